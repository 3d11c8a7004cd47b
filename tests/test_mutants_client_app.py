"""What the ClientApp (``clients.app``) promises that the mutation run found unpinned.

- a node's answer to the query round: no model asked, no samples; no link measured, up, down and round trip
  0; no speed asked (or no data to time it on), its three speed figures 0; a link measured against a real edge
  comes back with its real (positive) figures; a speed timed on the batch asked (1 sample is a batch), on the
  run's default batch of 32 when none is asked; why a link or a speed could not be measured, cut at 1000
  characters;
- a node's own edge-address is checked once per edge instance: a later round asks it again only when the run's
  edge changed, and is refused when that edge is no longer what the address reaches;
- a train report: no speed asked, its speed figures 0; a round trip that could not be timed is -1 (not
  measured), whatever the round did;
- the node's running totals (rounds, bytes each way, compute and link seconds) add each round's exactly.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

import clients.app
import tests.flower_fixtures as flower_fixtures
from splitfed.errors import ConfigError, TierError
from splitfed.flower.config import RunSettings
from splitfed.flower.node import NodeConfig
from splitfed.flower.records import CONFIG, METRICS, NODE, TrainInstruction, TrainReport
from splitfed.flower.transport import connect
from splitfed.flower.workload import client_data
from splitfed.transport.server import serve_tier
from tests.flower_fixtures import FakeGrid
from tests.test_node_replies import BASE, _run

NODE0 = {"partition-id": 0, "num-partitions": 1}
MODEL = json.dumps(BASE.spec.to_dict())
DATA = {"model": MODEL, "dataset": "digits", "partition": "iid", "seed": 0}


def _context() -> Context:
    """A lone node's context (partition 0 of 1), as Flower keeps it."""
    return FakeGrid(clients.app.app, 1).contexts[1000]


def _query(ask: dict[str, Any], ctx: Context | None = None) -> dict[str, Any]:
    """The raw NodeInfo record a node answers ``ask`` with (every figure as it travels)."""
    ctx = ctx or _context()  # first: it sets the task identity a Message needs
    msg = Message(RecordDict({CONFIG: ConfigRecord(ask)}), dst_node_id=1000, message_type="query", group_id="0")
    reply = clients.app.app(msg, ctx)
    assert not reply.has_error(), reply.error.reason
    return dict(reply.content.config_records[NODE])


def _speed(record: dict[str, Any]) -> tuple[Any, Any, Any]:
    return record["speed-blocks"], record["speed-samples"], record["speed-s"]


# --- the query round ----------------------------------------------------------------------------------------


def test_a_node_asked_nothing_answers_no_samples_no_link_and_no_speed() -> None:
    """A registration that asks for no model and no measurement: 0 samples, and every measured figure 0 (the
    coordinator reads 0 as "not measured": a 1 would be a link or a speed it plans with)."""
    got = _query({})
    assert got["samples"] == 0
    assert (got["up-mbps"], got["down-mbps"], got["rtt-ms"]) == (0.0, 0.0, 0.0)
    assert _speed(got) == (0, 0, 0.0) and got["speed-error"] == "" and got["link-error"] == ""


def test_a_node_asked_its_samples_but_not_its_speed_times_nothing() -> None:
    """Its sample count is its partition's; its speed is timed only when asked (a static run asks none)."""
    got = _query(DATA)
    x, _ = client_data(BASE.spec, "digits", "iid", 1, 0, 0)
    assert got["samples"] == len(x) > 0
    assert _speed(got) == (0, 0, 0.0) and got["speed-error"] == ""


@pytest.mark.parametrize(("batch", "samples"), [(1, 1), (None, RunSettings().batch_size)])
def test_a_node_times_its_training_on_the_batch_asked(batch: int | None, samples: int) -> None:
    """A batch of 1 is a batch; a coordinator that asks for a speed without a batch size gets it timed on the
    run's default batch (32)."""
    ask = {**DATA, "measure-speed": True, **({} if batch is None else {"batch-size": batch})}
    got = _query(ask)
    assert got["speed-error"] == ""
    assert got["speed-blocks"] >= 1 and got["speed-samples"] == samples == (32 if batch is None else 1)
    assert got["speed-s"] > 0


def test_a_node_measures_its_link_to_a_real_edge_and_reports_its_figures() -> None:
    """The bandwidth each way and the round trip as measured against a tier on 127.0.0.1, not zeroed."""
    with serve_tier("edge", insecure=True) as edge:
        got = _query({"measure-link": True, "edge-address": edge.address})
    assert got["link-error"] == ""
    assert got["up-mbps"] > 0 and got["down-mbps"] > 0 and got["rtt-ms"] > 0


def test_a_node_with_no_samples_says_so_and_one_sample_is_timed() -> None:
    node = NodeConfig.parse(NODE0)
    x, _ = client_data(BASE.spec, "digits", "iid", 1, 0, 0)
    assert clients.app._measure_speed(node, BASE.spec, x[:0], 32) == (None, "no local samples to time training on")
    speed, why = clients.app._measure_speed(node, BASE.spec, x[:1], 32)
    assert why == "" and speed is not None and speed.samples == 1


def test_why_a_speed_could_not_be_measured_is_cut_at_1000_characters(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The reason travels in the node's record to the coordinator's log: its first line, at most 1000
    characters. (``measure_speed`` is replaced to fail with a long message, as tests/test_probe.py does: no
    real model fails with one that long.)"""
    import splitfed.profile.speed as speed

    def fail(*a: Any, **k: Any) -> None:
        raise ConfigError("x" * 1500 + "\nsecond line")

    monkeypatch.setattr(speed, "measure_speed", fail)
    x, _ = client_data(BASE.spec, "digits", "iid", 1, 0, 0)
    assert clients.app._measure_speed(NodeConfig.parse(NODE0), BASE.spec, x, 32) == (None, "x" * 1000)


def test_why_a_link_could_not_be_measured_is_cut_at_1000_characters() -> None:
    assert clients.app._unmeasured(NodeConfig.parse(NODE0), TierError("y" * 1500 + "\nmore")) == (None, "y" * 1000)
    short = TierError("tier 127.0.0.1:1: UNAVAILABLE")
    assert clients.app._unmeasured(NodeConfig.parse(NODE0), short) == (None, "tier 127.0.0.1:1: UNAVAILABLE")


# --- a node's own edge-address ------------------------------------------------------------------------------

_INSTRUCTION = TrainInstruction(
    run_id="run", round=1, client_id="client0", cuts=(1, 3), mode="sflv1", u_shape=False, model=BASE.spec,
    optim=BASE.optim, seed=0, dataset="digits", partition="iid", batch_size=32, local_epochs=1,
    edge_address="127.0.0.1:1", deadline_s=2.0)


def test_a_nodes_own_edge_is_checked_again_when_the_runs_edge_changed() -> None:
    """Checked once for the run's edge instance; a round whose instruction names another instance (the run's
    edge was restarted) asks again, and the node reaching the old process is refused, not let through on the
    address alone."""
    ctx = _context()
    with serve_tier("edge", insecure=True) as edge:
        link = connect(edge.address, deadline_s=2.0)
        try:
            instance = link.describe().instance
            clients.app._check_edge(ctx, link, dataclasses.replace(_INSTRUCTION, edge_instance=instance))
            assert dict(ctx.state.config_records[clients.app.EDGE_CHECKED]) == {"address": link.address,
                                                                                 "instance": instance}
            moved = dataclasses.replace(_INSTRUCTION, edge_instance="feedfacefeedface")
            with pytest.raises(ConfigError, match=f"reaches tier 'edge' \\(instance {instance}\\), not this run's "
                                                  "edge at 127.0.0.1:1 \\(instance feedfacefeedface\\)"):
                clients.app._check_edge(ctx, link, moved)
        finally:
            link.close()


def test_a_nodes_own_edge_once_checked_is_not_asked_again() -> None:
    """Later rounds to the same address and edge instance trust the check: the edge is not described again
    (here it is gone, so a second Describe would fail the round)."""
    ctx = _context()
    with serve_tier("edge", insecure=True) as edge:
        link = connect(edge.address, deadline_s=2.0)
        instance = link.describe().instance
        ins = dataclasses.replace(_INSTRUCTION, edge_instance=instance)
        clients.app._check_edge(ctx, link, ins)
    try:
        clients.app._check_edge(ctx, link, ins)  # no call: the edge is stopped
        with pytest.raises(TierError):  # as a call to it would have
            link.describe()
    finally:
        link.close()


# --- the train round -----------------------------------------------------------------------------------------


def test_a_round_whose_round_trip_failed_reports_it_unmeasured_and_no_speed(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A health check that fails times nothing: the report's round trip is -1 ("not measured"), not a number
    the adaptive policy would learn; the round still trains. No speed asked: its speed figures are 0. The
    node's totals are its round's. (The in-process tiers of tests/flower_fixtures.py stand in for the edge;
    their link's health check is made to fail: a real link's fails only with a network blip between it and the
    steps.)"""
    monkeypatch.setattr(flower_fixtures._ClosableLink, "health", lambda self, timeout=5.0, *, wait=False: False)
    monkeypatch.setattr(flower_fixtures._ClosableLink, "health_failure", lambda self: None, raising=False)
    monkeypatch.setattr(flower_fixtures._ClosableLink, "address", "inproc-edge", raising=False)
    reports: dict[int, dict[str, Any]] = {}

    def app(msg: Message, ctx: Context) -> Message:
        reply = clients.app.app(msg, ctx)
        if msg.metadata.message_type == "train":
            assert not reply.has_error(), reply.error.reason
            reports[int(ctx.node_config["partition-id"])] = dict(reply.content.metric_records[METRICS])
        return reply

    grid = FakeGrid(app, BASE.clients)
    rows, _ = _run(monkeypatch, tmp_path, app, "rtt", grid=grid)
    assert rows[0]["failed"] == [] and sorted(reports) == [0, 1, 2]
    assert all(reports[pid]["bytes-up"] > 0 and reports[pid]["bytes-down"] > 0 for pid in (0, 1))  # cut 0: none
    for pid, ctx in enumerate(grid.contexts.values()):
        got = reports[pid]
        assert got["rtt-ms"] == -1.0
        assert (got["speed-blocks"], got["speed-samples"], got["speed-s"]) == (0, 0, 0.0)
        stats = ctx.state.metric_records[clients.app.STATS]
        assert stats["rounds"] == 1 and stats["bytes-up"] == got["bytes-up"]
        assert stats["bytes-down"] == got["bytes-down"]
        assert stats["compute-s"] == got["compute-s"] and stats["link-s"] == got["link-s"]


def test_a_nodes_running_totals_add_each_round_exactly() -> None:
    ctx = Context(run_id=1, node_id=0, node_config=dict(NODE0), state=RecordDict(), run_config={})
    clients.app._remember(ctx, TrainReport(10, 1, 0.5, 3, 0.25, 0.5, 1000, 2000))
    first = ctx.state.metric_records[clients.app.STATS]
    assert dict(first) == {"rounds": 1, "bytes-up": 1000, "bytes-down": 2000, "compute-s": 0.25, "link-s": 0.5,
                           "throughput": 6000.0}
    clients.app._remember(ctx, TrainReport(10, 1, 0.5, 3, 0.5, 1.5, 300, 700))
    assert dict(ctx.state.metric_records[clients.app.STATS]) == {
        "rounds": 2, "bytes-up": 1300, "bytes-down": 2700, "compute-s": 0.75, "link-s": 2.0,
        "throughput": 1000 / 1.5}
    assert isinstance(ctx.state.metric_records[clients.app.STATS], MetricRecord)


def test_the_totals_start_from_nothing() -> None:
    """Before a node's first round each total is 0, after it what the records hold."""
    assert clients.app._total(MetricRecord(), "rounds") == 0 and clients.app._total(MetricRecord(), "link-s") == 0
    assert clients.app._total(MetricRecord({"rounds": 4}), "rounds") == 4
