"""What ``splitfed report`` makes of its inputs and where it writes, each reproduced first: a run folder named
``report`` beside the runs was written over, two stray files were "the same run", ``summary.md`` named the runs
as typed in another folder, a hint that did not paste, a JSON error without its place, and notes that did not
agree with what a finished run's files say."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from splitfed.cli import main as cli
from splitfed.flower import runfolder
from splitfed.flower.metrics import METRICS, SUMMARY, summarise
from splitfed.report.runs import load_run, run_notes, write_run
from tests.test_report import make_rows


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _finished(folder: Path, rounds: int = 3) -> Path:
    """A run as splitfed ends one: its rows and summary written while it holds the folder, its end recorded."""
    rows = make_rows(rounds)
    with runfolder.claim(folder, resume=False, overwrite=False):
        write_run(folder, rows, summarise(rows, {}))
    return folder


# ---------------------------------------------------------------- never into a run folder


def test_a_run_folder_named_report_beside_the_runs_is_left_as_it_is(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``grp/a grp/b`` beside a run ``grp/report``. Before: exit 0, the report written into that run (its
    figures replaced, its heatmap removed); ``grp/*`` read it as a run too and wrote into it. Now: refused,
    exit 2, one line naming the folder and --out; the run as it was."""
    grp = tmp_path / "grp"
    a, b, report = (write_run(grp / n, make_rows(3)) for n in ("a", "b", "report"))
    (report / "cuts_1_report.png").write_bytes(b"the run's own heatmap")
    before = _digests(report)
    refused = (f"splitfed report: error: cannot write the report to {report.resolve()} (the default): it is a run "
               f"folder ({METRICS} is there); give --out another folder\n")
    assert cli(["report", str(a), str(b)]) == 2
    assert capsys.readouterr().err == refused
    assert cli(["report", *sorted(str(p) for p in grp.iterdir())]) == 2
    assert capsys.readouterr().err == refused
    assert _digests(report) == before and not (report / "report").exists()
    assert cli(["report", str(a), str(b), "--out", str(grp / "paper")]) == 0  # the way out it names
    assert (grp / "paper" / "summary.md").is_file() and _digests(report) == before


@pytest.mark.parametrize("name", [METRICS, SUMMARY, "checkpoint.pt", runfolder.LOCK])
def test_out_naming_a_run_folder_or_an_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        name: str) -> None:
    """``--out`` naming one of the runs given (its figures and a report's are named alike), or a folder that
    holds any of a run's files: refused before anything is written."""
    a, b = write_run(tmp_path / "a", make_rows(3)), write_run(tmp_path / "b", make_rows(3))
    before = _digests(b)
    assert cli(["report", str(a), str(b), "--out", str(b)]) == 2
    assert capsys.readouterr().err == (f"splitfed report: error: cannot write the report to {b}: it is a run folder "
                                       f"({METRICS} is there); give --out another folder\n")
    assert _digests(b) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / name).write_bytes(b"")
    assert cli(["report", str(a), "--out", str(other)]) == 2
    assert capsys.readouterr().err == (f"splitfed report: error: cannot write the report to {other}: it is a run "
                                       f"folder ({name} is there); give --out another folder\n")
    assert [p.name for p in other.iterdir()] == [name]


# ---------------------------------------------------------------- inputs


def test_stray_files_among_the_runs_are_named_not_taken_for_one_run(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``DIR/*`` with two scripts beside a run. Before: "sigint_run.py is the same run as check.py" (both stand
    for DIR). Now the first is named as no metrics, as it is alone; a folder and its metrics.jsonl are still one."""
    run = write_run(tmp_path / "run", make_rows(2))
    check, sigint = tmp_path / "check.py", tmp_path / "sigint_run.py"
    check.write_text("import sys\n")
    sigint.write_text("import os\n")
    assert cli(["report", str(check), str(run), str(sigint)]) == 2
    assert capsys.readouterr().err == (f"splitfed report: error: {check}:1: not valid JSON: Expecting value: "
                                       "column 1 (leave it out to report the other 2)\n")
    assert cli(["report", str(run), str(run / METRICS)]) == 2
    assert capsys.readouterr().err == (f"splitfed report: error: {run / METRICS} is the same run as {run}: "
                                       "each run once\n")


def test_summary_md_names_each_run_by_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cd run1; splitfed report . ../run2``. Before: summary.md (in ``../report``) listed ``.`` and
    ``../run2``, and its note ``../run2 has no summary.json``: wrong where it is read. Now absolute."""
    run1 = write_run(tmp_path / "run1", make_rows(2), {})
    write_run(tmp_path / "run2", make_rows(2))
    monkeypatch.chdir(run1)
    assert cli(["report", ".", "../run2"]) == 0
    md = (tmp_path / "report" / "summary.md").read_text()
    root = tmp_path.resolve()
    assert f"\n## Runs\n\n- **run1**: `{root / 'run1'}`\n- **run2**: `{root / 'run2'}`\n\n" in md
    assert f"\n## Notes\n\n- {root / 'run2'} has no summary.json: it did not finish, or is still running " \
           "(2 rounds kept)\n" in md


def test_the_hint_of_runs_below_a_folder_pastes_with_a_space_in_its_path(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``splitfed report /x/exp dir/runs/*``, which the shell splits in two. Now the folder is quoted
    and the glob left outside, for the shell to expand."""
    exp = tmp_path / "exp dir"
    write_run(exp / "runs" / "a", make_rows(1))
    assert cli(["report", str(exp)]) == 2
    err = capsys.readouterr().err
    assert err == (f"splitfed report: error: {exp} is not a run folder: no {METRICS} in it; its run folders are "
                   f"below it: splitfed report '{exp}/runs'/*\n")
    assert shlex.split(err.split(": splitfed report ", 1)[1]) == [f"{exp}/runs/*"]


# ---------------------------------------------------------------- JSON errors: where


def test_a_cut_summary_and_a_bad_metrics_row_are_named_with_their_line_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``summary.json: not valid JSON: Unterminated string starting at`` (at where?), and a metrics
    row's line without its column."""
    run = write_run(tmp_path / "run", make_rows(1))
    (run / SUMMARY).write_text('{\n  "rounds": 1,\n  "lab')
    assert cli(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"splitfed report: error: {run / SUMMARY}: not valid JSON: Unterminated "
                                       "string starting at: line 3 column 3\n")
    (run / SUMMARY).unlink()
    (run / METRICS).write_text('{"round": 1, "accuracy": 0.5,, "sim_round_s": 1}\n')
    assert cli(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"splitfed report: error: {run / METRICS}:1: not valid JSON: Expecting "
                                       "property name enclosed in double quotes: column 30\n")


# ---------------------------------------------------------------- notes of a finished run


def test_a_finished_run_whose_summary_was_removed_says_so(tmp_path: Path) -> None:
    """Before: status ``finished`` beside the note "has no summary.json: it did not finish, or is still
    running". Now the note says what the status is read from: the run's record of its end."""
    run = _finished(tmp_path / "run")
    assert run_notes(load_run(run)) == []
    until = json.loads((run / runfolder.LOCK).read_text())["until"]
    (run / SUMMARY).unlink()
    done = load_run(run)
    assert done.status == "finished"
    assert run_notes(done) == [f"{run} has no summary.json, though its run recorded that it finished at {until}: "
                               "the summary was removed since"]


def test_a_finished_run_whose_metrics_lost_rounds_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rows lost at the end of a finished run's metrics (or its last cut short). Before: reported finished, with
    fewer rounds and another final accuracy than its summary, without a word. Now a note (the report is made)."""
    run = _finished(tmp_path / "run")
    lines = (run / METRICS).read_text().splitlines(keepends=True)
    (run / METRICS).write_text("".join(lines[:2]))
    lost = (f"{run}: its summary.json counts 3 rounds but its metrics.jsonl holds 2: the file was changed after "
            "the run ended; the numbers here are of the rounds it holds")
    assert cli(["report", str(run)]) == 0
    assert capsys.readouterr().err == f"splitfed report: note: {lost}\n"
    assert f"\n## Notes\n\n- {lost}\n" in (run / "report" / "summary.md").read_text()
    (run / METRICS).write_text("".join(lines[:2]) + lines[2][:-10])  # the last row cut short
    assert run_notes(load_run(run)) == [f"{run / METRICS}: its last line was cut short (a crash, or a round still "
                                        "being written) and is left out", lost]
