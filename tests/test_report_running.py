"""``splitfed report`` over a sweep while a run is still in round 1: that run is a row ``running``, not a refusal.

Before, ``splitfed report runs/*`` stopped (exit 2) on a run folder whose run had not finished its first
round: "X is not a run folder: no metrics.jsonl in it" or "X/metrics.jsonl: no rounds in it", though the
run was alive and the README says the status column shows such a run as ``running``. Holders here are real:
this process's claim or reservation of the folder (what a run and a run starting hold), or another process's.
A folder without rounds that no live run holds is refused as before.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
from pathlib import Path

import pytest

from simulations import common
from splitfed.cli import main as cli
from splitfed.errors import ConfigError
from splitfed.flower import runfolder
from splitfed.flower.metrics import METRICS
from splitfed.report.runs import clock_of, load_run, load_runs, rows_to_run
from tests.test_report import make_rows
from tests.test_report_inputs import _finished
from tests.test_runfolder import _holder

HOST = socket.gethostname()


def _report(capsys: pytest.CaptureFixture[str], out: Path, *folders: Path) -> tuple[int, list[dict[str, str]], str,
                                                                                     str]:
    """``splitfed report FOLDERS --out OUT``: its exit code, summary.csv rows (none if not written), stdout, stderr."""
    rc = cli(["report", *map(str, folders), "--out", str(out)])
    printed, err = capsys.readouterr()
    rows = list(csv.DictReader((out / "summary.csv").open())) if (out / "summary.csv").is_file() else []
    return rc, rows, printed, err


def _in_round_one(folder: Path, metrics: str | None) -> None:
    """What a run leaves in its folder before round 1 ends: no metrics, an empty file, or round 1's row in part."""
    if metrics is not None:
        (folder / METRICS).write_text(metrics)


@pytest.mark.parametrize("metrics", [None, "", '{"round": 1, "accura'])
def test_a_run_still_in_round_one_is_a_running_row_without_numbers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], metrics: str | None) -> None:
    done, live = _finished(tmp_path / "runA"), tmp_path / "runX"
    with runfolder.claim(live, resume=False, overwrite=False):  # a run alive in its folder: this process
        _in_round_one(live, metrics)
        since = json.loads((live / runfolder.LOCK).read_text())["since"]
        rc, rows, printed, err = _report(capsys, tmp_path / "rep", done, live)
    assert rc == 0, err
    assert [r["run"] for r in rows] == ["runA", "runX"]
    assert rows[0]["status"] == "finished" and rows[0]["rounds"] == "3"
    numbers = [h for h in rows[1] if h not in ("run", "mode", "tiers", "U-shape", "rounds", "status")]
    assert (rows[1]["rounds"], rows[1]["status"], {rows[1][h] for h in numbers}) == ("0", "running", {""})
    line = next(x for x in printed.splitlines() if x.startswith("runX"))
    assert line.split() == ["runX", "-", "-", "-", "0", *["-"] * 7, "running"]
    notes = [x for x in err.splitlines() if "runX" in x]
    assert notes[0] == (f"splitfed report: note: {live} is still running (pid {os.getpid()} on {HOST}, started "
                        f"{since}): 0 rounds so far")
    assert len(notes) == (2 if metrics and metrics.strip() else 1)  # the line cut short is said too
    assert sorted(p.name for p in (tmp_path / "rep").glob("cuts_*.png")) == ["cuts_1_runA.png"]  # runX draws none
    assert (tmp_path / "rep" / "accuracy_vs_time.png").is_file()


def test_a_run_starting_in_its_folder_is_a_running_row_and_its_note_says_starting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done, live = _finished(tmp_path / "runA"), tmp_path / "runX"
    with runfolder.reserve(live, resume=False, overwrite=False):  # held from before its start (its Ray, tiers)
        rc, rows, _, err = _report(capsys, tmp_path / "rep", done, live)
    assert rc == 0, err
    assert (rows[1]["run"], rows[1]["rounds"], rows[1]["status"]) == ("runX", "0", "running")
    note = next(x for x in err.splitlines() if "runX" in x)
    assert note.startswith(f"splitfed report: note: {live} is starting (pid {os.getpid()} on {HOST}, started "), note
    assert note.endswith("): 0 rounds so far"), note


def test_a_run_of_another_process_in_round_one_is_reported_as_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done, live = _finished(tmp_path / "runA"), tmp_path / "runX"
    p = _holder(live)
    try:
        rc, rows, _, err = _report(capsys, tmp_path / "rep", done, live)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert rc == 0, err
    assert (rows[1]["rounds"], rows[1]["status"]) == ("0", "running")
    assert f"{live} is still running (pid {p.pid} on {HOST}, started " in err, err
    # gone (killed) with no round: no run to report, refused as any folder without rounds
    rc, _, _, err = _report(capsys, tmp_path / "rep", done, live)
    assert (rc, err) == (2, f"splitfed report: error: {live} is not a run folder: no {METRICS} in it (leave it out "
                            "to report the other 1)\n")


def test_a_run_alone_in_round_one_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    live = tmp_path / "runX"
    with runfolder.claim(live, resume=False, overwrite=False):
        since = json.loads((live / runfolder.LOCK).read_text())["since"]
        rc, rows, printed, err = _report(capsys, tmp_path / "rep", live)
        with pytest.raises(ConfigError) as e:
            load_run(live)
    said = f"{live} is running (pid {os.getpid()} on {HOST}, started {since}) and has finished no round yet"
    assert (rc, rows, printed, err) == (2, [], "", f"splitfed report: error: {said}\n")
    assert str(e.value) == said
    assert not (tmp_path / "rep").exists()


def test_runs_all_in_round_one_are_refused_naming_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "runX", tmp_path / "runY"
    with runfolder.claim(a, resume=False, overwrite=False), runfolder.reserve(b, resume=False, overwrite=False):
        since = json.loads((a / runfolder.LOCK).read_text())["since"]
        rc, _, _, err = _report(capsys, tmp_path / "rep", a, b)
        with pytest.raises(ConfigError) as e:
            load_runs([a, b])
    assert rc == 2
    assert str(e.value).startswith(f"{a} is running (pid {os.getpid()} on {HOST}, started {since}) and has finished "
                                   f"no round yet; {b} is starting (pid {os.getpid()} on {HOST}, started "), e.value
    assert str(e.value).endswith(") and has finished no round yet: report them once one has finished a round")
    assert err == f"splitfed report: error: {e.value}\n"


def test_a_folder_without_rounds_and_no_live_run_is_still_refused(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    done, ended = _finished(tmp_path / "runA"), tmp_path / "runX"
    with runfolder.claim(ended, resume=False, overwrite=False):
        pass
    ended.mkdir(exist_ok=True)
    (ended / METRICS).write_text("")  # a run that ended with no round (its record says so, or there is none)
    rc, rows, _, err = _report(capsys, tmp_path / "rep", done, ended)
    assert (rc, rows) == (2, [])
    assert err == (f"splitfed report: error: {ended / METRICS}: no rounds in it (leave it out to report the "
                   "other 1)\n")


def test_a_run_without_rounds_sets_no_clock(tmp_path: Path) -> None:
    """A deployment's runs (measured round times) beside one still in round 1 read "measured", not "sim/measured"."""
    rows = [{**r, "sim_round_s": None, "measured_round_s": 2.0} for r in make_rows(2)]
    deployed = rows_to_run(rows, "deployed")
    with runfolder.claim(tmp_path / "runX", resume=False, overwrite=False):
        live = load_run(tmp_path / "runX", unstarted=True)
    assert (live.rounds, live.status) == ((), "running")
    assert clock_of([deployed, live]) == "measured"


# ---------------------------------------------------------------- an experiment into a folder held by another


def test_an_experiment_into_a_held_folder_is_told_it_is_in_use_by_a_run_or_experiment(tmp_path: Path) -> None:
    """Before: "run folder OUT is in use by another run (...); ... choose another out": the holder is as likely
    another experiment, whose record does not say which, and the experiment's option is --out."""
    out = tmp_path / "out"
    p = _holder(out)  # another process holding the folder, as an experiment's output_folder holds it
    try:
        with pytest.raises(ConfigError) as e, common.output_folder(out, overwrite=False, name="compression"):
            pass
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    since = json.loads((out / runfolder.LOCK).read_text())["since"]
    assert str(e.value) == (f"--out {out} is in use by another run or experiment (pid {p.pid} on {HOST}, since "
                            f"{since}); wait for it to end or choose another --out")
