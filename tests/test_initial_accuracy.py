"""A run records the model's test accuracy before any training: accuracy curves start where training did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitfed.engine.rounds import initial_state
from splitfed.flower import workload
from splitfed.report import plots
from splitfed.report.runs import load_run
from tests.test_flower_apps import BASE, _run


def _rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def test_round_one_keeps_the_untrained_model_s_accuracy_and_a_resume_keeps_it(monkeypatch, tmp_path: Path) -> None:
    """Before, nothing recorded it: every curve started at round 1's accuracy, after a round of training."""
    s = BASE.with_(rounds=1, out=str(tmp_path))
    spec = s.spec
    want = workload.evaluate(spec, initial_state(spec, s.seed), *workload.test_data(spec, s.dataset, s.seed))
    summary, _ = _run(monkeypatch, s)
    first = _rows(tmp_path)[0]
    assert (first["initial_accuracy"], first["initial_loss"]) == pytest.approx(want, abs=0, rel=0)
    assert summary["initial_accuracy"] == first["initial_accuracy"] != first["accuracy"]
    summary, _ = _run(monkeypatch, s.with_(rounds=2, resume=True))  # round 1 is not run again
    rows = _rows(tmp_path)
    assert "initial_accuracy" not in rows[1] and rows[0]["initial_accuracy"] == first["initial_accuracy"]
    assert summary["initial_accuracy"] == first["initial_accuracy"]
    # the report's curves start there, from the summary or, with none (a run that did not finish), round 1's row
    (tmp_path / "summary.json").unlink()
    run = load_run(tmp_path)
    xs, ys = plots._with_start(run, run.sim_time)
    assert xs[0] == 0.0 and ys[:2] == [first["initial_accuracy"], first["accuracy"]] and len(ys) == 3


def test_the_in_process_runner_records_it_as_the_coordinator_does(tmp_path: Path) -> None:
    from splitfed.sim.inprocess import _train

    s = BASE.with_(rounds=1, out=str(tmp_path))
    spec = s.spec
    want = workload.evaluate(spec, initial_state(spec, s.seed), *workload.test_data(spec, s.dataset, s.seed))
    summary = _train(s, None)
    assert (_rows(tmp_path)[0]["initial_accuracy"], summary["initial_accuracy"]) == (want[0], want[0])
