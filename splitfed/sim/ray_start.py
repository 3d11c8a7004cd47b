"""Start Ray for the simulation, retrying a start that times out.

Ray gives its node processes a fixed 30 s to register (``raylet_start_wait_time_s``
in ``ray._private.node``, not configurable); on a loaded 2-core machine a start
can miss it and nothing has run yet. So the runner starts Ray itself, before any
tier process or ServerApp exists, and retries a failed start after killing the
processes that attempt left behind (Ray does not stop them when ``Node()``
raises). Flower's backend sees Ray initialised and uses it as it is.

Ray keeps a session folder per start (``/tmp/ray/session_<date>_<pid>``: its logs,
sockets, spilled objects) and never removes it; a researcher running many
simulations collects thousands. :func:`session_dir` names the one this process's Ray
uses while it is up, and :func:`remove_session` removes it once that Ray has shut
down and none of its processes is left (the runner calls it for a run that did not
fail; a failed run keeps it, for its logs).
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from splitfed.errors import ConfigError
from splitfed.importpath import child_pythonpath

ATTEMPTS = 3
WAIT_SLICE_S = 0.1  # how often :func:`remove_session` looks again for the session's processes


class RayStartError(RuntimeError):
    """Ray did not start in the tries allowed; the message holds the last cause."""


SOCKET = "plasma_store"  # the longest name Ray gives a socket in its session folder (the other: "raylet")


def ray_temp_root() -> str:
    """The folder Ray keeps its sessions in, ``<RAY_TMPDIR or TMPDIR or /tmp>/ray``, read as Ray reads it
    (``get_default_ray_temp_dir`` in ``ray._common.utils``) without importing Ray: ``splitfed simulate``
    refuses a folder too deep before its heavy imports (:func:`check_socket_room`).
    tests/test_simulate_progress.py holds it to Ray's own."""
    if "RAY_TMPDIR" in os.environ:
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        base = os.environ["TMPDIR"]
    elif sys.platform.startswith(("darwin", "linux")):
        base = os.path.join(os.sep, "tmp")
    else:
        base = tempfile.gettempdir()
    return os.path.join(base, "ray")


def check_socket_room() -> None:
    """Refuse (:class:`ConfigError`), before Ray starts, a temporary folder too deep for Ray's Unix sockets: a
    socket's path has at most 107 bytes (103 on macOS), and Ray makes its sockets in
    ``<RAY_TMPDIR or TMPDIR>/ray/session_<date>_<pid>/sockets``. A batch job's TMPDIR is often that deep; Ray
    then failed on each try with a path-length OSError, keeping a session folder each time. Imports nothing
    heavy (not Ray): ``splitfed simulate`` checks it first, a one-line refusal in a moment."""
    root = ray_temp_root()
    stamp = datetime.datetime(2000, 1, 1).strftime("%Y-%m-%d_%H-%M-%S_%f")  # as Ray names a session: fixed width
    path = Path(root) / f"session_{stamp}_{os.getpid()}" / "sockets" / SOCKET
    limit = (104 if sys.platform.startswith("darwin") else 108) - 1
    length = len(str(path).encode())
    if length > limit:
        where = "RAY_TMPDIR" if "RAY_TMPDIR" in os.environ else "TMPDIR (or RAY_TMPDIR, which Ray reads first)"
        raise ConfigError(f"Ray cannot start under {root}: the paths of its sockets there "
                          f"({root}/session_<date>_<pid>/sockets/{SOCKET}) would be {length} bytes long, over the "
                          f"{limit} a Unix socket's path may have; set {where} to a folder with a shorter path "
                          "(e.g. RAY_TMPDIR=/tmp)")


def start_ray(init_args: dict[str, Any], attempts: int = ATTEMPTS,
              log: Callable[[str], None] = lambda line: None, stopped: Callable[[], bool] = lambda: False) -> None:
    """``ray.init``, retried on failure, unless ``stopped()`` (a stop asked for meanwhile: it returns without Ray,
    and the caller raises the stop). The workers get this process's import path (:func:`_inherited`)."""
    import ray

    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        before = set(_children())  # by pid and start time: a pid freed and taken again is another process
        try:
            with warnings.catch_warnings():
                # a tip about a future default (GPU visibility for num_gpus=0 actors), not about this run
                warnings.filterwarnings("ignore", message=".*RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", category=FutureWarning)
                with _inherited(child_pythonpath()):
                    ray.init(**init_args)
            return
        except BaseException as e:  # Ray raises bare Exception on a start timeout
            last = e
            ray.shutdown()  # also a node set up before ray.init returned (else Ray's exit makes its folder again)
            _kill([p for p in _children() if p not in before and _is_ray(p)])
            if not isinstance(e, Exception):  # Ctrl-C while Ray started: what it had started is stopped too
                raise
            if stopped():
                return
            log(f"Ray did not start (attempt {attempt}/{attempts}): {type(e).__name__}: {e}")
    raise RayStartError(f"Ray did not start in {attempts} attempts; last error: {type(last).__name__}: {last}") \
        from last


@contextmanager
def _inherited(pythonpath: str) -> Iterator[None]:
    """PYTHONPATH set in this process's environment while Ray starts: its node's processes inherit it, and so
    every worker they start, those a node starts with it (one per CPU) among them. Flower's way, a runtime env
    with ``env_vars``, marks those idle ones unfit: each ClientApp actor then waited for a worker of its own
    (2.4 s here; the node's, fit, take 0.5 s), and the node's idled beside them. Restored afterwards: the
    processes this one starts later (the tiers) get their own (``child_pythonpath``)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pythonpath
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


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


def shutdown_ray() -> None:
    """``ray.shutdown``, also of a Ray whose shutdown was cut short (a second Ctrl-C while Flower's engine shut
    it down): Ray disconnects first, so ``ray.is_initialized()`` is False from there, and kills its node's
    processes last; left, they hold the session folder (:func:`remove_session` waited its 30 s for them, then
    kept it) and live until this process ends. Running it twice is allowed by Ray."""
    import ray
    from ray._private import worker

    if ray.is_initialized() or getattr(worker, "_global_node", None) is not None:
        ray.shutdown()


def session_dir() -> Path | None:
    """The session folder of the Ray this process is connected to (its logs are in ``logs/``); None when
    Ray is not up. Ray's temporary folder (``/tmp/ray``, or ``RAY_TMPDIR``'s ``ray``) and session name, as
    its runtime context gives them."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        ctx = ray.get_runtime_context()
        path = Path(ctx.get_temp_dir()) / ctx.get_session_name()
    except Exception:  # noqa: BLE001 - a Ray without them: nothing to remove, nothing to name
        return None
    return path if path.is_dir() else None


def own_sessions(since: float) -> list[Path]:
    """The session folders a Ray started by this process made from ``since`` (a Unix time) on, under Ray's
    default temporary folder: Ray names each ``session_<date>_<pid of the process that started it>``. For a
    start cut short (Ctrl-C while Ray started), when :func:`session_dir` has nothing to say."""
    from ray._common.utils import get_default_ray_temp_dir

    root = Path(get_default_ray_temp_dir())
    try:
        found = [p for p in root.glob(f"session_*_{os.getpid()}")
                 if p.is_dir() and not p.is_symlink() and p.stat().st_mtime >= since - 1]
    except OSError:
        return []
    return sorted(found)


LATEST = "session_latest"  # Ray's link to the session it started last, in the same folder


def remove_session(session: Path, wait_s: float = 30.0) -> bool:
    """Remove ``session``, the folder of a Ray that has shut down, and Ray's ``session_latest`` link beside
    it if it points at it (Ray points it at each new session; one that points at a missing folder is
    never replaced). Nothing else: another run's session and the link to it are left alone. Waits up to
    ``wait_s`` for the processes of that Ray (those that name the folder on their command line or hold
    a file in it: its workers rename themselves) to end; returns False, leaving the folder, if one is
    still there then, or if the folder could not be removed."""
    if not session.name.startswith("session_") or session.name == LATEST or session.is_symlink() \
            or not session.is_dir():
        return False
    end = time.monotonic() + wait_s
    while left := _session_processes(session):
        if time.monotonic() >= end:
            return False
        # in slices of WAIT_SLICE_S, looked for again each time: a worker that has ended while its raylet (its
        # parent) ends is a zombie for a while, which psutil counts as running, so one wait took its whole second
        psutil.wait_procs(left, timeout=min(WAIT_SLICE_S, max(0.0, end - time.monotonic())))
    for attempt in range(3):
        try:
            shutil.rmtree(session)
            break
        except FileNotFoundError:
            break
        except OSError:  # a file made in it meanwhile (a process that was not seen to be Ray's)
            if attempt == 2:
                return False
            time.sleep(0.2)
    latest = session.parent / LATEST
    try:
        if os.path.abspath(os.path.join(session.parent, os.readlink(latest))) == os.path.abspath(session):
            latest.unlink()
    except OSError:  # no link, not a link, or another run's Ray replaced it meanwhile
        pass
    return True


def _session_processes(session: Path) -> list[psutil.Process]:
    """This user's processes (not this one) that name ``session`` on their command line or hold a file in it."""
    where = str(session)
    inside = where + os.sep
    uid = os.getuid()
    found = []
    for p in psutil.process_iter(["uids", "cmdline"]):
        try:
            if p.pid == os.getpid() or p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            if where in " ".join(p.info["cmdline"] or []) or any(
                    f.path.startswith(inside) for f in p.open_files()):
                found.append(p)
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    return found


DONE = b"done"  # what the runner tells its watcher once it has shut Ray down and tidied up itself
REMOVE = b"remove "  # a line the runner may send first: a file of the run's own to remove too if it is killed
WATCHED = "SPLITFED_WATCHED_RAY_SESSION"  # the watcher's environment: the session folder it watches


class SessionWatch:
    """A watcher process for one Ray session: if this process ends without :meth:`release` (SIGKILL, the OOM
    killer), it kills the processes of that session still left and removes its folder, and the files this
    process named (:meth:`also_remove`).

    Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) outlive a driver killed so, reparented to
    PID 1, for good; a parent-death signal cannot reach them (raylet starts them, and it is not inherited).
    The watcher reads a pipe only this process can write to (its end is not inheritable): end of file
    without :data:`DONE` is this process gone. It runs in a session of its own, so the terminal's Ctrl-C,
    which the runner handles, does not end it first."""

    def __init__(self, session: Path) -> None:
        import subprocess
        import sys

        read, self._write = os.pipe()  # both close-on-exec: no other process of this run holds the write end
        try:
            # the folder in its environment, not on its command line: there it would be one of the session's
            # processes (_session_processes), waited for by remove_session
            self.proc = subprocess.Popen([sys.executable, "-m", "splitfed.sim.ray_start"], stdin=read,
                                         start_new_session=True, close_fds=True,
                                         env={**os.environ, "PYTHONPATH": child_pythonpath(), WATCHED: str(session)})
        except BaseException:
            os.close(self._write)
            raise
        finally:
            os.close(read)

    def also_remove(self, path: Path) -> None:
        """If this process is killed, the watcher removes ``path`` too: a file this run made for itself (its
        coordinator token, a secret) that it would have removed on any other end."""
        raw = os.fsencode(path)
        if self._write < 0 or b"\n" in raw:  # released already; or a name the line protocol cannot carry
            return
        try:
            os.write(self._write, REMOVE + raw + b"\n")
        except OSError:  # the watcher is gone already
            pass

    def release(self) -> None:
        """This process has tidied up (or means to keep the session): the watcher ends, doing nothing."""
        if self._write < 0:
            return
        try:
            os.write(self._write, DONE)
        except OSError:  # the watcher is gone already
            pass
        os.close(self._write)
        self._write = -1
        self.proc.wait()


def _watch(session: Path) -> None:
    """The watcher's side (:class:`SessionWatch`): wait for end of file on stdin, then tidy up unless told not to."""
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stop meant for the run: the run tells this one what to do
    said = sys.stdin.buffer.read().split(b"\n")
    if said[-1] == DONE:
        return
    _kill(_session_processes(session))
    remove_session(session)
    for line in said:
        if line.startswith(REMOVE):
            try:
                Path(os.fsdecode(line[len(REMOVE):])).unlink(missing_ok=True)
            except OSError:  # not ours to remove (any more): the others still go
                pass


if __name__ == "__main__":
    _watch(Path(os.environ[WATCHED]))
