"""With current cuts (``solve(prefer=...)``, the adaptive policy's re-solves and a resumed run's plan), the optimizer
returns, among the ties of least move cost, one of least total client round time.

Before, the least move alone was asked for and the rest left to the first answer: a resumed run's clients that its
plan did not know (their move costs 0 wherever they go) got whichever tie HiGHS met first; on the reference fleet
(vgg11) the 30 new clients took 866 s of client time where 223 s was theirs (their own fastest cuts).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, evaluate
from splitfed.cost.model import move_cost, move_costs
from splitfed.errors import ConfigError
from splitfed.optimizer import Adapter, assign, exhaustive, greedy, solve
from splitfed.optimizer import ties as opt_ties
from splitfed.profile import ModelProfile
from tests import optimizer_fixtures
from tests.plan_fixtures import every_plan
from tests.test_optimizer import instances

TIE = 1e-9  # solve's default tie_rel


def _total(sc: Scenario, plan: dict) -> float:
    return math.fsum(c.round_s for c in evaluate(sc, plan).clients)


def _moved(sc: Scenario, plan: dict, current: dict) -> float:
    return math.fsum(move_cost(sc, c, current[c.name], plan[c.name]) for c in sc.clients if c.name in current)


def _ships_nothing_somewhere(sc: Scenario, current: dict) -> bool:
    """Some client of ``current`` can change cuts without shipping a byte (such a move is undone where staying is
    as good: the least time is then not the brute force's over every plan)."""
    for c in sc.clients:
        if c.name in current:
            other = [o for o in sc.options.tolist() if tuple(o) != tuple(current[c.name])]
            if other and (move_costs(sc, c, current[c.name], np.asarray(other)) == 0).any():
                return True
    return False


@st.composite
def _with_current(draw: st.DrawFn, mode: str) -> tuple[Scenario, dict]:
    sc = draw(instances(mode, limit=400))
    cuts = [tuple(int(x) for x in o) for o in sc.options.tolist()]
    current = {c.name: draw(st.sampled_from(cuts)) for c in sc.clients if draw(st.booleans())}
    return sc, current


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["sflv1", "sflv1", "sl", "sflv2"]).flatmap(_with_current))
def test_of_the_ties_that_move_least_the_optimizer_takes_one_of_least_client_time(case: tuple[Scenario, dict]
                                                                                 ) -> None:
    """Brute force over every plan within ``tie_rel`` of the least makespan: the least move cost from the current
    cuts, and among the plans that move that little, the least total client time; the optimizer's plan moves no
    more (exact solve) and, unless some move ships nothing (undone where staying is as good), takes that time to
    within the tie search's gap."""
    sc, current = case
    try:
        exhaustive(sc)
    except ConfigError:
        event("no plan fits")
        return
    plans = every_plan(sc)
    thr = min(m for _, m in plans) * (1 + TIE)
    ties = [p for p, m in plans if m <= thr]
    least_move = min(_moved(sc, p, current) for p in ties)
    least = min(_total(sc, p) for p in ties if _moved(sc, p, current) <= least_move * (1 + 1e-9) + 1e-12)
    got = solve(sc, gap=0.0, time_limit=None, prefer=current)
    assert got.makespan_s <= thr
    assert _moved(sc, got.assignment, current) <= least_move * (1 + 1e-9) + 1e-9, got.note
    if _ships_nothing_somewhere(sc, current):
        event("a move ships nothing")
        return
    total = _total(sc, got.assignment)
    assert total <= least * (1 + opt_ties.TIE_GAP) + 1e-12, (got.assignment, got.note)
    assert total >= least * (1 - 1e-12)
    event("a tie of less time taken" if "least client time among those" in got.note else "least move kept")


@pytest.fixture(scope="module")
def reference(vgg11: ModelProfile) -> Scenario:
    return optimizer_fixtures.reference(vgg11)


def test_a_resumed_plan_s_new_clients_train_at_their_own_fastest(reference: Scenario) -> None:
    """The reference fleet, every other client's cuts known (a resumed run's plan that knew half the fleet): those
    stay (moving nothing), and the 30 others take their own fastest cuts (greedy's), where the least move alone
    left them 866 s of client time for their 223 s. The note says what the tie saved."""
    sc = reference
    plain = solve(sc)
    known = {c.name: plain.assignment[c.name] for c in sc.clients[::2]}
    got = solve(sc, prefer=known)
    assert got.makespan_s == pytest.approx(plain.makespan_s, rel=1e-12)
    assert {n: got.assignment[n] for n in known} == known
    fastest = {c.name: c.round_s for c in greedy(sc).cost.clients}
    mine = {c.name: c.round_s for c in got.cost.clients if c.name not in known}
    assert len(mine) == 30
    assert mine == pytest.approx({n: fastest[n] for n in mine}, rel=1e-9)
    assert "; least move cost among ties: 0 s; least client time among those: 445.8 s in all (was " in got.note


def test_the_least_move_is_not_given_up_for_client_time(reference: Scenario,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client's cuts known, those of the first optimal plan HiGHS meets (1,750 s of client time): staying is
    optimal (no move), so the plan is kept as it is, however much faster the clients could be (446 s): the least
    move comes first (the time search is not even run: the note says nothing of client time)."""
    sc = reference
    with monkeypatch.context() as m:
        m.setattr(assign, "least_time", lambda s, best, tie_rel, deadline: (best, True))
        slow = solve(sc).assignment  # a plan of the least makespan, not of the least time
    fast = solve(sc)
    assert _total(sc, slow) != _total(sc, fast.assignment)  # the premise: the kept plan is not the fastest
    got = solve(sc, prefer=slow)
    assert got.assignment == slow
    assert "client time" not in got.note


def test_an_adapter_given_a_plan_without_some_clients_plans_them_at_their_fastest(reference: Scenario) -> None:
    """``Adapter(assignment=...)`` as a resumed run makes it: the clients the plan names keep their cuts, the others
    are planned at their own fastest (before: the first tie, e.g. flagship phones training all of vgg11)."""
    sc = reference
    plain = solve(sc)
    known = {c.name: plain.assignment[c.name] for c in sc.clients if not c.name.startswith("phone-flagship")}
    a = Adapter(sc, rounds=5, assignment=known)
    assert {n: a.assignment[n] for n in known} == known
    fastest = {c.name: c.round_s for c in greedy(sc).cost.clients}
    got = {c.name: c.round_s for c in evaluate(sc, a.assignment).clients if c.name not in known}
    assert got and got == pytest.approx({n: fastest[n] for n in got}, rel=1e-9)
    assert max(got.values()) < 0.1 * plain.makespan_s


def test_a_time_search_out_of_time_keeps_the_least_move_and_says_so(reference: Scenario,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The time search has its own budget (as without ``prefer``); spent, the least-move plan stays, the makespan
    still proven, and the note says the search ran out."""
    sc = reference
    known = {c.name: solve(sc).assignment[c.name] for c in sc.clients[::2]}
    before = solve(sc, prefer=known)
    moving = opt_ties.least_time_moving
    monkeypatch.setattr(assign, "least_time_moving",
                        lambda sc, chosen, prefer, thr, deadline: moving(sc, chosen, prefer, thr, deadline - 1e9))
    got = solve(sc, prefer=known)
    assert got.optimal and got.makespan_s == before.makespan_s
    assert got.note.endswith("; least move cost among ties: 0 s; the search for the least client time among those "
                             "ran out of time"), got.note
    assert {n: got.assignment[n] for n in known} == known
    assert _total(sc, got.assignment) > _total(sc, before.assignment)



def _straggler_fleet() -> Scenario:
    """A straggler on a slow link and two fast clients, any of whose cuts ends before it (10 options each:
    1,000 plans for brute force)."""
    from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

    prof = ModelProfile.synthetic([20e6, 40e6, 1e6], [48e3, 4e3, 40], [8e3, 1.2e6, 20e3], input_bytes=12e3)
    slow = Client("straggler", "slow", TierProfile(1e8, 1e9), LinkProfile(1e4, 1e4, 0.05), 100)
    fast = [Client(f"fast{i}", "fast", TierProfile(5e9, 1e9), LinkProfile(1e7, 1e7, 0.01), 100) for i in range(2)]
    return Scenario(prof, (slow, *fast), (TierProfile(1e11, 1e10), TierProfile(1e12, 1e11)),
                    (LinkProfile(1e8, 1e8, 0.001),), batch=16)


@functools.cache
def _straggler_ties() -> list[tuple[dict, float]]:
    """Brute force: every plan of the least makespan (to ``tie_rel``) and its total client time."""
    sc = _straggler_fleet()
    plans = every_plan(sc)
    thr = min(mk for _, mk in plans) * (1 + TIE)
    return [(p, _total(sc, p)) for p, mk in plans if mk <= thr]


@pytest.mark.parametrize("known", [(), ("straggler",), ("straggler", "fast0"), ("fast1",)])
def test_a_straggler_bound_fleet_s_unknown_clients_get_the_least_time_of_the_least_move(
        known: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """With some clients' cuts known (those of the first optimal plan HiGHS meets), the plan moves none of them and
    the rest take the least client time brute force finds among such plans (the first plan's ties took more)."""
    sc = _straggler_fleet()
    with monkeypatch.context() as m:
        m.setattr(assign, "least_time", lambda s, best, tie_rel, deadline: (best, True))
        first = solve(sc).assignment
    current = {n: first[n] for n in known}
    ties = _straggler_ties()
    assert min(_moved(sc, p, current) for p, _ in ties) == 0.0  # staying is among the ties
    least = min(total for p, total in ties if _moved(sc, p, current) == 0.0)
    assert _total(sc, first) > least * (1 + opt_ties.TIE_GAP)  # the premise: the first plan is not the least time
    got = solve(sc, gap=0.0, time_limit=None, prefer=current)
    assert _moved(sc, got.assignment, current) == 0.0
    assert least <= _total(sc, got.assignment) <= least * (1 + opt_ties.TIE_GAP)



def test_the_time_search_moves_no_more_than_the_least_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """fast0 known on a slow tied cut, the straggler on a cut worse than its best (something must move), fast1
    unknown: the plan moves what the least move moves (brute force's), fast0 keeps its slow cut though moving it
    would cut the client time, and fast1 takes the least time the move leaves (brute force's, to the gap): the
    search is bounded by the move, not refused for it."""
    sc = _straggler_fleet()
    with monkeypatch.context() as m:
        m.setattr(assign, "least_time", lambda s, best, tie_rel, deadline: (best, True))
        first = solve(sc).assignment
    worst = max((tuple(int(x) for x in o) for o in sc.options.tolist()),
                key=lambda o: evaluate(sc, {**first, "straggler": o}).makespan_s)
    current = {"straggler": worst, "fast0": first["fast0"]}
    ties = _straggler_ties()
    least_move = min(_moved(sc, p, current) for p, _ in ties)
    assert least_move > 0
    least = min(total for p, total in ties if _moved(sc, p, current) <= least_move * (1 + 1e-9))
    assert min(total for _, total in ties) < least  # the premise: moving fast0 would save time
    got = solve(sc, gap=0.0, time_limit=None, prefer=current)
    assert _moved(sc, got.assignment, current) == pytest.approx(least_move, rel=1e-9)
    assert got.assignment["fast0"] == first["fast0"]
    assert least <= _total(sc, got.assignment) <= least * (1 + opt_ties.TIE_GAP), got.note
    assert "; least client time among those: " in got.note
