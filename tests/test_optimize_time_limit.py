"""``splitfed optimize --time-limit S`` keeps to S, and a Ctrl-C stops a solve at once (splitfed/optimizer/).

Measured before (vgg11, ``--time-limit 5``, fleets of distinct devices): pricing every device's options took
3-10 s for 1,000 and 33 s for 10,000 before any MILP ran (nothing checked the limit there); the time left was
taken before a MILP over thousands of classes was built; HiGHS's presolve overran its own ``time_limit`` by up
to 3.6 s; and the C code held the main thread, so a Ctrl-C waited for it. Each test drives the solver's clock
(``splitfed.optimizer.clock``'s ``time``) from the work it fakes: no timings.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest

from splitfed.cli import main
from splitfed.cost import Scenario, evaluate
from splitfed.errors import ConfigError
from splitfed.optimizer import baselines as opt_baselines
from splitfed.optimizer import best_static, solve
from splitfed.optimizer import classes as opt_classes
from splitfed.optimizer import clock as opt_clock
from splitfed.optimizer import solver as opt_solver
from splitfed.optimizer import ties as opt_ties
from tests.test_mutants_assign_polish import _all_on_edge, _cloud_need, _moved, _tiny
from tests.test_optimizer import FLEET, _client, _scenario


class _Clock:
    """The optimizer's clock (``time.perf_counter``): moves only when a test says so."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        monkeypatch.setattr(opt_clock, "time", SimpleNamespace(perf_counter=lambda: self.now))


def _distinct(n: int) -> Scenario:
    """``n`` clients no two alike (no classes to group): each is priced on its own."""
    return _scenario([_client(f"c{i}", flops=1e9 * (3 + i), up=1e6 * (1 + i)) for i in range(n)])


def _no_milp(*a: object, **k: object) -> None:
    raise AssertionError("a MILP ran after the time limit ran out")


def test_each_milp_gets_what_is_left_once_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a MILP (its rows, one Python loop per class) takes time too: HiGHS gets the deadline less the
    clock when it is called, not when the build began (before: 0.1 s of build per MILP over the limit here)."""
    clock = _Clock(monkeypatch)
    real_constraint, real_milp = opt_solver.LinearConstraint, opt_solver.milp
    calls: list[tuple[float, float]] = []

    def slow_build(*a: object, **k: object) -> object:
        clock.now += 0.1  # the rows' assembly
        return real_constraint(*a, **k)  # type: ignore[arg-type]

    def timed(*a: object, options: dict, **k: object) -> object:
        calls.append((clock.now, options["time_limit"]))
        clock.now += 0.05
        return real_milp(*a, options=options, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_solver, "LinearConstraint", slow_build)
    monkeypatch.setattr(opt_solver, "milp", timed)
    try:
        solve(_distinct(12), time_limit=1.0)
    except ConfigError as e:
        assert "time limit ran out before the MILP found any assignment" in str(e)
    assert calls and all(start + limit == pytest.approx(1.0) for start, limit in calls), calls
    assert all(start < 1.0 for start, _ in calls)


def test_pricing_the_options_stops_at_the_limit_before_any_milp(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 distinct devices, each priced 0.1 s: the limit of 4 s runs out on the way; the pricing stops at the
    next check (every CHECK_EVERY devices: the second, 6.3 s) and says so, naming the flag; no MILP runs (before:
    all 100 priced, then "before the MILP found any assignment")."""
    clock = _Clock(monkeypatch)
    real = opt_classes.option_table
    priced: list[str] = []

    def slow(sc: Scenario, c: object) -> object:
        priced.append(c.name)  # type: ignore[attr-defined]
        clock.now += 0.1
        return real(sc, c)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_classes, "option_table", slow)
    monkeypatch.setattr(opt_solver, "milp", _no_milp)
    with pytest.raises(ConfigError, match=r"^the time limit ran out while pricing the cuts of the 100 clients of "
                                          r"synthetic \(63 of their 100 distinct devices priced\), before any MILP: "
                                          r"raise it \(--time-limit\), or price a policy that needs no MILP: --greedy$"):
        solve(_distinct(100), time_limit=4.0)
    assert len(priced) == 2 * opt_clock.CHECK_EVERY - 1


def test_pruning_the_priced_options_stops_at_the_limit_before_any_milp(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 distinct devices priced at once, each group's Pareto front then taking 0.1 s: the limit of 4 s runs out
    while the fronts are built, and the pruning stops at its next check (every CHECK_EVERY groups: the second,
    6.3 s), saying how far it got; no MILP runs. (A mutation run found this check unwatched: with it gone, every
    front was built past the limit.)"""
    clock = _Clock(monkeypatch)
    real = opt_classes.pareto
    fronts: list[float] = []

    def slow(V: object) -> object:
        fronts.append(clock.now)
        clock.now += 0.1
        return real(V)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_classes, "pareto", slow)
    monkeypatch.setattr(opt_solver, "milp", _no_milp)
    with pytest.raises(ConfigError, match=r"^the time limit ran out while pricing the cuts of the 100 clients of "
                                          r"synthetic \(the options of 63 of their 100 groups pruned\), before any "
                                          r"MILP: raise it \(--time-limit\), or price a policy that needs no MILP: "
                                          r"--greedy$"):
        solve(_distinct(100), time_limit=4.0)
    assert len(fronts) == 2 * opt_clock.CHECK_EVERY - 1


def test_a_fleet_of_few_distinct_devices_is_always_priced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer than CHECK_EVERY devices are priced whatever the clock (a few ms): a spent limit then still gets an
    answer that needs no MILP (sl's), as before."""
    clock = _Clock(monkeypatch)
    real = opt_classes.option_table

    def slow(sc: Scenario, c: object) -> object:
        clock.now += 10.0
        return real(sc, c)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_classes, "option_table", slow)
    sc = replace(_distinct(opt_clock.CHECK_EVERY - 1), mode="sl")
    got = solve(sc, time_limit=1.0)
    assert got.cost.feasible and got.note.startswith("sl sequential")


def test_the_bisection_s_fronts_stop_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each class's first front prices its dominance (~1 ms; seconds for thousands of distinct clients): once the
    limit has run out no further front is built and no MILP runs (before: every class's front, then nothing)."""
    clock = _Clock(monkeypatch)
    real = opt_classes.OptionClass.shared_front
    fronts: list[float] = []

    def slow(self: opt_classes.OptionClass, tau: float) -> object:
        fronts.append(tau)
        clock.now += 0.5
        return real(self, tau)

    monkeypatch.setattr(opt_classes.OptionClass, "shared_front", slow)
    monkeypatch.setattr(opt_solver, "milp", _no_milp)
    with pytest.raises(ConfigError, match="time limit ran out before the MILP found any assignment"):
        solve(_distinct(40), time_limit=1.0)
    assert len(fronts) == 2  # 0.5 s each: the third class finds the limit spent


def test_polish_tries_nothing_once_the_limit_has_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each polish trial prices the whole fleet (~0.5 s for 1,000 distinct clients): none starts past the
    deadline. Twenty clients of which the cloud holds five moved: each trial 1 s, a deadline at 2.5 s stops it
    after at most three trials, where it would have made five moves."""
    n = 20
    sc = _tiny(n, cloud_memory=_cloud_need(n, 5))
    cost = _all_on_edge(sc)
    classes = opt_classes.price_classes(sc)
    assert _moved(opt_ties.polish(sc, classes, cost)) == 5
    clock = _Clock(monkeypatch)

    def slow(sc: Scenario, plan: dict) -> object:
        clock.now += 1.0
        return evaluate(sc, plan)

    monkeypatch.setattr(opt_ties, "evaluate", slow)
    got = opt_ties.polish(sc, classes, cost, deadline=2.5)
    assert 0 < _moved(got) < 5 and got.feasible
    assert clock.now <= 3.0  # no trial began at or past the deadline
    assert opt_ties.polish(sc, classes, cost, deadline=0.0) is cost


def test_best_static_s_ranking_stops_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--best-static`` ranks every vector over every distinct device's options before it prices one: a limit
    that runs out on the way is refused there, named (before: all 100 devices priced, 10 s on a 1 s limit)."""
    clock = _Clock(monkeypatch)
    real = opt_classes.option_table
    priced: list[int] = []

    def slow(sc: Scenario, c: object) -> object:
        priced.append(1)
        clock.now += 0.1
        return real(sc, c)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_baselines, "option_table", slow)
    with pytest.raises(ConfigError, match=r"^the time limit ran out while ranking the cut vectors for the 100 "
                                          r"clients of synthetic \(31 of their 100 distinct devices priced\), before "
                                          r"any was priced exactly: raise it \(--time-limit\)$"):
        best_static(_distinct(100), time_limit=1.0)
    assert len(priced) == opt_clock.CHECK_EVERY - 1


def test_a_milp_that_overruns_its_time_limit_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """HiGHS's presolve overran its ``time_limit`` by seconds on thousands of distinct clients: the solve waits
    for it GRACE_S past the deadline at most, then goes on as if HiGHS had stopped without an answer (before: it
    waited for HiGHS, here forever)."""
    clock = _Clock(monkeypatch)
    release, returned = threading.Event(), threading.Event()

    def stuck(*a: object, **k: object) -> None:
        clock.now = 100.0  # far past the deadline and its grace, as presolve was
        try:
            release.wait(10)  # a bound for the old code, which waits here
        finally:
            returned.set()

    monkeypatch.setattr(opt_solver, "milp", stuck)
    try:
        with pytest.raises(ConfigError, match="time limit ran out before the MILP found any assignment"):
            solve(_distinct(8), time_limit=1.0)
        assert not returned.is_set()  # given up while HiGHS (the fake) still ran
    finally:
        release.set()
    assert returned.wait(30)


def test_ctrl_c_stops_a_solve_while_highs_runs(fleet_file: str, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A SIGINT while HiGHS runs: the command ends with its one line and 130 while the MILP is still running (it
    runs in a worker thread; the main thread waits for it in slices, where the KeyboardInterrupt reaches it).
    Before, the C code held the main thread: the signal was handled only once HiGHS returned. The fake keeps
    the interrupt from its own thread as C code does, and re-raises it once released."""
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    def highs(*a: object, **k: object) -> None:
        started.set()
        caught = None
        try:
            while not release.wait(30):  # the bound: the old code's main thread is held here until released
                pass
        except KeyboardInterrupt as e:  # the old code: the signal's handler ran here, in the main thread
            caught = e
            release.wait(30)
        finally:
            returned.set()
        if caught is not None:
            raise caught

    main_id = threading.get_ident()

    def interrupt() -> None:
        if started.wait(30):
            signal.pthread_kill(main_id, signal.SIGINT)
        if not returned.wait(0) and not done.wait(10):  # the old code: let the fake go so the test ends
            release.set()

    done = threading.Event()
    monkeypatch.setattr(opt_solver, "milp", highs)
    t = threading.Thread(target=interrupt, daemon=True)
    t.start()
    try:
        code = main(["optimize", "--model", "mlp", "--fleet", fleet_file])
        still_running = not returned.is_set()
    finally:
        done.set()
        release.set()
    t.join(30)
    assert code == 130 and still_running
    assert capsys.readouterr().err == "splitfed optimize: interrupted\n"
    assert returned.wait(30)
    for th in threading.enumerate():  # the worker ends with its MILP: nothing is left behind
        if th.name == "splitfed-milp":
            th.join(30)
    assert not [th for th in threading.enumerate() if th.name == "splitfed-milp"]


@pytest.fixture()
def fleet_file(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "fleet.toml"
    p.write_text(FLEET)
    return str(p)


def test_the_help_states_the_grace_the_solver_gives_highs() -> None:
    from splitfed.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["optimize"]  # type: ignore[attr-defined]
    text = next(a.help for a in sub._actions if "--time-limit" in a.option_strings)
    assert f"given up {opt_solver.GRACE_S:g} s later" in text and "Ctrl-C stops a solve at once (exit 130)" in text


def test_a_re_solve_s_search_for_the_tie_that_moves_least_stops_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``prefer`` (every adaptive round's re-solve, limit 30 s) the classes priced with move costs ignored
    the limit: with every device's moves priced 1 s, a 5 s limit ran all 80 (80 s). They stop at the next check
    now, and the answer is the makespan's own, saying that its least-moving tie was not looked for."""
    sc = _distinct(80)
    plain = solve(sc)
    clock = _Clock(monkeypatch)
    real = opt_classes.move_costs
    priced: list[str] = []

    def slow(sc: Scenario, c: object, *a: object) -> object:
        priced.append(c.name)  # type: ignore[attr-defined]
        clock.now += 1.0
        return real(sc, c, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_classes, "move_costs", slow)
    got = solve(sc, time_limit=5.0, prefer={c.name: (0, 0) for c in sc.clients})  # all on the cloud: not a tie
    assert len(priced) == opt_clock.CHECK_EVERY - 1, len(priced)
    assert got.makespan_s == plain.makespan_s and got.cost.feasible
    assert "no time left to look for the tie that moves least" in got.note, got.note


def test_the_search_for_the_tie_that_moves_least_gets_a_tie_search_s_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``prefer`` the MILP of least move had the whole limit left: a re-solve of 1,000 distinct vgg11 devices
    whose beliefs moved 2 % spent 70 s there after a 45 s makespan search, to the 120 s limit. It gets what the
    tie of least client time gets: a quarter of the time so far, at least ``TIE_MIN_S``. Each MILP here takes
    20 s of the test's clock."""
    sc = _distinct(12)
    clock = _Clock(monkeypatch)
    real_milp, real_tie = opt_solver.run_milp, opt_ties.tie_answer

    def slow(*a: object, **k: object) -> object:
        r = real_milp(*a, **k)  # type: ignore[arg-type]
        clock.now += 20.0
        return r

    given: list[tuple[float, float]] = []  # (the clock, the time the tie search's solver has left)

    def tie(s: object, *a: object, **k: object) -> object:
        given.append((clock.now, s.deadline - clock.now))  # type: ignore[attr-defined]
        return real_tie(s, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_solver, "run_milp", slow)
    monkeypatch.setattr(opt_ties, "tie_answer", tie)
    got = solve(sc, time_limit=1000.0, prefer={c.name: (0, 0) for c in sc.clients})  # all on the cloud: no tie
    (now, left), *_ = given
    assert now >= 20.0 and left == pytest.approx(opt_ties.TIE_SHARE * now) and left < 1000.0 - now, given
    assert "least move cost among ties" in got.note and "time ran out" not in got.note, got.note


def test_a_search_for_the_least_move_cut_short_keeps_the_least_it_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """HiGHS stops the MILP of least move at its time with a tie in hand: that tie is taken (it moves least of
    those found), the note says it was not proven least, and the search of least client time among them is not
    begun with no time left."""
    sc = _distinct(12)
    clock = _Clock(monkeypatch)
    real_milp = opt_solver.run_milp
    ties: list[str] = []

    def cut_short(*a: object, **k: object) -> object:
        r = real_milp(*a, **k)  # type: ignore[arg-type]
        if k.get("objective") is not None:  # a tie search's MILP: its time runs out with its answer in hand
            ties.append("least time" if k.get("budget") is not None else "least move")
            clock.now += 10_000.0
            return opt_solver.MilpResult(r.counts, r.value, r.bound, False)
        return r

    monkeypatch.setattr(opt_solver, "run_milp", cut_short)
    current = {c.name: (0, 0) for c in sc.clients}
    got = solve(sc, time_limit=None, prefer=current)
    assert ties == ["least move"], ties
    assert "(the least found when its time ran out)" in got.note, got.note
    assert got.makespan_s == solve(sc).makespan_s and got.assignment != current


def test_a_re_solve_whose_preferred_cuts_are_a_tie_keeps_them_and_says_no_search_ran_out() -> None:
    """The adaptive round's usual re-solve: the cuts in force are an optimum, so they stay, and the answer says
    nothing ran out of time (a mutation run found the "finished" flag of that early answer unwatched: with it
    False, the note said the least-moving tie was not looked for, or was the least found in time, and the
    search for the least client time among the ties was skipped)."""
    sc = _distinct(6)
    plain = solve(sc)
    again = solve(sc, prefer=plain.assignment)
    assert again.assignment == plain.assignment and again.makespan_s == plain.makespan_s
    assert "ran out" not in again.note and "no time left" not in again.note, again.note
