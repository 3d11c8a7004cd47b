"""One way to turn (seed, purpose, ...) into independent generator seeds."""

from __future__ import annotations

import numpy as np

from splitfed.errors import ConfigError


def derive_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed for one purpose, so that streams for different purposes never overlap.

    ``seed + 1`` style offsets make the test set of seed 0 the train set of seed 1;
    hashing through ``SeedSequence`` keeps every (seed, part...) stream independent.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    state = np.random.SeedSequence([int(seed), *(int(p) for p in parts)]).generate_state(2)
    return int((int(state[0]) << 32 | int(state[1])) >> 1)
