"""Layer-wise federated averaging: the one aggregation routine of splitfed.

Each contribution is a partial model state (some blocks' keys) with a weight
(its sample count). Every key becomes the weighted mean of the contributions
that hold it, wherever they were trained: a block on one client's device and on
another client's edge replica is averaged the same way. Keys nobody sent keep
their previous value.

The mean decomposes: a server tier adds its clients' replicas into a
:class:`Partial` where they lie, and only that sum travels to the coordinator,
which adds it to the devices' contributions (:func:`aggregate`'s ``partials``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from splitfed.errors import InvalidArgument

State = dict[str, torch.Tensor]


@dataclass
class Partial:
    """Running sample-weighted sums per key (float64) and the weight behind each."""

    sums: State = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)

    def add(self, state: Mapping[str, torch.Tensor], w: float) -> Partial:
        if not (math.isfinite(w) and w >= 0):
            raise InvalidArgument(f"contribution weight must be a finite number >= 0, got {w}")
        if w == 0:
            return self
        for k, v in state.items():
            self._add(k, v.detach(), w, w, v.dtype)
        return self

    def merge(self, other: Partial) -> Partial:
        """Add ``other``'s sums (a tier's, say) to these; ``other`` is left as it was."""
        for k, s in other.sums.items():
            self._add(k, s.detach(), 1.0, other.weights[k], other.dtypes.get(k))
        return self

    def _add(self, k: str, v: torch.Tensor, scale: float, w: float, dtype: torch.dtype | None) -> None:
        """``sums[k] += scale * v`` in float64 (a fresh tensor the first time: never one of the caller's)."""
        if k in self.sums:
            if v.shape != self.sums[k].shape:
                raise InvalidArgument(f"cannot average {k!r}: shapes {list(self.sums[k].shape)} and {list(v.shape)}")
            self.sums[k].add_(v.to(self.sums[k].device, torch.float64), alpha=scale)
        else:
            self.sums[k] = v.to(torch.float64, copy=True).mul_(scale)
        self.weights[k] = self.weights.get(k, 0.0) + w
        if dtype is not None:
            self.dtypes.setdefault(k, dtype)

    def mean(self, previous: Mapping[str, torch.Tensor] | None = None) -> State:
        """``previous`` with every summed key replaced by its weighted mean, in the key's own dtype (integer
        buffers get the rounded mean)."""
        out: State = dict(previous or {})
        for k, s in self.sums.items():
            mean = s / self.weights[k]
            dtype = self.dtypes.get(k) or (previous[k].dtype if previous and k in previous else torch.float32)
            out[k] = (mean.round() if not dtype.is_floating_point else mean).to(dtype)
        return out


def aggregate(contributions: Iterable[tuple[State, float]], previous: State | None = None,
              partials: Iterable[Partial] = ()) -> State:
    """Sample-weighted mean per key of ``contributions`` and of sums made elsewhere (``partials``)."""
    total = Partial()
    for state, w in contributions:
        total.add(state, w)
    for p in partials:
        total.merge(p)
    return total.mean(previous)
