"""The optimizer's defaults (scipy- and numpy-free: ``splitfed optimize --help`` shows them)."""

EXHAUSTIVE_LIMIT = 2_000_000  # the most assignments brute force (exhaustive) tries
DEFAULT_GAP = 1e-5  # the relative optimality gap the MILP must prove (solve)
# the adaptive policy moves cuts only for a predicted gain above this share of the time the rounds left take
HYSTERESIS = 0.05
