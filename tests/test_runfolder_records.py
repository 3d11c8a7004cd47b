"""What a run folder's record says when its disk is full, while a resume starts, and of a lock file or an out
that cannot be used.

A run stopped by a full disk must record how it ended where its start record was (a new file does not fit):
read as a kill otherwise. While a resume starts (Ray), its folder is held but still holds the record of the
run before it: ``status`` and a second run's refusal must say that a process holds it, and which.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from splitfed.errors import ConfigError
from splitfed.flower import runfolder, runstatus
from splitfed.flower.metrics import METRICS
from splitfed.report.runs import load_run, run_notes

ROOT = Path(__file__).resolve().parent.parent
ROW = '{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n'
FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """No new file fits: the end record's atomic write (a new file put in place) fails as on a full disk."""
    def full(path: object, text: object) -> None:
        raise FULL
    monkeypatch.setattr(runfolder, "write_atomic", full)


def _claim_and_end(folder: Path, error: BaseException | None) -> int:
    """A run that keeps round 1, then ends (by ``error``, or finished); the lock file's inode while it ran."""
    with runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text(ROW)
        ino = (folder / runfolder.LOCK).stat().st_ino
        if error is not None:
            raise error
    return ino


def test_a_run_that_the_full_disk_stopped_records_that_it_failed_in_its_start_records_place(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    _disk_full(monkeypatch)
    with pytest.raises(OSError):
        _claim_and_end(folder, FULL)
    lock = folder / runfolder.LOCK
    rec = json.loads(lock.read_text())
    assert (rec["state"], rec["error"], rec["error_type"], rec["pid"]) == (
        "failed", "[Errno 28] No space left on device", "OSError", os.getpid())
    assert lock.read_text() == json.dumps(rec) + "\n"  # the start record's padding is gone
    st = runstatus.status(folder)
    assert st.state == "failed"
    notes = run_notes(load_run(folder))
    assert notes == [f"{folder} failed at {rec['until']}: [Errno 28] No space left on device (1 round kept)"]


def test_a_run_that_finished_on_a_full_disk_records_its_end_in_the_held_file(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    _disk_full(monkeypatch)
    with runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text(ROW)
        ino = (folder / runfolder.LOCK).stat().st_ino
        assert (folder / runfolder.LOCK).stat().st_size == runfolder.ROOM  # room made at the start
    assert (folder / runfolder.LOCK).stat().st_ino == ino  # written in place: no new file
    assert json.loads((folder / runfolder.LOCK).read_text())["state"] == "finished"
    assert runstatus.status(folder).state == "finished"


def test_an_end_record_written_in_place_is_never_torn(tmp_path, monkeypatch):
    """A crash between the in-place writes (here the second refused) leaves the start record, whole: the run
    reads as one that recorded no end, never as an unreadable record."""
    folder = tmp_path / "run"
    _disk_full(monkeypatch)
    writes: list[int] = []
    real = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if writes:  # the end record's second write: the crash
            raise FULL
        writes.append(offset)
        return real(fd, data, offset)

    with runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text(ROW)
        start = json.loads((folder / runfolder.LOCK).read_text())
        monkeypatch.setattr(runfolder.os, "pwrite", pwrite)
    assert writes and writes[0] > 0  # the tail went first, past the start record
    assert runstatus.read_record((folder / runfolder.LOCK).read_bytes()) == start
    assert (folder / runfolder.LOCK).read_bytes().rstrip().endswith(b"}")


def test_a_long_error_is_cut_to_the_room_of_the_start_record(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    _disk_full(monkeypatch)
    with pytest.raises(RuntimeError):
        _claim_and_end(folder, RuntimeError("x" * 10000))
    data = (folder / runfolder.LOCK).read_bytes()
    rec = json.loads(data)
    assert rec["state"] == "failed" and rec["error"].endswith("x...") and len(data) <= runfolder.ROOM
    assert runstatus.status(folder).state == "failed"


def test_with_room_on_the_disk_the_end_record_is_a_new_file_put_in_place(tmp_path):
    folder = tmp_path / "run"
    ino = _claim_and_end(folder, None)
    lock = folder / runfolder.LOCK
    assert lock.stat().st_ino != ino  # atomic, as before
    assert json.loads(lock.read_text())["state"] == "finished" and lock.read_text().endswith("}\n")


# ---------------------------------------------------------------- a folder held while its resume starts


def _stopped_run(folder: Path) -> dict:
    folder.mkdir(parents=True)
    (folder / METRICS).write_text(ROW)
    old = {"pid": 424242, "host": socket.gethostname(), "since": "2020-01-01 00:00:00", "process": "gone:1",
           "state": "stopped", "signal": "SIGINT", "until": "2020-01-01 00:01:00"}
    (folder / runfolder.LOCK).write_text(json.dumps(old) + "\n")
    return old


def _elsewhere(code: str) -> str:
    return subprocess.run([sys.executable, "-c", "from splitfed.flower import runfolder, runstatus\n" + code], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_folder_held_while_its_resume_starts_reads_as_running_with_the_holder(tmp_path):
    folder = tmp_path / "run"
    old = _stopped_run(folder)
    assert runstatus.status(folder).state == "stopped"
    with runfolder.reserve(folder, resume=True, overwrite=False):
        seen = _elsewhere(f"s = runstatus.status({str(folder)!r}); print(s.state, s.record['pid'], "
                          "s.record['starting'])")
        st = runstatus.status(folder)
        note = run_notes(load_run(folder))[0]
    assert seen == f"running {os.getpid()} True"
    assert (st.record["pid"], st.record["host"]) == (os.getpid(), socket.gethostname())
    assert note.startswith(f"{folder} is starting again (pid {os.getpid()} on {socket.gethostname()}, started ")
    assert note.endswith("): 1 round so far"), note
    assert json.loads((folder / runfolder.LOCK).read_text()) == old  # the record the resume needs, untouched
    assert runstatus.status(folder).state == "stopped"  # let go: as it was


def test_a_second_run_is_told_which_process_holds_the_folder_while_it_starts(tmp_path):
    folder = tmp_path / "run"
    _stopped_run(folder)
    with runfolder.reserve(folder, resume=True, overwrite=False):
        said = _elsewhere(f"from splitfed.errors import ConfigError\ntry:\n    runfolder.check({str(folder)!r}, "
                          "resume=True, overwrite=False)\nexcept ConfigError as e:\n    print(e)")
    assert said == (f"run folder {folder} is in use by another run (pid {os.getpid()} on {socket.gethostname()}, "
                    "still starting); wait for it to end or choose another out")


# ---------------------------------------------------------------- a lock file or an out that cannot be used


@pytest.mark.parametrize("how", ["check", "claim", "reserve"])
def test_a_lock_file_that_is_a_folder_is_named_with_what_to_do(tmp_path, how):
    folder = tmp_path / "run"
    (folder / runfolder.LOCK).mkdir(parents=True)
    (folder / METRICS).write_text(ROW)
    said = (f"cannot use run folder {folder}: its lock file {folder / runfolder.LOCK} is a folder (splitfed makes "
            "a file there); remove it, or choose another out")
    with pytest.raises(ConfigError) as e:
        if how == "check":
            runfolder.check(folder, resume=True, overwrite=False)
        else:
            with getattr(runfolder, how)(folder, resume=True, overwrite=False):
                pytest.fail("held")
    assert str(e.value) == said


@pytest.mark.parametrize("link", ["out", "parent"])
def test_a_dangling_symbolic_link_as_out_is_named_with_its_missing_target(tmp_path, link):
    (tmp_path / "l").symlink_to(tmp_path / "gone" / "x")
    folder = tmp_path / "l" if link == "out" else tmp_path / "l" / "run"
    said = (f"run folder {folder}: {tmp_path / 'l'} is a symbolic link to a missing {tmp_path / 'gone' / 'x'}; "
            "make that folder, or choose another out")
    with pytest.raises(ConfigError) as e:
        runfolder.check(folder, resume=False, overwrite=False)
    assert str(e.value) == said
    with pytest.raises(ConfigError) as e, runfolder.claim(folder, resume=False, overwrite=False):
        pytest.fail("held")
    assert str(e.value) == said
    assert not (tmp_path / "gone").exists()
