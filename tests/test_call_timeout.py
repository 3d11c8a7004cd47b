"""How long one call of a device to its edge may take (``call-timeout-s``). Every node's link once waited 60 s
per call whatever the run said: a device on a slow link with a large boundary could not be given more, and a
stalled edge could not be given up on sooner. The coordinator now sends each node the run's setting, capped by
the round timeout (no call outlasts its round)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message

import clients.app
import server.app
from splitfed.flower.config import RunSettings
from tests.flower_fixtures import FakeGrid, inprocess_tiers

BASE = RunSettings(rounds=1, clients=2, tiers=3, cuts="static:1,3", batch_size=32, node_wait_s=5.0,
                   round_timeout_s=30.0, min_clients=1)


@pytest.mark.parametrize(("changes", "deadline"), [
    ({}, 30.0),  # the default 60 s, capped by this round's 30
    ({"round_timeout_s": 600.0}, 60.0),  # the default alone
    ({"call_timeout_s": 7.5}, 7.5),
    ({"call_timeout_s": 100.0, "round_timeout_s": 40.0}, 40.0),
])
def test_each_node_is_told_the_runs_call_timeout_capped_by_its_round(monkeypatch, tmp_path, changes,  # type: ignore[no-untyped-def]
                                                                     deadline) -> None:
    told: list[float] = []

    def app(msg: Message, ctx: Any) -> Message:
        if msg.metadata.message_type == "train":
            told.append(clients.app._received(msg.content)[0].deadline_s)
        return clients.app.app(msg, ctx)

    s = BASE.with_(out=str(tmp_path / "run"), **changes)
    assert s.call_deadline_s == deadline
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(app, s.clients), s)
    assert told == [deadline, deadline]


def test_a_call_the_edge_does_not_answer_in_time_fails_its_client_alone(monkeypatch, tmp_path: Path) -> None:
    """Real gRPC tiers; the edge holds client1's first step until the run is over. With call-timeout-s 2 that
    step gives up after 2 s (the default would wait 60 s, past this test's hold): client1 fails, naming the
    deadline; client0 trains."""
    from splitfed.transport.server import TierServicer, serve_tier

    released = threading.Event()
    real_check = TierServicer._check

    def check(self: TierServicer, head: Any, items: Any) -> None:
        if head.client_id == "client1":
            released.wait(45.0)
        real_check(self, head, items)

    monkeypatch.setattr(TierServicer, "_check", check)
    try:
        with serve_tier("cloud", insecure=True) as cloud, \
                serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
            s = BASE.with_(out=str(tmp_path / "run"), call_timeout_s=2.0, sim_clock=False,
                           tier_addresses=f"{edge.address},{cloud.address}")
            server.app.run(FakeGrid(clients.app.app, 2), s, progress=lambda line: None)
            released.set()
    finally:
        released.set()
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["failed"] == ["client1"], row
    assert "no answer within the deadline of 2s" in row["why_failed"]["client1"], row["why_failed"]
