"""Brute force for the optimizer's tests: every assignment of legal cuts, priced by the cost model itself."""

from __future__ import annotations

import itertools

from splitfed.cost import Scenario, evaluate

Plan = dict[str, tuple[int, ...]]


def every_plan(sc: Scenario) -> list[tuple[Plan, float]]:
    """Every assignment of ``sc``'s legal cuts to its clients that fits, as :func:`evaluate` prices it, with its
    makespan (``len(options) ** clients`` of them: small scenarios only)."""
    names = [c.name for c in sc.clients]
    cuts = [tuple(int(x) for x in o) for o in sc.options.tolist()]
    plans = [dict(zip(names, p, strict=True)) for p in itertools.product(cuts, repeat=len(names))]
    return [(p, r.makespan_s) for p in plans if (r := evaluate(sc, p)).feasible]
