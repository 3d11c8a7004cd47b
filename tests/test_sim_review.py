"""Simulation runner review: how ``splitfed simulate`` ends when it is not let to end itself.

- A simulate killed outright (SIGKILL, the OOM killer) left Ray's ``ray::DashboardAgent`` and
  ``ray::RuntimeEnvAgent`` running for good, reparented to PID 1, and its session folder: a watcher process
  (:class:`~splitfed.sim.ray_start.SessionWatch`) now kills what is left of the session and removes it.
- A simulate whose output's reader went (``splitfed simulate ... | head``) ended quietly (141) but kept Ray's
  session folder, as for a failed run, and tried to print where its logs are, to the closed pipe.

Ray runs under a temporary folder of the test's own (``RAY_TMPDIR``): no other run's session is near it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from splitfed.sim import ray_start
from tests.ray_fixtures import running, sessions, until

REPO = Path(__file__).resolve().parents[1]
SPLITFED = REPO / ".venv" / "bin" / "splitfed"
TINY = ["--clients", "2", "--tiers", "2", "--cuts", "static:2", "--batch-size", "64", "--seed", "1"]


def _simulate(ray_tmp: Path, out: Path, *extra: str, stdout: int | None = None,
              tmp: Path | None = None, tiny: list[str] = TINY) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), **({"TMPDIR": str(tmp)} if tmp else {})}
    return subprocess.Popen([str(SPLITFED), "simulate", *tiny, "--out", str(out), *extra], cwd=REPO, env=env,
                            stdout=stdout if stdout is not None else subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


# ---------------------------------------------------------------- the watcher, without Ray


_HOLDER = """
import subprocess, sys, time
from pathlib import Path
from splitfed.sim.ray_start import SessionWatch
session = Path(sys.argv[1])
watch = SessionWatch(session)
# a process of that session that outlives this one (as Ray's agents do): holds a file in it, own session
child = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'a'); time.sleep(600)",
                          str(session / "logs" / "agent.log")], start_new_session=True)
secret = Path(sys.argv[3])
secret.write_text("token")
watch.also_remove(secret)  # the run's own coordinator token
print(child.pid, flush=True)
if sys.argv[2] == "release":
    watch.release()
time.sleep(600)
"""


def _holder(session: Path, how: str) -> tuple[subprocess.Popen[str], psutil.Process]:
    parent = subprocess.Popen([sys.executable, "-c", _HOLDER, str(session), how, str(session.parent / "secret")],
                              stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    assert until(lambda: any(f.path.endswith("agent.log") for f in child.open_files()), 30)
    return parent, child


def test_a_killed_runner_s_session_processes_and_folder_are_tidied_by_its_watcher(tmp_path):
    """And the files the runner named (:meth:`SessionWatch.also_remove`): its coordinator token was left in /tmp."""
    session = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    (session / "logs").mkdir(parents=True)
    parent, child = _holder(session, "keep")
    try:
        parent.kill()  # SIGKILL: nothing of the runner's own runs
        parent.wait()
        assert until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE)
        assert until(lambda: not session.exists())
        assert until(lambda: not (tmp_path / "secret").exists())  # the file the runner named goes too
    finally:
        parent.kill()
        ray_start._kill([child])


def test_a_released_watcher_leaves_the_session_alone(tmp_path):
    """A runner that tidied up itself (or keeps a failed run's session for its logs) releases its watcher."""
    session = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    (session / "logs").mkdir(parents=True)
    parent, child = _holder(session, "release")
    try:
        assert until(lambda: not [p for p in psutil.Process(parent.pid).children() if p.pid != child.pid])
        parent.kill()
        parent.wait()
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        assert (session / "logs" / "agent.log").is_file()
        assert (tmp_path / "secret").read_text() == "token"  # the runner removes its own files when it tidies up
    finally:
        parent.kill()
        ray_start._kill([child])


# ---------------------------------------------------------------- real simulations


@pytest.mark.slow
@pytest.mark.xdist_group("flower-real")
def test_a_sigkilled_simulate_leaves_no_ray_process_no_session_and_no_token_file(ray_tmp, tmp_path):
    """The run compresses each link with a codec of its own (``--compress fp16,int8``, 3 tiers), and its round 1
    (kept in its folder when it is killed) equals the in-process backend's to the bit where it is exact: the
    node's link gets the first codec and the edge's the second (before, the edge's link went uncompressed). Was
    a check of tests/test_ray_session.py's real run, a Ray start of its own (whose other checks are now on
    tests/test_flower_sim.py's run:
    test_a_simulation_removes_its_own_ray_session_and_nothing_else_and_holds_its_resources_flat), and before
    that test_links_and_replies.py's test_a_flower_simulation_with_compression_equals_the_inprocess_backend:
    a round's math does not depend on how many rounds follow, nor on how the run ends after it."""
    from splitfed.flower.config import RunSettings
    from splitfed.sim.inprocess import train_inprocess

    out = tmp_path / "run"
    tmp = tmp_path / "tmp"  # where the run makes its coordinator token
    tmp.mkdir()
    settings = RunSettings(rounds=1, clients=2, tiers=3, cuts="static:2,5", compress="fp16,int8", batch_size=64,
                           seed=1)
    tiny = ["--clients", "2", "--tiers", "3", "--cuts", "static:2,5", "--compress", "fp16,int8", "--batch-size",
            "64", "--seed", "1"]
    proc = _simulate(ray_tmp, out, "--rounds", "200", tmp=tmp, tiny=tiny)
    try:
        assert until(lambda: (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size, 300)
        [session] = sessions(ray_tmp)
        [token] = tmp.glob("splitfed-coordinator-token-*")
        ray_procs = [p for p in ray_start._session_processes(session) if p.pid != proc.pid]
        assert ray_procs  # Ray's processes of this run, there while it runs
        proc.kill()
        proc.wait()
        assert until(lambda: not running(ray_procs))
        assert until(lambda: not session.exists())
        assert until(lambda: not token.exists())  # a secret: was left in /tmp by every killed run
        assert (out / "checkpoint.pt").is_file()  # the run folder is kept, to resume
    finally:
        proc.kill()
        proc.wait()
    # the same model as in-process with the same codec on each link, and the same bytes: round 1
    train_inprocess(settings.with_(out=str(tmp_path / "local")))
    flower, local = (json.loads((tmp_path / d / "metrics.jsonl").read_text().splitlines()[0]) for d in ("run", "local"))
    assert flower["round"] == local["round"] == 1
    for key in ("loss", "train_loss", "accuracy"):  # the same model: the same numbers
        assert flower[key] == pytest.approx(local[key], rel=1e-6, abs=1e-9), key
    for key in ("bytes_up", "bytes_down"):  # each client's own link, compressed alike
        assert flower[key] == local[key] > 0, key
    assert flower["tier_weight_bytes"] == local["tier_weight_bytes"]  # weights travel exact


@pytest.mark.slow
@pytest.mark.xdist_group("flower-real")
def test_a_simulate_whose_reader_went_ends_quietly_and_removes_its_ray_session(ray_tmp, tmp_path):
    proc = _simulate(ray_tmp, tmp_path / "run", "--rounds", "3", stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"starting the simulation engine")
        assert until(lambda: bool(sessions(ray_tmp)), 300)
        proc.stdout.close()  # ``| head -1``
        assert proc.wait(timeout=300) == 141
        assert proc.stderr is not None and proc.stderr.read() == b""
        assert sessions(ray_tmp) == []
    finally:
        proc.kill()
        proc.wait()


_FIRST_LINE = """
import json, sys
from splitfed.flower.config import RunSettings
from splitfed.sim import runner


class Seen(Exception):
    pass


def first(line):
    raise Seen(line, sorted(m for m in ("ray", "flwr.simulation", "clients.app", "server.app") if m in sys.modules))


try:
    runner.simulate(RunSettings(rounds=1, clients=2), progress=first)
except Seen as e:
    print(json.dumps(e.args))
"""


def test_a_run_says_it_is_starting_before_it_imports_the_engine() -> None:
    """The first line comes before Ray, Flower's simulation and the apps are imported: seconds of silence on a
    slow machine, before (they were imported first)."""
    p = subprocess.run([sys.executable, "-c", _FIRST_LINE], cwd=Path(__file__).resolve().parents[1],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    line, imported = json.loads(p.stdout)
    assert line.startswith("starting the simulation engine (Ray, ") and line.endswith(" and 2 tier process(es)...")
    assert imported == [], imported
