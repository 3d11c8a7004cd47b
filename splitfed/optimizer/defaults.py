"""The optimizer's defaults (scipy- and numpy-free: ``splitfed optimize --help`` shows them)."""

EXHAUSTIVE_LIMIT = 2_000_000  # the most assignments brute force (exhaustive) tries
DEFAULT_GAP = 1e-5  # the relative optimality gap the MILP must prove (solve)
# the adaptive policy moves cuts only for a predicted gain above this share of the time the rounds left take
HYSTERESIS = 0.05
# the adaptive policy's beliefs: the weight of each round's measurement (the rest is the belief it had) ...
MEASUREMENT_WEIGHT = 0.5
# ... except a measurement this many times above or below its belief: a new regime, believed at once
REGIME_JUMP = 3.0
# seconds each of the adaptive policy's solves may take (its first plan, then each decision after a round)
ADAPT_TIME_LIMIT_S = 30.0
