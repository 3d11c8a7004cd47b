"""A run folder belongs to one run at a time, and a new run never writes over an old one unasked.

Two processes writing one folder interleave their rounds in ``metrics.jsonl`` and
replace each other's checkpoint; a fresh run into a folder that holds a finished
one would truncate its metrics. So a run *claims* its folder for its whole life
with an advisory lock (``flock``, which the kernel drops when the process dies,
even by SIGKILL: a crashed run never leaves a stale lock behind), and a fresh run
refuses a folder that holds a run unless told to replace it (``overwrite``).
``--resume`` continues the run that is there.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.metrics import METRICS, SUMMARY, read_rows

LOCK = ".splitfed.lock"
RUN_FILES = (METRICS, SUMMARY, checkpoint.FILENAME)  # what a run writes, and ``overwrite`` removes


def held_run(folder: str | Path) -> str:
    """What run ``folder`` holds, in words ("" if none): its finished rounds, or its files.

    A run stopped before its first round ended leaves an empty ``metrics.jsonl`` and no
    checkpoint: nothing to resume and nothing to lose, so that folder holds no run."""
    folder = Path(folder)
    metrics = folder / METRICS
    rounds = sum(1 for line in metrics.read_text(errors="replace").splitlines() if line.strip()) \
        if metrics.is_file() else 0
    if rounds:
        return f"{rounds} finished round(s)"
    return ", ".join(name for name in (SUMMARY, checkpoint.FILENAME) if (folder / name).is_file())


def check(folder: str | Path, resume: bool, overwrite: bool) -> None:
    """Refuse now, before anything starts, what :func:`claim` would refuse; creates nothing."""
    folder = Path(folder)
    _usable(folder)
    if not folder.is_dir():
        return
    _refuse_held(folder, resume, overwrite)
    if resume and (folder / METRICS).is_file():
        read_rows(folder / METRICS)  # a damaged metrics file is named now, not after Ray has started
    lock = folder / LOCK
    if lock.is_file():
        fd = os.open(lock, os.O_RDONLY)
        try:
            _lock(fd, folder)
        finally:
            os.close(fd)  # closing drops the probe's lock


@contextmanager
def claim(folder: str | Path, resume: bool, overwrite: bool) -> Iterator[Path]:
    """Hold ``folder`` for one run: refused if another process holds it, or if it holds a run that
    this one neither resumes nor replaces (``overwrite`` removes that run's files, once the lock is
    held)."""
    folder = Path(folder)
    _usable(folder)
    new = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"cannot write run folder {folder}: {e.strerror or e}") from None
    held = False
    try:
        _lock(fd, folder)
        held = True
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        _refuse_held(folder, resume, overwrite)
        if overwrite and not resume:
            for name in RUN_FILES:
                (folder / name).unlink(missing_ok=True)
        for name in RUN_FILES:  # what a writer killed mid-write left: with the lock held, no writer is alive
            for tmp in folder.glob(f".{name}.*.tmp"):
                tmp.unlink(missing_ok=True)
        yield folder
    finally:
        try:
            if held and not held_run(folder):
                _tidy(folder, new)
        finally:
            os.close(fd)  # the lock goes with the descriptor


def _tidy(folder: Path, new: bool) -> None:
    """A run that ended before any round finished (refused, failed or stopped in round 1) leaves nothing:
    no empty metrics file, no lock file, and no folder if the run made it. The lock file goes while it
    is still held: a process that opened it just before fails to lock it, and one that comes after
    makes a new one."""
    metrics = folder / METRICS
    if metrics.is_file() and metrics.stat().st_size == 0:
        metrics.unlink()
    (folder / LOCK).unlink(missing_ok=True)
    if new:
        with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
            folder.rmdir()


def _usable(folder: Path) -> None:
    for p in (folder, *folder.parents):
        if p.exists() and not p.is_dir():
            raise ConfigError(f"run folder {folder}: {p} is a file, not a folder")


def _refuse_held(folder: Path, resume: bool, overwrite: bool) -> None:
    if resume or overwrite:
        return
    held = held_run(folder)
    if held:
        resumable = f"continue it with --resume {folder}, " if (folder / checkpoint.FILENAME).is_file() else ""
        raise ConfigError(f"run folder {folder} already holds a run ({held}); {resumable}replace it with "
                          "--overwrite (run config: overwrite = true), or choose another out")


def _lock(fd: int, folder: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"run folder {folder} is in use by another run ({_holder(fd)}); wait for it to end "
                          "or choose another out") from None


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not said which"
