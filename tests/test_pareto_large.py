"""The optimizer's dominance pruning where real models put it: more than 256 options a client.

``opt_classes.pareto`` has two paths: all pairs at once for up to 256 rows, one sorted pass above. The
brute-force property tests use models of at most 4 blocks (15 options), so only the first ran there,
while vgg11 and resnet18 on 3 tiers take the second for every client. These hold the second to the
definition (``dominates``), and the optimizer to brute force on a model with more than 256 options.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from splitfed.cost import Scenario, cut_options
from splitfed.optimizer import exhaustive, solve
from splitfed.optimizer.classes import dominates, pareto, varying
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile


@st.composite
def tables(draw: st.DrawFn) -> np.ndarray:
    """257..700 rows of few distinct values (ties, duplicates, whole rows equal), 0..5 columns."""
    m, k = draw(st.integers(257, 700)), draw(st.integers(0, 5))
    values = st.sampled_from([0.0, 0.5, 1.0, 2.0, 1e-300, 3.0, np.inf]) if draw(st.booleans()) else \
        st.floats(0, 4, allow_nan=False, width=32)
    return draw(arrays(np.float64, (m, k), elements=values))


@settings(max_examples=150)
@given(tables())
def test_the_sorted_pass_keeps_exactly_the_rows_no_other_row_dominates(V: np.ndarray) -> None:
    keep = pareto(V)
    assert keep.dtype == bool and keep.shape == (V.shape[0],)
    assert np.array_equal(keep, ~dominates(V).any(axis=0))


def test_equal_rows_keep_the_first_and_no_columns_keep_one() -> None:
    V = np.tile([[1.0, 2.0]], (300, 1))
    V[7] = [0.5, 2.0]
    assert np.flatnonzero(pareto(V)).tolist() == [7]
    V[7] = [1.0, 2.0]
    assert np.flatnonzero(pareto(V)).tolist() == [0]
    assert np.flatnonzero(pareto(np.empty((400, 0)))).tolist() == [0]


@st.composite
def many_options(draw: st.DrawFn) -> Scenario:
    """2 clients of a 22- or 23-block model on 3 tiers: 276 or 300 options each, so each client's table
    takes the sorted pass; brute force tries every pair (at most 90,000)."""
    L = draw(st.integers(22, 23))
    ints = st.integers
    prof = ModelProfile.synthetic(
        [draw(ints(0, 50)) * 1e6 for _ in range(L)], [draw(ints(1, 60)) * 1e3 for _ in range(L)],
        [draw(st.sampled_from([0, draw(ints(1, 400)) * 1e3])) for _ in range(L)],
        input_bytes=draw(ints(1, 60)) * 1e3, optimizer_slots=draw(ints(0, 2)))
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(draw(ints(1, 30)) * 1e9, draw(ints(60, 600)) * 1e5),
                           LinkProfile(draw(ints(1, 40)) * 1e5, draw(ints(1, 40)) * 1e5, draw(ints(0, 80)) / 1e3),
                           draw(ints(1, 300)))
                    for i in range(2))
    servers = (TierProfile(draw(ints(1, 60)) * 1e9, draw(ints(30, 300)) * 1e5),
               TierProfile(draw(ints(1, 300)) * 1e9, draw(ints(30, 600)) * 1e5))
    link = LinkProfile(draw(ints(1, 60)) * 1e5, draw(ints(1, 60)) * 1e5, draw(ints(0, 30)) / 1e3)
    mode = draw(st.sampled_from(["sflv1", "sflv2", "sl"]))
    return Scenario(prof, clients, servers, (link,), batch=draw(ints(1, 32)), mode=mode)


@settings(max_examples=25)
@given(many_options())
def test_the_optimizer_equals_brute_force_with_more_than_256_options_a_client(sc: Scenario) -> None:
    assert len(cut_options(len(sc.profile.fwd_flops), 3, False)) > 256
    try:
        truth = exhaustive(sc)
    except Exception as e:  # noqa: BLE001 - an infeasible fleet: the optimizer must refuse it for the same cause
        try:
            solve(sc, gap=0.0)
        except type(e) as got:
            assert str(got).split()[0] == str(e).split()[0]
            return
        raise AssertionError(f"brute force refused ({e}); the optimizer did not") from None
    got = solve(sc, gap=0.0)
    assert got.makespan_s == truth.makespan_s, (got.assignment, truth.assignment)
    assert got.cost.feasible


@settings(max_examples=150)
@given(st.integers(1, 300).flatmap(lambda m: st.tuples(
    arrays(np.float64, (m, 3), elements=st.sampled_from([0.0, 1.0, 2.0, np.inf])),
    st.lists(st.sampled_from([0.0, 7.0, np.inf, -np.inf]), max_size=30))))
def test_columns_equal_in_every_row_change_no_dominance(case: tuple[np.ndarray, list[float]]) -> None:
    """Both paths leave out the columns equal in every row (``varying``: a vgg11 class's staged cover, 0 in
    each of its 38 columns but 14; its pruning took 5x as long): appending any such columns, an infinite one
    too, keeps exactly the rows kept without them, and the same dominance."""
    V, constant = case
    W = np.concatenate([V, np.tile(np.asarray(constant, np.float64), (len(V), 1))], axis=1)
    assert np.array_equal(pareto(W), pareto(V))
    assert np.array_equal(dominates(W), dominates(V))


def test_varying_keeps_each_column_that_differs_and_drops_the_rest() -> None:
    inf, nan = np.inf, np.nan
    V = np.array([[1.0, 0.0, inf, inf, 5.0, nan],
                  [1.0, 0.0, inf, 2.0, 5.0, nan]])
    # differ: inf vs 2 (col 3), NaN (never equal to itself: kept, as it always was compared); equal: the rest
    assert varying(V).tolist()[0][0] == inf and varying(V).shape == (2, 2)
    assert np.isnan(varying(V)[:, 1]).all()
    one = np.array([[3.0, 4.0]])
    assert varying(one) is one  # one row: nothing to compare, kept whole
    assert varying(np.empty((0, 4))).shape == (0, 4)
