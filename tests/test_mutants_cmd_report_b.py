"""What ``splitfed report`` promises about whose files its ``--out`` folder holds, and how a failed write is
named, that the mutation run of ``splitfed/commands/report.py`` (lines 201 on) found unpinned.

The report's own folder (:func:`owned_folder`) is the default one or any run folder's ``report``, a real
folder (not a link); a folder named otherwise, one beside no run, or a link is maybe the user's. There
(:func:`_ours`) a file is a report's only where the manifest lists it as it is now: never a link, a file not
listed, or one listed with other bytes; no manifest (or none that reads) lists nothing. The manifest lists a
file's bytes before the report only where they were the report's, and copes with a file not yet there. A
failed write names the file it was for (the error's file, else what was being written); a write that fails
before its draft exists is still one line, exit 1, no draft left. A draft's name is turned back into its
file's (``_named`` stripped ``.PID.tmp`` while drafts end ``.PID-THREAD.tmp``: the error named the hidden draft).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from splitfed.cli import main as cli
from splitfed.commands.report import MANIFEST, _manifest, _named, _ours, _written, owned_folder
from splitfed.jsonio import draft_of
from splitfed.report.runs import write_run
from tests.test_report import make_rows


def _run(folder: Path) -> Path:
    write_run(folder, make_rows(3))
    return folder


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- the report's own folder


def test_the_default_folder_of_several_runs_is_the_reports_own(tmp_path: Path) -> None:
    """``runs/report`` of ``runs/a runs/b`` is their default (no run beside it): the report's, where a
    ``summary.md`` is replaced unasked."""
    a, b = _run(tmp_path / "runs" / "a"), _run(tmp_path / "runs" / "b")
    assert owned_folder(tmp_path / "runs" / "report", [a, b]) is True
    assert owned_folder(tmp_path / "runs" / "other", [a, b]) is False


def test_any_run_folders_report_is_the_reports_own_but_not_a_link_nor_another_name(tmp_path: Path) -> None:
    """``b/report`` for run ``a`` is a run folder's report (``simulate --overwrite`` removes it with the run):
    the report's. ``b/paper``, ``paper`` beside no run, and ``c/report`` that links to the user's folder are
    maybe the user's."""
    a, b, c = (_run(tmp_path / n) for n in "abc")
    assert owned_folder(b / "report", [a]) is True
    assert owned_folder(b / "paper", [a]) is False
    assert owned_folder(tmp_path / "paper", [a]) is False
    mine = tmp_path / "mine"
    mine.mkdir()
    (c / "report").symlink_to(mine, target_is_directory=True)
    assert owned_folder(c / "report", [a]) is False


def test_a_summary_in_another_runs_report_is_replaced_unasked(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``report a --out b/report``: the folder is a run's report, so its ``summary.md`` is the report's and
    no manifest is written there."""
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    (b / "report").mkdir()
    (b / "report" / "summary.md").write_text("old\n")
    assert cli(["report", str(a), "--out", str(b / "report")]) == 0, capsys.readouterr().err
    assert (b / "report" / "summary.md").read_text().startswith("# splitfed report\n")
    assert not (b / "report" / MANIFEST).exists()


# ---------------------------------------------------------------- which files are a report's


def test_in_the_reports_own_folder_every_file_is_its_own(tmp_path: Path) -> None:
    """Owned: any path is the report's, a user's file or none there yet, whatever a manifest says."""
    (tmp_path / "summary.md").write_text("mine\n")
    ours = _ours(tmp_path, True)
    assert ours(tmp_path / "summary.md") is True
    assert ours(tmp_path / "bytes.png") is True


def test_elsewhere_only_a_listed_file_as_it_is_now_is_a_reports(tmp_path: Path) -> None:
    """Not owned: ``summary.md`` listed by its sha256 is the report's; ``rounds.csv`` not listed, a
    ``summary.csv`` listed with other bytes, a link to the listed file, a missing one are not."""
    for name, text in {"summary.md": "# splitfed report\n", "rounds.csv": "round\n", "summary.csv": "mine\n"}.items():
        (tmp_path / name).write_text(text)
    files = {"summary.md": [_sha(tmp_path / "summary.md")], "summary.csv": ["0" * 64]}
    (tmp_path / MANIFEST).write_text(json.dumps({"written by": "splitfed report", "files": files}))
    assert _written(tmp_path) == files
    (tmp_path / "bytes.png").symlink_to(tmp_path / "summary.md")
    files["bytes.png"] = files["summary.md"]
    (tmp_path / MANIFEST).write_text(json.dumps({"written by": "splitfed report", "files": files}))
    ours = _ours(tmp_path, False)
    assert ours(tmp_path / "summary.md") is True
    assert [ours(tmp_path / n) for n in ("rounds.csv", "summary.csv", "bytes.png", "gone.png")] == [False] * 4


def test_without_a_manifest_no_file_is_a_reports(tmp_path: Path) -> None:
    """No manifest: nothing listed (an empty mapping, not a failure), and a user's file there is theirs."""
    (tmp_path / "summary.md").write_text("mine\n")
    assert _written(tmp_path) == {}
    assert _ours(tmp_path, False)(tmp_path / "summary.md") is False


def test_the_manifest_keeps_a_files_bytes_before_only_where_they_were_a_reports(tmp_path: Path) -> None:
    """A user's ``summary.md`` replaced with ``--overwrite``: only the new bytes are listed (put back, it is
    theirs again). A report's ``rounds.csv``: old and new listed. ``summary.csv`` not there yet (the report's
    own folder): the new bytes alone, not a failure."""
    drafts = {}
    for name in ("summary.md", "rounds.csv", "summary.csv"):
        drafts[name] = tmp_path / f".{name}.draft"
        drafts[name].write_text(f"new {name}\n")
    (tmp_path / "summary.md").write_text("mine\n")
    (tmp_path / "rounds.csv").write_text("old rounds\n")
    staged = [(drafts[n], tmp_path / n) for n in ("summary.md", "rounds.csv")]
    files = json.loads(_manifest(staged, [], lambda p: p.name == "rounds.csv"))["files"]
    assert files == {"summary.md": [_sha(drafts["summary.md"])],
                     "rounds.csv": [_sha(drafts["rounds.csv"]), _sha(tmp_path / "rounds.csv")]}
    files = json.loads(_manifest([(drafts["summary.csv"], tmp_path / "summary.csv")], [], lambda p: True))["files"]
    assert files == {"summary.csv": [_sha(drafts["summary.csv"])]}


# ---------------------------------------------------------------- a failed write


def test_a_failed_write_names_its_file_else_what_was_being_written() -> None:
    """An error naming a file gives that file's name (the manifest's too, a dot first); one naming none (a
    full disk part way) gives what was being written."""
    assert _named(OSError(28, "No space left on device"), "summary.md") == "summary.md"
    assert _named(OSError(28, "No space left on device", "/r/out/rounds.csv"), "the figures") == "rounds.csv"
    assert _named(OSError(28, "No space left on device", f"/r/out/{MANIFEST}"), "summary.md") == MANIFEST


def _full_disk_at_summary_md(monkeypatch: pytest.MonkeyPatch) -> None:
    """``summary.md``'s draft cannot be made (a full disk): refused before the file exists."""
    import splitfed.jsonio as jsonio

    real = jsonio.write_draft

    def write_draft(path: str | Path, text: str | bytes) -> Path:
        if Path(path).name == "summary.md":
            raise OSError(28, "No space left on device", str(draft_of(path)))
        return real(path, text)

    monkeypatch.setattr(jsonio, "write_draft", write_draft)


def test_a_draft_that_could_not_be_made_is_one_line_and_leaves_no_draft(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Its draft never existed: the drafts of the figures are removed and the report stops with one line,
    exit 1, not a ``FileNotFoundError`` for the draft that is not there."""
    a = _run(tmp_path / "a")
    out = a / "report"
    _full_disk_at_summary_md(monkeypatch)
    assert cli(["report", str(a)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"splitfed report: error: cannot write the report to {out}: "), err
    assert err.endswith(": No space left on device (the report there before, if any, is kept)\n"), err
    assert err.count("\n") == 1, err
    assert list(out.iterdir()) == []


def test_a_draft_that_could_not_be_written_is_named_as_its_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The docstring's promise: a draft named as its file (``summary.md``), not ``.summary.md.PID-TID.tmp``."""
    assert _named(OSError(28, "No space left on device", str(draft_of(tmp_path / "bytes.png"))), "x") == "bytes.png"
    a = _run(tmp_path / "a")
    _full_disk_at_summary_md(monkeypatch)
    assert cli(["report", str(a)]) == 1
    assert f"{a / 'report'}: summary.md: No space left on device" in capsys.readouterr().err
