"""A Ray of the test's own for a real ``splitfed simulate`` (``RAY_TMPDIR``), and waits for what it leaves.

Ray keeps its session folders and sockets under ``$RAY_TMPDIR/ray``: a folder of the test's own keeps every
other run's session on this machine away from what the test looks at (and short, for Ray's socket paths).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from splitfed.sim import ray_start


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """Ray's folder for this test (``RAY_TMPDIR``). Whatever a failing test left there is killed and removed."""
    base = Path(tempfile.mkdtemp(prefix="sfr", dir="/tmp"))
    try:
        yield base
    finally:
        for session in (base / "ray").glob("session_2*"):
            ray_start._kill(ray_start._session_processes(session))
        shutil.rmtree(base, ignore_errors=True)


def sessions(ray_tmp: Path) -> list[Path]:
    """The session folders of the Ray under ``ray_tmp``."""
    return sorted((ray_tmp / "ray").glob("session_2*"))


def until(check: Callable[[], object], timeout_s: float = 60.0) -> bool:
    """Poll ``check`` until true or ``timeout_s`` passes (a bound for a wait, not a measurement)."""
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (a zombie has exited)."""
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
