"""What ``server.strategy.SplitFedAvg`` promises past its registration, pinned where a mutation run found nothing
checking it.

A round's train loss is the sample-weighted mean of its clients' losses, and a loss of exactly 0 is reported as
0 (``train-loss`` of Flower's train metrics, kept per round in ``Result``); a client's measured round trip is in
seconds, 0 ms included, and unmeasured (< 0) is None; the simulated time of a round a client failed is the
makespan of the clients that finished; each node is told its own link's codec (``none,int8``: ``none``).
``exchange`` names a message the grid pushed no id for, tells ``waiting`` while it waits and only then, and
warns of the nodes that did not answer (and of none when all did). A restarted edge is a new instance; a run
without ``edge_now`` or an edge instance asks nothing. A node's sample count is refused above registered x epochs
(and at exactly that, never) and outside a Reduce weight's range; a reply of the right shape but the wrong dtype
is refused. ``_plain`` writes 0, 99.5 and 100 as ``0``, ``99.5``, ``100``.

The rounds run for real over in-process tiers (``FakeGrid``); the node's reply is edited where a number a real
node measures (its loss, its round trip) must be one the test knows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

import clients.app
from server.strategy import NO_REPLY, SplitFedAvg, _check_weights, _plain, _samples_refusal
from splitfed.engine.rounds import initial_state
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import make_policy
from splitfed.flower.records import CONFIG, METRICS, state_to_record
from tests.flower_fixtures import FakeGrid, inprocess_tiers

SMALL = RunSettings(rounds=2, clients=3, tiers=3, cuts="static:1,3", batch_size=32, node_wait_s=5.0,
                    round_timeout_s=30.0)


def _strategy(settings: RunSettings, tiers: Iterable[Any] = (), **kw: Any) -> SplitFedAvg:
    return SplitFedAvg(settings, list(tiers), make_policy(settings), **kw)


def _run(monkeypatch: pytest.MonkeyPatch, s: RunSettings, app: Any, rounds: int, **kw: Any) -> tuple[Any, ...]:
    """``rounds`` rounds of ``s`` with nodes running ``app``: the strategy, Flower's Result, the grid, and each
    round's record (``on_round``)."""
    records: dict[int, Any] = {}
    with inprocess_tiers(monkeypatch, s.tiers - 1) as chain:
        strategy = _strategy(s, chain.controls, **kw)
        grid = FakeGrid(app, s.clients)
        strategy.register(grid)
        result = strategy.start(grid, state_to_record(initial_state(s.spec, s.seed)), num_rounds=rounds,
                                timeout=30, on_round=lambda rnd, arrays, rec: records.__setitem__(rnd, rec))
    return strategy, result, grid, records


# ---------------------------------------------------------------- a round's numbers

LOSSES = {1: [0.5, 1.25, 3.0], 2: [0.0, 0.0, 0.0]}  # per round, per partition; round 2 trains perfectly
RTT_MS = [250.0, 0.5, 0.0]  # per partition, round 1: a quarter second, half a millisecond, under a millisecond


def test_train_loss_is_sample_weighted_its_zero_is_zero_and_round_trips_are_seconds(monkeypatch) -> None:
    """Round 1: the clients' losses 0.5, 1.25 and 3.0, one client claiming half its samples, give the
    sample-weighted mean (in the round's record, its metrics and Flower's Result); round trips of 250, 0.5 and
    0 ms are 0.25 s, 0.0005 s and 0 s (a measured 0 is no unmeasured -1). Round 2's losses are all 0: its
    train-loss is 0, not the value a missing loss stands for."""
    sent: dict[int, list[tuple[float, int]]] = {1: [], 2: []}

    def app(msg: Message, ctx: Context) -> Message:
        reply = clients.app.app(msg, ctx)
        if msg.metadata.message_type == MessageType.TRAIN and not reply.has_error():
            p, rnd = ctx.node_config["partition-id"], int(msg.content[CONFIG]["server-round"])
            m = reply.content.metric_records[METRICS]
            m["loss"] = LOSSES[rnd][p]
            m["rtt-ms"] = RTT_MS[p] if rnd == 1 else -1.0
            if p == 1:  # fewer samples than it has (it may claim fewer): the weights differ
                m["num-examples"] = max(1, int(m["num-examples"]) // 2)
                m["correct"] = min(int(m["correct"]), int(m["num-examples"]))
            sent[rnd].append((LOSSES[rnd][p], int(m["num-examples"])))
        return reply

    _, result, _, records = _run(monkeypatch, SMALL, app, rounds=2)
    assert len(sent[1]) == 3 and len({n for _, n in sent[1]}) == 2, sent
    total = sum(n for _, n in sent[1])
    want = sum(loss * n for loss, n in sent[1]) / total
    assert records[1].failed == []
    assert records[1].train_loss == pytest.approx(want, rel=1e-12)
    metrics = result.train_metrics_clientapp
    assert sorted(metrics) == [1, 2]
    assert metrics[1]["train-loss"] == pytest.approx(want, rel=1e-12)
    assert metrics[1]["num-examples"] == total and metrics[1]["clients"] == 3 and metrics[1]["failed"] == 0
    rtt = {m.client_id: m.rtt_s for m in records[1].measurements}
    assert rtt == {"client0": pytest.approx(0.25), "client1": pytest.approx(0.0005), "client2": 0.0}
    assert records[2].train_loss == 0.0 and metrics[2]["train-loss"] == 0.0
    assert {m.rtt_s for m in records[2].measurements} == {None}


def test_a_failed_clients_round_takes_the_simulated_time_of_those_that_finished(monkeypatch) -> None:
    """The clock prices the round's clients (10 s each here): with client2's training failed, the round's
    simulated time is the two that finished (20 s), not the three it was priced at before (30 s)."""
    asked: list[list[str]] = []

    def clock(rnd: int, assignment: Any, sampled: Any, previous: Any) -> float:
        asked.append(sorted(assignment))
        return 10.0 * len(assignment)

    def app(msg: Message, ctx: Context) -> Message:
        if msg.metadata.message_type == MessageType.TRAIN and ctx.node_config["partition-id"] == 2:
            raise RuntimeError("this node's ClientApp crashed")  # FakeGrid, as Flower, replies with an error
        return clients.app.app(msg, ctx)

    _, _, _, records = _run(monkeypatch, SMALL, app, rounds=1, clock=clock)
    assert records[1].failed == ["client2"]
    assert asked == [["client0", "client1", "client2"], ["client0", "client1"]]
    assert records[1].sim_round_s == 20.0


def test_each_node_is_told_the_codec_of_its_own_link(monkeypatch) -> None:
    """``compress = "none,int8"``: the device's link to the edge travels uncompressed; the node is told
    ``none``, not the edge -> cloud link's ``int8``."""
    s = SMALL.with_(clients=2, compress="none,int8")
    with inprocess_tiers(monkeypatch, s.tiers - 1) as chain:
        strategy = _strategy(s, chain.controls)
        grid = FakeGrid(clients.app.app, s.clients)
        strategy.register(grid)
        try:
            msgs = list(strategy.configure_train(1, state_to_record(initial_state(s.spec, s.seed)),
                                                 ConfigRecord(), grid))
        finally:
            strategy._abort()
    assert len(msgs) == 2 and {m.content[CONFIG]["compress"] for m in msgs} == {"none"}


# ---------------------------------------------------------------- exchange


def _echo(msg: Message, ctx: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


def _msgs(grid: FakeGrid) -> list[Message]:
    return [Message(RecordDict({CONFIG: ConfigRecord({"k": 1})}), dst_node_id=n, message_type=MessageType.QUERY)
            for n in grid.node_ids]


class _PushesNone(FakeGrid):
    """A grid that gives no id at all for what it could not push (a shorter list than the messages)."""

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return []


def test_a_message_the_grid_gave_no_id_for_is_named_as_not_pushed() -> None:
    grid = _PushesNone(_echo, 2)
    strategy = _strategy(SMALL)
    assert strategy.exchange(grid, _msgs(grid), timeout=5.0) == []
    assert sorted(strategy._unanswered) == grid.node_ids
    assert all(why.startswith("its message could not be pushed to the SuperLink")
               for why in strategy._unanswered.values())


class _SecondPull(FakeGrid):
    """Its replies come at the second pull (clients that take a moment)."""

    pulls = 0

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        return [] if self.pulls == 1 else super().pull_messages(message_ids)


def test_waiting_is_told_only_while_replies_are_still_awaited() -> None:
    grid = _SecondPull(_echo, 2)
    told: list[int] = []
    got = _strategy(SMALL).exchange(grid, _msgs(grid), 5.0, lambda so_far: told.append(len(so_far)))
    assert len(got) == 2 and told == [0] and grid.pulls == 2


def test_the_nodes_that_did_not_answer_are_warned_of_and_none_when_all_did(caplog) -> None:
    strategy = _strategy(SMALL)
    grid = FakeGrid(_echo, 2)
    with caplog.at_level("WARNING"):
        assert len(strategy.exchange(grid, _msgs(grid), timeout=5.0)) == 2
    assert "did not answer" not in caplog.text and strategy._unanswered == {}
    silent = FakeGrid(_echo, 2, drop=lambda node, msg: node == silent.node_ids[1])
    with caplog.at_level("WARNING"):
        assert len(strategy.exchange(silent, _msgs(silent), timeout=0.3)) == 1
    assert "1 node(s) did not answer within 0.3s" in caplog.text
    assert strategy._unanswered == {silent.node_ids[1]: NO_REPLY}


# ---------------------------------------------------------------- the edge's instance


def test_a_restarted_edge_is_the_instance_nodes_are_told_and_the_same_one_says_nothing(caplog) -> None:
    now = ["edge-1"]
    strategy = _strategy(SMALL, edge_address="127.0.0.1:1", edge_instance="edge-1", edge_now=lambda: now[0])
    with caplog.at_level("INFO"):
        strategy._describe_edge()
    assert strategy.edge_instance == "edge-1" and "new instance" not in caplog.text
    now[0] = "edge-2"
    with caplog.at_level("INFO"):
        strategy._describe_edge()
    assert strategy.edge_instance == "edge-2"
    assert "the edge at 127.0.0.1:1 is a new instance (edge-2, was edge-1): restarted" in caplog.text


def test_an_edge_is_asked_only_with_both_a_way_to_ask_and_an_instance_to_check() -> None:
    def ask() -> str:
        raise AssertionError("the edge was asked")

    no_instance = _strategy(SMALL, edge_now=ask)
    no_instance._describe_edge()
    assert no_instance.edge_instance == ""
    no_way = _strategy(SMALL, edge_instance="edge-1")  # no edge_now: nothing to call
    no_way._describe_edge()
    assert no_way.edge_instance == "edge-1"


# ---------------------------------------------------------------- a reply's refusals


def test_a_sample_count_up_to_registered_times_epochs_is_taken_and_a_reduce_weight_is_checked() -> None:
    assert _samples_refusal(20, 10, 2) is None  # two epochs over 10 samples: 20
    assert _samples_refusal(10, 10, 2) is None
    assert _samples_refusal(21, 10, 2) == ("it trained on 21 sample(s), more than the 10 it registered x 2 "
                                           "local epoch(s)")
    assert _samples_refusal(-1, 10, 1) == "its weight must be 0 or in 1e-06..1e+15 (its samples), got -1"


def test_weights_of_the_right_shape_but_another_dtype_are_refused() -> None:
    expected = {"w": ((2, 3), torch.float32)}
    _check_weights({"w": torch.zeros(2, 3)}, expected)
    with pytest.raises(ConfigError, match=r"^returned 'w' as float64 \[2, 3\], but the global model's is "
                                          r"float32 \[2, 3\]$"):
        _check_weights({"w": torch.zeros(2, 3, dtype=torch.float64)}, expected)
    with pytest.raises(ConfigError, match=r"^returned 'w' as float32 \[3, 2\]"):
        _check_weights({"w": torch.zeros(3, 2)}, expected)


# ---------------------------------------------------------------- numbers in the log


@pytest.mark.parametrize(("x", "text"), [(0.0, "0"), (-3.0, "-3"), (99.5, "99.5"), (100.0, "100"), (100.4, "100"),
                                         (1540.0, "1540"), (1.9, "1.9"), (0.0123, "0.0123")])
def test_plain_writes_about_three_significant_digits(x: float, text: str) -> None:
    assert _plain(x) == text
