"""Layer-wise FedAvg: weighted per key, wherever the block was trained."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from splitfed.aggregate import aggregate
from splitfed.errors import InvalidArgument


def test_weighted_mean_per_key_and_previous_kept() -> None:
    a = {"0.w": torch.tensor([1.0, 2.0]), "1.w": torch.tensor([10.0])}
    b = {"0.w": torch.tensor([3.0, 6.0])}
    prev = {"0.w": torch.zeros(2), "1.w": torch.zeros(1), "2.w": torch.tensor([7.0])}
    out = aggregate([(a, 1), (b, 3)], previous=prev)
    assert torch.allclose(out["0.w"], torch.tensor([2.5, 5.0]))
    assert torch.equal(out["1.w"], torch.tensor([10.0]))  # only a held block 1
    assert torch.equal(out["2.w"], torch.tensor([7.0]))  # nobody trained block 2


def test_integer_buffers_are_rounded_means() -> None:
    out = aggregate([({"0.n": torch.tensor(3)}, 1), ({"0.n": torch.tensor(6)}, 2)])
    assert out["0.n"].dtype == torch.int64 and int(out["0.n"]) == 5


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="0.w"):
        aggregate([({"0.w": torch.zeros(2)}, 1), ({"0.w": torch.zeros(3)}, 1)])


@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=6),
       st.lists(st.integers(1, 1000), min_size=6, max_size=6))
def test_mean_of_equal_states_is_that_state_and_bounded(vals: list[float], ws: list[int]) -> None:
    same = [({"k": torch.tensor([vals[0]])}, w) for w in ws]
    assert torch.equal(aggregate(same)["k"], torch.tensor([vals[0]]))
    mixed = [({"k": torch.tensor([v])}, w) for v, w in zip(vals, ws, strict=False)]
    m = float(aggregate(mixed)["k"])
    assert min(vals) - 1e-3 <= m <= max(vals) + 1e-3
