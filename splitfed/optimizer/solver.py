"""The MILPs over option classes: built, solved by HiGHS (``scipy.optimize.milp``), and their answers priced.

:class:`Solver` is the one place for the MILPs' tolerances: it scales times so the optimum is near ``_SCALE``,
re-adds each answer's server memory exactly as the cost model does (tightening a row the solver's tolerance let
overflow), and prices every answer with :func:`~splitfed.cost.model.evaluate`. HiGHS runs in a worker thread
(:func:`call_milp`) so that a Ctrl-C and a deadline stop the caller, not the C code.
"""

from __future__ import annotations

import atexit
import math
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import cast

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, milp
from scipy.sparse import coo_array

from splitfed.cost.model import Cuts, RoundCost, Scenario, evaluate, server_memory
from splitfed.errors import ConfigError, SplitfedError
from splitfed.optimizer import clock
from splitfed.optimizer.classes import OptionClass
from splitfed.optimizer.solution import OutOfTime, endless, shared_infeasible

_SCALE = 1e4  # the optimum's size in scaled units (see splitfed.optimizer.assign's docstring)
# a memory row the MILP's answer overflowed is tightened by this much more (in units of the tier's memory):
# past HiGHS's feasibility tolerance (1e-6), else it returns the same answer (an overflow of an ulp, where the
# cost model's sum lands a hair over a memory its parts fill exactly in exact arithmetic) again and again
_ROW_TOL = 2e-6
# HiGHS runs in a daemon worker thread that the caller waits for in slices of WAIT_S (a Ctrl-C reaches the main
# thread, which the C code no longer holds); HiGHS's presolve overran its own time_limit (0.3 s) by 3.6 s on 2,000
# distinct clients (presolve off kept to it, but would change every solve, and scipy passes no presolve limit): a
# MILP still running GRACE_S past the deadline is given up, an unknown like HiGHS's own "time limit, no answer"
WAIT_S = 0.1
GRACE_S = 0.5
# a worker given up that way is waited for at the interpreter's exit, at most EXIT_WAIT_S: one whose HiGHS returned
# while the interpreter was finalizing aborted the process ("terminate called without an active exception", rc 134:
# benchmarks/optimizer.py's, after its results were written, when a tie search had run out of time)
EXIT_WAIT_S = 30.0
left_running: set[threading.Thread] = set()


@atexit.register
def join_left_running() -> None:
    """Waits for the MILP workers given up past their deadline; each ends at HiGHS's own time limit (what was left
    of the deadline when it was built), or a presolve's overrun of it later."""
    for worker in list(left_running):
        worker.join(EXIT_WAIT_S)


@dataclass
class MilpResult:
    counts: list[np.ndarray]   # per class, over that class's options
    value: float               # objective in seconds (inf: infeasible)
    bound: float               # proven lower bound in seconds
    optimal: bool


def call_milp(deadline: float | None, *args: object, **kwargs: object) -> object | None:
    """``milp(*args, **kwargs)`` in a daemon worker thread, waited for in slices of ``WAIT_S``: HiGHS's C code
    releases the GIL, so a Ctrl-C raises KeyboardInterrupt here within a slice (it held the main thread until
    HiGHS returned). None: still running ``GRACE_S`` past ``deadline``; the worker is left to end at HiGHS's own
    time limit (a daemon: a Ctrl-C's never holds the process open; one given up is waited for at exit,
    :func:`join_left_running`). An exception in the worker is raised here."""
    box: dict[str, object] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["res"] = milp(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["err"] = e
        finally:
            done.set()
            left_running.discard(worker)

    worker = threading.Thread(target=work, name="splitfed-milp", daemon=True)
    worker.start()
    while not done.wait(WAIT_S):
        if deadline is not None and clock.now() > deadline + GRACE_S:
            left_running.add(worker)
            if done.is_set():  # it ended between the wait and the add: nothing is left running
                left_running.discard(worker)
            return None
    if "err" in box:
        raise cast(BaseException, box["err"])
    return box["res"]


def run_milp(sc: Scenario, classes: list[OptionClass], allowed: list[np.ndarray], *, time_rows: bool, scale: float,
             gap: float, time_limit: float | None, mem_rhs: np.ndarray, m_max: float = math.inf,
             minimize: bool = True, objective: list[np.ndarray] | None = None,
             budget: tuple[list[np.ndarray], float] | None = None, deadline: float | None = None) -> MilpResult:
    """min M over counts of the ``allowed`` options: M >= every shared load (and, with ``time_rows``,
    >= each client's time: valid only when every class is a single client), M <= ``m_max`` seconds.
    ``minimize=False``: any feasible point (a yes/no question, far cheaper than a proof of optimality).
    ``objective`` (per class, per allowed option): minimise sum objective * count instead of M.
    ``budget`` (weights per class and allowed option, most): sum weights * count <= most.
    ``deadline`` (``time.perf_counter``): HiGHS gets at most what is left of it once the MILP is built (building
    one over thousands of classes takes a while), none if nothing is, and is given up ``GRACE_S`` past it
    (:func:`call_milp`); each unknown, as at HiGHS's own time limit without an answer."""
    sizes = [len(a) for a in allowed]
    nc = sum(sizes)
    iM = nc
    starts = np.cumsum([0, *sizes])
    nvar = nc + 1
    caps = sc.memory_caps
    binding = [s for s, cap in enumerate(caps) if math.isfinite(cap)] if sc.holders else []
    iy, iH = nvar, nvar + nc  # sl, sflv2: y (option used at all), then H_s / memory_s (bytes if 0; the largest holder)
    if binding:
        nvar += nc + len(caps)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(ci: np.ndarray, v: np.ndarray, lb: float, ub: float) -> None:
        rows.append(np.full(len(ci), len(lo)))
        cols.append(ci)
        vals.append(v)
        lo.append(lb)
        hi.append(ub)

    ones = np.ones(1)
    for k, (c, a) in enumerate(zip(classes, allowed, strict=True)):
        ni = np.arange(starts[k], starts[k + 1])
        add(ni, np.ones(len(ni)), len(c.members), len(c.members))
        if time_rows:
            add(np.append(ni, iM), np.append(c.T[a] * scale, -ones), -np.inf, 0.0)
    every = np.arange(nc)
    if budget is not None:
        add(every, np.concatenate(budget[0]), -np.inf, budget[1])
    for r in range(classes[0].load.shape[1]):
        v = np.concatenate([c.load[a, r] for c, a in zip(classes, allowed, strict=True)]) * scale
        if v.any():
            add(np.append(every, iM), np.append(v, -ones), -np.inf, 0.0)
    iy_base: list[int] = []  # sflv1: y_sb, block b is in tier s's staged base (two or more clients hold it)
    if not sc.in_turn:  # sflv1: a replica per client, and while they load their fixed parts beside the base
        total = sum(len(c.members) for c in classes)
        w = np.asarray(sc.profile.state_bytes, dtype=float)
        for s, cap in enumerate(caps):
            unit, rhs = _row_unit(cap, mem_rhs[s])
            v = _in_units(np.concatenate([c.mem[a, s] for c, a in zip(classes, allowed, strict=True)]), unit, rhs)
            if v.any() and math.isfinite(cap):
                add(every, v, -np.inf, rhs)
            cover = np.concatenate([c.cover[a, s] for c, a in zip(classes, allowed, strict=True)])
            blocks = np.nonzero(cover.any(axis=0))[0] if len(cover) else np.zeros(0, np.int64)
            if not len(blocks) or not math.isfinite(cap):
                continue
            ys = np.arange(nvar, nvar + len(blocks))
            nvar += len(blocks)
            iy_base.extend(ys.tolist())
            fixed = np.concatenate([c.mem[a, s] - c.act[a, s] for c, a in zip(classes, allowed, strict=True)])
            add(np.concatenate([every, ys]), _in_units(np.concatenate([fixed, w[blocks]]), unit, rhs), -np.inf, rhs)
            for y, b in zip(ys, blocks, strict=True):  # n_b - 1 <= N y_b: y_b is 1 when two clients hold b
                on = np.nonzero(cover[:, b])[0]
                add(np.append(on, y), np.append(np.ones(len(on)), -total), -np.inf, 1.0)
    if binding:  # sl, sflv2: every option used fits beside the largest holder, which holds every one used
        size = np.concatenate([np.full(len(a), len(c.members)) for c, a in zip(classes, allowed, strict=True)])
        for j in range(nc):  # n_j <= |class| y_j
            add(np.array([j, iy + j]), np.array([1.0, -size[j]]), -np.inf, 0.0)
        for s in binding:
            unit, rhs = _row_unit(caps[s], mem_rhs[s])
            turn = _in_units(np.concatenate([c.mem[a, s] for c, a in zip(classes, allowed, strict=True)]), unit, rhs)
            held = _in_units(np.concatenate([c.held[a, s] for c, a in zip(classes, allowed, strict=True)]), unit, rhs)
            for j in range(nc):
                add(np.array([iy + j, iH + s]), np.array([held[j], -1.0]), -np.inf, 0.0)
                add(np.array([iy + j, iH + s]), np.array([turn[j], 1.0]), -np.inf, rhs)
    # never empty: every class has its row (sum of its counts = its size), and there is at least one class
    A = coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(lo), nvar)).tocsr()
    ub = np.full(nvar, np.inf)
    ub[iM] = m_max * scale
    integrality = np.ones(nvar)
    integrality[iM] = 0
    if binding:
        ub[iy:iH] = 1.0
        integrality[iH:] = 0
    ub[iy_base] = 1.0
    for k, c in enumerate(classes):
        ub[starts[k]:starts[k + 1]] = len(c.members)
    obj = np.zeros(nvar)
    if objective is not None:
        obj[:nc] = np.concatenate(objective) if nc else 0.0
    else:
        obj[iM] = 1.0 if minimize else 0.0
    opts: dict = {"mip_rel_gap": gap, "disp": False}
    bounds, constraints = Bounds(np.zeros(nvar), ub), LinearConstraint(A, lo, hi)
    if deadline is not None:
        left = deadline - clock.now()
        if left <= 0:
            return MilpResult([], math.inf, 0.0, False)
        time_limit = left if time_limit is None else min(time_limit, left)
    if time_limit is not None:
        opts["time_limit"] = time_limit  # what is left of the solve's budget (the caller stops at 0)
    got = call_milp(deadline, obj, integrality=integrality, bounds=bounds, constraints=constraints, options=opts)
    if got is None:  # HiGHS overran its time limit: given up, as if it had stopped there without an answer
        return MilpResult([], math.inf, 0.0, False)
    res = cast(OptimizeResult, got)
    if res.status == 2:
        return MilpResult([], math.inf, math.inf, True)
    if res.x is None:
        if res.status == 1:  # time limit before any solution: unknown, treated as "no" (not proven)
            return MilpResult([], math.inf, 0.0, False)
        raise SplitfedError(f"the MILP solver stopped without a solution: {res.message}")
    counts = [np.rint(res.x[starts[k]:starts[k + 1]]).astype(np.int64) for k in range(len(classes))]
    for c, n in zip(classes, counts, strict=True):
        if n.sum() != len(c.members) or (n < 0).any():
            raise SplitfedError("the MILP solver returned counts that do not add up (numerical trouble)")
    value = float(res.x[iM]) / scale
    bound = getattr(res, "mip_dual_bound", None) if minimize and objective is None else None
    bound = float(bound) / scale if bound is not None and math.isfinite(bound) else 0.0
    return MilpResult(counts, value, bound, res.status == 0)


def _row_unit(cap: float, rhs: float) -> tuple[float, float]:
    """A server's memory rows in units of its memory (right-hand side ``rhs``, 1 less any tightening), or,
    for a tier of memory 0, in bytes with right-hand side 0 (bytes / 0 is NaN, even for an option that
    puts nothing there)."""
    return (float(cap), float(rhs)) if cap > 0 else (1.0, 0.0)


def _in_units(nbytes: np.ndarray, unit: float, rhs: float) -> np.ndarray:
    """A memory row's coefficients (bytes >= 0, over integer counts or 0/1 flags >= 0) in ``unit`` bytes, capped
    just past the right-hand side: one that passes it alone only says "not this option", and says it as well
    at ``rhs + 1``. A server of far less memory than an option needs (1e-89 bytes) put ratios of 1e95 (or an
    overflow to inf) into HiGHS's matrix otherwise, and it called a model with a feasible answer infeasible."""
    with np.errstate(over="ignore"):
        return np.minimum(nbytes / unit, max(rhs, 0.0) + 1.0)


def used_memory(sc: Scenario, classes: list[OptionClass], allowed: list[np.ndarray], counts: list[np.ndarray]
                ) -> np.ndarray:
    """Bytes on each server tier for these counts, exactly as :func:`~splitfed.cost.model.server_memory`."""
    used = [(c, a[n > 0], n[n > 0]) for c, a, n in zip(classes, allowed, counts, strict=True)]
    if sc.in_turn:
        held = np.concatenate([c.held[a] for c, a, _ in used])
        return np.max(np.concatenate([c.mem[a] for c, a, _ in used]), axis=0) + (held.max(axis=0) if sc.holders
                                                                                 else 0.0)
    def rows(part: str) -> np.ndarray:
        return np.concatenate([np.repeat(getattr(c, part)[a], n, axis=0) for c, a, n in used])

    return server_memory(sc, rows("options"), rows("mem"), rows("act"))


def counts_to_cuts(sc: Scenario, classes: list[OptionClass], allowed: list[np.ndarray], counts: list[np.ndarray]
                   ) -> dict[str, Cuts]:
    out: dict[str, Cuts] = {}
    for c, a, k in zip(classes, allowed, counts, strict=True):
        members = iter(c.members)
        for o, n in zip(a, k, strict=True):
            cuts = tuple(int(x) for x in c.options[o])
            for _ in range(int(n)):
                out[sc.clients[next(members)].name] = cuts
    return out


class Solver:
    """Runs MILPs and prices their answers with the cost model (one place for tolerances)."""

    def __init__(self, sc: Scenario, classes: list[OptionClass], gap: float, deadline: float | None) -> None:
        self.sc, self.gap, self.deadline = sc, gap, deadline
        self.priced = classes  # every option, those priced infinite too: what a refusal is diagnosed on
        self.classes = [c.finite() for c in classes]
        live = [c for c in self.classes if len(c.T)]
        base = max((float(c.T.min()) for c in live), default=0.0)  # a lower bound on the makespan
        if live and live[0].load.shape[1]:
            base = max(base, float(sum(len(c.members) * c.load.min(axis=0) for c in live).max()))
        if base <= 0:
            base = max((float(c.T.max()) for c in live), default=0.0) or 1.0
        self.scale = _SCALE / base
        self.calls = 0
        self.proven = True  # every MILP so far finished (no time limit hit)

    @cached_property
    def taus(self) -> np.ndarray:
        """The candidate largest client times: the distinct option times from the slowest class's best (a lower
        bound on the makespan) up; one sort a solver, whichever search asks first."""
        taus = np.unique(np.concatenate([c.T for c in self.classes]))
        return taus[taus >= max(float(c.T.min()) for c in self.classes)]

    def expired(self) -> bool:
        """Whether the time limit has run out."""
        return clock.expired(self.deadline)

    @property
    def stuck(self) -> list[int]:
        """The clients every cut of which is priced infinite (no round of theirs ends, as priced)."""
        return [i for c in self.classes if not len(c.T) for i in c.members]

    def no_answer(self) -> ConfigError:
        """The refusal when no MILP found an assignment: none fits, none ends (every one that fits takes
        infinitely long as priced), or (some MILP stopped at the time limit) none was found in time; "the
        servers cannot hold it" would be a wrong diagnosis of the last two."""
        if self.proven and all(len(c.T) == len(p.T) for c, p in zip(self.classes, self.priced, strict=True)):
            return shared_infeasible(self.sc)  # no option was left out for its infinite price
        fits = self._fits_memory() if self.proven else None
        if fits is None:
            what = (f"the time limit ran out before the MILP found any assignment for the {len(self.sc.clients)} "
                    f"clients of {self.sc.profile.model}")
            return OutOfTime(f"{what}: raise it (--time-limit), or price a policy that needs no MILP: --greedy, "
                             "--best-static", what)
        return endless(self.sc, self.stuck) if fits else shared_infeasible(self.sc)

    def _fits_memory(self) -> bool | None:
        """Whether some assignment, of any options priced finite or not, fits memory (None: the time limit
        ran out before the MILP knew)."""
        probe = Solver(self.sc, [c.memory_only() for c in self.priced], self.gap, self.deadline)
        _, ok = probe.run([np.arange(len(c.T)) for c in probe.classes], time_rows=False, minimize=False)
        self.calls += probe.calls
        self.proven &= probe.proven
        return True if ok is not None else (False if probe.proven else None)

    def run(self, allowed: list[np.ndarray], time_rows: bool, m_max: float = math.inf,
            minimize: bool = True, objective: list[np.ndarray] | None = None,
            budget: tuple[list[np.ndarray], float] | None = None) -> tuple[MilpResult, list[np.ndarray] | None]:
        """One MILP; returns its result and ``allowed`` (None when infeasible). Server memory is
        re-added exactly (fsum, as :func:`evaluate` does); a row the solver's tolerance let overflow
        is tightened past that tolerance (``_ROW_TOL``: an answer that fills the tier to within 2e-6 of
        its memory may then be passed over) and the MILP solved again."""
        rhs = np.ones(len(self.sc.memory_caps))
        for _ in range(4):
            if self.expired():  # the budget is spent: "unknown", like HiGHS at its limit
                self.proven = False
                return MilpResult([], math.inf, 0.0, False), None
            self.calls += 1
            r = run_milp(self.sc, self.classes, allowed, time_rows=time_rows, scale=self.scale, gap=self.gap,
                         time_limit=None, mem_rhs=rhs, m_max=m_max, minimize=minimize, objective=objective,
                         budget=budget, deadline=self.deadline)
            self.proven &= r.optimal
            if not math.isfinite(r.value):
                return r, None
            used = used_memory(self.sc, self.classes, allowed, r.counts)
            caps = self.sc.memory_caps
            over = [t for t, cap in enumerate(caps) if used[t] > cap]
            if not over:
                return r, allowed
            for t in over:  # the solver's tolerance let a row overflow: tighten it past that and re-solve
                if caps[t] > 0:  # (a tier of memory 0: its rows are in bytes, right-hand side 0, see _row_unit)
                    rhs[t] -= (used[t] / caps[t] - 1.0) + _ROW_TOL
        raise SplitfedError("the MILP solver's answers keep overflowing a server's memory (numerical trouble)")

    def price(self, allowed: list[np.ndarray], r: MilpResult) -> RoundCost:
        """The cost model's price of a MILP answer."""
        return evaluate(self.sc, counts_to_cuts(self.sc, self.classes, allowed, r.counts))


