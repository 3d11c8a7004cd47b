"""One federated round over a chain of tiers, for each variant.

- ``sflv1``: every client trains its own replica of every server-side segment;
  all replicas and device segments are averaged layer-wise at the end. The
  replicas start from a base segment per tier (the global model's blocks, sent
  once and copied there) and come back as each tier's sample-weighted mean
  (``reduce``; float32 for a float32 model's weights), which the coordinator
  turns back into a sum with the weight it knows is behind each key: its
  traffic is one copy of each tier's part each way, whatever the number of
  clients.
- ``sflv2``: one server-side model, trained by the clients in turn whichever
  server tier each client puts a block on; every client's device segments start
  from the global model and are averaged, and each server-side block is averaged
  with the device copies of that block (weighted by the samples that trained it
  on the servers).
- ``sl``: vanilla split learning: clients in turn, the whole model handed on
  from one client to the next, no averaging.

``sl`` and ``sflv2`` hand the model on the same way: each client's turn loads
its server segments from the model as the clients before it left it, and only
a client that finishes (its weights finite on every tier) hands its trained
segments on. They stay on the tiers, copied there into segments only the
coordinator can reach (the client's binding, whose secret its node holds, is
released): the next client's load copies from those, and only a block that changes tier between
clients (the edge for one, the cloud for the next), or goes to a device (``sl``),
is fetched and sent on through the coordinator; the trained model is fetched
once, at the end. A client that fails leaves the round as if it had not taken
part.

:class:`SplitRound` is the round's tier bookkeeping, cut open where the clients
train; :func:`run_round` drives it with clients trained in this process, and the
Flower strategy drives the same object with clients trained on Flower nodes, so
the round logic exists once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from splitfed.aggregate import Partial, aggregate, wire_dtype
from splitfed.engine import template
from splitfed.engine.checks import all_finite
from splitfed.engine.device import Device
from splitfed.engine.link import InProcessLink, Link, TierControl, nbytes
from splitfed.engine.tier import Tier
from splitfed.engine.types import (
    BASE_PREFIX,
    IN_TURN,
    MODES,
    OptimConfig,
    ReduceItem,
    SegmentLoad,
    State,
    block_of,
    is_base,
)
from splitfed.errors import ConfigError, CutError, SplitfedError, TierError
from splitfed.models.segment import segment_bounds, validate_cuts
from splitfed.models.zoo import ModelSpec

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundConfig:
    """One round's settings. ``binding_key`` (random per round, made by :class:`SplitRound`; never shown)
    derives each client's binding secret (:meth:`secret_of`); empty: the clients' segments are unprotected."""

    run_id: str
    round: int
    model: ModelSpec
    mode: str = "sflv1"
    u_shape: bool = False
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    binding_key: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def secret_of(self, client_id: str) -> str:
        """``client_id``'s binding secret this round, the same on every tier (:attr:`SegmentLoad.secret`):
        unguessable without ``binding_key``, and another client's tells nothing of it. "" without a key."""
        if not self.binding_key:
            return ""
        msg = f"{self.run_id}\0{self.round}\0{client_id}".encode()
        return hmac.new(self.binding_key.encode(), msg, hashlib.sha256).hexdigest()[:32]


@dataclass
class ClientResult:
    client_id: str
    cuts: tuple[int, ...]
    samples: int
    loss: float
    correct: int
    compute_s: float
    link_s: float
    bytes_up: int = 0
    bytes_down: int = 0
    rtt_s: float | None = None  # the device's round trip to its first tier, as measured this round (None: not)


def initial_state(model: ModelSpec, seed: int) -> State:
    """The global model before round 1: the same in every process for a seed."""
    from splitfed.models.zoo import model_blocks

    return {k: v.detach().clone() for k, v in model_blocks(model, seed)[1].whole().state_dict().items()}


def state_bytes(state: State) -> int:
    """The bytes of a state's tensors (as they travel: uncompressed)."""
    return sum(nbytes(t) for t in state.values())


def select(state: State, start: int, stop: int) -> State:
    """The keys of blocks ``[start, stop)``."""
    return {k: v for k, v in state.items() if start <= block_of(k) < stop}


def server_bounds(cuts: Sequence[int], n_blocks: int, u_shape: bool) -> list[tuple[int, int]]:
    """``[start, stop)`` of each server tier, in chain order (the device's parts excluded)."""
    b = segment_bounds(cuts, n_blocks, u_shape)
    return b[1:-1] if u_shape else b[1:]


def device_state(state: State, cuts: Sequence[int], n_blocks: int, u_shape: bool) -> State:
    b = segment_bounds(cuts, n_blocks, u_shape)
    out = select(state, *b[0])
    if u_shape:
        out.update(select(state, *b[-1]))
    return out


def tier_loads(cfg: RoundConfig, client_id: str, cuts: Sequence[int], state: State | None,
               replica: str | None = None) -> list[SegmentLoad]:
    """One load per server tier (``replica``: the weights it binds to; the client's own by default)."""
    n = template.num_blocks(cfg.model)
    bounds = server_bounds(cuts, n, cfg.u_shape)
    end = bounds[-1][1]  # where the servers' part ends: the tier that reaches it ends the chain
    loads = []
    for t, (a, z) in enumerate(bounds):
        part = None if state is None else select(state, a, z)
        loads.append(SegmentLoad(
            run_id=cfg.run_id, client_id=client_id, round=cfg.round, model=cfg.model, start=a, stop=z,
            replica=replica or client_id, state=part, optim=cfg.optim, seed=cfg.seed,
            loss_here=z == end and (t == 0 or bounds[t - 1][1] < end), secret=cfg.secret_of(client_id),
        ))
    return loads


def check_assignment(model: ModelSpec, assignment: dict[str, tuple[int, ...]], n_tiers: int, u_shape: bool) -> None:
    """Each client's cuts; a refusal names the client (of a fleet's, the one to fix), and keeps its kind."""
    n = template.num_blocks(model)
    for cid, cuts in assignment.items():
        try:
            validate_cuts(cuts, n, n_tiers, u_shape, model=model.name)
        except (CutError, ConfigError) as e:  # validate_cuts raises CutError, which is no ConfigError
            raise type(e)(f"client {cid}: {e}") from None


@dataclass
class Chain:
    """The server tiers a device talks to: control handles per tier, and the first link."""

    tiers: list[TierControl]
    link: Link

    @property
    def bytes(self) -> tuple[int, int]:
        return getattr(self.link, "bytes_up", 0), getattr(self.link, "bytes_down", 0)


def inprocess_chain(server_tiers: int = 2, compress_up=None, compress_down=None,  # type: ignore[no-untyped-def]
                    torch_device: str | torch.device = "cpu", links=None) -> Chain:
    """Edge -> ... -> cloud as in-process tiers joined by in-process links, computing on ``torch_device``.
    Every link compresses with ``compress_up``/``compress_down``, or ``links`` gives each its own
    (up, down) pair, in chain order (link 0: the device's to the first tier)."""
    if server_tiers < 1:
        raise ConfigError("a chain needs at least one server tier (2 tiers in all)")
    names = ["edge", *[f"tier{i}" for i in range(2, server_tiers)], "cloud"] if server_tiers > 1 else ["cloud"]
    pairs = list(links) if links is not None else [(compress_up, compress_down)] * len(names)
    if len(pairs) != len(names):
        raise ConfigError(f"{len(names)} link(s) need {len(names)} codec pair(s), got {len(pairs)}")
    tiers: list[Tier] = []
    nxt: InProcessLink | None = None
    for i in reversed(range(len(names))):
        tier = Tier(names[i], next=nxt, torch_device=torch_device)
        tiers.insert(0, tier)
        nxt = InProcessLink(tier, *pairs[i])
    assert nxt is not None
    return Chain(list(tiers), nxt)


def train_client(cfg: RoundConfig, chain: Chain, cid: str, cuts: tuple[int, ...], state: State,
           batches: Batches, torch_device: str | torch.device = "cpu",
           secret: str | None = None) -> tuple[Device, ClientResult]:
    """Train ``cid`` on its batches over ``chain``; its steps carry ``secret`` (by default the one ``cfg``
    derives: a node given only its own secret passes it here)."""
    up0, down0 = chain.bytes
    dev = Device(cfg.model, chain.link, run_id=cfg.run_id, client_id=cid, round=cfg.round, cuts=cuts,
                 state=state, u_shape=cfg.u_shape, optim=cfg.optim, seed=cfg.seed, torch_device=torch_device,
                 secret=cfg.secret_of(cid) if secret is None else secret)
    total, correct = 0.0, 0
    for x, y in batches:
        loss, c = dev.train_step(x, y)
        total += loss * int(x.shape[0])  # a batch's mean loss times its samples: a short last batch counts less
        correct += c
    up1, down1 = chain.bytes
    # the mean over samples, as a round's train loss (its clients' losses weighted by their samples) reads it
    return dev, ClientResult(cid, cuts, dev.samples, total / max(1, dev.samples), correct,
                             dev.compute_s, dev.link_s, up1 - up0, down1 - down0)


Cuts = tuple[int, ...]
GONE = ("UNAVAILABLE", "DEADLINE_EXCEEDED")  # a tier's answers to a release that say it is not there
BASE = f"{BASE_PREFIX}base"  # the round's global server blocks on a tier (sflv1): a base segment's id and replica
STAGED_RUNS = 4  # base segments per tier at most (runs of blocks); beyond, the largest (the rest travel with loads)
REDUCE_BATCH = 256  # clients per Reduce call: a tier averages ~256 vgg11 edge segments in seconds


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


NONFINITE = ("NaN or infinite", "not finite", "diverged")
"""What a check that met a NaN or an infinity says (``engine.checks``, a tier's loss and means, a node's report): a
client that failed so diverged. Words, not types: a node's failure reaches the round as its error reply's text."""


class RoundFailed(SplitfedError):
    """Too few clients finished the round; the global model is unchanged."""

    exit_code = 1


@dataclass
class Outcome:
    """A client's trained device segment(s) and what its round cost."""

    state: State
    result: ClientResult


Trainer = Callable[[RoundConfig, Mapping[str, Cuts], Mapping[str, State]], Mapping[str, Outcome]]
"""``train(cfg, cuts, device_weights) -> outcomes`` for one group; absent clients failed."""


class SplitRound:
    """The tier bookkeeping of one round (see the module docstring).

    Each client's segments are loaded with its own binding secret (``cfg.secret_of``; a ``cfg`` without a
    ``binding_key`` gets a random one here): a trainer gives a client its secret (``self.cfg`` derives it),
    and no other caller of the tiers can step, fetch, release or reload that client's segments.
    """

    def __init__(self, cfg: RoundConfig, tiers: Sequence[TierControl], global_state: State,
                 assignment: Mapping[str, Cuts], min_clients: int = 0,
                 unreleased: dict[tuple[int, str], int] | None = None) -> None:
        check_assignment(cfg.model, dict(assignment), len(tiers) + 1, cfg.u_shape)
        reserved = next((c for c in assignment if is_base(c)), None)
        if reserved is not None:
            raise ConfigError(f"client id {reserved!r}: ids starting with {BASE_PREFIX!r} name a coordinator's base "
                              "segments on the tiers, not a client")
        # (tier index, client) -> the round whose release did not reach that tier: the caller keeps it across
        # the run's rounds (under one binding key), so a later load can release what was left (see _load)
        self.unreleased = {} if unreleased is None else unreleased
        if not cfg.binding_key:
            cfg = replace(cfg, binding_key=secrets.token_hex(16))
        self.cfg, self.tiers, self.global_state = cfg, list(tiers), global_state
        self.assignment = dict(assignment)
        self.order = list(assignment)
        self._turn = {c: i for i, c in enumerate(self.order)}
        self.min_clients = min_clients or len(self.order)
        self.n_blocks = template.num_blocks(cfg.model)
        # sl: the model handed from client to client; sflv2: the server-side model (its server blocks)
        self.current = dict(global_state)
        self.trained: dict[int, float] = {}  # sflv2: block -> samples that trained it on the servers
        self.done: dict[str, Outcome] = {}
        self.failed: list[str] = []
        self.why: dict[str, str] = {}  # failures the round itself found (fetch, NaN weights): client -> reason
        self.lost: dict[str, str] = {}  # clients whose training failed where it ran (a node's error): -> reason
        self._loaded: list[str] = []
        self._group: list[str] = []
        self._gone: set[int] = set()  # tiers a release found unreachable: the rest of this round skips them
        # per server tier, the weight bytes this round sent it (loads) and got back (fetches, means): the
        # coordinator's own traffic (the cost model does not price it)
        self.weight_bytes: list[list[int]] = [[0, 0] for _ in self.tiers]
        # the devices' weight exchange this round: [sent (their segments' state, to each client of a group),
        # received (each trained state that came back)]: over the devices' own links, as the cost model prices it
        self.device_bytes: list[int] = [0, 0]
        self._staged: list[tuple[int, str]] = []  # (tier, base segment's id) loaded now (sflv1: see _stage)
        self._based: dict[int, set[int]] = {}  # tier -> the blocks of its base the clients' loads copy now
        # sl, sflv2: block -> (tier, holder) whose segment keeps the block's latest weights (see _keep); a block
        # not here is up to date in self.current
        self._held: dict[int, tuple[int, str]] = {}
        self._left_by: dict[str, str] = {}  # holder -> the client whose trained segments it keeps
        self._held_on: dict[str, set[int]] = {}  # holder -> the tiers where it still has a segment
        self._swept = False  # whether this round released what earlier rounds left (_release_leftovers)

    # ------------------------------------------------------------ the three steps

    def groups(self) -> list[list[str]]:
        return [list(self.order)] if self.cfg.mode == "sflv1" else [[c] for c in self.order]

    def begin(self, group: Sequence[str]) -> dict[str, State]:
        """Load the group's server-side segments; return each client's device weights."""
        cfg = self.cfg
        base = self.current if cfg.mode == "sl" else self.global_state  # where device segments start
        server = self.global_state if cfg.mode == "sflv1" else self.current  # where server segments start
        out = {}
        try:
            self._release_leftovers()
            if cfg.mode == "sflv1":
                self._stage(group)
            elif self._held:
                self._touch()
            for cid in group:
                try:
                    self._load(cid, server)
                except TierError as e:
                    if e.code in GONE:  # a tier that is not there fails every client alike: the round, at once
                        raise
                    self.why[cid] = f"its server segments could not be loaded: {e}"  # a refusal for this client
                    self._drop(cid)
                    continue
                if cfg.mode == "sl" and self._held:  # sl hands on the device's blocks too: latest first
                    bounds = segment_bounds(self.assignment[cid], self.n_blocks, cfg.u_shape)
                    self._collect(i for a, z in ([bounds[0], bounds[-1]] if cfg.u_shape else [bounds[0]])
                                  for i in range(a, z))
                out[cid] = device_state(base, self.assignment[cid], self.n_blocks, cfg.u_shape)
                self.device_bytes[0] += state_bytes(out[cid])
        finally:
            self._unstage()
        self._group = list(out)
        return out

    def _release_leftovers(self) -> None:
        """Release the base and holder segments an earlier round could not (once a round)."""
        if self._swept:
            return
        self._swept = True
        for (t, cid), r in sorted(self.unreleased.items()):
            if is_base(cid):
                self._release_on(t, self.tiers[t], cid, self._secret_in(r, cid), r)

    def _stage(self, group: Sequence[str]) -> None:
        """Load, once per tier, the global model's server blocks that two or more of the group's clients hold
        there (a base segment per run of such blocks; beyond :data:`STAGED_RUNS` runs, the largest), for the
        clients' loads to copy there: the coordinator sends each tier one copy of them, not one per client, and
        a block only one client holds goes with its load (sent once either way; staged, it would sit on the tier
        twice while the clients load). The cost model prices exactly these bytes
        (:func:`splitfed.cost.model.staged_memory`). A tier that refuses a base (full, say) gets the clients'
        weights with their loads, as before."""
        for t, tier in enumerate(self.tiers):
            holders = Counter(i for c in group
                              for i in range(*server_bounds(self.assignment[c], self.n_blocks, self.cfg.u_shape)[t]))
            weight = {r: state_bytes(select(self.global_state, *r)) for r in _runs(sorted(
                i for i, n in holders.items() if n >= 2))}
            runs = sorted(sorted((r for r in weight if weight[r]), key=lambda r: -weight[r])[:STAGED_RUNS])
            if not runs:
                continue
            try:
                for j, (a, z) in enumerate(runs):
                    cid = f"{self._base}.{j}"  # named per round: one a lost release left behind is in nobody's way
                    load = SegmentLoad(run_id=self.cfg.run_id, client_id=cid, round=self.cfg.round,
                                       model=self.cfg.model, start=a, stop=z, replica=self._base,
                                       state=select(self.global_state, a, z), optim=self.cfg.optim, seed=self.cfg.seed,
                                       secret=self._secret(cid))
                    self._staged.append((t, cid))  # before the load: one whose reply is lost is released all the same
                    self._load_on(t, tier, cid, load)
            except TierError as e:
                if e.code in GONE:
                    raise
                self._unstage_on(t)  # its runs loaded so far would sit there unused while the clients load
                continue
            self._based[t] = {i for a, z in runs for i in range(a, z)}

    def _unstage_on(self, t: int) -> None:
        """Release the base segments on tier ``t`` (one that refused a base: its clients' loads carry their
        weights, as the docstring of :meth:`_stage` says, beside no base)."""
        for u, cid in [s for s in self._staged if s[0] == t]:
            self._staged.remove((u, cid))
            self._release_on(u, self.tiers[u], cid, self._secret(cid))

    def _unstage(self) -> None:
        """Release the base segments: once the clients' loads have copied them, the tiers need them no more."""
        self._based.clear()
        while self._staged:
            t, cid = self._staged.pop()
            self._release_on(t, self.tiers[t], cid, self._secret(cid))

    def _secret(self, cid: str) -> str:
        return self._secret_in(self.cfg.round, cid)

    def _secret_in(self, round: int, cid: str) -> str:
        """The secret ``cid`` was loaded with in ``round``: a client's own; the round's base secret for the
        coordinator's own segments (bases, holders), which no node is ever given."""
        return replace(self.cfg, round=round).secret_of(BASE if is_base(cid) else cid)

    @property
    def _base(self) -> str:
        return f"{BASE}.{self.cfg.round}"

    def _load(self, cid: str, server: State) -> None:
        """Load ``cid``'s segments on every server tier. A tier may still hold the client from an earlier
        round whose release did not reach it (UNAVAILABLE then, up again now; ``unreleased``): it refuses this
        round's secret, so that binding is released with that round's own (the run's key derives it) and the
        load is tried again."""
        self._loaded.append(cid)
        loads = tier_loads(self.cfg, cid, self.assignment[cid], server)
        for t, (tier, load) in enumerate(zip(self.tiers, loads, strict=True)):
            staged = self._based.get(t, set()) & set(range(load.start, load.stop))
            if staged:  # those blocks are on the tier already: copied there, the others sent with the load
                rest = {k: v for k, v in (load.state or {}).items() if block_of(k) not in staged}
                load = replace(load, state=rest or None, base=self._base, base_secret=self._secret(self._base))
            elif self._held and load.start < load.stop:
                load = self._handed_on(t, load)
            self._load_on(t, tier, cid, load)

    def _handed_on(self, t: int, load: SegmentLoad) -> SegmentLoad:
        """sl, sflv2: the load of blocks the clients before left on the tiers. The replica on this tier that
        holds the most of their bytes is the load's base (copied there: nothing travels); the other blocks,
        fetched first where a replica holds them (:meth:`_collect`), travel with the load."""
        held = {i: self._held.get(i) for i in range(load.start, load.stop)}
        if not any(held.values()):
            return load
        weight: dict[tuple[int, str], int] = {}
        for i, h in held.items():
            if h is not None and h[0] == t:
                weight[h] = weight.get(h, 0) + state_bytes(select(self.global_state, i, i + 1))
        base = max(weight, key=lambda h: weight[h]) if weight else None
        rest = [i for i, h in held.items() if h is None or h != base]
        self._collect(rest)
        state = {k: v for i in rest for k, v in select(self.current, i, i + 1).items()}
        if base is None:
            return replace(load, state=state)
        return replace(load, state=state or None, base=base[1], base_secret=self._secret(base[1]))

    def _collect(self, blocks: Iterable[int]) -> None:
        """Fetch the latest weights of ``blocks`` from the replicas that hold them into ``self.current``; a
        replica that holds nothing more is released. A fetch that fails fails the round: those blocks' training
        by every client since is nowhere else."""
        by: dict[tuple[int, str], list[int]] = {}
        for i in blocks:
            h = self._held.get(i)
            if h is not None:
                by.setdefault(h, []).append(i)
        for (t, cid), mine in sorted(by.items()):
            for a, z in _runs(sorted(mine)):  # only those blocks: the replica's others are stale or another's
                try:
                    part = self.tiers[t].fetch(self.cfg.run_id, cid, self._secret(cid), (a, z))
                except TierError as e:
                    raise RoundFailed(f"round {self.cfg.round}: the server-side model's blocks [{a}, {z}) could "
                                      f"not be fetched from the {self._label(t)}, where "
                                      f"{self._left_by.get(cid, cid)} left them: {e}") from None
                self.weight_bytes[t][1] += state_bytes(part)
                self.current.update(select(part, a, z))
                for i in range(a, z):
                    del self._held[i]
            self._release_if_free(cid)

    def _release_if_free(self, cid: str) -> None:
        """Release ``cid`` once it holds no block's latest weights; a holder's segment on a tier where it holds
        none of them, at once (its other tiers may still hold some)."""
        live = {t for t, c in self._held.values() if c == cid}
        if not live:
            self._release(cid)
            return
        for t in sorted(self._held_on.get(cid, set()) - live):
            self._release_on(t, self.tiers[t], cid, self._secret(cid))
            self._held_on[cid].discard(t)

    def _one_holder(self, holder: str) -> None:
        """At most one holder per tier, as the memory model prices it (beside the client training there:
        :func:`splitfed.cost.model.server_memory`). Where ``holder`` lies beside an older holder that still
        keeps the latest of some blocks (sflv2: blocks this client trained on its device), the fewer bytes of
        the two's latest blocks there are fetched (nothing is lost) and that holder's segment there released.
        Without this a tier could keep a holder per client."""
        def size(blocks: list[int]) -> int:
            return sum(state_bytes(select(self.global_state, i, i + 1)) for i in blocks)

        for t in sorted(self._held_on.get(holder, set())):
            mine = [i for i, (u, c) in self._held.items() if u == t and c == holder]
            older = [i for i, (u, c) in self._held.items() if u == t and c != holder]
            if not older:
                continue
            one = len({self._held[i][1] for i in older}) == 1  # else only fetching them all leaves one
            self._collect(mine if one and size(mine) < size(older) else older)

    def _load_on(self, t: int, tier: TierControl, cid: str, load: SegmentLoad) -> None:
        """One load; a tier that still holds ``cid`` from an earlier round whose release did not reach it
        (``unreleased``) refuses this round's secret, so that one is released with its own secret first."""
        try:
            tier.load(load)
        except TierError as e:
            left = self.unreleased.get((t, cid))
            if e.code != "PERMISSION_DENIED" or left is None:
                raise
            tier.release(self.cfg.run_id, cid, self._secret_in(left, cid))
            del self.unreleased[(t, cid)]
            tier.load(load)
        self.unreleased.pop((t, cid), None)  # bound under this round's secret: an earlier binding noted is gone
        self.weight_bytes[t][0] += state_bytes(load.state or {})

    def end(self, outcomes: Mapping[str, Outcome], lost: Mapping[str, str] | None = None) -> None:
        """Take the group's trained device weights; clients missing from ``outcomes`` failed (``lost``:
        why, where the caller knows, e.g. a node's error reply; a failed round's message names it)."""
        for cid in self._group:
            out = outcomes.get(cid)
            if out is not None:  # it came back over the device's link, kept or refused below
                self.device_bytes[1] += state_bytes(out.state)
            if out is None and lost and cid in lost:
                self.lost[cid] = lost[cid]
            if out is None or self._refused(cid, "device", out.state):
                self._drop(cid)
                continue
            if self.cfg.mode in IN_TURN:  # clients in turn: hand the model on (a dropped client doesn't)
                holder = self._keep(cid)
                if holder is None:
                    self._drop(cid)
                    continue
                if self.cfg.mode == "sl":
                    self.current.update(out.state)
                before = {c for _, c in self._held.values()}
                for t, (a, z) in enumerate(server_bounds(self.assignment[cid], self.n_blocks, self.cfg.u_shape)):
                    for i in range(a, z):
                        if holder:  # the next client's load takes it from there
                            self._held[i] = (t, holder)
                        else:  # fetched: self.current has it
                            self._held.pop(i, None)
                        if self.cfg.mode == "sflv2":
                            self.trained[i] = self.trained.get(i, 0.0) + out.result.samples
                if holder:
                    self._one_holder(holder)
                for c in before | ({holder} if holder else set()):
                    self._release_if_free(c)
            self.done[cid] = out
        self._group = []

    def finish(self) -> State:
        """The new global state; releases every segment of the round."""
        try:
            if len(self.done) < self.min_clients:
                raise self._too_few(f"{len(self.done)} of {len(self.order)} clients finished")
            self._collect(list(self._held))
            if self.cfg.mode == "sl":
                return self.current
            if self.cfg.mode == "sflv1":
                return self._finish_v1()
            return self._finish_v2()
        finally:
            self.close()

    def close(self) -> None:
        """Release whatever is still loaded (safe to call twice, and after errors)."""
        for cid in list(self._loaded):
            self._release(cid)

    @property
    def results(self) -> list[ClientResult]:
        return [self.done[c].result for c in self.order if c in self.done]

    # ------------------------------------------------------------ internals

    def _finish_v1(self) -> State:
        """Device segments, and each server tier's mean of its clients' replicas (:meth:`_reduced`)."""
        partials = self._reduced()
        if len(self.done) < self.min_clients:
            raise self._too_few(f"only {len(self.done)} clients' replicas could be used")
        contributions: list[tuple[State, float]] = [(self.done[c].state, self.done[c].result.samples)
                                                    for c in self.order if c in self.done]
        return aggregate(contributions, previous=self.global_state, partials=partials)

    def _reduced(self) -> list[Partial]:
        """Each tier's sample-weighted sum of the finished clients' replicas (sent as means, see :meth:`_partial`).
        A client a tier leaves out (weights not finite, segment gone) is dropped, and the means are asked for
        again without it: the other tiers' include it. A Reduce call that fails drops its clients (a tier that is
        not there, every client: each has a segment on every tier; see :meth:`_sums_on`)."""
        while True:
            clients = [c for c in self.order if c in self.done]
            if not clients:
                return []
            items = [ReduceItem(c, self.cfg.secret_of(c), float(self.done[c].result.samples)) for c in clients]
            partials: list[Partial] = []
            for t, tier in enumerate(self.tiers):
                sums = self._sums_on(t, tier, items)
                if sums is None:
                    break
                partials += sums
            else:
                return partials

    def _sums_on(self, t: int, tier: TierControl, items: Sequence[ReduceItem]) -> list[Partial] | None:
        """Tier ``t``'s sums of ``items``, its means asked :data:`REDUCE_BATCH` clients at a time (each call
        within one deadline, however large the fleet); None: clients were dropped, and the others' means must
        be asked again (every tier's sums so far include the dropped). A call that fails drops its batch's
        clients alone (their segments there cannot be averaged; the other batches' can, or were not asked
        yet); one that says the tier is not there (``GONE``) drops every client: none can be averaged there."""
        out = []
        for k in range(0, len(items), REDUCE_BATCH):
            batch = items[k:k + REDUCE_BATCH]
            try:
                reduced = tier.reduce(self.cfg.run_id, batch)
            except TierError as e:
                for it in items if e.code in GONE else batch:
                    self.why[it.client_id] = f"its {self._label(t)} segments could not be averaged: {e}"
                    self._drop(it.client_id)
                return None
            self.weight_bytes[t][1] += state_bytes(reduced.means)
            refused = [it.client_id for it in batch if it.client_id in reduced.refused]
            for c in refused:
                self.why[c] = f"its {self._label(t)} {reduced.refused[c]}"
                self._drop(c)
            if refused:
                return None
            out.append(self._partial(t, reduced.means, [it.client_id for it in batch]))
        return out

    def _partial(self, t: int, means: State, clients: Sequence[str]) -> Partial:
        """Tier ``t``'s means made sums again (:meth:`Partial.of_means <splitfed.aggregate.Partial.of_means>`)
        with the weight behind each key (the samples of the clients whose segment there holds it), checked
        against what those segments hold (keys, shapes, the wire's dtype, finite): a tier's reply is not taken
        on trust."""
        weights: dict[str, float] = {}
        for c in clients:
            a, z = server_bounds(self.assignment[c], self.n_blocks, self.cfg.u_shape)[t]
            w = float(self.done[c].result.samples)
            for k in select(self.global_state, a, z) if w > 0 else ():
                weights[k] = weights.get(k, 0.0) + w
        where = f"{self._label(t)}: its mean of the clients' segments"
        if set(means) != set(weights):
            odd = sorted(set(means) ^ set(weights))
            raise TierError(f"{where} holds other keys than their segments: {odd[:3]}")
        dtypes = {k: self.global_state[k].dtype for k in means}
        for k, v in means.items():
            want = wire_dtype(dtypes[k])
            if v.shape != self.global_state[k].shape or v.dtype != want or not all_finite(v):
                raise TierError(f"{where}: {k!r} is {_dtype_name(v.dtype)} {list(v.shape)}, not a finite "
                                f"{_dtype_name(want)} {list(self.global_state[k].shape)}")
        return Partial.of_means(means, weights, dtypes)

    def _finish_v2(self) -> State:
        """Device segments, and the one server-side model (as the last client to finish left it) for each
        block weighted by the samples that trained it on the servers: the clients in turn fetched it back
        and refused what was not finite, so it holds only finished clients' steps."""
        contributions: list[tuple[State, float]] = [(self.done[c].state, self.done[c].result.samples)
                                                    for c in self.order if c in self.done]
        for i, w in self.trained.items():
            contributions.append((select(self.current, i, i + 1), w))
        return aggregate(contributions, previous=self.global_state)

    def _keep(self, cid: str) -> str | None:
        """sl, sflv2: ``cid``'s trained server segments, copied on their tiers into segments of the
        coordinator's own (``@held.<round>.<n>``, under the round's base secret, which no node is given; a copy
        is refused if not finite, so what later clients copy is); then ``cid`` is released. Its node holds its
        secret: left bound, its device could still step, or write NaN into, the weights the next clients copy.
        Returns the holder's id; "" when a tier refused the copy (full of bases, say) and the weights were
        fetched into ``self.current`` instead; None (and why) when they cannot be kept."""
        hid = f"{BASE_PREFIX}held.{self.cfg.round}.{self._turn[cid]}"
        bounds = server_bounds(self.assignment[cid], self.n_blocks, self.cfg.u_shape)
        for t, (a, z) in enumerate(bounds):  # said here as a fetch said it; the copy refuses what is not finite
            if a == z:
                continue
            try:
                refused = self._unfit(t, [cid])
            except TierError as e:
                self.why[cid] = f"its {self._label(t)} segment could not be checked: {e}"
                return None
            if cid in refused:
                self.why[cid] = f"its {self._label(t)} {refused[cid]}"
                return None
        self._loaded.append(hid)  # before its loads: one whose reply is lost is released all the same
        for t, (a, z) in enumerate(bounds):
            if a == z:
                continue
            load = SegmentLoad(run_id=self.cfg.run_id, client_id=hid, round=self.cfg.round, model=self.cfg.model,
                               start=a, stop=z, replica=hid, state=None, optim=self.cfg.optim, seed=self.cfg.seed,
                               secret=self._secret(hid), base=cid, base_secret=self._secret(cid))
            try:
                self._load_on(t, self.tiers[t], hid, load)
            except TierError as e:
                if e.code in GONE:
                    raise
                self._release(hid)
                if e.code == "RESOURCE_EXHAUSTED":
                    return self._fetched(cid)
                self.why[cid] = f"its {self._label(t)} segment could not be kept: {e}"
                return None
        self._release(cid)
        self._left_by[hid] = cid
        self._held_on[hid] = {t for t, (a, z) in enumerate(bounds) if a < z}
        return hid

    def _fetched(self, cid: str) -> str | None:
        """``cid``'s trained server segments fetched into ``self.current`` (checked finite), and ``cid``
        released: "" (None, and why, if they cannot be)."""
        parts: list[State] = []
        for t, (a, z) in enumerate(server_bounds(self.assignment[cid], self.n_blocks, self.cfg.u_shape)):
            if a == z:
                continue
            try:
                part = self.tiers[t].fetch(self.cfg.run_id, cid, self._secret(cid))
            except TierError as e:
                if e.code in GONE:  # as when keeping them: a tier that is not there fails the round
                    raise
                self.why[cid] = f"fetch failed: {e}"
                return None
            self.weight_bytes[t][1] += state_bytes(part)
            if self._refused(cid, self._label(t), part):
                return None
            parts.append(part)
        for part in parts:
            self.current.update(part)
        self._release(cid)
        return ""

    def _touch(self) -> None:
        """Ask each tier after the holders of the model's latest blocks (a mean of weight 0: nothing travels): a
        use that keeps the tier's idle release from them through a long round, and a holder lost (the tier
        restarted) fails the round here, naming it, rather than at the next fetch."""
        for t in range(len(self.tiers)):
            ids = sorted({c for u, c in self._held.values() if u == t})
            if not ids:
                continue
            try:
                refused = self._unfit(t, ids)
            except TierError as e:
                if e.code in GONE:
                    raise
                refused = {c: str(e) for c in ids}
            lost = next((c for c in ids if c in refused), None)
            if lost is not None:
                raise RoundFailed(f"round {self.cfg.round}: the {self._label(t)} lost the server-side model's "
                                  f"latest blocks ({lost}: {refused[lost]})")

    def _unfit(self, t: int, ids: Sequence[str]) -> dict[str, str]:
        """Which of ``ids`` tier ``t`` would leave out of a mean, and why (not finite, gone): a mean of weight 0,
        so nothing travels."""
        return self.tiers[t].reduce(self.cfg.run_id, [ReduceItem(c, self._secret(c), 0.0) for c in ids]).refused

    def _drop(self, cid: str) -> None:
        self.failed.append(cid)
        self.done.pop(cid, None)
        self._release(cid)

    def _refused(self, cid: str, where: str, state: State) -> bool:
        """Whether ``cid``'s weights from ``where`` are not finite: a diverged or corrupt client is dropped
        rather than averaged into everyone's model."""
        key = _nonfinite(state)
        if key is not None:
            self.why[cid] = f"its {where} weights {key!r} hold NaN or infinite values"
        return key is not None

    def _label(self, t: int) -> str:
        return ("edge", "cloud")[t] if len(self.tiers) <= 2 else f"server tier {t + 1}"

    def _failures(self, show: int = 3) -> str:
        why = {**self.lost, **self.why}
        parts = [f"{c} ({why[c]})" if c in why else c for c in self.failed[:show]]
        more = f", +{len(self.failed) - show} more" if len(self.failed) > show else ""
        return ", ".join(parts) + more or "none"

    def _too_few(self, finished: str) -> RoundFailed:
        """The round fails: ``finished`` (how many clients did) is below the minimum. Clients that failed on NaN
        or infinite values (a loss, an activation, weights) mean the training diverged: said, with what to lower,
        for the checks' own words ("activation: contains NaN ...") name only the symptom. The settings are named
        by the words ``splitfed simulate``'s flags (``--lr``) and ``flwr run``'s run-config keys (``lr``) share."""
        r = self.cfg.round
        text = f"round {r}: {finished}, fewer than the minimum {self.min_clients} (failed: {self._failures()})"
        why = {**self.lost, **self.why}
        if any(w in why.get(c, "") for c in self.failed for w in NONFINITE):
            o = self.cfg.optim
            lower = f"lr (now {o.lr:g})" + (f" or weight-decay (now {o.weight_decay:g})" if o.weight_decay else "")
            text += f"; training diverged at round {r} (its loss or weights became NaN or infinite): try a smaller {lower}"
        return RoundFailed(text)

    def _release(self, cid: str) -> None:
        """Forget ``cid``'s segments on every tier. A tier found unreachable or silent (its client has retried
        already, or waited its whole deadline) is not asked again this round: a round that fails because a tier died would otherwise spend a
        client's retries per client before it says so. Its segments go at the tier's idle release."""
        if cid not in self._loaded:
            return
        self._loaded.remove(cid)
        on = self._held_on.pop(cid, None)  # a holder: only where its segments are left
        for t, tier in enumerate(self.tiers):
            if on is None or t in on:
                self._release_on(t, tier, cid, self._secret(cid))

    def _release_on(self, t: int, tier: TierControl, cid: str, secret: str, loaded_in: int | None = None) -> None:
        """A release that fails is noted in ``unreleased`` with the round that loaded it (this one unless
        ``loaded_in``), for a later round to retry. An earlier round's binding still noted there (this round's load
        of ``cid`` did not bind it: never sent, refused, or its reply lost; :meth:`_load_on` forgets it once one
        does) may be what the tier holds: a release this round's secret does not do is tried with that round's, and
        the binding that may be left is the one noted (noted under the wrong round, every later load of ``cid``
        there would be refused: the release before it is, with that round's secret)."""
        loaded_in = self.cfg.round if loaded_in is None else loaded_in
        older = self.unreleased.get((t, cid))
        left = self._not_released(t, tier, cid, secret)
        if left is not None and older is not None and older != loaded_in:
            again = self._not_released(t, tier, cid, self._secret_in(older, cid))
            if again is None:  # nothing is left: this round's binding would have refused the older secret
                left = None
            elif again != "PERMISSION_DENIED":  # else the tier holds another binding than the older one
                loaded_in = older
        if left is None:
            self.unreleased.pop((t, cid), None)
        else:
            self.unreleased[(t, cid)] = loaded_in

    def _not_released(self, t: int, tier: TierControl, cid: str, secret: str) -> str | None:
        """Release ``cid`` on tier ``t``: None once done, else why not (the tier's status code; "" when the tier
        was not asked, or its answer says nothing)."""
        if t in self._gone:
            return ""
        try:
            tier.release(self.cfg.run_id, cid, secret)
        except TierError as e:
            if e.code in GONE:
                self._gone.add(t)
            return e.code
        except Exception:  # noqa: BLE001 - a vanished tier must not mask the round's outcome
            return ""
        return None


def _runs(blocks: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted block indices as maximal ``[start, stop)`` ranges."""
    runs: list[list[int]] = []
    for i in blocks:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [(a, z) for a, z in runs]


def _nonfinite(state: State) -> str | None:
    return next((k for k, v in state.items() if not all_finite(v)), None)


def drive(rnd: SplitRound, train: Trainer, lost: Mapping[str, str] | None = None) -> State:
    """Run ``rnd`` to the end with ``train`` doing each group's client training (``lost``: why clients
    it did not return failed, as :func:`local_trainer` records them)."""
    try:
        for group in rnd.groups():
            weights = rnd.begin(group)
            rnd.end(train(rnd.cfg, {c: rnd.assignment[c] for c in weights}, weights), lost)
        return rnd.finish()
    finally:
        rnd.close()


def local_trainer(chain: Chain, data: Mapping[str, Batches], failed: dict[str, str] | None = None) -> Trainer:
    """Clients trained in this process over ``chain.link`` (the in-process form of the ClientApp).

    A client whose training raises (a tier refused its step, a diverged loss, its own model failed on a
    batch) fails the round for everyone, unless ``failed`` is given: then, as a ClientApp's error reply
    does in a Flower run, whatever it raised, it only drops that client, and ``failed`` gets the reason
    (an error splitfed does not name is logged with its traceback, as Flower logs it).
    """

    def train(cfg: RoundConfig, cuts: Mapping[str, Cuts], weights: Mapping[str, State]) -> dict[str, Outcome]:
        out = {}
        for cid, w in weights.items():
            try:
                dev, res = train_client(cfg, chain, cid, cuts[cid], w, data[cid])
            except Exception as e:
                if failed is None:
                    raise
                if not isinstance(e, SplitfedError):
                    log.exception("%s: training failed", cid)
                failed[cid] = f"{type(e).__name__}: {e}"
                continue
            out[cid] = Outcome(dev.state(), res)
        return out

    return train


def run_round(cfg: RoundConfig, chain: Chain, global_state: State, assignment: dict[str, tuple[int, ...]],
              data: dict[str, Batches]) -> tuple[State, list[ClientResult]]:
    """Train every client of ``assignment`` on its batches in this process; return the new global state."""
    rnd = SplitRound(cfg, chain.tiers, global_state, assignment)
    state = drive(rnd, local_trainer(chain, data))
    return state, rnd.results
