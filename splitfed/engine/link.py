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
from splitfed.errors import InvalidArgument, SplitfedError, TierError

if TYPE_CHECKING:
    from splitfed.engine.tier import Tier

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

    def backward(self, key: StepKey, grad: torch.Tensor) -> torch.Tensor | None:
        """U-shape: gradient of the server chain's output in, gradient of its input out."""
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
        """Anything else the tier raises (its segment's own forward failing on a batch, say) as the gRPC tier
        answers it (INTERNAL, logged with its traceback): a TierError, so that client fails and the round goes
        on, on either transport. Raised bare, it ended the whole in-process round instead."""
        try:
            yield
        except SplitfedError:
            raise
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

    def backward(self, key: StepKey, grad: torch.Tensor) -> torch.Tensor | None:
        up = self._up(grad)
        with self._internal("backward"):
            g = self.tier.backward(key, up)
        return self._down(g)

    # control passes straight through
    def load(self, spec: SegmentLoad) -> None:
        self.tier.load(spec)

    def fetch(self, run_id: str, client_id: str, secret: str = "", blocks: tuple[int, int] | None = None) -> State:
        return self.tier.fetch(run_id, client_id, secret, blocks)

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        self.tier.release(run_id, client_id, secret)

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced:
        return self.tier.reduce(run_id, items)
