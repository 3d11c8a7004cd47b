"""Cut assignment: the exact optimizer, baseline policies, and online adaptation between rounds.

The optimizer's modules import numpy and scipy: this package imports them when one of their names is first
used, so that what needs only its defaults (``splitfed optimize --help``) does not wait for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from splitfed.optimizer.defaults import DEFAULT_GAP, EXHAUSTIVE_LIMIT

if TYPE_CHECKING:
    from splitfed.optimizer.adapt import Adapter, Decision, Measurement
    from splitfed.optimizer.assign import solve
    from splitfed.optimizer.baselines import all_on_server, best_static, greedy, static
    from splitfed.optimizer.brute_force import exhaustive
    from splitfed.optimizer.solution import OutOfTime, Solution

__all__ = [
    "DEFAULT_GAP",
    "EXHAUSTIVE_LIMIT",
    "Adapter",
    "Decision",
    "Measurement",
    "OutOfTime",
    "Solution",
    "all_on_server",
    "best_static",
    "exhaustive",
    "greedy",
    "solve",
    "static",
]

_MODULE = {
    **dict.fromkeys(("Adapter", "Decision", "Measurement"), "adapt"),
    **dict.fromkeys(("OutOfTime", "Solution"), "solution"),
    **dict.fromkeys(("all_on_server", "best_static", "greedy", "static"), "baselines"),
    "exhaustive": "brute_force",
    "solve": "assign",
}


def __getattr__(name: str) -> Any:
    """``splitfed.optimizer.solve`` and the rest: imported from their module when first asked for."""
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)
    globals()[name] = value  # asked once: the next lookup finds it without this function
    return value
