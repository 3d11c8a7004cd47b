"""What a node sends the ServerApp, and what the ServerApp sends a node, is checked where it is read.

A node may be buggy, of another version, or hostile: one bad reply costs that node its own update and is
named in the round's ``why_failed``; it never ends the run, shifts the global model, or blames the others.
A bad instruction reaches the coordinator as the node's one-line refusal, not as the ClientApp's traceback.
The runs are the real ServerApp and ClientApp over in-process tiers (``FakeGrid``), one node's messages
changed on their way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ConfigRecord, Message, RecordDict

import clients.app
import server.app
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.records import ARRAYS, CONFIG, METRICS, NODE, NodeInfo, TrainReport
from tests.flower_fixtures import FakeGrid, inprocess_tiers

BASE = RunSettings(rounds=1, clients=3, tiers=3, cuts="static:1,3/2,5/0,4", batch_size=32, lr=0.05,
                   node_wait_s=5.0, round_timeout_s=30.0, min_clients=2)
App = Callable[[Message, Any], Message]


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, app: App, name: str,
         grid: FakeGrid | None = None, settings: RunSettings = BASE) -> tuple[list[dict], list[int]]:
    """The run's metrics rows, and what each tier holds at its end (all released: zeros)."""
    s = settings.with_(out=str(tmp_path / name))
    with inprocess_tiers(monkeypatch, s.tiers - 1) as chain:
        server.app.run(grid or FakeGrid(app, s.clients), s)
        held = [t.clients() for t in chain.controls]
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return rows, held


def _replying(kind: str, change: Callable[[Message], None], partition: int = 1) -> App:
    """The ClientApp, except that ``partition``'s ``kind`` reply goes through ``change`` first."""
    def app(msg: Message, ctx: Any) -> Message:
        reply = clients.app.app(msg, ctx)
        if msg.metadata.message_type == kind and ctx.node_config["partition-id"] == partition:
            change(reply)
        return reply
    return app


def _metric(**values: Any) -> Callable[[Message], None]:
    def change(reply: Message) -> None:
        for k, v in values.items():
            reply.content.metric_records[METRICS][k] = v
    return change


def _array_bytes(data: bytes) -> Callable[[Message], None]:
    def change(reply: Message) -> None:
        arrays = reply.content.array_records[ARRAYS]
        k = next(iter(arrays))
        arrays[k] = Array(dtype="float32", shape=tuple(arrays[k].shape), stype="numpy.ndarray", data=data)
    return change


@pytest.mark.parametrize(("change", "words"), [
    # np.load of the bytes raised EOFError / BadZipFile, which ended the run with a traceback
    (_array_bytes(b""), "malformed reply: No data left in file"),
    (_array_bytes(b"PK\x03\x04" + b"\x00" * 40), "malformed reply: File is not a zip file"),
    # its sample count weighs its update: 10**9 made the global model client1's alone, 10**16 (beyond what a
    # tier's Reduce takes) failed the round for every client
    (_metric(**{"num-examples": 10**9}), "malformed reply: it trained on 1000000000 sample(s), more than the "),
    (_metric(**{"num-examples": 10**16}), "malformed reply: it trained on 10000000000000000 sample(s)"),
    (_metric(**{"num-examples": 0}), "malformed reply: train report: 0 sample(s) in "),
    # the round's train loss averages it: one node's NaN or -1000 was the round's
    (_metric(loss=float("nan")), "its training diverged (its loss is nan)"),  # what it is, not "malformed"
    (_metric(loss=-1000.0), "malformed reply: train report: loss must be >= 0, got -1000.0"),
])
def test_a_bad_train_reply_costs_its_node_alone(monkeypatch, tmp_path, change, words) -> None:
    honest, _ = _run(monkeypatch, tmp_path, clients.app.app, "honest")
    rows, held = _run(monkeypatch, tmp_path, _replying("train", change), "bad")
    (row,) = rows
    assert row["failed"] == ["client1"] and row["clients"] == 2, row["why_failed"]
    assert row["why_failed"]["client1"].startswith(words), row["why_failed"]
    assert held == [0, 0]
    assert 0 <= row["train_loss"] < 10
    # the others' updates are the global model, as when client1 simply fails
    _run(monkeypatch, tmp_path, _failing, "failed")
    got, want = (checkpoint.load(tmp_path / n).state for n in ("bad", "failed"))
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert honest[0]["failed"] == []


def _failing(msg: Message, ctx: Any) -> Message:
    if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 1:
        raise RuntimeError("gone")  # FakeGrid, as Flower, makes it an error reply
    return clients.app.app(msg, ctx)


def test_the_superlinks_answer_for_a_node_that_is_gone_is_that_nodes_failure(monkeypatch, tmp_path, caplog) -> None:
    """Flower's SuperLink answers for a dead SuperNode with an error reply from its own node id: the reply was
    matched to no client and dropped, and the round said "no reply before the round timeout" (it came at once)."""
    from flwr.app import Error
    from flwr.common.constant import SUPERLINK_NODE_ID

    def gone(msg: Message, ctx: Any) -> Message:
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 1:
            reply = Message(Error(code=2, reason="Node unavailable: it did not answer the SuperLink"), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID  # as Flower builds it
            return reply
        return clients.app.app(msg, ctx)

    with caplog.at_level("WARNING"):
        rows, held = _run(monkeypatch, tmp_path, gone, "gone")
    assert rows[0]["failed"] == ["client1"] and held == [0, 0]
    assert rows[0]["why_failed"]["client1"] == "Node unavailable: it did not answer the SuperLink"
    assert "client1 failed: Node unavailable" in caplog.text


def test_a_restarted_node_trains_for_its_client_again(monkeypatch, tmp_path, caplog) -> None:
    """A SuperNode that restarts comes back with a new node id and the same partition: the run kept sending
    to the old id, and the partition's data was never trained again. A node the run never registered, or
    one whose partition's node is still up, takes no client's place."""
    from flwr.app import Context

    grid: FakeGrid
    restarted: list[int] = []

    def restarting(msg: Message, ctx: Any) -> Message:
        reply = clients.app.app(msg, ctx)
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 1 and not restarted:
            restarted.append(old := ctx.node_id)
            for new, config in ((old + 1, ctx.node_config), (old + 2, {**ctx.node_config, "partition-id": 2}),
                                (old + 3, {**ctx.node_config, "partition-id": 7, "num-partitions": 8})):
                grid.contexts[new] = Context(run_id=1, node_id=new, node_config=dict(config), state=RecordDict(),
                                             run_config={})
            grid.node_ids = [n for n in grid.node_ids if n != old] + [old + 1, old + 2, old + 3]
            del grid.contexts[old]  # gone with its process
        return reply

    grid = FakeGrid(restarting, 3)
    with caplog.at_level("INFO"):
        rows, held = _run(monkeypatch, tmp_path, restarting, "back", grid=grid, settings=BASE.with_(rounds=3))
    assert [r["failed"] for r in rows] == [[], [], []] and held == [0, 0]
    assert all(sorted(r["per_client"]) == ["client0", "client1", "client2"] for r in rows)
    (old,) = restarted
    assert f"client1 is back on node {old + 1} (node {old} is gone)" in caplog.text
    # a node for a partition whose node is up waits, quietly; one the run refuses is asked once, not every round
    assert caplog.text.count("num-partitions is 8") == 1 and "which this run did not register" not in caplog.text


def test_a_node_restarted_before_its_old_id_expires_takes_its_place_once_it_does(monkeypatch, tmp_path,
                                                                                 caplog) -> None:
    """The SuperLink lists a dead node's id until its heartbeat times out. A restarted node asked while its
    old id was still listed (another client being gone, so new nodes were asked) was set aside for good."""
    from flwr.app import Context

    grid: FakeGrid
    rounds: list[int] = []

    def app(msg: Message, ctx: Any) -> Message:
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 0:
            rounds.append(1)
            ids = grid.node_ids
            if len(rounds) == 1:  # partition 3's device dies; partition 1's restarts, its old id still listed
                grid.contexts[5000] = Context(run_id=1, node_id=5000, node_config=dict(grid.contexts[ids[1]].node_config),
                                              state=RecordDict(), run_config={})
                grid.node_ids = [n for n in ids if n != ids[3]] + [5000]
                old.append(ids[1])
            elif len(rounds) == 2:  # the old id expires
                grid.node_ids = [n for n in ids if n != old[0]]
        return clients.app.app(msg, ctx)

    old: list[int] = []
    grid = FakeGrid(app, 4)
    grid.drop = lambda node, msg: node not in grid.node_ids  # a process that is gone answers nothing
    # 0.25 s: the four rounds a gone node leaves unanswered each wait it out (FakeGrid's in-process nodes reply while
    # the message is pushed, before the wait starts, and their links take no deadline)
    s = BASE.with_(clients=4, rounds=4, cuts="static:1,3", min_clients=2, round_timeout_s=0.25)
    with caplog.at_level("INFO"):
        rows, _ = _run(monkeypatch, tmp_path, app, "late", grid=grid, settings=s)
    assert [sorted(r["per_client"]) for r in rows] == [  # client3 gone from round 1 on (after client0's turn)
        ["client0", "client1", "client2"], ["client0", "client2"], ["client0", "client1", "client2"],
        ["client0", "client1", "client2"]]
    assert f"client1 is back on node 5000 (node {old[0]} is gone)" in caplog.text


def test_a_train_report_takes_a_round_trip_no_link_has_as_none() -> None:
    """Registration refuses an rtt beyond any link; the train report believed it, and one node's 1e300 ms made
    every prediction of the fleet 1e297 s."""
    good = TrainReport(64, 2, 1.5, 30, 0.5, 0.2, 1000, 1000, rtt_ms=12.0)
    assert TrainReport.from_record(good.to_record()).rtt_ms == 12.0
    far = TrainReport.from_record({**good.to_record(), "rtt-ms": 1e300})
    assert far.rtt_ms == -1.0  # not measured


def _query_samples(n: int) -> Callable[[Message], None]:
    def change(reply: Message) -> None:
        reply.content.config_records[NODE]["samples"] = n
    return change


@pytest.mark.parametrize("samples", [-100, 10**13])
def test_a_node_registering_a_sample_count_no_device_holds_is_left_out(monkeypatch, tmp_path, caplog,
                                                                       samples) -> None:
    """The count weighs the node in the plan and prices its turn on the clock: 10**12 made a round 1.35e9 s."""
    with caplog.at_level("WARNING"):
        rows, held = _run(monkeypatch, tmp_path, _replying("query", _query_samples(samples)), "q")
    assert sorted(rows[0]["per_client"]) == ["client0", "client2"] and held == [0, 0]
    assert f"malformed node record: node info: samples must be in 0..1,000,000,000,000, got {samples}" in caplog.text


def test_nodes_that_deal_the_data_out_otherwise_or_share_a_partition_are_left_out(monkeypatch, tmp_path,
                                                                                  caplog) -> None:
    """A node with num-partitions 10 in a 3-client run trained on a slice of another split (overlapping the
    others'); two nodes with one partition-id stopped the whole run."""
    grid = FakeGrid(clients.app.app, 4)
    nodes = grid.node_ids
    grid.contexts[nodes[1]].node_config.update({"partition-id": 1, "num-partitions": 10})
    grid.contexts[nodes[3]].node_config.update({"partition-id": 0, "num-partitions": 3})
    for n in (nodes[0], nodes[2]):
        grid.contexts[n].node_config.update({"num-partitions": 3})
    with caplog.at_level("WARNING"):
        rows, held = _run(monkeypatch, tmp_path, clients.app.app, "n", grid=grid, settings=BASE.with_(min_clients=1))
    assert sorted(rows[0]["per_client"]) == ["client2"] and held == [0, 0]
    assert (f"Node {nodes[1]} (partition 1) left out: its node config's num-partitions is 10, the run deals its "
            "data out to 3 clients") in caplog.text
    assert any(f"Nodes {a} and {b} both hold partition 0: both left out" in caplog.text
               for a, b in ((nodes[0], nodes[3]), (nodes[3], nodes[0])))  # in the order their answers came


# ------------------------------------------------------------------ instructions the ClientApp refuses

def _instruction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Message, Any]:
    """A real train instruction for partition 0 (and its node's context), kept from a one-round run."""
    kept: list[tuple[Message, Any]] = []

    def app(msg: Message, ctx: Any) -> Message:
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 0 and not kept:
            kept.append((msg, ctx))
        return clients.app.app(msg, ctx)

    _run(monkeypatch, tmp_path, app, "kept")
    return kept[0]


def _bad_weights(content: RecordDict) -> None:
    arrays = content.array_records[ARRAYS]
    k = sorted(arrays)[0]
    arrays[k] = Array(np.zeros(3, np.float32))


@pytest.mark.parametrize(("change", "words"), [
    (lambda c: c.config_records[CONFIG].__setitem__("cuts", [99, 99]), "CutError: cut 99 is out of range: cnn has"),
    (lambda c: c.config_records[CONFIG].__setitem__("round", "x"), "train instruction: round must be an integer"),
    (lambda c: c.config_records[CONFIG].__setitem__("local-epochs", "1"),
     "train instruction: local-epochs must be an integer, got '1'"),
    (lambda c: c.config_records[CONFIG].__setitem__("local-epochs", -1), "local-epochs must be >= 1, got -1"),
    (lambda c: c.config_records[CONFIG].__setitem__("model", '{"name": "nope"}'),
     "train instruction: malformed (KeyError"),
    (_bad_weights, "device weights '"),
])
def test_a_bad_instruction_comes_back_as_the_nodes_one_line_refusal(monkeypatch, tmp_path, change, words) -> None:
    """Each of these raised from the ClientApp (IndexError, TypeError, RuntimeError: a traceback in the
    node's log, and the coordinator got the engine's wrapper); local-epochs -1 trained on nothing and said OK."""
    msg, ctx = _instruction(monkeypatch, tmp_path)
    content = msg.content
    change(content)
    with inprocess_tiers(monkeypatch, BASE.tiers - 1):
        reply = clients.app.app(Message(content, dst_node_id=msg.metadata.dst_node_id, message_type="train",
                                        group_id="1"), ctx)
    assert reply.has_error(), reply.content
    assert words in reply.error.reason and "\n" not in reply.error.reason, reply.error.reason


@pytest.mark.parametrize(("ask", "words"), [
    ({"model": "{oops"}, "query: malformed (JSONDecodeError"),
    ({"model": '{"name": "nope"}'}, "query: malformed (KeyError"),
    ({"seed": "abc"}, "query: seed must be one integer, got 'abc'"),
])
def test_a_bad_query_comes_back_as_the_nodes_one_line_refusal(ask, words) -> None:
    ctx = FakeGrid(clients.app.app, 1).contexts[1000]
    base = {"model": json.dumps(BASE.spec.to_dict()), "dataset": "digits", "partition": "iid", "seed": 0}
    msg = Message(RecordDict({CONFIG: ConfigRecord({**base, **ask})}), dst_node_id=1000, message_type="query",
                  group_id="0")
    reply = clients.app.app(msg, ctx)
    assert reply.has_error(), reply.content
    assert words in reply.error.reason and "\n" not in reply.error.reason, reply.error.reason


def test_a_query_asking_to_measure_a_link_it_names_no_edge_for_says_it_could_not() -> None:
    """It read the edge's address with ``ask["edge-address"]``: a KeyError from the ClientApp."""
    ctx = FakeGrid(clients.app.app, 1).contexts[1000]
    msg = Message(RecordDict({CONFIG: ConfigRecord({"measure-link": True})}), dst_node_id=1000,
                  message_type="query", group_id="0")
    reply = clients.app.app(msg, ctx)
    assert not reply.has_error()
    info = NodeInfo.from_record(reply.content.config_records[NODE])
    assert info.link is None and info.link_error.startswith("no edge address")


def test_node_info_refuses_a_sample_count_outside_what_a_device_holds() -> None:
    ok = NodeInfo(0, 3, samples=100).to_record()
    assert NodeInfo.from_record(ok).samples == 100
    for bad in (-1, 10**12 + 1):
        with pytest.raises(ConfigError, match=f"samples must be in 0..1,000,000,000,000, got {bad}"):
            NodeInfo.from_record({**ok, "samples": bad})
    assert not NodeInfo.from_record(ok).own_data and NodeInfo.from_record({**ok, "own-data": True}).own_data
