"""What Ray's start, its session folder and the session's watcher promise, pinned from the mutation run of
``splitfed/sim/ray_start.py``.

- ``start_ray``: how many tries it makes and what it says of each, that a failed try kills the Ray processes
  it left (its grandchildren too) and nothing else, that a Ctrl-C while Ray starts is raised and a stop asked
  for meanwhile ends the tries.
- ``_is_ray``: which processes read as Ray's (a zombie, a gone one, one still inside ``execve``).
- ``own_sessions``: its one-second margin, exactly; ``remove_session``: its wait for the session's processes
  (and not for this one), its three tries at removing the folder, and its plain ``False``.
- ``SessionWatch``: its watcher runs in a session of its own, holds none of this process's descriptors,
  removes the files it is told of (and no other, for a name its line protocol cannot carry) when the runner
  is killed, and does nothing once released, also for a runner whose stdin and stdout were closed.
- One real Ray start: ``session_dir`` names its folder, ``own_sessions`` finds it, ``remove_session`` removes it.

Real child processes (``sleep`` under a Ray-like name standing for a leftover raylet, a Python runner holding
a watcher) stand in; only ``ray.init`` (a start timeout cannot be provoked) and, for the retries of
``remove_session``, ``shutil.rmtree`` (as root, no folder refuses removal) are replaced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from splitfed.sim import ray_start
from splitfed.sim.ray_start import RayStartError, SessionWatch, start_ray
from tests.ray_fixtures import ray_tmp, running, sessions, until  # noqa: F401 - ray_tmp is a fixture

REPO = Path(__file__).resolve().parents[1]
SLEEP = shutil.which("sleep") or "/bin/sleep"
SESSION = "session_2026-01-01_00-00-01_000001_11"


def _raylet() -> subprocess.Popen[bytes]:
    """A leftover of a failed start: a process whose command line names ray (as gcs_server and raylet do)."""
    return subprocess.Popen(["fake-raylet", "600"], executable=SLEEP)


def _plain() -> subprocess.Popen[bytes]:
    """A child that is not Ray's."""
    return subprocess.Popen([SLEEP, "600"])


def _end(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        _end(procs)


def _failing(spawned: list[subprocess.Popen[bytes]], error: Callable[[int], BaseException],
             leave: Callable[[], subprocess.Popen[bytes]] = _raylet) -> tuple[Callable[..., None], list[int]]:
    """A ``ray.init`` that leaves a process behind and fails as Ray's start timeout does (a bare Exception)."""
    calls: list[int] = []

    def init(**kwargs: object) -> None:
        calls.append(1)
        spawned.append(leave())
        raise error(len(calls))

    return init, calls


def _timeout(n: int) -> BaseException:
    return Exception(f"timed out {n}")  # what Ray raises


# ---------------------------------------------------------------- start_ray, with ray.init failing


def test_a_start_that_never_succeeds_tries_exactly_the_attempts_asked_and_says_each(monkeypatch, spawned):
    """Two attempts asked: two tries (not one, not three), each told as ``n/2``, and the last cause named;
    every try's leftover is killed."""
    import ray

    init, calls = _failing(spawned, _timeout)
    monkeypatch.setattr(ray, "init", init)
    lines: list[str] = []
    with pytest.raises(RayStartError) as e:
        start_ray({"num_cpus": 1}, attempts=2, log=lines.append)
    assert str(e.value) == "Ray did not start in 2 attempts; last error: Exception: timed out 2"
    assert len(calls) == 2
    assert lines == ["Ray did not start (attempt 1/2): Exception: timed out 1",
                     "Ray did not start (attempt 2/2): Exception: timed out 2"]
    assert [p.poll() is not None for p in spawned] == [True, True]


def test_a_failed_try_kills_only_the_ray_processes_it_started(monkeypatch, spawned):
    """A Ray-named process that was there before the start (another Ray of the caller's) and a child that is
    not Ray's, started meanwhile, are left alone; the try's own Ray process is killed."""
    import ray

    before = _raylet()
    spawned.append(before)
    assert until(lambda: ray_start._is_ray(psutil.Process(before.pid)), 30)  # past its execve

    def init(**kwargs: object) -> None:
        spawned.append(_plain())
        spawned.append(_raylet())
        raise Exception("timed out")  # noqa: TRY002 - what Ray raises

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(RayStartError):
        start_ray({"num_cpus": 1}, attempts=1)
    assert [p.poll() is None for p in spawned] == [True, True, False]


def test_a_failed_try_kills_a_ray_process_its_children_started(monkeypatch, spawned):
    """Ray's node processes are started by its own helpers: a grandchild of this process is one too."""
    import ray

    code = ("import os, subprocess; p = subprocess.Popen([os.environ['A0'], '600'], executable=os.environ['BIN']);"
            " print(p.pid, flush=True); p.wait()")
    grandchild: list[psutil.Process] = []

    def leave() -> subprocess.Popen[bytes]:
        parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  env={**os.environ, "A0": "fake-raylet", "BIN": SLEEP})
        assert parent.stdout is not None
        grandchild.append(psutil.Process(int(parent.stdout.readline())))
        return parent

    init, _ = _failing(spawned, _timeout, leave)
    monkeypatch.setattr(ray, "init", init)
    try:
        with pytest.raises(RayStartError):
            start_ray({"num_cpus": 1}, attempts=1)
        assert not running(grandchild)
        assert spawned[0].wait(timeout=30) == 0  # its parent, not Ray's, ended on its own
    finally:
        for p in grandchild:
            ray_start._kill([p])


def test_a_ctrl_c_while_ray_starts_is_raised_at_once_and_what_it_started_is_killed(monkeypatch, spawned):
    import ray

    init, calls = _failing(spawned, lambda n: KeyboardInterrupt())
    monkeypatch.setattr(ray, "init", init)
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        start_ray({"num_cpus": 1}, attempts=3, log=lines.append)
    assert len(calls) == 1 and lines == [] and spawned[0].poll() is not None


def test_a_stop_asked_for_while_ray_starts_ends_the_tries_without_ray(monkeypatch, spawned):
    """``stopped()`` true after a failed try: no second try, no error (the caller raises its stop)."""
    import ray

    init, calls = _failing(spawned, _timeout)
    monkeypatch.setattr(ray, "init", init)
    lines: list[str] = []
    assert start_ray({"num_cpus": 1}, attempts=3, log=lines.append, stopped=lambda: True) is None
    assert len(calls) == 1 and lines == [] and spawned[0].poll() is not None


# ---------------------------------------------------------------- _is_ray


class _Reads:
    """A process whose command line reads empty ``empty`` times (inside ``execve``), then ``cmd``; gone after
    ``limit`` reads (so that a loop that never ends does end)."""

    def __init__(self, empty: int, cmd: list[str], limit: int = 50) -> None:
        self.reads, self.empty, self.cmd, self.limit = 0, empty, cmd, limit

    def status(self) -> str:
        return psutil.STATUS_RUNNING

    def cmdline(self) -> list[str]:
        self.reads += 1
        if self.reads > self.limit:
            raise psutil.NoSuchProcess(1)
        return [] if self.reads <= self.empty else self.cmd


def test_a_command_line_read_once_is_judged_at_once_and_an_empty_one_read_again():
    ray_named = _Reads(0, ["fake-raylet", "600"])
    assert ray_start._is_ray(ray_named) is True  # type: ignore[arg-type]
    assert ray_named.reads == 1  # not read again until the wait is over
    other = _Reads(0, ["sleep", "600"])
    assert ray_start._is_ray(other) is False and other.reads == 1  # type: ignore[arg-type]
    mid_exec = _Reads(2, ["fake-raylet", "600"])
    assert ray_start._is_ray(mid_exec) is True and mid_exec.reads == 3  # type: ignore[arg-type]


def test_real_processes_are_judged_by_their_command_line_and_a_dead_one_is_not_rays(spawned):
    raylet, plain, dead, gone = _raylet(), _plain(), _raylet(), _raylet()
    spawned.extend([raylet, plain, dead, gone])
    procs = {name: psutil.Process(p.pid) for name, p in
             (("raylet", raylet), ("plain", plain), ("dead", dead), ("gone", gone))}
    assert until(lambda: procs["gone"].cmdline() and procs["dead"].cmdline(), 30)  # past their execve
    assert ray_start._is_ray(procs["raylet"]) is True
    assert ray_start._is_ray(procs["plain"]) is False
    dead.kill()  # not waited on: a zombie until reaped
    assert until(lambda: procs["dead"].status() == psutil.STATUS_ZOMBIE, 30)
    assert ray_start._is_ray(procs["dead"]) is False
    gone.kill()
    gone.wait()
    assert ray_start._is_ray(procs["gone"]) is False


# ---------------------------------------------------------------- own_sessions


def test_own_sessions_keeps_a_margin_of_exactly_one_second(tmp_path, monkeypatch):
    """A folder made from one second before ``since`` on is this start's (a coarse clock); one older is not."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    root = tmp_path / "ray"
    since = 1_700_000_000  # whole seconds: the margins below are exact in a float
    ages = {"a": -1.0, "b": -0.5, "c": -1.5, "d": 10.0, "e": -1.000001}
    for name, age in ages.items():
        d = root / f"session_{name}_{os.getpid()}"
        d.mkdir(parents=True)
        ns = int((since + age) * 1e9) if name != "e" else since * 10**9 - 10**9 - 1000
        os.utime(d, ns=(ns, ns))
    assert ray_start.own_sessions(since) == [root / f"session_{n}_{os.getpid()}" for n in ("a", "b", "d")]


def test_own_sessions_of_a_ray_folder_that_cannot_be_read_is_an_empty_list(monkeypatch):
    """A ``RAY_TMPDIR`` whose name the system refuses (a component past 255 bytes): no sessions, not None."""
    monkeypatch.setenv("RAY_TMPDIR", "/tmp/" + "x" * 300)
    assert ray_start.own_sessions(0) == []


# ---------------------------------------------------------------- remove_session, without Ray


def _session(base: Path) -> Path:
    s = base / SESSION
    (s / "logs").mkdir(parents=True)
    (s / "logs" / "raylet.out").write_text("log\n")
    return s


def _holder(path: Path, secs: int) -> subprocess.Popen[str]:
    """A ``sleep`` that holds ``path`` open (its command line does not name it), started and holding it."""
    p = subprocess.Popen(["sh", "-c", 'exec 3>>"$F"; echo open; exec "$BIN" "$SECS"'], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "F": str(path), "BIN": SLEEP, "SECS": str(secs)})
    assert p.stdout is not None and p.stdout.readline() == "open\n"
    return p


def test_remove_session_refuses_with_false_not_none(tmp_path):
    ours = _session(tmp_path)
    assert ray_start.remove_session(tmp_path / "not_a_session", wait_s=0) is False
    p = _holder(ours / "logs" / "worker.out", 600)
    try:
        assert ray_start.remove_session(ours, wait_s=0) is False  # a process of it still there
        assert (ours / "logs" / "worker.out").exists()
    finally:
        _end([p])  # type: ignore[list-item]


def test_remove_session_waits_for_a_process_of_it_to_end_by_itself(tmp_path):
    """A session process that ends within the wait (after a second) is waited for: the folder is removed."""
    ours = _session(tmp_path)
    p = _holder(ours / "logs" / "worker.out", 1)
    try:
        assert ray_start.remove_session(ours, wait_s=120) is True
        assert not ours.exists()
    finally:
        _end([p])  # type: ignore[list-item]


def test_remove_session_waits_for_a_process_that_names_it_on_its_command_line(tmp_path):
    """Ray's own processes (raylet, gcs_server) name the session folder among their arguments."""
    ours = _session(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", f"--session-dir={ours}"])
    try:
        assert until(lambda: str(ours) in " ".join(psutil.Process(p.pid).cmdline()), 30)
        assert ray_start.remove_session(ours, wait_s=0) is False and ours.is_dir()
    finally:
        _end([p])  # type: ignore[list-item]
    assert ray_start.remove_session(ours, wait_s=30) is True and not ours.exists()


def test_remove_session_does_not_wait_for_a_zombie_of_it(tmp_path):
    """A Ray worker that ends as its raylet (its parent) ends is a zombie until it is reaped, and psutil counts a
    zombie as running: it holds nothing of the session, and the folder goes without waiting for its reaping
    (one wait for such a worker took its whole second; the wait looks again every ``WAIT_SLICE_S``)."""
    ours = _session(tmp_path)
    parent = subprocess.Popen(  # the folder in its environment: only the worker's command line names it
        [sys.executable, "-c", "import os, subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5)', os.environ['SESSION_ARG']])\n"
         "print('started', flush=True)\ntime.sleep(600)\n"], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "SESSION_ARG": f"--session-dir={ours}"})
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "started\n"
        [worker] = psutil.Process(parent.pid).children()
        assert ray_start.remove_session(ours, wait_s=60) is True and not ours.exists()
        assert worker.status() == psutil.STATUS_ZOMBIE and parent.poll() is None  # ended, and never reaped
    finally:
        _end([parent])  # type: ignore[list-item]


def test_remove_session_does_not_wait_for_this_process(tmp_path):
    """The runner that calls it may still hold a file in its session (Ray's driver log): it is not waited for."""
    ours = _session(tmp_path)
    with open(ours / "logs" / "driver.log", "a"):
        assert ray_start.remove_session(ours, wait_s=0) is True
    assert not ours.exists()


def _rmtree_failing(monkeypatch: pytest.MonkeyPatch, times: int) -> list[Path]:
    """``shutil.rmtree`` that fails ``times`` times as for a file made in the folder meanwhile, then removes."""
    real = shutil.rmtree
    calls: list[Path] = []

    def rmtree(path: Path, *args: object, **kwargs: object) -> None:
        calls.append(path)
        if len(calls) <= times:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        real(path)

    monkeypatch.setattr(ray_start.shutil, "rmtree", rmtree)
    return calls


def test_remove_session_tries_the_removal_three_times(tmp_path, monkeypatch):
    ours = _session(tmp_path)
    calls = _rmtree_failing(monkeypatch, 2)
    assert ray_start.remove_session(ours, wait_s=0) is True
    assert len(calls) == 3 and not ours.exists()


def test_remove_session_says_false_when_the_folder_never_goes(tmp_path, monkeypatch):
    ours = _session(tmp_path)
    (tmp_path / "session_latest").symlink_to(ours)
    calls = _rmtree_failing(monkeypatch, 99)
    assert ray_start.remove_session(ours, wait_s=0) is False
    assert len(calls) == 3 and ours.is_dir()
    assert os.readlink(tmp_path / "session_latest") == str(ours)  # the link to a kept session is kept


# ---------------------------------------------------------------- SessionWatch


def test_the_watcher_runs_apart_holds_none_of_this_process_s_descriptors_and_is_released_once(tmp_path, capfd):
    """Its own session (the terminal's Ctrl-C is the runner's to handle); no descriptor of the runner's, even an
    inheritable one (a pipe a caller reads to its end would never end); released, it ends doing nothing, and a
    second release or a later ``also_remove`` writes nowhere (not to this process's stdin or stdout)."""
    session = _session(tmp_path)
    keep = tmp_path / "token"
    keep.write_text("secret")
    r, w = os.pipe()
    os.set_inheritable(w, True)
    watch = SessionWatch(session)
    try:
        pid = watch.proc.pid
        held = set()
        for n in os.listdir(f"/proc/{pid}/fd"):  # the watcher's interpreter opens and closes files as it starts:
            with contextlib.suppress(FileNotFoundError):  # one gone by now was its own (an inherited one stays)
                held.add(os.readlink(f"/proc/{pid}/fd/{n}"))
        assert f"pipe:[{os.fstat(w).st_ino}]" not in held
        assert os.getsid(pid) == pid != os.getsid(0)
        watch.also_remove(keep)
    finally:
        watch.release()
        os.close(r)
        os.close(w)
    assert watch.proc.returncode == 0
    assert session.is_dir() and keep.read_text() == "secret"
    stdin = os.fstat(0) if _open(0) else None
    watch.also_remove(tmp_path / "other")
    assert capfd.readouterr().out == ""
    watch.release()
    assert (os.fstat(0) if _open(0) else None) == stdin


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# a runner holding a watcher; "closed": one started with its stdin and stdout closed (a daemon), so that the
# watcher's pipe takes descriptors 0 and 1; it writes the watcher's pid on stderr
RUNNER = """
import os, sys, time
from pathlib import Path
from splitfed.sim.ray_start import SessionWatch
session, how, fds, *files = sys.argv[1:]
if fds == "closed":
    os.close(0)
    os.close(1)
watch = SessionWatch(Path(session))
for f in files:
    watch.also_remove(Path(f))
if how == "release":
    watch.release()
os.write(2, f"{watch.proc.pid}\\n".encode())
time.sleep(600)
"""


def _runner(session: Path, how: str, fds: str, *files: Path) -> tuple[subprocess.Popen[bytes], psutil.Process]:
    p = subprocess.Popen([sys.executable, "-c", RUNNER, str(session), how, fds, *map(str, files)],
                         stderr=subprocess.PIPE, cwd=REPO)
    return p, psutil.Process(p.pid)


def test_a_killed_runner_s_watcher_removes_the_session_and_the_files_named_and_a_released_one_nothing(tmp_path):
    """Three runners at once, all killed (SIGKILL) once their watcher is set:
    - one with stdin and stdout closed that named two files: its session and the file go; a name with a
      newline is not sent (its line would name another file, ``a``, which stays);
    - one that named no file: its session goes (the watcher read nothing but the end of its input);
    - one with stdin and stdout closed that named a file, then released its watcher: all stays."""
    made = {}
    for name in ("one", "two", "three"):
        (tmp_path / name).mkdir()
        made[name] = _session(tmp_path / name)
    token, token3, a = tmp_path / "token", tmp_path / "token3", tmp_path / "a"
    for f in (token, token3, a):
        f.write_text("x")
    runners = [_runner(made["one"], "keep", "closed", token, tmp_path / "a\nb"),
               _runner(made["two"], "keep", "open"),
               _runner(made["three"], "release", "closed", token3)]
    watchers = []
    try:
        for p, _ in runners:
            assert p.stderr is not None
            line = p.stderr.readline()
            assert line.strip().isdigit(), line + p.stderr.read()
            try:
                watchers.append(psutil.Process(int(line)))
            except psutil.NoSuchProcess:  # the released one's: ended already (release waits for it)
                pass
        for p, _ in runners:
            p.kill()
            p.wait()
        assert until(lambda: not running(watchers), 120)
        assert not made["one"].exists() and not token.exists() and a.read_text() == "x"
        assert not made["two"].exists()
        assert made["three"].is_dir() and token3.read_text() == "x"
    finally:
        for p, _ in runners:
            p.kill()
            p.wait()
        ray_start._kill(watchers)


# ---------------------------------------------------------------- one real Ray start


@pytest.mark.slow
@pytest.mark.xdist_group("flower-real")
def test_a_real_ray_s_session_is_named_found_and_removed(ray_tmp, monkeypatch):  # noqa: F811 - the fixture
    """``session_dir`` names the folder of the Ray that is up (and nothing once it is down); ``own_sessions``
    finds it as this process's; once Ray is down, ``remove_session`` removes it and the link to it."""
    import ray

    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    t0 = time.time()
    start_ray({"num_cpus": 1, "num_gpus": 0, "include_dashboard": False, "logging_level": "ERROR"})
    try:
        session = ray_start.session_dir()
        assert session is not None and session.is_dir()
        assert sessions(ray_tmp) == [session] and session.name.endswith(f"_{os.getpid()}")
        assert ray_start.own_sessions(t0) == [session]
    finally:
        ray.shutdown()
    assert ray_start.session_dir() is None
    assert ray_start.remove_session(session) is True
    assert not session.exists() and not (ray_tmp / "ray" / "session_latest").is_symlink()
