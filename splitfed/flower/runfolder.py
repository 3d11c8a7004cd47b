"""A run folder belongs to one run at a time, and a new run never writes over an old one unasked.

Two processes writing one folder interleave their rounds in ``metrics.jsonl`` and
replace each other's checkpoint; a fresh run into a folder that holds a finished
one would truncate its metrics. So a run *claims* its folder for its whole life
with an advisory lock (``flock``, which the kernel drops when the process dies,
even by SIGKILL: a crashed run never leaves a stale lock behind), and a fresh run
refuses a folder that holds a run unless told to replace it (``overwrite``).
``--resume`` continues the run that is there.

The lock file is also the run's record of itself, for ``splitfed report``: the run
writes who it is when it starts (pid, host, the process's start, so that a pid taken
again by another process is not taken for it), and how it ended when it ends
(``finished``, ``stopped`` by a signal, or ``failed`` with its error), replacing
the file atomically (on a full disk, in the room its start record kept). A run that
has a start and no end is still running if its process is, and crashed (SIGKILL, out
of memory, power loss) if not: :func:`~splitfed.flower.runstatus.status` reads it.
A claimer checks that the file it locked is still the one at the path (the end
record and :func:`_tidy` replace or remove it while it is held), so two runs never
hold one folder through two files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitfed.errors import ConfigError, Terminated
from splitfed.flower import checkpoint
from splitfed.flower.metrics import METRICS, SUMMARY, rows_kept, run_rows
from splitfed.flower.runstatus import (
    ENDS,
    LOCK,
    TIME,
    alive,
    held_by,
    identity,
    read_record,
    same_process,
)
from splitfed.jsonio import dumps, sync_folder, write_atomic

RUN_FILES = (METRICS, SUMMARY, checkpoint.FILENAME)  # what a run writes, and ``overwrite`` removes (:func:`outputs` too)
REPORT = "report"  # where ``splitfed report RUN`` writes its report by default: inside the run folder
ROOM = 4096  # bytes a start record is padded to (a file system block): its end record fits there on a full disk

_failures: dict[Path, str] = {}  # folder -> why its run fails, said from outside it (:func:`failed_elsewhere`)
_signalled: dict[Path, int] = {}  # folder -> the signal that stopped its run (:func:`recording_stops`)
_active: dict[Path, tuple[int, dict[str, Any]]] = {}  # folder -> (held lock file, start record) of runs held now
_reserved: dict[Path, Reservation] = {}  # folder -> this process's reservation of it (:func:`reserve`)
_reserving = threading.Lock()  # a reservation is taken over (or let go) once, by one thread
_made: dict[Path, list[Path]] = {}  # folder -> the folders :func:`fresh` made for it, while no run has held it


@dataclass(frozen=True, eq=False)
class Reservation:
    """What :func:`reserve` hands its run (the object itself is the token): the held lock file, whether the
    reservation made the folder, and the reserving thread (which may take it over without the token)."""

    fd: int
    new: bool
    thread: threading.Thread


def held_run(folder: str | Path) -> str:
    """What run ``folder`` holds, in words ("" if none): its finished rounds, or its files.

    A run stopped before its first round ended leaves an empty ``metrics.jsonl`` (or, cut short by a crash
    or a full disk, round 1's row in part) and no checkpoint: nothing to resume and nothing to lose, so that
    folder holds no run."""
    folder = Path(folder)
    rounds = rows_kept(folder, cut=False)
    if rounds:
        return f"{rounds} finished round(s)"
    return ", ".join(name for name in (SUMMARY, checkpoint.FILENAME) if (folder / name).is_file())


def check(folder: str | Path, resume: bool, overwrite: bool, reservation: Reservation | None = None) -> None:
    """Refuse now, before anything starts, what :func:`claim` would refuse; leaves nothing behind."""
    folder = Path(folder)
    _usable(folder)
    _writable(folder)
    if not folder.is_dir():
        return
    # the lock first: a folder another run holds is refused as in use, whatever it holds (the advice of the
    # refusals below, --resume or --overwrite, would be refused as well while that run lives)
    lock = folder / LOCK
    if lock.is_dir():
        raise ConfigError(_lock_is_folder(folder))
    if lock.is_file() and not _may_take(_reserved.get(folder.resolve()), reservation):  # this run's: held
        fd = os.open(lock, os.O_RDONLY)
        try:
            _lock(fd, folder)
        finally:
            os.close(fd)  # closing drops the probe's lock
    _refuse_held(folder, resume, overwrite)
    if overwrite and not resume:
        _replaceable(folder)
    if resume and (folder / METRICS).is_file():
        run_rows(folder / METRICS)  # a damaged metrics file is named now, not after Ray has started


@contextmanager
def claim(folder: str | Path, resume: bool, overwrite: bool,
          reservation: Reservation | None = None) -> Iterator[Path]:
    """Hold ``folder`` for one run: refused if another run (of any process) holds it, or if it holds a run that
    this one neither resumes nor replaces (``overwrite`` removes that run's files, and the figures and
    report made of it: :func:`outputs`, once the lock is held). The lock file records the run's start once it is accepted, and how it ended when it ends
    (see the module docstring); a refused claim leaves the record of the run that is there. A folder this
    process reserved (:func:`reserve`) is taken over by that run's claim only (``reservation``, or see
    :func:`_may_take`)."""
    folder = Path(folder)
    _usable(folder)
    reserved = _take_over(folder, reservation)
    fd, new = (reserved.fd, reserved.new) if reserved is not None else _open(folder)
    entered = False
    end: dict[str, Any] = {}
    key = folder.resolve()
    try:
        _refuse_held(folder, resume, overwrite)
        # the run that is there, if any: its record, and when it was written (``status`` compares it with the
        # summary's time: a record put back must keep it)
        before, kept, written = read_record(os.pread(fd, 65536, 0)), _footprint(folder), os.fstat(fd).st_mtime_ns
        if overwrite and not resume and not new:
            _remove_run(folder)
        for name in (*RUN_FILES, LOCK):  # what a writer killed mid-write left: with the lock held, none is alive
            for tmp in folder.glob(f".{name}.*.tmp"):
                tmp.unlink(missing_ok=True)
        start = _start_record()
        data = dumps(start).encode().ljust(ROOM)  # room for the end record, where a full disk leaves none
        os.pwrite(fd, data, 0)  # in place, then cut to length: the held file cannot be replaced, and a
        os.ftruncate(fd, len(data))  # reader sees the old record or the new one (see read_record)
        entered = True
        _active[key] = (fd, start)
        try:
            yield folder
        except BaseException as e:
            end = {**start, **_ended_by(e, _failures.get(key), _signalled.get(key))}
            raise
        else:
            end = {**start, "state": "finished"}
    finally:
        _active.pop(key, None)
        _failures.pop(key, None)
        _signalled.pop(key, None)
        try:
            if not held_run(folder):
                _tidy(folder, new)
            elif entered:
                record = {**end, "until": time.strftime(TIME)}
                back = end.get("state") != "finished" and "pid" in before and _footprint(folder) == kept
                if back:
                    record = before  # it kept nothing (a resume refused at its start): the run there is as it was
                with contextlib.suppress(OSError):  # a disk that fails now: the run's own files are written
                    _write_end(folder, fd, record)
                    if back:
                        os.utime(folder / LOCK, ns=(written, written))
        finally:
            os.close(fd)  # the lock goes with the descriptor


def _write_end(folder: Path, fd: int, record: dict[str, Any]) -> None:
    """Write a run's end ``record``: a new file put atomically in place of the held lock file where the disk has
    room, else (a full disk, often what stopped the run) in the held file's own bytes, which the start record
    padded (:data:`ROOM`): a lost end would read as a kill (``crashed``). The end record is the start record
    with more keys: its tail goes after the start's closing brace first, then one byte swaps that brace for a
    comma, so a reader (or a crash) sees the start record or the whole end, never a torn record."""
    text = dumps(record) + "\n"
    try:
        write_atomic(folder / LOCK, text)
        return
    except OSError:
        pass
    room = os.fstat(fd).st_size
    if len(text.encode()) > room and isinstance(record.get("error"), str):  # the error cut to what fits
        cut = record["error"][:max(0, len(record["error"]) - (len(text.encode()) - room) - 3)] + "..."
        text = dumps({**record, "error": cut}) + "\n"
    data, old = text.encode(), os.pread(fd, room, 0).rstrip()
    brace = len(old) - 1  # where the record there ends
    if old.endswith(b"}") and data[:brace] == old[:brace] and data[brace:brace + 1] == b",":
        os.pwrite(fd, data[brace + 1:], brace + 1)  # past the brace: the record there still reads as it was
        os.fsync(fd)
        os.pwrite(fd, b",", brace)
    else:  # not an extension of the record there (a record put back): written over it
        os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


@contextmanager
def reserve(folder: str | Path, resume: bool, overwrite: bool) -> Iterator[Reservation]:
    """Hold ``folder``'s lock from before a run's slow start (``splitfed simulate``'s Ray and tiers) until the
    run's :func:`claim`, in this process, takes it over: a second run into the folder, of this process or
    another, is refused at once, not once it has started its own. Refuses what :func:`check` refuses; the
    run's files are left to the claim (``overwrite`` removes nothing here: a start that fails leaves the old
    run whole), and a run that never claims leaves what a claim refused leaves. Yields the token the run's
    claim takes it over with (``claim(..., reservation=...)``)."""
    folder = Path(folder)
    check(folder, resume, overwrite)
    fd, new = _open(folder)
    key = folder.resolve()
    mine = Reservation(fd, new, threading.current_thread())
    with _reserving:
        _reserved[key] = mine
    try:
        yield mine
    finally:
        with _reserving:  # not taken over by a claim (then another run of this process may hold it by now)
            kept = _reserved.get(key) is mine
            if kept:
                del _reserved[key]
        if kept:
            try:
                if not held_run(folder):
                    _tidy(folder, new)
            finally:
                os.close(fd)


def _may_take(held: Reservation | None, token: Reservation | None = None) -> bool:
    """Whether a claim (or check) here is the reserving run's own: it names the reservation (``token``:
    ``splitfed simulate`` hands it to its ServerApp, which runs in a thread of Flower's), or, named none, runs
    in the reserving thread. Any other thread's run (a notebook's, a thread pool's) is another run."""
    if held is None:
        return False
    if token is not None:
        return token is held
    return threading.current_thread() is held.thread


def _take_over(folder: Path, token: Reservation | None) -> Reservation | None:
    """The reservation of ``folder`` that this claim takes over (None: the folder is not reserved here, or no
    more); refused when it is another run's."""
    with _reserving:
        held = _reserved.get(folder.resolve())
        if held is None:
            return None
        if not _may_take(held, token):
            raise ConfigError(f"run folder {folder} is in use by another run of this process (held for it from "
                              "before its start); wait for it to end or choose another out")
        del _reserved[folder.resolve()]
        return held


def fresh(stem: str | Path) -> Path:
    """Make a new run folder, ``stem`` or ``stem-2``, ``stem-3``... (the first not there), and its parents it
    lacks (durably). Made when chosen: two processes choosing at once (started in one second) never choose
    one folder. The run that takes it holds it as a folder it made (an empty one goes when the run ends:
    :func:`_tidy`); one that never does removes it with :func:`unmake`."""
    stem = Path(stem)
    made = _missing(stem.parent)
    try:
        stem.parent.mkdir(parents=True, exist_ok=True)
        path, n = stem, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:  # taken, perhaps since it was looked at: the next
                n += 1
                path = stem.with_name(f"{stem.name}-{n}")
        made.append(path.absolute())
        for d in made:  # its name in its parent is as durable as what the run keeps in it
            sync_folder(d.parent)
    except OSError as e:
        raise ConfigError(f"cannot write run folder {stem}: {e.strerror or e}") from None
    _made[path.resolve()] = made
    return path


def unmake(folder: str | Path) -> None:
    """Remove what :func:`fresh` made for ``folder``, where no run has held it since and nothing was put there
    (a run refused before it started: its settings, or another run's lock); any other folder is left as is."""
    for d in reversed(_made.pop(Path(folder).resolve(), [])):
        with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
            d.rmdir()


def _open(folder: Path) -> tuple[int, bool]:
    """Make ``folder`` (durably) and take its lock: the held descriptor, and whether the folder is new (or made
    for this run by :func:`fresh`)."""
    key = folder.resolve()
    new = key in _made or not folder.exists()
    made = _missing(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for d in made:  # its name in its parent is as durable as what the run keeps in it
            sync_folder(d.parent)
    except OSError as e:
        raise ConfigError(f"cannot write run folder {folder}: {e.strerror or e}") from None
    fd = _take(folder)
    _made.pop(key, None)  # held now: what becomes of it is the holder's (_tidy)
    return fd, new


def outputs(folder: str | Path) -> list[Path]:
    """What splitfed made in ``folder`` of the run there, beside the run's own files (:data:`RUN_FILES`): the
    figures ``splitfed simulate`` draws when a run ends, and the report ``splitfed report FOLDER`` writes by
    default in ``FOLDER/report`` (its figures, ``summary.md``, ``summary.csv`` and ``rounds.csv``). Those
    that are there now, by their names: a file of any other name (the user's) is never one, nor a folder."""
    from splitfed.report.plots import run_plot_files, standard_plot_files
    from splitfed.report.summary import csv_files

    def figures(d: Path) -> list[Path]:  # the standard views, and those that depend on the runs shown
        return [*standard_plot_files([], d), *run_plot_files(d)]

    folder = Path(folder)
    found = figures(folder)
    report = folder / REPORT
    if report.is_dir() and not report.is_symlink():  # (a link: a folder elsewhere, not the run's)
        found += [*figures(report), report / "summary.md", *csv_files(report)]
    return [p for p in dict.fromkeys(found) if p.is_symlink() or p.is_file()]


def _replaceable(folder: Path) -> None:
    """Refuse to replace the run in ``folder`` when a run's file there is a folder: it could not be removed,
    nor written."""
    for name in RUN_FILES:
        p = folder / name
        if p.is_dir() and not p.is_symlink():
            raise ConfigError(f"cannot replace the run in {folder}: {p} is a folder, not a file of a run (move it "
                              "away, or choose another out)")


def _remove_run(folder: Path) -> None:
    """``overwrite``: remove the run ``folder`` holds, and what splitfed made of it (:func:`outputs`), so that
    nothing of the old run is seen beside the new one's rows. Checked first; the figures and report go
    before the run's own files, so a disk that refuses a removal leaves the old run whole; the user's
    files stay, and so does ``report`` if it holds any."""
    _replaceable(folder)
    old = outputs(folder)
    report = folder / REPORT
    for p in [*old, *(folder / name for name in RUN_FILES)]:
        try:
            p.unlink(missing_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot replace the run in {folder}: cannot remove {p}: {e.strerror or e}") from None
    if any(p.parent == report for p in old):
        with contextlib.suppress(OSError):  # not empty: the user's files are there
            report.rmdir()


def _footprint(folder: Path) -> tuple[tuple[int, int] | None, ...]:
    """What a run leaves in ``folder``: unchanged, the run kept nothing. By content for the metrics and the
    summary (a resume rewrites the metrics as they were: ``MetricsWriter.truncate_after``), by size and
    time for the checkpoint (written only when a round is kept)."""
    out: list[tuple[int, int] | None] = []
    for name in RUN_FILES:
        try:
            if name == checkpoint.FILENAME:
                st = (folder / name).stat()
                out.append((st.st_size, st.st_mtime_ns))
            else:
                data = (folder / name).read_bytes()
                out.append((len(data), zlib.crc32(data)))
        except OSError:
            out.append(None)
    return tuple(out)


def record_mark(folder: str | Path) -> tuple[bytes | None, tuple[tuple[int, int] | None, ...]]:
    """The folder's record and run files as they are now. A run that claims the folder rewrites its record (its
    own pid and start), and one that keeps a round or replaces a run changes its files: the same mark after a
    run was to start means it left no trace, and an end recorded there is an earlier run's."""
    folder = Path(folder)
    try:
        record: bytes | None = (folder / LOCK).read_bytes()
    except OSError:
        record = None
    return record, _footprint(folder)


def failed_elsewhere(folder: str | Path, why: str) -> None:
    """Say why the run in ``folder`` (held by this process) fails, when that is known outside it: the
    simulation engine died, and the ServerApp is then stopped for it (what it raises, "the run was stopped",
    is that stop's echo, not the cause). Said of a folder no run of this process holds now, it is nothing (that
    run has recorded its own end)."""
    key = Path(folder).resolve()
    if key in _active:
        _failures[key] = why


@contextmanager
def recording_stops() -> Iterator[None]:
    """While held, in the main thread: SIGINT and SIGTERM first write the end of every run this process holds
    (``stopped``, by that signal), then do what they did before. A deployment's ServerApp process ends under
    Flower's own handler, which runs its exit handlers and then ``os._exit``: the claim's own end is never
    written there. Elsewhere (a thread: ``splitfed simulate``'s ServerApp) nothing: the runner says it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {int(sig): signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        was = previous[signum]
        if was == signal.SIG_IGN:  # ignored before: the run goes on, and nothing is said of it
            return
        for key, (fd, start) in list(_active.items()):
            if key in _signalled:  # the stop's first signal is its cause (a Ctrl-C, then Flower's SIGTERM)
                continue
            _signalled[key] = signum
            data = dumps({**start, "state": "stopped", "signal": _signal_name(signum),
                          "until": time.strftime(TIME)}).encode()
            with contextlib.suppress(OSError):  # in place: the lock stays held while the process winds down
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
        if callable(was):
            was(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:  # the default: end as the signal ends a process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, was in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, was if was is not None else signal.SIG_DFL)


def stop_requested(signum: int | None) -> None:
    """Say that the runs this process holds now were asked to stop, by signal ``signum`` (``None``: say
    nothing). Each then records that it was stopped, however its end came (the ServerApp's stop, a round
    whose clients were stopped under it), not that it failed; a run claimed later is not concerned (a
    notebook's next run after a Ctrl-C'd one). The simulate runner says so from its signal handler; a
    :class:`KeyboardInterrupt` (Ctrl-C, and :class:`~splitfed.errors.Terminated` for SIGTERM) through a
    run says so by itself."""
    if signum is not None:
        for key in list(_active):
            _signalled.setdefault(key, signum)


def _ended_by(e: BaseException, why: str | None = None, signum: int | None = None) -> dict[str, Any]:
    from splitfed.cli import OUTPUT_CLOSED, output_gone

    if signum is not None:
        return {"state": "stopped", "signal": _signal_name(signum)}
    if why is not None and isinstance(e, Exception):  # failed_elsewhere: the cause, not the stop it made
        return {"state": "failed", "error": why, "error_type": "failed elsewhere"}
    if output_gone(e):  # a progress line its reader went away from (``| head``): stopped as the command is, by
        return {"state": "stopped", "reason": OUTPUT_CLOSED}  # no signal (Python ignores SIGPIPE: the write raised)
    if isinstance(e, KeyboardInterrupt):
        return {"state": "stopped", "signal": "SIGTERM" if isinstance(e, Terminated) else "SIGINT"}
    if not isinstance(e, Exception):  # SystemExit, GeneratorExit: ended on purpose, not by an error
        return {"state": "stopped", "signal": type(e).__name__}
    return {"state": "failed", "error": str(e) or type(e).__name__, "error_type": type(e).__name__}


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _start_record() -> dict[str, Any]:
    from splitfed import __version__

    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "since": time.strftime(TIME), "process": identity(pid),
            "splitfed": __version__}


def _take(folder: Path) -> int:
    """Open and lock ``folder``'s lock file: a descriptor holding the lock of the file now at its path. One
    locked after its holder replaced it (the end record) or removed it (:func:`_tidy`) is another file:
    it is let go and the path opened again."""
    path = folder / LOCK
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise ConfigError(_lock_is_folder(folder)) from None
        except OSError as e:
            raise ConfigError(f"cannot write run folder {folder}: {e.strerror or e}") from None
        try:
            _lock(fd, folder)
            mine = os.fstat(fd)
            now = os.stat(path)
            if (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino):
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise ConfigError(f"run folder {folder} is in use by another run (its lock file keeps changing); wait for "
                      "it to end or choose another out")


def _lock_is_folder(folder: Path) -> str:
    return (f"cannot use run folder {folder}: its lock file {folder / LOCK} is a folder (splitfed makes a file "
            "there); remove it, or choose another out")


def _tidy(folder: Path, new: bool) -> None:
    """A run that ended before any round finished (refused, failed or stopped in round 1) leaves nothing:
    no empty metrics file, no lock file, and no folder if the run made it. The lock file goes while it
    is still held: a process that opened it just before fails to lock it, and one that comes after
    makes a new one."""
    metrics = folder / METRICS
    if metrics.is_file() and not rows_kept(folder, cut=False):  # empty, or round 1's row cut short
        metrics.unlink()
    (folder / LOCK).unlink(missing_ok=True)
    if new:
        with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
            folder.rmdir()


def _usable(folder: Path) -> None:
    for p in (folder, *folder.parents):
        if p.is_symlink() and not p.exists():  # mkdir would say "File exists" of it
            raise ConfigError(f"run folder {folder}: {p} is a symbolic link to a missing {os.path.realpath(p)}; "
                              "make that folder, or choose another out")
        if p.exists() and not p.is_dir():
            raise ConfigError(f"run folder {folder}: {p} is a file, not a folder")


def _missing(folder: Path) -> list[Path]:
    """The folders ``folder.mkdir(parents=True)`` would make, outermost first."""
    missing = []
    p = folder.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    return missing[::-1]


def _writable(folder: Path) -> None:
    """Refuse a folder a run could not write, by writing there: the folder and the parents it lacks are made,
    take an empty file, and are removed again (permissions alone miss a read-only mount, or /proc)."""
    made: list[Path] = []
    try:
        for d in _missing(folder):
            d.mkdir()
            made.append(d)
        probe = folder / f".splitfed-probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write run folder {folder}: {e.strerror or e}") from None
    finally:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()


def _refuse_held(folder: Path, resume: bool, overwrite: bool) -> None:
    if resume or overwrite:
        return
    held = held_run(folder)
    if held:
        resumable = (folder / checkpoint.FILENAME).is_file()
        # each way on in both forms: a `flwr run` user sets the run config, a command's user the flag
        go_on = f"continue it with --resume {shlex.quote(str(folder))}, " if resumable else ""
        keys = "resume = true, or overwrite = true" if resumable else "overwrite = true"
        raise ConfigError(f"run folder {folder} already holds a run ({held}); {go_on}replace it with "
                          f"--overwrite, or choose another out (in a run config: {keys})")


def check_free(folder: str | Path, said: tuple[str, str, str] = ("run folder", "run", "out")) -> None:
    """Refuse ``folder`` (ConfigError, naming the holder) while a run or experiment holds its lock; a probe
    that takes nothing: the lock is let go at once. ``said``: what the refusal calls the folder, its holder and
    the option to change (an experiment's: its --out, held by a run or an experiment, which the record does not
    tell apart)."""
    lock = Path(folder) / LOCK
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # no lock file (or none readable): no holder to name
        return
    try:
        _lock(fd, Path(folder), said)
    finally:
        os.close(fd)  # closing drops the probe's lock


def _lock(fd: int, folder: Path, said: tuple[str, str, str] = ("run folder", "run", "out")) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        what, holder, option = said
        raise ConfigError(f"{what} {folder} is in use by another {holder} ({_holder(fd)}); wait for it to end "
                          f"or choose another {option}") from None


def _holder(fd: int) -> str:
    info: dict[str, Any] = {}
    try:
        info = read_record(os.pread(fd, 65536, 0))
        if info.get("state") in ENDS or alive(info) is False:  # the run there before, ended or killed (its
            raise KeyError("state")  # start record, no end): the holder (reserve()) has not said yet
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, KeyError, TypeError):
        pid = held_by(fd)
        if not pid:
            return "a process that has not said which"
        if same_process(pid, info):  # the run there winding down (a signal's stop), or its process's next run
            return f"pid {pid} on {info['host']}"
        return f"pid {pid} on {socket.gethostname()}, still starting"


def nothing_to_do(out: str, rounds: int, again: str, held: checkpoint.Checkpoint | None = None,
                  reservation: Reservation | None = None) -> dict[str, Any] | None:
    """A resume of the run in ``out`` up to round ``rounds`` that finds nothing to train: it says so (with how
    to train on: ``again``, the folder as the user named it) and returns the run's summary; None when there
    is a round to train. A run that ended part way stays unfinished (no ``summary.json`` is written: it marks
    a finished run), and the summary is of the run as it was recorded, not of the flags that asked. ``held``:
    the checkpoint the resume read (:func:`checkpoint.current`), not read again; ``reservation``: the folder's,
    when this process holds it for the run (:func:`reserve`)."""
    import sys

    from splitfed.flower.metrics import summarise, summary_again

    ckpt = checkpoint.current(out, held)
    done = ckpt.round
    if done < rounds:
        return None
    own = int(ckpt.settings.get("rounds", done))  # the rounds the run that is there was started for
    check(out, resume=True, overwrite=False, reservation=reservation)  # no other run writes there now
    if checkpoint.restore_row(out, ckpt):  # a crash between the checkpoint and its row: the summary counts it
        print(checkpoint.row_put_back(ckpt), file=sys.stderr)
    resume = shlex.quote(str(again))
    if done < own:
        print(f"nothing to do: {out} holds round {done} of its {own}, --rounds {rounds} asks for no more (to "
              f"train on: --resume {resume})", file=sys.stderr)
        rows = [r for r in run_rows(Path(out) / METRICS) if r["round"] <= done]
        return summarise(rows, ckpt.settings)
    print(f"nothing to do: {out} already holds round {done} of {rounds} (to train on: --resume {resume} "
          f"--rounds {done + 1} or more)", file=sys.stderr)
    return summary_again(out, done, ckpt.settings)
