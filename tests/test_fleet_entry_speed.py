"""``splitfed ping --fleet-entry``: the ``flops`` it prints is this host's training rate as a node of a run
measures itself (``splitfed.profile.speed``, one thread), and a busy spell while it measures does not make
the device look many times slower than it is.

The timed passes read a virtual clock (:class:`_Clock`): two real measurements on a shared CI host differ by
whatever the other worker did meanwhile (a calm 4.3 GFLOP/s beside a contended 1.5), so the laws are checked
on what the code does with the times it reads, exactly, not on how fast this host was.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from splitfed.cli import main
from splitfed.models.zoo import resolve_spec
from splitfed.profile import profiler
from splitfed.profile import speed as speed_module
from splitfed.profile.fleet import parse_fleet
from splitfed.transport.server import serve_tier

EDGE = "[edge]\nflops = 1e12\nmemory_mb = 1024\n"  # what a [[device]] entry needs around it to be read back
SPEC = resolve_spec("cnn")  # what --fleet-entry times without --model


TICK_S = 0.001  # a training pass as the virtual clock times it: below speed.BUDGET_S, so every block is timed


class _Clock:
    """Each reading one tick after the last, plus any stall injected since: a pass (read before and after)
    takes one tick, and a stalled one its stall more."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += TICK_S
        return self.now

    def stall(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    """Every ``measure_speed`` (ping's and a node's) on the virtual clock; each asserts it ran on one thread."""
    virtual = _Clock()
    measure_speed = speed_module.measure_speed

    def on_the_clock(*args: Any, **kwargs: Any) -> speed_module.SpeedMeasure:
        assert torch.get_num_threads() == 1  # as a virtual client computes
        return measure_speed(*args, **kwargs, clock=virtual)

    monkeypatch.setattr(speed_module, "measure_speed", on_the_clock)
    yield virtual


@pytest.fixture
def edge() -> Iterator[str]:
    with serve_tier("edge", insecure=True) as srv:
        yield srv.address


_hosts = itertools.count()


def _entry_flops(address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> float:
    """The ``flops`` of the entry ``ping --fleet-entry`` prints, as on a host that never profiled the model
    (no profile in memory or on disk: whatever ping times, it times now)."""
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / f"cache{next(_hosts)}"))
    monkeypatch.setattr(profiler, "_MEMORY", {})
    threads = torch.get_num_threads()
    assert main(["ping", address, "--fleet-entry", "box", "--count", "1"]) == 0
    assert torch.get_num_threads() == threads  # timed on one thread, and the caller's setting given back
    out = capsys.readouterr().out
    (client,) = parse_fleet(EDGE + out).clients
    assert "trains cnn at this rate here" in out
    return client.device.flops


def _node_rate() -> float:
    """What a node of a run reports of itself on this host (clients/app.py: one thread, ``measure_speed`` on
    a batch, turned into FLOP/s by the coordinator with the cost model's FLOPs), the best of three
    registrations."""
    prof = profiler.profile_model(SPEC, 32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rates = [speed_module.measured_flops(prof, speed_module.measure_speed(SPEC, SPEC.example_input(32)))
                 for _ in range(3)]
    finally:
        torch.set_num_threads(threads)
    measured = [r for r in rates if r is not None]
    assert measured, rates
    return max(measured)


def test_the_entrys_rate_is_what_a_node_of_a_run_measures_of_itself_here(
        clock: _Clock, edge: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    printed = _entry_flops(edge, tmp_path, monkeypatch, capsys)
    node = _node_rate()  # the same passes timed alike: the same blocks, samples and FLOPs make the same rate
    assert printed == pytest.approx(node, rel=1e-5), (printed, node)  # printed to 6 digits


STALLS = 5  # training passes the busy spell slows: more than the 3 a median of 3 could outvote
STALL_S = 0.05  # each: far beyond a pass of the cnn on a batch of 32 (about a millisecond)


def test_a_busy_spell_as_it_starts_timing_does_not_make_the_device_look_slower(
        clock: _Clock, edge: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The host is busy as ping starts timing: its first training passes (forward and backward, each ending
    in ``torch.autograd.backward``) each stall 50 ms. The printed rate is a calm host's (before: the
    profile's median of 3 timed runs of the first block was all stall, and the rate 10x+ too low)."""
    calm = _entry_flops(edge, tmp_path, monkeypatch, capsys)
    backward = torch.autograd.backward
    left = iter(range(STALLS))
    timing = [False]  # inside splitfed.profile.speed.measure_speed
    stalled_while_timing: list[bool] = []

    def busy(*args: Any, **kwargs: Any) -> None:
        if next(left, None) is not None:
            stalled_while_timing.append(timing[0])
            clock.stall(STALL_S)
        return backward(*args, **kwargs)

    measure_speed = speed_module.measure_speed

    def timed(*args: Any, **kwargs: Any) -> speed_module.SpeedMeasure:
        timing[0] = True
        try:
            return measure_speed(*args, **kwargs)
        finally:
            timing[0] = False

    monkeypatch.setattr(torch.autograd, "backward", busy)
    monkeypatch.setattr(speed_module, "measure_speed", timed)
    stalled = _entry_flops(edge, tmp_path, monkeypatch, capsys)
    assert stalled == calm, (stalled, calm)
    assert stalled_while_timing == [True] * STALLS  # every stall fell on a timed pass: not absorbed elsewhere
