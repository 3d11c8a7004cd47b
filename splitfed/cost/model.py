"""THE cost model: what a round costs for each client and for the fleet, given the cuts.

The optimizer, the adapter, the simulated clock and the benchmarks all call this
module; nothing else predicts time.

Notation. A chain of T tiers: tier 0 is the client's device, tiers 1..T-1 are
servers shared by all clients (2 tiers: edge; 3 tiers: edge, cloud). Link j
joins tier j-1 and tier j; link 1 is the client's own, links j >= 2 are shared.
Blocks 0..L-1; per sample f_i (forward + backward FLOPs), h_i (activation bytes kept for
backward); per block w_i (state bytes: what the weight exchange sends for block i, every key of
its state dict, ``ModelProfile.state_bytes``: weights frozen or not, a tensor tied under two
names once per name, persistent buffers such as BatchNorm statistics), g_i (bytes of the
parameters that train, ``requires_grad``), m_i (fixed bytes: params and buffers, each storage once, +
grads and optimizer state of the trainable ones); a_k is the size of the tensor at boundary
k (a_0 the input, a_k the output of block k-1). Cuts k_1 <= ... <= k_{T-1} <= E, where E = L, or
E = u (the U-shape tail cut): tier t holds [k_t, k_{t+1}) with k_0 = 0 and
k_T = E; with U-shape the device also holds the tail [u, L) and the loss. A tail fed by
the servers (k_1 < u) takes its input with a gradient, which it computes and sends back
up even when no block before u trains: its blocks cost f'_i and h'_i, forward + backward
FLOPs and saved bytes measured with an input gradient (``ModelProfile.grad_bwd_flops``,
``grad_act_bytes``; f_i and h_i wherever a block before i trains).
B is the batch size, S = samples x epochs, n = ceil(samples / B) x epochs
batches (the last batch of an epoch may be short: r = samples mod B). Memory prices the
largest batch the client runs: B there is min(B, samples).

Per client, per round (prefix sums make each term O(1) per option):

- compute on tier t:   C_t = S * sum_{i in tier t} f_i / F_t   (F_t its FLOP/s)
- link j carries the boundary k_j up iff a server at or beyond tier j holds a
  block (k_j < E), with the labels (int64, 8 bytes a sample, never compressed;
  not with U-shape: labels stay on the device); the gradient comes back down iff
  a block before it has parameters that train (g[0, k_j) > 0: ``train_bytes``, 0 for a
  frozen block and for one before a block that detaches, which training's gradient
  never reaches; nothing upstream can use it otherwise) and the boundary is
  floating (none flows through token ids). U-shape: the tail's input a_E comes back
  down over every link the chain went up, and its gradient goes up again unless a block
  of the tail stops it (``ModelProfile.grad_reach``; the backward call goes all the same:
  it also releases the replicas the servers hold since the forward,
  even when nothing before E trains; a tail never starts at an integer
  tensor from the servers: ``Scenario.options`` leaves such cuts out).
- bytes on the wire (``codec``, per link; what :mod:`splitfed.transport.compress`
  sends for the boundary's tensor of N = b * a / s values, b samples in the message,
  s the element size of the dtype the profiler saw there: ``ModelProfile.dtypes``):
  none: sN; fp16: 2N; int8: 8 + N (float32 scale and offset, one byte a value);
  topk:F: min(N, max(1, ceil(F N))) * (4 + s) (int32 index + the value in its dtype),
  each read off :func:`splitfed.transport.codec.payload_size` (``wire_bytes``).
  Integer tensors (token-id inputs, labels) travel exactly. A round sends, per
  epoch, floor(samples / B) full batches and one short batch of r samples.
  Weights (the exchange below, and moves) always travel uncompressed.
  Up time  U_j = up_bytes_j / up_j + n * c_j * rtt_j / 2, same down: c_j calls a batch on a link the chain
  crosses (1; U-shape 2: forward, then backward), each answered before the next goes, whether or not a
  tensor comes back (a step's reply carries its loss), so a round trip each.
- weight exchange of the device's segment(s), W = w[0, k_1) + w[u, L) (its state dict,
  down and back up, as :func:`splitfed.engine.rounds.device_state` selects it):
  X = W / down_1 + W / up_1 + rtt_1  (rtt_1 even if W = 0: the round's train message and its reply go
  all the same; server replicas stay put)
- round time (one client's batches run sequentially along the chain):
  R = sum_t C_t + sum_j (U_j + D_j) + X;  one batch: the same with S = B, n = 1.
- memory on tier t, holding blocks [a, b): sum_{i in [a, b)} (m_i + B h_i) - B sum_{a <= j < i < b} s_ji,
  where s_ji is the part of h_i that block j, the last block before i that keeps it, keeps too (block i's
  input, or a view of it such as a Flatten passes on, saved by both: one tensor; ``ModelProfile.shared_act``);
  the device adds B a_0 (its input batch), less B s_-1,i for each of its head's blocks i that keeps that batch
  (j = -1), and its tail (with h'_i and s'_ji, ``grad_shared_act``, when fed by the servers, and B a_u, the
  tensor they send, which the tail's blocks keep a clone of: it needs a gradient). A server tier the chain
  enters (k_t < E) adds B max(0, a_lo - sum_{i < b} e_lo,i), the tensor it receives (held for the whole step,
  relayed or not), less what its blocks keep of it (``ModelProfile.input_kept``: none when it comes with a
  gradient, since the tier's segment then keeps a clone). A tier that sends its output on (the device's head, a
  server before an entered one, with U-shape the last server, to the tail) holds it until its gradient comes
  back, less what its blocks keep of it (``out_kept``; a view of what it received, ``out_views``: held anyway),
  and then that gradient too (if one comes back; from a tail, always): B (a_hi - kept + a_hi); a U-shape forward
  between servers lets go of its output once the next one answers, and keeps the chain's output it relays back
  (its reply, for a retry), so there B (max(a_hi - kept, a_hi) + a_u).

The fleet's round, by variant (``mode``; one option per client, everything below
is linear in that choice, so the optimizer minimises it exactly as a MILP):

``sflv1`` (SplitFed v1: every client trains its own server-side replica, all in
parallel). Edge, cloud and the edge-cloud link are shared by every client, so
their total work must fit in the round (a fluid bound: tight when many clients'
batches interleave, which is the regime of a fleet):

    makespan = max( max_i R_i,
                    sum_i S_i * flops_i(tier t) / F_t            for each server t,
                    sum_i bytes_i(link j, up) / up_j, same down  for each shared link j )

Server memory: the sum over its clients (one replica, and its activations, per client), and the
round's *staged base*: before the clients load, the coordinator sends each tier, once, the global
model's blocks that two or more of its clients hold there (their state w_i, nothing that trains), and
each client's load copies them from it (``splitfed.engine.rounds.SplitRound._stage``); it is released
once they are loaded, before any step. So while they load the tier holds every client's fixed part
and the base, and while they train every client's fixed part and activations:

    memory_t = sum_i fixed_i,t + max( sum_{b : n_t,b >= 2} w_b,  sum_i B act_i,t )

with n_t,b the number of clients whose cuts put block b on tier t. (A base of more than
``STAGED_RUNS`` runs of blocks stages only the largest: then the tier holds less than priced.)

``sl`` (vanilla split learning) and ``sflv2`` (SplitFed v2: one server-side
model) train the clients strictly in turn, as the engine runs them
(``splitfed.engine.rounds.SplitRound``: each client is its own group, and the
groups run one after another): a client's turn loads its server segments from
the model as the clients before it left it, trains, and hands them on (fetched
back and released) before the next client's turn. So, in both,

    makespan = sum_i R_i      (each R_i includes its own weight exchange X_i)

which bounds every shared resource too (``Scenario.in_turn``). Resource
"clients in turn", capacity 1 s/s; a client's extra time (moving its weights
first) delays every client after it, so it adds to that resource. Server
memory: the segment of the client training now, and the model as the client
before it left it there. When a turn ends, the client's trained segment on tier t
is copied there into a *holder* (its state, H_c,t = w[k_t, k_t+1), no optimizer
state) that the next client's load copies from; the engine keeps at most one
holder per tier (an older one's blocks are fetched first), and a client's own
segment is released only once its holder exists. So while c trains, tier t holds
the previous holder and c's segment (fixed part and one step's activations);
when its turn ends, the previous holder, c's fixed part and c's new holder:

    turn_c,t  = fixed_c,t + max(B h_c,t, H_c,t)
    memory_t  = max_c turn_c,t + max_c H_c,t     (one client: turn_c,t, no holder before it)

(the previous holder is some client's, at most the largest). What differs is
only where a client's device segment starts and what the round returns (sl:
the model as the last client left it, device segment included; sflv2: device
segments start from the global model and are averaged with the server-side
one); the bytes are the same, X_i in both.

Moving a client's cuts ships every block whose tier changes (its state w_i, buffers
included: each tier builds a fresh optimizer for each client each round, so no
optimizer state travels) along the links between its old and new tier:
``move_cost`` = sum over links and directions of sum w_i / bandwidth + rtt / 2.
Control messages and framing are not counted. The bytes priced here are
exactly what :class:`splitfed.engine.link.InProcessLink` counts, for every cut
vector (a test runs both): the engine enters a chain only as far as a block of
the client lies (the tier that reaches the end computes the loss; a client that
holds every block trains alone), and a tier sends a gradient back only when a
block before it has trainable parameters.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, reduce
from operator import add

import numpy as np

from splitfed.cost.wire import WireCodec, link_codecs, parse_codec, wire_bytes
from splitfed.engine.modes import IN_TURN, MODES
from splitfed.errors import ConfigError, CutError
from splitfed.models.segment import validate_cuts
from splitfed.profile.devices import LinkProfile, TierProfile
from splitfed.profile.fleet import Client, Fleet
from splitfed.profile.profiler import ModelProfile
from splitfed.units import mib_pair

Cuts = tuple[int, ...]
Assignment = Mapping[str, Sequence[int]]

LABEL_BYTES = 8.0  # int64 label per sample (the tiers accept int64 labels only)


def total(values: Iterable[float]) -> float:
    """The exact sum (``math.fsum``) of seconds or loads, none negative; inf where it passes the largest float.
    fsum raises OverflowError there: absurd beliefs (a node that reported a round trip of 1e308 s) ended the
    adaptive run as the move costs of three such clients were summed."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def leading_blocks(cuts: Sequence[int], n_blocks: int, u_shape: bool = False) -> int:
    """The blocks a device runs on its raw inputs before anything leaves it (what ``min_device_blocks``
    counts): its head [0, k_1); with U-shape cuts that enter no server (k_1 = u: all equal) the tail goes on
    from the head, so every block."""
    return n_blocks if u_shape and cuts[0] == cuts[-1] else int(cuts[0])


def cut_options(n_blocks: int, tiers: int, u_shape: bool = False, min_device_blocks: int = 0) -> np.ndarray:
    """Every legal cut vector (rows, lexicographic): non-decreasing values in 0..L that keep
    ``min_device_blocks`` leading blocks on the device. With U-shape, every all-equal vector puts the whole
    model on the device: one row stands for them, L,...,L (so one placement has one spelling)."""
    n = tiers - 1 + (1 if u_shape else 0)
    rows = [c for c in itertools.combinations_with_replacement(range(n_blocks + 1), n)
            if (not u_shape or c[0] < c[-1] or c[0] == n_blocks)
            and leading_blocks(c, n_blocks, u_shape) >= min_device_blocks]
    if not rows:
        raise CutError(f"no legal cut keeps {min_device_blocks} leading block(s) on the device of a "
                       f"{n_blocks}-block model")
    return np.array(rows, dtype=np.int64).reshape(len(rows), n)


@dataclass(frozen=True)
class Scenario:
    """What a round runs on: the model's profile, the clients, the shared tiers, the batch, the variant
    (``mode``: sflv1 | sflv2 | sl) and the boundary codec (``codec``: none | fp16 | int8 | topk:F, one
    for every link or a tuple with one per link, device's first)."""

    profile: ModelProfile
    clients: tuple[Client, ...]
    servers: tuple[TierProfile, ...]
    server_links: tuple[LinkProfile, ...] = ()
    batch: int = 32
    u_shape: bool = False
    epochs: int = 1
    min_device_blocks: int = 0
    mode: str = "sflv1"
    codec: str | tuple[str, ...] = "none"

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError("a chain needs at least one server tier")
        if len(self.server_links) != len(self.servers) - 1:
            raise ConfigError(f"{len(self.servers)} server tiers need {len(self.servers) - 1} link(s) between them")
        if self.batch < 1 or self.epochs < 1:
            raise ConfigError(f"batch and epochs must be >= 1, got {self.batch}, {self.epochs}")
        if not self.clients:
            raise ConfigError("a scenario needs at least one client")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        names = link_codecs(self.codec, len(self.servers))
        object.__setattr__(self, "codec", names[0] if len(set(names)) == 1 else names)  # one codec: its name

    @classmethod
    def from_fleet(cls, profile: ModelProfile, fleet: Fleet, tiers: int = 3, batch: int = 32,
                   u_shape: bool = False, epochs: int = 1, min_device_blocks: int = 0, mode: str = "sflv1",
                   codec: str | tuple[str, ...] = "none") -> Scenario:
        servers, links = fleet.servers(tiers)
        return cls(profile, fleet.clients, servers, links, batch, u_shape, epochs, min_device_blocks, mode, codec)

    def with_clients(self, clients: Sequence[Client]) -> Scenario:
        return replace(self, clients=tuple(clients))

    @property
    def tiers(self) -> int:
        return 1 + len(self.servers)

    @cached_property
    def tier_names(self) -> tuple[str, ...]:
        mid = tuple(f"tier{t}" for t in range(2, self.tiers - 1))
        return ("device", "edge") if self.tiers == 2 else ("device", "edge", *mid, "cloud")

    @cached_property
    def link_codecs(self) -> tuple[WireCodec, ...]:
        """The codec of each link (link 1, the device's, first)."""
        names = (self.codec,) * len(self.servers) if isinstance(self.codec, str) else self.codec
        return tuple(parse_codec(n) for n in names)

    @property
    def in_turn(self) -> bool:
        """The clients train strictly one after another (sl and sflv2; see the module docstring)."""
        return self.mode in IN_TURN

    @property
    def holders(self) -> bool:
        """A server holds, beside the client training there, the model as the client before left it (sl and
        sflv2 with two clients or more; see the module docstring)."""
        return self.in_turn and len(self.clients) > 1

    @property
    def serial_resource(self) -> int | None:
        """Column of the resource that serialises clients (sl, sflv2: "clients in turn"), else None."""
        return len(self.resource_names) - 1 if self.in_turn else None

    @cached_property
    def resource_names(self) -> tuple[str, ...]:
        """Shared resources whose busy time bounds the makespan, in ``shared_load`` column order."""
        n = self.tier_names
        links = [f"{n[j - 1]}->{n[j]} link {d}" for d in ("up", "down") for j in range(2, self.tiers)]
        serial = ("clients in turn",) if self.in_turn else ()
        return (*(f"{n[t]} compute" for t in range(1, self.tiers)), *links, *serial)

    @cached_property
    def capacities(self) -> np.ndarray:
        """Capacity of each shared resource (FLOP/s, bytes/s, or 1 s/s), ``resource_names`` order."""
        serial = (1.0,) if self.in_turn else ()
        return np.array([*(s.flops for s in self.servers), *(lk.up for lk in self.server_links),
                         *(lk.down for lk in self.server_links), *serial], dtype=float)

    @cached_property
    def memory_caps(self) -> np.ndarray:
        return np.array([s.memory for s in self.servers], dtype=float)

    @cached_property
    def _messages(self) -> dict[tuple[int, bool, int], np.ndarray]:
        return {}

    def _message(self, link: int, tail: bool, samples: int) -> np.ndarray:
        """:func:`wire_bytes` of one message of ``samples`` on ``link`` for every option of :attr:`options`
        (at k_link, or at the U-shape tail's cut), computed once per scenario: the option tables of
        thousands of clients share it (a message's size depends on no client's resources)."""
        key = (link, tail, samples)
        got = self._messages.get(key)
        if got is None:
            b = self.options[:, self.tiers - 1] if tail else self.options[:, link]
            got = wire_bytes(self.link_codecs[link], self._prefix["bound"][b], samples,
                             itemsize=self._prefix["itemsize"][b])
            got.setflags(write=False)
            self._messages[key] = got
        return got

    @cached_property
    def _priced(self) -> dict[tuple, tuple[ClientCost, np.ndarray]]:
        """:func:`evaluate`'s cost of one client kind (``client_key``) under one cut vector, priced once per
        scenario (a brute force or a local search prices the same few thousand pairs in every plan)."""
        return {}

    @cached_property
    def _row_of(self) -> dict[tuple[int, ...], int]:
        return {tuple(r): i for i, r in enumerate(self.options.tolist())}

    def _rows(self, C: np.ndarray) -> np.ndarray | None:
        """The rows of :attr:`options` that ``C``'s cut vectors are (None if one is not among them)."""
        if len(self.options) > 50_000:  # a dict of every option would cost more than it saves
            return None
        idx = [self._row_of.get(tuple(r)) for r in C.tolist()]
        return None if any(i is None for i in idx) else np.asarray(idx, dtype=np.int64)

    @cached_property
    def options(self) -> np.ndarray:
        """Every legal cut vector, less U-shape ones whose tail would start at an integer tensor."""
        c = cut_options(self.profile.n_blocks, self.tiers, self.u_shape, self.min_device_blocks)
        if not self.u_shape:
            return c
        floating = np.asarray(self.profile.float_itemsize) > 0
        return c[(c[:, 0] >= c[:, -1]) | floating[c[:, -1]]]  # as _tail_problem says, for every row at once

    def _tail_problem(self, cuts: Sequence[int]) -> str | None:
        """Why a U-shape cut vector cannot train: its tail starts at an integer tensor (token ids) that came
        through the servers, so no gradient can go back up to them (the device's tail needs one to send)."""
        e = int(cuts[-1])
        if not self.u_shape or cuts[0] >= e or self.profile.float_itemsize[e] > 0:
            return None
        return (f"the U-shape tail starts at boundary {e}, a {self.profile.dtypes[e]} tensor: no gradient can go "
                "back to the servers' blocks through it; choose another tail cut")

    @cached_property
    def _prefix(self) -> dict[str, np.ndarray]:
        p = self.profile

        def pre(v: Sequence[float]) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(np.asarray(v, dtype=float))])

        work = np.asarray(p.fwd_flops) + np.asarray(p.bwd_flops)
        grad_work = np.asarray(p.fwd_flops) + np.asarray(p.grad_bwd_flops)  # an input gradient too (a U-shape tail)
        return {"work": pre(work), "fwd": pre(p.fwd_flops), "fixed": pre(p.fixed_bytes),
                "grad_work": pre(grad_work), "grad_act": pre(p.grad_act_bytes),
                "state": pre(p.state_bytes),  # what the weight exchange sends: every state-dict key, buffers too
                "train": pre(p.train_bytes),  # the gradient rule (weights, frozen or not, travel: "state")
                "act": pre(p.act_bytes), "shared": _pairs(p.shared_act, p.n_blocks),
                "grad_shared": _pairs(p.grad_shared_act, p.n_blocks), "kept": _kept(p.input_kept, p.n_blocks),
                "out_kept": _out_kept(p.out_kept, p.n_blocks), "out_views": _views(p.out_views, p.n_blocks),
                "bound": np.array([p.input_bytes, *p.out_bytes], dtype=float),
                "itemsize": np.array(p.float_itemsize, dtype=float),  # 0: an integer tensor (token ids)
                "reach": np.asarray(p.grad_reach, dtype=float),  # 1: training's gradient reaches the boundary
                "move": np.asarray(p.state_bytes, dtype=float),  # optimizer state is not kept across rounds
                "block_fixed": np.asarray(p.fixed_bytes, dtype=float)}

    @cached_property
    def _index(self) -> dict[str, int]:
        return {c.name: i for i, c in reversed(list(enumerate(self.clients)))}

    def index(self, name: str) -> int:
        """Position of the client called ``name`` (the first, if names repeat)."""
        try:
            return self._index[name]
        except KeyError:
            raise ConfigError(f"no client named {name!r}") from None

    def check_cuts(self, cuts: Sequence[int]) -> Cuts:
        c = validate_cuts(cuts, self.profile.n_blocks, self.tiers, self.u_shape, model=self.profile.model)
        if leading_blocks(c, self.profile.n_blocks, self.u_shape) < self.min_device_blocks:
            raise CutError(f"cuts {','.join(map(str, c))} keep fewer than {self.min_device_blocks} leading "
                           "block(s) on the device")
        why = self._tail_problem(c)
        if why is not None:
            raise CutError(f"cuts {','.join(map(str, c))}: {why}")
        return c


@dataclass(frozen=True)
class OptionTable:
    """Costs of one client for many cut vectors at once (row r: ``options[r]``); per round unless noted."""

    options: np.ndarray      # (m, cuts)
    round_s: np.ndarray      # (m,)  the client's own round time
    batch_s: np.ndarray      # (m,)  one batch along the chain
    batch_parts: np.ndarray  # (m, 3T-2) one batch: forward on each tier, backward on each tier,
    #                          then each link's up and down (incl. latency): see ClientCost.batch
    exchange_s: np.ndarray   # (m,)  device segment weights down + up
    exchange_bytes: np.ndarray  # (m,)  device segment state (weights and buffers), each way
    compute_s: np.ndarray    # (m, T)
    flops: np.ndarray        # (m, T)
    up_bytes: np.ndarray     # (m, T-1) per link, on the wire (codec applied)
    down_bytes: np.ndarray   # (m, T-1)
    up_s: np.ndarray         # (m, T-1) incl. latency
    down_s: np.ndarray       # (m, T-1)
    memory: np.ndarray       # (m, T) bytes
    shared_load: np.ndarray  # (m, R) work on each shared resource (FLOPs, bytes or seconds)
    fits_device: np.ndarray  # (m,) bool
    act_memory: np.ndarray   # (m, T) the activation part of ``memory`` (one step's)


def _sum(cols: np.ndarray) -> np.ndarray:
    """Row sums in a fixed left-to-right order, so one row costs the same alone or in a table."""
    if cols.shape[1] == 0:
        return np.zeros(cols.shape[0])
    return reduce(add, (cols[:, j] for j in range(cols.shape[1])))


def option_table(sc: Scenario, client: Client, options: np.ndarray | None = None) -> OptionTable:
    """The cost model for one client over cut vectors ``options`` (default: every legal one)."""
    C = sc.options if options is None else np.asarray(options, dtype=np.int64).reshape(-1, sc.tiers - 1 + sc.u_shape)
    P = sc._prefix
    T, L, B = sc.tiers, sc.profile.n_blocks, sc.batch
    m = C.shape[0]
    k = C[:, : T - 1]
    E = C[:, T - 1] if sc.u_shape else np.full(m, L)
    edges = np.concatenate([np.zeros((m, 1), np.int64), k, E[:, None]], axis=1)
    S = float(client.samples * sc.epochs)
    n = math.ceil(client.samples / B) * sc.epochs
    full, short = divmod(client.samples, B)

    per_sample = P["work"][edges[:, 1:]] - P["work"][edges[:, :-1]]  # (m, T)
    # a U-shape tail fed by the servers takes its input with a gradient (it sends it back up), whatever trains
    # before it; fed by the head alone (k_1 = E) it runs as the whole model would
    fed = k[:, 0] < E
    per_sample[:, 0] += np.where(fed, P["grad_work"][L] - P["grad_work"][E], P["work"][L] - P["work"][E])
    speed = np.array([client.device.flops, *(s.flops for s in sc.servers)])
    flops = per_sample * S
    compute_s = flops / speed

    links = (client.link, *sc.server_links)
    up_bw = np.array([lk.up for lk in links])
    down_bw = np.array([lk.down for lk in links])
    half_rtt = np.array([lk.rtt / 2 for lk in links])
    cross = (k < E[:, None]).astype(float)                  # (m, T-1)
    # a gradient only for a block before the cut that trains (one a gradient reaches: ``train_bytes``, as
    # :func:`splitfed.engine.template.trains_before`),
    # and none through token ids
    grad = ((P["train"][k] > 0) & (P["itemsize"][k] > 0)).astype(float)
    a_k, s_k = P["bound"][k], P["itemsize"][k]
    a_e, s_e = P["bound"][E], P["itemsize"][E]
    reach_e = P["reach"][E]

    rows = None if options is None else sc._rows(C)

    def message(j: int, tail: bool, samples: int) -> np.ndarray:
        """One message's bytes on link ``j`` (boundary k_j, or the tail's a_E) for every option; the same for
        every client of the scenario, so kept there for its default options."""
        if options is None:
            return sc._message(j, tail, samples)
        if rows is not None:
            return sc._message(j, tail, samples)[rows]
        return wire_bytes(sc.link_codecs[j], a_e if tail else a_k[:, j], samples,
                          itemsize=s_e if tail else s_k[:, j])

    def per_round(j: int, tail: bool) -> np.ndarray:
        return sc.epochs * (full * message(j, tail, B) + message(j, tail, short))

    up_r, down_r, up_b, down_b = (np.zeros((m, T - 1)) for _ in range(4))
    for j in range(T - 1):
        act_r, act_b = per_round(j, False), message(j, False, B)
        if sc.u_shape:
            tail_r, tail_b = per_round(j, True), message(j, True, B)
            # a_E's gradient, unless a block of the tail stops it (the backward call goes all the same)
            up_r[:, j], up_b[:, j] = act_r + reach_e * tail_r, act_b + reach_e * tail_b
            down_r[:, j], down_b[:, j] = grad[:, j] * act_r + tail_r, grad[:, j] * act_b + tail_b
        else:
            up_r[:, j], up_b[:, j] = act_r + S * LABEL_BYTES, act_b + B * LABEL_BYTES
            down_r[:, j], down_b[:, j] = grad[:, j] * act_r, grad[:, j] * act_b
    # calls per batch on each link the chain crosses (U-shape: forward, then backward), each answered before the
    # next goes, whether or not a tensor comes back (a step's reply carries its loss): a round trip each
    calls = cross * (2.0 if sc.u_shape else 1.0)
    up_bytes, down_bytes = cross * up_r, cross * down_r
    up_s = up_bytes / up_bw + n * calls * half_rtt
    down_s = down_bytes / down_bw + n * calls * half_rtt

    dev_state = P["state"][k[:, 0]] + (P["state"][L] - P["state"][E])  # W: the device's state dict
    lk0 = client.link
    # the round's train message and its reply cross the device's link even when it holds no block (W = 0)
    exchange_s = dev_state / lk0.down + dev_state / lk0.up + lk0.rtt
    round_s = _sum(compute_s) + _sum(up_s) + _sum(down_s) + exchange_s
    fwd_ps = P["fwd"][edges[:, 1:]] - P["fwd"][edges[:, :-1]]
    fwd_ps[:, 0] += P["fwd"][L] - P["fwd"][E]
    batch_up = cross * up_b / up_bw + calls * half_rtt
    batch_down = cross * down_b / down_bw + calls * half_rtt
    batch_s = _sum(per_sample * B / speed) + _sum(batch_up) + _sum(batch_down)
    batch_parts = np.concatenate([fwd_ps * B / speed, (per_sample - fwd_ps) * B / speed, batch_up, batch_down],
                                 axis=1)

    lo, hi = edges[:, :-1], edges[:, 1:]
    B = min(B, client.samples)  # memory: the largest batch it runs (a client with fewer samples runs one short batch)
    act = B * (P["act"][hi] - P["act"][lo] - _within(P["shared"], lo, hi))
    # the device: the head, its input batch (that the head's blocks keep too, counted once), and the tail: fed
    # by the servers it keeps its own; fed by the head (k_1 = E) it goes on from it, one run of blocks [0, L)
    head = np.where(fed, k[:, 0], L)
    act[:, 0] = B * (P["act"][head] - _within(P["shared"], np.zeros(m, np.int64), head, batch=True)
                     + np.where(fed, P["grad_act"][L] - P["grad_act"][E] - _within(P["grad_shared"], E, np.full(m, L)),
                                0.0)
                     + P["bound"][0])
    # a server tier the chain enters holds the tensor it receives for the whole step, less what its blocks keep
    # of it (counted in their act); a fed tail's input comes with a gradient, its blocks keep a clone
    recv = P["bound"][lo[:, 1:]] - P["kept"][lo[:, 1:], hi[:, 1:]]
    act[:, 1:] += B * cross * np.maximum(recv, 0.0)
    if sc.u_shape:
        act[:, 0] += B * np.where(fed, P["bound"][E], 0.0)
    act += B * _in_flight(sc, edges, cross, grad, E)
    memory = (P["fixed"][edges[:, 1:]] - P["fixed"][edges[:, :-1]]) + act
    memory[:, 0] += P["fixed"][L] - P["fixed"][E]
    serial = [round_s[:, None]] if sc.in_turn else []
    shared = np.concatenate([flops[:, 1:], up_bytes[:, 1:], down_bytes[:, 1:], *serial], axis=1)
    return OptionTable(C, round_s, batch_s, batch_parts, exchange_s, dev_state, compute_s, flops, up_bytes,
                       down_bytes, up_s, down_s, memory, shared, memory[:, 0] <= client.device.memory, act)


def _grid(triples: Sequence[tuple[int, int, float]], rows: int, cols: int, shift: tuple[int, int] = (0, 0)) -> np.ndarray:
    """The bytes of ``triples`` (a, b, bytes) summed into a (rows, cols) table at [a + shift[0], b + shift[1]]:
    what the prefix tables below are made of."""
    m = np.zeros((rows, cols))
    for a, b, n in triples:
        m[a + shift[0], b + shift[1]] += n
    return m


def _pairs(triples: Sequence[tuple[int, int, float]], n: int) -> np.ndarray:
    """2-D prefix sums of ``ModelProfile.shared_act``: ``P[r, c]`` sums the bytes of the pairs whose keeper
    row (j + 1: row 0 is the input batch) is below r and whose block is below c."""
    return _grid(triples, n + 2, n + 1, (2, 1)).cumsum(axis=0).cumsum(axis=1)


def _in_flight(sc: Scenario, edges: np.ndarray, cross: np.ndarray, grad: np.ndarray, E: np.ndarray) -> np.ndarray:
    """(m, T), per sample: what each tier holds of the tensor it sends on and of the gradient that comes back for
    it. A tier sends its output on (the device's head, a server before an entered one; with U-shape the last
    entered server, to the device's tail) and holds it, less what its blocks keep of it (``out_kept``), until
    the gradient comes back, which it then holds too (if one comes: ``grad``; from a tail, always). A U-shape
    forward lets go of its output once the next server has answered, so there the larger of the two, and it
    keeps the chain's output it relays back (its reply, kept for a retry until the backward)."""
    P, L = sc._prefix, sc.profile.n_blocks
    m, T = edges.shape[0], sc.tiers
    out = np.zeros((m, T))
    C = P["out_kept"]
    for t in range(T):
        lo, hi = edges[:, t], edges[:, t + 1]
        a = P["bound"][hi]
        # kept by its blocks (the device's batch too: j = -1), or (a view of) what a server received, held anyway
        kept = C[hi, L + 1] - C[hi, 0] if t == 0 else C[hi, L + 1] - C[hi, lo + 1] + P["out_views"][hi, lo]
        held = np.maximum(a - kept, 0.0)
        # a tier that holds no block sends on what it received: the device its batch, a server the very tensor
        # (counted with what it receives), or, taken with a gradient, the clone its segment makes of it
        held = np.where(lo < hi, held, 0.0 if t == 0 else grad[:, t - 1] * a)
        if t < T - 1:
            on = cross[:, t]  # the next tier is entered
            back = grad[:, t] * a
            if sc.u_shape and t > 0:  # and the chain's output it relays back, kept as its forward's reply
                out[:, t] += on * (np.maximum(held, back) + P["bound"][E])
            else:
                out[:, t] += on * (held + back)
        if sc.u_shape and t > 0:  # the last server the chain enters: its output goes to the tail and comes back
            last = (lo < E) & (hi == E)
            out[:, t] += last * (held + P["reach"][E] * a)
    return out


def _out_kept(triples: Sequence[tuple[int, int, float]], n: int) -> np.ndarray:
    """Prefix sums of ``ModelProfile.out_kept``: ``C[k, c]`` sums the bytes of the boundary-k tensor that blocks
    j < c - 1 keep (column 0 before the input batch, j = -1)."""
    return _grid(triples, n + 1, n + 2, (0, 2)).cumsum(axis=1)


def _views(triples: Sequence[tuple[int, int, float]], n: int) -> np.ndarray:
    """``ModelProfile.out_views`` as a table: ``V[k, lo]`` bytes of the boundary-k tensor that are the boundary-lo
    tensor a tier starting at lo receives."""
    return _grid(triples, n + 1, n + 1)


def _kept(triples: Sequence[tuple[int, int, float]], n: int) -> np.ndarray:
    """Prefix sums of ``ModelProfile.input_kept``: ``K[k, c]`` sums the bytes blocks below c keep of the
    boundary-k tensor a tier starting at k receives."""
    return _grid(triples, n + 1, n + 1, (0, 1)).cumsum(axis=1)


def _within(P: np.ndarray, lo: np.ndarray, hi: np.ndarray, batch: bool = False) -> np.ndarray:
    """Per sample, the saved bytes blocks ``[lo, hi)`` of one tier keep twice (a block and one before it on
    the tier, or the input batch if ``batch``: held once); 0 where ``lo >= hi``."""
    first = np.minimum(lo, hi)
    top = first + 1 - batch                              # keeper rows: lo..hi-1 (and the batch's)
    got = P[hi + 1, hi] - P[top, hi] - P[hi + 1, first] + P[top, first]
    return np.where(hi > lo, got, 0.0)


def move_costs(sc: Scenario, client: Client, old: Sequence[int], options: np.ndarray | None = None) -> np.ndarray:
    """Seconds to ship the blocks that change tier (their state dicts, ``ModelProfile.state_bytes``) when
    ``client`` goes from ``old`` to each option."""
    C = sc.options if options is None else np.asarray(options, dtype=np.int64).reshape(-1, sc.tiers - 1 + sc.u_shape)
    old_t = tier_of_blocks(sc, np.asarray([sc.check_cuts(old)]))  # (1, L)
    new_t = tier_of_blocks(sc, C)                                  # (m, L)
    w = sc._prefix["move"]
    links = (client.link, *sc.server_links)
    out = np.zeros(C.shape[0])
    for j, lk in enumerate(links, 1):
        up = ((old_t < j) & (new_t >= j)).astype(float) @ w
        down = ((old_t >= j) & (new_t < j)).astype(float) @ w
        out = out + up / lk.up + (up > 0) * lk.rtt / 2 + down / lk.down + (down > 0) * lk.rtt / 2
    return out


def move_cost(sc: Scenario, client: Client, old: Sequence[int], new: Sequence[int]) -> float:
    """Seconds to move ``client``'s weights from cuts ``old`` to cuts ``new`` (0 if unchanged)."""
    return float(move_costs(sc, client, old, np.asarray([sc.check_cuts(new)]))[0])


def tier_of_blocks(sc: Scenario, C: np.ndarray) -> np.ndarray:
    """(m, L): the tier (0 = device) that holds each block under each cut vector of ``C``."""
    L, T = sc.profile.n_blocks, sc.tiers
    C = np.asarray(C, dtype=np.int64).reshape(-1, T - 1 + sc.u_shape)
    i = np.arange(L)[None, :]
    tier = np.zeros((C.shape[0], L), dtype=np.int64)
    for j in range(T - 1):
        tier += (C[:, j][:, None] <= i)
    if sc.u_shape:
        tier = np.where(C[:, T - 1][:, None] <= i, 0, tier)
    return tier


_tier_of_blocks = tier_of_blocks  # the old private name


def held_memory(sc: Scenario, cuts: np.ndarray) -> np.ndarray:
    """(n, S): the state bytes of each cut vector's blocks on each server tier: what a holder keeps of that
    client's segment there when its turn ends (sl, sflv2; see the module docstring)."""
    C = np.asarray(cuts, dtype=np.int64).reshape(-1, sc.tiers - 1 + sc.u_shape)
    k = C[:, : sc.tiers - 1]
    E = C[:, sc.tiers - 1] if sc.u_shape else np.full(C.shape[0], sc.profile.n_blocks)
    edges = np.concatenate([k, E[:, None]], axis=1)
    state = sc._prefix["state"]
    return state[edges[:, 1:]] - state[edges[:, :-1]]


def staged_memory(sc: Scenario, cuts: np.ndarray) -> np.ndarray:
    """(S,): sflv1's staged base on each server tier for the fleet's cut vectors ``cuts`` (one row per
    client): the state bytes of the blocks two or more clients hold there (see the module docstring)."""
    C = np.asarray(cuts, dtype=np.int64).reshape(-1, sc.tiers - 1 + sc.u_shape)
    on = tier_of_blocks(sc, C)
    w = np.asarray(sc.profile.state_bytes, dtype=float)
    return np.array([math.fsum(w[(on == t).sum(axis=0) >= 2]) for t in range(1, sc.tiers)])


def turn_memory(memory: np.ndarray, act: np.ndarray, held: np.ndarray) -> np.ndarray:
    """A client's peak on each server tier during its turn, beside the holder before it: its segment with
    one step's activations, or (its turn over) its segment's fixed part and its own new holder."""
    return memory + np.maximum(held - act, 0.0)


def server_memory(sc: Scenario, cuts: np.ndarray, memory: np.ndarray, act: np.ndarray) -> np.ndarray:
    """Bytes used on each server tier by clients with cut vectors ``cuts`` (n, .), their per-tier
    ``memory`` (n, S) and its activation part ``act`` (n, S), S = server tiers, by ``sc.mode``:
    sflv1 the sum (a replica each) with the staged base (:func:`staged_memory`) beside their fixed parts while
    they load; sl and sflv2 the largest :func:`turn_memory` plus the largest holder (:func:`held_memory`): one
    client at a time, beside the model as the client before left it."""
    n_s = sc.tiers - 1
    memory = np.asarray(memory, dtype=float).reshape(-1, n_s)
    act = np.asarray(act, dtype=float).reshape(-1, n_s)
    if memory.shape[0] == 0:
        return np.zeros(n_s)
    if sc.in_turn:
        held = held_memory(sc, cuts)
        before = held.max(axis=0) if len(held) > 1 else 0.0  # the first client has no holder before it
        return turn_memory(memory, act, held).max(axis=0) + before
    staged = staged_memory(sc, cuts)
    return np.array([math.fsum(memory[:, s]) + max(0.0, staged[s] - math.fsum(act[:, s])) for s in range(n_s)])


# ---------------------------------------------------------------- one client, one assignment


@dataclass(frozen=True)
class ClientCost:
    """One client's round under its cuts (seconds, bytes; per round unless noted)."""

    name: str
    cuts: Cuts
    samples: int
    batches: int
    round_s: float
    batch_s: float
    batch_parts: tuple[float, ...]  # one batch: see ``batch``
    exchange_s: float
    exchange_bytes: float           # device segment state (weights and buffers), each way
    compute_s: tuple[float, ...]    # per tier (device first)
    flops: tuple[float, ...]        # per tier
    up_bytes: tuple[float, ...]     # per link (link 1 = the device's), on the wire
    down_bytes: tuple[float, ...]
    up_s: tuple[float, ...]         # per link, incl. latency
    down_s: tuple[float, ...]
    memory: tuple[float, ...]       # bytes per tier
    fits_device: bool
    act_memory: tuple[float, ...] = ()  # the activation part of ``memory``, per tier

    def batch(self) -> dict[str, tuple[float, ...]]:
        """One batch, part by part: forward and backward seconds per tier, up and down seconds per link."""
        p, T = self.batch_parts, len(self.compute_s)
        return {"forward_s": p[:T], "backward_s": p[T:2 * T], "up_s": p[2 * T:3 * T - 1], "down_s": p[3 * T - 1:]}

    def to_dict(self) -> dict:
        return {"name": self.name, "cuts": list(self.cuts), "time_s": self.round_s, "batch_s": self.batch_s,
                "batch": {k: list(v) for k, v in self.batch().items()},
                "exchange_s": self.exchange_s, "exchange_bytes": self.exchange_bytes,
                "compute_s": list(self.compute_s), "up_s": list(self.up_s), "down_s": list(self.down_s),
                "up_bytes": list(self.up_bytes), "down_bytes": list(self.down_bytes),
                "memory_bytes": list(self.memory)}


def _row(sc: Scenario, client: Client, cuts: Cuts, t: OptionTable, r: int) -> ClientCost:
    def tup(a: np.ndarray) -> tuple[float, ...]:
        return tuple(float(x) for x in a[r])

    return ClientCost(client.name, cuts, client.samples, math.ceil(client.samples / sc.batch) * sc.epochs,
                      float(t.round_s[r]), float(t.batch_s[r]), tup(t.batch_parts), float(t.exchange_s[r]),
                      float(t.exchange_bytes[r]), tup(t.compute_s),
                      tup(t.flops), tup(t.up_bytes), tup(t.down_bytes), tup(t.up_s), tup(t.down_s),
                      tup(t.memory), bool(t.fits_device[r]), tup(t.act_memory))


def client_cost(sc: Scenario, client: Client | str, cuts: Sequence[int]) -> ClientCost:
    """One client's round under ``cuts`` (alone: sharing is accounted for in :func:`evaluate`)."""
    c = sc.clients[sc.index(client)] if isinstance(client, str) else client
    cuts = sc.check_cuts(cuts)
    return _row(sc, c, cuts, option_table(sc, c, np.asarray([cuts])), 0)


@dataclass(frozen=True)
class RoundCost:
    """The fleet's round under an assignment: per-client costs, shared loads, makespan."""

    clients: tuple[ClientCost, ...]
    makespan_s: float
    bottleneck: str                  # "client NAME" or a shared resource name
    shared_s: dict[str, float]       # busy seconds of each shared resource
    shared_memory: dict[str, float]  # bytes used on each server tier
    violations: tuple[str, ...]      # memory limits exceeded (empty: feasible)
    mode: str = "sflv1"

    @property
    def feasible(self) -> bool:
        return not self.violations

    def times(self) -> dict[str, float]:
        return {c.name: c.round_s for c in self.clients}

    def assignment(self) -> dict[str, Cuts]:
        return {c.name: c.cuts for c in self.clients}

    def to_dict(self) -> dict:
        return {"makespan_s": self.makespan_s, "mode": self.mode, "bottleneck": self.bottleneck,
                "feasible": self.feasible, "violations": list(self.violations), "shared_s": self.shared_s,
                "shared_memory_bytes": self.shared_memory,
                "clients": [{"name": c.name, "cuts": list(c.cuts), "time_s": c.round_s,
                             "device_memory_bytes": c.memory[0]} for c in self.clients]}


_PRICED_MAX = 16_384  # (client kind, cuts) pairs one scenario keeps priced for evaluate (Scenario._priced)


def client_key(c: Client) -> tuple:
    """What a client's costs depend on: clients with equal keys cost the same under every cut."""
    return (c.device, c.link, c.samples)


def evaluate(sc: Scenario, assignment: Assignment, extra_s: Mapping[str, float] | None = None) -> RoundCost:
    """The round's cost under ``assignment`` (every client of ``sc`` needs cuts), for ``sc.mode``.

    ``extra_s`` adds seconds to some clients' own time (e.g. moving their weights first; in ``sl``
    and ``sflv2`` also to the round, whose clients run in turn). Shared sums use ``math.fsum``: the
    makespan does not depend on client order. Each (client kind, cuts) pair is priced once per scenario and
    kept (``Scenario._priced``, at most ``_PRICED_MAX`` pairs): the same floats as pricing it again.
    """
    missing = [c.name for c in sc.clients if c.name not in assignment]
    if missing:
        raise ConfigError(f"assignment has no cuts for client(s) {', '.join(missing[:5])}"
                          f"{' ...' if len(missing) > 5 else ''}")
    extra = extra_s or {}
    groups: dict[tuple, list[int]] = {}
    cuts_of: list[Cuts] = []
    for i, c in enumerate(sc.clients):
        try:
            cuts = sc.check_cuts(assignment[c.name])
        except CutError as e:
            raise CutError(f"client {c.name}: {e}") from None
        cuts_of.append(cuts)
        groups.setdefault((client_key(c), cuts), []).append(i)
    costs: list[ClientCost | None] = [None] * len(sc.clients)
    loads: list[np.ndarray | None] = [None] * len(sc.clients)
    priced = sc._priced
    for key, idx in groups.items():
        got = priced.get(key)
        if got is None:
            cuts = key[1]
            t = option_table(sc, sc.clients[idx[0]], np.asarray([cuts]))
            first = _row(sc, sc.clients[idx[0]], cuts, t, 0)
            got = (first, t.shared_load[0])
            got[1].setflags(write=False)
            if len(priced) >= _PRICED_MAX:  # a bound on what one scenario keeps: start again
                priced.clear()
            priced[key] = got
        cost, row = got
        for i in idx:
            name = sc.clients[i].name
            costs[i] = cost if cost.name == name else replace(cost, name=name)  # frozen: shared as it is
            loads[i] = row
    cc = tuple(c for c in costs if c is not None)
    load = np.array(loads, dtype=float).reshape(len(cc), -1)
    shared_s = {name: total(load[:, r]) / sc.capacities[r] for r, name in enumerate(sc.resource_names)}
    if sc.in_turn:  # the clients run in turn: a client's extra time delays everyone after it
        shared_s[sc.resource_names[-1]] = total([*load[:, -1], *(extra.get(c.name, 0.0) for c in cc)])
    times = [c.round_s + extra.get(c.name, 0.0) for c in cc]
    worst = max(range(len(cc)), key=lambda i: times[i])
    makespan, bottleneck = times[worst], f"client {cc[worst].name}"
    for name, s in shared_s.items():
        if s > makespan:
            makespan, bottleneck = s, name
    names = sc.tier_names
    used = server_memory(sc, np.asarray(cuts_of), np.array([c.memory[1:] for c in cc]),
                         np.array([c.act_memory[1:] for c in cc]))
    shared_mem = {names[t]: float(used[t - 1]) for t in range(1, sc.tiers)}
    violations = [f"{c.name}: device memory {' > '.join(mib_pair(c.memory[0], sc.clients[i].device.memory))}"
                  for i, c in enumerate(cc) if not c.fits_device]
    violations += [f"{names[t]} memory {' > '.join(mib_pair(shared_mem[names[t]], cap))}"
                   for t, cap in enumerate(sc.memory_caps, 1) if shared_mem[names[t]] > cap]
    return RoundCost(cc, makespan, bottleneck, shared_s, shared_mem, tuple(violations), sc.mode)


def round_time(sc: Scenario, assignment: Assignment, extra_s: Mapping[str, float] | None = None) -> float:
    """The round's makespan in seconds (the simulated clock's step)."""
    return evaluate(sc, assignment, extra_s).makespan_s
