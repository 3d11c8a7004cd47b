"""Measuring a device's link to its edge (``Probe``), and writing it down as a fleet-file entry that
the fleet parser reads back."""

from __future__ import annotations

import math
import subprocess
import sys

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.errors import ConfigError
from splitfed.profile.devices import DeviceProfile, LinkProfile, mbps
from splitfed.profile.fleet import device_entry, parse_fleet
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import Unauthenticated
from splitfed.transport.pb import method, pb
from splitfed.transport.probe import bandwidth_mbps, measure_link
from splitfed.transport.process import TierProcess
from splitfed.transport.server import serve_tier
from splitfed.units import MIB

EDGE = "[edge]\nflops = 1e12\nmemory_mb = 1024\n"

positive = st.floats(1, 1e9, allow_nan=False, allow_infinity=False)  # inside every range of fleet.RANGES
names = st.text(st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(name=names, flops=positive, memory=positive, up=positive, down=positive,
       rtt=st.floats(0, 1e4, allow_nan=False))
def test_an_entry_reads_back_as_the_device_it_describes(name, flops, memory, up, down, rtt) -> None:  # type: ignore[no-untyped-def]
    text = device_entry(name, DeviceProfile(flops, memory, up, down, rtt), {"flops": "measured # here"})
    (client,) = parse_fleet(EDGE + text).clients
    assert client.name == name

    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-12)

    assert close(client.device.flops, flops) and close(client.device.memory, memory * MIB)
    assert close(client.link.up, mbps(up)) and close(client.link.down, mbps(down))
    assert close(client.link.rtt, rtt / 1e3)


@pytest.mark.parametrize(("name", "device", "words"), [
    ("two words", DeviceProfile(1e9, 512, 10, 10, 5), "'name' must be a non-empty string without spaces"),
    ("pi", DeviceProfile(-1.0, 512, 10, 10, 5), "'flops' must be a finite number > 0"),
    ("pi", DeviceProfile(1e9, 512, float("inf"), 10, 5), "'up_mbps' must be a finite number > 0"),
    ("pi", DeviceProfile(1e9, 512, None, 10, 5), "missing 'up_mbps'"),
])
def test_an_entry_that_would_not_read_back_is_refused(name, device, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=f"device entry {name!r}: .*{words}"):
        device_entry(name, device)


class SteadyLink:
    """A stand-in network of known speed (none can be made here): each call takes rtt + bytes / rate."""

    def __init__(self, up_mbps: float, down_mbps: float, rtt_s: float = 0.01) -> None:
        from splitfed.transport.wire import Limits

        self.limits = Limits()
        self.rates = (mbps(up_mbps), mbps(down_mbps))
        self.rtt = rtt_s
        self.calls: list[tuple[int, int]] = []

    def probe(self, up_bytes: int, down_bytes: int) -> float:
        self.calls.append((up_bytes, down_bytes))
        return self.rtt + up_bytes / self.rates[0] + down_bytes / self.rates[1]


@pytest.mark.parametrize(("up", "down"), [(2.0, 8.0), (100.0, 300.0), (5000.0, 20000.0)])
def test_bandwidth_is_the_payload_over_the_time_beyond_an_empty_call(up, down) -> None:  # type: ignore[no-untyped-def]
    link = SteadyLink(up, down)
    assert bandwidth_mbps(link, up=True) == pytest.approx(up, rel=1e-9)  # type: ignore[arg-type]
    assert bandwidth_mbps(link, up=False) == pytest.approx(down, rel=1e-9)  # type: ignore[arg-type]
    sizes = {max(c) for c in link.calls}
    assert max(sizes) <= link.limits.unary_bytes  # never more than one message
    if up < 100:  # a slow link is measured with a small payload, not the largest
        assert max(c[0] for c in link.calls) < 1 << 20


def test_a_tier_answers_a_probe_with_exactly_the_bytes_asked_and_no_more_than_a_message() -> None:
    with serve_tier("edge", insecure=True) as srv, grpc.insecure_channel(srv.address) as ch:
        call = ch.unary_unary(method("Probe"))
        reply = pb.ProbeReply.FromString(call(pb.ProbeRequest(payload=b"x" * 1000, reply_bytes=12345)
                                              .SerializeToString(), timeout=5))
        assert len(reply.payload) == 12345
        for bad, code in ((pb.ProbeRequest(reply_bytes=(4 << 20) + 1).SerializeToString(),
                           grpc.StatusCode.RESOURCE_EXHAUSTED),
                          (pb.ProbeRequest(reply_bytes=-1).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT),
                          (b"\xff\xff", grpc.StatusCode.INVALID_ARGUMENT)):
            with pytest.raises(grpc.RpcError) as err:
                call(bad, timeout=5)
            assert err.value.code() == code
        with GrpcTierClient(srv.address) as c:
            m = measure_link(c, count=2, bandwidth=True)
        assert m.rtt_ms > 0 and m.up_mbps > 0 and m.down_mbps > 0  # type: ignore[operator]
        assert math.isfinite(m.up_mbps) and math.isfinite(m.down_mbps)  # type: ignore[arg-type]


def test_a_probe_needs_the_token() -> None:
    with serve_tier("edge", insecure=True, token="s3cret") as srv, GrpcTierClient(srv.address, token="wrong") as c, \
            pytest.raises(Unauthenticated):
        c.probe(10, 10)


def test_fleet_entry_of_a_profile_without_a_measured_rate_is_refused_naming_why(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A profile that counts no FLOPs in the blocks this host timed gives no training rate: the entry is
    refused as such, not written without ``flops`` and then refused as a fleet entry the user never wrote."""
    import argparse
    from dataclasses import replace

    import splitfed.commands.profile  # noqa: F401 - first imported under the patch, it kept the fake for good
    import splitfed.profile.profiler as profiler
    from splitfed.commands.ping import _fleet_entry
    from splitfed.models.zoo import resolve_spec

    real = profiler.profile_model(resolve_spec("cnn"), 32, reps=1)
    untimed = replace(real, fwd_flops=tuple(0.0 for _ in real.fwd_flops), bwd_flops=tuple(0.0 for _ in real.bwd_flops))
    monkeypatch.setattr(profiler, "profile_model", lambda *a, **k: untimed)
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path))
    row = {"name": "edge", "address": "127.0.0.1:1", "up_mbps": 100.0, "down_mbps": 100.0, "rtt_ms": 1.0}
    args = argparse.Namespace(model="cnn", input_shape=None, num_classes=None, torch_device="cpu")
    with pytest.raises(ConfigError, match="no training rate measured on this host") as e:
        _fleet_entry("lab-box", row, args)
    assert "missing 'flops'" not in str(e.value)


@pytest.mark.slow
@pytest.mark.xdist_group("transport-processes")
def test_ping_prints_this_host_as_a_fleet_entry_measured_against_a_real_edge(tmp_path, capsys) -> None:  # noqa: ANN001
    """The refusals of ``--fleet-entry`` with two addresses or a spaced name, asked here in processes of their
    own before, are tests of their own that need no tier (exit 2, before any tier is asked):
    test_mutants_cmd_ping's test_a_fleet_entry_takes_one_address_and_a_chain_of_two_without_one_is_checked and
    test_bad_flags_are_refused_before_any_tier_is_asked[spaced_name]. ``--bandwidth`` is asked in this process
    (the edge is still the real one): an interpreter and torch less to start. The edge is a tier process; its
    cloud, which the fleet entry does not measure, a gRPC server in this process."""
    from splitfed import cli

    def ping(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "splitfed.cli", "ping", *args], capture_output=True,
                              text=True, timeout=300, env={**__import__("os").environ,
                                                           "SPLITFED_PROFILE_CACHE": str(tmp_path / "cache")})

    with serve_tier("cloud", insecure=True) as cloud, \
            TierProcess.start("edge", next_address=cloud.address, insecure=True) as edge:
        p = ping(edge.address, "--fleet-entry", "lab-box", "--count", "2")
        assert p.returncode == 0, p.stderr
        (client,) = parse_fleet(EDGE + p.stdout).clients
        assert client.name == "lab-box" and client.device.flops > 0 and client.device.memory > 0
        assert client.link.up > 0 and client.link.down > 0 and client.link.rtt > 0
        assert f"measured to edge at {edge.address}" in p.stdout and "trains cnn at this rate" in p.stdout

        capsys.readouterr()
        assert cli.main(["ping", edge.address, "--bandwidth", "--count", "1"]) == 0
        assert " Mbit/s, down " in capsys.readouterr().out


def _run_two_nodes(tmp_path, caplog, sim_clock: bool, cuts: str = "adaptive"):  # type: ignore[no-untyped-def]
    """One adaptive round of two nodes (the real ClientApp, in process) through real edge and cloud tiers."""
    import logging

    import clients.app
    import server.app
    from splitfed.flower.config import RunSettings
    from tests.flower_fixtures import FakeGrid

    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        s = RunSettings(model="cnn", rounds=1, clients=2, tiers=3, cuts=cuts, sim_clock=sim_clock,
                        tier_addresses=f"{edge.address},{cloud.address}", out=str(tmp_path), node_wait_s=30,
                        round_timeout_s=60)
        with caplog.at_level(logging.INFO, logger="flwr"):
            server.app.run(FakeGrid(clients.app.app, 2), s)
    return s


@pytest.mark.parametrize("sim_clock", [False, True])
def test_deployed_nodes_measure_their_links_at_registration_and_the_optimizer_plans_with_them(
        monkeypatch, tmp_path, caplog, sim_clock) -> None:  # type: ignore[no-untyped-def]
    """Real time (deployment): every node measures its link to the edge and its training speed when it
    registers, and the first plan uses them instead of its profile's guesses. Simulated time: the fleet file
    is the world, so nothing is measured (loopback speeds would replace the fleet's links)."""

    import splitfed.flower.adaptive as adaptive

    seen: list = []
    real = adaptive.scenario

    def spy(settings, clients):  # type: ignore[no-untyped-def]
        seen.append(list(clients))
        return real(settings, clients)

    monkeypatch.setattr(adaptive, "scenario", spy)
    s = _run_two_nodes(tmp_path, caplog, sim_clock)
    links = [c.link for c in seen[0]]
    speeds = [c.speed for c in seen[0]]
    if sim_clock:
        assert links == [None, None] and "measured up" not in caplog.text
        assert speeds == [None, None] and "GFLOP/s" not in caplog.text
    else:
        assert all(link.up > 0 and link.down > 0 and link.rtt > 0 for link in links)  # type: ignore[union-attr]
        assert all(sp is not None and sp.blocks >= 1 and sp.samples >= 1 for sp in speeds)  # SpeedMeasure: a positive time
        assert "client0=" in caplog.text and "(measured up " in caplog.text and " GFLOP/s)" in caplog.text
        planned = real(s, seen[0])
        assert planned.clients[0].link.up == pytest.approx(links[0].up)  # type: ignore[union-attr]
        from splitfed.flower.adaptive import measured_device_flops
        assert planned.clients[0].device.flops == pytest.approx(measured_device_flops(s, speeds[0]))


def test_a_measured_link_replaces_the_profiles_guess_in_the_plan() -> None:
    from splitfed.flower.adaptive import scenario
    from splitfed.flower.config import RunSettings
    from splitfed.flower.policy import ClientInfo

    s = RunSettings(model="cnn", tiers=3)
    guessed, measured = (scenario(s, [ClientInfo("client0", 1, 0, "rpi4", 100, link)])
                         for link in (None, LinkProfile(mbps(2.0), mbps(8.0), 0.04)))
    assert guessed.clients[0].link.up != mbps(2.0)
    link = measured.clients[0].link
    assert (link.up, link.down, link.rtt) == (mbps(2.0), mbps(8.0), 0.04)
    assert measured.clients[0].device == guessed.clients[0].device  # only the link changes


def test_the_coordinator_logs_measured_links_as_plain_numbers() -> None:
    """Before: ``up 1.54e+03 Mbit/s``; now about three significant digits, never e-notation."""
    from server.strategy import _link_text

    text = _link_text(LinkProfile(up=1540e6 / 8, down=8.2e6 / 8, rtt=0.041))
    assert text == " (measured up 1540 Mbit/s, down 8.2 Mbit/s, rtt 41 ms)"
    assert _link_text(LinkProfile(up=1.9e6 / 8, down=0.0123e6 / 8, rtt=2.5)) == \
        " (measured up 1.9 Mbit/s, down 0.0123 Mbit/s, rtt 2500 ms)"
    assert _link_text(None) == ""


def test_a_node_that_could_not_measure_its_link_says_why_in_the_coordinators_log(monkeypatch, tmp_path,
                                                                                caplog) -> None:
    """Before: the coordinator logged ``client1=rpi4`` and the reason was only in that node's own log."""

    import splitfed.transport.probe as probe
    from splitfed.errors import TierError

    real = probe.measure_link
    calls: list[int] = []

    def measure_once_then_fail(link, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)  # a TLS handshake lost on a loaded machine: the second node's measurement fails
        if len(calls) == 2:
            raise TierError("tier 127.0.0.1:1: probe: handshake failed\nsecond line")
        return real(link, **kwargs)

    monkeypatch.setattr(probe, "measure_link", measure_once_then_fail)
    _run_two_nodes(tmp_path, caplog, sim_clock=False)
    registered = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Registered 2 client"))
    assert registered.count("(measured up ") == 1, registered
    assert ("(link not measured: tier 127.0.0.1:1: probe: handshake failed; the profile's is used)"
            in registered), registered


def test_static_cuts_ask_no_speed_and_profile_nothing(monkeypatch, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Static cuts plan with no device's speed: a deployed static run measured every node's speed, and profiled
    the model on the coordinator only to log it. (The coordinator does profile the model now, for the cost
    model's prediction of each round beside the measured one: see tests/test_predicted.py.)"""
    import splitfed.profile as profile_pkg
    import splitfed.profile.profiler as profiler
    import splitfed.profile.speed as speed

    timed: list[int] = []
    profiled: list[str] = []
    real_measure, real_profile = speed.measure_speed, profiler.profile_model
    monkeypatch.setattr(speed, "measure_speed", lambda *a, **k: timed.append(1) or real_measure(*a, **k))
    def spy(spec, *a, **k):  # type: ignore[no-untyped-def]
        profiled.append(spec.name)
        return real_profile(spec, *a, **k)

    monkeypatch.setattr(profiler, "profile_model", spy)
    monkeypatch.setattr(profile_pkg, "profile_model", spy)
    _run_two_nodes(tmp_path, caplog, sim_clock=False, cuts="static:2,5")
    assert timed == [] and set(profiled) <= {"cnn"} and "GFLOP/s" not in caplog.text
    assert "(measured up " in caplog.text  # the link is measured as before (a deployment's check of it)


def test_a_node_that_could_not_measure_its_speed_says_why_and_keeps_its_profiles(monkeypatch, tmp_path,
                                                                                   caplog) -> None:
    import splitfed.profile.speed as speed

    real = speed.measure_speed
    calls: list[int] = []

    def measure_once_then_fail(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise ConfigError("could not time training model cnn here: RuntimeError: out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(speed, "measure_speed", measure_once_then_fail)
    _run_two_nodes(tmp_path, caplog, sim_clock=False)
    registered = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Registered 2 client"))
    assert registered.count(" GFLOP/s)") == 1, registered
    assert ("(speed not measured: could not time training model cnn here: RuntimeError: out of memory; the "
            "profile's is used)" in registered), registered
