"""The exact optimizer: every client's cuts, for the least round makespan the cost model prices.

Exact within the cost model (:mod:`splitfed.cost.model`), for every variant
(``Scenario.mode``). The makespan is the max of each client's own round time and
the busy time of every shared resource (sl and sflv2, whose clients train in
turn, add "clients in turn", busy sum_i R_i), and memory limits are linear, so
the problem is a MILP over one option per client (x_io = 1: client i uses cut
vector o):

    minimise M  s.t.  sum_o x_io = 1                           every client i
                      M >= sum_o R_io x_io                     every client i
                      M >= sum_io load_ior x_io / capacity_r   every shared resource r
                      memory of every server tier s <= memory_s
                      x_io in {0, 1}, only options o that fit device i's memory

Server memory by variant: sflv1 sum_io mem_ios x_io (a replica per client) and, while the clients load,
sum_io fixed_ios x_io + sum_b w_b y_sb with y_sb in {0, 1} >= [two or more clients' options put block b on
tier s] (sum of those x_io - 1 <= N y_sb: the staged base, :func:`splitfed.cost.model.staged_memory`); sl
and sflv2 one client at a time beside the largest holder (the model as a client
before left it; :func:`splitfed.cost.model.server_memory`): turn_ios + H_s <=
memory_s for the option each client uses, H_s >= held_ios for every option used
(with counts, an indicator y_io per option: n_io <= |class| y_io).

solved by ``scipy.optimize.milp`` (HiGHS). Three exact reductions keep it small:

- *classes*: clients with identical inputs (device, link, samples) have identical
  option costs; a class gets an integer count n_co per option instead of one
  binary per client. Any per-client solution maps to counts and back with the
  same makespan, so the optimum is unchanged and the MILP's size depends on the
  number of classes, not of clients (10,000 clients of 7 kinds: 7 classes).
- *dominance*: an option no better than another in every column (time, each
  shared load; sflv1: each server memory, and where the staged base can bind,
  each fixed part and which blocks it puts on that tier: a dominating option
  stages a subset) is dropped: swapping it for the dominating one never raises
  the makespan or breaks a limit.
- *bisection on tau*, the largest client time (``_bisect``): with counts the
  per-client rows M >= R_io need a weak big-M, so instead ask, for a candidate
  tau (a distinct option time), "is there an assignment using only options with
  R <= tau whose shared loads are <= tau?" (a yes/no MILP, monotone in tau).
  The first tau_k that says yes and one optimising MILP below it give
  M* = min(tau_k, S(tau_{k-1})); see ``_bisect`` for the argument.

``sl`` and ``sflv2`` need none of it (``sequential``, the default there; the
MILPs remain available for cross-checks): the makespan sum_i R_i is separable,
and for a fixed holder size H every memory limit is per option (held <= H_s,
turn + H_s <= memory_s), so each client's fastest such option is optimal for
that H. An optimal H is the largest held of the options it chose (lowering H to
it loosens every limit), one of finitely many values per server: the fastest
options first (optimal when they fit beside their own largest holder), else
every candidate H, vectorised.

``direct`` (the MILP above as written, per client) is kept for cross-checks:
both are checked against brute force in the tests. HiGHS proves
the optimum to ``gap`` (relative; 0 = exact, the default 1e-5 avoids proofs that
take minutes when shared tiers set the makespan: balancing loads is NP-hard).
Every answer is re-priced by :func:`splitfed.cost.model.evaluate`, which is what
every policy reports. Options priced infinite (beliefs of a rate near 0) are left out of the
MILPs (they end no round; an infinite coefficient is NaN in a row); when every assignment that
fits memory takes infinitely long as priced, ``solve`` refuses so, naming any client none of whose
cuts ends, rather than blaming memory.

Ties: ``solve(..., prefer=current)`` returns, among the assignments whose makespan
is within a relative ``tie_rel`` of the optimum, one of least total
:func:`~splitfed.cost.model.move_cost` from ``current`` (one more MILP, with the
move cost as objective), and among those one of least total client round time (one
more, that move cost a bound: ``least_time_moving``; clients ``current`` does not
name move nothing wherever they go); the current cuts themselves when they are optimal. Without
``prefer``, among the assignments of the optimal makespan, one of least total client
round time sum_i R_i (one more MILP, objective sum_io R_io x_io, to ``TIE_GAP``): a
straggler or a full shared tier leaves many ties, and the first one found could keep
a fast device busy up to the makespan for nothing (``least_time``).

The parts live beside this module, one job each: :mod:`~splitfed.optimizer.classes` (the options, grouped
and pruned), :mod:`~splitfed.optimizer.solver` (the MILPs, HiGHS and the pricing of their answers),
:mod:`~splitfed.optimizer.ties` (which tie to take), :mod:`~splitfed.optimizer.brute_force` (brute force) and
:mod:`~splitfed.optimizer.baselines` (the policies the optimizer is compared to); the solve's time limit is
read on one clock (:mod:`~splitfed.optimizer.clock`).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from splitfed.cost.model import Assignment, OptionTable, RoundCost, Scenario, client_key, evaluate
from splitfed.errors import ConfigError, SplitfedError
from splitfed.optimizer import clock
from splitfed.optimizer.classes import least_shares, price_classes
from splitfed.optimizer.defaults import DEFAULT_GAP
from splitfed.optimizer.solution import Solution
from splitfed.optimizer.solver import MilpResult, Solver, counts_to_cuts
from splitfed.optimizer.ties import (
    Moves,
    closest,
    least_time,
    least_time_moving,
    polish,
    preferred,
    tie_deadline,
    total_move,
    total_time,
)


def _direct(s: Solver) -> tuple[RoundCost, float]:
    """Every class is one client: M >= sum_o T_o x_o is exact, one MILP."""
    allowed = [np.arange(len(c.T)) for c in s.classes]
    r, ok = s.run(allowed, time_rows=True)
    if ok is None:
        raise s.no_answer()
    return s.price(allowed, r), r.bound


def _known_index(taus: np.ndarray, start: RoundCost | None) -> int | None:
    """The first tau_k that ``start`` (an assignment, as the cost model prices it) proves feasible: its makespan
    is at most tau_k, so its options are all within tau_k and so is every shared resource's load. None when it
    proves nothing (no start, it overflows memory, or shared resources set it past every tau)."""
    if start is None or not start.feasible or not start.makespan_s <= taus[-1]:
        return None
    return int(np.searchsorted(taus, start.makespan_s, side="left"))


def _start(sc: Scenario, prefer: Assignment | None) -> RoundCost | None:
    """The preferred cuts as priced now, when they name every client's legal cuts: what a re-solve's bisection
    starts from (an illegal one is refused where the ties are looked for, as before)."""
    if prefer is None:
        return None
    try:
        current = preferred(sc, prefer)
    except SplitfedError:
        return None
    return evaluate(sc, current) if len(current) == len(sc.clients) else None


def _fronts(s: Solver, tau: float) -> list[np.ndarray] | None:
    """Each class's front at ``tau``; None when the time limit runs out first (a class's first front prices
    its dominance, ~1 ms: seconds for thousands of distinct clients)."""
    out = []
    for c in s.classes:
        if s.expired():
            return None
        out.append(c.shared_front(tau))
    return out


def _within(s: Solver, below: float) -> tuple[RoundCost | None, bool]:
    """An assignment of makespan at most ``below``, and whether the answer is known (False: the time limit ran
    out first). One yes/no MILP: such an assignment uses only options of time <= ``below``, so of time <= the
    largest tau_j <= ``below``, and its shared loads are <= ``below``; none when tau_0, a lower bound, is above
    it. (None, True): there is none."""
    taus = s.taus
    j = int(np.searchsorted(taus, below, side="right")) - 1
    if j < 0:
        return None, True
    a = _fronts(s, float(taus[j]))
    if a is None:
        s.proven = False
        return None, False
    r, ok = s.run(a, time_rows=False, m_max=below, minimize=False)
    if ok is None:
        return None, r.optimal
    return s.price(ok, r), True


def _bisect(s: Solver, start: RoundCost | None = None) -> tuple[RoundCost, float]:
    """Bisection on the largest client time tau; exact, and it works on classes.

    Let S(tau) be the least shared-resource makespan using only options with T <= tau. Feasibility
    of "S(tau) <= tau" is monotone in tau, so bisection over the distinct option times finds the
    first tau_k where it holds (yes/no MILPs: no optimality proofs). Every assignment's makespan is
    max(tau, S(tau)) for its own tau, so M* = min(tau_k, S(tau_{k-1})): one optimising MILP, capped
    at tau_k. (If even tau_max fails, M* = S(tau_max).)

    ``start`` (a re-solve's current cuts, priced now) proves the first tau its makespan fits feasible without a
    MILP; when the tau below is not, that is tau_k: a re-solve whose cuts are still optimal asks 3 MILPs, not
    ~17 (an adaptive round on 1,000 distinct vgg11 devices: 5 s, was 17 s; 3 s with pruning
    that leaves out constant columns, :func:`varying`), and none when they reach tau_0.
    """
    taus = s.taus

    def allowed(k: int) -> list[np.ndarray] | None:
        return _fronts(s, float(taus[k]))

    def ask(a: list[np.ndarray] | None, m_max: float = math.inf, minimize: bool = True
            ) -> tuple[MilpResult, list[np.ndarray] | None]:
        if a is None:  # out of time: unknown, as a MILP asked then would answer
            s.proven = False
            return MilpResult([], math.inf, 0.0, False), None
        return s.run(a, time_rows=False, m_max=m_max, minimize=minimize)

    memo: dict[int, tuple[MilpResult, list[np.ndarray] | None]] = {}

    def feasible(k: int) -> bool:
        if k not in memo:
            memo[k] = ask(allowed(k), m_max=float(taus[k]), minimize=False)
        return memo[k][1] is not None

    def priced(k: int) -> RoundCost:
        r, a = memo[k]
        assert a is not None
        return s.price(a, r)

    last = len(taus) - 1
    known = _known_index(taus, start)
    if known == 0:  # a re-solve whose current cuts reach the lower bound: no MILP
        return cast(RoundCost, start), float(taus[0])
    if feasible(0):  # the slowest class's best time: a lower bound, reached
        return priced(0), float(taus[0])
    if known is not None:  # a re-solve: the current cuts fit tau_known; is the tau below it feasible?
        lo, hi = (0, known - 1) if feasible(known - 1) else (known - 1, known)
    elif not feasible(last):  # shared resources dominate whatever the cuts
        r, ok = ask(allowed(last))
        if ok is None:
            raise s.no_answer()
        return s.price(ok, r), r.bound
    else:
        lo, hi = 0, last  # infeasible at lo, feasible at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    best = priced(hi) if hi in memo else cast(RoundCost, start)  # hi == known: no MILP was asked there
    r, ok = ask(allowed(lo), m_max=float(taus[hi]))
    if ok is not None:
        bound = min(float(taus[hi]), r.bound)
    elif r.optimal:  # proven: nothing capped at tau_hi fits, so M* = tau_hi
        bound = float(taus[hi])
    else:  # cut short by the time limit: only a "no" that was proven bounds M* (M* > tau_k there)
        no = [k for k, (rk, ak) in memo.items() if ak is None and rk.optimal]
        bound = float(taus[max(no)]) if no else float(taus[0])
    if ok is not None:
        cost = s.price(ok, r)
        if cost.makespan_s < best.makespan_s:
            best = cost
    return best, bound


HOLDER_CANDIDATES = 4_000_000  # (holder sizes x options) past which sl/sflv2 go to the MILP instead


def _sequential(s: Solver) -> tuple[RoundCost | None, float]:
    """sl, sflv2: the makespan is sum_i R_i; for a holder size H every limit is per option, so each client's
    fastest option that fits beside H is optimal for it (options are sorted by time), and an optimal H is
    the largest held of the options chosen (module docstring). The fastest options first: optimal when
    they fit beside their own largest holder. Else every candidate H. None (the MILP decides) if the
    candidates are too many, or a shared resource other than the round itself were to set the makespan
    (it cannot: sum_i R_i bounds them all)."""
    sc, classes = s.sc, s.classes
    caps = sc.memory_caps
    fastest = [0] * len(classes)
    H = np.max([c.held[0] for c in classes], axis=0) if sc.holders else 0.0
    if not all((c.mem[0] + H <= caps).all() for c in classes):
        chosen = _holder_search(s)
        if chosen is None:
            return None, 0.0
        fastest = chosen
    allowed = [np.array([o]) for o in fastest]
    counts = [np.array([len(c.members)]) for c in classes]
    cost = s.price(allowed, MilpResult(counts, 0.0, 0.0, True))
    if not (cost.bottleneck.startswith("client ") or cost.bottleneck == sc.resource_names[-1]):
        return None, 0.0
    return cost, cost.makespan_s


def _holder_search(s: Solver) -> list[int] | None:
    """sl, sflv2: each class's option (index) for the best holder size H, tried over every candidate (each
    server's H one of the held values, at least every class's least); the cost model prices the few
    within 1e-9 of the best sum. None: too many candidates for this search; refused (:meth:`Solver.no_answer`)
    when no option priced finite fits beside any holder."""
    sc, classes = s.sc, s.classes
    caps = sc.memory_caps
    held = [c.held for c in classes]
    least = np.max([h.min(axis=0) for h in held], axis=0)
    values = [np.unique(np.concatenate([h[:, t] for h in held]))
              for t in range(len(caps))]
    values = [v[(v >= least[t]) & (v <= caps[t])] for t, v in enumerate(values)]
    n_h = math.prod(len(v) for v in values)
    if n_h == 0:
        raise s.no_answer()
    if n_h * sum(len(c.T) for c in classes) > HOLDER_CANDIDATES:
        return None
    grid = np.stack([g.ravel() for g in np.meshgrid(*values, indexing="ij")], axis=1)  # (n_h, S)
    total = np.zeros(len(grid))
    pick = np.zeros((len(grid), len(classes)), np.int64)
    for k, c in enumerate(classes):
        ok = ((c.held[None] <= grid[:, None]) & (c.mem[None] + grid[:, None] <= caps)).all(axis=2)
        first = ok.argmax(axis=1)
        pick[:, k] = first
        total += np.where(ok.any(axis=1), len(c.members) * c.T[first], np.inf)
    best = float(total.min())
    if not math.isfinite(best):
        raise s.no_answer()
    near = np.unique(pick[total <= best * (1 + 1e-9)], axis=0)[:64]
    priced = [(evaluate(sc, counts_to_cuts(sc, classes, [np.array([o]) for o in row],
                                           [np.array([len(c.members)]) for c in classes])).makespan_s, i)
              for i, row in enumerate(near)]
    return [int(o) for o in near[min(priced)[1]]]


def solve(sc: Scenario, *, gap: float = DEFAULT_GAP, time_limit: float | None = 60.0,
          method: str = "auto", prefer: Assignment | None = None, tie_rel: float = 1e-9,
          below: float | None = None) -> Solution:
    """The assignment of least makespan within the cost model (MILP; classes + dominance; see module doc).

    ``gap``: relative optimality gap HiGHS must prove (0: exact; the default 1e-5 is 10 us per second
    of round, and spares a proof that can take minutes when shared tiers set the makespan). ``method``:
    ``bisect`` (``auto`` for sflv1: its yes/no MILPs are far cheaper than one big proof, even for
    distinct clients), ``sequential`` (``auto`` for sl and sflv2, whose clients train in turn: each
    client's fastest option) or ``direct``
    (the MILP as written, one binary per client and option; kept for cross-checks).
    ``prefer``: current cuts; among assignments within a relative ``tie_rel`` of the optimum, return
    one of least total move cost from them (them, when they are optimal), and of those one of least total
    client time (budgeted as below). Without it, among the assignments
    of the optimal makespan, one of least total client time (to ``TIE_GAP``; given at most a quarter of the
    time the makespan took, at least ``TIE_MIN_S``, and the note says when that ran out).
    ``below`` (seconds; needs ``prefer``): only an assignment of makespan at most this is worth the search. When
    the preferred cuts (every client's, fitting memory) are slower and one MILP proves no assignment that fast
    (none when the lower bound tau_0 is above it), they come back as they are, ``kept``: an adaptive round whose
    cuts no plan beats by the hysteresis (a deployment's beliefs move a little every round) is decided by one
    MILP, not ~16 (1,000 distinct vgg11 devices: ~2 s, was 31 s). Otherwise the solve is the plain one, its
    bisection started from that MILP's answer.
    ``time_limit``: seconds for the whole solve from this call on (None: no limit): pricing the options
    (checked every ``CHECK_EVERY`` distinct devices), every MILP together (each gets what is left once it is
    built; none starts once it is spent; one HiGHS runs past it is given up ``GRACE_S`` later), the Python loops
    over the classes, the polish and the tie-breaks. Past it: at most ``GRACE_S``, the pricing of the answer in
    hand and one check's step. When it runs out the best assignment found so far is returned, ``optimal``
    False; when none was found, a ConfigError says so. A Ctrl-C (KeyboardInterrupt) reaches the caller within
    ``WAIT_S`` while HiGHS runs (:func:`call_milp`). Refused (ConfigError) too
    when no assignment fits memory, or every one that does takes infinitely long as priced.
    """
    t0 = clock.now()
    if below is not None and (prefer is None or not below >= 0):  # (a NaN is refused too)
        raise ConfigError(f"below must be a number of seconds >= 0, given with prefer (the cuts kept when no "
                          f"assignment is that fast), got below={below!r}" + (", prefer=None" if prefer is None else ""))
    if method == "auto":  # direct's one big MILP is slower to prove than bisect's yes/no MILPs
        method = "sequential" if sc.in_turn else "bisect"
    if method not in ("direct", "bisect", "sequential"):
        raise ConfigError(f"method must be auto, direct, bisect or sequential, got {method!r}")
    if method == "sequential" and not sc.in_turn:
        raise ConfigError(f"method sequential is exact for modes sl and sflv2 only, not {sc.mode}")
    deadline = None if time_limit is None else t0 + time_limit
    tables: dict[tuple, OptionTable] = {}  # each distinct device's, priced once for all the searches below
    classes = price_classes(sc, deadline=deadline, tables=tables)
    refusal = least_shares(sc, classes)
    if refusal is not None:
        raise refusal
    if method == "direct" and any(len(c.members) > 1 for c in classes):
        classes = [c.single(i) for c in classes for i in c.members]
    s = Solver(sc, classes, gap, deadline)
    if s.stuck:
        raise s.no_answer()
    cost: RoundCost | None = None
    if method == "sequential":
        cost, bound = _sequential(s)
        if cost is None:
            method = "bisect"
    start = None  # the preferred cuts as priced now: the bisection's start, and the first tie looked at
    if cost is None and method == "direct":
        cost, bound = _direct(s)
    elif cost is None:
        start = _start(sc, prefer)
        seed = start  # what the bisection starts from: the preferred cuts, or a faster assignment found below
        if (below is not None and start is not None and start.feasible and below < start.makespan_s < math.inf
                and _known_index(s.taus, start) != 0):  # (cuts that reach tau_0 are optimal: _bisect, no MILP)
            found, known = _within(s, below)
            if known and found is None:
                note = (f"{sc.mode} bisect: no assignment's makespan is at most {below:.6g} s ({s.calls} MILP(s)); "
                        f"the preferred cuts' {start.makespan_s:.6g} s kept")
                return Solution("milp", start, clock.now() - t0, s.proven, note,
                                (start.makespan_s - below) / start.makespan_s, kept=True)
            if found is not None and found.feasible and found.makespan_s < start.makespan_s:
                seed = found
        cost, bound = _bisect(s, seed)
    cost = polish(sc, classes, cost, deadline=deadline)
    proven = max(0.0, (cost.makespan_s - bound) / cost.makespan_s) if cost.makespan_s > 0 else 0.0
    groups = len({client_key(c) for c in sc.clients})
    how = ("no MILP (clients in turn: each takes its fastest option that fits)" if method == "sequential"
           else f"{s.calls} MILP(s)")  # sequential answers without one (_sequential), else hands over to bisect
    note = (f"{sc.mode} {method}: {groups} class(es), {sum(len(c.T) for c in classes)} non-dominated option(s), "
            f"{how}, proven gap {proven:.1e}")
    if prefer is not None:
        moves = Moves(sc, prefer, deadline, tables)
        chosen, looked = closest(sc, cost, moves, tie_rel, gap, tie_deadline(t0, deadline), start)
        if chosen is not cost:
            note += f"; least move cost among ties: {total_move(sc, chosen.assignment(), prefer):.3g} s"
            if not looked:
                note += " (the least found when its time ran out)"
        elif not looked:  # the makespan is still proven; only which of its ties moves least is not
            note += "; no time left to look for the tie that moves least"
        if looked:
            timed, done = least_time_moving(sc, chosen, moves, cost.makespan_s * (1 + tie_rel),
                                            tie_deadline(t0, deadline))
            if timed is not chosen:
                note += (f"; least client time among those: {total_time(timed):.4g} s in all "
                         f"(was {total_time(chosen):.4g} s)")
            if not done:
                note += "; the search for the least client time among those ran out of time"
            chosen = timed
        cost = chosen
    else:
        chosen, looked = least_time(s, cost, tie_rel, tie_deadline(t0, deadline))
        if chosen is not cost:
            note += (f"; least client time among ties: {total_time(chosen):.4g} s in all "
                     f"(was {total_time(cost):.4g} s)")
        if not looked:  # the makespan is still proven; only that no tie takes less client time is not
            note += "; the search for the tie of least client time ran out of time"
        cost = chosen
    return Solution("milp", cost, clock.now() - t0, s.proven, note, proven)


