"""Ray's start is retried when it times out, and a failed attempt leaves no process behind.

A start timeout cannot be provoked on demand, so ``ray.init`` is wrapped to fail
the way Ray does (after spawning processes, raising a bare ``Exception``); the
retry then starts the real Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

import splitfed.sim.runner
from splitfed.flower.config import RunSettings
from splitfed.sim.ray_start import RayStartError, start_ray
from tests.ray_fixtures import ray_tmp, until  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-real")]

TIMEOUT = "The current node timed out during startup."


@pytest.fixture(autouse=True)
def _ray_folder_of_its_own(ray_tmp, monkeypatch):  # type: ignore[no-untyped-def]  # noqa: F811 - the fixture
    """Ray under the test's own folder (removed after it): a Ray these tests start and shut down, or that fails,
    keeps its session folder, which in /tmp/ray was left there by every run of the suite."""
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))


def failing_init(fail_times: int, spawned: list[subprocess.Popen], real):  # type: ignore[no-untyped-def]
    calls = {"n": 0}

    def init(**kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] <= fail_times:
            # what Ray leaves behind: a process whose command line names ray (as gcs_server and raylet do)
            spawned.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "fake-raylet"]))
            raise Exception(TIMEOUT)  # noqa: TRY002 — what Ray raises
        return real(**kwargs)

    return init, calls


def test_a_start_that_times_out_is_retried_and_its_processes_killed(monkeypatch, tmp_path) -> None:
    """Also (the same real start): an actor runs in the worker Ray's node started with it, and imports what this
    process can. Before, the import path went to the workers in a runtime env, which made the node's own idle
    workers unfit: each ClientApp actor waited for a new worker (2.4 s), the node's idled beside it."""
    import ray

    from splitfed.sim.ray_start import _session_processes, session_dir

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "sf_only_on_this_path.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(mods))  # this process's import path, not the environment's
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "the-callers-own"))
    spawned: list[subprocess.Popen] = []
    init, calls = failing_init(1, spawned, ray.init)
    monkeypatch.setattr(ray, "init", init)
    lines: list[str] = []
    try:
        start_ray({"num_cpus": 1, "num_gpus": 0, "include_dashboard": False, "logging_level": "ERROR"},
                  log=lines.append)
        # the real start may time out too on a loaded host (what the retries are for): it took a third once
        assert ray.is_initialized() and calls["n"] >= 2
        assert ray.cluster_resources().get("CPU") == 1
        assert os.environ["PYTHONPATH"] == str(tmp_path / "the-callers-own")  # as the caller had it
        session = session_dir()
        assert session is not None

        def idle() -> set[int]:
            return {p.pid for p in _session_processes(session) if "ray::IDLE" in " ".join(p.cmdline())}

        assert until(idle, 60), "Ray's node started no worker of its own"
        node_workers = idle()

        @ray.remote(num_cpus=1)
        class Probe:
            def where(self) -> tuple[int, int]:
                import sf_only_on_this_path

                return os.getpid(), sf_only_on_this_path.VALUE

        pid, value = ray.get(Probe.remote().where.remote(), timeout=120)  # type: ignore[attr-defined]
        assert value == 42 and pid in node_workers, (pid, node_workers)
    finally:
        ray.shutdown()
    assert lines[0] == f"Ray did not start (attempt 1/3): Exception: {TIMEOUT}" and len(lines) == calls["n"] - 1
    assert all(line.startswith(f"Ray did not start (attempt {n}/3): ") for n, line in enumerate(lines, 1))
    assert spawned[0].poll() is not None  # the failed attempt's leftover was killed


def test_only_rays_processes_are_killed(monkeypatch) -> None:
    """A child that is not Ray's, started while Ray was starting, is left alone."""
    import ray

    other: list[subprocess.Popen] = []

    def init(**kwargs):  # type: ignore[no-untyped-def]
        other.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        raise Exception(TIMEOUT)  # noqa: TRY002

    monkeypatch.setattr(ray, "init", init)
    try:
        with pytest.raises(RayStartError):
            start_ray({"num_cpus": 1}, attempts=1)
        assert other[0].poll() is None
    finally:
        other[0].kill()
        other[0].wait()


def test_a_start_that_never_succeeds_names_the_cause_and_leaves_nothing(monkeypatch) -> None:
    import ray

    spawned: list[subprocess.Popen] = []
    init, calls = failing_init(99, spawned, ray.init)
    monkeypatch.setattr(ray, "init", init)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RayStartError, match=f"did not start in 2 attempts; last error: Exception: {TIMEOUT}"):
        start_ray({"num_cpus": 1}, attempts=2)
    assert calls["n"] == 2 and not ray.is_initialized()
    alive = [f"{p.pid} {psutil.Process(p.pid).status()}" for p in spawned if p.poll() is None]
    assert len(spawned) == 2 and not alive, alive
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_simulate_starts_no_tier_when_ray_does_not_start(monkeypatch, tmp_path) -> None:
    import ray

    spawned: list[subprocess.Popen] = []
    init, _ = failing_init(99, spawned, ray.init)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(splitfed.sim.runner, "start_tiers", lambda s: pytest.fail("tiers started"))
    import logging

    flwr = logging.getLogger("flwr")
    monkeypatch.setattr(flwr, "level", logging.DEBUG)  # a caller's own Flower logging
    lines: list[str] = []
    for addresses in ("", "127.0.0.1:7001,127.0.0.1:7002"):
        with pytest.raises(splitfed.sim.runner.SimulationError, match="the simulation engine failed: Ray did not start"):
            splitfed.sim.runner.simulate(RunSettings(rounds=1, clients=2, out=str(tmp_path / "run"),
                                                     tier_addresses=addresses), progress=lines.append)
    assert not (tmp_path / "run").exists()
    assert flwr.level == logging.DEBUG and not flwr.filters  # as it was: quieted only while the run lasted
    # what it says it starts: its own tiers, or none when it is given theirs (before: "2 tier process(es)" both times)
    assert lines[0].endswith("and 2 tier process(es)...")
    assert [x for x in lines if x.startswith("starting")][1].endswith(
        "using the tiers at 127.0.0.1:7001, 127.0.0.1:7002...")


def test_a_process_caught_inside_execve_is_read_again() -> None:
    """Right after ``Popen`` returns, under load, a child may still be inside ``execve``: its command line
    reads empty (seen on CI: a fake raylet was spared, 2 of 300 starts on a loaded machine). The kernel's
    window cannot be opened on demand, so a process whose first reads are empty stands in for it."""
    from splitfed.sim import ray_start

    class MidExec:
        reads = 0

        def status(self) -> str:
            return psutil.STATUS_RUNNING

        def cmdline(self) -> list[str]:
            self.reads += 1
            return [] if self.reads < 3 else [sys.executable, "-c", "...", "fake-raylet"]

    p = MidExec()
    assert ray_start._is_ray(p)  # type: ignore[arg-type]
    assert p.reads == 3
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not ray_start._is_ray(psutil.Process(child.pid))  # a real process that is not Ray's
    finally:
        child.kill()
        child.wait()
