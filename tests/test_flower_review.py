"""A review of the Flower layer (strategy, adaptive policy, records, run config): each test here failed before
the fix it names."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clients.app
import server.app
from splitfed.flower.config import RunSettings
from tests.flower_fixtures import FakeGrid, inprocess_tiers


def _rows(folder) -> list[dict]:  # type: ignore[no-untyped-def]
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("device", ["rpi4", "pi-home"])
def test_an_adaptive_sim_clock_run_of_nodes_naming_undrawn_devices_learns_from_measured_times(
        monkeypatch, tmp_path, device):
    """``sim-clock`` is on by default (``flwr run .`` with the repository's app config). Registration takes a node
    whose ``device-profile`` names a named profile (``rpi4``) or a fleet entry (``pi-home``), and the simulated
    clock then reports measured times (it draws no such client). The adaptive policy instead looked the device up
    in the drawn fleet after round 1 and stopped the run: "fleet 'reference[2]' has no client 'rpi4'"."""
    s = RunSettings(rounds=2, clients=2, cuts="adaptive", node_wait_s=5.0, round_timeout_s=30.0, out=str(tmp_path))
    grid = FakeGrid(clients.app.app, s.clients)
    for ctx in grid.contexts.values():
        ctx.node_config["device-profile"] = device
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(grid, s, progress=lambda line: None)
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["sim_round_s"] is None and r["measured_round_s"] > 0 for r in rows)  # the clock: measured
    assert [r["profiles"] for r in rows] == [{"client0": device, "client1": device}] * 2
    assert rows[0]["decision"]["reason"] and rows[1]["decision"]["reason"] == "last round"


def test_the_adaptive_policy_simulates_exactly_the_rounds_the_clock_simulates() -> None:
    """The policy's truth is the clock's: the drawn fleet's clients (any other device: measured, for all)."""
    from splitfed.flower.adaptive import simulated_devices
    from splitfed.flower.policy import ClientInfo
    from splitfed.sim.clock import fleet_for

    s = RunSettings(clients=2, cuts="adaptive")
    drawn = [c.name for c in fleet_for(s).clients]
    infos = [ClientInfo(f"client{i}", i, i, drawn[i], 10) for i in range(2)]
    assert simulated_devices(s, infos) == {"client0": drawn[0], "client1": drawn[1]}
    assert simulated_devices(s.with_(sim_clock=False), infos) is None
    assert simulated_devices(s, [infos[0], ClientInfo("client1", 1, 1, "rpi4", 10)]) is None


@pytest.mark.parametrize(("first", "second"), [("rounds", "num-server-rounds"), ("batch-size", "batch_size"),
                                               ("clients", "num-supernodes"), ("num_clients", "clients")])
def test_two_keys_of_one_setting_that_disagree_are_refused(tmp_path, first, second):
    """A config table with both ``rounds`` and ``num-server-rounds`` (Flower's name, as in its app templates), or
    ``batch-size`` and ``batch_size``, ran with whichever came last: the other was dropped without a word."""
    from splitfed.errors import ConfigError

    with pytest.raises(ConfigError, match=f"{first} = 8 and {second} = 2 both set"):
        RunSettings.from_mapping({first: 8, second: 2})
    path = tmp_path / "run.toml"
    path.write_text(f"[simulate]\n{first} = 8\n{second} = 2\n")
    with pytest.raises(ConfigError, match=f"{path}: {first} = 8 and {second} = 2"):
        RunSettings.from_toml(path)
    assert RunSettings.from_mapping({first: 8, second: 8.0}) == RunSettings.from_mapping({second: 8})  # agreeing
    # layers still override each other: a flag over the file's value
    assert RunSettings.layered([({first: 8}, "file"), ({second: 2}, "command line")]) == \
        RunSettings.from_mapping({first: 2})


COUNTS = ("num-examples", "steps", "correct", "bytes-up", "bytes-down")


@given(key=st.sampled_from(COUNTS), value=st.floats(allow_nan=True, allow_infinity=True))
@settings(max_examples=200)
def test_a_report_s_counts_are_whole_numbers_or_refused_naming_the_key(key: str, value: float) -> None:
    """``int()`` truncated a count: a reply of 9.9 samples weighed its update as 9 in every average."""
    from splitfed.errors import ConfigError
    from splitfed.flower.records import TrainReport

    record = TrainReport(10**6, 10**6, 0.5, 0, 0.1, 0.2, 100, 100).to_record()
    record[key] = value
    if not value.is_integer():  # NaN and infinities too
        with pytest.raises(ConfigError, match=f"train report: {key} must be a whole number, got {value!r}"):
            TrainReport.from_record(record)
        return
    try:
        got = TrainReport.from_record(record).to_record()[key]
    except ConfigError as e:  # a whole count the other checks refuse (negative, more correct than samples, ...)
        assert "whole number" not in str(e)
    else:
        assert got == int(value) and isinstance(got, int)


@pytest.mark.parametrize(("key", "value"), [("partition-id", "1"), ("partition-id", True), ("samples", 12.7),
                                            ("num-partitions", 4.5)])
def test_a_node_s_registration_counts_are_whole_numbers(key: str, value: object) -> None:
    """A node's partition and sample count were ``int()`` of anything: ``"1"`` or ``true`` named partition 1,
    12.7 samples became 12 (the bound on every count it reports later)."""
    from splitfed.errors import ConfigError
    from splitfed.flower.records import NodeInfo

    record = NodeInfo(1, 4, 100).to_record()
    assert NodeInfo.from_record(record) == NodeInfo(1, 4, 100)
    record[key] = value  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=f"node info: {key} must be a whole number, got {value!r}"):
        NodeInfo.from_record(record)


def test_a_reply_with_a_fractional_sample_count_is_dropped_not_truncated(monkeypatch, tmp_path) -> None:
    """Through the strategy: the node's update was averaged with weight 9 where it claimed 9.5."""
    from splitfed.flower.records import METRICS

    def fractional(msg, ctx):  # type: ignore[no-untyped-def]
        reply = clients.app.app(msg, ctx)
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 1:
            metrics = reply.content.metric_records[METRICS]
            metrics["num-examples"] = metrics["num-examples"] - 0.5
        return reply

    s = RunSettings(rounds=1, clients=3, cuts="static:1,3", node_wait_s=5.0, round_timeout_s=30.0, out=str(tmp_path))
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(fractional, s.clients), s, progress=lambda line: None)
    (row,) = _rows(tmp_path)
    assert row["failed"] == ["client1"] and row["clients"] == 2
    assert "num-examples must be a whole number" in row["why_failed"]["client1"]


@pytest.mark.parametrize(("line", "why"), [("[]", "not an object: []"), ('{"round": null}', "its round is null"),
                                           ('{"round": "two"}', 'its round is "two"'), ("{}", "its round is null"),
                                           ('{"round": 2.5}', "its round is 2.5"), ('{"round": 0}', "its round is 0")])
def test_a_resume_names_a_metrics_line_that_is_no_row(monkeypatch, tmp_path, line, why):
    """A line of valid JSON that is no row (hand-edited, or another tool's) stopped the resume with a traceback
    (``[]``: AttributeError in truncate_after; ``"round": null``: TypeError) or a false reason (``{}``: "holds its
    rounds out of order"; 2.5: "holds round(s) 2 twice"). Now one line names the file, its line, and why; the
    run folder is left as it was."""
    from splitfed.errors import ConfigError

    s = RunSettings(rounds=1, clients=2, cuts="static:2,5", node_wait_s=5.0, round_timeout_s=30.0, out=str(tmp_path))
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, s.clients), s, progress=lambda line: None)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + line + "\n")
    before = metrics.read_text()
    with pytest.raises(ConfigError) as err, inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, s.clients), s.with_(rounds=2, resume=True),
                       progress=lambda line: None)
    assert str(err.value).startswith(f"{metrics}:2: not a metrics row ({why})"), err.value
    assert metrics.read_text() == before
