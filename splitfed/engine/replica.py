"""What a tier keeps for its clients: replicas (a subset of a model's blocks, which clients bind to and train)
and bindings (one client's segment over a replica: its optimizer, its boundary, its step state), with the
bytes each holds, which a tier counts against its memory limit as the cost model prices them.

A replica's lock serialises the steps on it (many clients share one in ``sflv2``); a caller that would wait
longer than ``SHARED_WAIT_S`` for it is refused UNAVAILABLE rather than left hanging.
"""

from __future__ import annotations

import contextlib
import hmac
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from splitfed.engine import template
from splitfed.engine.optim import SegmentOptimizer
from splitfed.engine.types import SegmentLoad, is_base
from splitfed.errors import Unavailable
from splitfed.models.segment import Segment
from splitfed.models.zoo import ModelSpec

SHARED_WAIT_S = 60.0


@dataclass
class Replica:
    """Weights of one replica: block index -> module (a subset of the model's blocks)."""

    blocks: dict[int, nn.Module] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: set[str] = field(default_factory=set)
    secret: str = field(default="", repr=False)  # of the load that made it: only loads with it may bind to it
    loading: int = 0  # loads binding to it now: a replica being loaded is never dropped nor duplicated
    model: ModelSpec | None = None  # whose blocks it holds: a load of another model must not bind them
    held: int = 0  # bytes its blocks hold (weights, buffers, a gradient per byte that trains): Tier.held
    base: bool = False  # the coordinator's own (a base or a holder, ``is_base``): never trains, so weights only


Buffers = list[tuple[torch.Tensor, torch.Tensor]]  # a segment's buffers, each with its value before a forward


@dataclass
class Pending:
    """A U-shape forward waiting for its backward: its input and output (the graph), and what undoes it
    should its backward fail in this tier's own blocks (the sequence before it, the buffers it updated)."""
    x: torch.Tensor
    out: torch.Tensor
    seq: int
    phase: str
    buffers: Buffers


@dataclass
class Binding:
    """One client's segment on a replica: its optimizer, its boundary (what its input and output must be), and
    its step state (the last step, whose reply a retry gets again; a U-shape forward waiting for its backward)."""

    spec: SegmentLoad
    replica: Replica
    segment: Segment
    optim: SegmentOptimizer | None
    in_shape: tuple[int, ...]
    in_dtype: torch.dtype
    out_shape: tuple[int, ...]
    grad_in: bool  # a block before this segment has trainable parameters: its input's gradient goes back
    ends_model: bool = True  # the segment's output is the logits: a step may compute the loss here
    last_seq: int = -1
    last_phase: str = ""
    cached: object = None
    digest: bytes = b""  # of the request whose reply is ``cached`` (the tier's): a retry must be it
    pending: Pending | None = None  # a U-shape forward waiting for its backward
    holds_lock: bool = False
    last_used: float = 0.0
    backward: threading.Lock = field(default_factory=threading.Lock)  # one backward at a time: a retry waits
    held: int = 0  # bytes of its optimizer's state (slots, step counts: optimizer_bytes): Tier.held


def same_secret(held: str, given: str) -> bool:
    """Whether ``given`` is the binding's secret (in constant time: a caller learns nothing from the timing)."""
    return hmac.compare_digest(held.encode(), given.encode())


def trained_bytes(spec: SegmentLoad, index: int) -> tuple[int, int]:
    """Block ``index``'s bytes of weights and buffers, and of the parameters that train, as a load of ``spec``
    holds them: a coordinator's own segment (a base, a holder: ``is_base``) never steps, so it holds its weights
    and nothing that trains (no gradient, no optimizer slots), as the cost model prices a holder."""
    weights, trains = template.held_bytes(spec.model, index)
    return weights, 0 if is_base(spec.client_id) else trains


def optimizer_bytes(spec: SegmentLoad, index: int) -> int:
    """Bytes the optimizer of a load of ``spec`` keeps for block ``index`` once it steps: its slots and Adam's
    step counts (``OptimConfig.state_bytes``), as the profile's fixed bytes count them; none for a coordinator's
    own segment, which never steps."""
    if is_base(spec.client_id):
        return 0
    return spec.optim.state_bytes(trained_bytes(spec, index)[1], template.train_tensors(spec.model, index))


@contextlib.contextmanager
def holding(replica: Replica, tier: str, what: str) -> Iterator[None]:
    """The replica's lock, or UNAVAILABLE: a client that vanished mid U-shape step blocks nobody forever."""
    if not replica.lock.acquire(timeout=SHARED_WAIT_S):
        raise Unavailable(f"tier {tier}: {what}: replica busy for {SHARED_WAIT_S:.0f}s")
    try:
        yield
    finally:
        replica.lock.release()
