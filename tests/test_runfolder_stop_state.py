"""How a run folder records a run whose output's reader went away (``splitfed simulate ... | head -3``).

The reader of a command's stdout gone, the command ends quietly (exit 141, as a Unix tool that SIGPIPE ends):
its user stopped it. The run's own record (the lock file, which ``splitfed report`` reads into its ``status``
column) must say so, ``stopped``, not ``failed`` with a BrokenPipeError, and the run stays resumable. A
BrokenPipeError from anything else (a socket, a child's pipe) is still a failure.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from splitfed.cli import OUTPUT_CLOSED
from splitfed.cli import main as cli
from splitfed.errors import ConfigError
from splitfed.flower import runfolder, runstatus
from splitfed.flower.metrics import METRICS

ROOT = Path(__file__).resolve().parent.parent


def _run_code(folder: Path, broken: str) -> str:
    """A real run (in-process backend) that, once round 1 is kept, meets a BrokenPipeError: its progress line
    written to a stdout whose reader has gone (``broken == "stdout"``; it waits until the reader is gone), or
    a write to a socket whose peer has closed, its stdout still read (``"socket"``)."""
    return textwrap.dedent(f"""
        import select, socket, sys
        from splitfed.flower.config import RunSettings
        from splitfed.sim.inprocess import train_inprocess

        def progress(line):
            if not line.startswith("round 1/"):
                return
            print("round 1 kept", flush=True)
            if {broken!r} == "stdout":
                poll = select.poll()
                poll.register(sys.stdout.fileno(), 0)  # only POLLERR/POLLHUP: blocks until the reader has gone
                poll.poll()
                print(line, flush=True)
            else:
                a, b = socket.socketpair()
                b.close()
                a.sendall(b"x" * 65536)

        train_inprocess(RunSettings(rounds=3, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=1,
                                    out={str(folder)!r}), progress=progress)
    """)


def _run(folder: Path, broken: str) -> str:
    """Run :func:`_run_code` to its end; its stderr."""
    p = subprocess.Popen([sys.executable, "-c", _run_code(folder, broken)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    try:
        assert p.stdout.readline().strip() == "round 1 kept"
        if broken == "stdout":
            p.stdout.close()  # as ``head`` does once it has its lines
        else:
            p.stdout.read()
        err = p.stderr.read()
    finally:
        p.wait()
    assert "BrokenPipeError" in err, err  # the run did meet one (the child has no command to end it quietly)
    return err


def _report(capsys: pytest.CaptureFixture[str], folder: Path) -> tuple[dict[str, str], str]:
    """``splitfed report FOLDER``: its summary.csv row, and its stderr (the notes)."""
    out = folder.parent / "report"
    assert cli(["report", str(folder), "--out", str(out)]) == 0
    _, err = capsys.readouterr()
    [row] = list(csv.DictReader((out / "summary.csv").open()))
    return row, err


@pytest.mark.slow
def test_a_run_whose_stdout_reader_went_away_is_recorded_stopped_and_stays_resumable(tmp_path, capsys):
    folder = tmp_path / "headed"
    _run(folder, "stdout")
    rs = runstatus.status(folder)
    # Python ignores SIGPIPE: its write failed (BrokenPipeError), and no signal stopped it
    assert (rs.state, rs.record.get("reason"), rs.record.get("signal")) == ("stopped", OUTPUT_CLOSED, None), rs
    assert "error_type" not in rs.record
    row, err = _report(capsys, folder)
    assert (row["status"], row["rounds"]) == ("stopped", "1"), row
    assert f"note: {folder} was stopped (output closed) at " in err and "(1 round kept)" in err, err
    with pytest.raises(ConfigError, match="already holds a run"):  # its round is kept, not replaced
        runfolder.check(folder, resume=False, overwrite=False)
    with runfolder.claim(folder, resume=True, overwrite=False):  # and continued as any stopped run
        assert runstatus.status(folder).state == "running"


@pytest.mark.slow
def test_a_broken_pipe_that_is_not_stdout_is_still_a_failure(tmp_path):
    folder = tmp_path / "socket"
    _run(folder, "socket")
    rs = runstatus.status(folder)
    assert (rs.state, rs.record.get("error_type")) == ("failed", "BrokenPipeError"), rs



# ------------------------------------------------------- a run folder reserved before the run's slow start


def _check_elsewhere(folder: Path, resume: bool = False, overwrite: bool = False) -> str:
    """What a second run's early check (``splitfed simulate``'s validate, in another process) says of
    ``folder``: "" if it passes, else its refusal."""
    code = textwrap.dedent(f"""
        from splitfed.errors import ConfigError
        from splitfed.flower import runfolder
        try:
            runfolder.check({str(folder)!r}, resume={resume}, overwrite={overwrite})
        except ConfigError as e:
            print(e)
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _kept_run(folder: Path) -> dict[str, bytes]:
    """A folder that holds a stopped run: one round's row and a start-and-stop record."""
    with pytest.raises(KeyboardInterrupt), runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text('{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n')
        raise KeyboardInterrupt
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_reserved_folder_is_refused_to_a_second_run_at_once_and_taken_over_by_its_claim(tmp_path):
    folder = tmp_path / "new" / "run"
    with runfolder.reserve(folder, resume=False, overwrite=False):
        assert "is in use by another run" in _check_elsewhere(folder)  # before its Ray, not after
        assert "is in use by another run" in _check_elsewhere(folder, overwrite=True)
        runfolder.check(folder, resume=False, overwrite=False)  # this process's own check: not in use by another
        with runfolder.claim(folder, resume=False, overwrite=False):  # the run's claim takes the lock over
            assert runstatus.status(folder).state == "running"
            assert "is in use by another run" in _check_elsewhere(folder)
            (folder / METRICS).write_text('{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n')
        assert runstatus.status(folder).state == "finished"
    assert runstatus.status(folder).state == "finished"  # the reservation's end leaves the claim's record
    with runfolder.claim(folder, resume=True, overwrite=False):  # and the lock: a later run takes it
        pass


def test_a_reservation_refuses_what_check_refuses(tmp_path):
    folder = tmp_path / "run"
    kept = _kept_run(folder)
    with pytest.raises(ConfigError, match="already holds a run"), \
            runfolder.reserve(folder, resume=False, overwrite=False):
        pass
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == kept


@settings(max_examples=8)
@given(made=st.booleans(), resume=st.booleans(), overwrite=st.booleans())
def test_a_reservation_no_run_claimed_leaves_the_folder_as_it_was(tmp_path_factory, made, resume, overwrite):
    """A start that fails (Ray, the tiers) or is stopped before the run's claim: the run there, if any, is whole
    (``overwrite`` removes it only once the run claims the folder), a folder the reservation made is gone,
    and the folder is free again."""
    assume(not (resume and overwrite))
    folder = tmp_path_factory.mktemp("r") / "run"
    kept = _kept_run(folder) if made else None
    with pytest.raises(KeyboardInterrupt), runfolder.reserve(folder, resume=resume or made and not overwrite,
                                                            overwrite=overwrite):
        refused = _check_elsewhere(folder, resume=True)
        assert f"in use by another run (pid {os.getpid()} on {socket.gethostname()}" in refused  # this process
        raise KeyboardInterrupt  # Ctrl-C while Ray starts
    if kept is None:
        assert not folder.exists()
    else:
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == kept
        assert _check_elsewhere(folder, resume=True) == ""
