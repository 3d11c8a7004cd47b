"""What ``simulations/common.py`` promises about an experiment's runs that the mutation run found unpinned.

- :func:`train` returns the run it trained, named by its label (in the returned run and in its
  ``summary.json``, whose keys stay sorted as a run writes them); training again into the same run folder
  replaces it (an experiment's rerun is no refusal);
- the ``.experiment`` mark beside an experiment's runs (``runs/.experiment``) is written only for a named
  experiment training under ``runs/``, making the folders it needs, and an existing mark is left as it is;
- with ``--resume`` (``_resuming(True, ...)``) a run whose ``summary.json`` says it finished (as many rounds,
  the same settings but for the resumable keys) is kept, not trained, one of other settings refused; without
  it, it trains again; a Flower
  run with a checkpoint continues from it (``resume=True, overwrite=False`` reach the runner), an in-process
  one, or a Flower one without a checkpoint, starts again; ``_finished`` reads an unreadable summary as no
  finished run (``False``);
- each line train() prints, its progress too, is flushed at once: a script of the user's own calling train()
  with a block-buffered stdout (a pipe; ``main`` is not there to make it line-buffered) shows each as it comes.

The Flower branch is checked with :func:`splitfed.sim.runner.simulate` replaced by a recorder (a real Flower
run takes tens of seconds): what it pins is the settings that reach the runner and what is printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulations import common
from splitfed.errors import ConfigError
from splitfed.sim import inprocess, runner

TABLE = {"clients": 2, "rounds": 1, "model": "cnn", "dataset": "digits", "partition": "iid",
         "cuts": "static:2,5", "seed": 0}


def settings(**changes: Any) -> Any:
    return common.base_settings({**TABLE, **changes})


class Stop(Exception):
    """What the stand-in runners raise once they have recorded their call."""


@pytest.fixture
def no_flower(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process run must never start Flower's simulation engine."""
    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the in-process backend ran the Flower runner")

    monkeypatch.setattr(runner, "simulate", refuse)


def record_runner(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """Replace ``module.name`` (a runner) by one that records its settings, prints one progress line, stops."""
    seen: list[Any] = []

    def fake(s: Any, progress: Any = None) -> None:
        seen.append(s)
        if progress is not None:
            progress("round 1/1")
        raise Stop()

    monkeypatch.setattr(module, name, fake)
    return seen


class BlockBuffered:
    """A stdout that passes on only what was flushed (as a pipe's block buffer does)."""

    def __init__(self) -> None:
        self.pending = ""
        self.flushed = ""

    def write(self, text: str) -> int:
        self.pending += text
        return len(text)

    def flush(self) -> None:
        self.flushed += self.pending
        self.pending = ""


# ---------------------------------------------------------------- train(): the run, its label, a rerun


def test_train_returns_its_run_labelled_and_a_rerun_replaces_the_folder(tmp_path: Path, no_flower: None) -> None:
    """train() returned the run read back (before: None to the scripts); the label lands in summary.json with
    its keys sorted; a second train() into the same folder replaces it (before: refused, the folder held)."""
    out = tmp_path / "r"
    run = common.train(settings(), out, "first", backend="inprocess")
    assert run is not None and run.label == "first" and len(run.rounds) == 1
    text = (out / "summary.json").read_text()
    summary = json.loads(text)
    assert summary["label"] == "first"
    assert list(summary) == sorted(summary)  # as the run wrote it: diff-stable
    again = common.train(settings(), out, "second", backend="inprocess")
    assert again.label == "second" and len(again.rounds) == 1
    assert json.loads((out / "summary.json").read_text())["label"] == "second"


# ---------------------------------------------------------------- the .experiment mark beside the runs


def test_a_named_experiment_marks_its_runs_folder_making_the_folders(tmp_path: Path, no_flower: None) -> None:
    """The mark names the experiment (its --resume refuses another's runs); the runs folder's parents are made."""
    out = tmp_path / "a" / "b"
    with common._resuming(False, "compression"):
        (run,) = common.run_cases([("none", settings())], out, "inprocess")
    assert run.label == "none"
    assert json.loads((out / "runs" / common.MARK).read_text()) == {"experiment": "compression"}


def test_the_mark_is_written_into_a_runs_folder_already_there(tmp_path: Path, no_flower: None) -> None:
    """An existing runs folder (no mark yet) is no error."""
    (tmp_path / "runs").mkdir()
    with common._resuming(False, "drift"):
        common.run_cases([("none", settings())], tmp_path, "inprocess")
    assert json.loads((tmp_path / "runs" / common.MARK).read_text()) == {"experiment": "drift"}


def test_no_mark_without_a_name_nor_outside_runs_and_an_old_mark_stays(tmp_path: Path, monkeypatch) -> None:
    """Only a named experiment under runs/ writes it, and once: the first experiment's name is kept."""
    record_runner(monkeypatch, inprocess, "train_inprocess")
    with common._resuming(False, ""), pytest.raises(Stop):  # no experiment's name: no mark
        common.run_cases([("none", settings())], tmp_path / "unnamed", "inprocess")
    assert not (tmp_path / "unnamed" / "runs" / common.MARK).exists()
    with common._resuming(False, "drift"), pytest.raises(Stop):  # a run folder not under runs/
        common.train(settings(), tmp_path / "solo" / "r", "solo", backend="inprocess")
    assert not (tmp_path / "solo" / common.MARK).exists()
    (tmp_path / "old" / "runs").mkdir(parents=True)
    (tmp_path / "old" / "runs" / common.MARK).write_text('{"experiment": "compression"}')
    with common._resuming(False, "drift"), pytest.raises(Stop):
        common.run_cases([("none", settings())], tmp_path / "old", "inprocess")
    assert json.loads((tmp_path / "old" / "runs" / common.MARK).read_text()) == {"experiment": "compression"}


# ---------------------------------------------------------------- --resume: kept, trained again, continued


def test_resume_keeps_a_finished_run_and_without_it_the_run_trains_again(tmp_path: Path, monkeypatch,
                                                                         capsys, no_flower: None) -> None:
    """A finished run is kept under --resume (its line says so, nothing trains); without --resume it trains."""
    out = tmp_path / "runs" / "r"
    with common._resuming(True, "x"):
        common.train(settings(), out, "r", backend="inprocess")  # nothing there yet: trains
    capsys.readouterr()
    seen = record_runner(monkeypatch, inprocess, "train_inprocess")
    with common._resuming(True, "x"):
        kept = common.train(settings(), out, "r", backend="inprocess")
    assert seen == [] and kept.label == "r" and len(kept.rounds) == 1
    assert f"  [r] kept: its 1 round(s) in {out}\n" in capsys.readouterr().out
    with common._resuming(False, "x"), pytest.raises(Stop):
        common.train(settings(), out, "r", backend="inprocess")
    assert len(seen) == 1 and "kept" not in capsys.readouterr().out


def test_a_flower_run_with_a_checkpoint_continues_from_it_on_resume(tmp_path: Path, monkeypatch, capsys) -> None:
    """The runner is asked to resume the folder (not overwrite it), and the line says it continues."""
    seen = record_runner(monkeypatch, runner, "simulate")
    out = tmp_path / "runs" / "r"
    out.mkdir(parents=True)
    (out / "checkpoint.pt").write_bytes(b"")
    with common._resuming(True, "x"), pytest.raises(Stop):
        common.train(settings(), out, "r", backend="flower")
    (s,) = seen
    assert s.resume is True and s.overwrite is False and s.out == str(out)
    printed = capsys.readouterr().out
    assert "[r] flower: cuts=static:2,5 mode=" in printed and f"continues in {out}" in printed, printed


def test_without_a_checkpoint_or_in_process_a_resumed_run_starts_again(tmp_path: Path, monkeypatch, capsys) -> None:
    """A Flower run with no checkpoint, and an in-process one (which cannot resume), start over its folder."""
    flower = record_runner(monkeypatch, runner, "simulate")
    local = record_runner(monkeypatch, inprocess, "train_inprocess")
    bare = tmp_path / "runs" / "bare"
    with common._resuming(True, "x"), pytest.raises(Stop):
        common.train(settings(), bare, "bare", backend="flower")
    ckpt = tmp_path / "runs" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "checkpoint.pt").write_bytes(b"")
    with common._resuming(True, "x"), pytest.raises(Stop):
        common.train(settings(), ckpt, "ckpt", backend="inprocess")
    assert [(s.resume, s.overwrite) for s in flower] == [(False, True)]
    assert [(s.resume, s.overwrite) for s in local] == [(False, True)]
    printed = capsys.readouterr().out
    assert f"-> {bare}" in printed and f"-> {ckpt}" in printed and "continues in" not in printed


# ---------------------------------------------------------------- _finished: what counts as this run finished


def write_summary(out: Path, rounds: Any, recorded: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"rounds": rounds, "settings": recorded}))


def test_finished_compares_rounds_and_the_math_not_the_resumable_keys(tmp_path: Path) -> None:
    """Kept only with as many rounds and the same math (other math is refused); a resumable key (a timeout, the
    folder) may differ."""
    out = tmp_path / "r"
    now = settings(rounds=2).with_(out=str(out), overwrite=True)  # as train() asks
    write_summary(out, 2, now.to_dict())
    assert common._finished(now, out) is True
    write_summary(out, 2, now.with_(round_timeout_s=now.round_timeout_s + 5, out="elsewhere",
                                    overwrite=False).to_dict())
    assert common._finished(now, out) is True
    write_summary(out, 1, now.to_dict())  # stopped after round 1 of 2
    assert common._finished(now, out) is False
    write_summary(out, 2, now.with_(seed=1).to_dict())  # another run's math: refused, not trained over
    with pytest.raises(ConfigError) as e:
        common._finished(now, out)
    assert str(e.value) == (f"run {out}: cannot resume with different seed (1 -> 0): --resume with the config it "
                            "ran with, or give another --out, or --overwrite to start over")
    write_summary(out, 2, {k: v for k, v in now.to_dict().items() if k != "seed"})  # as simulate: its default
    assert common._finished(now, out) is True


@pytest.mark.parametrize("text", [None, "{not json", "[1, 2]", '{"rounds": 2}', '"a string"'])
def test_an_unreadable_summary_is_no_finished_run(tmp_path: Path, text: str | None) -> None:
    """Missing, not JSON, not a table, without settings: False (so the run trains), never an error."""
    out = tmp_path / "r"
    out.mkdir()
    if text is not None:
        (out / "summary.json").write_text(text)
    assert common._finished(settings(rounds=2).with_(out=str(out)), out) is False


# ---------------------------------------------------------------- every line flushed as it is printed


def test_each_line_train_prints_is_flushed_at_once(tmp_path: Path, monkeypatch, no_flower: None) -> None:
    """With a block-buffered stdout (train() in a user's own script, its output piped) nothing waits unflushed:
    the start line and progress of an in-process run, a kept run's line, a Flower run's start line (out before
    the run begins) and progress."""
    stdout = BlockBuffered()
    monkeypatch.setattr("sys.stdout", stdout)
    out = tmp_path / "runs" / "r"
    with common._resuming(True, "x"):
        common.train(settings(), out, "r", backend="inprocess")
    assert stdout.pending == "" and "[r] inprocess: cuts=static:2,5" in stdout.flushed
    assert "[r] round 1/1" in stdout.flushed, stdout.flushed
    with common._resuming(True, "x"):
        common.train(settings(), out, "r", backend="inprocess")
    assert stdout.pending == "" and "[r] kept: its 1 round(s)" in stdout.flushed
    at_start: list[str] = []

    def simulate(s: Any, progress: Any) -> None:  # what was out when the run started, then its progress
        at_start.append(stdout.flushed)
        progress("round 1/1")
        raise Stop()

    monkeypatch.setattr(runner, "simulate", simulate)
    with common._resuming(False, "x"), pytest.raises(Stop):
        common.train(settings(), tmp_path / "runs" / "f", "f", backend="flower")
    (before,) = at_start
    assert "[f] flower: cuts=static:2,5 mode=" in before and f"-> {tmp_path / 'runs' / 'f'}\n" in before
    assert stdout.pending == "" and "[f] round 1/1" in stdout.flushed
