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


# ---------------------------------------------------------------- a tier's means made sums again


def test_a_tiers_means_travel_as_float32_for_float32_keys_and_float64_for_the_rest() -> None:
    from splitfed.aggregate import Partial, wire_dtype

    p = Partial()
    p.add({"f32": torch.tensor([1.0, 2.0]), "f16": torch.tensor([1.0], dtype=torch.float16),
           "bf16": torch.tensor([1.0], dtype=torch.bfloat16), "f64": torch.tensor([1.0], dtype=torch.float64),
           "n": torch.tensor(3)}, 1.0)
    p.add({"f32": torch.tensor([3.0, 5.0]), "f16": torch.tensor([2.0], dtype=torch.float16),
           "bf16": torch.tensor([2.0], dtype=torch.bfloat16), "f64": torch.tensor([2.0], dtype=torch.float64),
           "n": torch.tensor(6)}, 2.0)
    means = p.means()
    assert {k: v.dtype for k, v in means.items()} == {
        "f32": torch.float32, "f16": torch.float32, "bf16": torch.float32, "f64": torch.float64, "n": torch.float64}
    assert {k: wire_dtype(d) for k, d in p.dtypes.items()} == {k: v.dtype for k, v in means.items()}
    assert torch.equal(means["f32"], torch.tensor([7.0 / 3.0, 4.0]))
    assert float(means["n"]) == 5.0  # not rounded on the way: the coordinator rounds the final mean
    back = Partial.of_means(means, p.weights, p.dtypes)
    assert back.weights == p.weights and back.dtypes == p.dtypes
    assert all(v.dtype == torch.float64 for v in back.sums.values())
    got = aggregate([], partials=[back])
    assert got["n"].dtype == torch.int64 and int(got["n"]) == 5
    assert got["f16"].dtype == torch.float16 and got["bf16"].dtype == torch.bfloat16


@pytest.mark.parametrize("w", [0.0, -1.0, float("nan"), float("inf"), None])
def test_a_mean_without_a_finite_positive_weight_is_refused(w: float | None) -> None:
    from splitfed.aggregate import Partial

    weights = {} if w is None else {"k": w}
    with pytest.raises(InvalidArgument, match="'k'.*finite weight > 0"):
        Partial.of_means({"k": torch.zeros(2)}, weights)


_F32 = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@given(st.lists(st.tuples(st.lists(_F32, min_size=3, max_size=3), st.integers(1, 2**20)), min_size=1, max_size=8),
       st.lists(st.tuples(st.lists(_F32, min_size=3, max_size=3), st.integers(1, 2**20)), max_size=4))
def test_a_tiers_mean_times_its_weight_gives_back_what_its_sum_gave(
        tier: list[tuple[list[float], int]], devices: list[tuple[list[float], int]]) -> None:
    """One tier's float32 means, made sums again with the weight behind them: bitwise the mean its float64 sum
    gave where the tier alone holds the key (a float32 mean times an integer weight < 2**29 is exact in
    float64); with other contributions (the devices'), the same to float32 rounding."""
    from splitfed.aggregate import Partial

    replicas = [({"k": torch.tensor(v, dtype=torch.float32)}, float(w)) for v, w in tier]
    summed = Partial()
    for state, w in replicas:
        summed.add(state, w)
    sent = Partial.of_means(summed.means(), summed.weights, summed.dtypes)
    assert torch.equal(aggregate([], partials=[sent])["k"], aggregate(replicas)["k"])
    assert torch.equal(aggregate([], partials=[sent])["k"], aggregate([], partials=[summed])["k"])
    both = [({"k": torch.tensor(v, dtype=torch.float32)}, float(w)) for v, w in devices]
    want, got = aggregate(both + replicas)["k"], aggregate(both, partials=[sent])["k"]
    scale = max(abs(x) for v, _ in tier + devices for x in v)  # the mean's rounding is relative to the values'
    torch.testing.assert_close(got, want, rtol=2e-7, atol=2e-7 * scale)
