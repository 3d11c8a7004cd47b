"""A simulation removes the Ray session folder it made (``/tmp/ray/session_<date>_<pid>``), and only that.

Before, every run left its session folder (~250 KB: logs, sockets) behind; a researcher running many
simulations collected thousands. Now a run that ends removes its own session, once Ray is down, and
Ray's ``session_latest`` link if it points at it; another run's session and a link to it are left alone;
a run that failed keeps its session and names its logs. Ray runs here under its own temporary folder
(``RAY_TMPDIR``), so the sessions of other runs on this machine are never near the test.
A run that ends removing its own session and nothing else, and holding its resources flat, is checked on
tests/test_flower_sim.py's real run (its
test_a_simulation_removes_its_own_ray_session_and_nothing_else_and_holds_its_resources_flat; it was a Ray
start of its own here); its per-link compression check (``--compress fp16,int8`` equals the in-process
backend) on tests/test_sim_review.py's SIGKILL run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitfed.flower.config import RunSettings
from splitfed.sim import ray_start

TINY = RunSettings(rounds=1, clients=2, tiers=2, cuts="static:2", batch_size=64, seed=1)
OTHER = "session_2000-01-01_00-00-00_000000_1"  # another run's session


@pytest.fixture
def ray_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Ray's folder for this test (``RAY_TMPDIR/ray``), holding another run's session; short, for Ray's sockets."""
    base = Path(tempfile.mkdtemp(prefix="sfr", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(base))
    other = base / "ray" / OTHER / "logs"
    other.mkdir(parents=True)
    (other / "raylet.out").write_text("another run's log\n")
    try:
        yield base / "ray"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _sessions(ray_dir: Path) -> list[str]:
    return sorted(p.name for p in ray_dir.iterdir())


# ---------------------------------------------------------------- real simulations


@pytest.mark.slow
@pytest.mark.xdist_group("flower-real")
def test_a_failed_simulation_keeps_its_ray_session_and_names_its_logs(ray_tmp, tmp_path, monkeypatch):
    import flwr.simulation

    from splitfed.sim.runner import SimulationError, simulate

    def engine_fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(flwr.simulation, "run_simulation", engine_fails)
    with pytest.raises(SimulationError, match="the engine broke") as e:
        simulate(TINY.with_(out=str(tmp_path / "run")), progress=lambda line: None)
    kept = [ray_tmp / n for n in _sessions(ray_tmp) if n not in (OTHER, "session_latest")]
    assert len(kept) == 1 and (kept[0] / "logs").is_dir()
    assert str(e.value).endswith(f"(Ray's logs are kept in {kept[0] / 'logs'})")


# ---------------------------------------------------------------- remove_session, without Ray


def _fake_ray(base: Path) -> tuple[Path, Path]:
    ours, other = base / "session_2026-01-01_00-00-01_000001_11", base / OTHER
    for s in (ours, other):
        (s / "logs").mkdir(parents=True)
        (s / "logs" / "raylet.out").write_text("log\n")
        (s / "sockets").mkdir()
    return ours, other


def test_remove_session_removes_the_link_only_when_it_points_at_the_session(tmp_path):
    ours, other = _fake_ray(tmp_path)
    latest = tmp_path / "session_latest"
    latest.symlink_to(other)  # another run's Ray started after ours
    assert ray_start.remove_session(ours, wait_s=1)
    assert not ours.exists() and other.is_dir() and os.readlink(latest) == str(other)
    ours, _ = _fake_ray(tmp_path / "again")
    (tmp_path / "again" / "session_latest").symlink_to(ours)
    assert ray_start.remove_session(ours, wait_s=1)
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == [OTHER]  # a link to nothing: Ray would
    # never replace it (it checks os.path.exists, which is False for a dangling link, then fails to symlink)


@pytest.mark.parametrize("name", ["session_latest", "logs", "not_a_session"])
def test_remove_session_removes_nothing_but_a_session_folder(tmp_path, name):
    ours, _ = _fake_ray(tmp_path)
    target = tmp_path / name
    if name == "session_latest":
        target.symlink_to(ours)
    else:
        target.mkdir()
    assert not ray_start.remove_session(target, wait_s=0)
    assert target.exists() and ours.is_dir()


def test_remove_session_waits_for_a_process_still_writing_in_it(tmp_path):
    """A process that holds a file in the session (a Ray worker renames itself: its command line does not
    name the session) keeps the session while it lives."""
    ours, _ = _fake_ray(tmp_path)
    code = "import sys, time; f = open(sys.argv[1], 'a'); print('open', flush=True); time.sleep(600)"
    p = subprocess.Popen([sys.executable, "-c", code, str(ours / "logs" / "worker.out")], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "open"
        t = time.monotonic()
        assert not ray_start.remove_session(ours, wait_s=0.5)
        assert time.monotonic() - t < 10 and (ours / "logs" / "worker.out").exists()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert ray_start.remove_session(ours, wait_s=5) and not ours.exists()
