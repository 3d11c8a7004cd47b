"""Start Ray for the simulation, retrying a start that times out.

Ray gives its node processes a fixed 30 s to register (``raylet_start_wait_time_s``
in ``ray._private.node``, not configurable); on a loaded 2-core machine a start
can miss it and nothing has run yet. So the runner starts Ray itself, before any
tier process or ServerApp exists, and retries a failed start after killing the
processes that attempt left behind (Ray does not stop them when ``Node()``
raises). Flower's backend sees Ray initialised and uses it as it is.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import psutil

from splitfed.importpath import child_pythonpath

ATTEMPTS = 3


class RayStartError(RuntimeError):
    """Ray did not start in the tries allowed; the message holds the last cause."""


def start_ray(init_args: dict[str, Any], attempts: int = ATTEMPTS,
              log: Callable[[str], None] = lambda line: None) -> None:
    """``ray.init`` with Flower's runtime env (PYTHONPATH to the workers), retried on failure."""
    import ray

    pythonpath = child_pythonpath()
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        before = set(_children())  # by pid and start time: a pid freed and taken again is another process
        try:
            with warnings.catch_warnings():
                # a tip about a future default (GPU visibility for num_gpus=0 actors), not about this run
                warnings.filterwarnings("ignore", message=".*RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", category=FutureWarning)
                ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)
            return
        except Exception as e:  # Ray raises bare Exception on a start timeout
            last = e
            if ray.is_initialized():
                ray.shutdown()
            _kill([p for p in _children() if p not in before and _is_ray(p)])
            log(f"Ray did not start (attempt {attempt}/{attempts}): {type(e).__name__}: {e}")
    raise RayStartError(f"Ray did not start in {attempts} attempts; last error: {type(last).__name__}: {last}") \
        from last


def _children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _is_ray(p: psutil.Process, wait_s: float = 2.0) -> bool:
    """Ray's own processes (gcs_server, raylet, its Python helpers) name it on their command line. A process
    still inside ``execve`` shows an empty one (its parent may already have returned from starting it), so
    an empty command line is read again, for up to ``wait_s``."""
    end = time.monotonic() + wait_s
    while True:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return False
            cmd = p.cmdline()
        except psutil.Error:
            return False
        if cmd or time.monotonic() > end:
            return "ray" in " ".join(cmd)
        time.sleep(0.01)


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
