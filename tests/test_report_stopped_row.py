"""``splitfed report`` of a run stopped by Ctrl-C: its row names the run's mode, tiers and U-shape.

Such a folder has no ``summary.json`` (written last), only its rows and its checkpoint, whose settings say what
the run was. Before, the summary row showed ``-`` for mode, tiers and U-shape. The checkpoint's settings are
read without torch and without its weights (its pickle, tensors left unread), and not at all for a folder
that has its summary. Folders are made here as a run leaves them: rows and checkpoint written while the
folder is claimed, the claim ended by a KeyboardInterrupt (its lock records ``stopped``, SIGINT).
"""

from __future__ import annotations

import csv
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from splitfed.cli import main as cli
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import summarise
from splitfed.report import runs as report_runs
from splitfed.report.runs import load_run, write_run
from splitfed.report.summary import summary_rows
from tests.test_report import make_rows

SETTINGS = RunSettings(mode="sflv2", tiers=2, u_shape=True, cuts="static:1,5").to_dict()  # none the default


def _stopped(folder: Path, rounds: int = 2, settings: dict | None = None) -> Path:
    """A run stopped by Ctrl-C after ``rounds`` rounds: rows and a checkpoint, no summary."""
    with pytest.raises(KeyboardInterrupt), runfolder.claim(folder, resume=False, overwrite=False):
        write_run(folder, make_rows(rounds))
        checkpoint.save(folder, checkpoint.Checkpoint(rounds, {"w": torch.zeros(3)}, settings or SETTINGS))
        raise KeyboardInterrupt
    return folder


def test_a_stopped_runs_row_names_its_mode_and_tiers_from_its_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _stopped(tmp_path / "stopped-run")
    assert cli(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    [row] = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert (row["mode"], row["tiers"], row["U-shape"], row["status"]) == ("sflv2", "2", "yes", "stopped")
    table_row = next(line for line in printed.splitlines() if line.startswith("stopped-run "))
    assert table_row.split()[1:4] == ["sflv2", "2", "yes"]


def test_the_checkpoints_weights_and_torch_load_are_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its settings come from the pickle alone: torch.load (which reads every tensor) is never called."""
    run = _stopped(tmp_path / "run")

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_load)
    _, [row] = summary_rows([load_run(run)])
    assert row[1:4] == ["sflv2", 2, "yes"]


def test_a_finished_runs_checkpoint_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its summary says: the checkpoint beside it (another mode here) is left unread."""
    run = tmp_path / "run"
    with runfolder.claim(run, resume=False, overwrite=False):
        rows = make_rows(2)
        checkpoint.save(run, checkpoint.Checkpoint(2, {"w": torch.zeros(3)}, SETTINGS))
        write_run(run, rows, summarise(rows, RunSettings(mode="sl", tiers=3).to_dict()))

    def unread(folder: Path) -> dict:
        raise AssertionError(f"{folder}'s checkpoint read")

    monkeypatch.setattr(report_runs, "recorded_settings", unread)
    _, [row] = summary_rows([load_run(run)])
    assert row[1:4] == ["sl", 3, "no"]


def _pickle_as_checkpoint(path: Path, payload: bytes) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)


class _Runs:
    def __reduce__(self) -> tuple:
        return (print, ("ran",))


@pytest.mark.parametrize("make", [
    lambda p: p.write_bytes(b"not a zip"),
    lambda p: _pickle_as_checkpoint(p, b"\x80\x02}q\x00."),  # a pickle of {}: no meta
    lambda p: _pickle_as_checkpoint(p, pickle.dumps({"meta": "{not json"})),
    lambda p: _pickle_as_checkpoint(p, pickle.dumps({"meta": _Runs()})),  # a callable no checkpoint holds
], ids=["not a zip", "no meta", "meta not JSON", "a foreign callable"])
def test_a_checkpoint_that_says_nothing_leaves_dashes_and_runs_nothing(tmp_path: Path, make: object,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = _stopped(tmp_path / "run")
    assert callable(make)
    make(run / checkpoint.FILENAME)
    capsys.readouterr()
    loaded = load_run(run)
    _, [row] = summary_rows([loaded])
    assert row[1:4] == [None, None, None] and loaded.status == "stopped"
    assert capsys.readouterr().out == ""  # print("ran") was not called


def test_a_stopped_run_without_a_checkpoint_still_shows_dashes(tmp_path: Path) -> None:
    """The in-process backend writes no checkpoint: nothing in the folder names the mode."""
    run = _stopped(tmp_path / "run")
    (run / checkpoint.FILENAME).unlink()
    _, [row] = summary_rows([load_run(run)])
    assert row[1:4] == [None, None, None]


def test_the_pickle_read_is_the_one_torch_wrote(tmp_path: Path) -> None:
    """Its settings as :func:`checkpoint.load` reads them (the same file, read the slow way)."""
    run = _stopped(tmp_path / "run")
    assert checkpoint.recorded_settings(run) == checkpoint.load(run).settings == SETTINGS
