"""Behaviour of the adaptive policy that a mutation run found unpinned (``splitfed/flower/adaptive.py``, from the
resume branch of ``AdaptivePolicy.assign`` on): a finished run resumed for more rounds decides again, the state
of a policy that has not planned yet, what a deployed client's round teaches about its link (the wire is what is
left of ``link_s`` once the latency and the servers' part come off, shared by the believed wire times), what a
device that computed nothing (or next to nothing) teaches, and a checkpoint's beliefs with their guards."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, client_cost
from splitfed.flower.adaptive import AdaptivePolicy, _measured, _with_belief
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import Measurement
from splitfed.optimizer import Measurement as Seen
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from splitfed.profile.speed import SpeedMeasure, measured_flops
from tests.test_speed_probe import INFO, SLOW

# four blocks; the edge is slow enough that its compute, and the edge-cloud link, are a real part of link_s
PROF = ModelProfile.synthetic([1e6, 1e8, 5e8, 2e8], [4e4, 2e4, 3e4, 10], [1e3, 1.5e6, 2e6, 1e5], input_bytes=3e4)
DEV = Client("d", "d", TierProfile(1e9, 1e9), LinkProfile(1e6, 4e5, 0.03), samples=100)


def _sc(epochs: int = 1, dev: Client = DEV, profile: ModelProfile = PROF) -> Scenario:
    return Scenario(profile, (dev,), (TierProfile(2e9, 1e10), TierProfile(1e10, 1e11)),
                    (LinkProfile(5e6, 5e6, 0.01),), batch=10, epochs=epochs)


def _round_in(world: Scenario, cuts: tuple[int, ...], **kw: object) -> Measurement:
    """What the device of ``world`` times of a round there: its compute, and all its waiting on the chain (the
    round less its compute and its weights' exchange), with the model's bytes on its link."""
    c = client_cost(world, world.clients[0], cuts)
    link_s = c.round_s - c.compute_s[0] - c.exchange_s
    m = Measurement("d", cuts, world.clients[0].samples * world.epochs, c.compute_s[0], link_s,
                    int(c.up_bytes[0]), int(c.down_bytes[0]))
    return replace(m, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- what a deployed round teaches of the link


def test_a_link_half_as_fast_both_ways_is_learned_exactly_with_its_measured_round_trip() -> None:
    """Believed: 1 MB/s up, 400 kB/s down, 30 ms. The world: 500 kB/s up, 200 kB/s down, 50 ms (measured). The
    wire of link 0 is then twice the believed wire times each way; the latency (at the measured round trip)
    and the servers' part (the edge's compute, the cloud's, the edge-cloud link's) are not wire."""
    sc = _sc()
    cuts = (1, 3)
    world = sc.with_clients([replace(DEV, link=LinkProfile(5e5, 2e5, 0.05))])
    m = _round_in(world, cuts, rtt_s=0.05)
    believed = client_cost(sc, DEV, cuts)
    assert believed.compute_s[1] > 10 and believed.up_s[1] > 0.1  # the servers' part is no rounding error
    got = _measured(sc, m)
    assert got.up_bytes == m.bytes_up and got.down_bytes == m.bytes_down and got.rtt_s == 0.05
    assert got.up_s == pytest.approx(believed.up_bytes[0] / 5e5, rel=1e-9)  # 8.0016 s
    assert got.down_s == pytest.approx(believed.down_bytes[0] / 2e5, rel=1e-9)  # 20 s: down is the longer
    assert (got.compute_flops, got.compute_s) == (believed.flops[0], m.compute_s)


@settings(max_examples=40, deadline=None)
@given(cut=st.tuples(st.integers(0, 4), st.integers(0, 4)).map(lambda t: (min(t), max(t))),
       slower=st.floats(0.25, 4.0), rtt=st.sampled_from([None, 0.0, 0.01, 0.2]), epochs=st.integers(1, 2),
       samples=st.integers(1, 300))
@example(cut=(1, 3), slower=1.0, rtt=None, epochs=1, samples=1)
@example(cut=(1, 3), slower=2.0, rtt=0.05, epochs=2, samples=100)
def test_a_link_slower_by_one_factor_both_ways_is_learned_exactly(cut: tuple[int, int], slower: float,
                                                                   rtt: float | None, epochs: int,
                                                                   samples: int) -> None:
    """A world whose link is ``slower`` times the belief both ways (1: exactly as believed), at the measured
    round trip where one was measured (else the believed one), teaches exactly that link: up and down rates
    recovered, however many samples (one included) the client trained over however many epochs."""
    me = replace(DEV, samples=samples)
    sc = _sc(epochs, me)
    true = LinkProfile(DEV.link.up / slower, DEV.link.down / slower, DEV.link.rtt if rtt is None else rtt)
    world = sc.with_clients([replace(me, link=true)])
    c = client_cost(world, world.clients[0], cut)
    if c.up_bytes[0] + c.down_bytes[0] == 0:
        return
    m = _round_in(world, cut, rtt_s=rtt)
    got = _measured(sc, m)
    assert got.rtt_s == rtt
    for sent, wire_s, rate, on_wire in ((got.up_bytes, got.up_s, true.up, c.up_bytes[0]),
                                        (got.down_bytes, got.down_s, true.down, c.down_bytes[0])):
        if on_wire:
            assert wire_s == pytest.approx(on_wire / rate, rel=1e-7, abs=1e-12)
            assert sent == int(on_wire)
        else:  # nothing went this way: no time on its wire either
            assert wire_s == 0


def test_a_round_whose_waiting_was_all_latency_and_servers_teaches_nothing_of_the_link() -> None:
    """The servers ran slower than believed: nothing is left for the wire, so the link stays as believed (not
    a negative wire time), while the device's compute and the round trip it measured are still learned."""
    sc = _sc()
    cuts = (1, 3)
    m = _round_in(sc, cuts, rtt_s=0.03)
    c = client_cost(sc, DEV, cuts)
    wire = c.up_bytes[0] / DEV.link.up + c.down_bytes[0] / DEV.link.down
    short = replace(m, link_s=m.link_s - 1.5 * wire)  # less waiting than the latency and servers take
    got = _measured(sc, short)
    assert got == Seen(c.flops[0], m.compute_s, rtt_s=0.03)


def test_a_link_that_carried_no_bytes_teaches_nothing_of_its_rates() -> None:
    """A U-shaped client of a model whose boundaries carry no bytes: its link carried nothing (all its
    waiting is latency and servers), so no rate can be read off it; before the guard, 0/0."""
    prof = ModelProfile.synthetic([1e6, 1e8, 5e8, 2e8], [0, 0, 0, 0], [1e3, 1.5e6, 2e6, 1e5], input_bytes=0)
    sc = replace(_sc(profile=prof), u_shape=True)
    cuts = (1, 3, 3)
    c = client_cost(sc, DEV, cuts)
    assert c.up_bytes[0] == c.down_bytes[0] == 0
    m = _round_in(sc, cuts)
    got = _measured(sc, replace(m, link_s=m.link_s + 5.0))  # 5 s more than believed, and no bytes to blame
    assert got == Seen(c.flops[0], m.compute_s)


# ---------------------------------------------------------------- a device that computed nothing, or next to it


def test_a_device_that_trained_nothing_teaches_the_speed_it_timed_and_its_round_trip() -> None:
    sc = _sc()
    speed = SpeedMeasure(1, 1, 1e-3)  # block 0 (3 MFLOP with its backward) on one sample in 1 ms: 3 GFLOP/s
    rate = measured_flops(PROF, speed)
    assert rate == pytest.approx(3e9)
    got = _measured(sc, Measurement("d", (0, 2), 0, 0.0, 0.0, 0, 0, rtt_s=0.02, speed=speed))
    assert got.compute_flops == pytest.approx(3e6) and got.compute_s == 1e-3 and got.rtt_s == 0.02
    assert (got.up_bytes, got.up_s, got.down_bytes, got.down_s) == (0, 0, 0, 0)
    # without a timing: nothing of its speed either (seconds without work), but the round trip still
    assert _measured(sc, Measurement("d", (0, 2), 0, 4.0, 9.0, 0, 0, rtt_s=0.02)) == Seen(0.0, 4.0, rtt_s=0.02)


def test_a_device_that_computed_under_one_flop_teaches_that_work_not_the_speed_it_timed() -> None:
    """Work is work however little: a device whose blocks took 0.0003 FLOP this round is learned from them,
    not from the training it timed (which only a device that computed nothing is asked for)."""
    prof = ModelProfile.synthetic([1e-4, 1e-4], [1e3, 10], [1e3, 1.5e6], input_bytes=1e3)
    dev = Client("d", "d", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=1)
    sc = Scenario(prof, (dev,), (TierProfile(5e9, 1e10),), (), batch=1)
    c = client_cost(sc, dev, (1,))
    assert 0 < c.flops[0] <= 1
    speed = SpeedMeasure(1, 1, 1e-4)
    assert measured_flops(prof, speed) == pytest.approx(3.0)  # a usable timing, 3 FLOP/s
    m = replace(_round_in(sc, (1,)), compute_s=2e-4, speed=speed)
    got = _measured(sc, m)
    assert (got.compute_flops, got.compute_s) == (c.flops[0], 2e-4)


# ---------------------------------------------------------------- a checkpoint's beliefs


@pytest.mark.parametrize(("saved", "want"), [
    ([3e9, 2e6, 8e5, 0.04], (3e9, 2e6, 8e5, 0.04)),  # a plain belief, a round trip under a second included
    ([1.0, 0.5, 1.0, 0.0], (1.0, 0.5, 1.0, 0.0)),  # slow rates are rates; a round trip of 0 s (same host) too
    ([math.inf, math.inf, math.inf, math.inf], (2e9, 1e6, 4e5, 0.03)),  # no usable number: the profile's
    ([math.nan, 0.0, -1.0, -0.5], (2e9, 1e6, 4e5, 0.03)),
    ([3e9, 2e6, 8e5], (3e9, 2e6, 8e5, 0.03)),  # from before round trips were learned: the profile's
])
def test_a_checkpoint_s_beliefs_are_taken_where_they_are_usable_numbers(saved: list[float],
                                                                       want: tuple[float, ...]) -> None:
    client = replace(DEV, device=TierProfile(2e9, 7e8))
    got = _with_belief(client, saved)
    assert (got.device.flops, got.link.up, got.link.down, got.link.rtt) == want
    assert got.device.memory == 7e8 and (got.name, got.samples) == (client.name, client.samples)


# ---------------------------------------------------------------- the policy's state and a resumed run
# SLOW: a slow device on a fast link (its raw inputs go to the edge), as tests/test_speed_probe.py plans it


def _settings(tmp_path: Path, rounds: int) -> RunSettings:
    fleet = tmp_path / "slow.toml"
    fleet.write_text(SLOW)
    return RunSettings(rounds=rounds, clients=1, fleet=str(fleet), cuts="adaptive", sim_clock=False)


def test_a_policy_that_has_not_planned_yet_checkpoints_what_it_loaded(tmp_path: Path) -> None:
    policy = AdaptivePolicy(_settings(tmp_path, 6))
    assert policy.state_dict() == {}
    state = {"assignment": {"client0": [0, 7]}, "beliefs": {"client0": [1e6, 1e8, 1e8, 0.001]}, "rounds": 6}
    policy.load_state_dict(state)
    assert policy.state_dict() == state  # resumed, and checkpointed again before its first round: kept


def test_a_finished_run_resumed_for_more_rounds_decides_again_for_the_rounds_left(tmp_path: Path) -> None:
    """A run of 3 rounds learned its device is fast, but its last decision kept the cuts (no round left to
    repay a move). Resumed for 6 rounds, it decides again after round 3 for the 3 rounds now left and moves;
    a run stopped midway (its checkpoint's horizon is the run's) is not decided again on resuming."""
    fast = {"assignment": {"client0": [0, 7]}, "beliefs": {"client0": [1e13, 1.125e8, 1.125e8, 0.001]}}
    finished = AdaptivePolicy(_settings(tmp_path, 6))
    finished.load_state_dict({**fast, "rounds": 3})
    assert finished.assign(4, INFO) == {"client0": (7, 7)}
    [d] = finished.adapter.history
    assert d.round == 3 and d.moved == ("client0",) and "over 3 round(s)" in d.reason, d
    midway = AdaptivePolicy(_settings(tmp_path, 6))
    midway.load_state_dict({**fast, "rounds": 6})
    assert midway.assign(4, INFO) == {"client0": (0, 7)}
    assert midway.adapter.history == []
