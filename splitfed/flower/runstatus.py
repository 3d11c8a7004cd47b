"""How the run in a folder ended, read from the record its lock file keeps (:mod:`splitfed.flower.runfolder`
writes it), and whose process a record is.

A run records its start (pid, host, the process's identity) and its end (``finished``, ``stopped``, ``failed``)
in the folder's lock file; a start without an end is a run still going if its process lives, and one that
crashed if not. The kernel's lock table says who holds the lock while a run starts there. What
``splitfed report`` and ``server.deploy`` show of a run is :func:`status`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitfed.flower import checkpoint
from splitfed.flower.metrics import METRICS, SUMMARY, rows_kept

LOCK = ".splitfed.lock"
ENDS = ("finished", "stopped", "failed")  # how a run that recorded its end ended
TIME = "%Y-%m-%d %H:%M:%S"


# ---------------------------------------------------------------- whose a record is, who holds the lock


def same_process(pid: int, rec: Mapping[str, Any]) -> bool:
    """Whether this host's process ``pid`` is the one that wrote ``rec``."""
    return pid == rec.get("pid") and rec.get("host") == socket.gethostname() and \
        rec.get("process", identity(pid)) == identity(pid)


def held_by(fd: int) -> int | None:
    """Who holds the lock of the file open as ``fd``: the pid, 0 where it cannot be named, None if nobody.
    Read from the kernel's lock table (Linux's /proc/locks), which takes no lock: a probe's own lock would
    refuse a run that starts at that moment; without that table, a probe."""
    st = os.fstat(fd)
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    found = {}  # (device, inode) -> pid of each flock held (not waited for: "->")
    for line in table.splitlines():
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[5].count(":") == 2:
            found[f[5].lower()] = int(f[4]) if f[4].isdigit() else 0
    pid = found.get(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    if pid is None:  # a stacked file system (overlayfs) names the lower device: the inode alone, if one holds it
        same = [v for k, v in found.items() if k.rsplit(":", 1)[1] == str(st.st_ino)]
        pid = same[0] if len(same) == 1 else None
    return pid


def read_record(data: bytes) -> dict[str, Any]:
    """The JSON object a lock file holds ({}: none, or not one). The first object only: a record being
    replaced in place by a shorter one may show the end of the longer for a moment."""
    try:
        obj, _ = json.JSONDecoder().raw_decode(data.decode(errors="replace"))
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


# ---------------------------------------------------------------- how a run ended


@dataclass(frozen=True)
class RunStatus:
    """What became of the run in a folder.

    ``state``: ``finished``, ``stopped`` (by a signal: ``record["signal"]``; or ``record["reason"]``: its output's
    reader went away), ``failed`` (``record["error"]``),
    ``running`` (its process is alive, or one holds the folder's lock to start a run there, which has not
    recorded its start yet: ``record["starting"]``, the record then that process's), ``crashed`` (it recorded its start and its process is gone without
    recording an end: SIGKILL, out of memory, the machine went down), ``unknown`` (no end recorded, and its
    process is on another host, ``record["host"]``), ``unfinished`` (no summary, written by a splitfed that
    did not record how a run ended), or ``hand-made`` (no run of splitfed wrote the folder: its metrics were
    made by other means). ``record``: the lock file's record (pid, host, since, until...), {} if none."""

    state: str
    record: Mapping[str, Any] = field(default_factory=dict)


def status(folder: str | Path) -> RunStatus:
    """Read how the run in ``folder`` ended, or that it has not (see :class:`RunStatus`).

    Folders written before runs recorded their end read as well: their lock file holds the start only
    (pid, host, since), so a dead process there is a finished run if it wrote its summary and
    ``unfinished`` if not; a folder without a lock file is a run of splitfed when its summary or its
    checkpoint is splitfed's, and hand-made if neither."""
    folder = Path(folder)
    lock, summary = folder / LOCK, folder / SUMMARY
    try:
        rec = read_record(lock.read_bytes())
    except OSError:
        rec = {}
    if rec.get("state") in ENDS or not alive(rec):  # the record is no live run's: is a run starting there?
        starting = _starting(lock)
        if starting and not same_process(starting.get("pid", 0), rec):  # (not the run there, winding down)
            return RunStatus("running", starting)
    if "pid" not in rec:  # no lock file, or an empty one (a refused claim creates it and writes nothing)
        if summary.is_file():
            return RunStatus("finished" if _splitfeds_summary(summary) else "hand-made")
        return RunStatus("unfinished" if (folder / checkpoint.FILENAME).is_file() else "hand-made")
    state = rec.get("state")
    if state in ENDS:
        if state != "finished" and _summary_since(folder):  # written again since: a resume with nothing to do
            return RunStatus("finished", rec)
        return RunStatus(str(state), rec)
    live = alive(rec)
    if live:
        return RunStatus("running", rec)
    if "process" not in rec:  # an older splitfed's record, which never records an end: its summary is its end
        return RunStatus("finished" if summary.is_file() else "unknown" if live is None else "unfinished", rec)
    if _summary_since(folder):  # killed after it wrote its summary (written last), before it recorded its end
        return RunStatus("finished", rec)
    return RunStatus("unknown" if live is None else "crashed", rec)


def _starting(lock: Path) -> dict[str, Any]:
    """The process that holds ``lock`` while its record is still the run's before it (a resume reserves the
    folder while Ray starts, and records itself once its run claims it): ``pid``, ``host``, ``since`` (its
    process's start) and ``starting``; {} when nobody holds it."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return {}
    try:
        pid = held_by(fd)
    finally:
        os.close(fd)
    if pid is None:
        return {}
    held: dict[str, Any] = {"host": socket.gethostname(), "starting": True}
    if pid:
        import psutil

        held["pid"] = pid
        with contextlib.suppress(psutil.Error, ValueError, OverflowError):
            held["since"] = time.strftime(TIME, time.localtime(psutil.Process(pid).create_time()))
    return held


def _summary_since(folder: Path) -> bool:
    """Whether ``summary.json`` was written after the lock file's record, and sums up every row of the
    metrics: not one left from before a resume that went on to train more rounds."""
    try:
        if (folder / SUMMARY).stat().st_mtime_ns < (folder / LOCK).stat().st_mtime_ns:
            return False
        summary = json.loads((folder / SUMMARY).read_text())
        if not (folder / METRICS).is_file():
            return False
        rows = rows_kept(folder)
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("rounds") == rows


def _splitfeds_summary(path: Path) -> bool:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and "settings" in obj and "rounds" in obj  # what metrics.summarise writes


def alive(rec: Mapping[str, Any]) -> bool | None:
    """Whether the process that wrote ``rec`` is alive (None: it ran on another host, so it cannot be told)."""
    if rec.get("host") != socket.gethostname():
        return None
    pid = rec.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if rec.get("process"):
        return identity(pid) == rec["process"]
    import psutil

    try:  # a record without the process's identity (an older splitfed's): a process with that pid, started by then
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and p.create_time() <= time.mktime(
            time.strptime(str(rec.get("since")), TIME)) + 2
    except (psutil.Error, ValueError, OverflowError):
        return False


def identity(pid: int) -> str:
    """Which process ``pid`` is: on Linux the boot and the clock tick it started at (a clock set since, or a
    pid taken again by another process, changes neither, and a process ended reads as ""); elsewhere its
    start time. "" where there is no live process of that pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except FileNotFoundError:
        if Path("/proc/self/stat").is_file():
            return ""  # Linux: no such process
    except OSError:
        return ""
    else:
        fields = stat.rsplit(")", 1)[-1].split()  # after the command's name, which may hold spaces
        return "" if fields[0] in ("Z", "X") else f"{boot}:{fields[19]}"
    import psutil

    try:
        p = psutil.Process(pid)
        return "" if p.status() == psutil.STATUS_ZOMBIE else f"{p.create_time():.3f}"
    except psutil.Error:
        return ""
