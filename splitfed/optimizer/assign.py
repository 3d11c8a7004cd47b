"""Choosing every client's cuts: the exact optimizer, brute force, and the policies it is compared to.

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
more, that move cost a bound: ``_least_time_moving``; clients ``current`` does not
name move nothing wherever they go); the current cuts themselves when they are optimal. Without
``prefer``, among the assignments of the optimal makespan, one of least total client
round time sum_i R_i (one more MILP, objective sum_io R_io x_io, to ``TIE_GAP``): a
straggler or a full shared tier leaves many ties, and the first one found could keep
a fast device busy up to the makespan for nothing (``_least_time``).
"""

from __future__ import annotations

import atexit
import itertools
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, milp
from scipy.sparse import coo_array

from splitfed.cost.model import (
    Assignment,
    Cuts,
    OptionTable,
    RoundCost,
    Scenario,
    client_key,
    evaluate,
    held_memory,
    move_cost,
    move_costs,
    option_table,
    server_memory,
    tier_of_blocks,
    total,
    turn_memory,
)
from splitfed.errors import ConfigError, SplitfedError
from splitfed.optimizer.defaults import DEFAULT_GAP, EXHAUSTIVE_LIMIT
from splitfed.profile.fleet import Client
from splitfed.units import mib_pair, mib_text

_SCALE = 1e4  # the optimum's size in scaled units (see module docstring)
# a memory row the MILP's answer overflowed is tightened by this much more (in units of the tier's memory):
# past HiGHS's feasibility tolerance (1e-6), else it returns the same answer (an overflow of an ulp, where the
# cost model's sum lands a hair over a memory its parts fill exactly in exact arithmetic) again and again
_ROW_TOL = 2e-6
# the tie of least client time (``_least_time``) need not be proven least: within 0.1 % is plenty, and a proof to
# 1e-5 took 7 s after a 0.3 s solve (1,000 clients on full servers); it may take a quarter of the time the
# makespan's solve took, at least TIE_MIN_S, within the solve's own time limit
TIE_GAP = 1e-3
TIE_SHARE = 0.25
TIE_MIN_S = 1.0
_EDGE_REL = 1e-9  # brute force: memory this close to a tier's is checked as evaluate() prices it
_MOVE_TOL = 1e-6  # a tie of least time may move this much (of the largest single move) more than the least move
_STAGED_REL = 1e-9  # sflv1: the rounding a bound on a tier's staged base is allowed (_staged_tiers)
# the time limit (``solve``'s, ``best_static``'s): pricing the fleet's options checks it every CHECK_EVERY distinct
# devices (a few ms each: a fleet of fewer is always priced, so a spent limit still gets an answer that needs no
# MILP), and the Python loops over the classes check it every class. HiGHS runs in a daemon worker thread that
# the caller waits for in slices of WAIT_S (a Ctrl-C reaches the main thread, which the C code no longer holds);
# HiGHS's presolve overran its own time_limit (0.3 s) by 3.6 s on 2,000 distinct clients (presolve off kept to
# it, but would change every solve, and scipy passes no presolve limit): a MILP still running GRACE_S past the
# deadline is given up, an unknown like HiGHS's own "time limit, no answer"
CHECK_EVERY = 32
WAIT_S = 0.1
GRACE_S = 0.5
# a worker given up that way is waited for at the interpreter's exit, at most EXIT_WAIT_S: one whose HiGHS returned
# while the interpreter was finalizing aborted the process ("terminate called without an active exception", rc 134:
# benchmarks/optimizer.py's, after its results were written, when a tie search had run out of time)
EXIT_WAIT_S = 30.0
_left_running: set[threading.Thread] = set()


@atexit.register
def _join_left_running() -> None:
    """Waits for the MILP workers given up past their deadline; each ends at HiGHS's own time limit (what was left
    of the deadline when it was built), or a presolve's overrun of it later."""
    for worker in list(_left_running):
        worker.join(EXIT_WAIT_S)


@dataclass(frozen=True)
class Solution:
    """An assignment, priced by the cost model, and how it was found."""

    method: str
    cost: RoundCost
    solve_s: float
    optimal: bool
    note: str = ""
    gap: float = 0.0  # proven relative optimality gap (0 for exhaustive; unknown -> 0 for policies)
    kept: bool = False  # solve(below=): no assignment is that fast; these are the preferred cuts, not searched

    @property
    def makespan_s(self) -> float:
        return self.cost.makespan_s

    @property
    def assignment(self) -> dict[str, Cuts]:
        return self.cost.assignment()

    def to_dict(self) -> dict:
        return {"method": self.method, "optimal": self.optimal, "gap": self.gap, "solve_s": self.solve_s,
                "note": self.note,
                **self.cost.to_dict()}


@dataclass
class _Class:
    """Clients with identical option costs, and their (device-feasible, non-dominated) options."""

    members: list[int]
    options: np.ndarray
    T: np.ndarray               # own round seconds
    load: np.ndarray            # (m, R) seconds of each shared resource (work / capacity)
    mem: np.ndarray             # (m, S) bytes of this client on each server (sl, sflv2: its turn's peak)
    dom: np.ndarray             # (m, K) further columns for dominance: memory, move cost
    all_options: int = 0
    move: np.ndarray | None = None  # (m,) seconds to move here from the preferred cuts
    held: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (m, S) the holder its turn leaves
    act: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (m, S) sflv1: the activation part of mem
    cover: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), bool))  # (m, S, L) sflv1: staged blocks
    _dom: np.ndarray | None = None

    def shared_front(self, tau: float) -> np.ndarray:
        """Options with T <= tau not dominated in shared load and memory by another such option."""
        if self._dom is None:
            self._dom = _dominates(np.concatenate([self.load, self.dom], axis=1))
        p = int(np.searchsorted(self.T, tau, side="right"))
        return np.nonzero(~self._dom[:p, :p].any(axis=0))[0]

    def single(self, i: int) -> _Class:
        return _Class([i], self.options, self.T, self.load, self.mem, self.dom, self.all_options, self.move,
                      held=self.held, act=self.act, cover=self.cover)

    def finite(self) -> _Class:
        """Only the options priced finite (own time and every shared load): an option priced infinite ends no
        round, and an infinite coefficient (or inf * a scale of 0) is NaN in a MILP row."""
        keep = np.isfinite(self.T) & np.isfinite(self.load).all(axis=1)
        if keep.all():
            return self
        return _Class(self.members, self.options[keep], self.T[keep], self.load[keep], self.mem[keep],
                      self.dom[keep], self.all_options, None if self.move is None else self.move[keep],
                      held=self.held[keep], act=self.act[keep], cover=self.cover[keep])

    def memory_only(self) -> _Class:
        """Every option, priced at no time: a MILP over these asks only whether some assignment fits memory."""
        m = len(self.T)
        return _Class(self.members, self.options, np.zeros(m), np.zeros((m, 0)), self.mem, self.dom,
                      self.all_options, held=self.held, act=self.act, cover=self.cover)


def _infeasible(sc: Scenario, members: list[int], t_mem: np.ndarray, options: np.ndarray) -> ConfigError:
    """The first of ``members`` (devices no cut fits) named with its numbers, the others counted (named, if few)."""
    c = sc.clients[members[0]]
    best = int(np.argmin(t_mem))
    others = [sc.clients[i].name for i in members[1:]]
    more = "" if not others else (f" (and {', '.join(map(repr, others))})" if len(others) <= 3
                                  else f" (and {len(others)} more)")
    entry = f" (fleet entry {c.kind!r})" if c.kind and c.kind != c.name else ""  # simulate names clients by id
    has, need = mib_pair(c.device.memory, t_mem[best])
    return ConfigError(
        f"device {c.name!r}{entry}{more} cannot train any legal cut of {sc.profile.model} at batch {sc.batch}: "
        f"its memory is {has} and the smallest device share needs {need} (cuts {','.join(map(str, options[best]))})")


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


class OutOfTime(ConfigError):
    """A solve's time limit ran out before it had an answer. The message ends with what ``splitfed optimize``
    offers (its flags); ``what`` is what happened alone, for a caller that offers its own (the adaptive policy:
    its ``solve-time-limit-s``; before, a simulation was told to raise ``--time-limit``, a flag it has not)."""

    def __init__(self, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.what = what or message


class _OutOfTime(OutOfTime):
    """:func:`_out_of_time`'s: a search after the makespan's (the tie that moves least) gives up on it alone."""


def _out_of_time(sc: Scenario, done: str) -> ConfigError:
    """The refusal when the time limit runs out while the fleet's options are priced, before any MILP."""
    what = (f"the time limit ran out while pricing the cuts of the {len(sc.clients):,} clients of "
            f"{sc.profile.model} ({done}), before any MILP")
    return _OutOfTime(f"{what}: raise it (--time-limit), or price a policy that needs no MILP: --greedy", what)


def _varying(V: np.ndarray) -> np.ndarray:
    """``V``'s columns that differ between some rows: one equal in every row decides no dominance (most of a
    vgg11 class's 38 are: its blocks' staged cover, 0 for every option; comparing them made pruning 5x slower)."""
    return V[:, ~(V == V[:1]).all(axis=0)] if V.shape[0] > 1 else V


def _dominates(V: np.ndarray) -> np.ndarray:
    """D[a, b]: row a dominates row b (a <= b everywhere, and a < b somewhere or a comes first)."""
    V = _varying(V)
    idx = np.arange(V.shape[0])
    le = (V[:, None, :] <= V[None, :, :]).all(-1)
    lt = (V[:, None, :] < V[None, :, :]).any(-1)
    return le & (lt | (idx[:, None] < idx[None, :]))


def _pareto(V: np.ndarray) -> np.ndarray:
    """Rows not dominated by another row (a <= b everywhere; among equal rows the first stays).

    Few rows: all pairs at once. Many: a dominating row sorts lexicographically no later than the
    row it dominates (stable for equal rows), so one pass in that order, checking each row against
    the rows kept so far, suffices.
    """
    m = V.shape[0]
    if m <= 256:
        return ~cast(np.ndarray, _dominates(V).any(axis=0))  # 2-D in: an array (the stub allows a scalar)
    keep = np.zeros(m, bool)
    V = _varying(V)
    order = np.lexsort(V.T[::-1]) if V.shape[1] else np.arange(m)
    front = np.empty_like(V)
    n = 0
    for i in order:
        if n and (front[:n] <= V[i]).all(axis=1).any():
            continue
        front[n] = V[i]
        n += 1
        keep[i] = True
    return keep


def _server_columns(sc: Scenario, t: OptionTable) -> tuple[np.ndarray, np.ndarray]:
    """Per option, its bytes on each server (sl, sflv2: its turn's peak, :func:`turn_memory`) and the holder
    it leaves there (zeros in sflv1, which keeps none)."""
    if not sc.in_turn:
        return t.memory[:, 1:], np.zeros_like(t.memory[:, 1:])
    held = held_memory(sc, t.options)
    return turn_memory(t.memory[:, 1:], t.act_memory[:, 1:], held), held


def _fits_alone(sc: Scenario, turn: np.ndarray, held: np.ndarray) -> np.ndarray:
    """sl, sflv2: the options that fit every server beside their own holder (a necessary condition: the
    largest holder is at least theirs); one client: alone."""
    return cast(np.ndarray, (turn + (held if sc.holders else 0.0) <= sc.memory_caps).all(axis=1))


def _classes(sc: Scenario, prefer: Assignment | None = None, deadline: float | None = None,
             tables: dict[tuple, OptionTable] | None = None) -> list[_Class]:
    """Group clients (by their inputs; with ``prefer``, also by their preferred cuts) and price each
    group's legal options; raises for a device no cut fits (first), then, in sl and sflv2, for a
    server no option fits. Refused (:func:`_out_of_time`) when ``deadline`` (``time.perf_counter``) passes
    while the options are priced (checked every ``CHECK_EVERY`` distinct devices, and groups pruned).
    ``tables``: each distinct device's option table (``client_key``), those priced already and those priced here
    (a re-solve prices them once for its makespan and for its move costs)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(sc.clients):
        pc = None if prefer is None or c.name not in prefer else sc.check_cuts(prefer[c.name])
        groups.setdefault((client_key(c), pc), []).append(i)
    tables = {} if tables is None else tables
    kinds = len({k for k, _ in groups})
    for members in groups.values():
        c = sc.clients[members[0]]
        if client_key(c) not in tables:
            if len(tables) % CHECK_EVERY == CHECK_EVERY - 1 and _expired(deadline):
                raise _out_of_time(sc, f"{len(tables):,} of their {kinds:,} distinct devices priced")
            tables[client_key(c)] = option_table(sc, c)
    # every device no cut fits, whatever its kind (the same device with other sample counts is priced apart)
    unfit = [i for i, c in enumerate(sc.clients) if not tables[client_key(c)].fits_device.any()]
    if unfit:
        t = tables[client_key(sc.clients[unfit[0]])]
        raise _infeasible(sc, unfit, t.memory[:, 0], t.options)
    fits = {}
    for k, t in tables.items():
        ok = t.fits_device
        if sc.in_turn:  # one client at a time on the servers: its option must fit them beside its holder
            ok = ok & _fits_alone(sc, *_server_columns(sc, t))
            if not ok.any():
                raise _shared_infeasible(sc)
        fits[k] = ok
    finite = np.isfinite(sc.memory_caps)
    staged = _staged_tiers(sc, [(len(m), tables[k], fits[k]) for (k, _), m in groups.items()])
    out: list[_Class] = []
    for (key, pc), members in groups.items():
        if len(out) % CHECK_EVERY == CHECK_EVERY - 1 and _expired(deadline):  # (each a Pareto front: a few ms)
            raise _out_of_time(sc, f"the options of {len(out):,} of their {len(groups):,} groups pruned")
        t, ok = tables[key], fits[key]
        opts = t.options[ok]
        T, load = t.round_s[ok], t.shared_load[ok] / sc.capacities
        mem, held = (a[ok] for a in _server_columns(sc, t))
        act = t.act_memory[ok, 1:]
        cover = _cover(sc, opts, staged)
        dom = np.concatenate([mem[:, finite], held[:, finite]], axis=1) if sc.in_turn else \
            np.concatenate([mem, (mem - act)[:, staged], cover.reshape(len(opts), -1)], axis=1)
        move = None
        if pc is not None:
            move = move_costs(sc, sc.clients[members[0]], pc, opts)
            dom = np.concatenate([dom, move[:, None]], axis=1)
        keep = np.nonzero(_pareto(np.concatenate([T[:, None], load, dom], axis=1)))[0]
        keep = keep[np.argsort(T[keep], kind="stable")]  # by time: "T <= tau" is a prefix
        out.append(_Class(members, opts[keep], T[keep], load[keep], mem[keep], dom[keep], len(ok),
                          None if move is None else move[keep], held=held[keep], act=act[keep], cover=cover[keep]))
    return out


def _staged_tiers(sc: Scenario, groups: list[tuple[int, OptionTable, np.ndarray]]) -> np.ndarray:
    """(S,) sflv1: the server tiers whose staged base may take them over their memory (every client's
    largest fixed part and the whole model's state beside it would): only there must the optimizer tell
    which blocks two clients share (see :func:`~splitfed.cost.model.staged_memory`)."""
    n_s = sc.tiers - 1
    if sc.in_turn or sum(n for n, _, _ in groups) < 2:
        return np.zeros(n_s, bool)
    fixed = sum(n * (t.memory[ok, 1:] - t.act_memory[ok, 1:]).max(axis=0) for n, t, ok in groups)
    # a bound that lands on a tier's memory may be a hair under it where the cost model's sum (fsum, another
    # order) is a hair over: such a tier is counted too (its base rows cost nothing where they cannot bind)
    return cast(np.ndarray, fixed + math.fsum(sc.profile.state_bytes) > sc.memory_caps * (1 - _STAGED_REL))


def _cover(sc: Scenario, options: np.ndarray, staged: np.ndarray) -> np.ndarray:
    """(m, S, L): whether each option puts block b, one with state, on server tier s, for the ``staged``
    tiers (False elsewhere): a block two clients' options cover is in that tier's staged base (sflv1).
    As dominance columns (0/1), an option dominates another only with a subset of its staged blocks:
    swapping to it then never grows a base."""
    on = tier_of_blocks(sc, options)
    has = np.asarray(sc.profile.state_bytes) > 0
    cover = np.zeros((len(options), sc.tiers - 1, sc.profile.n_blocks), bool)
    for s in np.nonzero(staged)[0]:
        cover[:, s] = (on == s + 1) & has
    return cover


@dataclass
class _Result:
    counts: list[np.ndarray]   # per class, over that class's options
    value: float               # objective in seconds (inf: infeasible)
    bound: float               # proven lower bound in seconds
    optimal: bool


def _call_milp(deadline: float | None, *args: object, **kwargs: object) -> object | None:
    """``milp(*args, **kwargs)`` in a daemon worker thread, waited for in slices of ``WAIT_S``: HiGHS's C code
    releases the GIL, so a Ctrl-C raises KeyboardInterrupt here within a slice (it held the main thread until
    HiGHS returned). None: still running ``GRACE_S`` past ``deadline``; the worker is left to end at HiGHS's own
    time limit (a daemon: a Ctrl-C's never holds the process open; one given up is waited for at exit,
    :func:`_join_left_running`). An exception in the worker is raised here."""
    box: dict[str, object] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["res"] = milp(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["err"] = e
        finally:
            done.set()
            _left_running.discard(worker)

    worker = threading.Thread(target=work, name="splitfed-milp", daemon=True)
    worker.start()
    while not done.wait(WAIT_S):
        if deadline is not None and time.perf_counter() > deadline + GRACE_S:
            _left_running.add(worker)
            if done.is_set():  # it ended between the wait and the add: nothing is left running
                _left_running.discard(worker)
            return None
    if "err" in box:
        raise cast(BaseException, box["err"])
    return box["res"]


def _milp(sc: Scenario, classes: list[_Class], allowed: list[np.ndarray], *, time_rows: bool, scale: float,
          gap: float, time_limit: float | None, mem_rhs: np.ndarray, m_max: float = math.inf,
          minimize: bool = True, objective: list[np.ndarray] | None = None,
          budget: tuple[list[np.ndarray], float] | None = None, deadline: float | None = None) -> _Result:
    """min M over counts of the ``allowed`` options: M >= every shared load (and, with ``time_rows``,
    >= each client's time: valid only when every class is a single client), M <= ``m_max`` seconds.
    ``minimize=False``: any feasible point (a yes/no question, far cheaper than a proof of optimality).
    ``objective`` (per class, per allowed option): minimise sum objective * count instead of M.
    ``budget`` (weights per class and allowed option, most): sum weights * count <= most.
    ``deadline`` (``time.perf_counter``): HiGHS gets at most what is left of it once the MILP is built (building
    one over thousands of classes takes a while), none if nothing is, and is given up ``GRACE_S`` past it
    (:func:`_call_milp`); each unknown, as at HiGHS's own time limit without an answer."""
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
        left = deadline - time.perf_counter()
        if left <= 0:
            return _Result([], math.inf, 0.0, False)
        time_limit = left if time_limit is None else min(time_limit, left)
    if time_limit is not None:
        opts["time_limit"] = time_limit  # what is left of the solve's budget (the caller stops at 0)
    got = _call_milp(deadline, obj, integrality=integrality, bounds=bounds, constraints=constraints, options=opts)
    if got is None:  # HiGHS overran its time limit: given up, as if it had stopped there without an answer
        return _Result([], math.inf, 0.0, False)
    res = cast(OptimizeResult, got)
    if res.status == 2:
        return _Result([], math.inf, math.inf, True)
    if res.x is None:
        if res.status == 1:  # time limit before any solution: unknown, treated as "no" (not proven)
            return _Result([], math.inf, 0.0, False)
        raise SplitfedError(f"the MILP solver stopped without a solution: {res.message}")
    counts = [np.rint(res.x[starts[k]:starts[k + 1]]).astype(np.int64) for k in range(len(classes))]
    for c, n in zip(classes, counts, strict=True):
        if n.sum() != len(c.members) or (n < 0).any():
            raise SplitfedError("the MILP solver returned counts that do not add up (numerical trouble)")
    value = float(res.x[iM]) / scale
    bound = getattr(res, "mip_dual_bound", None) if minimize and objective is None else None
    bound = float(bound) / scale if bound is not None and math.isfinite(bound) else 0.0
    return _Result(counts, value, bound, res.status == 0)


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


def _used_memory(sc: Scenario, classes: list[_Class], allowed: list[np.ndarray], counts: list[np.ndarray]
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


def _caps_text(sc: Scenario) -> str:
    return ", ".join(f"{n} {mib_text(m)}" for n, m in zip(sc.tier_names[1:], sc.memory_caps, strict=True))


def _shared_infeasible(sc: Scenario, why: str = "") -> ConfigError:
    """The refusal when no assignment fits the server tiers; ``why``: the tiers that tell so, where some do."""
    return ConfigError(f"no assignment fits: the server tiers ({_caps_text(sc)}) cannot hold the segments of "
                       + ("the 1 client" if len(sc.clients) == 1 else f"all {len(sc.clients)} clients")
                       + f" of {sc.profile.model} at batch {sc.batch}, whatever the cuts" + (f"; {why}" if why else ""))


def _least_shares(sc: Scenario, classes: list[_Class]) -> ConfigError | None:
    """sflv1: the refusal, before any MILP, when some server tiers cannot hold even every client's least share.

    A tier holds sum_i fixed_i + max(staged base, sum_i act_i) >= sum_i mem_i (a replica per client), so for a
    set of tiers, the sum over clients of the least bytes any legal option of theirs puts on that set bounds
    what the set holds from below (dominance keeps, for every set, an option of least bytes). Past the set's
    memory, no assignment fits. Each tier alone misses a fleet that can move its segments from one tier to
    another but not off both: 1,000 distinct clients need 3x edge + cloud, and HiGHS took 13-34 s to say so
    (thousands: minutes, or it ran out of time and asked for more). ``classes``: every option, those priced
    infinite too (memory is about all of them). Sound, not complete: None leaves it to the MILPs."""
    caps = sc.memory_caps
    finite = [s for s in range(len(caps)) if math.isfinite(caps[s])]  # a set with an unbounded tier holds all
    if sc.in_turn or not classes or not finite:  # in turn: one client's segment at a time (checked per option)
        return None
    counts = np.array([len(c.members) for c in classes], dtype=float)
    mem = np.concatenate([c.mem for c in classes])  # every class has an option (_classes refuses otherwise)
    starts = np.cumsum([0, *(len(c.mem) for c in classes)])[:-1]
    sizes = range(1, len(finite) + 1) if len(finite) <= 6 else (1, len(finite))  # 2^S sets: tiers are few
    for k in sizes:
        over = []
        for tiers in itertools.combinations(finite, k):
            t = list(tiers)
            need, cap = float(counts @ np.minimum.reduceat(mem[:, t].sum(axis=1), starts)), float(caps[t].sum())
            if need > cap * (1 + _STAGED_REL):  # the margin: the cost model's sums run in another order
                over.append((need - cap, need, cap, t))
        if over:  # the fewest tiers that tell it, and of those the one short by most
            _, need, cap, t = max(over, key=lambda o: o[0])
            has_not, has = mib_pair(need, cap)
            n = len(sc.clients)
            whose = "the 1 client's least share" if n == 1 else f"the {n} clients' least shares"
            names = [sc.tier_names[s + 1] for s in t]
            who = names[0] + " needs" if k == 1 else f"{', '.join(names[:-1])} and {names[-1]} together need"
            return _shared_infeasible(sc, f"{who} at least {has_not} for {whose}, {'has' if k == 1 else 'have'} "
                                          f"{has}")
    return None


def _endless(sc: Scenario, stuck: list[int]) -> ConfigError:
    """Some assignment fits memory, but every one that does takes infinitely long as priced (beliefs of a
    rate near 0); ``stuck``: the clients every cut of which is priced infinite."""
    names = ", ".join(repr(sc.clients[i].name) for i in stuck[:3]) + \
        (f" and {len(stuck) - 3} more" if len(stuck) > 3 else "")
    why = f"every cut of client(s) {names} is priced infinite" if stuck else \
        "the cuts priced finite overflow those tiers"
    return ConfigError(f"no assignment ends: every assignment of the {len(sc.clients)} clients of "
                       f"{sc.profile.model} at batch {sc.batch} that fits the server tiers ({_caps_text(sc)}) "
                       f"takes infinitely long as priced ({why})")


def _assign(sc: Scenario, classes: list[_Class], allowed: list[np.ndarray], counts: list[np.ndarray]
            ) -> dict[str, Cuts]:
    out: dict[str, Cuts] = {}
    for c, a, k in zip(classes, allowed, counts, strict=True):
        members = iter(c.members)
        for o, n in zip(a, k, strict=True):
            cuts = tuple(int(x) for x in c.options[o])
            for _ in range(int(n)):
                out[sc.clients[next(members)].name] = cuts
    return out


class _Solver:
    """Runs MILPs and prices their answers with the cost model (one place for tolerances)."""

    def __init__(self, sc: Scenario, classes: list[_Class], gap: float, deadline: float | None) -> None:
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
        return _expired(self.deadline)

    @property
    def stuck(self) -> list[int]:
        """The clients every cut of which is priced infinite (no round of theirs ends, as priced)."""
        return [i for c in self.classes if not len(c.T) for i in c.members]

    def no_answer(self) -> ConfigError:
        """The refusal when no MILP found an assignment: none fits, none ends (every one that fits takes
        infinitely long as priced), or (some MILP stopped at the time limit) none was found in time; "the
        servers cannot hold it" would be a wrong diagnosis of the last two."""
        if self.proven and all(len(c.T) == len(p.T) for c, p in zip(self.classes, self.priced, strict=True)):
            return _shared_infeasible(self.sc)  # no option was left out for its infinite price
        fits = self._fits_memory() if self.proven else None
        if fits is None:
            what = (f"the time limit ran out before the MILP found any assignment for the {len(self.sc.clients)} "
                    f"clients of {self.sc.profile.model}")
            return OutOfTime(f"{what}: raise it (--time-limit), or price a policy that needs no MILP: --greedy, "
                             "--best-static", what)
        return _endless(self.sc, self.stuck) if fits else _shared_infeasible(self.sc)

    def _fits_memory(self) -> bool | None:
        """Whether some assignment, of any options priced finite or not, fits memory (None: the time limit
        ran out before the MILP knew)."""
        probe = _Solver(self.sc, [c.memory_only() for c in self.priced], self.gap, self.deadline)
        _, ok = probe.run([np.arange(len(c.T)) for c in probe.classes], time_rows=False, minimize=False)
        self.calls += probe.calls
        self.proven &= probe.proven
        return True if ok is not None else (False if probe.proven else None)

    def run(self, allowed: list[np.ndarray], time_rows: bool, m_max: float = math.inf,
            minimize: bool = True, objective: list[np.ndarray] | None = None,
            budget: tuple[list[np.ndarray], float] | None = None) -> tuple[_Result, list[np.ndarray] | None]:
        """One MILP; returns its result and ``allowed`` (None when infeasible). Server memory is
        re-added exactly (fsum, as :func:`evaluate` does); a row the solver's tolerance let overflow
        is tightened past that tolerance (``_ROW_TOL``: an answer that fills the tier to within 2e-6 of
        its memory may then be passed over) and the MILP solved again."""
        rhs = np.ones(len(self.sc.memory_caps))
        for _ in range(4):
            if self.expired():  # the budget is spent: "unknown", like HiGHS at its limit
                self.proven = False
                return _Result([], math.inf, 0.0, False), None
            self.calls += 1
            r = _milp(self.sc, self.classes, allowed, time_rows=time_rows, scale=self.scale, gap=self.gap,
                      time_limit=None, mem_rhs=rhs, m_max=m_max, minimize=minimize, objective=objective,
                      budget=budget, deadline=self.deadline)
            self.proven &= r.optimal
            if not math.isfinite(r.value):
                return r, None
            used = _used_memory(self.sc, self.classes, allowed, r.counts)
            caps = self.sc.memory_caps
            over = [t for t, cap in enumerate(caps) if used[t] > cap]
            if not over:
                return r, allowed
            for t in over:  # the solver's tolerance let a row overflow: tighten it past that and re-solve
                if caps[t] > 0:  # (a tier of memory 0: its rows are in bytes, right-hand side 0, see _row_unit)
                    rhs[t] -= (used[t] / caps[t] - 1.0) + _ROW_TOL
        raise SplitfedError("the MILP solver's answers keep overflowing a server's memory (numerical trouble)")

    def price(self, allowed: list[np.ndarray], r: _Result) -> RoundCost:
        """The cost model's price of a MILP answer."""
        return evaluate(self.sc, _assign(self.sc, self.classes, allowed, r.counts))


def _direct(s: _Solver) -> tuple[RoundCost, float]:
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
        current = _preferred(sc, prefer)
    except SplitfedError:
        return None
    return evaluate(sc, current) if len(current) == len(sc.clients) else None


def _fronts(s: _Solver, tau: float) -> list[np.ndarray] | None:
    """Each class's front at ``tau``; None when the time limit runs out first (a class's first front prices
    its dominance, ~1 ms: seconds for thousands of distinct clients)."""
    out = []
    for c in s.classes:
        if s.expired():
            return None
        out.append(c.shared_front(tau))
    return out


def _within(s: _Solver, below: float) -> tuple[RoundCost | None, bool]:
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


def _bisect(s: _Solver, start: RoundCost | None = None) -> tuple[RoundCost, float]:
    """Bisection on the largest client time tau; exact, and it works on classes.

    Let S(tau) be the least shared-resource makespan using only options with T <= tau. Feasibility
    of "S(tau) <= tau" is monotone in tau, so bisection over the distinct option times finds the
    first tau_k where it holds (yes/no MILPs: no optimality proofs). Every assignment's makespan is
    max(tau, S(tau)) for its own tau, so M* = min(tau_k, S(tau_{k-1})): one optimising MILP, capped
    at tau_k. (If even tau_max fails, M* = S(tau_max).)

    ``start`` (a re-solve's current cuts, priced now) proves the first tau its makespan fits feasible without a
    MILP; when the tau below is not, that is tau_k: a re-solve whose cuts are still optimal asks 3 MILPs, not
    ~17 (an adaptive round on 1,000 distinct vgg11 devices: 5 s, was 17 s; 3 s with pruning
    that leaves out constant columns, :func:`_varying`), and none when they reach tau_0.
    """
    taus = s.taus

    def allowed(k: int) -> list[np.ndarray] | None:
        return _fronts(s, float(taus[k]))

    def ask(a: list[np.ndarray] | None, m_max: float = math.inf, minimize: bool = True
            ) -> tuple[_Result, list[np.ndarray] | None]:
        if a is None:  # out of time: unknown, as a MILP asked then would answer
            s.proven = False
            return _Result([], math.inf, 0.0, False), None
        return s.run(a, time_rows=False, m_max=m_max, minimize=minimize)

    memo: dict[int, tuple[_Result, list[np.ndarray] | None]] = {}

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


def _sequential(s: _Solver) -> tuple[RoundCost | None, float]:
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
    cost = s.price(allowed, _Result(counts, 0.0, 0.0, True))
    if not (cost.bottleneck.startswith("client ") or cost.bottleneck == sc.resource_names[-1]):
        return None, 0.0
    return cost, cost.makespan_s


def _holder_search(s: _Solver) -> list[int] | None:
    """sl, sflv2: each class's option (index) for the best holder size H, tried over every candidate (each
    server's H one of the held values, at least every class's least); the cost model prices the few
    within 1e-9 of the best sum. None: too many candidates for this search; refused (:meth:`_Solver.no_answer`)
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
    priced = [(evaluate(sc, _assign(sc, classes, [np.array([o]) for o in row],
                                    [np.array([len(c.members)]) for c in classes])).makespan_s, i)
              for i, row in enumerate(near)]
    return [int(o) for o in near[min(priced)[1]]]


def _polish(sc: Scenario, classes: list[_Class], cost: RoundCost, budget: int = 200,
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
                    if _expired(deadline):
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
                    if _expired(deadline):
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


def _total_time(cost: RoundCost) -> float:
    return total(c.round_s for c in cost.clients)


def _tie_answer(s: _Solver, cap: float, allowed: list[np.ndarray], weights: list[np.ndarray],
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


def _least_time(s: _Solver, best: RoundCost, tie_rel: float, deadline: float | None, *,
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
    MILP's classes carry those costs: ``_classes(prefer=...)``). Its own solver (gap ``TIE_GAP``,
    ``deadline``): a search cut short leaves the makespan's proof as it was."""
    t = _Solver(s.sc, s.classes, TIE_GAP, deadline)
    M = best.makespan_s
    limit = M if limit is None else limit
    thr = M * (1 + tie_rel)
    for cap in (thr, M):  # the MILP's tolerance may overshoot thr by a hair: then ask for M itself
        allowed = [np.arange(int(np.searchsorted(c.T, cap, side="right"))) for c in t.classes]
        budget = None
        if moves is not None:
            budget = ([np.zeros(len(a)) if c.move is None else c.move[a] for c, a in zip(t.classes, allowed,
                                                                                         strict=True)], moves[1])
        cand = _tie_answer(t, cap, allowed, [c.T[a] for c, a in zip(t.classes, allowed, strict=True)], budget)
        if cand is None:
            continue
        cand = _polish(t.sc, t.classes, cand, deadline=deadline)
        if moves is not None and _total_move(t.sc, cand.assignment(), moves[0]) > moves[1] + _MOVE_TOL * max(
                (float(c.move.max()) for c in t.classes if c.move is not None and len(c.move)), default=0.0):
            continue  # the MILP's tolerance let it move a hair more: not what was asked
        if cand.feasible and cand.makespan_s <= limit:  # not a hair of makespan given up for it
            return (cand, t.proven) if _total_time(cand) < _total_time(best) else (best, t.proven)
    return best, t.proven


def _total_move(sc: Scenario, assignment: Assignment, prefer: Assignment) -> float:
    return total(move_cost(sc, c, prefer[c.name], assignment[c.name]) for c in sc.clients
                     if c.name in prefer and tuple(prefer[c.name]) != tuple(assignment[c.name]))


def _preferred(sc: Scenario, prefer: Assignment) -> dict[str, Cuts]:
    return {c.name: sc.check_cuts(prefer[c.name]) for c in sc.clients if c.name in prefer}


class _Moves:
    """The cuts a re-solve prefers, and the classes priced with each option's move cost from them: built once,
    when a search first needs them, for both tie searches under ``prefer`` (the least move, then the least time
    among those), each of which built its own (0.05 s on the reference fleet, a quarter of an adaptive re-solve),
    from the option tables the makespan's search priced (``tables``; before, every device was priced twice) and
    within the solve's ``deadline`` (raising :class:`_OutOfTime`; before, a re-solve's limit did not hold here)."""

    def __init__(self, sc: Scenario, prefer: Assignment, deadline: float | None = None,
                 tables: dict[tuple, OptionTable] | None = None) -> None:
        self.sc, self.current = sc, _preferred(sc, prefer)
        self.deadline, self.tables = deadline, tables
        self._classes: list[_Class] | None = None

    @staticmethod
    def of(sc: Scenario, prefer: Assignment | _Moves) -> _Moves:
        return prefer if isinstance(prefer, _Moves) else _Moves(sc, prefer)

    @property
    def classes(self) -> list[_Class]:
        if self._classes is None:
            self._classes = _classes(self.sc, prefer=self.current, deadline=self.deadline, tables=self.tables)
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


def _closest(sc: Scenario, best: RoundCost, prefer: Assignment | _Moves, tie_rel: float, gap: float,
             deadline: float | None, start: RoundCost | None = None) -> tuple[RoundCost, bool]:
    """Among assignments within ``tie_rel`` of ``best``'s makespan, one of least total move cost from
    ``prefer`` (the preferred cuts themselves when they qualify); ``best`` if none is found. And whether
    the search finished: one whose time (``deadline``: ``solve`` gives it a tie search's share) ran out keeps
    the tie of least move HiGHS had found, else ``best``. ``start``: the preferred cuts as priced already
    (:func:`_start`), not priced again."""
    M = best.makespan_s
    thr = M * (1 + tie_rel)
    moves = _Moves.of(sc, prefer)
    current = moves.current
    if len(current) == len(sc.clients):
        cur = start if start is not None else evaluate(sc, current)
        if cur.feasible and cur.makespan_s <= thr:
            return cur, True
    try:
        s = _Solver(sc, moves.classes, gap, deadline)
    except _OutOfTime:  # the makespan's answer stands; which of its ties moves least is not looked for
        return best, False
    classes = s.classes  # the options priced finite: the MILPs' indices are into these
    found = None
    for cap in (thr, M):  # the MILP's tolerance may overshoot thr by a hair: then ask for M itself
        allowed = [c.shared_front(cap) for c in classes]
        move = [np.zeros(len(a)) if c.move is None else c.move[a] for c, a in zip(classes, allowed, strict=True)]
        cand = _tie_answer(s, cap, allowed, move)
        if cand is not None and cand.feasible and cand.makespan_s <= thr:
            found = cand
            break
    if found is None:
        return best, s.proven
    found = _stay(sc, found, current, thr)  # a move that ships nothing is not made if staying is as good
    if _total_move(sc, found.assignment(), current) > _total_move(sc, best.assignment(), current):
        return best, s.proven
    return found, s.proven


def _least_time_moving(sc: Scenario, chosen: RoundCost, prefer: Assignment | _Moves, thr: float,
                       deadline: float | None) -> tuple[RoundCost, bool]:
    """Among assignments within ``thr`` that move no more than ``chosen`` from ``prefer``, one of least total
    client time (``_least_time`` with the move as a bound; its answer's moves that ship nothing undone, as in
    ``_closest``). The least move alone left the rest to chance: a resumed run's clients the plan did not know
    (move 0 wherever they go) got the first tie found, on the reference fleet 866 s of client time where
    223 s was theirs. And whether the search finished."""
    moves = _Moves.of(sc, prefer)
    current = moves.current
    most = _total_move(sc, chosen.assignment(), current)
    if most == 0 and len(current) == len(sc.clients):
        return chosen, True  # every client stays: only moves that ship nothing could differ, and those are undone
    try:
        s = _Solver(sc, moves.classes, TIE_GAP, deadline)
    except _OutOfTime:
        return chosen, False
    got, looked = _least_time(s, chosen, 0.0, deadline, limit=thr, moves=(current, most))
    return (chosen, looked) if got is chosen else (_stay(sc, got, current, thr), looked)


def _tie_deadline(t0: float, deadline: float | None) -> float:
    """When a tie search begun now must stop: a quarter of the time the solve has taken since ``t0``, at least
    ``TIE_MIN_S``, within the solve's own ``deadline``."""
    now = time.perf_counter()
    until = now + max(TIE_MIN_S, TIE_SHARE * (now - t0))
    return until if deadline is None else min(until, deadline)


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
    ``WAIT_S`` while HiGHS runs (:func:`_call_milp`). Refused (ConfigError) too
    when no assignment fits memory, or every one that does takes infinitely long as priced.
    """
    t0 = time.perf_counter()
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
    classes = _classes(sc, deadline=deadline, tables=tables)
    refusal = _least_shares(sc, classes)
    if refusal is not None:
        raise refusal
    if method == "direct" and any(len(c.members) > 1 for c in classes):
        classes = [c.single(i) for c in classes for i in c.members]
    s = _Solver(sc, classes, gap, deadline)
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
                return Solution("milp", start, time.perf_counter() - t0, s.proven, note,
                                (start.makespan_s - below) / start.makespan_s, kept=True)
            if found is not None and found.feasible and found.makespan_s < start.makespan_s:
                seed = found
        cost, bound = _bisect(s, seed)
    cost = _polish(sc, classes, cost, deadline=deadline)
    proven = max(0.0, (cost.makespan_s - bound) / cost.makespan_s) if cost.makespan_s > 0 else 0.0
    groups = len({client_key(c) for c in sc.clients})
    how = ("no MILP (clients in turn: each takes its fastest option that fits)" if method == "sequential"
           else f"{s.calls} MILP(s)")  # sequential answers without one (_sequential), else hands over to bisect
    note = (f"{sc.mode} {method}: {groups} class(es), {sum(len(c.T) for c in classes)} non-dominated option(s), "
            f"{how}, proven gap {proven:.1e}")
    if prefer is not None:
        moves = _Moves(sc, prefer, deadline, tables)
        chosen, looked = _closest(sc, cost, moves, tie_rel, gap, _tie_deadline(t0, deadline), start)
        if chosen is not cost:
            note += f"; least move cost among ties: {_total_move(sc, chosen.assignment(), prefer):.3g} s"
            if not looked:
                note += " (the least found when its time ran out)"
        elif not looked:  # the makespan is still proven; only which of its ties moves least is not
            note += "; no time left to look for the tie that moves least"
        if looked:
            timed, done = _least_time_moving(sc, chosen, moves, cost.makespan_s * (1 + tie_rel),
                                             _tie_deadline(t0, deadline))
            if timed is not chosen:
                note += (f"; least client time among those: {_total_time(timed):.4g} s in all "
                         f"(was {_total_time(chosen):.4g} s)")
            if not done:
                note += "; the search for the least client time among those ran out of time"
            chosen = timed
        cost = chosen
    else:
        chosen, looked = _least_time(s, cost, tie_rel, _tie_deadline(t0, deadline))
        if chosen is not cost:
            note += (f"; least client time among ties: {_total_time(chosen):.4g} s in all "
                     f"(was {_total_time(cost):.4g} s)")
        if not looked:  # the makespan is still proven; only that no tie takes less client time is not
            note += "; the search for the tie of least client time ran out of time"
        cost = chosen
    return Solution("milp", cost, time.perf_counter() - t0, s.proven, note, proven)


# ---------------------------------------------------------------- reference and baseline policies


def _count_text(sizes: Sequence[int]) -> str:
    """The product of ``sizes`` (each >= 1) for a message: exact (``2,000,000``) while it is small, else
    ``~1.23e+400`` from its logarithm (``{n:.3g}`` of such an int raised OverflowError, and the exact
    product of 10^5 counts takes long to build)."""
    log = math.fsum(math.log10(m) for m in sizes)
    if log < 15:
        return f"{math.prod(sizes):,}"
    e = math.floor(log)
    m = 10 ** (log - e)
    if m >= 9.995:  # would print as 10
        m, e = m / 10, e + 1
    return f"~{m:.3g}e+{e}"


def _kinds(sc: Scenario) -> Iterator[tuple[Client, tuple, OptionTable | None]]:
    """Each client with its kind's key and, where the kind is first seen, its option table (identical
    clients are priced once); a device that no option fits is refused, named."""
    seen: set[tuple] = set()
    for i, c in enumerate(sc.clients):
        k = client_key(c)
        t = None
        if k not in seen:
            seen.add(k)
            t = option_table(sc, c)
            if not t.fits_device.any():
                raise _infeasible(sc, _unfit_from(sc, i), t.memory[:, 0], t.options)
        yield c, k, t


def _unfit_from(sc: Scenario, first: int) -> list[int]:
    """Client ``first`` (a device no cut fits) and every later one no cut fits, each kind priced once: the
    refusal names them all (the clients before ``first`` fit)."""
    unfit = {client_key(sc.clients[first]): True}
    for c in sc.clients[first + 1:]:
        if client_key(c) not in unfit:
            unfit[client_key(c)] = not option_table(sc, c).fits_device.any()
    return [j for j in range(first, len(sc.clients)) if unfit[client_key(sc.clients[j])]]


def _exhaustive_tables(sc: Scenario, limit: int) -> list[tuple[np.ndarray, ...]]:
    """Each client's device-feasible options (options, T, load, mem, held, act, tier of each block), refusing
    as soon as the product of their counts passes ``limit``: identical clients share one table (200 of a kind
    cost one), and the product only grows, so distinct clients are priced only until it is too large."""
    memo: dict[tuple, tuple[np.ndarray, ...]] = {}
    tables = []
    total = 1
    for _, k, t in _kinds(sc):
        if t is not None:
            ok = t.fits_device
            mem, held = _server_columns(sc, t)
            if sc.in_turn:  # one client at a time on the servers: its option must fit them beside its holder
                # (none: an empty table, a product of 0; the later kinds are still priced, so a device no cut
                # fits is named first, as in solve, and exhaustive then refuses as memory)
                ok = ok & _fits_alone(sc, mem, held)
            memo[k] = (t.options[ok], t.round_s[ok], t.shared_load[ok] / sc.capacities, mem[ok], held[ok],
                       t.act_memory[ok, 1:], tier_of_blocks(sc, t.options[ok]))
        tables.append(memo[k])
        total *= len(memo[k][1])
        if total > limit:
            known = [len(memo[kd][1]) for kd in map(client_key, sc.clients) if kd in memo]
            more = "more than " if len(known) < len(sc.clients) else ""
            raise ConfigError(f"exhaustive search over {len(sc.clients):,} clients would check {more}"
                              f"{_count_text(known)} assignments (limit {limit:,}); use the default exact MILP "
                              "instead")
    return tables


def _decode(sc: Scenario, tables: list[tuple[np.ndarray, ...]], sizes: list[int], flat: int) -> dict[str, Cuts]:
    """The assignment of a flat index (one mixed-radix digit per client) over ``tables``."""
    assignment: dict[str, Cuts] = {}
    for c, (opts, *_), m in zip(sc.clients, tables, sizes, strict=True):
        assignment[c.name] = tuple(int(x) for x in opts[flat % m])
        flat //= m
    return assignment


def _fits_as_priced(sc: Scenario, tables: list[tuple[np.ndarray, ...]], sizes: list[int], flat: np.ndarray,
                    val: np.ndarray, best: float) -> np.ndarray:
    """Whether each of these assignments, whose memory brute force's sums put within rounding of a tier's,
    fits as :func:`evaluate` prices it (its sum, in another order, may land on the other side). Cheapest
    first, and only while one may still be the best: those past the first that fits are left False."""
    fits = np.zeros(len(flat), bool)
    for j in np.argsort(val, kind="stable"):
        if val[j] > best * (1 + 1e-9):
            break
        if evaluate(sc, _decode(sc, tables, sizes, int(flat[j]))).feasible:
            fits[j] = True
            best = min(best, float(val[j]))
    return fits


def exhaustive(sc: Scenario, limit: int = EXHAUSTIVE_LIMIT) -> Solution:
    """Brute force over every combination of device-feasible cuts (small fleets only), for ``sc.mode``."""
    t0 = time.perf_counter()
    tables = _exhaustive_tables(sc, limit)
    sizes = [len(t[1]) for t in tables]
    total = math.prod(sizes)
    caps = sc.memory_caps
    best = math.inf
    cands: list[tuple[float, int]] = []  # (value, flat index)
    chunk = 250_000 if sc.in_turn else 100_000  # sflv1 counts the clients holding each block on each tier
    for start in range(0, total, chunk):
        idx = np.arange(start, min(total, start + chunk))
        rem = idx.copy()
        tmax = np.zeros(len(idx))
        load = np.zeros((len(idx), tables[0][2].shape[1]))
        mem = np.zeros((len(idx), len(caps)))
        most = np.zeros((len(idx), len(caps)))  # in turn: the largest holder
        act = np.zeros((len(idx), len(caps)))  # sflv1: the activations, and how many clients hold each block
        holding = np.zeros((len(idx), len(caps), sc.profile.n_blocks), np.int32)
        for (_, T, ld, mm, hh, aa, on), m in zip(tables, sizes, strict=True):
            d = rem % m
            rem //= m
            tmax = np.maximum(tmax, T[d])
            load += ld[d]
            if sc.in_turn:
                mem = np.maximum(mem, mm[d])
                most = np.maximum(most, hh[d])
            else:
                mem += mm[d]
                act += aa[d]
                for t in range(len(caps)):
                    holding[:, t] += on[d] == t + 1
        if sc.holders:
            mem += most
        if not sc.in_turn:  # the staged base beside the fixed parts (:func:`~splitfed.cost.model.server_memory`)
            mem += np.maximum((holding >= 2) @ np.asarray(sc.profile.state_bytes, dtype=float) - act, 0.0)
        val = np.maximum(tmax, load.max(axis=1) if load.shape[1] else 0.0)
        ok = cast(np.ndarray, (mem <= caps * (1 - _EDGE_REL)).all(axis=1))  # 2-D in: an array (the stub allows a scalar)
        edge = np.nonzero((mem <= caps * (1 + _EDGE_REL)).all(axis=1) & ~ok)[0]
        ok[edge] = _fits_as_priced(sc, tables, sizes, idx[edge], val[edge], min(best, val[ok].min(initial=math.inf)))
        if not ok.any():
            continue
        vmin = float(val[ok].min())
        if vmin <= best * (1 + 1e-9):
            best = min(best, vmin)
            sel = np.nonzero(ok & (val <= best * (1 + 1e-9)))[0]
            cands = [(v, i) for v, i in cands if v <= best * (1 + 1e-9)] + [(float(val[s]), int(idx[s])) for s in sel]
    if not cands:
        raise _shared_infeasible(sc)
    results = []
    seen: set[float] = set()
    for v, flat in sorted(cands):
        if v in seen:  # equal sums in float: re-price one combination per value
            continue
        seen.add(v)
        cost = evaluate(sc, _decode(sc, tables, sizes, flat))
        if cost.feasible:
            results.append(cost)
    if not results:
        raise _shared_infeasible(sc)
    cost = min(results, key=lambda c: c.makespan_s)
    return Solution("exhaustive", cost, time.perf_counter() - t0, True, f"{total:,} assignments checked")


def static(sc: Scenario, cuts: Sequence[int]) -> Solution:
    """The same cuts for every client; a device they do not fit is named."""
    t0 = time.perf_counter()
    cuts = sc.check_cuts(cuts)
    cost = evaluate(sc, {c.name: cuts for c in sc.clients})
    for c, cc in zip(sc.clients, cost.clients, strict=True):
        if not cc.fits_device:
            need, has = mib_pair(cc.memory[0], c.device.memory)
            raise ConfigError(f"cuts {','.join(map(str, cuts))} do not fit device {c.name!r}: they need {need} "
                              f"of its {has}")
    return Solution(f"static {','.join(map(str, cuts))}", cost, time.perf_counter() - t0, False)


def best_static(sc: Scenario, time_limit: float | None = None) -> Solution:
    """The best single cut vector for all clients (every legal one tried in the cost model).

    Every vector is ranked by a bound (slowest client, busiest shared tier); the few best are then priced
    exactly, each a pass over the whole fleet (~2.5 s for 100,000 clients). ``time_limit``: seconds from this
    call on after which no further one is priced (the first always is); the note says when that cut it short.
    Ranking prices every distinct device's options: refused (ConfigError) when the limit runs out before that
    is done (checked every ``CHECK_EVERY`` devices: a fleet of fewer is always ranked)."""
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    ok = np.ones(len(sc.options), bool)
    round_s = np.zeros(len(sc.options))
    load = np.zeros((len(sc.options), len(sc.capacities)))
    mem = np.zeros((len(sc.options), len(sc.memory_caps)))
    act = np.zeros_like(mem)
    held = held_memory(sc, sc.options) if sc.holders else np.zeros_like(mem)
    groups: dict[tuple, list[Client]] = {}
    for c in sc.clients:
        groups.setdefault(client_key(c), []).append(c)
    for done, members in enumerate(groups.values()):
        if done % CHECK_EVERY == CHECK_EVERY - 1 and _expired(deadline):
            what = (f"the time limit ran out while ranking the cut vectors for the {len(sc.clients):,} clients of "
                    f"{sc.profile.model} ({done:,} of their {len(groups):,} distinct devices priced), before any "
                    "was priced exactly")
            raise OutOfTime(f"{what}: raise it (--time-limit)", what)
        n = len(members)
        t = option_table(sc, members[0])
        ok &= t.fits_device
        round_s = np.maximum(round_s, t.round_s)
        load += n * t.shared_load
        if sc.mode == "sflv1":
            mem += n * t.memory[:, 1:]
            act += n * t.act_memory[:, 1:]
        else:  # one client at a time (sl, sflv2), beside a holder of the same cuts
            mem = np.maximum(mem, _server_columns(sc, t)[0])
    if sc.mode == "sflv1" and len(sc.clients) > 1:  # every client holds the same server blocks: all are staged
        mem += np.maximum(held_memory(sc, sc.options) - act, 0.0)  # (server_memory's base, beside the fixed parts)
    ok &= (mem + held <= sc.memory_caps * (1 + 1e-9)).all(axis=1)
    val = np.maximum(round_s, (load / sc.capacities).max(axis=1) if load.shape[1] else 0.0)
    if not ok.any():
        raise ConfigError(f"no single cut vector fits every device and server of the fleet for {sc.profile.model}")
    order = np.argsort(np.where(ok, val, np.inf), kind="stable")
    best: Solution | None = None
    priced, note = 0, ""
    for o in order[:8]:  # re-price the few best with the exact cost model
        if not ok[o]:
            break
        if best is not None and time_limit is not None and time.perf_counter() - t0 > time_limit:
            note = f"the time limit ran out after pricing {priced} of the {min(8, int(ok.sum()))} best-ranked vectors"
            break
        s = static(sc, sc.options[o])
        priced += 1
        if s.cost.feasible and (best is None or s.makespan_s < best.makespan_s):
            best = s
    if best is None:
        raise ConfigError(f"no single cut vector fits every device and server of the fleet for {sc.profile.model}")
    return Solution(f"best static {','.join(map(str, best.assignment[sc.clients[0].name]))}", best.cost,
                    time.perf_counter() - t0, False, note)


def greedy(sc: Scenario) -> Solution:
    """Each device picks the cuts that minimise its own round time, as if the servers were its alone: among
    the cuts that fit its device and, alone, every server (together its clients may overflow a server)."""
    t0 = time.perf_counter()
    assignment: dict[str, Cuts] = {}
    memo: dict[tuple, Cuts] = {}
    for c, k, t in _kinds(sc):
        if t is not None:
            fits = t.fits_device & _fits_alone(sc, *_server_columns(sc, t))
            if not fits.any():
                caps = ", ".join(f"{n} {mib_text(m)}" for n, m in zip(sc.tier_names[1:], sc.memory_caps, strict=True))
                raise ConfigError(f"greedy: no cuts of client {c.name!r} that its device holds fit the server "
                                  f"tiers ({caps}) even with the servers to itself")
            memo[k] = tuple(int(x) for x in t.options[int(np.argmin(np.where(fits, t.round_s, np.inf)))])
        assignment[c.name] = memo[k]
    cost = evaluate(sc, assignment)
    return Solution("greedy", cost, time.perf_counter() - t0, False,
                    "" if cost.feasible else "violates: " + "; ".join(cost.violations))


def all_on_server(sc: Scenario) -> Solution:
    """Everything on the last server (the device only sends its data; U-shape: and computes the loss)."""
    L = sc.profile.n_blocks
    cuts = (0,) * (sc.tiers - 1) + ((L,) if sc.u_shape else ())
    s = static(sc, cuts)
    return Solution("all-on-server", s.cost, s.solve_s, False)
