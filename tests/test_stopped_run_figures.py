"""A run stopped part way (Ctrl-C, SIGTERM) gets the figures of the rounds it did, as a finished run does.

Before: ``splitfed simulate`` drew the standard figures only once a run had finished; one stopped at round 12 of
30 left its metrics and no PNG. Now the runner's stop path draws them, once every process is stopped and only for
a clean stop (one signal: the engine wound down, so the metrics are whole), never for a failed run or a second
signal (threads may still write; the user wants out).

A real run costs a Ray start (tens of seconds here): the stop path is met with Ray's start, the tiers, the
ServerApp and Flower's engine as stand-ins, and a real signal sent to this process while the "engine" runs, so
the runner's own handlers, stop flag and interrupt do the rest. ``stopped_figures`` is also checked alone."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from splitfed.errors import Terminated
from splitfed.flower.config import RunSettings
from splitfed.report.runs import write_run
from splitfed.sim import runner
from splitfed.sim.tiers import TierChain

SETTINGS = RunSettings(rounds=30, clients=2, tiers=3, cuts="static:1,3")


def _rows(rounds: int) -> list[dict[str, Any]]:
    return [{"round": r, "accuracy": 1 - 0.5 ** r, "loss": 0.5 ** r, "sim_round_s": 2.0, "bytes_up": 1000 * r,
             "bytes_down": 500 * r, "cuts": {"client0": [1, 3], "client1": [1, 3]}} for r in range(1, rounds + 1)]


def _pngs(folder: Path) -> list[str]:
    """The figures in ``folder``, and any draft of one left behind."""
    return sorted(p.name for p in folder.iterdir() if ".png" in p.name)


# what ``splitfed report`` draws of such rounds (accuracy, bytes, simulated time, each client's cuts)
FIGURES = ["accuracy_per_round.png", "accuracy_vs_bytes.png", "accuracy_vs_time.png", "bytes.png", "cuts_1_run.png",
           "makespan.png"]


def _engine(monkeypatch: pytest.MonkeyPatch, out: Path, rows: int, then: Callable[[], None]) -> None:
    """``simulate`` with no process started: Flower's engine "trains" ``rows`` rounds into ``out`` (as the
    ServerApp writes them), then does ``then`` (a signal to this process, a crash)."""
    import flwr.simulation

    import server.app

    @contextmanager
    def start_tiers(settings: RunSettings) -> Iterator[TierChain]:
        yield TierChain(["127.0.0.1:7001", "127.0.0.1:7002"], coordinator_token_file="/tmp/unused-token")

    def run_simulation(server_app: Any, client_app: Any, **kwargs: Any) -> None:
        write_run(out, _rows(rows))
        then()

    monkeypatch.setattr(runner, "start_ray", lambda *a, **k: None)
    monkeypatch.setattr(runner, "session_dir", lambda: None)
    monkeypatch.setattr(runner, "own_sessions", lambda since: [])  # never another run's Ray session
    monkeypatch.setattr(runner, "start_tiers", start_tiers)
    monkeypatch.setattr(server.app, "build_app", lambda *a, **k: object())
    monkeypatch.setattr(flwr.simulation, "run_simulation", run_simulation)


def _signal(*sigs: int) -> Callable[[], None]:
    def send() -> None:
        for sig in sigs:
            os.kill(os.getpid(), sig)
    return send


@pytest.mark.parametrize(("sig", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_run_stopped_by_a_signal_draws_the_figures_of_its_rounds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sig: int, raised: type[BaseException]) -> None:
    out = tmp_path / "run"
    _engine(monkeypatch, out, 3, _signal(sig))
    lines: list[str] = []
    with pytest.raises(raised) as e:
        runner.simulate(SETTINGS.with_(out=str(out)), progress=lines.append, cpus=1)
    assert type(e.value) is raised
    assert _pngs(out) == FIGURES
    assert lines[-1] == f"stopped: 6 figure(s) of the 3 round(s) done are in {out}"


def test_a_second_signal_draws_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The user asked twice: the run ends at once (its threads may still be writing its metrics)."""
    out = tmp_path / "run"
    _engine(monkeypatch, out, 3, _signal(signal.SIGINT, signal.SIGINT))
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        runner.simulate(SETTINGS.with_(out=str(out)), progress=lines.append, cpus=1)
    assert _pngs(out) == [] and not any("figure" in line for line in lines)


def test_a_failed_run_draws_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def crash() -> None:
        raise RuntimeError("Simulation engine crashed") from OSError("the raylet died")

    out = tmp_path / "run"
    _engine(monkeypatch, out, 3, crash)
    with pytest.raises(runner.SimulationError):
        runner.simulate(SETTINGS.with_(out=str(out)), progress=[].append, cpus=1)
    assert _pngs(out) == []


def test_stopped_figures_draws_the_rounds_done(tmp_path: Path) -> None:
    out = tmp_path / "run"
    write_run(out, _rows(2))
    lines: list[str] = []
    assert runner.stopped_figures(str(out), lines.append) == 6
    assert _pngs(out) == FIGURES
    assert lines == [f"stopped: 6 figure(s) of the 2 round(s) done are in {out}"]


def test_stopped_figures_of_a_run_stopped_before_its_first_round_is_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    lines: list[str] = []
    assert runner.stopped_figures(str(out), lines.append) == 0
    (out / "metrics.jsonl").write_text("")  # the ServerApp had begun, no round was written
    assert runner.stopped_figures(str(out), lines.append) == 0
    assert lines == [] and _pngs(out) == []


def test_figures_that_cannot_be_drawn_are_said_not_raised(tmp_path: Path) -> None:
    """The stop is the run's outcome: a metrics file the report refuses leaves the folder as it was and says how
    to draw them later."""
    out = tmp_path / "my run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1, "accuracy": 0.5}\n{"round": \n')
    lines: list[str] = []
    assert runner.stopped_figures(str(out), lines.append) == 0
    assert _pngs(out) == []
    [line] = lines
    assert line.startswith("the figures of the rounds done were not drawn (")
    assert line.endswith(f"); draw them with: splitfed report '{out}'")
