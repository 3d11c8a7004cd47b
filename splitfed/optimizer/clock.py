"""The optimizer's clock: every part of a solve reads its deadline here.

A solve's time limit (``solve``'s, ``best_static``'s) spans pricing the fleet's options, every MILP, the loops
over the classes and the tie searches, in several modules; one clock for all of them lets a test drive a whole
solve's time from the work it fakes (patch this module's ``time``), with no timing of its own.
"""

from __future__ import annotations

import time

# pricing the fleet's options checks the limit every CHECK_EVERY distinct devices (a few ms each: a fleet of fewer
# is always priced, so a spent limit still gets an answer that needs no MILP), and the Python loops over the
# classes check it every class
CHECK_EVERY = 32


def now() -> float:
    """Seconds on the solver's clock (``time.perf_counter``)."""
    return time.perf_counter()


def expired(deadline: float | None) -> bool:
    """Whether ``deadline`` (a time of :func:`now`; None: no limit) has passed."""
    return deadline is not None and now() >= deadline
