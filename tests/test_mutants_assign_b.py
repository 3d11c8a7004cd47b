"""The optimizer (splitfed/optimizer/), pinned where a mutation run found gaps (second list): every
policy's solve time and optimality flag, the proven gap solve reports, refusals' wording, the memory the best
single cut is judged by, and the tie that moves least."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from splitfed.cost import Scenario, evaluate
from splitfed.errors import ConfigError
from splitfed.optimizer import all_on_server, best_static, exhaustive, greedy, solve, static
from splitfed.optimizer.classes import price_classes
from splitfed.optimizer.solution import Solution
from splitfed.optimizer.solver import run_milp
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

BIG = 1e15  # memory no option fills


def _model(L: int = 4) -> ModelProfile:
    return ModelProfile.synthetic([(i + 1) * 1e7 for i in range(L)], [(L - i) * 2e4 for i in range(L)],
                                  [(i + 2) * 1e5 for i in range(L)], input_bytes=3e4)


def _mixed(n: int = 6, kinds: int = 3, *, server_flops: float = 5e9, speed: float = 1.0, L: int = 4,
           server_memory: float = BIG, mode: str = "sflv1") -> Scenario:
    """``n`` clients of ``kinds`` kinds (faster devices and links per kind) on an edge and a cloud; ``speed``
    scales every rate (and divides every latency), so every time scales by 1 / speed."""
    clients = tuple(Client(f"c{i}", f"k{i % kinds}", TierProfile(speed * 2e9 * (1 + i % kinds), BIG),
                           LinkProfile(speed * 4e6 * (1 + i % kinds), speed * 4e6, 0.01 / speed), 100)
                    for i in range(n))
    servers = (TierProfile(speed * server_flops, server_memory), TierProfile(speed * server_flops * 3, server_memory))
    return Scenario(_model(L), clients, servers, (LinkProfile(speed * 2e7, speed * 2e7, 0.005 / speed),),
                    batch=8, mode=mode)


def _timed(fn: Callable[[], Solution]) -> tuple[Solution, float]:
    t0 = time.perf_counter()
    sol = fn()
    return sol, time.perf_counter() - t0


# ---------------------------------------------------------------- solve time and optimality flag, every policy


@pytest.mark.parametrize("mode", ["sflv1", "sl"])
def test_every_policy_reports_its_own_duration_and_whether_it_is_proven(mode: str) -> None:
    """``solve_s`` is the seconds the call took (a small non-negative duration, never a clock reading);
    ``optimal`` is True for the MILP (finished) and brute force, False for every baseline policy."""
    sc = _mixed(n=2, kinds=2, L=2, mode=mode)
    first = sc.clients[0].name
    policies: list[tuple[Callable[[], Solution], bool]] = [
        (lambda: solve(sc, gap=0.0, time_limit=None), True),
        (lambda: solve(sc, gap=0.0, time_limit=None, prefer={first: tuple(sc.options[0])}), True),
        (lambda: exhaustive(sc), True),
        (lambda: static(sc, tuple(sc.options[-1])), False),
        (lambda: best_static(sc), False),
        (lambda: greedy(sc), False),
        (lambda: all_on_server(sc), False),
    ]
    for fn, proven in policies:
        sol, took = _timed(fn)
        assert 0.0 <= sol.solve_s <= took, (sol.method, sol.solve_s, took)
        assert sol.optimal is proven, sol.method
        assert sol.to_dict()["optimal"] is proven


# ---------------------------------------------------------------- the proven gap


@pytest.mark.parametrize("speed", [1.0, 100.0])  # makespans of seconds and of tens of milliseconds
@pytest.mark.parametrize("method", ["direct", "bisect"])
def test_a_loose_gap_is_reported_as_the_relative_distance_to_a_valid_bound(method: str, speed: float) -> None:
    """Asked for a 30 % gap, HiGHS may stop early: the reported gap is (M - bound) / M for a bound no higher
    than the true optimum, so gap <= 0.3 and M * (1 - gap) <= M*, and a gap of 0 claims M = M*; the note
    prints it."""
    sc = _mixed(speed=speed)
    truth = solve(sc, gap=0.0, time_limit=None).makespan_s
    sol = solve(sc, gap=0.3, method=method, time_limit=None)
    assert sol.makespan_s >= truth * (1 - 1e-9)
    assert 0.0 <= sol.gap <= 0.3
    assert sol.makespan_s * (1 - sol.gap) <= truth * (1 + 1e-9)
    assert sol.gap > 0 or sol.makespan_s == pytest.approx(truth, rel=1e-9)  # (this HiGHS stops above it)
    assert sol.note.split("; ")[0].endswith(f"proven gap {sol.gap:.1e}")  # (then the tie it chose, if any)
    assert sol.to_dict()["gap"] == sol.gap


@pytest.mark.parametrize("method", ["direct", "bisect"])
def test_an_exact_solve_proves_its_optimum(method: str) -> None:
    """At the default gap the MILP proves its answer to 1e-5: the reported gap says so (a lost bound would
    report 1, as if nothing were proven), and the note counts the MILPs it ran (at least one)."""
    for sc in (_mixed(), _mixed(n=4, kinds=4, server_flops=2e10)):
        sol = solve(sc, method=method, time_limit=None)
        assert 0.0 <= sol.gap <= 1e-5, sol.note
        runs = int(re.search(r"(-?\d+) MILP\(s\)", sol.note).group(1))  # type: ignore[union-attr]
        assert runs >= 1, sol.note


def test_a_round_of_no_time_has_no_gap() -> None:
    """A model of no work and no state, its 1-byte input on an instant link: the best round takes 0 s. The
    gap of a 0 s makespan is 0 (not a division by zero, not 1)."""
    prof = ModelProfile.synthetic([0.0, 0.0], [1.0, 1.0], [0.0, 0.0], input_bytes=1.0)
    client = Client("c0", "c0", TierProfile(1e9, BIG), LinkProfile(1e6, 1e6, 0.0), 1)
    sc = Scenario(prof, (client,), (TierProfile(1e9, BIG),), (), batch=1, mode="sflv1")
    sol = solve(sc, gap=0.0)
    assert sol.makespan_s == 0.0
    assert sol.gap == 0.0
    assert sol.note.endswith("proven gap 0.0e+00")


# ---------------------------------------------------------------- refusals


def test_four_devices_no_cut_fits_name_the_three_others() -> None:
    """Up to three further unfit devices are named, by name; more are counted."""
    sc = _mixed(n=4, kinds=4, L=2)
    tiny = tuple(Client(c.name, c.kind, TierProfile(c.device.flops, 1.0), c.link, c.samples) for c in sc.clients)
    sc = replace(sc, clients=tiny)
    with pytest.raises(ConfigError, match=r"device 'c0' \(fleet entry 'k0'\) \(and 'c1', 'c2', 'c3'\) cannot"):
        solve(sc)


PROF = ModelProfile.synthetic([1e6, 2e6, 3e6], [1e3, 2e3, 1e3], [1e4, 2e4, 1e4], input_bytes=1e3)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the cost model overflows on absurd beliefs
@pytest.mark.parametrize("stuck, tail", [(3, "'c0', 'c1', 'c2' is priced"), (4, "'c0', 'c1', 'c2' and 1 more is priced"),
                                         (5, "'c0', 'c1', 'c2' and 2 more is priced")])
def test_clients_priced_infinite_are_named_up_to_three(stuck: int, tail: str) -> None:
    """Three clients whose every cut is priced infinite: all three named, no "and 0 more"; four or five: the
    rest counted."""
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1e9, BIG), LinkProfile(1e-308 if i < stuck else 1e6,
                                                                                1e6, 0.01), 4) for i in range(6))
    sc = Scenario(PROF, clients, (TierProfile(1e10, 1e12), TierProfile(1e11, 1e12)), (LinkProfile(1e6, 1e6, 0.005),),
                  batch=2, mode="sflv1")
    with pytest.raises(ConfigError) as e:
        solve(sc, gap=0.0, time_limit=None)
    assert str(e.value).endswith(f"(every cut of client(s) {tail} infinite)")


# ---------------------------------------------------------------- the best single cut: server memory as priced


@pytest.mark.parametrize("n", [1, 3])
def test_best_static_takes_a_cut_that_fills_the_servers_exactly(n: int) -> None:
    """sflv1: servers of exactly the memory the best static cut needs (as the cost model prices it, the staged
    base for several clients, none for one): that cut is still taken, not estimated out."""
    heavy = ModelProfile.synthetic([(i + 1) * 1e7 for i in range(4)], [1e3] * 4, [5e6] * 4, input_bytes=3e4)
    loose = replace(_mixed(n=n, kinds=1, server_flops=1e12), profile=heavy)  # state outweighs activations
    ranked = sorted((static(loose, o).makespan_s, tuple(o)) for o in loose.options)
    for _, cuts in ranked:
        cost = static(loose, cuts).cost
        need = list(cost.shared_memory.values())
        if all(m > 0 for m in need):
            break
    sc = replace(loose, servers=tuple(TierProfile(s.flops, m) for s, m in zip(loose.servers, need, strict=True)))
    assert evaluate(sc, {c.name: cuts for c in sc.clients}).feasible
    truth = min(s.makespan_s for s in (static(sc, o) for o in sc.options) if s.cost.feasible)
    got = best_static(sc)
    assert got.makespan_s == truth
    assert math.isfinite(truth)


# ---------------------------------------------------------------- MILP answers, every method

HEAVY = ModelProfile.synthetic([(i + 1) * 1e7 for i in range(4)], [(4 - i) * 2e4 for i in range(4)],
                               [(i + 2) * 1e6 for i in range(4)], input_bytes=3e4)  # state outweighs activations


def test_every_method_finds_the_same_optimum_for_identical_clients() -> None:
    """Classes of several identical clients: direct (one binary per client), bisect (counts per class) and the
    brute force agree at gap 0."""
    sc = _mixed(n=4, kinds=2, L=3)
    truth = exhaustive(sc).makespan_s
    for method in ("direct", "bisect"):
        sol = solve(sc, gap=0.0, method=method, time_limit=None)
        assert sol.makespan_s == pytest.approx(truth, rel=1e-9), method
        assert sol.optimal


@pytest.mark.parametrize("fill", [0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("kinds", [1, 2])
def test_two_clients_staged_base_is_respected(kinds: int, fill: float) -> None:
    """sflv1, two clients, a heavy model, an edge of a fraction of the whole model's state: the staged base
    (blocks both clients put there) decides what fits; the MILP equals brute force."""
    state = sum(HEAVY.state_bytes)
    sc = replace(_mixed(n=2, kinds=kinds, server_flops=2e10), profile=HEAVY)
    sc = replace(sc, servers=(TierProfile(sc.servers[0].flops, fill * 2 * state), sc.servers[1]))
    truth = exhaustive(sc)
    sol = solve(sc, gap=0.0, time_limit=None)
    assert sol.cost.feasible
    assert sol.makespan_s == pytest.approx(truth.makespan_s, rel=1e-9)


@pytest.mark.parametrize("fill", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
@pytest.mark.parametrize("method", ["sequential", "bisect", "direct"])
def test_in_turn_holders_and_memory_equal_brute_force(method: str, fill: float) -> None:
    """sl, two kinds, servers a fraction of the model's state: each client's turn beside the largest holder
    decides what fits; every method equals brute force, and its answer fits as priced."""
    state = sum(HEAVY.state_bytes)
    sc = replace(_mixed(n=3, kinds=2, server_flops=2e10, mode="sl"), profile=HEAVY)
    sc = replace(sc, servers=tuple(TierProfile(s.flops, fill * 2 * state) for s in sc.servers))
    try:
        truth = exhaustive(sc)
    except ConfigError as e:
        with pytest.raises(ConfigError, match=str(e).split(":")[0]):
            solve(sc, gap=0.0, method=method, time_limit=None)
        return
    sol = solve(sc, gap=0.0, method=method, time_limit=None)
    assert sol.cost.feasible
    assert sol.makespan_s == pytest.approx(truth.makespan_s, rel=1e-9)


def test_a_milp_out_of_time_before_any_answer_is_unknown_not_an_error() -> None:
    """HiGHS stopped by its time limit before any solution: "no answer, not proven", not numerical trouble."""
    sc = _mixed(n=12, kinds=12)
    classes = price_classes(sc)
    r = run_milp(sc, classes, [np.arange(len(c.T)) for c in classes], time_rows=True, scale=1.0, gap=0.0,
              time_limit=1e-9, mem_rhs=np.ones(2))
    assert r.value == math.inf
    assert not r.optimal
    assert r.counts == []


# ---------------------------------------------------------------- the tie that moves least


def test_a_preferred_cut_that_ties_the_optimum_exactly_is_kept() -> None:
    """c0 sets the makespan; c1's preferred cuts (everything on the device) give exactly the same makespan,
    though its own round is slower than at its fastest cuts: with tie_rel 0 they are kept."""
    sc = _mixed(n=2, kinds=2, server_flops=1e12)
    free = solve(sc, gap=0.0, time_limit=None)
    mine = (0, 0)
    assert free.assignment["c1"] != mine
    assert evaluate(sc, {**free.assignment, "c1": mine}).makespan_s == free.makespan_s
    sol = solve(sc, gap=0.0, time_limit=None, prefer={"c1": mine}, tie_rel=0.0)
    assert sol.assignment["c1"] == mine
    assert sol.assignment["c0"] == free.assignment["c0"]
    assert sol.makespan_s == free.makespan_s
    assert "least move cost among ties" in sol.note


@pytest.mark.parametrize("method", ["sequential", "bisect", "direct"])
def test_in_turn_servers_no_option_fits_refuse_as_memory(method: str) -> None:
    """sl: servers of 1 kB, a device that cannot hold the whole model: no option fits a server beside its
    holder, and the refusal says the servers cannot hold the segments."""
    sc = replace(_mixed(n=2, kinds=2, mode="sl"), profile=HEAVY)
    sc = replace(sc, servers=tuple(TierProfile(s.flops, 1e3) for s in sc.servers),
                 clients=tuple(replace(c, device=TierProfile(c.device.flops, 3 * HEAVY.state_bytes[0]))
                               for c in sc.clients))
    with pytest.raises(ConfigError, match=r"^no assignment fits: the server tiers \(edge 1000 bytes, cloud "
                                          r"1000 bytes\) cannot hold the segments of all 2 clients"):
        solve(sc, gap=0.0, method=method, time_limit=None)


@pytest.mark.parametrize("mine", [(0, 0), (0, 2), (0, 3), (0, 4)])
def test_a_client_whose_moves_ship_nothing_stays_where_it_is_when_that_ties(mine: tuple[int, int]) -> None:
    """A model without state: every move costs 0 s, so the move-cost MILP cannot tell c1's cuts apart; among
    the assignments that tie the optimum, c1 keeps the cuts it has rather than make a move that ships nothing."""
    stateless = ModelProfile.synthetic([(i + 1) * 1e7 for i in range(4)], [(4 - i) * 2e4 for i in range(4)],
                                       [0.0] * 4, input_bytes=3e4)
    sc = replace(_mixed(n=2, kinds=2, server_flops=1e12), profile=stateless)
    free = solve(sc, gap=0.0, time_limit=None)
    assert evaluate(sc, {**free.assignment, "c1": mine}).makespan_s == free.makespan_s
    sol = solve(sc, gap=0.0, time_limit=None, prefer={"c1": mine}, tie_rel=0.0)
    assert sol.assignment == {"c0": free.assignment["c0"], "c1": mine}
    assert sol.makespan_s == free.makespan_s
