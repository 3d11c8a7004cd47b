"""A simulation removes the Ray session folder it made (``/tmp/ray/session_<date>_<pid>``), and only that.

Before, every run left its session folder (~250 KB: logs, sockets) behind; a researcher running many
simulations collected thousands. Now a run that ends removes its own session, once Ray is down, and
Ray's ``session_latest`` link if it points at it; another run's session and a link to it are left alone;
a run that failed keeps its session and names its logs. Ray runs here under its own temporary folder
(``RAY_TMPDIR``), so the sessions of other runs on this machine are never near the test.
The finished real run also checks that a run holds its resources flat (tests/test_resources.py's
law, for a real simulate): one Ray start for both.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
def test_a_simulation_removes_its_own_ray_session_and_nothing_else_and_holds_its_resources_flat(
        ray_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ``splitfed simulate`` run in this process (Ray, ClientApps, tier processes), 8 rounds. Its Ray
    session: there while it runs, gone with it, with the link to it, and nothing else. Its resources: the
    ServerApp process's descriptors and threads, and the tier processes' descriptors, are at round 8 what they
    were at round 2; once it ends, its tier processes are gone and its coordinator token file is removed. It
    runs with ``RAY_ADDRESS`` set, and starts its own Ray all the same. It compresses each link with a codec of
    its own (``--compress fp16,int8``, 3 tiers), and its round 1 equals the in-process backend's to the bit
    where it is exact (was tests/test_links_and_replies.py's
    test_a_flower_simulation_with_compression_equals_the_inprocess_backend, a Ray start of its own): the node's
    link gets the first codec and the edge's the second (swapped, or one left out, the numbers differ); before,
    the edge's link went uncompressed. (One run for all: each real run costs a Ray start.)"""
    import gc

    import ray

    import splitfed.sim.runner as runner
    from tests.test_resources import _running, _usage

    chains: list[Any] = []
    start_tiers = runner.start_tiers

    @contextlib.contextmanager
    def keeping(settings: RunSettings) -> Iterator[Any]:
        with start_tiers(settings) as chain:
            chains.append(chain)
            yield chain

    monkeypatch.setattr(runner, "start_tiers", keeping)
    sessions: list[tuple[Path, bool, str]] = []
    seen: dict[int, tuple[tuple[int, int], list[int]]] = {}

    def progress(line: str) -> None:
        if not line.startswith("round ") or "  acc " not in line:  # a round's own line, not one while it waits
            return
        rnd = int(line.split()[1].split("/")[0])
        if rnd == 1:  # during the run: Ray's session and the link Ray points at it
            ctx = ray.get_runtime_context()
            session = Path(ctx.get_temp_dir()) / ctx.get_session_name()
            sessions.append((session, session.is_dir(), os.readlink(ray_tmp / "session_latest")))
        if rnd in (2, 8):
            gc.collect()
            seen[rnd] = (_usage(), [_usage(p)[0] for p in chains[0].pids])

    # as on a Ray cluster's node, whose environment names the cluster: the run still starts a Ray of its own
    # (before: ray.init went to connect there, refused the run's num_cpus, and the run failed after 3 tries)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    settings = RunSettings(rounds=8, clients=2, tiers=3, cuts="static:2,5", compress="fp16,int8",
                           out=str(tmp_path / "run"))
    summary = runner.simulate(settings, progress)
    assert summary["rounds"] == 8
    [(session, was_there, latest)] = sessions
    assert was_there and session.parent == ray_tmp and session.name.startswith("session_")
    assert Path(latest) == session
    assert not session.exists()  # gone with the run...
    assert _sessions(ray_tmp) == [OTHER]  # ...with the link to it, and nothing else
    assert (ray_tmp / OTHER / "logs" / "raylet.out").read_text() == "another run's log\n"
    (me2, tiers2), (me8, tiers8) = seen[2], seen[8]
    grown = f"round 2 -> 8: ServerApp (fds, threads) {me2} -> {me8}, tiers' fds {tiers2} -> {tiers8}"
    assert me8[0] <= me2[0] + 3 and me8[1] <= me2[1] + 8, grown
    assert all(b <= a + 3 for a, b in zip(tiers2, tiers8, strict=True)), grown
    (chain,) = chains
    assert chain.coordinator_token_file and not Path(chain.coordinator_token_file).exists()
    assert not any(_running(pid) for pid in chain.pids)
    # the same model as in-process with the same codec on each link, and the same bytes: round 1 (a round's
    # math does not depend on how many rounds follow)
    from splitfed.sim.inprocess import train_inprocess

    train_inprocess(settings.with_(rounds=1, out=str(tmp_path / "local")))
    flower, local = (json.loads((tmp_path / d / "metrics.jsonl").read_text().splitlines()[0]) for d in ("run", "local"))
    for key in ("loss", "train_loss", "accuracy"):  # the same model: the same numbers
        assert flower[key] == pytest.approx(local[key], rel=1e-6, abs=1e-9), key
    for key in ("bytes_up", "bytes_down"):  # each client's own link, compressed alike
        assert flower[key] == local[key] > 0, key
    assert flower["tier_weight_bytes"] == local["tier_weight_bytes"]  # weights travel exact


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
