"""A run folder belongs to one run at a time, and a new run does not write over an old one unasked.

Real processes hold the folder (and are killed with SIGKILL: the kernel drops
their lock, so a crashed run never blocks the next one); the ServerApp's run and
the in-process backend both claim the folder; ``splitfed simulate`` refuses an
occupied folder before anything starts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import clients.app
from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import METRICS, SUMMARY
from tests.flower_fixtures import FakeGrid, inprocess_tiers

ROOT = Path(__file__).resolve().parent.parent
SMALL = RunSettings(rounds=1, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=1)


def _holder(folder: Path) -> subprocess.Popen:
    """Another process that claims ``folder`` and keeps it until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from splitfed.flower import runfolder
        with runfolder.claim({str(folder)!r}, resume=True, overwrite=False):
            print("held", flush=True)
            time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _finished_run(folder: Path, checkpointed: bool = True) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / METRICS).write_text('{"round": 1}\n{"round": 2}\n')
    (folder / SUMMARY).write_text('{"rounds": 2}\n')
    if checkpointed:
        (folder / checkpoint.FILENAME).write_bytes(b"a checkpoint")
    (folder / "notes.txt").write_text("the user's own file\n")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != runfolder.LOCK}


def test_a_folder_in_use_is_refused_until_its_process_dies(tmp_path):
    folder = tmp_path / "run"
    p = _holder(folder)
    try:
        for attempt in (lambda: runfolder.check(folder, resume=True, overwrite=False),
                        lambda: runfolder.claim(folder, resume=True, overwrite=False).__enter__()):
            with pytest.raises(ConfigError, match=rf"run folder .*run is in use by another run \(pid {p.pid} on "):
                attempt()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    with runfolder.claim(folder, resume=True, overwrite=False) as held:  # the kernel dropped the dead one's lock
        assert held == folder


def test_a_held_run_is_refused_kept_resumed_or_replaced(tmp_path):
    folder = tmp_path / "run"
    before = _finished_run(folder)
    for attempt in (lambda: runfolder.check(folder, resume=False, overwrite=False),
                    lambda: runfolder.claim(folder, resume=False, overwrite=False).__enter__()):
        with pytest.raises(ConfigError, match=r"already holds a run \(2 finished round\(s\)\); continue it with "
                                              r"--resume .*, replace it with --overwrite"):
            attempt()
    assert _files(folder) == before  # refused: nothing touched
    with runfolder.claim(folder, resume=True, overwrite=False):
        assert _files(folder) == before  # resuming keeps the run
    with runfolder.claim(folder, resume=False, overwrite=True):
        # the run's own files go; a file of the user's stays
        assert _files(folder) == {"notes.txt": before["notes.txt"]}


def test_without_a_checkpoint_the_refusal_does_not_offer_resume(tmp_path):
    folder = tmp_path / "run"
    _finished_run(folder, checkpointed=False)  # e.g. the in-process backend's run
    with pytest.raises(ConfigError, match=r"already holds a run \(2 finished round\(s\)\); replace it with "
                                          r"--overwrite") as e:
        runfolder.check(folder, resume=False, overwrite=False)
    assert "--resume" not in str(e.value)


def test_a_run_stopped_in_round_1_leaves_a_folder_a_new_run_may_use(tmp_path):
    """Nothing finished: no checkpoint to resume from and no row to lose (before, such a folder could be
    neither resumed nor run again)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / METRICS).write_text("")
    assert runfolder.held_run(folder) == ""
    runfolder.check(folder, resume=False, overwrite=False)
    with runfolder.claim(folder, resume=False, overwrite=False):
        pass


def test_a_claim_clears_what_a_writer_killed_mid_write_left(tmp_path):
    folder = tmp_path / "run"
    before = _finished_run(folder)
    stale = [folder / f".{checkpoint.FILENAME}.4242.tmp", folder / f".{SUMMARY}.77.tmp"]
    for p in stale:
        p.write_bytes(b"half a file")
    (folder / ".mine.tmp").write_text("not the run's")
    with runfolder.claim(folder, resume=True, overwrite=False):
        assert not any(p.exists() for p in stale)
        assert _files(folder) == {**before, ".mine.tmp": b"not the run's"}


def test_a_resume_with_damaged_metrics_is_refused_before_anything_starts(tmp_path):
    folder = tmp_path / "run"
    _finished_run(folder)
    (folder / METRICS).write_text('{"round": 1}\n{"rou\n{"round": 3}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: not valid JSON"):
        runfolder.check(folder, resume=True, overwrite=False)


def test_a_folder_holding_only_a_checkpoint_is_a_run(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / checkpoint.FILENAME).write_bytes(b"x")
    assert runfolder.held_run(folder) == checkpoint.FILENAME
    assert runfolder.held_run(tmp_path / "absent") == ""
    (tmp_path / "empty").mkdir()
    assert runfolder.held_run(tmp_path / "empty") == ""


def test_check_creates_nothing_and_names_a_file_in_the_way(tmp_path):
    runfolder.check(tmp_path / "a" / "b", resume=False, overwrite=False)
    assert not (tmp_path / "a").exists()
    (tmp_path / "f").write_text("x")
    for path in (tmp_path / "f", tmp_path / "f" / "run"):
        with pytest.raises(ConfigError, match=r"is a file, not a folder"):
            runfolder.check(path, resume=False, overwrite=False)
        with pytest.raises(ConfigError, match=r"is a file, not a folder"):
            runfolder.claim(path, resume=False, overwrite=False).__enter__()


def test_resume_and_overwrite_together_are_refused():
    with pytest.raises(ConfigError, match="resume continues the run in out, overwrite replaces it"):
        RunSettings(out="x", resume=True, overwrite=True)


def test_simulate_refuses_an_occupied_folder_before_anything_starts(tmp_path, capsys, monkeypatch):
    import splitfed.sim.runner

    def started(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the simulation started: the folder should have been refused before")

    monkeypatch.setattr(splitfed.sim.runner, "simulate", started)
    folder = tmp_path / "run"
    before = _finished_run(folder)
    assert main(["simulate", "--out", str(folder), "--rounds", "1"]) == 2
    assert "already holds a run (2 finished round(s))" in capsys.readouterr().err
    assert _files(folder) == before
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--resume", str(folder), "--overwrite"])
    assert e.value.code == 2
    assert "not allowed with argument --resume" in capsys.readouterr().err
    p = _holder(tmp_path / "busy")
    try:
        assert main(["simulate", "--out", str(tmp_path / "busy"), "--rounds", "1"]) == 2
        assert f"in use by another run (pid {p.pid} on " in capsys.readouterr().err
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def test_default_run_folders_do_not_collide(tmp_path):
    from splitfed.commands.simulate import _fresh_folder

    stem = tmp_path / "sim-20261130-120000"
    assert _fresh_folder(stem) == str(stem)  # made when chosen: the next choice skips it
    assert _fresh_folder(stem) == str(tmp_path / "sim-20261130-120000-2")
    assert _fresh_folder(stem) == str(tmp_path / "sim-20261130-120000-3")
    for n in ("", "-2", "-3"):
        runfolder.unmake(f"{stem}{n}")


def test_the_server_app_holds_its_folder_for_the_whole_run(tmp_path, monkeypatch):
    import server.app

    folder = tmp_path / "run"
    seen: list[str] = []

    def progress(line: str) -> None:  # while the run is going, another process is refused the folder
        if line.startswith("round 1"):
            probe = subprocess.run(
                [sys.executable, "-c", "import sys; from splitfed.flower import runfolder; "
                 "runfolder.check(sys.argv[1], resume=True, overwrite=False)", str(folder)],
                cwd=ROOT, capture_output=True, text=True)
            seen.append(probe.stderr)

    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder)), progress=progress)
        assert len(seen) == 1 and "is in use by another run (pid" in seen[0], seen
        first = (folder / METRICS).read_bytes()

        with pytest.raises(ConfigError, match="already holds a run"):  # a second fresh run into it
            server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder)))
        assert (folder / METRICS).read_bytes() == first

        p = _holder(folder)
        try:
            with pytest.raises(ConfigError, match=f"in use by another run \\(pid {p.pid} "):
                server.app.run(FakeGrid(clients.app.app, SMALL.clients),
                               SMALL.with_(out=str(folder), resume=True, rounds=2))
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        assert (folder / METRICS).read_bytes() == first

        server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder), overwrite=True))
        assert (folder / METRICS).read_bytes().count(b"\n") == 1  # replaced, not appended


def test_the_inprocess_backend_claims_its_folder(tmp_path):
    from splitfed.sim.inprocess import train_inprocess

    folder = tmp_path / "run"
    before = _finished_run(folder)
    with pytest.raises(ConfigError, match="already holds a run"):
        train_inprocess(SMALL.with_(out=str(folder)))
    assert _files(folder) == before
    with pytest.raises(ConfigError, match="does not resume"):
        train_inprocess(SMALL.with_(out=str(folder), resume=True))
    summary = train_inprocess(SMALL.with_(out=str(folder), overwrite=True))
    assert summary["rounds"] == 1 and (folder / "notes.txt").is_file()


def test_resuming_a_finished_run_starts_nothing(tmp_path, capsys, monkeypatch):
    import splitfed.sim.runner

    def started(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the simulation started for a run with nothing left to do")

    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        import server.app

        server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(tmp_path)),
                       progress=lambda line: None)
    monkeypatch.setattr(splitfed.sim.runner, "simulate", started)
    rows = (tmp_path / METRICS).read_bytes()
    assert main(["simulate", "--resume", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr()
    assert f"nothing to do: {tmp_path} already holds round 1 of 1" in out.err
    assert json.loads(out.out)["rounds"] == 1 and (tmp_path / METRICS).read_bytes() == rows


def _two_rounds(folder: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        import server.app

        server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder), rounds=2),
                       progress=lambda line: None)


def test_a_resume_with_nothing_to_do_writes_a_lost_summary_again(tmp_path, capsys, monkeypatch):
    _two_rounds(tmp_path, monkeypatch)
    want = json.loads((tmp_path / SUMMARY).read_text())
    (tmp_path / SUMMARY).unlink()
    assert main(["simulate", "--resume", str(tmp_path), "--json"]) == 0
    assert "nothing to do" in capsys.readouterr().err
    got = json.loads((tmp_path / SUMMARY).read_text())
    assert got == want and got["rounds"] == 2  # settings included: the run as it was recorded


def test_a_resume_for_fewer_rounds_than_held_leaves_the_record_as_it_was(tmp_path, capsys, monkeypatch):
    """Before, ``--resume DIR --rounds 1`` of a 2-round run rewrote its summary with ``rounds: 1`` in its
    settings: a record of a run that never was."""
    _two_rounds(tmp_path, monkeypatch)
    want = (tmp_path / SUMMARY).read_bytes()
    assert main(["simulate", "--resume", str(tmp_path), "--rounds", "1", "--json"]) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert (tmp_path / SUMMARY).read_bytes() == want


@pytest.mark.parametrize("damage, words", [
    (lambda rows: rows[1:], r"lacks round\(s\) 1,"),  # a row cut out by hand
    (lambda rows: rows[:1] + rows, r"holds round\(s\) 1 twice"),
    (lambda rows: [], r"lacks round\(s\) 1, 2,"),
], ids=["cut", "twice", "emptied"])
def test_a_metrics_file_that_lacks_a_round_the_checkpoint_holds_is_not_continued(tmp_path, capsys, monkeypatch,
                                                                                damage, words):
    """A row is written right after its round's checkpoint, which keeps a copy of it: a crash between the
    two is mended (below), so only damage leaves the file behind the checkpoint otherwise, and continuing
    would leave a hole (before: rows 1, 2, 4, 5 later)."""
    _two_rounds(tmp_path, monkeypatch)
    rows = (tmp_path / METRICS).read_text().splitlines(keepends=True)
    (tmp_path / METRICS).write_text("".join(damage(rows)))
    before = _files(tmp_path)
    for rounds in ("2", "3"):  # nothing to do, or more rounds: refused alike, before anything starts
        assert main(["simulate", "--resume", str(tmp_path), "--rounds", rounds]) == 2
        err = capsys.readouterr().err
        assert re.search(words, err) and "--overwrite" in err, err
        assert _files(tmp_path) == before


@pytest.mark.parametrize("cut", ["torn", "missing"])
def test_a_crash_between_a_checkpoint_and_its_row_is_mended_by_the_resume(tmp_path, capsys, monkeypatch,
                                                                          cut: str) -> None:
    """Round 2's checkpoint was written and its row was not, or only in part (a crash between the two): the
    resume puts the row back from the checkpoint, whole, and goes on; nothing is refused or lost."""
    _two_rounds(tmp_path, monkeypatch)
    rows = (tmp_path / METRICS).read_text().splitlines(keepends=True)
    (tmp_path / SUMMARY).unlink()
    (tmp_path / METRICS).write_text("".join(rows[:1] + ([rows[1][:-9]] if cut == "torn" else [])))
    assert main(["simulate", "--resume", str(tmp_path), "--rounds", "2"]) == 0
    err = capsys.readouterr().err
    assert "nothing to do" in err and err.count("round 2's metrics row, lost in a crash after its checkpoint was "
                                                "written, is put back from the checkpoint") == 1, err
    assert (tmp_path / METRICS).read_text().splitlines(keepends=True) == rows  # the row as it was written
    assert json.loads((tmp_path / SUMMARY).read_text())["rounds"] == 2


@pytest.mark.parametrize("cut", ["torn", "missing"])
def test_a_resume_checks_a_crashed_folder_without_writing_then_puts_the_lost_row_back_and_says_so(
        tmp_path, monkeypatch, cut: str) -> None:
    """The check before the run (``check_resume``: the folder is not the run's yet) writes nothing; the run that
    then holds the folder puts round 2's row back from its checkpoint, says so once, and trains round 3."""
    import server.app

    _two_rounds(tmp_path, monkeypatch)
    rows = (tmp_path / METRICS).read_text().splitlines(keepends=True)
    (tmp_path / METRICS).write_text("".join(rows[:1] + ([rows[1][:-9]] if cut == "torn" else [])))
    crashed = _files(tmp_path)
    settings = SMALL.with_(out=str(tmp_path), rounds=3, resume=True)
    server.app.check_resume(settings)
    assert _files(tmp_path) == crashed
    said: list[str] = []
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, SMALL.clients), settings, progress=said.append)
    put_back = [line for line in said if "metrics row, lost in a crash" in line]
    assert put_back == ["round 2's metrics row, lost in a crash after its checkpoint was written, is put back from "
                        "the checkpoint"], said
    after = (tmp_path / METRICS).read_text().splitlines(keepends=True)
    assert after[:2] == rows and [json.loads(line)["round"] for line in after] == [1, 2, 3]


def test_a_resume_of_a_whole_folder_says_nothing_of_a_row_put_back(tmp_path, monkeypatch) -> None:
    import server.app

    _two_rounds(tmp_path, monkeypatch)
    said: list[str] = []
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(tmp_path), rounds=3,
                                                                              resume=True), progress=said.append)
    assert not [line for line in said if "put back" in line] and any("rounds 3..3" in line for line in said), said


@pytest.mark.parametrize("stopped", [True, False], ids=["terminated", "failed"])
@pytest.mark.parametrize("summary", [True, False], ids=["summary", "no-summary"])
def test_a_run_that_ends_after_its_last_round_says_it_is_whole(tmp_path, capsys, monkeypatch, stopped, summary):
    """A run stopped as it winds down, after its last round (a SIGTERM that came late: CI's loaded cores once
    delivered one sent at round 2 of 4 after round 4) is whole: before, "terminated" alone, as if it were cut
    short. One that kept its last round but not its summary (stopped or failed before it was written) is told
    that a resume writes it, and the resume does, training nothing."""
    import splitfed.sim.runner
    from splitfed.engine.rounds import RoundFailed
    from splitfed.errors import Terminated

    out = tmp_path / "run"

    def ends_after_its_last_round(settings, **kw):  # type: ignore[no-untyped-def]
        _two_rounds(Path(settings.out), monkeypatch)
        if not summary:
            (Path(settings.out) / SUMMARY).unlink()
        raise Terminated() if stopped else RoundFailed("the engine died as it shut down")

    with monkeypatch.context() as m:
        m.setattr(splitfed.sim.runner, "simulate", ends_after_its_last_round)
        assert main(["simulate", "--out", str(out), "--rounds", "2"]) == (143 if stopped else 1)
    err = capsys.readouterr().err.splitlines()
    said = "splitfed simulate: terminated" if stopped else "splitfed simulate: error: the engine died as it shut down"
    if summary:
        want = [said, f"splitfed simulate: the run had finished: its 2 round(s) are in {out} (see: splitfed report "
                      f"{out})"] if stopped else [said]
        assert err[-len(want):] == want, err
        return
    assert err[-2:] == [said, f"splitfed simulate: all 2 round(s) are kept in {out}, without its summary; write it "
                              f"with: splitfed simulate --resume {out}"], err
    kept = (out / METRICS).read_bytes()
    assert main(["simulate", "--resume", str(out)]) == 0  # what it says to type
    assert "nothing to do" in capsys.readouterr().err
    assert json.loads((out / SUMMARY).read_text())["rounds"] == 2 and (out / METRICS).read_bytes() == kept


@pytest.mark.parametrize("extra, rounds_flag", [([], ""), (["--rounds", "5"], " --rounds 5")])
def test_a_run_that_fails_after_a_kept_round_says_how_to_continue_it(tmp_path, capsys, monkeypatch, extra,
                                                                     rounds_flag):
    """The error is the run's; the next line is what to type (with --rounds when the checkpoint's differs)."""
    import splitfed.sim.runner
    from splitfed.engine.rounds import RoundFailed

    _two_rounds(tmp_path, monkeypatch)
    saved = checkpoint.load(tmp_path)
    checkpoint.save(tmp_path, checkpoint.Checkpoint(1, saved.state, {**saved.settings, "rounds": 4 if not extra else 2},
                                                    saved.assignment, saved.policy, saved.rng, saved.data))

    def fails(settings, **kw):  # type: ignore[no-untyped-def]
        raise RoundFailed("round 2: 0 of 2 clients finished")

    monkeypatch.setattr(splitfed.sim.runner, "simulate", fails)
    assert main(["simulate", "--resume", str(tmp_path), *extra]) == 1
    err = capsys.readouterr().err.splitlines()
    total = 5 if extra else 4
    assert err[-2:] == ["splitfed simulate: error: round 2: 0 of 2 clients finished",
                        f"splitfed simulate: round 1 of {total} is kept in {tmp_path}; continue with: "
                        f"splitfed simulate --resume {tmp_path}{rounds_flag}"]
