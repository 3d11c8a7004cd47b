"""Resuming a run: the files it names, the rows it drops, and what it says at its end.

- ``--resume DIR --fleet F`` (or ``--dataset npz:F``) naming, relative, the file the run recorded absolute is
  the same setting: before, it was refused as "cannot resume with different fleet ('/abs/F' -> 'F')"; a file
  moved since is refused naming the path the run recorded;
- an older checkpoint of the run put in its finished folder says which rows it drops and trains again;
- a disk that fills while the end-of-run figures are drawn: the run is done (exit 0, its done line), the
  figures not drawn are said, with how to draw them later, and the figures of an earlier part are removed;
- the run folder line lists the files that are there;
- a checkpoint missing beside kept rounds: the refusal also holds for a run of the in-process backend;
- a checkpoint of another run, ahead of the rows, is named before the metrics file.

The runs are Flower's apps in this process (:mod:`tests.flower_fixtures`): no Ray, no tier processes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import clients.app
from splitfed.cli import main
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings, absolute_paths
from splitfed.flower.metrics import METRICS, SUMMARY
from tests.flower_fixtures import FakeGrid, inprocess_tiers

ROOT = Path(__file__).resolve().parent.parent
SMALL = RunSettings(rounds=1, clients=2, tiers=2, cuts="static:2", model="mlp", batch_size=64, seed=1)


def _run(folder: Path, monkeypatch: pytest.MonkeyPatch, rounds: int = 1, **given: object) -> list[str]:
    """A run of ``SMALL`` (with ``given``) in ``folder``, its paths recorded absolute as ``simulate`` records
    them, resumed if a checkpoint is there; the lines it said."""
    import server.app

    resume = (folder / checkpoint.FILENAME).is_file()
    settings = absolute_paths(SMALL.with_(out=str(folder), rounds=rounds, resume=resume, **given))
    said: list[str] = []
    with inprocess_tiers(monkeypatch, settings.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, settings.clients), settings, progress=said.append)
    return said


def _npz(path: Path) -> Path:
    """8 train and 4 test samples shaped as digits, labels 0..3."""
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.random((8, 1, 8, 8), dtype=np.float32), y_train=np.arange(8) % 4,
             x_test=rng.random((4, 1, 8, 8), dtype=np.float32), y_test=np.arange(4))
    return path


@pytest.mark.parametrize("spelled", ["myfleet.toml", "./myfleet.toml"])
def test_a_resume_naming_the_runs_fleet_file_relative_is_no_other_fleet(tmp_path, monkeypatch, capsys, spelled):
    """Before: ``cannot resume with different fleet ('/abs/myfleet.toml' -> 'myfleet.toml')``, exit 2."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "splitfed" / "fleets" / "small.toml", "myfleet.toml")
    _run(tmp_path / "run", monkeypatch, fleet="myfleet.toml")
    assert checkpoint.load(tmp_path / "run").settings["fleet"] == str(tmp_path / "myfleet.toml")
    assert main(["simulate", "--resume", "run", "--fleet", spelled, "--json"]) == 0
    assert "nothing to do: run already holds round 1 of 1" in capsys.readouterr().err


def test_a_resume_naming_the_runs_npz_file_relative_is_no_other_dataset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _npz(tmp_path / "d.npz")
    _run(tmp_path / "run", monkeypatch, dataset="npz:d.npz")
    assert checkpoint.load(tmp_path / "run").settings["dataset"] == f"npz:{tmp_path / 'd.npz'}"
    assert main(["simulate", "--resume", "run", "--dataset", "npz:d.npz", "--json"]) == 0
    assert "nothing to do: run already holds round 1 of 1" in capsys.readouterr().err


def test_a_resume_naming_a_moved_fleet_file_says_the_path_the_run_recorded(tmp_path, monkeypatch, capsys):
    """The same contents elsewhere are still another setting (the run records one path): the refusal says
    which path that is, and the two ways on."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "splitfed" / "fleets" / "small.toml", "myfleet.toml")
    _run(tmp_path / "run", monkeypatch, fleet="myfleet.toml")
    (tmp_path / "moved").mkdir()
    (tmp_path / "myfleet.toml").rename(tmp_path / "moved" / "myfleet.toml")
    assert main(["simulate", "--resume", "run", "--fleet", "moved/myfleet.toml"]) == 2
    old, new = tmp_path / "myfleet.toml", tmp_path / "moved" / "myfleet.toml"
    assert capsys.readouterr().err == (
        f"splitfed simulate: error: cannot resume with different fleet ('{old}' -> '{new}'); the run recorded "
        f"fleet '{old}': give that path, or put the file back there if it moved\n")


def test_an_older_checkpoint_of_the_run_says_which_rows_it_drops(tmp_path, monkeypatch):
    """Before, the rows after the checkpoint's round were dropped and trained again without a word."""
    run, old = tmp_path / "run", tmp_path / "round1.pt"
    _run(run, monkeypatch, rounds=1)
    shutil.copy(run / checkpoint.FILENAME, old)
    _run(run, monkeypatch, rounds=3)
    rows = (run / METRICS).read_text().splitlines()
    shutil.copy(old, run / checkpoint.FILENAME)  # the round-1 checkpoint of the finished 3-round run
    said = _run(run, monkeypatch, rounds=3)
    assert "metrics.jsonl: rows 2..3 are after the checkpoint's round 1: dropped, trained again" in said
    assert [json.loads(r)["round"] for r in (run / METRICS).read_text().splitlines()] == [1, 2, 3]
    assert (run / METRICS).read_text().splitlines()[0] == rows[0]


def test_a_resume_after_a_crash_between_a_checkpoint_and_its_row_drops_nothing_and_says_so(tmp_path, monkeypatch):
    """The case the step serves: the row the checkpoint's copy puts back is said as such, nothing is dropped."""
    run = tmp_path / "run"
    _run(run, monkeypatch, rounds=2)
    lines = (run / METRICS).read_text().splitlines()
    (run / METRICS).write_text(lines[0] + "\n" + lines[1][:40])  # round 2's row cut short
    said = _run(run, monkeypatch, rounds=3)
    assert "round 2's metrics row, lost in a crash after its checkpoint was written, is put back from the " \
           "checkpoint" in said
    assert not [line for line in said if "dropped" in line]
    assert [json.loads(r)["round"] for r in (run / METRICS).read_text().splitlines()] == [1, 2, 3]


def _finished_run(folder: Path, monkeypatch: pytest.MonkeyPatch, rounds: int = 1) -> None:
    """A run that ``simulate`` could end: its rows, summary and checkpoint, no figure yet."""
    _run(folder, monkeypatch, rounds=rounds)
    assert (folder / SUMMARY).is_file()


def test_figures_that_cannot_be_drawn_leave_the_run_done(tmp_path, monkeypatch, capsys):
    """Before: exit 1 with ``[Errno 28] No space left on device: '.../makespan.png'`` and no done line, the
    figures of the earlier part of the run left as if this run's. Now exit 0 (the run is whole: README's 1
    is a run that failed), its done line, then what was not drawn and how to draw it; the figures there
    before are removed. The full disk: a failing draw of the makespan figure, in this process."""
    import errno

    import splitfed.report.plots as plots

    run = tmp_path / "run"
    _finished_run(run, monkeypatch, rounds=1)
    assert main(["simulate", "--resume", str(run)]) == 0  # nothing to do: draws the round-1 figures
    before = sorted(p.name for p in run.glob("*.png"))
    assert "makespan.png" in before
    _run(run, monkeypatch, rounds=2)  # trained on: the figures there are round 1's

    def full(runs, path):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plots, "makespan_plot", full)
    capsys.readouterr()
    assert main(["simulate", "--resume", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip("\n").splitlines()[-2:] == [
        f"done: 2 round(s), final accuracy {json.loads((run / SUMMARY).read_text())['final_accuracy']:.4f}",
        f"run folder: {run} (metrics.jsonl, summary.json, checkpoint, 0 figure(s))"]
    assert err.splitlines()[-1] == (
        f"the figures were not drawn ([Errno 28] No space left on device: '{run / 'makespan.png'}'); the "
        f"{len(before)} figure(s) drawn there before are removed; draw them with: splitfed report {run}")
    assert not list(run.glob("*.png")) and not list(run.glob(".*png*"))  # no draft left either
    assert sorted(p.name for p in run.iterdir()) == [".splitfed.lock", checkpoint.FILENAME, METRICS, SUMMARY]


def test_the_run_folder_line_lists_what_is_there(tmp_path, monkeypatch, capsys):
    """Before: ``--resume d --rounds 1`` of a run stopped at round 1 of 2 listed a summary.json it lacks."""
    run = tmp_path / "run"
    real = checkpoint.save

    def save(where, ckpt):  # type: ignore[no-untyped-def]
        if ckpt.round == 2:  # stopped (Ctrl-C) once round 1 was kept
            raise KeyboardInterrupt
        return real(where, ckpt)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(checkpoint, "save", save)
        _run(run, monkeypatch, rounds=2)
    assert not (run / SUMMARY).exists()
    assert main(["simulate", "--resume", str(run), "--rounds", "1"]) == 0
    figures = len(list(run.glob("*.png")))
    assert capsys.readouterr().out.rstrip("\n").splitlines()[-1] == (
        f"run folder: {run} (metrics.jsonl, checkpoint, {figures} figure(s))")


def test_a_missing_checkpoint_beside_kept_rounds_also_names_the_in_process_backend(tmp_path, capsys):
    """A run of the in-process backend (experiments' ``backend = "inprocess"``) writes no checkpoint, and
    nothing in its folder says which backend ran it: the refusal is true of both cases."""
    from splitfed.sim.inprocess import train_inprocess

    run = tmp_path / "run"
    train_inprocess(SMALL.with_(out=str(run)), progress=lambda line: None)
    assert main(["simulate", "--resume", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"splitfed simulate: error: cannot resume: {run / checkpoint.FILENAME} is missing, though {run / METRICS} "
        "holds 1 finished round(s): put the checkpoint back, or start the run over with --overwrite (a run of "
        "the in-process backend writes no checkpoint: it does not resume)\n")


def test_a_checkpoint_of_another_run_ahead_of_the_rows_is_named_first(tmp_path, monkeypatch, capsys):
    """Before: ``metrics.jsonl lacks round(s) 2, 3 ... put the file back``, for a round-3 checkpoint of a run in
    another folder put beside a 1-row run."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _run(ours, monkeypatch, rounds=1)
    _run(theirs, monkeypatch, rounds=3)
    shutil.copy(theirs / checkpoint.FILENAME, ours / checkpoint.FILENAME)
    assert main(["simulate", "--resume", str(ours)]) == 2
    assert capsys.readouterr().err == (
        f"splitfed simulate: error: cannot resume: {ours / checkpoint.FILENAME} holds round 3, but "
        f"{ours / METRICS} lacks round(s) 2, and the checkpoint was written in {checkpoint.place(theirs)} (a "
        "checkpoint of another run put in this folder?); put this run's checkpoint back (or its metrics file, if "
        "that was cut), or start the run over with --overwrite\n")
