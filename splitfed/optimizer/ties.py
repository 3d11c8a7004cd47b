"""Among assignments of (near) equal makespan, the one to take: ties are many, and the first found is arbitrary.

One straggler or one full shared tier sets the makespan and leaves every other client free to take any cuts
that keep under it; so after the makespan's search, ``solve`` breaks ties by what else matters. Without
current cuts, the least total client round time (a fast device is not kept busy up to the makespan for
nothing: :func:`least_time`); with them (a re-solve between rounds), the least total move cost from them
(:func:`closest`), and among those the least client time (:func:`least_time_moving`). :func:`polish` first
breaks ties of the last float bit, below any MILP tolerance. Each search has its own share of the solve's
time (:func:`tie_deadline`); one cut short leaves the makespan's proof as it was.
"""

from __future__ import annotations

import numpy as np

from splitfed.cost.model import (
    Assignment,
    Cuts,
    OptionTable,
    RoundCost,
    Scenario,
    evaluate,
    move_cost,
    total,
)
from splitfed.optimizer import clock
from splitfed.optimizer.classes import OptionClass, price_classes
from splitfed.optimizer.solution import PricingOutOfTime
from splitfed.optimizer.solver import Solver

# the tie of least client time (``least_time``) need not be proven least: within 0.1 % is plenty, and a proof to
# 1e-5 took 7 s after a 0.3 s solve (1,000 clients on full servers); it may take a quarter of the time the
# makespan's solve took, at least TIE_MIN_S, within the solve's own time limit
TIE_GAP = 1e-3
TIE_SHARE = 0.25
TIE_MIN_S = 1.0
_MOVE_TOL = 1e-6  # a tie of least time may move this much (of the largest single move) more than the least move


def polish(sc: Scenario, classes: list[OptionClass], cost: RoundCost, budget: int = 200,
           deadline: float | None = None) -> RoundCost:
    """Break float ties: options whose costs are equal in exact arithmetic can differ in the last bit
    (0.003 + 0.006 + 0.01 vs 0.009 + 0.01), below any MILP tolerance. Move a client that sets the
    makespan (or loads the resource that does) to an option at most 1e-9 cheaper there, when that
    lowers the makespan as the cost model computes it (at most ``budget`` trials for a resource).
    No trial starts once ``deadline`` (``time.perf_counter``) has passed: each prices the whole fleet
    (~0.5 s for 1,000 distinct clients); what stops there is at most 1e-9 of the makespan.
    """
    by_client = {i: c for c in classes for i in c.members}
    col = {name: r for r, name in enumerate(sc.resource_names)}
    for _ in range(len(sc.clients)):
        M = cost.makespan_s
        better = None
        if cost.bottleneck.startswith("client "):
            for i, cc in enumerate(cost.clients):
                if cc.round_s < M:
                    continue
                c = by_client[i]
                for o in np.nonzero((c.T < cc.round_s) & (c.T >= cc.round_s * (1 - 1e-9)))[0]:
                    if clock.expired(deadline):
                        return cost if better is None else better
                    trial = evaluate(sc, {**cost.assignment(), cc.name: tuple(int(x) for x in c.options[o])})
                    if trial.feasible and trial.makespan_s < M and (better is None
                                                                     or trial.makespan_s < better.makespan_s):
                        better = trial
        elif cost.bottleneck in col:
            r = col[cost.bottleneck]
            seen: set[tuple[int, Cuts]] = set()
            for i, cc in enumerate(cost.clients):
                c = by_client[i]
                if (id(c), cc.cuts) in seen or budget <= 0:
                    continue
                seen.add((id(c), cc.cuts))
                cur = np.nonzero((c.options == np.asarray(cc.cuts)).all(axis=1))[0]
                if not len(cur):
                    continue
                v = c.load[cur[0], r]
                for o in np.nonzero((c.load[:, r] < v) & (c.load[:, r] >= v * (1 - 1e-9)) & (c.T <= M))[0]:
                    if clock.expired(deadline):
                        return cost if better is None else better
                    budget -= 1
                    trial = evaluate(sc, {**cost.assignment(), cc.name: tuple(int(x) for x in c.options[o])})
                    if trial.feasible and trial.makespan_s < M and (better is None
                                                                     or trial.makespan_s < better.makespan_s):
                        better = trial
        if better is None:
            return cost
        cost = better
    return cost


def total_time(cost: RoundCost) -> float:
    return total(c.round_s for c in cost.clients)


def tie_answer(s: Solver, cap: float, allowed: list[np.ndarray], weights: list[np.ndarray],
               budget: tuple[list[np.ndarray], float] | None = None) -> RoundCost | None:
    """One MILP of a tie search: the least sum of ``weights`` (per class, per allowed option) times counts over
    the ``allowed`` options with every shared load at most ``cap`` (and, with ``budget``, its weights times
    counts at most its bound), priced by the cost model; None when a class has no option left or none fits.
    Weights are scaled by their largest (0: left as they are) for the MILP's tolerances."""
    if any(len(a) == 0 for a in allowed):
        return None
    top = max(float(w.max()) for w in weights) or 1.0
    if budget is not None:
        most = max(float(w.max()) for w in budget[0]) or 1.0
        budget = ([w / most for w in budget[0]], budget[1] / most)
    r, ok = s.run(allowed, time_rows=False, m_max=cap, objective=[w / top for w in weights], budget=budget)
    return None if ok is None else s.price(allowed, r)


def least_time(s: Solver, best: RoundCost, tie_rel: float, deadline: float | None, *,
               limit: float | None = None, moves: tuple[Assignment, float] | None = None
               ) -> tuple[RoundCost, bool]:
    """Among assignments of ``best``'s makespan, one of least total client round time (one more MILP, over
    those within ``tie_rel`` of it, whose answer is polished and taken only at no more than ``best``'s
    makespan, or ``limit``); ``best`` if none is found. And whether the search finished. Ties are many where
    one straggler or one shared tier sets the makespan, and any of them was taken: on the reference fleet,
    flagship phones trained all of vgg11 for 30.8 s (the straggler's 31.3 s) where 2.3 s was theirs to have,
    battery and heat spent for nothing, and every client left within a few percent of becoming the straggler
    itself. The options allowed are each class's with T <= the cap, all of them (``shared_front`` would drop a
    fast one that another, slower one dominates in load: right for "is there any", wrong for "least time").
    ``moves`` (current cuts, most): only assignments whose total move cost from them is at most ``most`` (the
    MILP's classes carry those costs: ``price_classes(prefer=...)``). Its own solver (gap ``TIE_GAP``,
    ``deadline``): a search cut short leaves the makespan's proof as it was."""
    t = Solver(s.sc, s.classes, TIE_GAP, deadline)
    M = best.makespan_s
    limit = M if limit is None else limit
    thr = M * (1 + tie_rel)
    for cap in (thr, M):  # the MILP's tolerance may overshoot thr by a hair: then ask for M itself
        allowed = [np.arange(int(np.searchsorted(c.T, cap, side="right"))) for c in t.classes]
        budget = None
        if moves is not None:
            budget = ([np.zeros(len(a)) if c.move is None else c.move[a] for c, a in zip(t.classes, allowed,
                                                                                         strict=True)], moves[1])
        cand = tie_answer(t, cap, allowed, [c.T[a] for c, a in zip(t.classes, allowed, strict=True)], budget)
        if cand is None:
            continue
        cand = polish(t.sc, t.classes, cand, deadline=deadline)
        if moves is not None and total_move(t.sc, cand.assignment(), moves[0]) > moves[1] + _MOVE_TOL * max(
                (float(c.move.max()) for c in t.classes if c.move is not None and len(c.move)), default=0.0):
            continue  # the MILP's tolerance let it move a hair more: not what was asked
        if cand.feasible and cand.makespan_s <= limit:  # not a hair of makespan given up for it
            return (cand, t.proven) if total_time(cand) < total_time(best) else (best, t.proven)
    return best, t.proven


def total_move(sc: Scenario, assignment: Assignment, prefer: Assignment) -> float:
    return total(move_cost(sc, c, prefer[c.name], assignment[c.name]) for c in sc.clients
                     if c.name in prefer and tuple(prefer[c.name]) != tuple(assignment[c.name]))


def preferred(sc: Scenario, prefer: Assignment) -> dict[str, Cuts]:
    return {c.name: sc.check_cuts(prefer[c.name]) for c in sc.clients if c.name in prefer}


class Moves:
    """The cuts a re-solve prefers, and the classes priced with each option's move cost from them: built once,
    when a search first needs them, for both tie searches under ``prefer`` (the least move, then the least time
    among those), each of which built its own (0.05 s on the reference fleet, a quarter of an adaptive re-solve),
    from the option tables the makespan's search priced (``tables``; before, every device was priced twice) and
    within the solve's ``deadline`` (raising :class:`PricingOutOfTime`; before, a re-solve's limit did not hold here)."""

    def __init__(self, sc: Scenario, prefer: Assignment, deadline: float | None = None,
                 tables: dict[tuple, OptionTable] | None = None) -> None:
        self.sc, self.current = sc, preferred(sc, prefer)
        self.deadline, self.tables = deadline, tables
        self._classes: list[OptionClass] | None = None

    @staticmethod
    def of(sc: Scenario, prefer: Assignment | Moves) -> Moves:
        return prefer if isinstance(prefer, Moves) else Moves(sc, prefer)

    @property
    def classes(self) -> list[OptionClass]:
        if self._classes is None:
            self._classes = price_classes(self.sc, prefer=self.current, deadline=self.deadline, tables=self.tables)
        return self._classes


def _stay(sc: Scenario, cost: RoundCost, current: dict[str, Cuts], thr: float) -> RoundCost:
    """``cost`` with each move that ships nothing undone where staying keeps the makespan within ``thr``."""
    plan = cost.assignment()
    for name, cuts in list(plan.items()):
        if name in current and cuts != current[name] and move_cost(sc, sc.clients[sc.index(name)],
                                                                   current[name], cuts) == 0:
            trial = evaluate(sc, {**plan, name: current[name]})
            if trial.feasible and trial.makespan_s <= thr:
                plan[name] = current[name]
                cost = trial
    return cost


def closest(sc: Scenario, best: RoundCost, prefer: Assignment | Moves, tie_rel: float, gap: float,
            deadline: float | None, start: RoundCost | None = None) -> tuple[RoundCost, bool]:
    """Among assignments within ``tie_rel`` of ``best``'s makespan, one of least total move cost from
    ``prefer`` (the preferred cuts themselves when they qualify); ``best`` if none is found. And whether
    the search finished: one whose time (``deadline``: ``solve`` gives it a tie search's share) ran out keeps
    the tie of least move HiGHS had found, else ``best``. ``start``: the preferred cuts as priced already
    (:func:`~splitfed.optimizer.assign._start`), not priced again."""
    M = best.makespan_s
    thr = M * (1 + tie_rel)
    moves = Moves.of(sc, prefer)
    current = moves.current
    if len(current) == len(sc.clients):
        cur = start if start is not None else evaluate(sc, current)
        if cur.feasible and cur.makespan_s <= thr:
            return cur, True
    try:
        s = Solver(sc, moves.classes, gap, deadline)
    except PricingOutOfTime:  # the makespan's answer stands; which of its ties moves least is not looked for
        return best, False
    classes = s.classes  # the options priced finite: the MILPs' indices are into these
    found = None
    for cap in (thr, M):  # the MILP's tolerance may overshoot thr by a hair: then ask for M itself
        allowed = [c.shared_front(cap) for c in classes]
        move = [np.zeros(len(a)) if c.move is None else c.move[a] for c, a in zip(classes, allowed, strict=True)]
        cand = tie_answer(s, cap, allowed, move)
        if cand is not None and cand.feasible and cand.makespan_s <= thr:
            found = cand
            break
    if found is None:
        return best, s.proven
    found = _stay(sc, found, current, thr)  # a move that ships nothing is not made if staying is as good
    if total_move(sc, found.assignment(), current) > total_move(sc, best.assignment(), current):
        return best, s.proven
    return found, s.proven


def least_time_moving(sc: Scenario, chosen: RoundCost, prefer: Assignment | Moves, thr: float,
                      deadline: float | None) -> tuple[RoundCost, bool]:
    """Among assignments within ``thr`` that move no more than ``chosen`` from ``prefer``, one of least total
    client time (``least_time`` with the move as a bound; its answer's moves that ship nothing undone, as in
    ``closest``). The least move alone left the rest to chance: a resumed run's clients the plan did not know
    (move 0 wherever they go) got the first tie found, on the reference fleet 866 s of client time where
    223 s was theirs. And whether the search finished."""
    moves = Moves.of(sc, prefer)
    current = moves.current
    most = total_move(sc, chosen.assignment(), current)
    if most == 0 and len(current) == len(sc.clients):
        return chosen, True  # every client stays: only moves that ship nothing could differ, and those are undone
    try:
        s = Solver(sc, moves.classes, TIE_GAP, deadline)
    except PricingOutOfTime:
        return chosen, False
    got, looked = least_time(s, chosen, 0.0, deadline, limit=thr, moves=(current, most))
    return (chosen, looked) if got is chosen else (_stay(sc, got, current, thr), looked)


def tie_deadline(t0: float, deadline: float | None) -> float:
    """When a tie search begun now must stop: a quarter of the time the solve has taken since ``t0``, at least
    ``TIE_MIN_S``, within the solve's own ``deadline``."""
    now = clock.now()
    until = now + max(TIE_MIN_S, TIE_SHARE * (now - t0))
    return until if deadline is None else min(until, deadline)


