"""``splitfed ping --fleet-entry NAME --torch-device DEV``: the entry of a device whose node computes on a GPU
(a Jetson's) is timed there, as that node times itself, and a GPU this host lacks is refused before any tier
is asked."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch

from splitfed.cli import main
from splitfed.commands import ping
from splitfed.profile.fleet import parse_fleet
from splitfed.transport.server import serve_tier
from splitfed.units import MIB

EDGE = "[edge]\nflops = 1e12\nmemory_mb = 1024\n"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed: asking it would fail late


@pytest.fixture
def edge() -> Iterator[str]:
    with serve_tier("edge", insecure=True) as srv:
        yield srv.address


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU: nothing to refuse")
def test_a_gpu_this_host_lacks_is_refused_before_any_tier_is_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ping", _closed_port(), "--fleet-entry", "jetson", "--torch-device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--torch-device cuda: this machine has no CUDA GPU" in err and "no answer" not in err


@pytest.mark.parametrize("dev, why", [("tpu", "not a device torch knows"), ("mps", "not mps"), ("cpu:3", "the CPU has no index")])
def test_a_device_torch_cannot_compute_on_is_named(dev: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ping", _closed_port(), "--fleet-entry", "box", "--torch-device", dev]) == 2
    assert why in capsys.readouterr().err


def test_torch_device_without_fleet_entry_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Only --fleet-entry trains anything: a --torch-device on its own would be silently ignored."""
    assert main(["ping", _closed_port(), "--torch-device", "cuda"]) == 2
    assert "give it with --fleet-entry" in capsys.readouterr().err


def test_the_cpu_entry_records_the_memory_training_can_use(edge: str, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """What is available (MemAvailable), as the named profiles count a device's memory (a 4 GB Pi 4: ~2 GiB for
    training), taken before the timing allocates; before, the RAM in all: twice a Pi's share."""
    import collections

    import psutil

    from splitfed.engine import compute

    VM = collections.namedtuple("VM", "total available")
    seen: list[str] = []
    real_rate = ping.training_rate
    monkeypatch.setattr(psutil, "virtual_memory", lambda: (seen.append("memory"), VM(8192 * MIB, 3000 * MIB))[1])
    monkeypatch.setattr(ping, "training_rate", lambda *a, **k: (seen.append("timed"), real_rate(*a, **k))[1])
    assert main(["ping", edge, "--fleet-entry", "box", "--count", "1", "--torch-device", "cpu"]) == 0
    out = capsys.readouterr().out
    (client,) = parse_fleet(EDGE + out).clients
    assert client.device.memory == 3000 * MIB
    assert "memory_mb = 3000" in out and "this host's memory available when measured, of 8,192 MiB in all" in out
    assert "one thread" in out and seen[:2] == ["memory", "timed"]
    assert compute.free_memory(torch.device("cpu")) == (3000 * MIB, 8192 * MIB)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_entry_is_timed_on_it_with_its_memory(edge: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ping", edge, "--fleet-entry", "jetson", "--count", "1", "--torch-device", "cuda"]) == 0
    out = capsys.readouterr().out
    (client,) = parse_fleet(EDGE + out).clients
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0 < client.device.memory <= total and client.device.flops > 0  # free when measured, of the total
    assert f"of {total / MIB:,.0f} MiB in all" in out
    assert "at this rate on cuda:0" in out
