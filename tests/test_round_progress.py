"""A round still waiting for its clients says how far it got, every ``server.strategy.WAITING_S`` seconds (a round
of a large fleet takes minutes, and a terminal silent that long looks hung); a round done sooner says nothing
more than its own line. Before, nothing was said between the rounds' lines."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pytest
from flwr.app import Context, Error, Message, MessageType

import clients.app
import server.app
import server.strategy
from splitfed.flower.config import RunSettings
from tests.flower_fixtures import FakeGrid, inprocess_tiers

WAITING = re.compile(r"round (\d+)/(\d+)  (\d+)/(\d+) clients done(?: \((\d+) failed\))?  wall \d+s$")


@pytest.fixture(autouse=True)
def _no_poll_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reply of :class:`_Slow` comes after a poll that finds none: the round sleeps ``POLL_S`` (0.2 s) after it,
    ten times a test. What is said depends on the polls, not on how long they sleep."""
    monkeypatch.setattr(server.strategy, "POLL_S", 0.0)


class _Slow(FakeGrid):
    """Replies come one at a time, each after a poll that finds none (clients that take a while)."""

    held = False

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.held = not self.held
        if self.held:
            return []
        ready = [m for m in message_ids if m in self.replies]
        return [self.replies.pop(ready[0])] if ready else []


def _lines(monkeypatch: pytest.MonkeyPatch, s: RunSettings, grid: FakeGrid) -> list[str]:
    said: list[str] = []
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(grid, s, progress=said.append)
    return said


@pytest.mark.parametrize(("mode", "counts"), [("sflv1", [0, 1, 1, 2, 2]), ("sl", [0, 1, 2])])
def test_a_waiting_round_says_how_many_of_its_clients_are_done(monkeypatch, mode: str, counts: list[int]) -> None:
    """Every poll that leaves clients to wait for says so (``WAITING_S`` = 0): SplitFed v1 sends to the 3 clients
    at once and counts their replies; vanilla split learning trains them in turn and counts the turns done."""
    monkeypatch.setattr(server.strategy, "WAITING_S", 0.0)
    s = RunSettings(rounds=2, clients=3, mode=mode, node_wait_s=5.0, round_timeout_s=60.0)
    said = _lines(monkeypatch, s, _Slow(clients.app.app, 3))
    waiting = [m.groups() for line in said if (m := WAITING.match(line))]
    assert [(int(r), int(c)) for r, _, c, _, _ in waiting] == [(1, c) for c in counts] + [(2, c) for c in counts], said
    assert all(rounds == "2" and total == "3" and failed is None for _, rounds, _, total, failed in waiting)
    rounds = [line for line in said if line.startswith("round ") and not WAITING.match(line)]
    assert [line.split()[1] for line in rounds] == ["1/2", "2/2"]  # each round's own line, after its waiting ones
    assert said.index(rounds[0]) > max(i for i, line in enumerate(said) if WAITING.match(line) and "round 1/" in line)


def test_a_round_done_before_the_wait_says_nothing_more(monkeypatch) -> None:
    s = RunSettings(rounds=1, clients=3, node_wait_s=5.0, round_timeout_s=60.0)
    said: list[Any] = _lines(monkeypatch, s, _Slow(clients.app.app, 3))
    assert server.strategy.WAITING_S >= 10 and not [line for line in said if WAITING.match(line)], said
    assert [line.split()[1] for line in said if line.startswith("round ")] == ["1/1"]


class _InOrder(_Slow):
    """As :class:`_Slow`, the replies in the order their messages went (a set's order otherwise)."""

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.held = not self.held
        if self.held:
            return []
        ready = [m for m in self.replies if m in set(message_ids)]
        return [self.replies.pop(ready[0])] if ready else []


@pytest.mark.parametrize(("mode", "lines"), [("sflv1", [(0, None), (1, 1), (1, 1), (2, 1), (2, 1)]),
                                             ("sl", [(0, None), (1, 1), (2, 1)])])
def test_a_client_whose_round_failed_is_said_apart(monkeypatch, mode: str, lines: list[tuple[int, int | None]]) -> None:
    """The first client's training fails (an error reply, as a node that raised sends): it is done with the
    round, and the waiting lines say it failed. Before, it was counted among the done alone, and a watcher
    learnt of it only from the round's own line, minutes later in a large fleet."""
    monkeypatch.setattr(server.strategy, "WAITING_S", 0.0)

    def app(msg: Message, context: Context) -> Message:
        if msg.metadata.message_type == MessageType.TRAIN and context.node_config["partition-id"] == 0:
            return Message(Error(code=0, reason="ConfigError: this device's disk is gone"), reply_to=msg)
        return clients.app.app(msg, context)

    s = RunSettings(rounds=1, clients=3, min_clients=1, mode=mode, node_wait_s=5.0, round_timeout_s=60.0)
    said = _lines(monkeypatch, s, _InOrder(app, 3))
    waiting = [m.groups() for line in said if (m := WAITING.match(line))]
    assert [(int(done), failed and int(failed)) for _, _, done, _, failed in waiting] == lines, said
