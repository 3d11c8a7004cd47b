"""The optimizer's defaults (scipy- and numpy-free: ``splitfed optimize --help`` shows them)."""

EXHAUSTIVE_LIMIT = 2_000_000  # the most assignments brute force (exhaustive) tries
DEFAULT_GAP = 1e-5  # the relative optimality gap the MILP must prove (solve)
