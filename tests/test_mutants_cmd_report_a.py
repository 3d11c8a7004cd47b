"""What ``splitfed report`` promises that the mutation run of ``splitfed/commands/report.py`` (lines 1-200) found
unpinned.

``--target`` takes an accuracy in (0, 1]: 1 is accepted, 0 refused; one run given by a relative path reports in
``RUN/report`` as given (not made absolute); the output folder among the runs given is left out, and nothing
else is; SIGTERM ends a report written in the main thread as Ctrl-C does (143, its drafts removed), a handler
of the caller's own is left in place, and a report in another thread works; a report again into a folder of
the user's (``--out``) is not refused, its manifest names each file there as it is now, and a user's file
named as an earlier report's heatmap is neither removed nor taken for the report's; a user's ``summary.md``
there is refused without ``--overwrite``; a nested ``--out`` not there yet is made; only a run with clients
gets its cuts-per-class table; a write that fails says how many files are new, exactly, and leaves no draft.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from splitfed import jsonio
from splitfed.cli import build_parser
from splitfed.cli import main as cli
from splitfed.commands.report import MANIFEST, default_out, without_out
from splitfed.report import plots
from splitfed.report.runs import write_run


def _rows(rounds: int, clients: bool = True, cut: int = 1) -> list[dict[str, Any]]:
    profiles = {"client0": "pi-home-0", "client1": "phone-mid-0"}
    rows = []
    for r in range(1, rounds + 1):
        row: dict[str, Any] = {"round": r, "accuracy": 1 - 0.5 ** r, "loss": 0.5 ** r, "sim_round_s": 2.0,
                               "bytes_up": 1000 * r, "bytes_down": 500 * r}
        if clients:
            cuts = {c: [cut, 5] for c in profiles}
            row |= {"cuts": cuts, "per_client": {c: {"profile": p, "cuts": cuts[c]} for c, p in profiles.items()}}
        rows.append(row)
    return rows


def _drafts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- --target


def test_target_of_exactly_1_is_accepted_and_0_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """(0, 1]: a target of 1 (every sample right) is a target; 0 is reached before any round."""
    assert build_parser().parse_args(["report", "r", "--target", "1"]).target == 1.0
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["report", "r", "--target", "0"])
    assert e.value.code == 2
    assert "expected an accuracy in (0, 1], got 0.0" in capsys.readouterr().err


# ---------------------------------------------------------------- where the report goes


def test_one_run_given_relative_reports_in_its_report_folder_as_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One run: ``RUN/report`` as the user named it (``a/report``, not the absolute path); the metrics file
    given stands for its folder."""
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    assert default_out([Path("a")]) == Path("a") / "report"
    assert default_out([Path("a") / "metrics.jsonl"]) == Path("a") / "report"
    assert cli(["report", "a"]) == 0
    assert capsys.readouterr().out.endswith(
        "\nreport: 6 figure(s), summary.md, summary.csv and rounds.csv in a/report\n")
    assert (tmp_path / "a" / "report" / "summary.md").is_file()


def test_a_nested_out_folder_not_there_yet_is_made(tmp_path: Path) -> None:
    """``--out paper/figs/v2`` where ``paper`` is not there yet: made, parents too (before any check refused)."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    out = tmp_path / "paper" / "figs" / "v2"
    assert cli(["report", str(tmp_path / "a"), "--out", str(out)]) == 0
    assert (out / "summary.md").is_file() and (out / "rounds.csv").is_file()


def test_only_the_output_folder_is_left_out_of_the_runs(tmp_path: Path) -> None:
    """``runs/*`` once ``runs/report`` is there: that folder (no metrics in it, where the report goes) is left
    out, the runs kept in order; no other folder is dropped, and the output folder given alone is kept (the
    reader then refuses it)."""
    runs = tmp_path / "runs"
    a, b = write_run(runs / "a", _rows(1)), write_run(runs / "b", _rows(1))
    out = runs / "report"
    out.mkdir()
    assert without_out([a, out, b], out) == [a, b]
    assert without_out([a, b], out) == [a, b]
    assert without_out([a / "metrics.jsonl", b], out) == [a / "metrics.jsonl", b]
    notes = runs / "notes"
    notes.mkdir()
    assert without_out([a, notes], out) == [a, notes]  # not the output folder: kept, for the reader to refuse
    assert without_out([out], out) == [out]
    assert without_out([a, b], a) == [a, b]  # --out naming a run folder: a run, not left out


# ---------------------------------------------------------------- SIGTERM


def _sigterm_while_drawing(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> None:
    """Each figure saved notes the SIGTERM handler in place; the first sends SIGTERM where a handler would
    catch it (where none is, the test fails instead of the process ending)."""
    real = plots._save

    def save(fig: Any, path: str | Path) -> Path:
        p = real(fig, path)
        seen.append(signal.getsignal(signal.SIGTERM))
        if len(seen) == 1:
            assert seen[0] not in (signal.SIG_DFL, signal.SIG_IGN, None), "SIGTERM would end the process at once"
            os.kill(os.getpid(), signal.SIGTERM)
        return p

    monkeypatch.setattr(plots, "_save", save)


def test_sigterm_while_writing_ends_the_report_as_terminated_and_leaves_no_draft(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """In the main thread with SIGTERM's default action, the report holds a handler: SIGTERM ends it as
    Ctrl-C does (exit 143, one line), the drafts are removed, and the default action is back afterwards."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        seen: list[Any] = []
        _sigterm_while_drawing(monkeypatch, seen)
        assert cli(["report", str(tmp_path / "a")]) == 143
        assert capsys.readouterr().err == "splitfed report: terminated\n"
        assert len(seen) == 1  # no figure drawn after it
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
    out = tmp_path / "a" / "report"
    assert not out.exists() or list(out.iterdir()) == []


def test_a_sigterm_handler_of_the_callers_own_is_left_in_place(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A program around the API with its own SIGTERM handler: the report neither replaces it while it runs
    nor leaves the default action in its place afterwards."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    seen: list[Any] = []
    real = plots._save

    def save(fig: Any, path: str | Path) -> Path:
        seen.append(signal.getsignal(signal.SIGTERM))
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", save)

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not sent")

    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert cli(["report", str(tmp_path / "a")]) == 0
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen and all(h is mine for h in seen)
    assert after is mine


def test_a_report_in_another_thread_is_written(tmp_path: Path) -> None:
    """Signals are the main thread's: a report run from a worker thread leaves them alone and is written
    (asking for a handler there raises ValueError)."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    done: list[Any] = []

    def work() -> None:
        try:
            done.append(cli(["report", str(tmp_path / "a")]))
        except BaseException as e:  # noqa: BLE001 - shown in the assertion below
            done.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert done == [0]
    assert (tmp_path / "a" / "report" / "summary.md").is_file()


# ---------------------------------------------------------------- --out: a folder of the user's


def test_a_report_again_into_a_users_folder_keeps_its_manifest_true_and_the_users_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three reports into ``--out paper`` holding ``cuts_2_b.png`` of the user's (a name a report gives an
    earlier report's heatmap), the run's rows changed between the first two. Each is written, unasked;
    after each the manifest names every file the report wrote by its sha256 now, and never the user's file,
    which stays as it was."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    out = tmp_path / "paper"
    out.mkdir()
    (out / "cuts_2_b.png").write_bytes(b"my heatmap")
    (out / "notes.txt").write_text("mine\n")
    for i in range(3):
        if i == 1:
            write_run(tmp_path / "a", _rows(3, cut=2), {"label": "a"})
        assert cli(["report", str(tmp_path / "a"), "--out", str(out)]) == 0, capsys.readouterr().err
        assert (out / "cuts_2_b.png").read_bytes() == b"my heatmap"
        assert (out / "notes.txt").read_text() == "mine\n"
        written = json.loads((out / MANIFEST).read_text())["files"]
        assert "cuts_2_b.png" not in written and "notes.txt" not in written
        ours = sorted(p.name for p in out.iterdir())
        ours = [n for n in ours if n not in ("cuts_2_b.png", "notes.txt", MANIFEST)]
        assert ours == sorted(["accuracy_vs_time.png", "accuracy_per_round.png", "makespan.png", "bytes.png",
                               "accuracy_vs_bytes.png", "cuts_1_a.png", "summary.md", "summary.csv",
                               "rounds.csv"])
        assert all(_sha(out / n) in written[n] for n in ours), (i, written)
        assert _drafts(out) == []


def test_a_users_summary_is_replaced_only_with_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The user's own ``summary.md`` in ``--out``: refused, naming it, without ``--overwrite``; replaced with it."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    out = tmp_path / "paper"
    out.mkdir()
    (out / "summary.md").write_text("# my notes\n")
    assert cli(["report", str(tmp_path / "a"), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"splitfed report: error: cannot write the report to {out}: summary.md there was not written by "
        "splitfed report (give --overwrite to replace it, or another --out)\n")
    assert sorted(p.name for p in out.iterdir()) == ["summary.md"]
    assert cli(["report", str(tmp_path / "a"), "--out", str(out), "--overwrite"]) == 0
    assert (out / "summary.md").read_text().startswith("# splitfed report\n")


# ---------------------------------------------------------------- the terminal


def test_only_a_run_with_clients_gets_its_cuts_per_class_table(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose rows name clients gets its table of cuts per device class; one that names none, none."""
    write_run(tmp_path / "split", _rows(2), {"label": "split"})
    write_run(tmp_path / "plain", _rows(2, clients=False), {"label": "plain"})
    assert cli(["report", str(tmp_path / "split"), str(tmp_path / "plain")]) == 0
    out = capsys.readouterr().out
    assert out.count("cuts per device class") == 1
    assert "\nsplit: cuts per device class\n" in out


# ---------------------------------------------------------------- a write that fails


def test_a_write_that_fails_before_any_file_is_in_place_keeps_the_report_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A full disk as ``rounds.csv`` is drafted: nothing was put in place, and it says so; no draft is left."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    out = tmp_path / "a" / "report"
    assert cli(["report", str(tmp_path / "a")]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = jsonio.write_draft

    def full(path: str | Path, text: str | bytes) -> Path:
        if Path(path).name == "rounds.csv":
            raise OSError(28, "No space left on device")
        return real(path, text)

    monkeypatch.setattr(jsonio, "write_draft", full)
    capsys.readouterr()
    assert cli(["report", str(tmp_path / "a")]) == 1
    assert capsys.readouterr().err == (f"splitfed report: error: cannot write the report to {out}: rounds.csv: "
                                       "No space left on device (the report there before, if any, is kept)\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_write_that_fails_part_way_says_how_many_files_are_new(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The 4th of 9 files fails to go in place: "3 of its 9 files are new", exactly; the drafts of the 6 not
    put in place are removed; the next report is written."""
    write_run(tmp_path / "a", _rows(2), {"label": "a"})
    out = tmp_path / "a" / "report"
    assert cli(["report", str(tmp_path / "a")]) == 0
    real, calls = os.replace, []

    def fails(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", fails)
    capsys.readouterr()
    assert cli(["report", str(tmp_path / "a")]) == 1
    assert capsys.readouterr().err == (f"splitfed report: error: cannot write the report to {out}: bytes.png: "
                                       "No space left on device (3 of its 9 files are new)\n")
    assert _drafts(out) == []
    monkeypatch.setattr(os, "replace", real)
    assert cli(["report", str(tmp_path / "a")]) == 0
