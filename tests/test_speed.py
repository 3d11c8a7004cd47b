"""A device's training speed measured at registration (splitfed.profile.speed), and the plan that uses it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.engine import template
from splitfed.errors import ConfigError
from splitfed.flower.records import NodeInfo
from splitfed.models.zoo import resolve_spec
from splitfed.profile.profiler import ModelProfile, profile_model
from splitfed.profile.speed import SpeedMeasure, measure_speed, measured_flops

SPEC = resolve_spec("cnn")


def _ticks(step: float):  # type: ignore[no-untyped-def]
    """A clock that advances ``step`` seconds each time it is read."""
    counter = itertools.count()
    return lambda: next(counter) * step


def test_blocks_are_added_until_a_pass_takes_the_budget() -> None:
    x = SPEC.example_input(8)
    n = template.num_blocks(SPEC)
    assert measure_speed(SPEC, x, budget_s=0.0, clock=_ticks(0.01)).blocks == 1  # the first block is enough
    every = measure_speed(SPEC, x, budget_s=math.inf, clock=_ticks(0.01))
    assert (every.blocks, every.samples, every.seconds) == (n, 8, pytest.approx(0.01))
    # each pass reads the clock twice: 0.01 s a pass, so a 0.025 s budget is never met and a 0.005 s one at once
    assert measure_speed(SPEC, x, budget_s=0.005, clock=_ticks(0.01)).blocks == 1


def test_the_measurement_trains_copies_and_gives_torchs_generator_back() -> None:
    """The node's own model and the run's random draws are untouched by the timing."""
    spec = resolve_spec("vgg11")  # dropout: the timing draws masks from torch's generator
    before = {k: v.clone() for i, m in enumerate(template.template(spec).modules) for k, v in
              ((f"{i}.{name}", t) for name, t in m.state_dict().items())}
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    m = measure_speed(spec, spec.example_input(2), budget_s=math.inf)
    assert torch.equal(torch.rand(3), expected)
    assert m.blocks == template.num_blocks(spec)
    after = {k: v for i, mod in enumerate(template.template(spec).modules) for k, v in
             ((f"{i}.{name}", t) for name, t in mod.state_dict().items())}
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for mod in template.template(spec).modules for p in mod.parameters())


def test_flops_are_the_cost_models_own_work_over_the_seconds() -> None:
    prof = profile_model(SPEC, batch=8)
    m = SpeedMeasure(2, 8, 0.5)
    want = (sum(prof.fwd_flops[:2]) + sum(prof.bwd_flops[:2])) * 8 / 0.5
    assert measured_flops(prof, m) == pytest.approx(want) and want > 0
    assert measured_flops(prof, SpeedMeasure(prof.n_blocks + 1, 8, 0.5)) is None  # another model's blocks
    idle = ModelProfile.synthetic([0.0, 1e6], [4.0, 4.0], [0.0, 16.0], input_bytes=4.0)
    assert measured_flops(idle, SpeedMeasure(1, 8, 0.5)) is None  # no work there: no speed


@pytest.mark.parametrize(("blocks", "samples", "seconds"),
                         [(0, 8, 1.0), (1, 0, 1.0), (1, 8, 0.0), (1, 8, -1.0), (1, 8, math.nan), (1, 8, math.inf)])
def test_a_nonsense_measurement_is_refused_and_a_node_sending_one_has_none(blocks, samples, seconds) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="a speed measurement needs"):
        SpeedMeasure(blocks, samples, seconds)
    info = NodeInfo.from_record(NodeInfo(0, 2, 10, speed_blocks=blocks, speed_samples=samples,
                                         speed_s=seconds).to_record())
    assert info.speed is None


@settings(max_examples=30, deadline=None)
@given(blocks=st.integers(1, 50), samples=st.integers(1, 4096), seconds=st.floats(1e-6, 1e4))
def test_a_measurement_travels_in_the_node_record_unchanged(blocks: int, samples: int, seconds: float) -> None:
    info = NodeInfo.from_record(NodeInfo(3, 4, 10, speed_blocks=blocks, speed_samples=samples,
                                         speed_s=seconds).to_record())
    assert info.speed == SpeedMeasure(blocks, samples, seconds)
    old = NodeInfo.from_record({"partition-id": 3, "num-partitions": 4})  # a node from before: not measured
    assert old.speed is None and old.speed_error == ""


def test_a_measured_speed_replaces_the_profiles_guess_in_the_plan() -> None:
    """Before, a device the optimizer gave no block kept its profile's FLOP/s for good: nothing it did in a
    round was compute. Now the plan starts from what it measured at registration."""
    from splitfed.flower.adaptive import scenario
    from splitfed.flower.config import RunSettings
    from splitfed.flower.policy import ClientInfo

    s = RunSettings(model="cnn", tiers=3)
    m = SpeedMeasure(2, 32, 0.004)
    guessed, measured = (scenario(s, [ClientInfo("client0", 1, 0, "rpi4", 100, None, speed)])
                         for speed in (None, m))
    prof = profile_model(s.spec, batch=s.batch_size, optimizer_slots=s.optim.slots)
    assert measured.clients[0].device.flops == pytest.approx(measured_flops(prof, m))
    assert measured.clients[0].device.flops != guessed.clients[0].device.flops
    assert measured.clients[0].device.memory == guessed.clients[0].device.memory
    assert measured.clients[0].link == guessed.clients[0].link  # only the speed changes


# ---------------------------------------------------------------- a node's reply is not trusted (review of 01eaa12)


def test_numbers_no_device_reaches_are_ignored_and_the_profiles_guess_stands() -> None:
    """A node replying speed-s 1e308 made the optimizer see a device of 1e-300 FLOP/s and refuse the whole run
    ("no assignment fits"); 5e-324 made one of inf FLOP/s that took every block. Now a rate outside what a fleet
    file accepts for a device is no measurement, nor one of more samples than the batch it was asked for."""
    from splitfed.flower.adaptive import scenario
    from splitfed.flower.config import RunSettings
    from splitfed.flower.policy import ClientInfo
    from splitfed.profile.fleet import RANGES

    s = RunSettings(model="cnn", tiers=3)
    prof = profile_model(s.spec, batch=s.batch_size, optimizer_slots=s.optim.slots)
    lo, hi, _ = RANGES["flops"]
    guessed = scenario(s, [ClientInfo("client0", 1, 0, "rpi4", 100)]).clients[0].device.flops
    for m in (SpeedMeasure(1, 32, 1e308), SpeedMeasure(1, 32, 5e-324), SpeedMeasure(1, 2**62, 0.5),
              SpeedMeasure(1, s.batch_size + 1, 0.5)):
        assert measured_flops(prof, m) is None, m
        assert scenario(s, [ClientInfo("client0", 1, 0, "rpi4", 100, None, m)]).clients[0].device.flops == guessed
    ok = SpeedMeasure(1, 32, 0.01)
    assert lo <= measured_flops(prof, ok) <= hi  # type: ignore[operator]


def test_a_node_record_with_an_infinite_count_is_malformed_not_a_crash() -> None:
    """int(inf) raised OverflowError, which the registration does not catch: the ServerApp died."""
    for key in ("speed-blocks", "speed-samples", "samples"):
        with pytest.raises(ConfigError, match="node info: (malformed|samples must be a whole number, got inf)"):
            NodeInfo.from_record({"partition-id": 0, "num-partitions": 2, key: math.inf})


def test_a_node_that_says_its_measurement_failed_is_taken_at_its_word() -> None:
    info = NodeInfo(0, 2, 10, speed_blocks=1, speed_samples=8, speed_s=0.1, speed_error="boom")
    assert info.speed is None


def test_a_link_no_network_has_is_no_measurement() -> None:
    assert NodeInfo(0, 2, up_mbps=1e308, down_mbps=8.0, rtt_ms=10.0).link is None
    assert NodeInfo(0, 2, up_mbps=2.0, down_mbps=8.0, rtt_ms=1e300).link is None
    assert NodeInfo(0, 2, up_mbps=2.0, down_mbps=8.0, rtt_ms=10.0).link is not None


def test_a_model_that_cannot_train_on_the_nodes_samples_is_a_refusal_not_a_traceback() -> None:
    """BatchNorm on one sample raises ValueError: the query round failed with a traceback, where before the
    speed check it answered."""
    spec = resolve_spec("tests.own_models:digits_batchnorm", input_shape=(1, 8, 8))
    assert measure_speed(spec, torch.randn(2, 1, 8, 8)).samples == 2
    with pytest.raises(ConfigError, match="could not time training model .* here: ValueError: Expected more than 1"):
        measure_speed(spec, torch.randn(1, 1, 8, 8), budget_s=math.inf)  # every block, the BatchNorm's included


def test_only_the_blocks_timed_are_copied(monkeypatch) -> None:
    """Every block was copied (and moved to the node's GPU) though only the first few are timed: a small GPU
    that holds the device's blocks could run out of memory at registration."""
    copied: list[tuple[int, int]] = []
    real = template.copy_blocks

    def spy(spec, start, stop):  # type: ignore[no-untyped-def]
        copied.append((start, stop))
        return real(spec, start, stop)

    monkeypatch.setattr(template, "copy_blocks", spy)
    m = measure_speed(SPEC, SPEC.example_input(4), budget_s=0.0)
    assert m.blocks == 1 and copied == [(0, 1)]
