"""A folder reserved for one run of this process is taken over by that run's claim only; a run whose output's
reader went away records that, not a signal it never got.

``splitfed simulate`` reserves its folder before Ray starts, and its ServerApp's claim (in a thread started since)
takes the reservation over. Any other run of the same process (``train_inprocess`` from a notebook's thread, a
thread pool's run) took it over as well: with ``overwrite`` it removed the run a ``--resume`` was starting to
continue, and the simulation's own claim was then refused, naming its own pid.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cli import OUTPUT_CLOSED
from splitfed.cli import main as cli
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder, runstatus
from splitfed.flower.metrics import METRICS
from tests.test_runfolder_stop_state import _check_elsewhere

ROOT = Path(__file__).resolve().parent.parent
ROW = '{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n'


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != runfolder.LOCK}


def _in_thread(body: Callable[[], Any]) -> Any:
    """``body``'s result (or what it raised) in a thread started now: as the ServerApp's claim runs."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(body())
        except BaseException as e:  # handed to the caller
            got.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return got[0]


class _Notebook:
    """A thread alive before the reservation (a notebook's, a thread pool's) that runs what it is handed."""

    def __init__(self) -> None:
        self.job: Callable[[], Any] | None = None
        self.result: Any = None
        self.ready, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        self.ready.wait()
        assert self.job is not None
        try:
            self.result = self.job()
        except BaseException as e:  # handed to the caller
            self.result = e
        self.done.set()

    def run(self, job: Callable[[], Any]) -> Any:
        self.job = job
        self.ready.set()
        self.done.wait()
        self.thread.join()
        return self.result


def _claim(folder: Path, resume: bool, overwrite: bool, reservation: runfolder.Reservation | None = None,
           ) -> str:
    """A run's claim of ``folder`` that writes its round 1: "claimed", or its refusal."""
    token = {} if reservation is None else {"reservation": reservation}  # unnamed: as the callers claim now
    try:
        with runfolder.claim(folder, resume=resume, overwrite=overwrite, **token):
            (folder / METRICS).write_text(ROW.replace("0.5", "0.9"))
    except ConfigError as e:
        return str(e)
    return "claimed"


@settings(max_examples=6, deadline=None)
@given(made=st.booleans(), overwrite=st.booleans())
def test_another_threads_run_cannot_take_over_a_reserved_folder(tmp_path_factory, made, overwrite):
    """``simulate`` (``--resume`` of the run there, if any) holds the folder while its Ray starts; a notebook's
    ``train_inprocess`` into it, from a thread that was there before, is refused naming the folder and leaves
    the run there whole; the simulation's own claim, from its ServerApp's thread, then takes the folder."""
    folder = tmp_path_factory.mktemp("f") / "run"
    if made:
        folder.mkdir()
        (folder / METRICS).write_text(ROW)
        (folder / checkpoint.FILENAME).write_bytes(b"the resumed run's checkpoint")
    notebook = _Notebook()
    with runfolder.reserve(folder, resume=made, overwrite=False) as held:
        kept = _files(folder)
        refused = notebook.run(lambda: _claim(folder, resume=False, overwrite=overwrite))
        assert refused == (f"run folder {folder} is in use by another run of this process (held for it from "
                           "before its start); wait for it to end or choose another out"), refused
        assert _files(folder) == kept  # the checkpoint a --resume continues is still there
        # a thread started since (as Flower's, running the ServerApp) without the token is another run too
        assert "in use by another run of this process" in _in_thread(
            lambda: _claim(folder, resume=made, overwrite=False))
        assert _in_thread(lambda: _claim(folder, resume=made, overwrite=False, reservation=held)) == "claimed"
    assert runstatus.status(folder).state == "finished"


def test_a_reservation_is_taken_over_by_its_own_token_from_any_thread_and_by_no_other(tmp_path):
    folder = tmp_path / "run"
    other = tmp_path / "other"
    with runfolder.reserve(other, resume=False, overwrite=False) as wrong, \
            runfolder.reserve(folder, resume=False, overwrite=False) as mine:
        assert "in use by another run of this process" in _in_thread(
            lambda: _claim(folder, resume=False, overwrite=False, reservation=wrong))
        notebook = _Notebook()  # a thread the reservation would not let take it over unnamed: the token does
        assert notebook.run(lambda: _claim(folder, resume=False, overwrite=False, reservation=mine)) == "claimed"
    assert runstatus.status(folder).state == "finished"


def test_a_reservations_end_does_not_let_go_of_a_later_reservation_of_the_folder(tmp_path):
    """A run reserves a folder, claims it and ends; a second run of this process reserves the folder (to resume
    it) before the first's reservation has ended: that end must not close the second's lock file."""
    folder = tmp_path / "run"
    held, first_out, refused = threading.Event(), threading.Event(), []

    def second() -> None:
        with runfolder.reserve(folder, resume=True, overwrite=False):
            held.set()
            first_out.wait()
            refused.append(_check_elsewhere(folder, resume=True))

    with runfolder.reserve(folder, resume=False, overwrite=False):
        assert _claim(folder, resume=False, overwrite=False) == "claimed"
        t = threading.Thread(target=second)
        t.start()
        held.wait()
    first_out.set()
    t.join()
    assert "is in use by another run" in refused[0], refused


def test_a_run_whose_output_reader_closed_records_that_and_no_signal(tmp_path, capsys):
    """A real command's stdout piped into ``head -n 1``: once head has its line and exits, the next line the run
    writes raises BrokenPipeError (Python ignores SIGPIPE: no signal comes). The run's record says it was
    stopped because its output closed, with no ``signal``; ``splitfed report`` reads it as stopped."""
    folder = tmp_path / "headed"
    code = textwrap.dedent(f"""
        import select, sys
        from splitfed.cli import script
        from splitfed.flower import runfolder

        def body():
            with runfolder.claim({str(folder)!r}, resume=False, overwrite=False):
                open({str(folder / METRICS)!r}, "w").write({ROW!r})
                print("round 1 kept", flush=True)
                poll = select.poll()
                poll.register(sys.stdout.fileno(), 0)  # POLLERR/POLLHUP only: returns once head has gone
                poll.poll()
                print("round 2 ...", flush=True)

        sys.exit(script("run", body))
    """)
    run = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-n", "1"], stdin=run.stdout, capture_output=True, text=True, check=True)
    assert run.stdout is not None and run.stderr is not None
    run.stdout.close()  # head alone reads it
    err = run.stderr.read().decode()
    assert (head.stdout, run.wait(), err) == ("round 1 kept\n", 141, "")  # ended quietly, as a Unix tool
    rs = runstatus.status(folder)
    assert rs.state == "stopped" and rs.record.get("reason") == OUTPUT_CLOSED, rs
    assert "signal" not in rs.record and "error_type" not in rs.record, rs
    assert cli(["report", str(folder), "--out", str(tmp_path / "report")]) == 0
    note = capsys.readouterr().err
    assert f"note: {folder} was stopped" in note and "SIGPIPE" not in note, note
    with runfolder.claim(folder, resume=True, overwrite=False):  # kept, and continued as any stopped run
        assert runstatus.status(folder).state == "running"


def test_a_stops_first_signal_is_the_one_recorded(tmp_path):
    """A Ctrl-C, then a SIGTERM while the run winds down (Flower's SuperExec stopping its ServerApp): the record
    says SIGINT, the user's, not the last signal that came."""
    folder = tmp_path / "run"
    code = textwrap.dedent(f"""
        import os, signal, time
        from splitfed.flower import runfolder
        signal.signal(signal.SIGINT, lambda *a: None)  # a handler of the caller's: the run goes on
        signal.signal(signal.SIGTERM, lambda *a: None)
        with runfolder.claim({str(folder)!r}, resume=False, overwrite=False), runfolder.recording_stops():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            print(open(os.path.join({str(folder)!r}, runfolder.LOCK)).read())
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["signal"] == "SIGINT", out.stdout  # what a process the SIGTERM ends leaves
