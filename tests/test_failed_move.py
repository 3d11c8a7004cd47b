"""A client moved in a round it failed is charged the move when it next trains, in both backends.

Before, ``previous`` (each client's cuts when it last trained) took the round's whole assignment, the failed
client's new cuts too: its row showed the move, the simulated time (the clients that finished) left it out,
and no later round charged it, as ``previous`` already held the new cuts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import clients.app
import server.app
import splitfed.flower.policy as policy_mod
from splitfed.errors import SplitfedError
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo, Cuts, Measurement, StaticPolicy, register_policy
from splitfed.flower.records import CONFIG
from splitfed.sim.clock import fleet_for, make_clock
from tests.flower_fixtures import FakeGrid, inprocess_tiers

START = [(1, 3), (2, 5), (0, 4), (3, 7)]  # client p trains at START[p] in round 1
MOVE = {"client0": (3, 7)}  # and these move from round 2 (the phone, the round's straggler: its move shows)
# seed 1 deals 4 of the reference fleet's devices as phone-mid-0, phone-mid-1, phone-flagship-0, laptop-0: client0
# is the mid-range phone, the round's straggler at START's cuts and MOVE's (seed 0 deals a Jetson as client0, whose
# move hides behind a phone's time)
BASE = RunSettings(rounds=3, clients=4, tiers=3, cuts="movesat2", batch_size=32, lr=0.05, momentum=0.9,
                   min_clients=2, node_wait_s=5.0, round_timeout_s=30.0, seed=1)


class MovesAtTwo(StaticPolicy):
    """START in round 1, MOVE's clients at their new cuts from round 2 (a policy a user registers)."""

    def assign(self, round: int, clients: Sequence[ClientInfo]) -> dict[str, Cuts]:
        cuts = super().assign(round, clients)
        return {cid: MOVE.get(cid, c) if round >= 2 else c for cid, c in cuts.items()}

    def observe(self, round: int, measurements: Sequence[Measurement]) -> None:
        return None


@pytest.fixture(autouse=True)
def _moving_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_mod, "_FACTORIES", dict(policy_mod._FACTORIES))  # registered for this test only
    register_policy("movesat2", lambda arg, settings: MovesAtTwo(START))


def _flower(monkeypatch: pytest.MonkeyPatch, s: RunSettings, fails: Mapping[int, str]) -> None:
    """The ServerApp over a FakeGrid: the node of client ``fails[r]`` crashes on its train message of round r."""

    def app(msg: Any, ctx: Any) -> Any:
        if msg.metadata.message_type == "train":
            rnd = int(msg.content.config_records[CONFIG]["server-round"])
            if fails.get(rnd) == f"client{ctx.node_config['partition-id']}":
                raise RuntimeError("the node crashed")
        return clients.app.app(msg, ctx)

    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(app, s.clients), s, progress=lambda line: None)


def _local(monkeypatch: pytest.MonkeyPatch, s: RunSettings, fails: Mapping[int, str]) -> None:
    """The in-process backend: client ``fails[r]``'s training raises in round r."""
    import splitfed.engine.rounds as rounds
    from splitfed.sim.inprocess import train_inprocess

    train = rounds.train_client

    def raising(cfg: Any, chain: Any, cid: str, *args: Any, **kwargs: Any) -> Any:
        if fails.get(cfg.round) == cid:
            raise SplitfedError("the node crashed")
        return train(cfg, chain, cid, *args, **kwargs)

    monkeypatch.setattr(rounds, "train_client", raising)
    train_inprocess(s)


def _rows(folder: Any) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def _sim_s(s: RunSettings, rnd: int, previous: Mapping[str, Cuts]) -> float | None:
    """The simulated time of round ``rnd`` (every client finished) from the clients' ``previous`` cuts."""
    from splitfed.sim.inprocess import sim_clients

    fleet = fleet_for(s)
    sampled = sim_clients(s, fleet)
    assignment = {c.client_id: MOVE.get(c.client_id, START[c.partition_id]) for c in sampled}
    return make_clock(s, fleet)(rnd, assignment, sampled, previous)


@pytest.mark.parametrize("backend", ["flower", "local"])
def test_a_client_that_failed_the_round_it_moved_pays_the_move_when_it_next_trains(monkeypatch, tmp_path,
                                                                                  backend):
    s = BASE.with_(out=str(tmp_path))
    (_flower if backend == "flower" else _local)(monkeypatch, s, {2: "client0"})
    rows = _rows(tmp_path)
    move = {"client0": [list(START[0]), list(MOVE["client0"])]}
    assert [r["failed"] for r in rows] == [[], ["client0"], []]
    assert [r["moved"] for r in rows] == [{}, {}, move]  # planned in round 2, made (and listed) in round 3
    start = {f"client{p}": c for p, c in enumerate(START)}
    assert rows[2]["sim_round_s"] == _sim_s(s, 3, start)  # its move is in round 3's time
    assert rows[2]["sim_round_s"] > _sim_s(s, 3, {**start, **MOVE})  # it costs something


def test_the_checkpoint_keeps_a_failed_clients_old_cuts_and_a_resume_charges_its_move(monkeypatch, tmp_path):
    """The checkpoint after round 2 holds client0's cuts of round 1 (it did not finish round 2 at its new
    ones), so a run resumed there charges the move in round 3 as the whole run does."""
    fails = {2: "client0"}
    _flower(monkeypatch, BASE.with_(out=str(tmp_path / "whole")), fails)
    _flower(monkeypatch, BASE.with_(out=str(tmp_path / "part"), rounds=2), fails)
    assert checkpoint.load(tmp_path / "part").assignment["client0"] == START[0]
    _flower(monkeypatch, BASE.with_(out=str(tmp_path / "part"), resume=True), fails)
    assert checkpoint.load(tmp_path / "whole").assignment["client0"] == MOVE["client0"]  # it finished round 3
    whole, part = _rows(tmp_path / "whole"), _rows(tmp_path / "part")
    assert [(r["moved"], r["sim_round_s"]) for r in part] == [(r["moved"], r["sim_round_s"]) for r in whole]
    assert whole[2]["moved"]


def test_both_backends_write_the_same_rows_when_a_moved_client_fails(monkeypatch, tmp_path):
    fails = {2: "client0"}
    _flower(monkeypatch, BASE.with_(out=str(tmp_path / "flower")), fails)
    _local(monkeypatch, BASE.with_(out=str(tmp_path / "local")), fails)
    keys = ("cuts", "moved", "failed", "sim_round_s", "clients")
    assert ([{k: r[k] for k in keys} for r in _rows(tmp_path / "flower")]
            == [{k: r[k] for k in keys} for r in _rows(tmp_path / "local")])
