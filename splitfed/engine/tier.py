"""A server tier (edge, cloud, ...): holds many clients' segments and runs their steps.

It talks only to its next tier through a :class:`~splitfed.engine.link.Link`.
Every incoming message is checked before anything changes; a refused message
raises a :class:`~splitfed.errors.TierError` whose ``code`` the gRPC server
turns into a status. Every call for a client after its load (step, fetch,
release, re-load) must carry the secret the client was loaded with
(:attr:`SegmentLoad.secret`), and so must a load that joins its replica, or copies
it as its base (``base_secret``), or it is refused with PERMISSION_DENIED (a sum,
:meth:`Tier.reduce`, leaves such a client out): a tier's token lets a caller in, the secret
says which segment is its own. Steps are idempotent: a repeated sequence number
with the same request returns the cached reply, with another request (other
tensors) it is refused, and an older one is refused. A segment nobody has used for
``idle_release_s`` is released (:meth:`Tier.sweep`): a tier is a long-lived
service, and a coordinator that vanishes mid-round would otherwise leave its
clients' replicas (weights and optimizer state) held for good.

A tier computes on ``torch_device`` (the CPU, or a CUDA GPU): its segments and
optimizer state live there, and what crosses its boundary (activations, labels,
gradients, fetched weights) is on the CPU, where the checks and the codec work.

What it keeps for each client (replicas, bindings, their bytes) is :mod:`splitfed.engine.replica`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from splitfed.aggregate import Partial
from splitfed.engine import template
from splitfed.engine.checks import all_finite, check_returned, check_tensor
from splitfed.engine.compute import memory_bytes
from splitfed.engine.limits import IDLE_RELEASE_S, current_limits
from splitfed.engine.link import Link
from splitfed.engine.replica import (
    SHARED_WAIT_S,
    Binding,
    Buffers,
    Pending,
    Replica,
    holding,
    optimizer_bytes,
    same_secret,
    trained_bytes,
)
from splitfed.engine.types import (
    Reduced,
    ReduceItem,
    SegmentLoad,
    State,
    StepKey,
    StepReply,
    block_of,
    is_base,
)
from splitfed.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from splitfed.models.segment import Segment, step_rng
from splitfed.models.tying import param_sizes
from splitfed.units import mib_text

GONE_KEPT = 4096  # released segments a tier remembers, to tell a late call why its segment is gone
# a Reduce weight is a sample count: 0 (a check) or within these, so float64 sums of float32 weights stay exact
# enough and finite (a weight of 1e308 overflowed them, one of 5e-324 underflowed them; both answered OK)
MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e15
MAX_BASES = 64  # base segments a tier holds at once, over all runs (each a part of one model: bounded memory)

log = logging.getLogger(__name__)


def _digest(phase: str, *tensors: torch.Tensor) -> bytes:
    """What tells a request apart beyond its step key: its phase and its tensors (dtype, shape, bytes)."""
    h = hashlib.sha256(phase.encode())
    for t in tensors:
        t = t.detach()
        h.update(f"|{t.dtype}|{list(t.shape)}|".encode())
        if t.numel():
            h.update(t.cpu().reshape(-1).contiguous().view(torch.uint8).numpy().data)
    return h.digest()


def _drop_reply(b: Binding) -> None:
    """Let go of the previous step's cached reply once the next step is checked and admitted (under the replica's
    lock): a retry of that step is stale from now on (:meth:`Tier._admit`), and kept until this step's reply
    replaced it, its tensors (a relaying tier's input gradient) sat beside this step's activations."""
    b.cached, b.digest = None, b""


class _Sent(torch.autograd.Function):
    """A stand-in (one element's bytes) for a tensor sent on, joined to its graph: its backward hands the gradient
    to the tensor's own ``grad_fn`` unchanged, so the tensor's data need not be kept for it."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, out: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(out.shape, (0,) * out.dim(), dtype=out.dtype, device=out.device)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _kept(out: torch.Tensor) -> torch.Tensor:
    """What a U-shape forward keeps of its output until its backward: its shape, dtype and graph, not its bytes
    (what it sent on is the receiver's). An op that needs its output for its backward (a ReLU, a
    sigmoid) saved it in the graph itself, so only bytes no backward reads are let go of."""
    if out.requires_grad:
        return _Sent.apply(out)
    return torch.empty_strided(out.shape, (0,) * out.dim(), dtype=out.dtype, device=out.device)


def weight_refusal(weight: float) -> str | None:
    """Why a Reduce weight is refused (None: it is not): a sample count, 0 (a check) or in MIN_WEIGHT..MAX_WEIGHT."""
    if weight == 0 or MIN_WEIGHT <= weight <= MAX_WEIGHT:
        return None
    return f"its weight must be 0 or in {MIN_WEIGHT:g}..{MAX_WEIGHT:g} (its samples), got {weight}"


def _check_names(spec: SegmentLoad) -> None:
    """Run, client, replica and base names are printable: the tier's log and status lines show them."""
    for what, v in (("run_id", spec.run_id), ("client_id", spec.client_id), ("replica", spec.replica),
                    ("base", spec.base)):
        if not v.isprintable():
            raise InvalidArgument(f"{what} {v!r} holds a control character (a line break, a tab, ...)")


def _few(names: list[str], show: int = 3) -> str:
    """``a, b, c +2 more``: a log line names a few runs, not thousands."""
    return ", ".join(names[:show]) + (f" +{len(names) - show} more" if len(names) > show else "")


def _put_back(saved: Buffers) -> None:
    with torch.no_grad():
        for t, old in saved:
            t.copy_(old)


@contextlib.contextmanager
def _undone_on_error(segment: nn.Module) -> Iterator[Buffers]:
    """A forward updates BatchNorm's running statistics at once; a step that fails after it (the next tier
    unreachable or refusing, a diverged loss) must not keep them, or its retry would count the batch twice.
    Yields what it saved: a U-shape forward keeps it until its backward (:meth:`Tier._abandon`)."""
    saved = [(t, t.clone()) for t in segment.buffers()]
    try:
        yield saved
    except BaseException:
        _put_back(saved)
        raise


@contextlib.contextmanager
def _no_gradient_left(b: Binding) -> Iterator[None]:
    """A step or U-shape backward that fails (half-way through its backward, say) leaves no gradient on the
    segment: the next step on its replica (another client's, on a shared one) would apply it with its own."""
    try:
        yield
    except BaseException:
        if b.optim is not None:
            b.optim.zero_grad(set_to_none=True)
        raise


class Tier:
    """One tier of the chain for many clients and runs."""

    def __init__(self, name: str = "edge", next: Link | None = None, *, max_batch: int = 4096,
                 max_clients: int = 10_000, idle_release_s: float | None = IDLE_RELEASE_S,
                 clock: Callable[[], float] = time.monotonic, torch_device: str | torch.device = "cpu",
                 max_held_bytes: int | None = None) -> None:
        """``max_held_bytes``: what its segments may hold at once (``BuildLimits.held_bytes``; None: this
        process's limit, whose 0 is three quarters of the memory of ``torch_device``)."""
        if idle_release_s is not None and not (math.isfinite(idle_release_s) and idle_release_s > 0):
            raise ValueError(f"idle_release_s must be a positive number of seconds or None, got {idle_release_s}")
        self.name = name
        self.next = next
        self.torch_device = torch.device(torch_device)
        self.max_batch = max_batch
        self.max_clients = max_clients
        self.idle_release_s = idle_release_s
        held = current_limits().held_bytes if max_held_bytes is None else max_held_bytes
        self.max_held_bytes = held or memory_bytes(self.torch_device) * 3 // 4
        self.held = 0  # bytes its segments hold now (replicas' blocks, bindings' optimizers)
        self._reserved = 0  # bytes loads in flight may add
        self._clock = clock
        self._born = clock()  # a segment asked for that this tier never held: loaded into a process before it?
        self._gone: OrderedDict[tuple[str, str], str] = OrderedDict()  # (run, client) -> why its segment went
        self._lock = threading.Lock()
        self._replicas: dict[tuple[str, str], Replica] = {}
        self._bindings: dict[tuple[str, str], Binding] = {}
        self._bases = 0  # of the bindings, the coordinators' base segments (is_base): counted, not searched
        self._claims: dict[tuple[str, str], list] = {}  # (run, client) -> [secret, loads of it in flight]
        self.steps_served = 0  # steps (and U-shape forwards and backwards) applied since the tier started

    # ------------------------------------------------------------ control

    def load(self, spec: SegmentLoad) -> None:
        """Bind a client to ``[start, stop)`` of a replica, writing ``state`` if given."""
        n = template.num_blocks(spec.model)
        if not 0 <= spec.start <= spec.stop <= n:
            raise InvalidArgument(f"segment [{spec.start}, {spec.stop}) is outside the model's {n} blocks")
        if spec.round < 0:
            raise InvalidArgument(f"round must be >= 0, got {spec.round}: no step could ever use this segment")
        _check_names(spec)
        rkey = (spec.run_id, spec.replica)
        with self._lock:
            bkey = (spec.run_id, spec.client_id)
            self._authorize_load(spec, rkey)
            if bkey not in self._bindings and self._full(spec):
                self._sweep_locked()  # a full tier first lets go of what vanished coordinators left
            if bkey not in self._bindings and self._full(spec):
                raise ResourceExhausted(f"tier {self.name} already holds {MAX_BASES} base segments" if
                                        is_base(spec.client_id) else
                                        f"tier {self.name} already serves {self.max_clients} clients")
            base = self._base(spec)
            need = self._reserve(spec, rkey, bkey)  # last: nothing after it refuses before the try below
            # got or made under the lock: clients of one replica loaded at once all bind to the same one
            replica = self._replicas.setdefault(rkey, Replica(secret=spec.secret, model=spec.model,
                                                                 base=is_base(spec.client_id)))
            replica.loading += 1
            # the client is this load's until it ends: a load of it under another secret meanwhile is refused
            # before it writes anything (else it could write a replica and only then be refused)
            self._claims.setdefault(bkey, [spec.secret, 0])[1] += 1
        try:
            binding, added = self._bind(spec, replica, base)
        except BaseException:
            with self._lock:
                replica.loading -= 1
                self._reserved -= need
                self._unclaim(bkey)
                if not replica.users and not replica.loading and self._replicas.get(rkey) is replica:
                    self._drop_replica(rkey)  # a failed first load leaves no empty replica behind
            raise
        with self._lock:
            replica.loading -= 1
            self._reserved -= need
            replica.held += added
            self.held += added
            self._unclaim(bkey)
            # no second authorisation: the claim kept loads under another secret off the client, and a replica
            # with a load under way is never dropped, so none under another secret replaced it meanwhile
            old = self._bindings.get(bkey)
            if old is not None:
                self._unbind(bkey, old)  # bound again below: nothing to remember
            replica.users.add(spec.client_id)
            if self._replicas.get(rkey) is not replica:  # the old binding was its last user: held again
                self.held += replica.held
            self._replicas[rkey] = replica
            self._bindings[bkey] = binding
            self._gone.pop(bkey, None)
            self.held += binding.held
            self._bases += is_base(spec.client_id)

    def _reserve(self, spec: SegmentLoad, rkey: tuple[str, str], bkey: tuple[str, str]) -> int:
        """The bytes the load may add, set aside under ``self._lock``; RESOURCE_EXHAUSTED if they would take
        the tier's segments over ``max_held_bytes`` (after letting go of what vanished coordinators left)."""
        def need_now() -> tuple[int, int]:  # what it adds, and what a re-load frees (the client's optimizer)
            replica = self._replicas.get(rkey)
            have = replica.blocks if replica is not None else {}
            need = 0
            for i in range(spec.start, spec.stop):
                weights, trains = trained_bytes(spec, i)
                need += (weights + trains) * (i not in have) + optimizer_bytes(spec, i)
            old = self._bindings.get(bkey)
            return need, old.held if old is not None else 0

        need, freed = need_now()
        if self.held + self._reserved + need - freed > self.max_held_bytes:
            self._sweep_locked()
            need, freed = need_now()  # the sweep may have let go of the replica it would have joined
            if self.held + self._reserved + need - freed > self.max_held_bytes:
                loading = f" and loads under way may add {mib_text(self._reserved)}" if self._reserved else ""
                raise ResourceExhausted(
                    f"tier {self.name}: load of client {spec.client_id!r} would add {mib_text(need)}: its "
                    f"segments hold {mib_text(self.held)}{loading}, and it holds at most "
                    f"{mib_text(self.max_held_bytes)} (splitfed tier --max-held-mb)")
        self._reserved += need
        return need

    def _drop_replica(self, rkey: tuple[str, str]) -> None:
        """Let go of a replica nobody binds nor loads (under ``self._lock``)."""
        self.held -= self._replicas.pop(rkey).held

    def _bind(self, spec: SegmentLoad, replica: Replica, base: Replica | None = None) -> tuple[Binding, int]:
        """The binding of ``spec`` to ``replica``, its missing blocks written into it, the blocks its state leaves
        out copied from ``base``; nothing changes if refused.

        The base's blocks are copied straight into the segment, under the base's lock too (a load of the base
        meanwhile cannot tear them), taken for that copy alone: loads of many clients from one base (SplitFed v1's
        round start) build their segments at once. A copy of them first would sit beside the new segment, a
        second segment's weights on the tier for a moment, which the cost model's memory does not price. The
        locks nest replica, then base; loads from each other's replica at once (no coordinator sends those)
        would wait ``SHARED_WAIT_S`` and be refused UNAVAILABLE, not hang."""
        with holding(replica, self.name, "load"):
            copied = self._from_base(spec, base) if base is not None else []
            missing = [i for i in range(spec.start, spec.stop) if i not in replica.blocks]
            new = ({i: m.to(self.torch_device) for i, m in template.copy_blocks(spec.model, spec.start,
                                                                                 spec.stop).items()}
                   if missing else {})
            segment = Segment(
                {str(i): replica.blocks[i] if i in replica.blocks else new[i] for i in range(spec.start, spec.stop)},
                spec.start, spec.stop)
            self._check_state(segment, spec.state or {}, [i for i in missing if i not in copied], spec.replica)
            # nothing has changed yet: now commit
            with holding(base, self.name, "load from base") if base is not None else contextlib.nullcontext():
                state = {f"{i}.{k}": v for i in copied for k, v in base.blocks[i].state_dict().items()} \
                    if base is not None else {}
                state.update(spec.state or {})  # the base's tensors themselves: loading copies them in place
                if state:
                    with torch.no_grad():
                        segment.load_state_dict(state, strict=False)
            for i in missing:
                replica.blocks[i] = new[i]
            added = sum(sum(trained_bytes(spec, i)) for i in missing)
            segment.train()
            in_shape, in_dtype = template.boundary(spec.model, spec.start)
            out_shape, _ = template.boundary(spec.model, spec.stop)
            # the binding keeps the load's settings, not its tensors (written into the segment above): a tier
            # holding each client's weights twice would halve the clients it can serve
            slots = sum(optimizer_bytes(spec, i) for i in range(spec.start, spec.stop))
            optim = None if is_base(spec.client_id) else spec.optim.build(list(segment.parameters()))
            return Binding(replace(spec, state=None), replica, segment, optim,
                            in_shape, in_dtype, out_shape, template.trains_before(spec.model, spec.start),
                            ends_model=spec.stop == template.num_blocks(spec.model), last_used=self._clock(),
                            held=slots), added

    def _full(self, spec: SegmentLoad) -> bool:
        """Whether another binding like ``spec`` would pass the tier's bounds (under ``self._lock``): clients
        up to ``max_clients``, and besides them coordinators' base segments (held while a round's clients load)
        up to ``MAX_BASES``."""
        if is_base(spec.client_id):
            return self._bases >= MAX_BASES
        return len(self._bindings) - self._bases >= self.max_clients

    def _base(self, spec: SegmentLoad) -> Replica | None:
        """The replica a load copies its weights from (``spec.base``), if its secret is ``base_secret``
        (under ``self._lock``)."""
        if not spec.base:
            return None
        if spec.base == spec.replica:
            raise InvalidArgument(f"load of client {spec.client_id!r}: replica {spec.replica!r} cannot be its own base")
        base = self._replicas.get((spec.run_id, spec.base))
        if base is None:
            raise FailedPrecondition(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r}: "
                                     f"its base {spec.base!r} is not loaded here (load the base first)")
        if not same_secret(base.secret, spec.base_secret):
            raise PermissionDenied(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r} "
                                   f"refused: base {spec.base!r} is held under another secret")
        if base.model is not None and base.model != spec.model:
            raise FailedPrecondition(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r}: "
                                     f"its base {spec.base!r} holds blocks of another model ({base.model.name}, "
                                     f"not {spec.model.name})")
        users = [b for u in base.users if (b := self._bindings.get((spec.run_id, u))) is not None]
        if any(b.holds_lock for b in users):  # said now: waiting for it would read as a tier that is gone
            raise FailedPrecondition(f"tier {self.name}: load of client {spec.client_id!r}: its base "
                                     f"{spec.base!r} is in a U-shape step waiting for its backward")
        now = self._clock()
        for b in users:  # copying a base is a use of it: its idle release counts from here
            b.last_used = now
        return base

    def _from_base(self, spec: SegmentLoad, base: Replica) -> list[int]:
        """The blocks of ``[start, stop)`` with state that the load leaves out, to copy from ``base``; refused if
        the base lacks one (a replica's blocks are only ever added: no lock needed to ask)."""
        given = {block_of(k) for k in spec.state or {}}
        wanted = [i for i in range(spec.start, spec.stop) if i not in given and template.has_state(spec.model, i)]
        lacking = [i for i in wanted if i not in base.blocks]
        if lacking:
            raise FailedPrecondition(f"tier {self.name}: load of client {spec.client_id!r}: its base "
                                     f"{spec.base!r} holds no block {lacking[0]} of [{spec.start}, {spec.stop})")
        return wanted

    def _authorize_load(self, spec: SegmentLoad, rkey: tuple[str, str]) -> None:
        """A load may rebind a client, or bind to a replica that exists, only with their secret (under
        ``self._lock``): else any caller could overwrite, reset or read another client's weights. A replica
        holds one model's blocks: a load of another model is refused, not bound to blocks of another shape."""
        bkey = (spec.run_id, spec.client_id)
        old = self._bindings.get(bkey)
        if old is not None and not same_secret(old.spec.secret, spec.secret):
            raise PermissionDenied(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r} "
                                   "refused: the client is bound already, with another secret (only the "
                                   "coordinator that loaded it may load it again)")
        claim = self._claims.get(bkey)
        if claim is not None and not same_secret(claim[0], spec.secret):
            raise PermissionDenied(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r} "
                                   "refused: the client is being loaded now, with another secret")
        replica = self._replicas.get(rkey)
        if replica is not None and not same_secret(replica.secret, spec.secret):
            raise PermissionDenied(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r} "
                                   f"refused: replica {spec.replica!r} is held under another secret")
        if replica is not None and replica.model is not None and replica.model != spec.model:
            raise FailedPrecondition(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r} "
                                     f"refused: replica {spec.replica!r} holds blocks of another model "
                                     f"({replica.model.name}, not {spec.model.name} as this load says)")
        if replica is not None and replica.base != is_base(spec.client_id):  # its blocks are counted as its own
            raise FailedPrecondition(f"tier {self.name}: load of client {spec.client_id!r} in run {spec.run_id!r} "
                                     f"refused: replica {spec.replica!r} holds " +
                                     ("a coordinator's base segment, which never trains" if replica.base else
                                      "a client's segment, which trains: a base segment needs a replica of its own"))

    def _unclaim(self, bkey: tuple[str, str]) -> None:
        """A load of ``bkey`` ended (under ``self._lock``)."""
        claim = self._claims[bkey]
        claim[1] -= 1
        if not claim[1]:
            del self._claims[bkey]

    @staticmethod
    def _check_state(segment: Segment, state: State, missing: list[int], replica: str) -> None:
        """A load writes whole blocks; blocks it leaves out must already be in the replica."""
        own = segment.state_dict()
        extra = sorted(set(state) - set(own))
        if extra:
            raise InvalidArgument(f"state keys outside blocks [{segment.start}, {segment.stop}): {extra[:3]}")
        for i in range(segment.start, segment.stop):
            keys = [k for k in own if block_of(k) == i]
            have = [k for k in keys if k in state]
            if have and len(have) != len(keys):
                raise InvalidArgument(f"state of block {i} is partial: missing {sorted(set(keys) - set(have))[:3]}")
            if not have and i in missing and keys:
                raise FailedPrecondition(f"replica {replica!r} holds no weights for block {i}: "
                                         "the load must carry its state")
        for k, v in state.items():
            if v.shape != own[k].shape or v.dtype != own[k].dtype:
                raise InvalidArgument(f"state {k!r}: {str(v.dtype)} {list(v.shape)} does not match "
                                      f"{str(own[k].dtype)} {list(own[k].shape)}")
            if not all_finite(v):
                raise InvalidArgument(f"state {k!r} contains NaN or infinite values")

    def fetch(self, run_id: str, client_id: str, secret: str = "", blocks: tuple[int, int] | None = None) -> State:
        """The client's segment weights; ``blocks``: only those of ``[start, stop)``, a range inside the segment."""
        b = self._binding(run_id, client_id, secret)
        if blocks is not None and not b.spec.start <= blocks[0] < blocks[1] <= b.spec.stop:
            raise InvalidArgument(f"tier {self.name}: fetch of client {client_id!r}: blocks [{blocks[0]}, {blocks[1]}) "
                                  f"are not a range inside its segment [{b.spec.start}, {b.spec.stop})")
        if b.holds_lock:
            raise FailedPrecondition(f"fetch of client {client_id!r} while its U-shape step {b.last_seq} "
                                     "waits for its backward")
        with holding(b.replica, self.name, "fetch"):
            return {k: v.detach().to("cpu", copy=True) for k, v in b.segment.state_dict().items()
                    if blocks is None or blocks[0] <= block_of(k) < blocks[1]}

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced:
        """The sample-weighted mean of the listed clients' trained segments (:class:`Reduced`), summed here in
        float64 and sent as :meth:`Partial.means <splitfed.aggregate.Partial.means>` says (float32 for float32
        keys): one copy of the segment leaves the tier instead of every client's replica. A client whose weights
        are not finite, that has no segment here, or whose secret is not its binding's, is left out and named."""
        ids = [it.client_id for it in items]
        twice = next((c for c in ids if ids.count(c) > 1), None) if len(set(ids)) != len(ids) else None
        if twice is not None:
            raise InvalidArgument(f"reduce: client {twice!r} is listed twice")
        for it in items:
            why = weight_refusal(it.weight)
            if why is not None:
                raise InvalidArgument(f"reduce: client {it.client_id!r}: {why}")
        refused: dict[str, str] = {}
        with self._lock:
            found: dict[str, Binding] = {}
            for it in items:
                b = self._bindings.get((run_id, it.client_id))
                if b is None:  # read after "its edge ": its reason
                    refused[it.client_id] = f"segment is missing: tier {self.name}: {self._not_loaded(run_id, it.client_id)}"
                elif not same_secret(b.spec.secret, it.secret):  # that client alone: as its own fetch would be
                    refused[it.client_id] = str(self._denied("reduce", run_id, it.client_id, it.secret))
                else:
                    b.last_used = self._clock()
                    found[it.client_id] = b
        total = Partial()
        for it in items:
            b = found.get(it.client_id)
            if b is None:
                continue
            if b.holds_lock:
                refused[it.client_id] = f"its U-shape step {b.last_seq} waits for its backward"
                continue
            with holding(b.replica, self.name, "reduce"):  # summed on the CPU: a GPU tier's memory is its steps'
                state = {k: v.detach().to("cpu") for k, v in b.segment.state_dict().items()}
                bad = next((k for k, v in state.items() if not all_finite(v)), None)
                if bad is None:
                    total.add(state, it.weight)
            if bad is not None:
                refused[it.client_id] = f"weights {bad!r} hold NaN or infinite values"
        means = total.means()
        bad = next((k for k, v in means.items() if not all_finite(v)), None)
        if bad is not None:  # finite weights, each under MAX_WEIGHT: only weights of float64 near its limit
            raise InvalidArgument(f"reduce: the mean of {bad!r} is not finite (its weighted sum overflows)")
        return Reduced(means, {it.client_id: refused[it.client_id] for it in items if it.client_id in refused})

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        with self._lock:
            b = self._bindings.get((run_id, client_id))
            if b is not None and not same_secret(b.spec.secret, secret):
                raise self._denied("release", run_id, client_id, secret)
            if b is not None:
                self._unbind((run_id, client_id), b, "released by its coordinator")

    def _unbind(self, bkey: tuple[str, str], b: Binding, why: str | None = None) -> None:
        """Drop a binding; a later call for it is told ``why`` it is gone (the last GONE_KEPT remembered)."""
        if why is not None:
            self._gone[bkey] = why
            self._gone.move_to_end(bkey)
            while len(self._gone) > GONE_KEPT:
                self._gone.popitem(last=False)
        if b.holds_lock:
            b.holds_lock = False
            b.replica.lock.release()
        del self._bindings[bkey]
        self.held -= b.held
        self._bases -= is_base(bkey[1])
        b.replica.users.discard(bkey[1])
        rkey = (bkey[0], b.spec.replica)
        if not b.replica.users and not b.replica.loading and self._replicas.get(rkey) is b.replica:
            self._drop_replica(rkey)

    def clients(self) -> int:
        with self._lock:
            return len(self._bindings)

    def holding(self) -> tuple[int, list[str], int]:
        """Segments bound now, the runs they belong to, and steps served since the tier started."""
        with self._lock:
            return len(self._bindings), sorted({r for r, _ in self._bindings}), self.steps_served

    def status(self) -> str:
        """One line for an operator: what the tier holds now, and what it has served."""
        with self._lock:
            blocks = [m for r in self._replicas.values() for m in list(r.blocks.values())]  # a load may add some
        segments, runs, steps = self.holding()
        weights = param_sizes([t for m in blocks for t in [*m.parameters(), *m.buffers()]])[1]  # a .data tie once
        return (f"tier {self.name}: {segments} segment(s) of {len(runs)} run(s){f' ({_few(runs)})' if runs else ''}, "
                f"{mib_text(weights)} of weights held; {steps} step(s) served")

    def sweep(self) -> list[tuple[str, str]]:
        """Release every segment unused for ``idle_release_s``; returns their (run, client) keys.

        A coordinator releases its segments at the end of each round, so only a vanished one
        leaves segments this idle. A late call for a released one gets NOT_FOUND.
        """
        with self._lock:
            return self._sweep_locked()

    def _sweep_locked(self) -> list[tuple[str, str]]:
        if self.idle_release_s is None:
            return []
        horizon = self._clock() - self.idle_release_s
        stale = [k for k, b in self._bindings.items() if b.last_used < horizon]
        for k in stale:
            self._unbind(k, self._bindings[k], f"released unused for {self.idle_release_s:.0f} s")
        if stale:
            log.warning("tier %s: released %d segment(s) unused for %.0f s (their coordinator gone?) of run(s) %s",
                        self.name, len(stale), self.idle_release_s, _few(sorted({r for r, _ in stale})))
        return stale

    # ------------------------------------------------------------ data path

    def _binding(self, run_id: str, client_id: str, secret: str) -> Binding:
        """The client's binding, if ``secret`` is its secret (else PERMISSION_DENIED; NOT_FOUND if none)."""
        with self._lock:
            b = self._bindings.get((run_id, client_id))
            allowed = b is not None and same_secret(b.spec.secret, secret)
            if b is not None and allowed:
                b.last_used = self._clock()  # a refused call does not keep a segment from its idle release
        if b is None:
            raise NotFound(f"tier {self.name}: {self._not_loaded(run_id, client_id)}")
        if not allowed:
            raise self._denied("call", run_id, client_id, secret)
        return b

    def _not_loaded(self, run_id: str, client_id: str) -> str:
        """Why a client has no segment here, as far as the tier can tell: released (by its coordinator, or
        unused), or, on a tier too young to have released it, lost with the tier process before this one."""
        text = f"no segment loaded for client {client_id!r} in run {run_id!r}"
        why = self._gone.get((run_id, client_id))
        if why is not None:
            return f"{text} ({why})"
        up = self._clock() - self._born
        if up <= (self.idle_release_s or IDLE_RELEASE_S):  # young: a segment it never held was not released here
            return text + (f" (this tier started {up:.0f} s ago: a segment loaded before then was lost with the "
                           "process that held it)")
        if self.idle_release_s is not None:  # forgotten, or never loaded
            return text + f" (segments unused for {self.idle_release_s:.0f} s are released)"
        return text

    def _denied(self, what: str, run_id: str, client_id: str, secret: str) -> PermissionDenied:
        """The refusal of a call for a client that does not carry its binding's secret (never shown)."""
        return PermissionDenied(f"tier {self.name}: {what} for client {client_id!r} in run {run_id!r} refused: "
                                f"{'it carries another secret than' if secret else 'it carries no secret, but'} "
                                "the one the client was loaded with (each client's calls must carry the secret "
                                "its coordinator gave it for the round)")

    def _cached(self, b: Binding, key: StepKey, phase: str, digest: bytes) -> object | None:
        """The cached reply of a retried call (the seq and phase last applied), else None; a retry whose request
        is not the one applied (other tensors) is refused: its sender would take another request's reply."""
        if key.seq != b.last_seq or phase != b.last_phase or b.cached is None:
            return None
        if not hmac.compare_digest(digest, b.digest):
            raise FailedPrecondition(f"tier {self.name}: {phase} {key.seq} of client {key.client_id!r} was applied "
                                     "already with another request: a retry must resend the same tensors")
        return b.cached

    def _admit(self, b: Binding, key: StepKey, phase: str, digest: bytes) -> object | None:
        """Sequence check; returns the cached reply of a retried call."""
        if key.round != b.spec.round:
            raise FailedPrecondition(f"step for round {key.round}, but round {b.spec.round} is loaded")
        cached = self._cached(b, key, phase, digest)
        if cached is not None:
            return cached
        expect_same = phase == "backward"
        want = b.last_seq if expect_same else b.last_seq + 1
        if expect_same and b.last_phase != "forward":
            raise FailedPrecondition(f"backward of step {key.seq} without its forward")
        if not expect_same and b.last_phase == "forward":
            raise FailedPrecondition(f"step {key.seq} before the backward of step {b.last_seq}")
        if key.seq < want:
            raise FailedPrecondition(f"stale step {key.seq}: step {b.last_seq} was already applied")
        if key.seq != want:
            raise FailedPrecondition(f"out-of-order step {key.seq}: expected {want}")
        return None

    def _labels(self, b: Binding, y: torch.Tensor, batch: int) -> None:
        if y.dtype != torch.int64 or y.dim() != 1 or y.shape[0] != batch:
            raise InvalidArgument(f"labels must be int64 of shape [{batch}], got {str(y.dtype)} {list(y.shape)}")
        k = b.spec.model.num_classes
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= k):
            raise InvalidArgument(f"labels must lie in 0..{k - 1}")

    def _input(self, b: Binding, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, b.in_shape, b.in_dtype, "activation", self.max_batch)
        vocab = b.spec.model.vocab
        if b.spec.start == 0 and vocab and x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab):
            raise InvalidArgument(f"token ids must lie in 0..{vocab - 1} (the model's vocab), got "
                                  f"{int(x.min())}..{int(x.max())}")
        x = x.detach().to(self.torch_device)
        if b.grad_in and x.is_floating_point():  # else nobody upstream could use it: none is sent
            x.requires_grad_(True)
        return x

    def _finish(self, b: Binding, key: StepKey, phase: str, reply: object, digest: bytes) -> None:
        if b.optim is not None:
            b.optim.step()
            b.optim.zero_grad(set_to_none=True)
        b.last_seq, b.last_phase, b.cached, b.digest = key.seq, phase, reply, digest
        with self._lock:
            self.steps_served += 1

    def _onward(self, b: Binding) -> Link | None:
        """The next tier, unless this one ends the client's chain (no block of it lies beyond)."""
        return None if b.spec.loss_here else self.next

    def _rng(self, b: Binding, key: StepKey) -> int:
        return step_rng(b.spec.seed, key.client_id, key.round, key.seq)

    def _trainer(self, key: StepKey) -> Binding:
        """The binding a step or forward runs on: a coordinator's own segment (a base, a holder) never trains,
        and is held without room for a gradient or optimizer slots (:func:`trained_bytes`)."""
        b = self._binding(key.run_id, key.client_id, key.secret)
        if is_base(key.client_id):
            raise FailedPrecondition(f"tier {self.name}: {key.client_id!r} in run {key.run_id!r} is a coordinator's "
                                     "base segment: it is copied and summed, never stepped")
        return b

    def step(self, key: StepKey, activation: torch.Tensor, labels: torch.Tensor) -> StepReply:
        b = self._trainer(key)
        if b.holds_lock:
            raise FailedPrecondition(f"step {key.seq} while U-shape step {b.last_seq} waits for its backward")
        if self._onward(b) is None and not b.ends_model:
            raise FailedPrecondition(f"tier {self.name}: step {key.seq} of client {key.client_id!r}: its segment "
                                     f"[{b.spec.start}, {b.spec.stop}) ends the chain but not the model, so the loss "
                                     "cannot be computed here (a U-shape client calls forward and backward)")
        digest = _digest("step", activation, labels)
        with holding(b.replica, self.name, "step"):
            cached = self._admit(b, key, "step", digest)
            if cached is not None:
                return cached  # type: ignore[return-value]
            x = self._input(b, activation)
            self._labels(b, labels, x.shape[0])
            _drop_reply(b)
            with _no_gradient_left(b), _undone_on_error(b.segment):
                reply = self._step(b, key, x, labels)
            self._finish(b, key, "step", reply, digest)
            return reply

    def _step(self, b: Binding, key: StepKey, x: torch.Tensor, labels: torch.Tensor) -> StepReply:
        out = b.segment(x, rng=self._rng(b, key))
        onward = self._onward(b)
        if onward is None:
            here = labels.to(self.torch_device)
            loss = F.cross_entropy(out, here)
            value = float(loss.detach())
            if not math.isfinite(value):
                raise InvalidArgument("loss is not finite (diverged); the step was not applied")
            if loss.requires_grad:
                loss.backward()
            correct = int((out.detach().argmax(1) == here).sum())
        else:
            down = onward.step(key, self._out(out), labels)
            if down.grad is not None:
                check_returned(down.grad, out, f"tier {self.name}: step {key.seq} of {key.client_id}: "
                               "the next tier's gradient")
                if out.requires_grad:
                    out.backward(down.grad.to(self.torch_device))
            value, correct = down.loss, down.correct
        return StepReply(self._grad_out(x), value, correct)

    @staticmethod
    def _out(t: torch.Tensor) -> torch.Tensor:
        """What leaves the tier: detached, on the CPU (a no-op for a CPU tier)."""
        return t.detach().cpu()

    def _grad_out(self, x: torch.Tensor) -> torch.Tensor | None:
        """The gradient of a step's input, to send back (None: nobody upstream trains)."""
        return self._out(x.grad) if x.requires_grad and x.grad is not None else None

    def forward(self, key: StepKey, activation: torch.Tensor) -> torch.Tensor:
        b = self._trainer(key)
        digest = _digest("forward", activation)
        if b.holds_lock:
            # this client's forward waits for its backward and keeps the replica's lock: a retry of it gets its
            # reply again; anything else is refused, and the lock stays where it is
            cached = self._admit(b, key, "forward", digest)
            if cached is not None:
                return cached  # type: ignore[return-value]
            raise FailedPrecondition(f"step {key.seq} before the backward of step {b.last_seq}")  # pragma: no cover
        x = self._input(b, activation)  # checked before waiting for the lock: a malformed call waits for nobody
        if not b.replica.lock.acquire(timeout=SHARED_WAIT_S):
            raise Unavailable(f"tier {self.name}: replica {b.spec.replica!r} busy for {SHARED_WAIT_S:.0f}s")
        try:  # the lock is ours from here: it is let go of on any refusal, kept only for the backward
            cached = self._admit(b, key, "forward", digest)
            if cached is not None:  # pragma: no cover - a forward's reply is cached only while its lock is held
                b.replica.lock.release()
                return cached  # type: ignore[return-value]
            before = (b.last_seq, b.last_phase)
            _drop_reply(b)
            with _undone_on_error(b.segment) as buffers:
                out = b.segment(x, rng=self._rng(b, key))
                onward = self._onward(b)
                result = onward.forward(key, self._out(out)) if onward is not None else self._out(out)
                out = _kept(out)
        except BaseException:
            b.replica.lock.release()
            raise
        with self._lock:  # as _unbind sees it: a segment released meanwhile must not keep the lock for good
            bound = self._bindings.get((key.run_id, key.client_id)) is b
            b.holds_lock = bound
        if not bound:
            b.replica.lock.release()
            raise NotFound(f"tier {self.name}: the segment of client {key.client_id!r} was released during "
                           f"its forward {key.seq}")
        b.pending = Pending(x, out, *before, buffers)
        b.last_seq, b.last_phase, b.cached, b.digest = key.seq, "forward", result, digest
        return result

    def backward(self, key: StepKey, grad: torch.Tensor | None) -> torch.Tensor | None:
        """U-shape: the gradient of the forward's output in (None: none reached it, and the step is released
        without a backward: no block of the chain gets a gradient), the gradient of its input out."""
        b = self._trainer(key)
        # a retry that comes while the first is still running waits for it, then takes its reply; two at once
        # would both pass the checks below and run the graph's backward twice (the second: an internal error)
        if not b.backward.acquire(timeout=SHARED_WAIT_S):
            raise Unavailable(f"tier {self.name}: backward {key.seq} of client {key.client_id!r}: another "
                              f"backward of it has run for {SHARED_WAIT_S:.0f}s")
        try:
            return self._backward(b, key, grad)
        finally:
            b.backward.release()

    def _backward(self, b: Binding, key: StepKey, grad: torch.Tensor | None) -> torch.Tensor | None:
        if key.round != b.spec.round:
            raise FailedPrecondition(f"step for round {key.round}, but round {b.spec.round} is loaded")
        digest = _digest("backward", *(() if grad is None else (grad,)))
        cached = self._cached(b, key, "backward", digest)
        if cached is not None:
            return cached[0]  # type: ignore[index]
        if not b.holds_lock or b.pending is None:
            raise FailedPrecondition(f"backward of step {key.seq} without its forward")
        self._admit(b, key, "backward", digest)
        x, out = b.pending.x, b.pending.out
        onward = self._onward(b)
        want = b.out_shape if onward is None else None
        if want is not None and grad is not None:
            check_tensor(grad, want, out.dtype, "gradient", self.max_batch)
            if grad.shape[0] != out.shape[0]:
                raise InvalidArgument(f"gradient batch {grad.shape[0]} does not match the forward's {out.shape[0]}")
        g = onward.backward(key, grad) if onward is not None else grad
        if onward is not None and g is not None:
            check_returned(g, out, f"tier {self.name}: backward {key.seq} of {key.client_id}: "
                           "the next tier's gradient")
        if out.requires_grad and g is not None:
            try:
                with _no_gradient_left(b):
                    out.backward(g.to(self.torch_device))
            except BaseException:
                self._abandon(b)
                raise
        gx = self._grad_out(x)
        b.pending = None
        self._finish(b, key, "backward", (gx,), digest)
        self._let_go(b)
        return gx

    def _abandon(self, b: Binding) -> None:
        """Undo a U-shape step whose backward failed in this tier's own blocks (out of memory, say): that used
        up the forward's graph, so no retry of the backward could run. The forward's statistics are put back,
        the sequence is as before it (a retry of the whole step runs as a clean one), and the replica's lock is
        let go of now: the other clients of a shared replica do not wait for this one's release. (A backward
        that failed in a later tier keeps its step: its graph here is whole, and a retry may still run it.)"""
        p = b.pending
        assert p is not None
        _put_back(p.buffers)
        b.pending = None
        b.last_seq, b.last_phase = p.seq, p.phase
        _drop_reply(b)
        self._let_go(b)

    def _let_go(self, b: Binding) -> None:
        """The replica's lock a U-shape forward kept, given back, unless a release let go of it meanwhile."""
        with self._lock:
            held, b.holds_lock = b.holds_lock, False
        if held:
            b.replica.lock.release()
