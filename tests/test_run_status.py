"""``splitfed report`` says what became of each run: finished, stopped, failed, crashed, still running, or a
folder no run of splitfed wrote (hand-made metrics).

Before, every folder without ``summary.json`` read "it did not finish, or is still running", whether it was
stopped by Ctrl-C, failed, killed by SIGKILL, still training, or made by hand. Runs here are real (the
in-process backend; a ``splitfed simulate`` stopped by Ctrl-C or SIGTERM reads stopped in
tests/test_signals.py); the crashed one is a real process
killed with SIGKILL mid-way; folders of older splitfed versions and hand-made ones are written as they were.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from splitfed.cli import main as cli
from splitfed.errors import Terminated
from splitfed.flower import runfolder, runstatus
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import METRICS, SUMMARY
from splitfed.report.runs import load_run, load_runs, run_notes, write_run

ROOT = Path(__file__).resolve().parent.parent
SMALL = RunSettings(rounds=3, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=1)
OLD_HEADERS = ["run", "mode", "tiers", "U-shape", "rounds", "final accuracy", "best accuracy", "sim time s", "mean sim round s",
               "activation MB", "weight MB", "wall s"]


def _train(folder: Path, progress=None, **changes) -> dict:  # type: ignore[no-untyped-def]
    from splitfed.sim.inprocess import train_inprocess

    return train_inprocess(SMALL.with_(out=str(folder), **changes), progress=progress)


def _report(capsys: pytest.CaptureFixture[str], *folders: Path) -> tuple[list[dict[str, str]], str, str]:
    """``splitfed report`` of ``folders``: its summary.csv rows, its stdout and its stderr."""
    out = folders[0].parent / "report"
    assert cli(["report", *map(str, folders), "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    return list(csv.DictReader((out / "summary.csv").open())), printed, err


def _stop_at(after: int):  # type: ignore[no-untyped-def]
    def progress(line: str) -> None:
        if line.startswith(f"round {after}/"):
            raise KeyboardInterrupt  # what Ctrl-C raises in the run's thread
    return progress


# ---------------------------------------------------------------- real runs


def test_a_finished_run_reads_finished_and_its_report_is_otherwise_as_before(tmp_path, capsys):
    done = tmp_path / "done"
    summary = _train(done)
    run = load_run(done)
    assert run.status == "finished" and run.finished and run_notes(run) == []
    record = json.loads((done / runfolder.LOCK).read_text())
    assert record["state"] == "finished" and record["pid"] == os.getpid() and record["until"]
    rows, printed, err = _report(capsys, done)
    assert err == ""  # nothing to say of a whole, finished run
    assert list(rows[0]) == [*OLD_HEADERS, "status"] and rows[0]["status"] == "finished"
    assert int(rows[0]["rounds"]) == summary["rounds"] == 3
    assert float(rows[0]["final accuracy"]) == summary["final_accuracy"]
    header = printed.splitlines()[0].split()
    assert header[-1] == "status" and printed.splitlines()[2].split()[-1] == "finished"
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "| status |" in md and "| finished |" in md and "## Notes" not in md


def test_a_stopped_and_a_failed_run_say_how_they_ended(tmp_path, capsys):
    stopped, terminated, failed = tmp_path / "stopped", tmp_path / "terminated", tmp_path / "failed"
    with pytest.raises(KeyboardInterrupt):
        _train(stopped, _stop_at(1))

    def sigterm(line: str) -> None:
        if line.startswith("round 2/"):
            raise Terminated  # SIGTERM, as splitfed's handlers raise it

    with pytest.raises(Terminated):
        _train(terminated, sigterm)

    def disk_on_fire(line: str) -> None:
        if line.startswith("round 2/"):
            raise RuntimeError("the disk is on fire")

    with pytest.raises(RuntimeError):
        _train(failed, disk_on_fire)
    assert [load_run(f).status for f in (stopped, terminated, failed)] == ["stopped", "stopped", "failed"]
    rows, _, err = _report(capsys, stopped, terminated, failed)
    assert [r["status"] for r in rows] == ["stopped", "stopped", "failed"]
    assert [r["rounds"] for r in rows] == ["1", "2", "2"]
    assert f"note: {stopped} was stopped by Ctrl-C (SIGINT) at " in err and ", before its end (1 round kept)" in err
    assert f"note: {terminated} was stopped by SIGTERM at " in err
    assert f"note: {failed} failed at " in err and ": the disk is on fire (2 rounds kept)" in err
    assert "did not finish, or is still running" not in err


def test_a_run_stopped_by_the_simulate_runners_signal_reads_stopped_whatever_its_end_raised(tmp_path):
    """The runner's handler only sets the stop flags; what the run then raises (the ServerApp's RunStopped,
    a round whose clients were stopped) is the stop's echo, not a failure."""
    folder = tmp_path / "run"
    with pytest.raises(RuntimeError), runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text('{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n')
        runfolder.stop_requested(signal.SIGTERM)
        raise RuntimeError("round 2: 0 of 2 clients finished")
    st = runstatus.status(folder)
    assert (st.state, st.record["signal"]) == ("stopped", "SIGTERM")


def _holder_code(folder: Path) -> str:
    """A real run, in-process backend, that stops after round 1 until it is killed."""
    return textwrap.dedent(f"""
        import sys, time
        from splitfed.flower.config import RunSettings
        from splitfed.sim.inprocess import train_inprocess

        def progress(line):
            if line.startswith("round 1/"):
                print("round 1", flush=True)
                time.sleep(600)

        train_inprocess(RunSettings(rounds=3, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=1,
                                    out={str(folder)!r}), progress=progress)
    """)


def test_a_run_killed_mid_way_reads_still_running_then_crashed(tmp_path, capsys):
    folder = tmp_path / "killed"
    p = subprocess.Popen([sys.executable, "-c", _holder_code(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "round 1"
        run = load_run(folder)
        assert run.status == "running" and [r.round for r in run.rounds] == [1]
        rows, _, err = _report(capsys, folder)
        assert rows[0]["status"] == "running"
        assert f"note: {folder} is still running (pid {p.pid} on {socket.gethostname()}, started " in err
        assert err.rstrip().endswith("): 1 round so far"), err
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert not (folder / SUMMARY).exists()
    run = load_run(folder)
    assert run.status == "crashed" and run.record["pid"] == p.pid
    rows, _, err = _report(capsys, folder)
    assert rows[0]["status"] == "crashed"
    assert f"note: {folder} crashed: its process (pid {p.pid} on " in err and "(1 round kept)" in err
    # its folder is continued as any stopped run's: the resumed run's own end is what is read then
    with runfolder.claim(folder, resume=True, overwrite=False):
        assert runstatus.status(folder).state == "running"  # this process, now
    assert runstatus.status(folder).state == "finished"


def test_a_finished_run_resumed_for_more_rounds_and_killed_reads_crashed(tmp_path):
    """Its summary.json is the earlier run's: it does not make the resumed run finished."""
    folder = tmp_path / "run"
    _train(folder, rounds=1)
    code = textwrap.dedent(f"""
        import time
        from splitfed.flower import runfolder

        with runfolder.claim({str(folder)!r}, resume=True, overwrite=False):
            with open({str(folder / METRICS)!r}, "a") as f:
                f.write('{{"round": 2, "accuracy": 0.5, "sim_round_s": 1.0}}\\n')
            print("round 2", flush=True)
            time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "round 2"
        assert load_run(folder).status == "running"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    run = load_run(folder)
    assert run.finished and run.status == "crashed" and [r.round for r in run.rounds] == [1, 2]


def test_a_pid_taken_again_by_another_process_is_not_the_run(tmp_path):
    """A record of this very pid, but of another process (started at another tick), is a crashed run."""
    folder = write_run(tmp_path / "run", [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}])
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": "2026-01-01 00:00:00",
              "process": "some-boot:12345", "splitfed": "0.1.0"}
    (folder / runfolder.LOCK).write_text(json.dumps(record))
    assert load_run(folder).status == "crashed"
    (folder / runfolder.LOCK).write_text(json.dumps({**record, "host": "another-host"}))
    run = load_run(folder)
    assert run.status == "unknown"
    assert run_notes(run) == [f"{folder} has no summary.json and no record of its end: it is still running on "
                              f"another-host (pid {os.getpid()}), or crashed there (1 round kept)"]


# ---------------------------------------------------------------- folders of other makers and older versions


def test_a_hand_made_folder_says_so_and_keeps_its_notes(tmp_path, capsys):
    made = write_run(tmp_path / "made", [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}], {"label": "mine"})
    bare = write_run(tmp_path / "bare", [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}])
    assert [load_run(f).status for f in (made, bare)] == ["hand-made", "hand-made"]
    rows, _, err = _report(capsys, made, bare)
    assert [r["status"] for r in rows] == ["hand-made", "hand-made"]
    assert err == f"splitfed report: note: {bare} has no summary.json: it did not finish, or is still running " \
                  "(1 round kept)\n"  # as before: nothing records whether it did
    # a claim refused on it (a fresh run into a folder holding rows) records nothing: still hand-made
    from splitfed.errors import ConfigError

    with pytest.raises(ConfigError, match="already holds a run"), \
            runfolder.claim(made, resume=False, overwrite=False):
        pass
    assert load_run(made).status == "hand-made"


def _old_folder(folder: Path, *, summary: bool, checkpoint: bool, lock: dict | None) -> Path:
    """A run folder as splitfed wrote it before runs recorded their end."""
    from splitfed.flower.metrics import summarise

    rows = [{"round": r, "accuracy": 0.5, "loss": 1.0, "sim_round_s": 1.0, "wall_s": 0.1, "bytes_up": 10,
             "bytes_down": 10, "cuts": {"client0": [1, 3]}} for r in (1, 2)]
    folder.mkdir(parents=True)
    (folder / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        (folder / SUMMARY).write_text(json.dumps(summarise(rows, SMALL.to_dict()), indent=2))
    if checkpoint:
        (folder / "checkpoint.pt").write_bytes(b"a checkpoint")
    if lock is not None:
        (folder / runfolder.LOCK).write_text(json.dumps(lock))
    return folder


def test_folders_of_an_older_splitfed_read_with_a_sensible_status(tmp_path, capsys):
    here = socket.gethostname()
    gone = {"pid": os.getpid(), "host": here, "since": "2020-01-01 00:00:00"}  # this pid, then another process
    alive = {"pid": os.getpid(), "host": here, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    folders = [
        _old_folder(tmp_path / "finished", summary=True, checkpoint=True, lock=gone),
        _old_folder(tmp_path / "ended", summary=False, checkpoint=True, lock=gone),
        _old_folder(tmp_path / "going", summary=False, checkpoint=True, lock=alive),
        _old_folder(tmp_path / "unlocked", summary=True, checkpoint=True, lock=None),  # before run folders locked
        _old_folder(tmp_path / "unlocked-ended", summary=False, checkpoint=True, lock=None),
    ]
    want = ["finished", "unfinished", "running", "finished", "unfinished"]
    assert [r.status for r in load_runs(folders)] == want
    rows, _, err = _report(capsys, *folders)
    assert [r["status"] for r in rows] == want
    notes = err.splitlines()
    assert notes == [
        f"splitfed report: note: {folders[1]} has no summary.json: it did not finish (stopped, failed or crashed: "
        "the splitfed that ran it did not record which) (2 rounds kept)",
        f"splitfed report: note: {folders[2]} is still running (pid {os.getpid()} on {here}, started "
        f"{alive['since']}): 2 rounds so far",
        f"splitfed report: note: {folders[4]} has no summary.json: it did not finish (stopped, failed or crashed: "
        "the splitfed that ran it did not record which) (2 rounds kept)",
    ], err


def test_a_summary_written_again_after_a_failed_end_reads_finished(tmp_path):
    """``simulate --resume`` of a run whose checkpoint holds its last round writes its summary again (without
    a run): the folder then holds a whole run, whatever its last run recorded."""
    folder = tmp_path / "run"
    with pytest.raises(RuntimeError), runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text('{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n')
        raise RuntimeError("after the last checkpoint")
    assert runstatus.status(folder).state == "failed"
    time.sleep(0.01)
    (folder / SUMMARY).write_text('{"rounds": 1}\n')
    assert runstatus.status(folder).state == "finished"


def test_the_end_record_replaces_the_lock_file_atomically(tmp_path):
    """Written with the run's atomic writer: no temporary file left beside it, never half a record."""
    folder = tmp_path / "run"
    with runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text('{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n')
        inode = (folder / runfolder.LOCK).stat().st_ino
    assert sorted(p.name for p in folder.iterdir()) == [runfolder.LOCK, METRICS]
    assert json.loads((folder / runfolder.LOCK).read_text())["state"] == "finished"
    assert (folder / runfolder.LOCK).stat().st_ino != inode  # replaced, not rewritten in place


def test_a_claim_holds_the_lock_file_at_the_path_even_if_it_was_replaced_as_it_locked(tmp_path, monkeypatch):
    """A run's end record replaces the lock file; a claim that opened the old file just before, and locked it
    just after, would hold a file no other claim opens: it lets that one go and takes the one at the path."""
    import fcntl

    from splitfed.jsonio import write_atomic

    folder = tmp_path / "run"
    with runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text('{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n')
    real, calls = runfolder._lock, []

    def lock_after_a_replace(fd: int, where: Path) -> None:
        if not calls:  # the run that held the folder writes its end record between this open and this lock
            write_atomic(folder / runfolder.LOCK, '{"pid": 1, "state": "finished"}\n')
        calls.append(fd)
        real(fd, where)

    monkeypatch.setattr(runfolder, "_lock", lock_after_a_replace)
    with runfolder.claim(folder, resume=True, overwrite=False):
        assert len(calls) == 2
        fd = os.open(folder / runfolder.LOCK, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # the file at the path is the one held
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


# ---------------------------------------------------------------- review of 535a014


def test_a_signal_under_a_handler_that_never_unwinds_still_records_the_stop(tmp_path):
    """A deployment's ServerApp process ends under Flower's own SIGTERM handler (exit handlers, then os._exit):
    the claim's end was never written, and a deployment stopped by SIGTERM or Ctrl-C read crashed. The
    ServerApp holds its folder under recording_stops, which writes the stop before that handler runs."""
    folder = tmp_path / "run"
    code = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        from splitfed.flower import runfolder

        signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))  # as Flower's, in the end: no unwinding
        folder = Path({str(folder)!r})
        with runfolder.claim(folder, False, False), runfolder.recording_stops():
            (folder / "metrics.jsonl").write_text('{{"round": 1}}\\n')
            print("ready", flush=True)
            time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert runstatus.status(folder).state == "running"
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0  # Flower's exit, not the signal's
    finally:
        p.kill()
        p.wait()
    st = runstatus.status(folder)
    assert (st.state, st.record.get("signal")) == ("stopped", "SIGTERM"), st


def test_a_sigterm_left_at_its_default_records_the_stop_and_still_ends_the_process_by_it(tmp_path):
    """A process that keeps SIGTERM's default (a script around the API; no Flower handler) is ended by the
    signal itself after the stop is written: its exit status says SIGTERM, and the folder reads stopped."""
    folder = tmp_path / "run"
    code = textwrap.dedent(f"""
        import signal, time
        from pathlib import Path
        from splitfed.flower import runfolder

        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        folder = Path({str(folder)!r})
        with runfolder.claim(folder, False, False), runfolder.recording_stops():
            (folder / "metrics.jsonl").write_text('{{"round": 1}}\\n')
            print("ready", flush=True)
            time.sleep(600)
        print("unwound", flush=True)  # never: the default ends the process at once
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert runstatus.status(folder).state == "running"
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == -signal.SIGTERM
        assert p.stdout.read() == ""
    finally:
        p.kill()
        p.wait()
    st = runstatus.status(folder)
    assert (st.state, st.record.get("signal")) == ("stopped", "SIGTERM"), st


def test_recording_stops_gives_the_handlers_back_and_sigint_still_interrupts(tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    folder = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        with runfolder.claim(folder, False, False), runfolder.recording_stops():
            (folder / METRICS).write_text('{"round": 1}\n')
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the signal interrupts this
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    st = runstatus.status(folder)
    assert (st.state, st.record.get("signal")) == ("stopped", "SIGINT"), st
    with pytest.raises(ValueError, match="its own"):  # a later run's failure is its own: no stale stop
        with runfolder.claim(folder, True, False):
            (folder / METRICS).write_text('{"round": 1}\n{"round": 2}\n')
            raise ValueError("its own")
    assert runstatus.status(folder).state == "failed"


def test_a_resume_refused_at_its_start_leaves_the_record_of_the_run_that_is_there(tmp_path):
    """``flwr run`` with resume=true and another lr: the ServerApp's claim is taken, then the resume is
    refused; the finished run there was then recorded as failed with the refusal."""
    from splitfed.errors import ConfigError

    folder = tmp_path / "run"
    _train(folder, rounds=1)
    record = dict(runstatus.status(folder).record)
    assert record["state"] == "finished"
    with pytest.raises(ConfigError, match="cannot resume"):
        with runfolder.claim(folder, resume=True, overwrite=False):
            raise ConfigError("cannot resume with different lr (0.05 -> 0.5)")
    st = runstatus.status(folder)
    assert st.state == "finished" and dict(st.record) == record
    with pytest.raises(ConfigError):  # one that kept something records its own end
        with runfolder.claim(folder, resume=True, overwrite=False):
            with (folder / METRICS).open("a") as f:
                f.write('{"round": 2}\n')
            raise ConfigError("round 2 failed")
    assert runstatus.status(folder).state == "failed"


def test_a_failure_said_from_outside_the_run_is_recorded_rather_than_the_stop_it_caused(tmp_path):
    """The simulation engine died; the runner then stops the ServerApp, which raised RunStopped: the record
    said "failed: the run was stopped" and the cause was lost."""
    from server.strategy import RunStopped

    folder = tmp_path / "run"
    with pytest.raises(RunStopped):
        with runfolder.claim(folder, False, False):
            (folder / METRICS).write_text('{"round": 1}\n')
            runfolder.failed_elsewhere(folder, "the simulation engine failed: RuntimeError: the engine died")
            raise RunStopped("the run was stopped")
    st = runstatus.status(folder)
    assert st.state == "failed" and st.record["error"] == ("the simulation engine failed: RuntimeError: the "
                                                           "engine died"), st
    with pytest.raises(RunStopped):  # said for that run only
        with runfolder.claim(folder, True, False):
            (folder / METRICS).write_text('{"round": 1}\n{"round": 2}\n')
            raise RunStopped("the run was stopped")
    assert runstatus.status(folder).record["error"] == "the run was stopped"


def test_own_sessions_are_this_processs_since_the_start(tmp_path, monkeypatch):
    from splitfed.sim.ray_start import own_sessions

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    root = tmp_path / "ray"
    mine, other, old = (root / f"session_2026_{os.getpid()}", root / "session_2026_1",
                        root / f"session_2025_{os.getpid()}")
    for d in (mine, other, old):
        d.mkdir(parents=True)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    (root / "session_latest").symlink_to(mine)
    assert own_sessions(time.time() - 60) == [mine]


# ---------------------------------------------------------------- second review


def test_a_stop_said_while_no_run_is_held_concerns_no_later_run(tmp_path):
    """A Ctrl-C'd simulate left its stop set for the process: a notebook's next run that failed read stopped."""
    runfolder.stop_requested(signal.SIGINT)  # nothing held now
    folder = tmp_path / "run"
    with pytest.raises(OSError), runfolder.claim(folder, False, False):
        (folder / METRICS).write_text('{"round": 1}\n')
        raise OSError("the disk is on fire")
    st = runstatus.status(folder)
    assert st.state == "failed" and st.record["error"] == "the disk is on fire", st


def test_a_failure_said_of_a_folder_no_run_holds_is_nothing(tmp_path):
    """Said after the run's claim ended, it stayed, and the next run in that folder failed with its cause."""
    folder = tmp_path / "run"
    runfolder.failed_elsewhere(folder, "the simulation engine failed: RuntimeError: an old cause")
    with pytest.raises(OSError), runfolder.claim(folder, False, False):
        (folder / METRICS).write_text('{"round": 1}\n')
        raise OSError("its own")
    assert runstatus.status(folder).record["error"] == "its own"


def test_a_resume_that_rewrote_the_metrics_as_they_were_kept_nothing(tmp_path):
    """A resume rewrites metrics.jsonl (MetricsWriter.truncate_after) before anything can stop it: by file
    times it had always 'kept something', and a Ctrl-C while waiting for nodes recorded the finished run
    there as stopped. And a record put back keeps its time: the summary a resume with nothing to do wrote
    again still reads finished."""
    folder = tmp_path / "run"
    _train(folder, rounds=1)
    record = dict(runstatus.status(folder).record)
    with pytest.raises(KeyboardInterrupt), runfolder.claim(folder, resume=True, overwrite=False):
        data = (folder / METRICS).read_bytes()
        time.sleep(0.01)
        (folder / METRICS).write_bytes(data)  # as it was, written again
        raise KeyboardInterrupt
    st = runstatus.status(folder)
    assert st.state == "finished" and dict(st.record) == record, st
    # a stopped run whose summary a resume with nothing to do wrote again reads finished, and stays so
    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt), runfolder.claim(stopped, False, False):
        (stopped / METRICS).write_text('{"round": 1}\n')
        raise KeyboardInterrupt
    time.sleep(0.01)
    (stopped / SUMMARY).write_text(json.dumps({"settings": {}, "rounds": 1}))
    assert runstatus.status(stopped).state == "finished"
    with pytest.raises(ValueError), runfolder.claim(stopped, resume=True, overwrite=False):
        raise ValueError("cannot resume with different lr")
    assert runstatus.status(stopped).state == "finished"


def test_an_ignored_sigint_records_no_stop(tmp_path):
    """A run started with SIGINT ignored (a background job) went on after one, recorded stopped meanwhile."""
    folder = tmp_path / "run"
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with runfolder.claim(folder, False, False), runfolder.recording_stops():
            (folder / METRICS).write_text('{"round": 1}\n')
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert runstatus.status(folder).state == "running"
    finally:
        signal.signal(signal.SIGINT, old)
    assert runstatus.status(folder).state == "finished"


@pytest.mark.parametrize(("cuts", "sim_clock", "asked"), [
    ("adaptive", False, True), ("adaptive:", False, True), (" greedy ", False, True), ("static:2,5", False, False),
    ("adaptive", True, False)])
def test_speeds_are_asked_for_the_policies_that_price_devices_however_spelt(cuts, sim_clock, asked):
    from server.strategy import asks_speed

    assert asks_speed(RunSettings(cuts=cuts, sim_clock=sim_clock)) is asked
