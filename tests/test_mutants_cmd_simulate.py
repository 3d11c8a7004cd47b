"""What ``splitfed simulate`` promises that the mutation run of ``splitfed/commands/simulate.py`` found unpinned.

``--tiers`` takes 2 and 3 and nothing else. A default run folder already taken gets ``-2`` (checked on its own:
a folder that is there is numbered at once, whatever comes first). ``--json`` prints the summary alone on stdout,
indented by 2 with its keys sorted. Without it the run ends with its rounds table, the cuts per device class, the
final accuracy to 4 places (``n/a`` when the summary holds none) and the run folder with the number of figures
drawn in it. The command's ``run`` returns 0 on both paths. A run stopped (Ctrl-C) before any round was kept says
to run the same command again; a run that ended over a checkpoint it cannot read, or one that has no folder, has
no hint to give (``""``).

The simulation engine (Ray + Flower, 20-60 s a run) is stood in for by the in-process backend
(``splitfed.sim.inprocess.train_inprocess``: the same rounds, metrics and summary, in this process, a fraction
of a second for this run) or by a stand-in that fails or is interrupted as a run would: what is pinned here is
what the command does with the run's outcome, not the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import splitfed.sim.runner
from splitfed import cli
from splitfed.commands.simulate import _continue_hint, _fresh_folder
from splitfed.engine.rounds import RoundFailed
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.sim.inprocess import train_inprocess

TINY = ["--clients", "2", "--rounds", "1", "--tiers", "2", "--cuts", "static:2", "--model", "mlp",
        "--batch-size", "64", "--seed", "1"]


def _command(argv: list[str]) -> Any:
    """The command's own ``run`` (what ``splitfed.cli.main`` calls), with what it returns as it is."""
    args = cli.build_parser().parse_args(["simulate", *argv])
    return args.func(args)


@pytest.fixture
def inprocess(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The simulation engine stood in for by the in-process backend; the summaries it returned."""
    summaries: list[dict[str, Any]] = []

    def simulate(settings, progress=print, verbose=False, cpus=None, resumed=None):  # type: ignore[no-untyped-def]
        assert resumed is None
        summaries.append(train_inprocess(settings, progress))
        return summaries[-1]

    monkeypatch.setattr(splitfed.sim.runner, "simulate", simulate)
    return summaries


def test_tiers_takes_2_and_3_only(capsys: pytest.CaptureFixture[str]) -> None:
    """Device + 1 or 2 server tiers: 3 (the default) and 2 parse; 4 is argparse's refusal, exit 2."""
    parser = cli.build_parser()
    assert parser.parse_args(["simulate", "--tiers", "3"]).tiers == 3
    assert parser.parse_args(["simulate", "--tiers", "2"]).tiers == 2
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["simulate", "--tiers", "4"])
    assert e.value.code == 2
    assert "argument --tiers: invalid choice: 4 (choose from 2, 3)" in capsys.readouterr().err


def test_a_default_run_folder_already_there_is_numbered(tmp_path: Path) -> None:
    """Two runs started within one second: the second's folder is ``-2`` at once (checked alone, before a
    folder not there is ever asked about: a loop on the wrong test would never end on that)."""
    stem = tmp_path / "sim-20261130-120000"
    stem.mkdir()
    assert _fresh_folder(stem) == str(tmp_path / "sim-20261130-120000-2")


def test_json_prints_the_summary_alone_indented_with_sorted_keys(tmp_path: Path, inprocess: list[dict[str, Any]],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--json``: for ``| jq`` and for people alike, stdout is the summary and nothing else, indented by 2,
    its keys sorted (the summary's own order is not); the round lines go to stderr."""
    out = tmp_path / "run"
    assert _command([*TINY, "--out", str(out), "--json"]) == 0
    printed, err = capsys.readouterr()
    (summary,) = inprocess
    assert list(summary) != sorted(summary)  # so the sorting shows
    assert printed == json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"
    assert printed.startswith('{\n  "best_accuracy": ') and '\n    "batch_size": 64,\n' in printed
    assert "round 1" in err and "done:" not in printed + err


def test_a_run_ends_with_its_tables_accuracy_and_figures(tmp_path: Path, inprocess: list[dict[str, Any]],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The end of a run: its rounds table, the cuts per device class, the final accuracy to 4 places, and the
    run folder with the number of figures the command drew there."""
    out = tmp_path / "run"
    assert _command([*TINY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    (summary,) = inprocess
    figures = sorted(p.name for p in out.glob("*.png"))
    assert len(figures) >= 5 and "cuts_1_run.png" in figures, figures
    assert "run: rounds\nround  accuracy" in printed
    assert "run: cuts per device class\ndevice class  clients  cuts round 1" in printed
    assert printed.rstrip("\n").splitlines()[-2:] == [
        f"done: 1 round(s), final accuracy {summary['final_accuracy']:.4f}",
        f"run folder: {out} (metrics.jsonl, summary.json, {len(figures)} figure(s))"]  # the stand-in keeps no checkpoint


def test_a_summary_without_a_final_accuracy_reads_n_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A summary whose final accuracy is null (as ``summary.json`` holds a non-finite one) is "n/a", not a
    traceback once the run is over. Stood in for: the in-process run's summary with its accuracy taken out."""
    monkeypatch.setattr(splitfed.sim.runner, "simulate",
                        lambda settings, **kw: {**train_inprocess(settings), "final_accuracy": None})
    assert cli.main(["simulate", *TINY, "--out", str(tmp_path / "run")]) == 0
    assert "\ndone: 1 round(s), final accuracy n/a\n" in capsys.readouterr().out


def test_a_run_interrupted_before_any_round_was_kept_says_to_start_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C before round 1 was kept: nothing to resume, so the hint is the same command again; a run that
    failed there would only fail again, so it gets no hint at all."""
    out = tmp_path / "run"

    def interrupted(settings, **kw):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    def failed(settings, **kw):  # type: ignore[no-untyped-def]
        raise RoundFailed("round 1: 0 of 2 clients finished")

    monkeypatch.setattr(splitfed.sim.runner, "simulate", interrupted)
    assert cli.main(["simulate", *TINY, "--out", str(out)]) == 130
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "splitfed simulate: interrupted",
        f"splitfed simulate: no round was kept in {out}: run the same command again to start over"]
    monkeypatch.setattr(splitfed.sim.runner, "simulate", failed)
    assert cli.main(["simulate", *TINY, "--out", str(out)]) == 1
    assert capsys.readouterr().err.splitlines()[-1:] == ["splitfed simulate: error: round 1: 0 of 2 clients finished"]


def test_a_run_over_a_checkpoint_it_cannot_read_has_no_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint that cannot be read says nothing of where to continue: the run's error alone, no traceback
    from the hint, and the hint itself is "" (nothing to say), a string as for every other run."""
    out = tmp_path / "run"

    def fails_over_a_damaged_checkpoint(settings, **kw):  # type: ignore[no-untyped-def]
        Path(settings.out).mkdir(parents=True, exist_ok=True)
        (Path(settings.out) / checkpoint.FILENAME).write_bytes(b"not a checkpoint")
        raise RoundFailed("round 2: 0 of 2 clients finished")

    monkeypatch.setattr(splitfed.sim.runner, "simulate", fails_over_a_damaged_checkpoint)
    assert cli.main(["simulate", *TINY, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1:] == ["splitfed simulate: error: round 2: 0 of 2 clients finished"], err
    assert "Traceback" not in err
    assert _continue_hint(RunSettings(rounds=1, out=str(out)), stopped=True) == ""


def test_a_run_with_no_folder_has_nothing_kept_to_continue() -> None:
    """Settings without a run folder (``out`` empty, as ``RunSettings()`` has it) hold no round: no hint, not
    "round 1 of 3 is kept in ". (``splitfed simulate`` itself always names a folder.)"""
    assert RunSettings().out == ""
    assert _continue_hint(RunSettings(), stopped=False) == ""
    assert _continue_hint(RunSettings(rounds=1), stopped=False) == ""


def test_the_command_that_continues_a_run_names_a_folder_with_spaces_as_one_word(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The last line of a stopped run is a command to paste: a folder with a space (or a quote) in its name is
    quoted, so the shell hands it to ``--resume`` whole (before: ``--resume /tmp/my runs/run 1``, three words)."""
    import shlex

    out = tmp_path / "my runs" / "run 1 'b'"

    def one_round_then_ctrl_c(settings, **kw):  # type: ignore[no-untyped-def]
        from splitfed.engine.rounds import initial_state

        Path(settings.out).mkdir(parents=True)  # round 1's checkpoint, as the run writes it, then Ctrl-C
        state = initial_state(settings.spec, settings.seed)
        checkpoint.save(settings.out, checkpoint.Checkpoint(1, state, settings.to_dict()))
        raise KeyboardInterrupt

    monkeypatch.setattr(splitfed.sim.runner, "simulate", one_round_then_ctrl_c)
    assert cli.main(["simulate", *TINY, "--rounds", "3", "--out", str(out)]) == 130
    last = capsys.readouterr().err.splitlines()[-1]
    head = f"splitfed simulate: round 1 of 3 is kept in {out}; continue with: "
    assert last.startswith(head), last
    argv = shlex.split(last[len(head):])
    assert argv[:2] == ["splitfed", "simulate"] and len(argv) == 4
    assert cli.build_parser().parse_args(argv[1:]).resume == str(out)


def test_a_refusal_names_the_resume_of_a_folder_with_spaces_as_one_word(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new run into a folder that holds one is refused, naming ``--resume DIR``: quoted, as above."""
    import shlex

    from splitfed.engine.rounds import initial_state

    out = tmp_path / "my runs" / "run 1"
    settings = RunSettings(clients=2, rounds=3, tiers=2, cuts="static:2", model="mlp", out=str(out))
    out.mkdir(parents=True)
    checkpoint.save(out, checkpoint.Checkpoint(1, initial_state(settings.spec, settings.seed), settings.to_dict()))
    (out / "metrics.jsonl").write_text(json.dumps({"round": 1, "loss": 0.5, "accuracy": 0.8}) + "\n")
    assert cli.main(["simulate", *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    said = err.partition("continue it with --resume ")[2].partition(", replace it with --overwrite")[0]
    assert said == shlex.quote(str(out)) == f"'{out}'", err
