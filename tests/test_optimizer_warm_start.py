"""A re-solve (``solve(prefer=current)``: the adaptive policy's after every round) starts its bisection from the
current cuts: priced now, they prove the first tau their makespan fits feasible, so no MILP asks that, and one asks
whether the tau just below is: when not, the current makespan's tau is the first feasible one.

Measured before (this machine): the adapter's decision after a round of 1,000 distinct vgg11 devices whose beliefs
had not changed (a simulated run, whose clients measure what the cost model priced) asked 17 MILPs, 16.5-18.5 s;
now 3, 5.0-5.4 s (3.1-3.3 s once pruning left out constant columns). Beliefs that did change (each device's speed
and uplink off by up to 2 %) ask as many as before (16 vs 17; 31-34 s vs 29-36 s). The adapter now asks first, in one
MILP, whether any plan beats its cuts by the hysteresis (``below``, tests/test_optimizer_below.py): 2.2 s a decision
in both cases, as no plan does.
"""

from __future__ import annotations

import re
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, evaluate
from splitfed.errors import ConfigError
from splitfed.optimizer import assign, best_static, defaults, exhaustive, greedy, solve
from splitfed.optimizer import classes as opt_classes
from splitfed.optimizer import solver as opt_solver
from splitfed.profile import ModelProfile
from tests.optimizer_fixtures import reference
from tests.test_optimizer import _outcome, _within_memory, instances


def _milps(note: str) -> int:
    found = re.search(r"(\d+) MILP\(s\)", note)
    assert found is not None, note
    return int(found.group(1))


@st.composite
def _with_every_current(draw: st.DrawFn, mode: str) -> tuple[Scenario, dict]:
    """A fleet and cuts for every one of its clients, any legal ones (some overflow memory)."""
    sc = draw(instances(mode))
    cuts = [tuple(int(x) for x in o) for o in sc.options.tolist()]
    return sc, {c.name: draw(st.sampled_from(cuts)) for c in sc.clients}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["sflv1", "sflv1", "sl", "sflv2"]).flatmap(_with_every_current))
def test_a_re_solve_from_any_current_cuts_equals_brute_force(case: tuple[Scenario, dict]) -> None:
    """From any current cuts, from greedy's and the best static cut's, and from an optimal plan itself, the
    bisection's makespan is brute force's, exactly (``tie_rel`` 0: no tie a hair slower is taken for moving less)."""
    sc, current = case
    truth = _outcome(exhaustive, sc)
    if isinstance(truth, ConfigError):
        event("no plan fits")
        got = _outcome(lambda s: solve(s, gap=0.0, method="bisect", prefer=current), sc)
        assert isinstance(got, ConfigError) and str(got).split()[0] == str(truth).split()[0], got
        return
    starts = [("drawn cuts", current), ("an optimum", truth.assignment)]
    starts += [(policy.__name__, p.assignment) for policy in (greedy, best_static)
               if not isinstance(p := _outcome(policy, sc), ConfigError)]
    for kind, start in starts:
        with mock.patch.object(assign, "_known_index", wraps=assign._known_index) as spy:
            got = solve(sc, gap=0.0, time_limit=None, method="bisect", prefer=start, tie_rel=0.0)
        known = [assign._known_index(*c.args) for c in spy.call_args_list]  # what it answered (pure)
        event(f"from {kind}: " + ("no bisection" if not known else "proves nothing" if known[0] is None
                                  else "the lower bound" if known[0] == 0 else "a tau above it"))
        assert got.makespan_s == truth.makespan_s, (start, got.assignment, truth.assignment, got.note)
        assert got.optimal and _within_memory(sc, got.assignment)


def test_a_re_solve_whose_cuts_are_still_optimal_asks_three_milps(vgg11: ModelProfile) -> None:
    """1,000 clients dealt from the reference fleet share the edge and cloud: the plain bisection asks 10 MILPs.
    From its own answer, 3: the tau below the answer's (no), the lower bound (no), and the least shared load
    capped at the answer's tau. Same makespan, same cuts."""
    sc = reference(vgg11, 1000)
    plain = solve(sc)
    assert plain.note.startswith("sflv1 bisect") and _milps(plain.note) >= 8, plain.note
    again = solve(sc, prefer=plain.assignment)
    assert _milps(again.note) == 3, again.note
    assert again.makespan_s == plain.makespan_s and again.assignment == plain.assignment


def test_a_re_solve_whose_cuts_reach_the_lower_bound_asks_none(vgg11: ModelProfile) -> None:
    """The reference fleet is straggler-bound: its optimum is the slowest client's best time, a lower bound that
    the current cuts reach, so no MILP is needed to know it (the plain solve asks one)."""
    sc = reference(vgg11, 60)
    plain = solve(sc)
    assert _milps(plain.note) == 1, plain.note
    again = solve(sc, prefer=plain.assignment)
    assert _milps(again.note) == 0 and again.makespan_s == plain.makespan_s, again.note


@pytest.mark.parametrize(("drift", "asks"), [("edge", 3), ("phone-mid", None)])
def test_a_re_solve_after_drift_still_finds_the_optimum(vgg11: ModelProfile, drift: str, asks: int | None) -> None:
    """The edge's speed halves: the old cuts' tau is still the first feasible one (3 MILPs, where a solve from
    nothing asks 10). The mid-range phones' uplinks drop 10x: the old cuts prove a tau above the new optimum, and
    the bisection below it finds what a solve from nothing finds."""
    sc = reference(vgg11, 1000)
    before = solve(sc)
    if drift == "edge":
        drifted = replace(sc, servers=(replace(sc.servers[0], flops=sc.servers[0].flops / 2), *sc.servers[1:]))
    else:
        drifted = replace(sc, clients=tuple(replace(c, link=replace(c.link, up=c.link.up / 10)) if c.kind == drift
                                            else c for c in sc.clients))
    plain = solve(drifted)
    again = solve(drifted, prefer=before.assignment)
    assert plain.makespan_s != before.makespan_s  # the drift changed the optimum
    assert again.makespan_s == plain.makespan_s, (again.note, plain.note)
    if asks is not None:
        assert _milps(again.note) == asks < _milps(plain.note), (again.note, plain.note)
    else:
        assert evaluate(drifted, before.assignment).makespan_s > again.makespan_s  # found below the start


def test_cuts_that_overflow_memory_prove_nothing(vgg11: ModelProfile) -> None:
    """Current cuts that do not fit (every client's whole model on the edge and cloud, 1,000 replicas) are no
    start: the bisection is the plain one (its MILPs and its answer; the tie searches after it, which look for
    the least move from such cuts, are left out: 7 s)."""
    sc = reference(vgg11, 1000)
    crowded = {c.name: (0, 0) for c in sc.clients}
    start = assign._start(sc, crowded)
    assert start is not None and not start.feasible
    assert assign._known_index(np.array([start.makespan_s, np.inf]), start) is None
    classes = opt_classes.price_classes(sc)
    plain, warm = (opt_solver.Solver(sc, classes, defaults.DEFAULT_GAP, None) for _ in range(2))
    expected, got = assign._bisect(plain), assign._bisect(warm, start)
    assert got[0].makespan_s == expected[0].makespan_s and warm.calls == plain.calls >= 8, (warm.calls, plain.calls)
