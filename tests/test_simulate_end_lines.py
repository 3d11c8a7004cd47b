"""``splitfed simulate`` says what it does between its last round and its end.

Before: after the ServerApp's "wrote ..." line, 2-8 s without a word: Flower's engine shutting Ray down, the tier
processes stopping and Ray's session folder going (the runner), then, after the tables, matplotlib's import and
the figures (the command). Now a line before each: "shutting down the simulation engine (Ray) and N tier
process(es)..." once the ServerApp has its summary, and "drawing the figures..." after the tables. The engine,
Ray and the tiers are stand-ins that record when they stop; the command's run is the in-process backend's
(``splitfed.sim.inprocess.train_inprocess``, as tests/test_mutants_cmd_simulate.py stands in for the engine):
no Ray starts here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import splitfed.sim.runner
from splitfed.cli import main
from splitfed.flower.config import RunSettings
from splitfed.sim import runner
from splitfed.sim.inprocess import train_inprocess
from splitfed.sim.tiers import TierChain

DRAWING = "drawing the figures..."
SMALL = RunSettings(rounds=1, clients=1, tiers=3, cuts="static:1,3", batch_size=32)
LAST = "wrote metrics.jsonl and summary.json"  # the ServerApp's last line (a stand-in's)


def _engine_and_tiers(monkeypatch: pytest.MonkeyPatch, said: list[str]) -> None:
    """Ray, the tiers, the ServerApp and Flower's engine stood in for: each line said and each stop (the engine's
    end, the tiers', Ray's shutdown) goes to ``said`` in the order they come."""
    import flwr.simulation
    import ray

    import server.app

    @contextmanager
    def start_tiers(settings: RunSettings) -> Iterator[TierChain]:
        yield TierChain(["127.0.0.1:7001", "127.0.0.1:7002"], coordinator_token_file="/tmp/tok")
        said.append("<tiers stopped>")

    def build_app(settings: RunSettings, progress: Any, on_summary: Any, **kwargs: Any) -> object:
        def main() -> None:  # the ServerApp's end: its last line, then its summary
            progress(LAST)
            on_summary({"rounds": 1})
        return main

    def run_simulation(server_app: Any, client_app: Any, **kwargs: Any) -> None:
        server_app()
        said.append("<engine ended>")

    monkeypatch.setattr(runner, "start_ray", lambda init_args, **kwargs: None)
    monkeypatch.setattr(runner, "session_dir", lambda: None)
    monkeypatch.setattr(runner, "own_sessions", lambda since: [])
    monkeypatch.setattr(runner, "start_tiers", start_tiers)
    monkeypatch.setattr(runner, "_level_before_silence", None)
    monkeypatch.setattr(server.app, "build_app", build_app)
    monkeypatch.setattr(flwr.simulation, "run_simulation", run_simulation)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # a Ray still up: the runner shuts it down
    monkeypatch.setattr(ray, "shutdown", lambda: said.append("<Ray shut down>"))


def test_the_runner_says_it_shuts_down_before_the_engine_and_tiers_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Said once the ServerApp has its summary, after its last line, before Flower's engine ends (it shuts Ray
    down then), the tiers stop and the runner's own shutdown of Ray; the run's summary is returned as before."""
    said: list[str] = []
    _engine_and_tiers(monkeypatch, said)
    assert runner.simulate(SMALL, progress=said.append, cpus=1) == {"rounds": 1}
    assert said[said.index(LAST):] == [
        LAST, "shutting down the simulation engine (Ray) and 2 tier process(es)...",
        "<engine ended>", "<tiers stopped>", "<Ray shut down>"]


def test_tiers_the_run_did_not_start_are_not_said_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiers at ``tier-addresses`` run on after the run: only the engine is said to shut down."""
    said: list[str] = []
    _engine_and_tiers(monkeypatch, said)
    runner.simulate(SMALL.with_(tier_addresses="127.0.0.1:7001,127.0.0.1:7002"), progress=said.append, cpus=1)
    assert said[said.index(LAST) + 1] == "shutting down the simulation engine (Ray)..."


def test_json_keeps_the_shutdown_line_off_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Through the command: with ``--json`` the line goes to stderr with the run's other lines; stdout is the
    summary alone."""
    said: list[str] = []
    _engine_and_tiers(monkeypatch, said)
    monkeypatch.setattr(runner, "validate", lambda settings, held=None: None)  # the run's checks: not this test's
    assert main(["simulate", "--clients", "1", "--rounds", "1", "--out", str(tmp_path / "run"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"rounds": 1}
    assert err.splitlines()[-1] == "shutting down the simulation engine (Ray) and 2 tier process(es)..."


def test_the_command_says_it_draws_the_figures_after_the_tables_before_drawing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """After the cuts table, before matplotlib is imported and the figures drawn (their count is then on the run
    folder's line), then the done lines. The drawing is a stand-in that says when it starts."""
    import splitfed.report.plots as plots

    def simulate(settings, progress=print, verbose=False, cpus=None, resumed=None):  # type: ignore[no-untyped-def]
        return train_inprocess(settings, progress)

    def standard_plots(runs, out):  # type: ignore[no-untyped-def]  # drawn as ever (tests/test_mutants_cmd_simulate.py)
        print("<drawing>")
        return [Path(out) / "a.png", Path(out) / "b.png"]

    monkeypatch.setattr(splitfed.sim.runner, "simulate", simulate)
    monkeypatch.setattr(runner, "validate", lambda settings, held=None: None)  # the run's checks: not this test's
    monkeypatch.setattr(plots, "standard_plots", standard_plots)
    out = tmp_path / "run"
    assert main(["simulate", "--clients", "2", "--rounds", "1", "--tiers", "2", "--cuts", "static:2", "--model",
                 "mlp", "--batch-size", "64", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    drawing = lines.index(DRAWING)
    assert lines.index("run: cuts per device class") < drawing - 3 and lines[drawing - 1] == ""
    assert lines[drawing - 2].split()[-1] == "2"  # the cuts table's last row (its cuts: static:2)
    assert lines[drawing + 1:drawing + 4] == ["<drawing>", "", lines[drawing + 3]]
    assert lines[drawing + 3].startswith("done: 1 round(s)")
    assert lines[-1] == f"run folder: {out} (metrics.jsonl, summary.json, 2 figure(s))"
