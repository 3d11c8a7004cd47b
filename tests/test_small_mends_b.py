"""Small mends: the late-drift note from every backend, the divergence advice in both spellings of the settings,
the in-process run's clients built once, and a tier that takes SIGHUP as it takes SIGTERM.

Before: only ``splitfed simulate`` (Flower) said a fleet drift the run never reaches, naming ``--rounds`` (a
``flwr run`` has ``num-server-rounds``); the in-process backend and ``flwr run``'s ServerApp said nothing. A
diverged round said "try a smaller --lr (now X) or --weight-decay (now Y)", flags a ``flwr run`` user has none
of (its run-config keys are ``lr`` and ``weight-decay``). ``train_inprocess`` drew every client's data twice to
count its samples. ``splitfed tier`` died of SIGHUP (a closed terminal) with 129 and without its "stopped" line.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

import clients.app
import server.app
import splitfed.sim.inprocess as inprocess
from splitfed.cli import build_parser
from splitfed.engine.rounds import RoundFailed
from splitfed.flower.config import RunSettings
from splitfed.sim.inprocess import train_inprocess
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.process import READY
from tests.flower_fixtures import FakeGrid, inprocess_tiers
from tests.test_tier_signals_at_start import _AT_TORCH

ROOT = Path(__file__).resolve().parent.parent
# 2 of the shipped ``small`` fleet's 5 devices by seed 0 are its flagship and its laptop, whose drift comes at round 5
DRIFTING = RunSettings(fleet="small", clients=2, seed=0, rounds=1, cuts="static:1,3", batch_size=64)
DRAW = "clients: 2 of the 5 devices of fleet 'small', drawn by seed 0: 1 flagship, 1 laptop"
NOTE = ("note: fleet 'small': device 'laptop' drifts at round 5, after the run's last round (1): never applied "
        "(a run of 5 or more rounds would apply it)")
# the same run as ``flwr run`` gives it: its run config (pyproject's keys)
RUN_CONFIG = {"fleet": "small", "clients": 2, "seed": 0, "num-server-rounds": 1, "cuts": "static:1,3",
              "batch-size": 64}


def _context(run_config: dict[str, Any]) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


def _flwr_run(monkeypatch: pytest.MonkeyPatch, run_config: dict[str, Any]) -> None:
    """``server.app:app`` as ``flwr run`` starts it (no settings: the run config alone), over real ClientApps
    and in-process tiers."""
    with inprocess_tiers(monkeypatch):
        server.app.build_app()(FakeGrid(clients.app.app, 2), _context(run_config))


def _flwr_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "flwr" and r.levelno == logging.INFO]


# --- 1. the late-drift note, from every backend -------------------------------------------------------------


def test_the_note_names_no_one_spelling_of_the_rounds() -> None:
    from splitfed.sim.runner import late_drift_note

    assert RunSettings.from_mapping(RUN_CONFIG, source="run config") == DRIFTING
    assert late_drift_note(DRIFTING) == NOTE
    assert late_drift_note(DRIFTING.with_(seed=1)) == ""  # seed 1 deals no laptop (a phone and the pi): no note


def test_an_in_process_run_says_it_before_its_first_line(tmp_path: Path) -> None:
    lines: list[str] = []
    train_inprocess(DRIFTING.with_(out=str(tmp_path / "run")), progress=lines.append)
    assert lines[0] == DRAW and lines[1] == NOTE
    assert lines[2].startswith("run ") and lines[2].endswith("rounds 1..1 (in-process)")
    assert lines.count(NOTE) == 1


def test_a_flwr_run_logs_it_once_at_its_start(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                              tmp_path: Path) -> None:
    with caplog.at_level(logging.INFO, logger="flwr"):
        _flwr_run(monkeypatch, {**RUN_CONFIG, "out": str(tmp_path / "run")})
    lines = _flwr_lines(caplog)
    assert lines[0] == DRAW and lines[1] == NOTE
    assert lines.count(NOTE) == 1
    assert any(line.startswith("run ") and line.endswith("rounds 1..1") for line in lines)


def test_a_serverapp_given_its_settings_leaves_it_to_its_caller(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """``splitfed simulate`` builds the app with its settings and says the note itself, before Ray starts."""
    lines: list[str] = []
    with caplog.at_level(logging.INFO, logger="flwr"), inprocess_tiers(monkeypatch):
        server.app.build_app(DRIFTING, progress=lines.append)(FakeGrid(clients.app.app, 2), _context({}))
    assert NOTE not in lines + _flwr_lines(caplog)
    assert lines[0].startswith("query round: asking the 2 node(s)") and lines[1].startswith("run ")  # no note first


def test_a_fleet_the_note_cannot_draw_is_left_to_the_run_to_refuse(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """As before: the run refuses it once it holds its folder (the note raises nothing of its own)."""
    seen: list[RunSettings] = []

    def run(grid: Any, s: RunSettings, *a: Any, **k: Any) -> dict[str, Any]:
        seen.append(s)
        return {}

    monkeypatch.setattr(server.app, "run", run)
    with caplog.at_level(logging.INFO, logger="flwr"):
        server.app.build_app()(None, _context({"fleet": "no-such-fleet"}))  # type: ignore[arg-type]
    assert [s.fleet for s in seen] == ["no-such-fleet"] and _flwr_lines(caplog) == []


# --- 2. the divergence advice, right in both spellings ------------------------------------------------------


def test_a_diverged_flwr_run_names_its_run_config_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(RoundFailed) as e:
        _flwr_run(monkeypatch, {**RUN_CONFIG, "fleet": "reference", "weight-decay": 1e30,
                                "out": str(tmp_path / "run")})
    assert str(e.value).endswith("; training diverged at round 1 (its loss or weights became NaN or infinite): "
                                 "try a smaller lr (now 0.05) or weight-decay (now 1e+30)")


def test_the_words_it_names_are_a_run_config_key_and_a_simulate_flag_each() -> None:
    keys = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    args = build_parser().parse_args(["simulate", "--lr", "0.01", "--weight-decay", "0.001"])
    assert (args.lr, args.weight_decay) == (0.01, 0.001)
    assert {"lr", "weight-decay"} <= set(keys)


# --- 3. the in-process run's clients, built once ---------------------------------------------------------


def test_an_in_process_run_draws_its_clients_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-sample-batch check and the rounds share one list of clients (each client's data is drawn to count
    its samples); before, the run drew them again."""
    built: list[list[Any]] = []
    real = inprocess.sim_clients

    def sim_clients(settings: Any, fleet: Any) -> list[Any]:
        built.append(real(settings, fleet))
        return built[-1]

    monkeypatch.setattr(inprocess, "sim_clients", sim_clients)
    summary = train_inprocess(DRIFTING.with_(out=str(tmp_path / "run")))
    assert [[c.client_id for c in b] for b in built] == [["client0", "client1"]]
    assert summary["rounds"] == 1


# --- 4. a tier takes SIGHUP as it takes SIGTERM -------------------------------------------------------------


def test_a_serving_tier_sent_sighup_stops_with_its_stopped_line_and_0() -> None:
    """Before: killed by the signal, 129, and no "stopped" line."""
    tier = subprocess.Popen([sys.executable, "-m", "splitfed.cli", "tier", "--role", "cloud", "--listen",
                             "127.0.0.1:0", "--insecure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert tier.stdout is not None
        address = tier.stdout.readline()[len(READY):].split()[0]
        with GrpcTierClient(address, deadline_s=10) as client:
            assert client.health(10, wait=True)
        tier.send_signal(signal.SIGHUP)
        _, err = tier.communicate(timeout=60)
        assert tier.returncode == 0, err
        assert err.splitlines()[-1].endswith(" cloud INFO stopped (SIGHUP)"), err
    finally:
        tier.kill()
        tier.wait()


def test_a_sighup_while_the_tier_starts_stops_it_as_sigterm_does() -> None:
    """Before its serving: one line and 143 (before: killed by the signal, 129, no word)."""
    done = subprocess.run([sys.executable, "-c", _AT_TORCH.format(sig="SIGHUP")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 143, done.stderr
    assert done.stdout == "torch imported: True\n"
    assert done.stderr == "splitfed tier: terminated\n"
