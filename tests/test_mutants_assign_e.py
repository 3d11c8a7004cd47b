"""The optimizer (splitfed/optimizer/), pinned where a mutation run found gaps (fifth list): bisect's
MILPs over a class of several identical clients take no per-client time rows (they would count the class's summed
round times as a makespan), and sl/sflv2's holder search with exactly one candidate holder size."""

from __future__ import annotations

import numpy as np
import pytest

from splitfed.cost import Scenario, evaluate, option_table
from splitfed.optimizer import exhaustive, solve
from splitfed.optimizer.classes import server_columns
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

BIG = 1e15  # memory no option fills


# ---------------------------------------------------------------- sflv1 bisect: shared resources dominate


def _six_on_two_servers() -> Scenario:
    """Six identical clients (one class) of one block, too small to hold it, an edge and a cloud of equal speed:
    each client loads the tier it uses 0.3 s, so three on each (0.9 s) is the best whatever the cuts, above every
    client's own round (about 0.304 s), yet far below the class's six rounds summed (about 1.82 s)."""
    prof = ModelProfile.synthetic([1e8], [1e3], [1e4], input_bytes=1e3)
    clients = tuple(Client(f"c{i}", "k", TierProfile(1e8, 1e4), LinkProfile(1e7, 1e7, 0.001), 10) for i in range(6))
    return Scenario(prof, clients, (TierProfile(1e10, BIG), TierProfile(1e10, BIG)), (LinkProfile(1e9, 1e9, 1e-4),),
                    batch=5)


def test_the_fixture_has_shared_loads_above_every_round_and_below_the_class_s_summed_rounds() -> None:
    sc = _six_on_two_servers()
    t = option_table(sc, sc.clients[0])
    assert t.options.tolist() == [[0, 0], [0, 1], [1, 1]] and t.fits_device.tolist() == [True, True, False]
    assert t.round_s[:2].tolist() == [0.30421808, 0.304008]  # the cloud, the edge
    assert (t.shared_load[:2, :2] / sc.capacities[:2]).tolist() == [[0.0, 0.3], [0.3, 0.0]]
    all_edge = evaluate(sc, {c.name: (0, 1) for c in sc.clients})
    assert all_edge.bottleneck == "edge compute" and all_edge.makespan_s == 1.8


def test_bisect_balances_a_class_of_six_where_shared_resources_dominate_whatever_the_cuts() -> None:
    """No cut lets the loads (at least 0.9 s) under the slowest round: bisect's "shared resources dominate" MILP.
    Rows M >= the class's summed rounds there (valid for single clients only) would make 6 x 0.304 s the
    makespan, which the faster edge option lowers: every client on the edge, 1.8 s."""
    sc = _six_on_two_servers()
    want = exhaustive(sc)
    assert want.makespan_s == 0.9
    assert sorted(want.assignment.values()) == [(0, 0)] * 3 + [(0, 1)] * 3
    got = solve(sc, method="bisect")
    assert got.cost.feasible and got.makespan_s == want.makespan_s
    assert sorted(got.assignment.values()) == [(0, 0)] * 3 + [(0, 1)] * 3
    assert got.note.startswith("sflv1 bisect: 1 class(es), 2 non-dominated option(s), 3 MILP(s)")


@pytest.mark.parametrize(("n", "best"), [(2, 0.30421808), (6, 0.9)])
def test_direct_splits_a_class_into_single_clients(n: int, best: float) -> None:
    """direct's rows M >= each client's time are valid for single clients only: a class of identical clients
    (two or six) is priced client by client, and reaches brute force's optimum (half on each server: two set
    the makespan by the cloud client's round, six by the loads). Priced as one class, the summed rounds are
    least with every client on the edge: 0.6 s and 1.8 s."""
    six = _six_on_two_servers()
    sc = six.with_clients(six.clients[:n])
    want = exhaustive(sc)
    got = solve(sc, method="direct")
    assert got.cost.feasible and got.makespan_s == want.makespan_s == best
    assert sorted(got.assignment.values()) == [(0, 0)] * (n // 2) + [(0, 1)] * (n // 2)
    assert got.note.startswith(f"sflv1 direct: 1 class(es), {2 * n} non-dominated option(s), 1 MILP(s)")


# ---------------------------------------------------------------- sflv1 bisect: the final optimising MILP


def _six_load_bound() -> Scenario:
    """Six identical clients of two blocks: all on the edge (cuts 0, 0.307 s, loading it 0.303 s each) or block 0
    on a slow device (cuts 1, 1.828 s, 0.003 s); the device cannot hold both. Six at cuts 0 load the edge
    1.818 s: less than cuts 1 take, more than cuts 0 do, less than six cuts-0 rounds summed (1.842 s)."""
    prof = ModelProfile.synthetic([1e8, 1e6], [1e3, 1e3], [1e4, 1e4], input_bytes=1e3)
    clients = tuple(Client(f"c{i}", "k", TierProfile(1.65e9, 6e4), LinkProfile(1e7, 1e7, 0.001), 10)
                    for i in range(6))
    return Scenario(prof, clients, (TierProfile(1e10, BIG),), (), batch=5)


def test_the_fixture_puts_six_fast_clients_load_between_the_two_round_times() -> None:
    sc = _six_load_bound()
    t = option_table(sc, sc.clients[0])
    assert t.options.ravel().tolist() == [0, 1, 2] and t.fits_device.tolist() == [True, True, False]
    t0, t1 = t.round_s[:2].tolist()
    assert t0 == 0.307008 and t1 == pytest.approx(1.82818982, abs=1e-8)
    assert (t.shared_load[:2, 0] / sc.capacities[0]).tolist() == [0.303, 0.003]
    assert t0 < 6 * 0.303 < t1 < 6 * t0


def test_bisect_s_final_milp_over_a_class_finds_the_load_below_the_next_round_time() -> None:
    """Bisect: tau_0 (0.307 s) says no, tau_1 (1.828 s) yes; the optimum is the MILP capped at tau_1 over the
    fast cuts: all six there, 1.818 s. Rows M >= the class's summed rounds (1.842 s > the cap) made that MILP
    infeasible, leaving tau_1's answer (every client at cuts 1, 1.828 s)."""
    sc = _six_load_bound()
    want = exhaustive(sc)
    assert want.makespan_s == 1.818 and set(want.assignment.values()) == {(0,)}
    got = solve(sc, method="bisect")
    assert got.cost.feasible and got.makespan_s == want.makespan_s
    assert got.assignment == {c.name: (0,) for c in sc.clients}
    assert got.note.startswith("sflv1 bisect: 1 class(es), 2 non-dominated option(s), 3 MILP(s)")


# ---------------------------------------------------------------- sl, sflv2: one candidate holder size


def _one_holder(mode: str) -> Scenario:
    """One edge of 8.05e6 bytes. Client x (a tiny device, 1 sample) can only put both blocks there: its holder is
    1.1e6 bytes, the most any option leaves. Client y (8 samples) is fastest keeping block 0 (turn 7.008e6 bytes,
    holder 1e6): beside x's holder it does not fit, so its choice is all on its device (2.63 s). Every holder
    size is at least x's 1.1e6 (x has no other), so 1.1e6 is the only candidate."""
    prof = ModelProfile.synthetic([1e6, 1e9], [1e3, 1e3], [1e5, 1e6], input_bytes=1e5, act_bytes=[1e3, 5e5])
    x = Client("x", "x", TierProfile(1e8, 2e5), LinkProfile(1e7, 1e7, 0.01), 1)
    y = Client("y", "y", TierProfile(1e10, 1e8), LinkProfile(1e7, 1e7, 0.01), 8)
    return Scenario(prof, (x, y), (TierProfile(1e11, 8.05e6),), (), batch=8, mode=mode)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_the_fixture_has_one_holder_that_y_s_fastest_cut_does_not_fit_beside(mode: str) -> None:
    sc = _one_holder(mode)
    x, y = (option_table(sc, c) for c in sc.clients)
    assert x.fits_device.tolist() == [True, False, False]
    assert y.round_s.tolist() == pytest.approx([0.3402464, 0.2840064, 2.6324], abs=1e-12)  # cuts 1 fastest
    mem, held = server_columns(sc, y)
    assert mem.ravel().tolist() == [8108000.0, 7008000.0, 0.0] and held.ravel().tolist() == [1.1e6, 1e6, 0.0]
    assert not evaluate(sc, {"x": (0,), "y": (1,)}).feasible
    assert evaluate(sc, {"x": (0,), "y": (1,)}).shared_memory["edge"] == 7008000.0 + 1.1e6


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_the_holder_search_takes_a_single_candidate_holder(mode: str) -> None:
    """The fastest cuts do not fit beside their own largest holder, so ``sequential`` searches holder sizes: one
    candidate (1.1e6) is a search, not a refusal (n_h == 1 is no "no candidate")."""
    sc = _one_holder(mode)
    want = exhaustive(sc)
    assert want.assignment == {"x": (0,), "y": (2,)} and want.makespan_s == pytest.approx(2.6924308, abs=1e-9)
    got = solve(sc)
    assert got.cost.feasible and got.assignment == want.assignment and got.makespan_s == want.makespan_s
    assert got.note.startswith(f"{mode} sequential: 2 class(es), 3 non-dominated option(s), no MILP (clients in turn: "
                               "each takes its fastest option that fits)")
    assert np.isclose(got.cost.shared_memory["edge"], 4.4e6 + 1.1e6)


def _cloud_holder_past_an_edge(mode: str) -> Scenario:
    """``_one_holder`` with the blocks on a cloud of 8.05e6 bytes past an edge of 1e5 (no block fits there): x's
    one option puts both on the cloud (holder 1.1e6 there, none on the edge), y is fastest keeping block 0 and
    the cloud block 1 (turn 7.008e6), which does not fit beside x's holder; all on its device, it does."""
    prof = ModelProfile.synthetic([1e6, 1e9], [1e3, 1e3], [1e5, 1e6], input_bytes=1e5, act_bytes=[1e3, 5e5])
    x = Client("x", "x", TierProfile(1e8, 2e5), LinkProfile(1e7, 1e7, 0.01), 1)
    y = Client("y", "y", TierProfile(1e10, 1e8), LinkProfile(1e7, 1e7, 0.01), 8)
    return Scenario(prof, (x, y), (TierProfile(1e11, 1e5), TierProfile(1e11, 8.05e6)), (LinkProfile(1e9, 1e9, 0.001),),
                    batch=8, mode=mode)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_the_least_holder_is_taken_per_server_over_clients(mode: str) -> None:
    """Candidate holders: the edge's at least 0 (every client holds nothing there), the cloud's at least x's 1.1e6.
    The least taken per client over servers instead (x: 1.1e6, y: 0) asks the edge for a holder of 1.1e6, which
    no option leaves there: no candidate, a refusal of a fleet that fits."""
    sc = _cloud_holder_past_an_edge(mode)
    x, y = (option_table(sc, c) for c in sc.clients)
    assert x.options.tolist() == y.options.tolist() == [[0, 0], [0, 1], [0, 2], [1, 1], [1, 2], [2, 2]]
    assert (x.fits_device & (x.memory[:, 1] <= 1e5)).tolist() == [True, False, False, False, False, False]
    on_edge = y.memory[:, 1] <= 1e5  # y: (0, 0) puts 8e5 bytes on the edge, (1, 1) 24,000
    assert on_edge.tolist() == [False, False, False, True, False, True]
    assert y.round_s[on_edge].tolist() == pytest.approx([0.285022464, 2.6324], abs=1e-12)
    assert y.memory[3, 2] == 7008000.0
    assert not evaluate(sc, {"x": (0, 0), "y": (1, 1)}).feasible
    want = exhaustive(sc)
    assert want.assignment == {"x": (0, 0), "y": (2, 2)}
    got = solve(sc)
    assert got.cost.feasible and got.assignment == want.assignment and got.makespan_s == want.makespan_s
    assert got.note.startswith(f"{mode} sequential: 2 class(es), 3 non-dominated option(s), no MILP (clients in turn: "
                               "each takes its fastest option that fits)")
