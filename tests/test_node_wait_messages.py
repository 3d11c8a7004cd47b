"""What ``SplitFedAvg.register`` says while it waits for nodes, and when too few are admitted.

The wait said "Waiting for nodes: 2 of 3 registered" once a second (119 lines for 120 s); now it says it when
the count changes, else every ``waiting_s`` (30 s, as a round's progress), and once more where the wait ran
out. A query round that admitted too few nodes said "only 0 node(s) answered the query round" though both
answered and were left out (num-partitions): its refusal now says how many answered, how many were admitted,
and why the others were left out. Real ClientApps answer over ``FakeGrid``; ``server.strategy``'s clock is a
fake that only ``sleep`` moves, so a two-minute wait takes no time."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pytest
from flwr.app import Context, Message

import clients.app
import server.strategy
from server.strategy import SplitFedAvg
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import make_policy
from tests.flower_fixtures import FakeGrid, StrategyClock

SMALL = RunSettings(rounds=1, clients=3, tiers=3, cuts="static:1,3", batch_size=32, node_wait_s=120.0,
                    round_timeout_s=30.0)


def _strategy(settings: RunSettings) -> SplitFedAvg:
    return SplitFedAvg(settings, [], make_policy(settings))


def _waiting(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Waiting for nodes")]


class _Listed(FakeGrid):
    """Lists its first ``counts[i]`` nodes at its i-th listing (the last count from then on)."""

    def __init__(self, num_nodes: int, counts: list[int]) -> None:
        super().__init__(clients.app.app, num_nodes)
        self.counts = counts
        self.asked = 0

    def get_node_ids(self) -> Iterable[int]:
        n = self.counts[min(self.asked, len(self.counts) - 1)]
        self.asked += 1
        return self.node_ids[:n]


def _partitions(grid: FakeGrid, num_partitions: int) -> FakeGrid:
    for n in grid.node_ids:
        grid.contexts[n].node_config["num-partitions"] = num_partitions
    return grid


# ---------------------------------------------------------------- the wait


def test_a_long_wait_at_one_count_says_it_every_30_s_and_where_the_wait_ran_out(strategy_clock: StrategyClock,
                                                                                caplog) -> None:
    """2 of 3 nodes for the whole 120 s: at 0, 30, 60 and 90 s, then the end (before: 120 lines)."""
    with caplog.at_level(logging.INFO):
        got = _strategy(SMALL).register(_Listed(3, [2]))
    assert _waiting(caplog) == ["Waiting for nodes: 2 of 3 registered"] * 4 + [
        "Waiting for nodes: 2 of 3 registered when node-wait-s (120s) ran out"]
    assert [c.client_id for c in got] == ["client0", "client1"]


def test_the_wait_says_each_new_count_at_once_and_nothing_more_once_all_came(strategy_clock: StrategyClock,
                                                                             caplog) -> None:
    """1 node for 3 s, then 2 for 40 s, then all 3: each count the moment it changes, 2 again 30 s later."""
    with caplog.at_level(logging.INFO):
        got = _strategy(SMALL).register(_Listed(3, [1] * 3 + [2] * 40 + [3]))
    assert _waiting(caplog) == ["Waiting for nodes: 1 of 3 registered", "Waiting for nodes: 2 of 3 registered",
                                "Waiting for nodes: 2 of 3 registered"]
    assert [c.client_id for c in got] == ["client0", "client1", "client2"]


# ---------------------------------------------------------------- the query round's refusal


def test_nodes_that_answered_but_were_left_out_are_said_so_with_why(strategy_clock: StrategyClock, caplog) -> None:
    """The prober's run: clients=3, two nodes started with num-partitions=2. Both answer, both are left out;
    the refusal was "only 0 node(s) answered the query round; at least 1 needed"."""
    grid = _partitions(FakeGrid(clients.app.app, 2), 2)
    with caplog.at_level(logging.INFO), pytest.raises(ConfigError) as e:
        _strategy(SMALL).register(grid)
    assert str(e.value) == (
        "only 0 node(s) admitted by the query round (2 of 2 answered); at least 1 needed; left out: its node "
        "config's num-partitions is 2, the run deals its data out to 3 clients (2 nodes)")
    assert _waiting(caplog)[-1] == "Waiting for nodes: 2 of 3 registered when node-wait-s (120s) ran out"


def test_each_reason_is_counted_the_most_common_first(strategy_clock: StrategyClock) -> None:
    """Four nodes, two needed: one crashes, one never replies, two deal the data out otherwise."""
    def app(msg: Message, ctx: Context) -> Message:
        if ctx.node_id == 1000:  # FakeGrid's first node
            raise RuntimeError("no data here\nTraceback (most recent call last): ...")
        return clients.app.app(msg, ctx)

    grid = FakeGrid(app, 4, drop=lambda node, msg: node == 1000 + 7 * 3)
    for i, n in enumerate(grid.node_ids[1:3]):
        grid.contexts[n].node_config.update({"partition-id": i, "num-partitions": 2})
    with pytest.raises(ConfigError) as e:
        _strategy(SMALL.with_(clients=4, min_clients=2, node_wait_s=5.0)).register(grid)
    assert str(e.value) == (
        "only 0 node(s) admitted by the query round (2 of 4 answered); at least 2 needed; left out: its node "
        "config's num-partitions is 2, the run deals its data out to 4 clients (2 nodes); no reply within "
        "node-wait-s (5s) (1 node); an error instead of an answer: RuntimeError: no data here (1 node)")


def test_two_nodes_on_one_partition_are_both_counted_as_left_out(strategy_clock: StrategyClock) -> None:
    grid = FakeGrid(clients.app.app, 2)
    for n in grid.node_ids:
        grid.contexts[n].node_config.update({"partition-id": 0, "num-partitions": 2})
    with pytest.raises(ConfigError) as e:
        _strategy(SMALL.with_(clients=2, min_clients=1)).register(grid)
    assert str(e.value) == ("only 0 node(s) admitted by the query round (2 of 2 answered); at least 1 needed; "
                            "left out: partition 0 held by more than one node (2 nodes)")


def test_beyond_three_reasons_the_rest_are_counted_not_listed() -> None:
    left = {1: "a", 2: "b", 3: "b", 4: "c", 5: "d", 6: "e"}
    reasons = server.strategy._reasons
    assert reasons(left) == "b (2 nodes); a (1 node); c (1 node); 2 other reason(s) in the warnings above"
    assert reasons({1: "a"}) == "a (1 node)"
