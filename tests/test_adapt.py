"""Online adaptation, driven by the simulated clock (the cost model under the fleet's true, drifting numbers)."""

from __future__ import annotations

import pytest

from splitfed.cost import Scenario, evaluate, move_cost
from splitfed.errors import ConfigError
from splitfed.optimizer import Adapter, Measurement, solve
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile, parse_fleet

# A model whose activations shrink with depth: sending early activations costs uplink.
PROF = ModelProfile.synthetic(fwd_flops=[40e6, 80e6, 80e6, 2e6], out_bytes=[48e3, 16e3, 4e3, 40],
                              param_bytes=[8e3, 300e3, 1.2e6, 20e3], input_bytes=12e3)

FLEET = """
samples = 500
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "phone"
profile = "phone-flagship"
count = 3
[[device]]
name = "laptop"
profile = "laptop"
samples = 1500
[[device.drift]]
round = 5
up_scale = 0.1        # the laptop's uplink drops 10x from round 5 on
"""


def simulate(fleet_text: str, rounds: int, adapter_kw: dict | None = None, mode: str = "sflv1"):  # noqa: ANN201
    """Run ``rounds`` rounds on the simulated clock; returns per-round makespans (adaptive, static) and the adapter."""
    fleet = parse_fleet(fleet_text, "drift.toml")
    belief = Scenario.from_fleet(PROF, fleet, tiers=3, batch=32, mode=mode)  # what the file says, drift unknown
    adapter = Adapter(belief, rounds, **(adapter_kw or {}))
    static = dict(adapter.assignment)
    adaptive_s, static_s, oracle_s, cuts = [], [], [], []
    moving: dict[str, float] = {}
    for r in range(1, rounds + 1):
        truth = Scenario.from_fleet(PROF, fleet.at_round(r), tiers=3, batch=32, mode=mode)
        cost = evaluate(truth, adapter.assignment, extra_s=moving)
        adaptive_s.append(cost.makespan_s)
        static_s.append(evaluate(truth, static).makespan_s)
        oracle_s.append(solve(truth).makespan_s)
        cuts.append(dict(adapter.assignment))
        measured = {cc.name: Measurement.from_cost(cc, truth.clients[truth.index(cc.name)]) for cc in cost.clients}
        before = dict(adapter.assignment)
        decision = adapter.observe(r, measured)
        moving = {n: move_cost(truth, truth.clients[truth.index(n)], before[n], adapter.assignment[n])
                  for n in decision.moved}
    return adaptive_s, static_s, oracle_s, cuts, adapter


def test_uplink_drop_moves_the_cut_and_the_makespan_recovers() -> None:
    adaptive, static, oracle, cuts, adapter = simulate(FLEET, rounds=12)
    start = cuts[0]["laptop"]
    # rounds 1-4: beliefs are right, nothing moves
    assert all(c == cuts[0] for c in cuts[:5])
    assert all(not d.moved for d in adapter.history[:4])
    # the uplink drops in round 5: the laptop's cut moves within 2 rounds
    assert cuts[6]["laptop"] != start
    moved_at = next(d.round for d in adapter.history if "laptop" in d.moved)
    assert moved_at in (5, 6)
    # ... and the makespan recovers to the optimum of the new world, while the static cuts stay slow
    assert static[4] > 2 * static[3]
    for r in range(7, 12):
        assert adaptive[r] == pytest.approx(oracle[r], rel=1e-6)
        assert adaptive[r] < 0.6 * static[r]
    assert all(s == pytest.approx(static[4]) for s in static[5:])
    # in total, adapting (including the round that moved weights) beats staying put
    assert sum(adaptive) < sum(static)


def test_no_churn_without_news() -> None:
    quiet = FLEET.replace("[[device.drift]]\nround = 5\nup_scale = 0.1", "")
    adaptive, static, _, cuts, adapter = simulate(quiet, rounds=6)
    assert all(c == cuts[0] for c in cuts)
    assert adaptive == static


def test_a_move_must_repay_its_weights_over_the_rounds_left() -> None:
    # block 1: 100 MFLOP/sample, 1.5 MB of weights. The edge (5 GFLOP/s) first beats the device (1 GFLOP/s);
    # then the device turns out 10x faster: keeping block 1 saves ~1.1 s a round (after its weight
    # exchange), but moving it down first (its weights over a 0.8 MB/s downlink) costs 1.9 s.
    prof = ModelProfile.synthetic([1e6, 1e8], [1e3, 10], [1e3, 1.5e6], input_bytes=1e3)
    dev = Client("d", "d", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=100)
    sc = Scenario(prof, (dev,), (TierProfile(5e9, 1e10),), (), batch=10)
    faster = {"d": Measurement(compute_flops=1e10, compute_s=1.0)}
    decisions = {}
    for rounds in (2, 11):
        adapter = Adapter(sc, rounds=rounds, hysteresis=0.0)
        assert adapter.assignment["d"] == (0,)  # all on the edge
        d = adapter.observe(1, faster)
        decisions[rounds] = d
        better = solve(adapter.belief)
        assert better.assignment["d"] == (2,) and better.makespan_s < d.before_s - 1.0
    assert not decisions[2].moved and "no move pays" in decisions[2].reason       # 1 round left
    assert decisions[11].moved == ("d",) and decisions[11].assignment["d"] == (2,)  # 10 rounds left
    assert decisions[11].move_s == pytest.approx((1.5e6 + 1e3) / 0.8e6)  # parameters only: no optimizer state


def test_smoothing_and_jumps() -> None:
    fleet = parse_fleet(FLEET, "f.toml")
    sc = Scenario.from_fleet(PROF, fleet, tiers=3, batch=32)
    adapter = Adapter(sc, rounds=10, alpha=0.5, jump=3.0)
    phone = sc.clients[0]
    # 20% slower compute: smoothed halfway
    adapter.update({phone.name: Measurement(compute_flops=8e9, compute_s=8e9 / (0.8 * phone.device.flops))})
    assert adapter.belief.clients[0].device.flops == pytest.approx(0.9 * phone.device.flops)
    # 10x slower uplink: a change of regime, believed at once; downlink untouched (no bytes)
    adapter.update({phone.name: Measurement(up_bytes=1e6, up_s=1e6 / (0.1 * phone.link.up))})
    assert adapter.belief.clients[0].link.up == pytest.approx(0.1 * phone.link.up)
    assert adapter.belief.clients[0].link.down == phone.link.down
    # server tiers learn too
    adapter.update({}, servers={"edge": (1e12, 1.0)})
    assert adapter.belief.servers[0].flops == pytest.approx(1e12)
    with pytest.raises(ConfigError, match="no server tier named 'fog'"):
        adapter.update({}, servers={"fog": (1.0, 1.0)})


def test_hysteresis_ignores_small_gains() -> None:
    fleet = parse_fleet(FLEET, "f.toml")
    sc = Scenario.from_fleet(PROF, fleet, tiers=3, batch=32)
    adapter = Adapter(sc, rounds=10, hysteresis=10.0)  # nothing can gain 1000%
    truth = Scenario.from_fleet(PROF, fleet.at_round(5), tiers=3, batch=32)
    cost = evaluate(truth, adapter.assignment)
    measured = {cc.name: Measurement.from_cost(cc, truth.clients[truth.index(cc.name)]) for cc in cost.clients}
    d = adapter.observe(5, measured)
    assert not d.moved and "hysteresis" in d.reason
    with pytest.raises(ConfigError):
        Adapter(sc, rounds=10, alpha=0)


def test_ties_go_to_the_cheapest_move() -> None:
    # S's device turns out 100x slower: it must take block 1 to the edge, whose memory holds ONE copy of
    # block 1, so A's copy must leave the edge. A on its device or on the cloud gives the same makespan
    # (S sets it), but shipping block 1 down A's 1 MB/s link costs 100x more than over the 100 MB/s
    # edge->cloud link: the adapter must pick the cloud, although a plain re-solve picks the device.
    prof = ModelProfile.synthetic([1e6, 1e8], [1e3, 10], [1e3, 1.5e5], input_bytes=1e3)
    s = Client("S", "S", TierProfile(1e10, 1e9), LinkProfile(1e6, 1e6, 0.0), samples=300)
    a = Client("A", "A", TierProfile(1e10, 1e9), LinkProfile(1e6, 1e6, 0.0), samples=10)
    sc = Scenario(prof, (s, a), (TierProfile(1e11, 6e5), TierProfile(3e9, 1e10)), (LinkProfile(1e8, 1e8, 0.0),),
                  batch=10)
    adapter = Adapter(sc, rounds=20, hysteresis=0.0, assignment={"S": (2, 2), "A": (0, 2)})
    d = adapter.observe(1, {"S": Measurement(compute_flops=1e10, compute_s=100.0)})
    plain = solve(adapter.belief)
    assert plain.assignment["A"] == (2, 2)  # what the adapter would pick without preferring cheap moves
    assert d.moved == ("A", "S") and d.assignment == {"S": (0, 2), "A": (0, 1)}
    assert d.after_s == pytest.approx(plain.makespan_s, rel=1e-9)
    cheapest = min(move_cost(adapter.belief, a, (0, 2), tuple(int(x) for x in o)) for o in sc.options
                   if evaluate(adapter.belief, {"S": (0, 2), "A": tuple(int(x) for x in o)}).feasible)
    assert move_cost(adapter.belief, a, (0, 2), d.assignment["A"]) == cheapest


def test_optimal_current_cuts_are_kept_among_ties() -> None:
    # a straggler sets the makespan whatever the phones do: their (non-greedy) current cuts are optimal
    fleet = parse_fleet(FLEET.replace("[[device.drift]]\nround = 5\nup_scale = 0.1", "") + """
[[device]]
name = "straggler"
profile = "rpi4"
up_mbps = 0.5
samples = 3000
""", "ties.toml")
    sc = Scenario.from_fleet(PROF, fleet, tiers=3, batch=32)
    plain = solve(sc)
    current = dict(plain.assignment)
    for c in sc.clients[:3]:  # the phones: another cut, slower for them but far from the slowest
        ok = [tuple(int(x) for x in o) for o in sc.options
              if evaluate(sc, {**current, c.name: tuple(int(x) for x in o)}).makespan_s == plain.makespan_s]
        current[c.name] = next(o for o in ok if o != plain.assignment[c.name])
    assert current != plain.assignment and evaluate(sc, current).makespan_s == plain.makespan_s
    adapter = Adapter(sc, rounds=10, hysteresis=0.0, assignment=current)
    for r in (1, 2):
        d = adapter.observe(r, {})
        assert not d.moved and d.reason == "already optimal" and adapter.assignment == current


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_adaptation_in_the_other_variants(mode: str) -> None:
    adaptive, static, oracle, cuts, adapter = simulate(FLEET, rounds=10, mode=mode)
    assert adapter.belief.mode == mode
    assert cuts[7]["laptop"] != cuts[0]["laptop"]  # the uplink drop moves the laptop's cut here too
    assert adaptive[8] == pytest.approx(oracle[8], rel=1e-6) and adaptive[8] < static[8]
    assert sum(adaptive) < sum(static)
    if mode == "sl":  # clients in turn: the round is the sum of their times
        truth = Scenario.from_fleet(PROF, parse_fleet(FLEET, "f.toml").at_round(9), tiers=3, batch=32, mode=mode)
        cost = evaluate(truth, cuts[8])
        assert cost.makespan_s == pytest.approx(sum(cost.times().values()))


_ONE = """
name = "one"
samples = 150
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "dev"
flops = 1e8
memory_mb = 1024
up_mbps = 8
down_mbps = 30
rtt_ms = 50
"""


def test_a_round_trip_that_grows_moves_the_cut(tmp_path) -> None:
    """The clock priced a device's new round trip, but the policy never learned it (a Measurement had no
    latency): it kept a cut 4.7x slower than the best, saying "already optimal"."""
    import json

    from splitfed.flower.config import RunSettings
    from splitfed.sim.inprocess import train_inprocess

    fleet = tmp_path / "rtt.toml"
    fleet.write_text(_ONE + "[[device.drift]]\nround = 2\nrtt_ms = 2000\n")
    out = tmp_path / "run"
    train_inprocess(RunSettings(rounds=4, clients=1, fleet=str(fleet), cuts="adaptive", out=str(out)))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["cuts"]["client0"] for r in rows] == [[0, 7], [0, 7], [7, 7], [7, 7]]  # keep every message home
    assert rows[1]["decision"]["moved"] == ["client0"]
    assert rows[3]["sim_round_s"] < rows[1]["sim_round_s"] / 4


def test_a_deployed_client_s_waiting_is_not_all_wire(tmp_path) -> None:
    """A deployed device measures link_s: the wire, every message's latency and the servers' compute. Before,
    all of it was taken as wire time, so a device exactly as believed was learned 4x slower on its uplink."""
    from dataclasses import replace

    from splitfed.cost import client_cost
    from splitfed.flower.adaptive import AdaptivePolicy
    from splitfed.flower.config import RunSettings
    from splitfed.flower.policy import ClientInfo
    from splitfed.flower.policy import Measurement as Measured

    fleet = tmp_path / "one.toml"
    fleet.write_text(_ONE.replace("flops = 1e8", "flops = 3e8"))
    policy = AdaptivePolicy(RunSettings(rounds=6, clients=1, fleet=str(fleet), cuts="adaptive", sim_clock=False))
    info = [ClientInfo("client0", 1, 0, "dev-0", 150)]
    cuts = policy.assign(1, info)["client0"]
    truth = policy.adapter.belief  # the fleet as written: here, the world as it is

    def round_on(world: Scenario) -> Measured:
        c = client_cost(world, "client0", cuts)
        link_s = c.round_s - c.compute_s[0] - c.exchange_s  # what the device times as waiting on the chain
        return Measured("client0", cuts, 150, c.compute_s[0], link_s, int(c.up_bytes[0]), int(c.down_bytes[0]))

    policy.observe(1, [round_on(truth)])
    believed = policy.adapter.belief.clients[0].link
    true = truth.clients[0].link
    assert (believed.up, believed.down) == pytest.approx((true.up, true.down), rel=1e-6)  # nothing to learn
    slower = truth.with_clients([replace(truth.clients[0], link=replace(true, up=true.up / 2, down=true.down / 2))])
    policy.observe(2, [round_on(slower)])
    believed = policy.adapter.belief.clients[0].link  # half the bandwidth, within the jump: smoothed halfway
    assert believed.up == pytest.approx(0.75 * true.up, rel=1e-6)
    assert believed.down == true.down  # cut 0: nothing comes back down this link, so nothing to learn


def test_a_measured_round_trip_is_smoothed_like_a_rate() -> None:
    sc = Scenario.from_fleet(PROF, parse_fleet(FLEET, "f.toml"), tiers=3, batch=32)
    adapter = Adapter(sc, rounds=10, alpha=0.5, jump=3.0)
    phone = sc.clients[0]
    rtt = phone.link.rtt
    adapter.update({phone.name: Measurement(rtt_s=1.5 * rtt)})
    assert adapter.belief.clients[0].link.rtt == pytest.approx(1.25 * rtt)  # within the jump: halfway
    adapter.update({phone.name: Measurement(rtt_s=40 * rtt)})
    assert adapter.belief.clients[0].link.rtt == pytest.approx(40 * rtt)  # a change of regime: at once
    adapter.update({phone.name: Measurement()})
    assert adapter.belief.clients[0].link.rtt == pytest.approx(40 * rtt)  # not measured: kept


def test_a_deployed_client_s_longer_round_trip_is_learned_as_latency_not_bandwidth(tmp_path) -> None:
    """Deployed, a device's round trip was never measured after the first round: a round trip 10x longer than
    believed was all taken as wire time, so the policy learned a link several times slower than it is (and
    kept believing the old round trip). Each node now times its round trip every round and reports it."""
    from dataclasses import replace

    from splitfed.cost import client_cost
    from splitfed.flower.adaptive import AdaptivePolicy
    from splitfed.flower.config import RunSettings
    from splitfed.flower.policy import ClientInfo
    from splitfed.flower.policy import Measurement as Measured

    fleet = tmp_path / "one.toml"
    fleet.write_text(_ONE.replace("flops = 1e8", "flops = 3e8"))
    policy = AdaptivePolicy(RunSettings(rounds=6, clients=1, fleet=str(fleet), cuts="adaptive", sim_clock=False))
    cuts = policy.assign(1, [ClientInfo("client0", 1, 0, "dev-0", 150)])["client0"]
    truth = policy.adapter.belief
    true = truth.clients[0].link
    world = truth.with_clients([replace(truth.clients[0], link=replace(true, rtt=10 * true.rtt))])
    c = client_cost(world, "client0", cuts)
    link_s = c.round_s - c.compute_s[0] - c.exchange_s
    measured = Measured("client0", cuts, 150, c.compute_s[0], link_s, int(c.up_bytes[0]), int(c.down_bytes[0]))
    unaware = AdaptivePolicy(policy.settings)
    unaware.assign(1, [ClientInfo("client0", 1, 0, "dev-0", 150)])
    unaware.observe(1, [measured])  # the round trip not measured: the latency is taken for a slower wire
    assert unaware.adapter.belief.clients[0].link.up < 0.9 * true.up
    policy.observe(1, [replace(measured, rtt_s=10 * true.rtt)])
    believed = policy.adapter.belief.clients[0].link
    assert believed.rtt == pytest.approx(10 * true.rtt)  # a change of regime: learned at once
    assert (believed.up, believed.down) == pytest.approx((true.up, true.down), rel=1e-6)  # the wire is as it was


def test_a_node_reports_its_round_trip_and_the_metrics_keep_it(monkeypatch, tmp_path) -> None:
    import json

    import clients.app
    import server.app
    from splitfed.flower.config import RunSettings
    from splitfed.flower.records import TrainReport
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    s = RunSettings(rounds=1, clients=2, cuts="static:1,3", node_wait_s=5.0, round_timeout_s=30.0,
                    out=str(tmp_path))
    with inprocess_tiers(monkeypatch, 2):
        server.app.run(FakeGrid(clients.app.app, 2), s, progress=lambda line: None)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert all(p["rtt_ms"] is not None and p["rtt_ms"] >= 0 for p in row["per_client"].values()), row
    # a node from before round trips were reported is read as "not measured", not refused
    old = {k: v for k, v in TrainReport(10, 1, 0.5, 3, 0.1, 0.2, 100, 100, 4.0).to_record().items() if k != "rtt-ms"}
    assert TrainReport.from_record(old).rtt_ms == -1.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_measurement_that_is_not_a_number_teaches_nothing(bad: float) -> None:
    """A NaN time got past the ``seconds <= 0`` guard and stayed in the belief for good (every later plan
    priced NaN); it now leaves the belief as it was, as a measurement of no work does."""
    from splitfed.optimizer.adapt import _smooth, _toward

    assert _smooth(3.0, 10.0, bad, 0.3, 4.0) == 3.0
    assert _smooth(3.0, bad, 2.0, 0.3, 4.0) == 3.0
    assert _toward(0.05, bad, 0.3, 4.0) == 0.05


@pytest.mark.parametrize("key, value", [("compute-s", float("nan")), ("link-s", float("inf")),
                                        ("bytes-up", -5), ("num-examples", -1)])
def test_a_node_s_report_with_an_impossible_number_is_refused(key: str, value: float) -> None:
    """A node's report feeds the adaptive policy's beliefs: one NaN would have stayed there. Its reply is now
    malformed (the client is dropped from the round, with the reason)."""
    from splitfed.errors import ConfigError
    from splitfed.flower.records import TrainReport

    good = dict(TrainReport(10, 1, 0.5, 3, 0.1, 0.2, 100, 100, 4.0).to_record().items())
    assert TrainReport.from_record(good).compute_s == 0.1
    with pytest.raises(ConfigError, match=f"{key.replace('num-examples', 'samples')} must be a finite number >= 0"):
        TrainReport.from_record({**good, key: value})


def test_a_nan_belief_a_checkpoint_may_hold_is_replaced_by_the_next_measurement() -> None:
    """Before NaN measurements were ignored, one could reach a belief and the checkpoint: it stayed NaN."""
    from splitfed.optimizer.adapt import _smooth, _toward

    assert _toward(float("nan"), 0.05, 0.5, 3.0) == 0.05
    assert _smooth(float("nan"), 1e9, 1.0, 0.5, 3.0) == 1e9
    assert _toward(float("inf"), 0.05, 0.5, 3.0) == 0.05


def test_a_failed_health_check_is_no_round_trip() -> None:
    """round_trip_ms timed the refusal of a health check that failed (0.06 ms to a closed port), and a node
    reported it as its round trip, which the adaptive policy believed at once. Now it raises, and the node
    reports -1 (not measured)."""
    import socket

    from splitfed.errors import TierError
    from splitfed.flower.transport import connect
    from splitfed.transport.probe import round_trip_ms

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = connect(f"127.0.0.1:{port}", deadline_s=5)
    try:
        with pytest.raises(TierError, match="health check failed, so no round trip was timed"):
            round_trip_ms(c, 3, 1.0)
    finally:
        c.close()


def test_an_adapter_keeps_a_bounded_history() -> None:
    """Each decision holds every client's cuts: a run of thousands of rounds of a large fleet grew without end."""
    from splitfed.optimizer.adapt import HISTORY

    sc = Scenario.from_fleet(PROF, parse_fleet(FLEET, "f.toml"), tiers=3, batch=32)
    adapter = Adapter(sc, rounds=10 * HISTORY)
    for r in range(1, HISTORY + 21):
        adapter.observe(r, {})
    assert len(adapter.history) == HISTORY
    assert [d.round for d in adapter.history] == list(range(21, HISTORY + 21))  # the latest


@pytest.mark.parametrize("policy", ["adaptive", "greedy"])
def test_a_resumed_run_plans_a_node_its_checkpoint_did_not_know(policy: str) -> None:
    """A deployment registers whichever nodes answer: on resume one may hold a partition the checkpoint never
    saw. That client's cuts and beliefs were looked up in the checkpoint: a KeyError from the ServerApp."""
    from splitfed.cost import evaluate
    from splitfed.flower.adaptive import AdaptivePolicy, GreedyPolicy, scenario
    from splitfed.flower.config import RunSettings
    from splitfed.flower.policy import ClientInfo
    from splitfed.flower.policy import Measurement as Reported
    from splitfed.sim.clock import fleet_for

    settings = RunSettings(cuts=policy, fleet="small", clients=4, rounds=5)
    kinds = [c.name for c in fleet_for(settings).clients]
    first = [ClientInfo(f"client{i}", i + 1, i, kinds[i % len(kinds)], 100) for i in range(4)]
    make = AdaptivePolicy if policy == "adaptive" else GreedyPolicy
    before = make(settings)
    cuts = before.assign(1, first)
    # the measured numbers (samples, seconds, bytes): client0 trains 10x slower than its profile says
    before.observe(1, [Reported(c.client_id, cuts[c.client_id], 100, 9.0 if c.client_id == "client0" else 0.1,
                                0.2, 1000, 1000) for c in first])
    saved = before.state_dict()
    after = make(settings)
    after.load_state_dict(saved)
    now = [*first[:3], ClientInfo("client4", 9, 4, kinds[3 % len(kinds)], 100)]  # client3's node is gone
    got = after.assign(2, now)
    assert set(got) == {c.client_id for c in now}
    kept = {k: tuple(v) for k, v in saved["assignment"].items()}
    if policy == "greedy":  # each device's own pick: the known keep theirs, the new one gets its own
        assert all(got[c.client_id] == kept[c.client_id] for c in now[:3])
        fresh = GreedyPolicy(settings).assign(1, now)
        assert got["client4"] == fresh["client4"]
        return
    belief = after.adapter.belief
    for c in now[:3]:  # what the run had learned of the clients it knew is kept
        learned = saved["beliefs"][c.client_id]
        seen = belief.clients[belief.index(c.client_id)]
        assert [seen.device.flops, seen.link.up, seen.link.down, seen.link.rtt] == learned
    new = belief.clients[belief.index("client4")]
    assert new.device == scenario(settings, now).clients[3].device  # a node new to it: its profile's numbers
    plan = evaluate(belief, got)
    assert plan.feasible
    assert plan.makespan_s == solve(belief).makespan_s  # planned with the rest, optimally
