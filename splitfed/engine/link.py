"""The ``Link`` contract between neighbouring tiers, and its in-process implementation.

A link moves a boundary tensor to the next tier and its gradient back. The
gRPC link implements the same two protocols, so the engine never knows which
transport it runs on. Optional lossy compression is applied here (by the
transport's codec), never in the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from splitfed.engine.limits import MAX_DIMS
from splitfed.engine.types import Reduced, ReduceItem, SegmentLoad, State, StepKey, StepReply
from splitfed.errors import InvalidArgument, ResourceExhausted, SplitfedError, TierError

if TYPE_CHECKING:
    from splitfed.engine.tier import Tier

MAX_ID = 256
"""The most characters of a run, client, replica or base id and of a secret that a tier takes."""

Compress = Callable[[torch.Tensor], tuple[torch.Tensor, int]]
"""Lossy round trip of a tensor: returns what the receiver sees and the bytes on the wire."""


@runtime_checkable
class Link(Protocol):
    """Data path to the next tier (one call per step and direction)."""

    def step(self, key: StepKey, activation: torch.Tensor, labels: torch.Tensor) -> StepReply:
        """Forward ``activation`` down the chain, loss at its end, return the gradient."""
        ...

    def forward(self, key: StepKey, activation: torch.Tensor) -> torch.Tensor:
        """U-shape: run the rest of the server chain, return its output activation."""
        ...

    def backward(self, key: StepKey, grad: torch.Tensor | None) -> torch.Tensor | None:
        """U-shape: gradient of the server chain's output in, gradient of its input out. ``grad`` None: none
        reached the tail's input (a block of the tail detaches): the servers release the step without a
        backward, as training the whole model leaves the blocks before it without a gradient."""
        ...


@runtime_checkable
class TierControl(Protocol):
    """Control path of one tier for a round: bind, collect, forget (``secret``: the binding's, as loaded)."""

    def load(self, spec: SegmentLoad) -> None: ...

    def fetch(self, run_id: str, client_id: str, secret: str = "", blocks: tuple[int, int] | None = None) -> State:
        ...

    def release(self, run_id: str, client_id: str, secret: str = "") -> None: ...

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced: ...


log = logging.getLogger(__name__)


# ---------------------------------------------------------------- control checks
# A tier's control calls are checked here, on either transport: the gRPC tier (transport.server) and its client
# (transport.client) call these, and so does InProcessLink, so the same bad input gets the same error.


def check_ids(run_id: str, client_id: str, secret: str = "") -> None:
    """The run and client a call names (1..MAX_ID characters) and its secret (at most MAX_ID)."""
    for what, v in (("run_id", run_id), ("client_id", client_id)):
        if not v or len(v) > MAX_ID:
            raise InvalidArgument(f"{what} must have 1..{MAX_ID} characters, got {len(v)}")
    if len(secret) > MAX_ID:  # its value is never shown
        raise InvalidArgument(f"secret must have at most {MAX_ID} characters, got {len(secret)}")


def check_replica(replica: str, base: str, base_secret: str) -> None:
    """A load's replica (1..MAX_ID characters), base and base secret (at most MAX_ID)."""
    if not replica or len(replica) > MAX_ID:
        raise InvalidArgument(f"replica must have 1..{MAX_ID} characters")
    if len(base) > MAX_ID:
        raise InvalidArgument(f"base must have at most {MAX_ID} characters, got {len(base)}")
    if len(base_secret) > MAX_ID:  # its value is never shown
        raise InvalidArgument(f"base_secret must have at most {MAX_ID} characters, got {len(base_secret)}")


def check_blocks(client_id: str, blocks: tuple[int, int] | None) -> None:
    """A fetch's range of blocks, if any: ``[start, stop)`` with ``0 <= start < stop``."""
    if blocks is None:
        return
    a, z = blocks
    if not 0 <= a < z:
        raise InvalidArgument(f"fetch of {client_id}: blocks must be a range [start, stop) with 0 <= start < stop, "
                              f"got [{a}, {z})")


class Listed(Protocol):
    """A client a reduce lists: a :class:`ReduceItem`, or the message it travels as (checked before it is one)."""

    @property
    def client_id(self) -> str: ...

    @property
    def secret(self) -> str: ...

    @property
    def weight(self) -> float: ...


def check_reduce(run_id: str, items: Sequence[Listed], tier: str, max_clients: int) -> None:
    """A reduce's run, and its items: ids and secrets, weights, distinct clients, at most ``max_clients`` of
    them (0: any number) on tier ``tier``."""
    # imported here: splitfed.engine.tier imports this module
    from splitfed.engine.tier import weight_refusal

    if not run_id or len(run_id) > MAX_ID:
        raise InvalidArgument(f"reduce: run_id must have 1..{MAX_ID} characters, got {len(run_id)}")
    if max_clients and len(items) > max_clients:
        raise ResourceExhausted(f"reduce: {len(items)} clients listed, but tier {tier} serves at most {max_clients}")
    seen: set[str] = set()
    for i, it in enumerate(items):
        who = f"reduce: item {i} (client {it.client_id[:64]!r})"  # an overlong id: its start
        try:
            check_ids(run_id, it.client_id, it.secret)
        except InvalidArgument as e:
            raise InvalidArgument(f"{who}: {e}") from None
        why = weight_refusal(it.weight)
        if why is not None:
            raise InvalidArgument(f"{who}: {why}")
        if it.client_id in seen:
            raise InvalidArgument(f"{who}: the client is listed twice")
        seen.add(it.client_id)


def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class InProcessLink:
    """Calls the next tier directly; counts bytes as they would cross a wire."""

    def __init__(self, tier: Tier, compress_up: Compress | None = None,
                 compress_down: Compress | None = None) -> None:
        self.tier = tier
        self.compress_up = compress_up
        self.compress_down = compress_down
        self.bytes_up = 0
        self.bytes_down = 0

    @staticmethod
    def _crossing(t: torch.Tensor) -> None:
        if t.dim() > MAX_DIMS:  # as the wire refuses it (transport.codec): a simulation fails where a deployment would
            raise InvalidArgument(f"a tensor of {t.dim()} dimensions cannot travel (at most {MAX_DIMS})")

    def _up(self, t: torch.Tensor) -> torch.Tensor:
        self._crossing(t)
        if self.compress_up is not None and t.is_floating_point():
            t, n = self.compress_up(t)
        else:
            n = nbytes(t)
        self.bytes_up += n
        return t

    def _down(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        self._crossing(t)
        if self.compress_down is not None:
            t, n = self.compress_down(t)
        else:
            n = nbytes(t)
        self.bytes_down += n
        return t

    @contextmanager
    def _internal(self, what: str) -> Iterator[None]:
        """What the tier raises, as the gRPC tier answers it: a TierError as is; any other SplitfedError (a
        model that does not build: ConfigError) as INVALID_ARGUMENT with its message; anything else (its
        segment's own forward failing on a batch, say) as INTERNAL, logged with its traceback. Each a TierError,
        so that client fails and the round goes on, on either transport. Raised bare, it ended the whole
        in-process round instead."""
        try:
            yield
        except TierError:
            raise
        except SplitfedError as e:
            raise InvalidArgument(str(e)) from e
        except Exception as e:
            log.exception("tier %s: %s failed", self.tier.name, what)
            raise TierError(f"tier {self.tier.name}: internal error in {what}: {type(e).__name__}: {e}") from e

    def step(self, key: StepKey, activation: torch.Tensor, labels: torch.Tensor) -> StepReply:
        self.bytes_up += nbytes(labels)
        up = self._up(activation)
        with self._internal("step"):
            reply = self.tier.step(key, up, labels)
        reply.grad = self._down(reply.grad)
        return reply

    def forward(self, key: StepKey, activation: torch.Tensor) -> torch.Tensor:
        up = self._up(activation)
        with self._internal("forward"):
            mid = self.tier.forward(key, up)
        out = self._down(mid)
        assert out is not None
        return out

    def backward(self, key: StepKey, grad: torch.Tensor | None) -> torch.Tensor | None:
        up = None if grad is None else self._up(grad)
        with self._internal("backward"):
            g = self.tier.backward(key, up)
        return self._down(g)

    # control: checked and answered as over gRPC (the same checks, the same errors)
    def load(self, spec: SegmentLoad) -> None:
        check_ids(spec.run_id, spec.client_id, spec.secret)
        check_replica(spec.replica, spec.base, spec.base_secret)
        with self._internal("load"):
            self.tier.load(spec)

    def fetch(self, run_id: str, client_id: str, secret: str = "", blocks: tuple[int, int] | None = None) -> State:
        check_blocks(client_id, blocks)
        check_ids(run_id, client_id, secret)
        with self._internal("fetch"):
            return self.tier.fetch(run_id, client_id, secret, blocks)

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        check_ids(run_id, client_id, secret)
        with self._internal("release"):
            self.tier.release(run_id, client_id, secret)

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced:
        check_reduce(run_id, items, self.tier.name, int(getattr(self.tier, "max_clients", 0)))
        with self._internal("reduce"):
            return self.tier.reduce(run_id, items)
