"""A tier as a real OS process, pinned (mutation survivors of splitfed/transport/process.py, its first part):
what a dropped TierProcess does to its child (killed, pipes closed, token file gone even if someone removed it
first), the command line and environment ``spawn`` gives the child (a session of its own, one torch thread by
default, ``threads=None`` leaving torch its choice), and the default startup timeout of 120 s. Tiers on
127.0.0.1; most tests only spawn (no wait for torch's import) and kill at once."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
import types
from pathlib import Path

import pytest

from splitfed.transport import process
from splitfed.transport.process import TierProcess

pytestmark = pytest.mark.xdist_group("transport-processes")

needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/environ")


def _env_without_omp() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # tests/conftest.py sets it


def _child_env(pid: int) -> dict[str, str]:
    """The child's environment; empty while its exec is still setting up the new image (Popen returns once the
    exec began), so read again until the kernel shows it."""
    end = time.monotonic() + 30
    while not (raw := Path(f"/proc/{pid}/environ").read_bytes()) and time.monotonic() < end:
        time.sleep(0.01)
    return dict(e.decode().split("=", 1) for e in raw.split(b"\0") if b"=" in e)


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_a_dropped_tier_process_kills_its_running_child_and_closes_its_pipes() -> None:
    """Garbage collection reaps the child (the module docstring's promise): SIGKILL at once, not a wait for the
    child to notice its stdin closed, and none of the three pipes left open (a descriptor leaked per tier)."""
    tp = TierProcess.spawn("cloud", insecure=True)
    proc = tp.proc
    assert proc.poll() is None
    del tp
    gc.collect()
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    assert proc.stdin.closed and proc.stdout.closed and proc.stderr.closed


def test_a_token_file_someone_else_removed_does_not_make_kill_raise() -> None:
    """The token goes to the child in a private temporary file that the reaper removes; one already gone
    (a tmp cleaner, a user) is no reason for kill() to raise FileNotFoundError."""
    tp = TierProcess.spawn("cloud", insecure=True, token="secret")
    path = Path(_flag(list(tp.proc.args), "--token-file") or "")
    assert path.name.startswith("splitfed-token-") and path.read_text() == "secret"
    assert "secret" not in tp.proc.args  # never on the command line
    path.unlink()
    tp.kill()
    assert tp.proc.returncode == -signal.SIGKILL


@needs_proc
def test_a_tier_runs_in_a_session_of_its_own_with_one_torch_thread_by_default() -> None:
    """A terminal's Ctrl-C must not reach the tier (its own session); without ``threads`` the tier gets
    ``--threads 1`` and OMP_NUM_THREADS=1 even where this process's environment has none."""
    tp = TierProcess.spawn("cloud", insecure=True, env=_env_without_omp())
    try:
        assert os.getsid(tp.pid) == tp.pid != os.getsid(0)
        args = list(tp.proc.args)
        assert _flag(args, "--threads") == "1"
        assert "--insecure" in args
        assert _child_env(tp.pid).get("OMP_NUM_THREADS") == "1"
    finally:
        tp.kill()


@needs_proc
def test_threads_given_reach_the_tier_and_its_openmp() -> None:
    tp = TierProcess.spawn("cloud", insecure=True, threads=3, env=_env_without_omp())
    try:
        assert _flag(list(tp.proc.args), "--threads") == "3"
        assert _child_env(tp.pid).get("OMP_NUM_THREADS") == "3"
    finally:
        tp.kill()


def test_no_insecure_option_means_no_insecure_flag() -> None:
    """Plaintext is the tier's refusal unless asked: ``spawn`` must not ask for the caller."""
    tp = TierProcess.spawn("cloud")
    try:
        assert "--insecure" not in tp.proc.args
    finally:
        tp.kill()


@needs_proc
def test_threads_none_leaves_torch_its_choice_and_the_tier_serves() -> None:
    """``threads=None``: no --threads flag (``--threads None`` the tier's parser refuses) and no
    OMP_NUM_THREADS="None" in its environment."""
    with TierProcess.start("cloud", insecure=True, threads=None, env=_env_without_omp()) as tp:
        assert "--threads" not in tp.proc.args
        assert "OMP_NUM_THREADS" not in _child_env(tp.pid)
        assert tp.alive() and tp.address.startswith("127.0.0.1:")


def test_the_default_startup_timeout_is_120_s(monkeypatch) -> None:
    """TierOptions documents a default of 120 s from the spawn: on a clock that reads spawn + 120 s, the wait
    gives up (TimeoutError naming it, the child killed) rather than waiting on."""
    clock = [1000.0]
    monkeypatch.setattr(process, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    tp = TierProcess.spawn("cloud", insecure=True)
    clock[0] = 1120.0
    with pytest.raises(TimeoutError, match=r"tier cloud did not start within 120s"):
        tp.wait_ready()
    assert tp.proc.returncode == -signal.SIGKILL
