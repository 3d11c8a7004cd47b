"""Real Flower simulation (Ray), real gRPC tier processes on 127.0.0.1: the Flower must-shows.

- 4 virtual clients, 3 tiers, 2 rounds, heterogeneous static cuts: accuracy rises and
  the global model equals FedAvg of the unsplit model over the same client batches;
- the run, stopped after round 2 and resumed with ``splitfed simulate --resume`` to
  round 3, ends bit-identical to an uninterrupted 3-round run (computed in-process:
  a transport changes no number, so the uninterrupted run needs no second simulation).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import clients.app
from splitfed.cli import main
from splitfed.engine.rounds import device_state, initial_state, state_bytes
from splitfed.engine.verify import max_abs_diff
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from tests.flower_fixtures import (
    FakeGrid,
    assert_rounds_are_the_reference,
    inprocess_tiers,
    kept_rounds,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-real")]

SETTINGS = RunSettings(rounds=2, clients=4, tiers=3, mode="sflv1", cuts="static:1,3/2,5/0,4/3,7",
                       partition="dirichlet:0.5", batch_size=32, lr=0.05, momentum=0.9, seed=3)


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real simulation of 2 rounds (shared by the tests of this module)."""
    from splitfed.sim.runner import simulate

    out = tmp_path_factory.mktemp("sim") / "run"
    with kept_rounds() as kept:  # the ServerApp runs in this process: each round's global model
        summary = simulate(SETTINGS.with_(out=str(out)), progress=lambda line: None)
    return out, summary, kept


def _rows(out):  # type: ignore[no-untyped-def]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_simulation_trains_and_equals_unsplit_fedavg(two_rounds):
    out, summary, kept = two_rounds
    rows = _rows(out)
    assert [r["round"] for r in rows] == [1, 2] and summary["rounds"] == 2
    for r in rows:
        assert r["clients"] == 4 and r["failed"] == []
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0 and r["sim_round_s"] > 0
        assert r["cuts"] == {"client0": [1, 3], "client1": [2, 5], "client2": [0, 4], "client3": [3, 7]}
        # the devices' weights went down and came back over Flower, counted as the in-process backend counts
        sent = sum(state_bytes(device_state(initial_state(SETTINGS.spec, SETTINGS.seed), c, 7, False))
                   for c in [(1, 3), (2, 5), (0, 4), (3, 7)])
        assert r["device_weight_bytes"] == [sent, sent] and sent > 0
    assert rows[1]["accuracy"] > rows[0]["accuracy"] > 0.2  # 10 classes: chance is 0.1
    # what the user asked for is recorded, not the addresses and temporary token of the tiers started for it
    recorded = json.loads((out / "summary.json").read_text())["settings"]
    assert recorded == checkpoint.load(out).settings
    assert recorded["tier_addresses"] == recorded["coordinator_token_file"] == ""
    assert {k: v for k, v in recorded.items() if k != "run_name"} == {
        k: v for k, v in SETTINGS.with_(out=str(out)).to_dict().items() if k != "run_name"}
    assert all(torch.equal(v, kept[2][k]) for k, v in checkpoint.load(out).state.items())
    assert_rounds_are_the_reference(SETTINGS, kept)


def test_stopped_run_resumes_bit_identical(two_rounds, tmp_path, monkeypatch):
    out, _, _ = two_rounds
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    assert main(["simulate", "--resume", str(resumed), "--rounds", "3"]) == 0
    assert [r["round"] for r in _rows(resumed)] == [1, 2, 3]

    whole = tmp_path / "whole"  # the uninterrupted run, in-process
    with inprocess_tiers(monkeypatch, SETTINGS.tiers - 1):
        import server.app

        server.app.run(FakeGrid(clients.app.app, SETTINGS.clients), SETTINGS.with_(rounds=3, out=str(whole)),
                       progress=lambda line: None)
    a, b = checkpoint.load(whole).state, checkpoint.load(resumed).state
    assert all(torch.equal(a[k], b[k]) for k in a), max_abs_diff(a, b)
