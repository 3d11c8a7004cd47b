"""Layer-wise federated averaging: the one aggregation routine of splitfed.

Each contribution is a partial model state (some blocks' keys) with a weight
(its sample count). Every key becomes the weighted mean of the contributions
that hold it, wherever they were trained: a block on one client's device and on
another client's edge replica is averaged the same way. Keys nobody sent keep
their previous value.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from splitfed.errors import InvalidArgument

State = dict[str, torch.Tensor]


def aggregate(contributions: Iterable[tuple[State, float]], previous: State | None = None) -> State:
    """Sample-weighted mean per key; integer buffers get the rounded weighted mean."""
    sums: dict[str, torch.Tensor] = {}
    weights: dict[str, float] = {}
    ref: dict[str, torch.Tensor] = {}
    for state, w in contributions:
        if w < 0:
            raise InvalidArgument(f"contribution weight must be >= 0, got {w}")
        if w == 0:
            continue
        for k, v in state.items():
            if k in ref and (v.shape != ref[k].shape):
                raise InvalidArgument(f"cannot average {k!r}: shapes {list(ref[k].shape)} and {list(v.shape)}")
            ref.setdefault(k, v)
            acc = v.detach().to(torch.float64) * w
            sums[k] = sums[k].add_(acc) if k in sums else acc
            weights[k] = weights.get(k, 0.0) + w
    out: State = dict(previous or {})
    for k, s in sums.items():
        mean = s / weights[k]
        dtype = ref[k].dtype
        out[k] = (mean.round() if not dtype.is_floating_point else mean).to(dtype)
    return out
