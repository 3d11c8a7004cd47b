"""What ``server.strategy`` promises, pinned where a mutation run found nothing checking it.

A new :class:`RoundRecord` has moved no weights; :func:`moves` lists only clients whose cuts changed, and
:func:`settle` keeps a failed client's old cuts (and drops its move). :class:`RoundProgress` counts the clients
done and failed, and speaks once ``every_s`` seconds have passed, exactly then (a fake clock). ``SplitFedAvg``
turns Flower's federated evaluation off, keeps its waiting period and its edge's address, waits ``node_wait_s``
polling once a second and goes on with ``min_clients`` nodes, asks a node whose answer was refused (or that
waits for its partition's old node to go) only once, samples among the listed nodes with the fraction's product
rounded to 9 decimals, and completes a real-time round a client failed (no clock to price it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, RecordDict

import clients.app
import server.app
import server.strategy
from server.app import metrics_row
from server.strategy import WAITING_S, RoundProgress, RoundRecord, SplitFedAvg, moves, settle
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo, make_policy
from tests.flower_fixtures import FakeGrid, StrategyClock, inprocess_tiers

SMALL = RunSettings(rounds=1, clients=3, tiers=3, cuts="static:1,3", batch_size=32, node_wait_s=5.0,
                    round_timeout_s=30.0)


def _strategy(settings: RunSettings = SMALL, **kw) -> SplitFedAvg:  # type: ignore[no-untyped-def]
    return SplitFedAvg(settings, [], make_policy(settings), **kw)


# ---------------------------------------------------------------- RoundRecord, moves, settle


def test_a_new_round_record_has_moved_no_weights_to_or_from_the_devices() -> None:
    rec = RoundRecord(1, {"client0": (1, 3)}, sim_round_s=1.0)
    assert rec.device_weight_bytes == [0, 0]
    assert metrics_row(rec, 0.5, 1.0, 2.0, {})["device_weight_bytes"] == [0, 0]


def test_moves_lists_only_the_clients_whose_cuts_changed() -> None:
    """A client at its old cuts did not move, and a new client did not either."""
    previous = {"a": (1, 2), "b": (2, 3)}
    assert moves(previous, {"a": (1, 2), "b": (1, 3), "c": (2, 2)}) == {"b": ((2, 3), (1, 3))}
    assert moves(previous, {"a": [1, 2]}) == {}  # a list of the same cuts is no move


def test_settle_keeps_a_failed_clients_old_cuts_and_drops_its_move() -> None:
    previous: dict[str, tuple[int, ...]] = {"a": (1, 2), "b": (1, 2)}
    rec = RoundRecord(1, {"a": (2, 3), "b": (2, 3), "c": (1, 1)}, failed=["b"],
                      moved={"a": ((1, 2), (2, 3)), "b": ((1, 2), (2, 3))})
    settle(previous, rec)
    assert previous == {"a": (2, 3), "b": (1, 2), "c": (1, 1)}
    assert rec.moved == {"a": ((1, 2), (2, 3))}


# ---------------------------------------------------------------- RoundProgress


def _replies(ok: int, failed: int) -> list[Message]:
    FakeGrid(clients.app.app, 0)  # sets Flower's task identity, as a runtime would: a Message needs it
    asked = Message(RecordDict(), dst_node_id=1, message_type=MessageType.TRAIN)
    asked.metadata.__dict__["_message_id"] = "m1"
    return ([Message(RecordDict(), reply_to=asked) for _ in range(ok)]
            + [Message(Error(code=0, reason="gone"), reply_to=asked) for _ in range(failed)])


def test_a_fresh_progress_has_no_clients_none_done_none_failed(strategy_clock: StrategyClock) -> None:
    said: list[str] = []
    RoundProgress(said.append, 1, 2, 0.0).waiting([])
    assert said == ["round 1/2  0/0 clients done  wall 0s"]


def test_progress_counts_the_answered_groups_and_their_failures(strategy_clock: StrategyClock) -> None:
    """Done and failed add up over the groups (sl, sflv2: a turn each) and the replies in so far."""
    said: list[str] = []
    watch = RoundProgress(said.append, 3, 5, 0.0)
    watch.clients = 6
    watch.answered(_replies(1, 1))
    watch.answered(_replies(1, 0))
    strategy_clock.now += 42.0
    watch.waiting(_replies(1, 1))
    assert said == ["round 3/5  5/6 clients done (2 failed)  wall 42s"]


def test_progress_speaks_once_every_s_have_passed_and_not_before(strategy_clock: StrategyClock) -> None:
    said: list[str] = []
    watch = RoundProgress(said.append, 1, 1, 30.0)
    watch.clients = 2
    for t in (110.0, 129.0, 130.0, 140.0, 159.5, 160.0):
        strategy_clock.now = t
        watch.waiting([])
    assert said == ["round 1/1  0/2 clients done  wall 30s", "round 1/1  0/2 clients done  wall 60s"]


# ---------------------------------------------------------------- SplitFedAvg's settings


def test_federated_evaluation_is_off_as_flowers_hooks_see_it() -> None:
    """The ServerApp evaluates the global model itself: Flower's evaluate hook sends no node anything."""
    grid = FakeGrid(clients.app.app, 2)
    assert list(_strategy().configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid)) == []
    assert grid.sent == []


def test_the_waiting_period_is_the_given_one_or_waiting_s() -> None:
    assert _strategy().waiting_s == WAITING_S == 30.0
    assert _strategy(waiting_s=2.5).waiting_s == 2.5


def test_the_edge_is_the_first_of_the_tier_addresses_unless_named() -> None:
    s = SMALL.with_(tier_addresses="127.0.0.1:7101,127.0.0.1:7102")
    assert _strategy(s).edge_address == "127.0.0.1:7101"
    assert _strategy(s, edge_address="127.0.0.1:7200").edge_address == "127.0.0.1:7200"
    assert _strategy().edge_address == ""


# ---------------------------------------------------------------- registration


class _TwoOfThree(FakeGrid):
    """Three partitions, but only the first two nodes ever connect."""

    def get_node_ids(self) -> Iterable[int]:
        return self.node_ids[:2]


def test_registration_polls_each_second_for_node_wait_s_then_goes_on_with_min_clients(strategy_clock: StrategyClock,
                                                                                         caplog) -> None:
    """3 clients asked, 2 connect, 2 must finish: it waits the 3 s given (a poll a second) and registers the 2;
    the minimum itself is enough."""
    s = SMALL.with_(clients=3, min_clients=2, node_wait_s=3.0)
    with caplog.at_level("INFO"):
        got = _strategy(s).register(_TwoOfThree(clients.app.app, 3))
    assert strategy_clock.slept == [1.0, 1.0, 1.0] and strategy_clock.now == 103.0
    # said at its start and where it ran out, not at each poll (tests/test_node_wait_messages.py)
    assert caplog.text.count("Waiting for nodes: 2 of 3 registered") == 2
    assert "Waiting for nodes: 2 of 3 registered when node-wait-s (3s) ran out" in caplog.text
    assert [c.client_id for c in got] == ["client0", "client1"]


# ---------------------------------------------------------------- a node that comes back (_rejoin)


def _queries_to(grid: FakeGrid, node: int) -> int:
    return sum(m.metadata.dst_node_id == node and m.metadata.message_type == "query" for m in grid.sent)


def _node(grid: FakeGrid, node: int, partition: int, partitions: int = 3) -> None:
    grid.contexts[node] = Context(run_id=1, node_id=node, node_config={"partition-id": partition,
                                                                       "num-partitions": partitions},
                                  state=RecordDict(), run_config={})


def test_a_node_whose_answer_is_refused_is_never_asked_again() -> None:
    """Partition 2's node fails the query round; when client1's node is gone, a new node that deals the data
    out otherwise is refused. Neither is asked again at each later round (its answer does not change)."""
    def app(msg: Message, ctx: Context) -> Message:
        if ctx.node_config["partition-id"] == 2:
            raise RuntimeError("not ready")
        return clients.app.app(msg, ctx)

    grid = FakeGrid(app, 3)
    a, b, c = grid.node_ids
    strategy = _strategy(SMALL.with_(min_clients=2))
    strategy.register(grid)
    assert strategy._rejoin(grid) == {a, b, c}  # nothing gone: the nodes listed
    _node(grid, 5000, 1, partitions=8)
    grid.node_ids = [a, c, 5000]
    for _ in range(3):
        assert strategy._rejoin(grid) == {a, c, 5000}
    assert (_queries_to(grid, 5000), _queries_to(grid, c)) == (1, 1)
    assert sorted(strategy.clients) == [a, b]


def test_a_node_waiting_for_its_partitions_old_node_is_asked_once_and_takes_its_place() -> None:
    """Client2's node is gone; a new node for partition 1 comes while client1's old node is still listed: it
    waits, unasked again, until the old id goes, then trains for client1."""
    grid = FakeGrid(clients.app.app, 3)
    a, b, c = grid.node_ids
    strategy = _strategy()
    strategy.register(grid)
    _node(grid, 5000, 1)
    grid.node_ids = [a, b, 5000]
    strategy._rejoin(grid)
    strategy._rejoin(grid)
    assert _queries_to(grid, 5000) == 1 and sorted(strategy.clients) == [a, b, c]
    grid.node_ids = [a, 5000]
    strategy._rejoin(grid)
    assert _queries_to(grid, 5000) == 1
    assert {n: ci.client_id for n, ci in strategy.clients.items()} == {a: "client0", 5000: "client1", c: "client2"}


# ---------------------------------------------------------------- sampling


def _registered(n: int, fraction: float, minimum: int = 1) -> SplitFedAvg:
    st = _strategy()
    st.fraction_train, st.min_train_nodes = fraction, minimum
    st.clients = {i: ClientInfo(f"client{i}", i, i) for i in range(n)}
    return st


def test_sampling_draws_among_the_listed_nodes_when_they_are_enough() -> None:
    """4 registered, 2 to draw: with exactly 2 listed, those 2 every round; with none given, 2 of all 4."""
    st = _registered(4, 0.5)
    for rnd in range(1, 11):
        assert [c.client_id for c in st.sample(rnd, {0, 1, 99})] == ["client0", "client1"]
    drawn = [c.client_id for rnd in range(1, 11) for c in st.sample(rnd)]
    assert len(drawn) == 20 and set(drawn) == {"client0", "client1", "client2", "client3"}


@pytest.mark.parametrize(("fraction", "k"), [(0.5000000001, 1), (0.500000001, 2)])
def test_the_fractions_share_is_rounded_to_9_decimals_before_the_ceiling(fraction: float, k: int) -> None:
    """As documented: a share above a whole number in its 10th decimal is float error, in its 9th it is not."""
    assert len(_registered(2, fraction).sample(1)) == k


# ---------------------------------------------------------------- a real-time round a client failed


def test_a_real_time_round_that_a_client_failed_completes_with_no_simulated_time(monkeypatch, tmp_path) -> None:
    """In real time there is no clock to price the round its survivors finished: the round stands, its row
    names the failure, and its simulated time stays unknown."""
    def app(msg: Message, ctx: Context) -> Message:
        if msg.metadata.message_type == MessageType.TRAIN and ctx.node_config["partition-id"] == 1:
            return Message(Error(code=0, reason="ConfigError: this device's disk is gone"), reply_to=msg)
        return clients.app.app(msg, ctx)

    s = SMALL.with_(clients=2, min_clients=1, sim_clock=False, out=str(tmp_path))
    monkeypatch.setattr(clients.app, "_measure_link", lambda node, ask: (None, "not measured in this test"))
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(app, s.clients), s, progress=lambda line: None)
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["failed"] == ["client1"] and sorted(row["per_client"]) == ["client0"]
    assert row["why_failed"] == {"client1": "ConfigError: this device's disk is gone"}
    assert row["sim_round_s"] is None
