"""Every policy priced side by side in the one cost model: the optimizer, the best static cut, greedy, all on
the server. What ``splitfed optimize --compare`` prints and ``benchmarks/optimizer.py`` judges its targets on.

A policy that refuses the fleet (no single cut fits every device, raw data must stay) is kept with its reason
and no time; one that breaks a memory limit (greedy, blind to sharing) keeps its time, marked infeasible. Ratios
are each policy's makespan over the optimizer's: none where the optimizer refused.
"""

from __future__ import annotations

from typing import Any

from splitfed.cost.model import Scenario
from splitfed.errors import SplitfedError
from splitfed.optimizer.assign import solve
from splitfed.optimizer.baselines import all_on_server, best_static, greedy
from splitfed.optimizer.defaults import DEFAULT_GAP
from splitfed.optimizer.explain import explain
from splitfed.optimizer.solution import Solution

POLICIES = ("optimizer", "best_static", "greedy", "all_on_server")


def proven(sol: Solution) -> bool:
    """Whether ``sol`` is a proven optimum that fits: a MILP's proven to its gap, or brute force's."""
    return (sol.method == "exhaustive" or (sol.method == "milp" and sol.optimal)) and sol.cost.feasible


def why(sc: Scenario, sol: Solution) -> str | None:
    """What sets ``sol``'s makespan (:func:`~splitfed.optimizer.explain.explain`), for a proven optimum only: its
    reasons (a straggler no policy can beat, cuts held back by full servers) hold of no other answer."""
    return explain(sc, sol.cost) if proven(sol) else None


def by_class(sc: Scenario, sol: Solution) -> dict[str, dict[str, int]]:
    """How many clients of each device class (fleet entry) got which cuts, in client order."""
    kinds: dict[str, dict[str, int]] = {}
    assignment = sol.assignment
    for c in sc.clients:
        cuts = ",".join(map(str, assignment[c.name]))
        kinds.setdefault(c.kind, {}).setdefault(cuts, 0)
        kinds[c.kind][cuts] += 1
    return kinds


def ratio(seconds: float, base: float) -> float:
    """``seconds / base``; a makespan of 0 (a model of no work and no bytes) is matched only by 0 (1.0), and
    beaten by anything slower infinitely (it divided by zero)."""
    if base > 0:
        return seconds / base
    return 1.0 if seconds <= 0 else float("inf")


def compare(sc: Scenario, *, gap: float = DEFAULT_GAP, time_limit: float | None = 60.0,
            static_time_limit: float | None = None) -> dict[str, dict[str, Any]]:
    """Each of :data:`POLICIES` priced: ``makespan_s`` (None: refused, ``note`` says why), ``feasible`` and the
    memory limits it breaks (``violations``), ``bottleneck``, ``method``, ``optimal``, ``solve_s``, ``note``,
    ``cuts_by_class``; the others' ``ratio_vs_optimizer``; the
    optimizer's ``why`` (:func:`why`). ``gap`` and ``time_limit`` are the optimizer's, ``static_time_limit`` best
    static's (None: every vector it ranks best is priced)."""
    runs = {"optimizer": lambda: solve(sc, gap=gap, time_limit=time_limit),
            "best_static": lambda: best_static(sc, time_limit=static_time_limit),
            "greedy": lambda: greedy(sc), "all_on_server": lambda: all_on_server(sc)}
    out: dict[str, dict[str, Any]] = {}
    sols: dict[str, Solution] = {}
    for name in POLICIES:
        try:
            s = runs[name]()
        except SplitfedError as e:
            out[name] = {"makespan_s": None, "note": str(e)}
            continue
        sols[name] = s
        out[name] = {"makespan_s": s.makespan_s, "feasible": s.cost.feasible, "violations": list(s.cost.violations),
                     "bottleneck": s.cost.bottleneck, "method": s.method, "optimal": s.optimal,
                     "solve_s": s.solve_s, "note": s.note, "cuts_by_class": by_class(sc, s)}
    opt = out["optimizer"]["makespan_s"]
    for name in POLICIES[1:]:
        m = out[name]["makespan_s"]
        # no ratio to an optimizer that refused (no assignment fits): the others' times are still reported
        out[name]["ratio_vs_optimizer"] = None if m is None or opt is None else ratio(m, opt)
    out["optimizer"]["why"] = why(sc, sols["optimizer"]) if "optimizer" in sols else None
    return out
