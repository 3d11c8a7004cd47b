"""The optimizer (splitfed/optimizer/), pinned where a mutation run found gaps (sixth list): brute force's
sflv1 staged base counts only blocks two clients hold, best_static's prefilter puts a holder beside every turn (sl,
sflv2), and the tie search under ``prefer`` (``closest``): no per-class time rows, and a MILP answer a hair past
the threshold is not a tie."""

from __future__ import annotations

import numpy as np
import pytest

from splitfed.cost import Scenario, evaluate, move_cost, option_table
from splitfed.optimizer import best_static, exhaustive, solve, static
from splitfed.optimizer.classes import server_columns
from splitfed.optimizer.ties import closest
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from tests.plan_fixtures import every_plan

BIG = 1e15  # memory no option fills


# ---------------------------------------------------------------- sflv1 brute force: a block one client holds


def _one_holder_of_the_big_block(clients: int) -> Scenario:
    """An edge of 6.2e6 bytes. Block 0 has a large state (1e7 bytes) but only 3e6 fixed bytes; block 1 a small one
    (1e3). Client a's device cannot hold both blocks, and a is fast only with both on the edge (cuts 0: 6e6 fixed
    bytes and 600 of activations there); beside it, b (a large device) fits only with both blocks at home (cuts 2:
    any block it put there adds 3e6 fixed bytes). Block 0 then lies on the edge for a alone: no staged base. Counted
    as a base anyway (its 1e7 bytes beside a's fixed parts) it would not fit, and a would have to keep block 0
    (cuts 1, 14 s)."""
    prof = ModelProfile.synthetic([1e8, 1e8], [1e2, 1e2], [1e6, 1e6], input_bytes=1e2, act_bytes=[1e2, 1e2],
                                  state_bytes=[1e7, 1e3])
    a = Client("a", "a", TierProfile(1e8, 3.5e6), LinkProfile(1e7, 1e7, 0.01), 4)
    b = Client("b", "b", TierProfile(1e9, BIG), LinkProfile(1e7, 1e7, 0.01), 4)
    return Scenario(prof, (a, b)[:clients], (TierProfile(1e10, 6.2e6),), (), batch=2)


def test_the_fixture_fits_block_0_on_the_edge_only_as_no_base() -> None:
    sc = _one_holder_of_the_big_block(2)
    a, b = (option_table(sc, c) for c in sc.clients)
    assert a.fits_device.tolist() == [True, True, False] and b.fits_device.tolist() == [True, True, True]
    assert a.round_s.tolist() == [0.2700432, 14.1500832, 26.0102]
    assert b.round_s.tolist() == [0.2700432, 3.3500831999999994, 4.4102]
    assert a.memory[:, 1].tolist() == [6000600.0, 3000400.0, 0.0]
    assert a.act_memory[:, 1].tolist() == [600.0, 400.0, 0.0]
    alone = evaluate(sc, {"a": (0,), "b": (2,)})
    assert alone.feasible and alone.shared_memory["edge"] == 6000600.0  # fixed 6e6 + activations, no base
    both = evaluate(sc, {"a": (0,), "b": (0,)})  # two hold block 0: its state is staged
    assert not both.feasible and both.shared_memory["edge"] == 2 * 6e6 + 1e7 + 1e3
    shared_1 = evaluate(sc, {"a": (0,), "b": (1,)})  # b's block 1 beside a's: 3e6 more fixed bytes
    assert not shared_1.feasible and shared_1.shared_memory["edge"] == 9001000.0


@pytest.mark.parametrize(("clients", "want", "best"), [
    (2, {"a": (0,), "b": (2,)}, 4.4102),
    (1, {"a": (0,)}, 0.2700432),
], ids=["two-clients", "one-client"])
def test_brute_force_stages_only_blocks_two_clients_hold(clients: int, want: dict[str, tuple[int, ...]],
                                                         best: float) -> None:
    """The optimum puts block 0 on the edge for client a alone. A base of the blocks one client holds (their
    state beside the fixed parts) overflows the edge there, and brute force kept a slower plan (a keeping block 0,
    14.1500832 s) as the optimum; the MILPs and every plan priced by :func:`evaluate` say otherwise."""
    sc = _one_holder_of_the_big_block(clients)
    plans = every_plan(sc)
    least = min(m for _, m in plans)
    assert least == best and [p for p, m in plans if m == least] == [want]
    got = exhaustive(sc)
    assert got.cost.feasible and got.assignment == want and got.makespan_s == best
    assert got.cost.shared_memory["edge"] == 6000600.0
    for method in ("bisect", "direct"):
        milp = solve(sc, gap=0.0, method=method)
        assert milp.assignment == want and milp.makespan_s == best


# ---------------------------------------------------------------- sl, sflv2 best_static: the holder beside a turn


def _holder_beside_every_turn(mode: str) -> Scenario:
    """Two identical clients, eight blocks; the last has 1e6 bytes of state (3e6 fixed), the others one byte. Every
    cut vector that uses the edge (cuts 0 to 7, faster the more blocks it puts there) holds block 7 there: a turn
    of about 4e6 bytes fits the edge's 4.5e6 alone, not beside the other client's holder of about 1e6. Only cuts 8
    (all on the devices, the slowest) fit, the ninth in speed: past the eight best that best_static re-prices."""
    prof = ModelProfile.synthetic([1e8] * 8, [1e2] * 8, [1.0] * 7 + [1e6], input_bytes=1e2)
    clients = tuple(Client(f"c{i}", "k", TierProfile(1e9, BIG), LinkProfile(1e7, 1e7, 0.01), 4) for i in range(2))
    return Scenario(prof, clients, (TierProfile(1e11, 4.5e6),), (), batch=2, mode=mode)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_the_fixture_s_edge_holds_any_turn_but_not_beside_a_holder(mode: str) -> None:
    sc = _holder_beside_every_turn(mode)
    t = option_table(sc, sc.clients[0])
    assert t.options.ravel().tolist() == list(range(9)) and t.fits_device.all()
    assert np.all(np.diff(t.round_s) > 0)  # the fewer blocks on the edge, the slower
    turn, held = (a.ravel().tolist() for a in server_columns(sc, t))
    assert turn == [4000028.0 - 4 * k for k in range(8)] + [0.0]
    assert held == [1000007.0 - k for k in range(8)] + [0.0]
    assert all(u <= 4.5e6 < u + h for u, h in zip(turn[:8], held[:8], strict=True))
    assert evaluate(sc, {"c0": (7,), "c1": (7,)}).shared_memory["edge"] == 5e6


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_best_static_screens_out_every_cut_whose_turn_overflows_beside_a_holder(mode: str) -> None:
    """best_static screens cut vectors on turn + holder and re-prices only the eight fastest left. A screen that
    took the holder off the turn let cuts 0 to 7 through; all eight overflow as priced, and the one that fits (cuts
    8, ninth) was never priced: a refusal of a fleet that fits."""
    sc = _holder_beside_every_turn(mode)
    priced = {o: static(sc, (o,)).cost for o in range(9)}
    assert [o for o, c in priced.items() if c.feasible] == [8]
    got = best_static(sc)
    assert got.method == "best static 8" and got.cost.feasible
    assert got.assignment == {"c0": (8,), "c1": (8,)}
    assert got.makespan_s == priced[8].makespan_s == 19.620002799999998
    assert exhaustive(sc).makespan_s == got.makespan_s  # the fleet's optimum too


# ---------------------------------------------------------------- prefer: a class of two clients in the tie search


def _three_on_two_servers() -> Scenario:
    """Three identical clients of one block, an edge and a cloud of equal speed: each loads the tier it uses 0.3 s
    and takes 0.304 s (edge) or 0.30421808 s (cloud) alone, 30 s on its device: two on one tier and one on the other
    (0.6 s) is the optimum, in six ways."""
    prof = ModelProfile.synthetic([1e8], [1e3], [1e4], input_bytes=1e3)
    clients = tuple(Client(f"c{i}", "k", TierProfile(1e8, BIG), LinkProfile(1e7, 1e7, 0.001), 10) for i in range(3))
    return Scenario(prof, clients, (TierProfile(1e10, BIG), TierProfile(1e10, BIG)), (LinkProfile(1e9, 1e9, 1e-4),),
                    batch=5)


_CURRENT = {"c0": (1, 1), "c1": (1, 1), "c2": (0, 0)}  # c0 and c1 on their devices (one class: same inputs, cuts)


def test_the_fixture_has_six_ties_and_one_that_moves_least() -> None:
    sc = _three_on_two_servers()
    assert option_table(sc, sc.clients[0]).round_s.tolist() == [0.30421808, 0.304008, 30.003]
    assert evaluate(sc, _CURRENT).makespan_s == 30.003
    plans = every_plan(sc)
    ties = [p for p, m in plans if m == 0.6]
    assert min(m for _, m in plans) == 0.6 and len(ties) == 6

    def moved(p: dict[str, tuple[int, ...]]) -> float:
        return sum(move_cost(sc, c, _CURRENT[c.name], p[c.name]) for c in sc.clients)

    assert [moved(p) for p in ties] == [0.00318, 0.0030600000000000002, 0.0031200000000000004,
                                        0.0030600000000000002, 0.0031200000000000004, 0.003]
    assert ties[5] == {"c0": (0, 1), "c1": (0, 1), "c2": (0, 0)}


def test_the_tie_search_over_a_class_of_two_finds_the_tie_that_moves_least() -> None:
    """Handed the tie that moves most (c0 and c1 to the cloud, c2 to the edge), the search returns the one that
    moves least (c0 and c1 to the edge, c2 stays). c0 and c1 are one class (same inputs, same cuts in force): a
    row M >= the class's summed round times (2 x 0.304 s, past the 0.6 s cap; valid for single clients only) left
    no tie, and the search kept what it was handed."""
    sc = _three_on_two_servers()
    most = evaluate(sc, {"c0": (0, 0), "c1": (0, 0), "c2": (0, 1)})
    assert most.makespan_s == 0.6
    chosen, looked = closest(sc, most, _CURRENT, 1e-9, 1e-5, None)
    assert looked and chosen.makespan_s == 0.6
    assert chosen.assignment() == {"c0": (0, 1), "c1": (0, 1), "c2": (0, 0)}
    got = solve(sc, prefer=_CURRENT)
    assert got.makespan_s == 0.6 and got.assignment == {"c0": (0, 1), "c1": (0, 1), "c2": (0, 0)}


# ---------------------------------------------------------------- prefer: a tie that is 2e-15 s too slow


def _a_hair_apart(mode: str) -> Scenario:
    """Block 0 does no work, has no parameters and one byte of state; its output is as large as the input. Keeping
    it on the device (cuts 1) instead of the edge (cuts 0) costs only that byte's exchange over a link of 1e15
    B/s: client x's round is 2e-15 s longer (0.330000000010082 s against 0.33000000001008 s), while moving the
    block to the edge ships that byte (half a round trip, 0.005 s)."""
    prof = ModelProfile.synthetic([0.0, 1e8], [1e3, 1e3], [0.0, 1e5], input_bytes=1e3, state_bytes=[1.0, 1e5])
    x = Client("x", "x", TierProfile(1e9, BIG), LinkProfile(1e15, 1e15, 0.01), 10)
    y = Client("y", "y", TierProfile(1e9, BIG), LinkProfile(1e15, 1e15, 0.01), 1)
    return Scenario(prof, (x, y), (TierProfile(1e10, BIG),), (), batch=5, mode=mode)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_the_fixture_s_current_cuts_are_a_hair_slower_than_the_optimum(mode: str) -> None:
    sc = _a_hair_apart(mode)
    x = option_table(sc, sc.clients[0])
    assert x.round_s.tolist() == [0.33000000001008, 0.330000000010082, 3.010000000200002]
    assert move_cost(sc, sc.clients[0], (1,), (0,)) == 0.005000000000001
    assert evaluate(sc, {"x": (0,), "y": (0,)}).makespan_s == 0.380000000011088
    assert evaluate(sc, {"x": (1,), "y": (0,)}).makespan_s == 0.38000000001109


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_with_no_tie_tolerance_cuts_a_hair_slower_are_not_kept(mode: str) -> None:
    """``tie_rel=0``: only the optimum itself is a tie. The MILP that looks for the tie moving least takes the cuts
    in force (no move), whose round exceeds its cap by far less than its tolerance; priced, they are 2e-15 s
    slower than the optimum: no tie, and the optimum is returned. Accepted whenever the candidate fits memory, they
    were returned, slower. With the default tolerance (1e-9) they are a tie and are kept."""
    sc = _a_hair_apart(mode)
    current = {"x": (1,), "y": (0,)}
    got = solve(sc, prefer=current, tie_rel=0.0)
    assert got.assignment == {"x": (0,), "y": (0,)} and got.makespan_s == 0.380000000011088
    assert "least move cost" not in got.note
    kept = solve(sc, prefer=current)
    assert kept.assignment == current and kept.makespan_s == 0.38000000001109
