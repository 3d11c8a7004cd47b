"""Layer-wise federated averaging: the one aggregation routine of splitfed.

Each contribution is a partial model state (some blocks' keys) with a weight
(its sample count). Every key becomes the weighted mean of the contributions
that hold it, wherever they were trained: a block on one client's device and on
another client's edge replica is averaged the same way. Keys nobody sent keep
their previous value.

The mean decomposes: a server tier adds its clients' replicas into a
:class:`Partial` where they lie, and only their weighted mean per key travels to
the coordinator (:meth:`Partial.means`: float32 for a floating key of 32 bits or
fewer, as wide as the model's own weights; float64 otherwise, see
:func:`wire_dtype`). The coordinator knows the weight behind each key (the
samples of the clients whose segment there holds it), turns each mean back into
a float64 sum (:meth:`Partial.of_means`) and adds it to the devices'
contributions (:func:`aggregate`'s ``partials``). A float32 mean times an
integer weight below 2**29 is exact in float64, so a key one tier alone holds
averages bitwise as if every replica had been fetched, when the tier's clients
come in one ``Reduce`` (``REDUCE_BATCH``, 256 at most); where several means meet
(tiers, devices, or a tier's batches of clients), the result differs from that
by float32 rounding only (an ulp).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from splitfed.errors import InvalidArgument

State = dict[str, torch.Tensor]


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tier's mean of a key of ``dtype`` travels in (:meth:`Partial.means`): float32 for a floating
    key of 32 bits or fewer (float32, float16, bfloat16), float64 for the rest (float64 keys, integer buffers
    such as BatchNorm's ``num_batches_tracked``: tiny, or in need of the precision)."""
    return torch.float32 if dtype.is_floating_point and dtype.itemsize <= 4 else torch.float64


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

    @classmethod
    def of_means(cls, means: Mapping[str, torch.Tensor], weights: Mapping[str, float],
                 dtypes: Mapping[str, torch.dtype] | None = None) -> Partial:
        """The sums behind ``means`` (a tier's :meth:`means`), each ``weights[k]`` (the weight behind key ``k``,
        known to the caller) times its mean, in float64; ``dtypes``: the keys' own dtypes, for :meth:`mean`."""
        out = cls()
        for k, m in means.items():
            w = weights.get(k)
            if w is None or not (math.isfinite(w) and w > 0):
                raise InvalidArgument(f"the mean of {k!r} needs a finite weight > 0 behind it, got {w}")
            out._add(k, m.detach(), w, w, (dtypes or {}).get(k))
        return out

    def means(self) -> State:
        """Each key's weighted mean, computed in float64 and sent as :func:`wire_dtype` says (float32 for the
        keys of a float32 model): what a tier sends back, at the bytes of one copy of its weights."""
        return {k: (s / self.weights[k]).to(wire_dtype(self.dtypes.get(k, torch.float64)))
                for k, s in self.sums.items()}

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
