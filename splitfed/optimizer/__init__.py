"""Cut assignment: the exact optimizer, baseline policies, and online adaptation between rounds."""

from splitfed.optimizer.adapt import Adapter, Decision, Measurement
from splitfed.optimizer.assign import (
    DEFAULT_GAP,
    EXHAUSTIVE_LIMIT,
    Solution,
    all_on_server,
    best_static,
    exhaustive,
    greedy,
    solve,
    static,
)

__all__ = [
    "DEFAULT_GAP",
    "EXHAUSTIVE_LIMIT",
    "Adapter",
    "Decision",
    "Measurement",
    "Solution",
    "all_on_server",
    "best_static",
    "exhaustive",
    "greedy",
    "solve",
    "static",
]
