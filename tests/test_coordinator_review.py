"""A review of the coordinator (server.app, server.strategy.SplitFedAvg) over the Flower 1.42 Message API: each
test here failed before the fix it names."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Error, Message
from hypothesis import given, settings
from hypothesis import strategies as st

import clients.app
import server.app
from server.strategy import RunStopped, SplitFedAvg
from splitfed.engine.rounds import RoundFailed
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo, make_policy
from splitfed.flower.records import CONFIG
from tests.flower_fixtures import FakeGrid, inprocess_tiers


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _run(monkeypatch: pytest.MonkeyPatch, s: RunSettings, grid: FakeGrid, say: Any = None,
         stop: threading.Event | None = None) -> dict[str, Any]:
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        return server.app.run(grid, s, progress=say or (lambda line: None), stop=stop)


def test_a_failed_round_names_the_clients_that_never_answered_and_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every sampled client failed: one node crashed, two never answered. RoundFailed named the crash and left
    the other two bare (``failed: ..., client1, client2``): the user could not tell a timeout from a refusal."""
    s = RunSettings(rounds=1, clients=3, node_wait_s=5.0, round_timeout_s=0.3, out=str(tmp_path))

    def app(msg: Message, ctx: Any) -> Message:
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 0:
            raise RuntimeError("node 0 crashed")
        return clients.app.app(msg, ctx)

    grid = FakeGrid(app, 3, drop=lambda node, msg: msg.metadata.message_type == "train" and node != grid.node_ids[0])
    with pytest.raises(RoundFailed) as e:
        _run(monkeypatch, s, grid)
    assert "client0 (RuntimeError: node 0 crashed)" in str(e.value)
    for cid in ("client1", "client2"):
        assert f"{cid} (no reply before the round timeout)" in str(e.value)


class _Refusing(FakeGrid):
    """A SuperLink that cannot take the train messages to ``refused`` (too large, say): ``None`` for their ids,
    as Flower's grid gives."""

    refused: set[int] = set()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        keep = [m for m in messages if not (m.metadata.message_type == "train"
                                            and m.metadata.dst_node_id in self.refused)]
        ids = iter(list(super().push_messages(keep)))
        return [next(ids) if m in keep else None for m in messages]  # type: ignore[misc]


def test_a_message_the_superlink_refused_is_named_so_not_as_a_timeout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A message the grid could not push (``None`` for its id) was never sent: the row said the client gave
    "no reply before the round timeout", though no one waited for it."""
    s = RunSettings(rounds=1, clients=2, node_wait_s=5.0, round_timeout_s=30.0, out=str(tmp_path))
    grid = _Refusing(clients.app.app, 2)
    grid.refused = {grid.node_ids[1]}
    _run(monkeypatch, s, grid)
    (row,) = _rows(tmp_path)
    assert row["failed"] == ["client1"] and row["clients"] == 1
    assert row["why_failed"]["client1"].startswith("its message could not be pushed to the SuperLink")


@given(n=st.integers(1, 30), fraction=st.floats(0.01, 1.0), min_share=st.floats(0.0, 1.0),
       gone=st.sets(st.integers(0, 29)), rnd=st.integers(1, 50))
@settings(max_examples=150, deadline=None)
def test_sampling_draws_among_the_listed_nodes_when_they_are_enough(n: int, fraction: float, min_share: float,
                                                                      gone: set[int], rnd: int) -> None:
    """``fraction`` < 1 drew among all registered clients, a node Flower no longer lists (gone for good) too:
    it failed, and a round that needed ``min-clients`` failed the run with listed nodes idle. The draw keeps its
    size (ceil(fraction * registered), at least min-clients), is the same for a seed, round and listed nodes,
    and is the old draw when every node is listed (resume is exact)."""
    s = RunSettings(clients=n, fraction=fraction, min_clients=max(1, round(min_share * n)))
    strategy = SplitFedAvg(s, [], make_policy(s))
    strategy.clients = {100 + i: ClientInfo(f"client{i}", 100 + i, i) for i in range(n)}
    live = {100 + i for i in range(n) if i not in gone}
    everyone = strategy.sample(rnd)
    assert strategy.sample(rnd, set(strategy.clients)) == everyone
    k = len(everyone)
    assert s.min_clients <= k <= n
    picked = strategy.sample(rnd, live)
    assert picked == strategy.sample(rnd, set(live))  # deterministic
    assert len(picked) == k and len({c.client_id for c in picked}) == k
    if len(live) >= k:
        assert all(c.node_id in live for c in picked)
    else:  # too few listed: drawn from all, the gone ones fail saying why
        assert picked == everyone


class _Leaving(FakeGrid):
    """As the SuperLink: a node it no longer lists gets an error reply for its message."""

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(super().push_messages(messages))
        for m, mid in zip(messages, ids, strict=True):
            if m.metadata.dst_node_id not in self.node_ids:
                self.replies[mid] = Message(Error(code=3, reason="Node Unavailable"), reply_to=m)
        return ids


def test_a_node_gone_mid_run_is_not_drawn_while_enough_listed_nodes_are(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """4 nodes, fraction 0.5, min-clients 2; client1's node leaves after round 1. Round 2 drew it, it failed,
    and the run stopped: "round 2: 1 of 2 clients finished, fewer than the minimum 2"."""
    s = RunSettings(rounds=4, clients=4, fraction=0.5, min_clients=2, node_wait_s=5.0, round_timeout_s=30.0,
                    out=str(tmp_path))
    grid = _Leaving(clients.app.app, 4, drop=lambda node, msg: node not in grid.node_ids)
    gone = grid.node_ids[1]

    def say(line: str) -> None:
        if line.startswith("round 1/"):
            grid.node_ids.remove(gone)

    _run(monkeypatch, s, grid, say)
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert all(r["clients"] == 2 and not r["failed"] for r in rows)
    assert all("client1" not in r["cuts"] for r in rows[1:])


def test_a_stop_between_rounds_sends_no_message_of_the_next_round(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A stop set once round 1 was recorded still sent round 2 to every node (each trained it for nothing, and
    its tiers' segments were released under it); the run then stopped in the wait. Now it stops before the
    round: round 1's checkpoint and its row, nothing of round 2."""
    s = RunSettings(rounds=3, clients=2, node_wait_s=5.0, round_timeout_s=30.0, out=str(tmp_path))
    grid = FakeGrid(clients.app.app, 2)
    stop = threading.Event()

    def say(line: str) -> None:
        if line.startswith("round 1/"):
            stop.set()

    with pytest.raises(RunStopped):
        _run(monkeypatch, s, grid, say, stop)
    rounds = [m.content.config_records[CONFIG]["server-round"] for m in grid.sent
              if m.metadata.message_type == "train"]
    assert rounds == [1, 1]
    assert [r["round"] for r in _rows(tmp_path)] == [1]
    assert checkpoint.load(str(tmp_path)).round == 1
