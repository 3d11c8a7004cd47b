"""What a run folder's lock and record promise, pinned from the mutation run of ``splitfed/flower/runfolder.py``.

Whether the process holding a folder is judged alive (a live run's folder is never taken, a dead or zombie
one's reads crashed), how the holder of a busy folder is named, the overwrite-only checks, the freshness of
a summary against the lock record, the stop a signal records, and the end a closed output records. Real
child processes (``sleep``, a claiming Python) stand in for runs; nothing is mocked.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from splitfed.cli import OUTPUT_CLOSED
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder, runstatus
from splitfed.flower.metrics import METRICS, SUMMARY
from tests.test_runfolder import _holder

ROOT = Path(__file__).resolve().parent.parent
ROW = '{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n'
TIME = "%Y-%m-%d %H:%M:%S"


def _write_lock(folder: Path, rec: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / runfolder.LOCK).write_text(json.dumps(rec) + "\n")


def _wait_state(pid: int, letter: str) -> None:
    for _ in range(500):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == letter:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {letter}")


# ---------------------------------------------------------------- is the holder alive?


def test_a_run_killed_but_not_yet_reaped_by_its_parent_reads_crashed_not_running(tmp_path: Path) -> None:
    """A zombie is a dead run: its folder must read crashed (resumable), not still running."""
    folder = tmp_path / "run"
    p = _holder(folder)
    try:
        (folder / METRICS).write_text(ROW)
        assert runstatus.status(folder).state == "running"
        os.kill(p.pid, signal.SIGKILL)  # not waited on: a zombie until reaped
        _wait_state(p.pid, "Z")
        assert runstatus.status(folder).state == "crashed"
    finally:
        p.kill()
        p.wait()
    assert runstatus.status(folder).state == "crashed"


def test_the_lock_record_names_the_process_by_this_boot_and_its_start(tmp_path: Path) -> None:
    """The record's ``process`` is what tells a pid taken again from the run: this boot and a start tick."""
    folder = tmp_path / "run"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with runfolder.claim(folder, resume=False, overwrite=False):
        rec = json.loads((folder / runfolder.LOCK).read_text())
        assert rec["pid"] == os.getpid()
        b, _, tick = rec["process"].partition(":")
        assert b == boot and tick.isdigit() and int(tick) > 0
        assert runstatus.status(folder).state == "running"


def test_a_run_that_is_pid_1_of_its_container_reads_running(tmp_path: Path) -> None:
    """Pid 1 is a real process (a run started as a container's entry point), not an invalid pid."""
    folder = tmp_path / "run"
    rec = {"pid": 1, "host": socket.gethostname(), "since": time.strftime(TIME),
           "process": runstatus.identity(1)}
    assert rec["process"]
    _write_lock(folder, rec)
    (folder / METRICS).write_text(ROW)
    assert runstatus.status(folder).state == "running"


def _old_record(pid: int, since: float) -> dict:
    """An older splitfed's start record: no ``process``, so liveness goes by the pid's start time."""
    return {"pid": pid, "host": socket.gethostname(), "since": time.strftime(TIME, time.localtime(since))}


def test_an_older_record_is_its_live_process_when_that_started_at_most_two_seconds_after_it(
        tmp_path: Path) -> None:
    """``since`` is written in whole seconds after the process started; up to 2 s of slack is the same run."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        ct = psutil.Process(p.pid).create_time()
        for name, since in (("at", math.floor(ct)), ("late", math.ceil(ct) - 2)):  # ct - since in (1, 2]
            folder = tmp_path / name
            _write_lock(folder, _old_record(p.pid, since))
            (folder / METRICS).write_text(ROW)
            assert runstatus.status(folder).state == "running", name
    finally:
        p.kill()
        p.wait()


def test_an_older_record_is_not_a_process_that_started_more_than_two_seconds_after_it(tmp_path: Path) -> None:
    """A process with the pid started well after the record was written is another one: the run ended."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        ct = psutil.Process(p.pid).create_time()
        folder = tmp_path / "run"
        _write_lock(folder, _old_record(p.pid, math.ceil(ct) - 3))  # ct - since in (2, 3]
        (folder / METRICS).write_text(ROW)
        assert runstatus.status(folder).state == "unfinished"
    finally:
        p.kill()
        p.wait()


# ---------------------------------------------------------------- naming the holder of a busy folder


def _refusal_from_another_thread(folder: Path) -> str:
    said: list[str] = []

    def probe() -> None:
        try:
            runfolder.check(folder, resume=True, overwrite=False)
        except ConfigError as e:
            said.append(str(e))

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert said, "the held folder was not refused"
    return said[0]


@pytest.mark.parametrize("old", [
    {"pid": 424242, "host": "another-host", "since": "2020-01-01 00:00:00", "state": "finished"},
    {"pid": 2 ** 22 + 7, "host": socket.gethostname(), "since": "2020-01-01 00:00:00", "process": "gone:1"},
], ids=["ended-elsewhere", "crashed-here"])
def test_a_folder_reserved_before_its_run_said_who_it_is_does_not_name_the_run_that_was_there(
        tmp_path: Path, old: dict) -> None:
    """Between reserve() and the claim the lock file still holds the previous run's record: the refusal must
    not name that (ended or dead) run as the holder."""
    folder = tmp_path / "run"
    _write_lock(folder, old)
    with runfolder.reserve(folder, resume=True, overwrite=False):
        said = _refusal_from_another_thread(folder)
    assert f"is in use by another run (pid {os.getpid()} on {socket.gethostname()}, still starting)" in said, said
    assert str(old["pid"]) not in said


# ---------------------------------------------------------------- overwrite-only checks, leftovers


def test_a_resume_is_not_refused_for_what_only_an_overwrite_could_not_remove(tmp_path: Path) -> None:
    """A run file that is a folder stops ``--overwrite`` (it cannot be removed); a resume or a fresh run is
    not checked for it."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / checkpoint.FILENAME).mkdir()
    runfolder.check(folder, resume=True, overwrite=False)
    runfolder.check(folder, resume=False, overwrite=False)
    runfolder.check(folder, resume=True, overwrite=True)
    with pytest.raises(ConfigError, match="is a folder, not a file of a run"):
        runfolder.check(folder, resume=False, overwrite=True)


def test_an_overwrite_leaves_a_report_folder_linked_from_elsewhere_alone(tmp_path: Path) -> None:
    """``report`` as a link is a folder elsewhere, not this run's report: replacing the run removes nothing there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "summary.md").write_text("another run's report\n")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / METRICS).write_text(ROW)
    (folder / runfolder.REPORT).symlink_to(elsewhere, target_is_directory=True)
    assert not any(p.parent.name == runfolder.REPORT for p in runfolder.outputs(folder))
    with runfolder.claim(folder, resume=False, overwrite=True):
        pass
    assert (elsewhere / "summary.md").read_text() == "another run's report\n"


def test_a_run_whose_lock_file_was_removed_under_it_ends_without_error(tmp_path: Path) -> None:
    """A run that kept nothing tidies its lock file away; one already gone (the user emptied the folder) is
    no error of the run's."""
    folder = tmp_path / "run"
    with runfolder.claim(folder, resume=False, overwrite=False):
        (folder / runfolder.LOCK).unlink()
    assert not folder.exists()


# ---------------------------------------------------------------- is the summary the run's end?


def _ended_run(folder: Path, rows: int, state: str = "failed") -> None:
    folder.mkdir(parents=True)
    (folder / METRICS).write_text("".join(
        f'{{"round": {r}, "accuracy": 0.5, "sim_round_s": 1.0}}\n' for r in range(1, rows + 1)))
    _write_lock(folder, {"pid": 1, "host": socket.gethostname(), "since": "2020-01-01 00:00:00",
                         "process": "x:1", "state": state, "until": "2020-01-01 00:00:01"})


def test_a_summary_written_in_the_same_instant_as_the_end_record_is_the_runs_end(tmp_path: Path) -> None:
    """A coarse clock can stamp both alike: the summary is not older than the record, so it counts."""
    folder = tmp_path / "run"
    _ended_run(folder, rows=2)
    (folder / SUMMARY).write_text('{"rounds": 2}\n')
    t = (folder / runfolder.LOCK).stat().st_mtime_ns
    os.utime(folder / SUMMARY, ns=(t, t))
    assert runstatus.status(folder).state == "finished"


@pytest.mark.parametrize("summary", ['{"rounds": 1}\n', "[2]\n"], ids=["fewer-rounds", "not-an-object"])
def test_a_newer_summary_that_does_not_sum_up_the_rows_is_not_the_runs_end(tmp_path: Path, summary: str) -> None:
    folder = tmp_path / "run"
    _ended_run(folder, rows=2)
    (folder / SUMMARY).write_text(summary)
    t = (folder / runfolder.LOCK).stat().st_mtime_ns + 10**9
    os.utime(folder / SUMMARY, ns=(t, t))
    assert runstatus.status(folder).state == "failed"


def test_a_folder_without_a_lock_whose_summary_is_splitfeds_reads_finished(tmp_path: Path) -> None:
    """Before run folders were locked: splitfed's summary (settings and rounds) is the run's end."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / METRICS).write_text(ROW)
    (folder / SUMMARY).write_text('{"settings": {}, "rounds": 1}\n')
    assert runstatus.status(folder).state == "finished"


# ---------------------------------------------------------------- signals and a closed output


def test_the_first_signal_of_a_stop_is_recorded_in_place_and_the_previous_handler_still_runs(
        tmp_path: Path) -> None:
    """Ctrl-C then SIGTERM: the record says SIGINT (the cause), readable while the run is held, and the
    handlers there before still run."""
    folder = tmp_path / "run"
    calls: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in before:
        signal.signal(s, lambda signum, frame: calls.append(signum))
    try:
        with runfolder.claim(folder, resume=False, overwrite=False), runfolder.recording_stops():
            (folder / METRICS).write_text(ROW)
            mine = signal.getsignal(signal.SIGINT)
            assert callable(mine) and mine is not before[signal.SIGINT]
            try:
                mine(signal.SIGINT, None)
            except KeyboardInterrupt:
                pytest.fail("the handler there before was not run: the stop interrupted the run itself")
            rec = json.loads((folder / runfolder.LOCK).read_bytes())
            assert (rec["state"], rec["signal"]) == ("stopped", "SIGINT")
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
            rec = json.loads((folder / runfolder.LOCK).read_bytes())
            assert (rec["state"], rec["signal"]) == ("stopped", "SIGINT")
            assert runstatus.status(folder).state == "stopped"
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert calls == [signal.SIGINT, signal.SIGTERM]


def test_recording_stops_in_another_thread_changes_no_handler() -> None:
    """Handlers can only be set in the main thread: elsewhere it is nothing, and no error."""
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def run() -> None:
        with runfolder.recording_stops():
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before]


def test_a_ctrl_c_under_the_default_sigint_interrupts_the_run_rather_than_killing_it(tmp_path: Path) -> None:
    """SIGINT at SIG_DFL: the run is interrupted (KeyboardInterrupt, its end recorded), the process not killed."""
    folder = tmp_path / "run"
    code = textwrap.dedent(f"""
        import os, signal
        from splitfed.flower import runfolder
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            with runfolder.claim({str(folder)!r}, resume=False, overwrite=False), runfolder.recording_stops():
                open({str(folder / METRICS)!r}, "w").write({ROW!r})
                os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "interrupted"), r.stderr
    rs = runstatus.status(folder)
    assert (rs.state, rs.record.get("signal")) == ("stopped", "SIGINT")


def test_a_run_whose_output_reader_went_away_records_it_was_stopped_for_that(tmp_path: Path) -> None:
    """``| head`` ending: a BrokenPipeError on stdout is a stop by the user, not a failure."""
    folder = tmp_path / "run"
    code = textwrap.dedent(f"""
        import sys
        from splitfed.flower import runfolder
        with runfolder.claim({str(folder)!r}, resume=False, overwrite=False):
            open({str(folder / METRICS)!r}, "w").write({ROW!r})
            print("held", flush=True)
            sys.stdin.readline()
            while True:
                print("progress " * 100, flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "held"
    p.stdout.close()
    p.stdin.write("go\n")
    p.stdin.close()
    p.wait(timeout=60)
    rs = runstatus.status(folder)
    assert (rs.state, rs.record.get("reason"), rs.record.get("signal")) == ("stopped", OUTPUT_CLOSED, None), rs
