"""In real time (deployment, or ``sim-clock=false``) each round's metrics carry what the cost model predicted of it
beside what was measured (design: "measured times are reported beside predicted ones"); before, a deployment's
rows had measured times only."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from server.app import metrics_row, progress_line
from server.strategy import RoundRecord
from splitfed.cost import evaluate
from splitfed.flower.adaptive import make_predictor, scenario
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo, Measurement


def test_a_real_time_run_reports_the_predicted_round_beside_the_measured_one(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import clients.app
    import server.app
    import splitfed.flower.adaptive as adaptive
    from splitfed.transport.server import serve_tier
    from tests.flower_fixtures import FakeGrid

    seen: list = []
    real = adaptive.scenario

    def spy(settings, clients):  # type: ignore[no-untyped-def]
        seen.append(list(clients))  # as registered: profile, and the link each node measured
        return real(settings, clients)

    monkeypatch.setattr(adaptive, "scenario", spy)
    lines: list[str] = []
    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        s = RunSettings(rounds=2, clients=2, cuts="static:1,3", sim_clock=False, node_wait_s=30.0,
                        round_timeout_s=60.0, tier_addresses=f"{edge.address},{cloud.address}", out=str(tmp_path))
        server.app.run(FakeGrid(clients.app.app, 2), s, progress=lines.append)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    infos = seen[0]
    assert all(c.link is not None for c in infos)  # each measured its link to the edge: the prediction uses it
    want = evaluate(real(s, infos), {c.client_id: (1, 3) for c in infos})  # what registration said
    for row in rows:
        assert row["sim_round_s"] is None and row["measured_round_s"] > 0
        assert row["predicted_round_s"] == pytest.approx(want.makespan_s)
        assert {cid: c["predicted_s"] for cid, c in row["per_client"].items()} == pytest.approx(want.times())
    assert sum("(predicted " in line for line in lines) == 2, lines


def test_a_dropped_client_leaves_the_prediction_beside_what_was_measured(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The prediction beside a round's measured time is of the clients that finished it: before, a client that
    failed was still priced (its time, and its share of the edge and cloud), a round the row never measured."""
    import clients.app
    import server.app
    import splitfed.flower.adaptive as adaptive
    from splitfed.transport.server import serve_tier
    from tests.flower_fixtures import FakeGrid

    seen: list = []
    real = adaptive.scenario

    def spy(settings, clients):  # type: ignore[no-untyped-def]
        seen.append(list(clients))
        return real(settings, clients)

    def slowest() -> str:  # as predicted from what registration said: dropping it changes the round
        times = evaluate(real(s, seen[0]), {c.client_id: (1, 3) for c in seen[0]}).times()
        return max(times, key=times.__getitem__)

    def app(msg, ctx):  # type: ignore[no-untyped-def]
        if msg.metadata.message_type == "train" and f"client{ctx.node_config['partition-id']}" == slowest():
            raise RuntimeError("device out of memory")
        return clients.app.app(msg, ctx)

    monkeypatch.setattr(adaptive, "scenario", spy)
    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        s = RunSettings(rounds=1, clients=3, min_clients=2, cuts="static:1,3", sim_clock=False, node_wait_s=30.0,
                        round_timeout_s=60.0, tier_addresses=f"{edge.address},{cloud.address}", out=str(tmp_path))
        server.app.run(FakeGrid(app, 3), s)
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    infos = seen[0]
    gone = slowest()
    left = [c for c in infos if c.client_id != gone]
    assert row["failed"] == [gone] and set(row["per_client"]) == {c.client_id for c in left}
    every = evaluate(real(s, infos), {c.client_id: (1, 3) for c in infos})
    done = evaluate(real(s, left), {c.client_id: (1, 3) for c in left})
    assert done.makespan_s != pytest.approx(every.makespan_s)  # else this test could not tell the two apart
    assert row["predicted_round_s"] == pytest.approx(done.makespan_s)
    assert {cid: c["predicted_s"] for cid, c in row["per_client"].items()} == pytest.approx(done.times())


def test_the_adaptive_policy_predicts_with_what_it_has_learned(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = RunSettings(rounds=3, clients=2, cuts="static:1,3", sim_clock=False)
    infos = [ClientInfo("client0", 1, 0, "", 100), ClientInfo("client1", 2, 1, "", 100)]
    from splitfed.sim.clock import fleet_for

    fleet = fleet_for(s)
    infos = [ClientInfo(c.client_id, c.node_id, c.partition_id, fleet.clients[i].name, 100)
             for i, c in enumerate(infos)]
    believed = scenario(s, infos)
    slower = believed.with_clients([believed.clients[0]])  # a belief of client0 alone: only it is priced
    policy = SimpleNamespace(adapter=SimpleNamespace(belief=slower))
    got = make_predictor(s, policy)({"client0": (1, 3)}, infos[:1])
    assert got is not None
    assert got[0] == evaluate(slower, {"client0": (1, 3)}).makespan_s and set(got[1]) == {"client0"}
    plain = make_predictor(s, object())({"client0": (1, 3), "client1": (2, 3)}, infos)
    assert plain is not None and plain[0] == evaluate(believed, {"client0": (1, 3), "client1": (2, 3)}).makespan_s


def test_a_device_the_cost_model_cannot_price_gives_no_prediction() -> None:
    s = RunSettings(rounds=1, clients=1, cuts="static:1,3", sim_clock=False)
    assert make_predictor(s, object())({"client0": (1, 3)}, [ClientInfo("client0", 1, 0, "nosuch", 10)]) is None


@pytest.mark.parametrize(("in_turn", "want"), [(False, 3.0), (True, 5.0)])
def test_the_measured_round_of_clients_in_turn_is_their_sum(in_turn: bool, want: float) -> None:
    """sl and sflv2 train the clients one after another: before, the row said the longest client's time."""
    rec = RoundRecord(1, {"a": (1, 3), "b": (1, 3)},
                      measurements=[Measurement("a", (1, 3), 10, 1.0, 1.0, 5, 5),
                                    Measurement("b", (1, 3), 10, 2.0, 1.0, 5, 5)])
    row = metrics_row(rec, 0.5, 1.0, 9.0, {}, in_turn=in_turn)
    assert row["measured_round_s"] == want and row["predicted_round_s"] is None
    assert "(predicted" not in progress_line(row, 1, {})
