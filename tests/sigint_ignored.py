"""A child started with SIGINT ignored, as a script's background job is: through a trampoline that ignores it
and execs the command (the disposition survives the exec), not a ``preexec_fn``, which forks the test's
process and runs its gRPC's fork handlers in the child before the exec (that aborted a child under load)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

_TRAMPOLINE = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
               "os.execv(sys.argv[1], sys.argv[1:])")


def ignoring_sigint(cmd: Sequence[object]) -> list[str]:
    """``cmd`` (its first item a path) run with SIGINT ignored."""
    return [sys.executable, "-c", _TRAMPOLINE, *map(str, cmd)]
