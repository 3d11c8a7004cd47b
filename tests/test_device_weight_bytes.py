"""The devices' weight exchange is counted: each round's ``device_weight_bytes`` ([to the devices, back]) in the
metrics, its total in ``summary.json``, a "weight MB" column in the report. It is what the cost model prices
as X (``ClientCost.exchange_bytes``, each way), so the counted bytes equal the predicted ones. Before, only
activations and gradients were counted, and FedAvg (cut L: everything on the device) showed 0 MB."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from splitfed.cli import main as cli
from splitfed.cost import Scenario, client_cost
from splitfed.engine.rounds import device_state, initial_state, state_bytes
from splitfed.engine.template import num_blocks
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import METRICS
from splitfed.profile import Client, LinkProfile, TierProfile
from splitfed.profile.profiler import profile_model
from splitfed.report.runs import load_run
from splitfed.report.summary import summary_rows

SMALL = RunSettings(rounds=2, clients=2, tiers=3, batch_size=64, seed=1)


def _sent(s: RunSettings, cuts: list[tuple[int, ...]]) -> int:
    """What the coordinator sends the devices in a round: each client's device segments' state."""
    spec = s.spec
    state = initial_state(spec, s.seed)
    return sum(state_bytes(device_state(state, c, num_blocks(spec), s.u_shape)) for c in cuts)


def _predicted(s: RunSettings, cuts: tuple[int, ...]) -> float:
    prof = profile_model(s.spec, s.batch_size, reps=1)
    dev = Client("c", "c", TierProfile(1e9, 1e12), LinkProfile(1e6, 1e6, 0.01), samples=10)
    sc = Scenario(prof, (dev,), (TierProfile(1e10, 1e12), TierProfile(1e11, 1e12)),
                  (LinkProfile(1e7, 1e7, 0.005),), batch=s.batch_size, u_shape=s.u_shape)
    return client_cost(sc, dev, cuts).exchange_bytes


@pytest.mark.parametrize("mode, u_shape, cuts", [
    ("sflv1", False, [(1, 3), (2, 5)]),
    ("sl", True, [(1, 3, 6), (0, 4, 7)]),      # the tail's state travels too
    ("sflv1", False, [(7, 7), (7, 7)]),        # FedAvg: the whole model, no activation at all
])
def test_each_round_counts_the_devices_weights_both_ways_as_the_cost_model_prices_them(
        tmp_path: Path, mode: str, u_shape: bool, cuts: list[tuple[int, ...]]) -> None:
    from splitfed.sim.inprocess import train_inprocess

    static = "static:" + "/".join(",".join(map(str, c)) for c in cuts)
    s = SMALL.with_(mode=mode, u_shape=u_shape, cuts=static, out=str(tmp_path / "run"))
    summary = train_inprocess(s)
    rows = [json.loads(x) for x in (tmp_path / "run" / METRICS).read_text().splitlines()]
    each = _sent(s, cuts)
    assert each > 0
    assert each == pytest.approx(sum(_predicted(s, c) for c in cuts))  # the cost model's X bytes, each way
    assert [r["device_weight_bytes"] for r in rows] == [[each, each]] * s.rounds
    assert summary["device_weight_bytes"] == [each * s.rounds] * 2

    run = load_run(tmp_path / "run")
    assert run.weight_bytes == 2 * each * s.rounds
    headers, table = summary_rows([run])
    assert table[0][headers.index("weight MB")] == pytest.approx(2 * each * s.rounds / 1e6)
    if cuts[0] == (7, 7):
        assert table[0][headers.index("activation MB")] == 0  # FedAvg sends no activation: only weights

    assert cli(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    per_round = list(csv.DictReader((tmp_path / "report" / "rounds.csv").open()))
    assert [int(r["weight_bytes"]) for r in per_round] == [2 * each] * s.rounds


def test_a_client_that_fails_is_sent_its_weights_but_returns_none(tmp_path: Path) -> None:
    """client1's training fails where it runs (as a node's error reply): its weights went down, none came
    back up."""
    from splitfed.sim.inprocess import train_inprocess

    s = SMALL.with_(rounds=1, cuts="static:1,3/2,5", out=str(tmp_path / "run"), min_clients=1)
    import splitfed.engine.rounds as rounds

    real = rounds.train_client

    def fails_for_client1(cfg, chain, cid, cuts, state, batches, *a, **k):  # type: ignore[no-untyped-def]
        if cid == "client1":
            raise ConfigError("client1 could not train")
        return real(cfg, chain, cid, cuts, state, batches, *a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(rounds, "train_client", fails_for_client1)
    try:
        train_inprocess(s)
    finally:
        mp.undo()
    (row,) = [json.loads(x) for x in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert row["failed"] == ["client1"]
    assert row["device_weight_bytes"] == [_sent(s, [(1, 3), (2, 5)]), _sent(s, [(1, 3)])]


@pytest.mark.parametrize("value", [[1], [1, -2], ["1", 2], [1.5, 2], "12", [True, 2]])
def test_a_malformed_weight_count_in_a_metrics_row_is_refused_naming_it(tmp_path: Path, value: object) -> None:
    row = {"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "device_weight_bytes": value}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / METRICS).write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match="'device_weight_bytes' must be \\[sent, received\\]"):
        load_run(tmp_path / "run")


def test_rows_older_than_the_count_read_as_none(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / METRICS).write_text(json.dumps({"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}) + "\n")
    assert load_run(tmp_path / "run").weight_bytes == 0
