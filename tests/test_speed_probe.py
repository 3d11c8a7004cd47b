"""A device the plan gives no block (cut 0) computes nothing, so its rounds taught the adaptive policy nothing of
its speed: a Raspberry Pi put at cut 0 on a guess stayed there however fast it turned out. Now such a node times
its training before each round when asked (deployment), and the simulated clock times it in the cost model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from splitfed.flower.adaptive import AdaptivePolicy
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo, Measurement
from splitfed.flower.records import TrainReport
from splitfed.profile.speed import SpeedMeasure, first_work, measured_flops

# a device so slow, on so fast a link, that the plan sends its raw inputs to the edge
SLOW = """
name = "slow"
samples = 150
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "dev"
flops = 1e6
memory_mb = 1024
up_mbps = 900
down_mbps = 900
rtt_ms = 1
"""
INFO = [ClientInfo("client0", 1, 0, "dev-0", 150)]


def _policy(tmp_path, text: str = SLOW, **kw) -> AdaptivePolicy:  # type: ignore[no-untyped-def]
    fleet = tmp_path / "slow.toml"
    fleet.write_text(text)
    settings = RunSettings(rounds=6, clients=1, fleet=str(fleet), cuts="adaptive", **kw)
    policy = AdaptivePolicy(settings)
    assert policy.assign(1, INFO)["client0"][0] == 0  # the plan: its raw inputs go to the edge
    return policy


def _round_at_cut_0(policy: AdaptivePolicy, speed: SpeedMeasure | None) -> Measurement:
    cuts = policy.adapter.assignment["client0"]
    return Measurement("client0", tuple(cuts), 150, 0.0, 0.0, 0, 0, None, speed)


def test_a_device_at_cut_0_learns_its_speed_from_what_it_timed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    policy = _policy(tmp_path, sim_clock=False)
    profile = policy.adapter.belief.profile
    believed = policy.adapter.belief.clients[0].device.flops
    policy.observe(1, [_round_at_cut_0(policy, None)])  # nothing computed, nothing timed: nothing learned
    assert policy.adapter.belief.clients[0].device.flops == believed
    timed = SpeedMeasure(1, 32, 1e-3)
    rate = measured_flops(profile, timed)
    assert rate is not None and rate > 3 * believed  # a change of regime: believed at once
    policy.observe(2, [_round_at_cut_0(policy, timed)])
    assert policy.adapter.belief.clients[0].device.flops == pytest.approx(rate)


def test_a_timing_of_another_model_or_no_device_teaches_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    policy = _policy(tmp_path, sim_clock=False)
    believed = policy.adapter.belief.clients[0].device.flops
    for nonsense in (SpeedMeasure(99, 32, 1.0), SpeedMeasure(1, 10_000, 1.0), SpeedMeasure(1, 1, 1e-30)):
        policy.observe(1, [_round_at_cut_0(policy, nonsense)])
        assert policy.adapter.belief.clients[0].device.flops == believed


def test_the_simulated_clock_times_a_device_at_cut_0_in_the_fleet_as_it_is(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Drift makes the device 1000x faster from round 2: the clock's world has it, and the policy learns it
    although the device computed nothing (before: its belief stayed the fleet file's 1 MFLOP/s)."""
    policy = _policy(tmp_path, SLOW + "[[device.drift]]\nround = 2\nflops_scale = 1000\n", sim_clock=True)
    policy.observe(1, [_round_at_cut_0(policy, None)])
    assert policy.adapter.belief.clients[0].device.flops == pytest.approx(1e6)
    policy.observe(2, [_round_at_cut_0(policy, None)])
    assert policy.adapter.belief.clients[0].device.flops == pytest.approx(1e9)


def test_the_work_timed_in_the_clock_is_the_first_blocks_that_compute() -> None:
    from splitfed.profile import ModelProfile

    prof = ModelProfile.synthetic([0.0, 3e6, 5e6], [10.0, 10.0, 10.0], [0.0, 1e3, 1e3], input_bytes=10)
    assert first_work(prof, 4) == pytest.approx(4 * (prof.fwd_flops[1] + prof.bwd_flops[1]))
    assert first_work(ModelProfile.synthetic([0.0], [1.0], [0.0], input_bytes=1), 4) == 0.0


def test_only_an_adaptive_run_in_real_time_asks_a_device_that_computes_nothing() -> None:
    from server.strategy import probes_speed

    live = RunSettings(model="cnn", cuts="adaptive", sim_clock=False)  # cnn's block 0 is a convolution
    assert probes_speed(live, (0, 3)) and probes_speed(replace(live, cuts="adaptive:0.1"), (0, 0))
    assert not probes_speed(live, (1, 3))  # it trains block 0: its round times it
    assert not probes_speed(replace(live, sim_clock=True), (0, 3))  # the clock times it
    assert not probes_speed(replace(live, cuts="greedy"), (0, 3))  # greedy never re-plans
    assert not probes_speed(replace(live, cuts="static:0,3"), (0, 3))
    u = replace(live, u_shape=True)
    assert not probes_speed(u, (0, 3, 6)) and probes_speed(u, (0, 3, 7))  # a tail is trained on it
    # mlp's block 0 is a flatten: a device that holds it alone (min-device-blocks 1, say) computes nothing
    # either (the clock times such a device too: before, deployment did not)
    mlp = replace(live, model="mlp")
    assert probes_speed(mlp, (1, 3)) and not probes_speed(mlp, (2, 3))


@pytest.mark.parametrize("bad", [{"speed-s": math.nan}, {"speed-s": -1.0}, {"speed-s": math.inf},
                                 {"speed-blocks": 0}, {"speed-samples": 0}, {"speed-blocks": math.nan},
                                 {"speed-samples": math.inf}, {"speed-blocks": 2.5}, {"speed-samples": "x"}])
def test_a_speed_in_a_report_travels_and_nonsense_is_none(bad: dict) -> None:
    report = TrainReport(10, 1, 0.5, 3, 0.1, 0.2, 100, 100, 4.0, 2, 32, 0.05)
    back = TrainReport.from_record(report.to_record())
    assert back == report and back.speed == SpeedMeasure(2, 32, 0.05)
    old = {k: v for k, v in report.to_record().items() if not k.startswith("speed-")}  # a node from before
    assert TrainReport.from_record(old).speed is None
    odd = TrainReport.from_record({**report.to_record(), **bad})  # the round itself is kept: its speed is none
    assert odd.speed is None and odd.samples == 10 and odd.compute_s == 0.1


@pytest.mark.parametrize("rtt", [[1.0, 2.0], "x", math.nan, -3.0])
def test_a_round_trip_that_is_no_number_is_not_measured_and_the_round_stands(rtt: object) -> None:
    report = TrainReport(10, 1, 0.5, 3, 0.1, 0.2, 100, 100, 4.0)
    odd = TrainReport.from_record({**report.to_record(), "rtt-ms": rtt})  # before: a list dropped the client
    assert odd.rtt_ms == -1.0 and odd.samples == 10


def test_a_deployed_node_at_cut_0_times_its_training_and_the_policy_gets_it(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The real ClientApp, in process, through real edge and cloud tiers: client0 is put at cut 0 and reports
    a timing; client1 trains blocks and reports none."""
    import clients.app
    import server.app
    from splitfed.transport.server import serve_tier
    from tests.flower_fixtures import FakeGrid

    seen: list[list[Measurement]] = []
    real_assign, real_observe = AdaptivePolicy.assign, AdaptivePolicy.observe

    def assign(self, round, infos):  # type: ignore[no-untyped-def]
        cuts = real_assign(self, round, infos)
        self.adapter.assignment.update({"client0": (0, 0), "client1": (2, 4)})
        return {**cuts, "client0": (0, 0), "client1": (2, 4)}

    def observe(self, round, measurements):  # type: ignore[no-untyped-def]
        seen.append(list(measurements))
        return real_observe(self, round, measurements)

    monkeypatch.setattr(AdaptivePolicy, "assign", assign)
    monkeypatch.setattr(AdaptivePolicy, "observe", observe)
    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        s = RunSettings(model="cnn", rounds=1, clients=2, tiers=3, cuts="adaptive", sim_clock=False,
                        tier_addresses=f"{edge.address},{cloud.address}", out=str(tmp_path), node_wait_s=30,
                        round_timeout_s=60)
        server.app.run(FakeGrid(clients.app.app, 2), s, progress=lambda line: None)
    (round1,) = seen
    by = {m.client_id: m for m in round1}
    assert by["client0"].cuts == (0, 0) and by["client0"].speed is not None
    assert by["client0"].speed.blocks >= 1 and by["client0"].speed.samples >= 1
    assert by["client1"].compute_s > 0 and by["client1"].speed is None
