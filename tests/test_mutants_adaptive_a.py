"""Behaviour of the Flower policies that a mutation run found unpinned: how a registered node becomes a cost-model
client (a named device profile's numbers in SI units, its sample count, a fleet device as it is in round 1), the
device FLOPs per sample of a cut vector, a measurement's record, and the refusals of ``--cuts``."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from splitfed.cost import client_cost
from splitfed.errors import ConfigError
from splitfed.flower.adaptive import device_work, run_profile, scenario
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import (
    _FACTORIES,
    AssignmentPolicy,
    ClientInfo,
    Measurement,
    StaticPolicy,
    check_policy,
    make_policy,
    parse_static,
)
from splitfed.profile import TierProfile, load_fleet

MIB = 2**20


def _settings(**kw: object) -> RunSettings:
    return RunSettings(**{"rounds": 2, "clients": 2, "cuts": "static:1,3", "sim_clock": False, **kw})  # type: ignore[arg-type]


# ---------------------------------------------------------------- a named device profile as a client


@pytest.mark.parametrize(("name", "flops", "memory_mb", "up_mbit", "down_mbit", "rtt_ms"), [
    ("rpi4", 4e9, 2048, 20, 100, 20),
    ("phone-mid", 8e9, 1024, 8, 30, 50),
])
def test_a_named_device_profile_is_priced_with_its_own_numbers_in_si_units(
        name: str, flops: float, memory_mb: float, up_mbit: float, down_mbit: float, rtt_ms: float) -> None:
    """Mbit/s become bytes/s (each direction its own), ms become s, MiB become bytes; the node's samples count."""
    (c,) = scenario(_settings(clients=1), [ClientInfo("client0", 1, 0, name, 37)]).clients
    assert c.name == "client0" and c.samples == 37
    assert c.device == TierProfile(flops, memory_mb * MIB)
    assert (c.link.up, c.link.down) == (up_mbit * 1e6 / 8, down_mbit * 1e6 / 8)
    assert c.link.rtt == pytest.approx(rtt_ms / 1000, rel=1e-12)


def test_a_named_device_profile_without_a_sample_count_trains_one_sample() -> None:
    """A node that reported no samples (0) is priced for one, not for none (nor two)."""
    assert ClientInfo("client0", 1, 0, "rpi4").samples == 0  # a ClientInfo says no samples unless told
    (c,) = scenario(_settings(clients=1), [ClientInfo("client0", 1, 0, "rpi4", 0)]).clients
    assert c.samples == 1


def test_a_fleet_device_takes_the_node_s_sample_count_else_the_fleet_s() -> None:
    fleet = {c.name: c for c in load_fleet("reference").clients}
    assert fleet["pi-home-0"].samples == 800  # what the fleet file says (the node's count must differ from it)
    told, untold = scenario(_settings(), [ClientInfo("client0", 1, 0, "pi-home-0", 37),
                                          ClientInfo("client1", 2, 1, "pi-home-0")]).clients
    assert (told.name, told.samples) == ("client0", 37)
    assert (untold.name, untold.samples) == ("client1", 800)
    assert told.device == untold.device == fleet["pi-home-0"].device


def test_a_fleet_device_is_planned_as_it_is_in_round_1_not_after_a_later_drift(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A drift from round 2 on is the clock's business: round 1's plan sees the device before it."""
    fleet = tmp_path / "later.toml"
    fleet.write_text('[edge]\nprofile = "edge-server"\n[cloud]\nprofile = "cloud-gpu"\n'
                     '[[device]]\nname = "phone"\nprofile = "phone-mid"\nsamples = 100\n'
                     '[[device.drift]]\nround = 2\nflops_scale = 0.01\nup_scale = 0.5\n')
    (c,) = scenario(_settings(clients=1, fleet=str(fleet)), [ClientInfo("client0", 1, 0, "phone", 100)]).clients
    assert c.device == TierProfile(8e9, 1024 * MIB)  # phone-mid's numbers, undrifted
    assert (c.link.up, c.link.down) == (8e6 / 8, 30e6 / 8)


# ---------------------------------------------------------------- device FLOPs per sample


@pytest.mark.parametrize("cuts", [(0, 5), (1, 3), (2, 5), (3, 3), (7, 7)])
def test_device_work_is_the_per_sample_training_flops_of_the_device_s_blocks(cuts: tuple[int, int]) -> None:
    """One sample's forward and backward FLOPs of blocks [0, k1): not scaled by any sample count."""
    s = _settings()
    p = run_profile(s)
    k = cuts[0]
    want = sum(p.fwd_flops[:k]) + sum(p.bwd_flops[:k])
    assert device_work(s, cuts) == pytest.approx(want, rel=1e-12, abs=0.0)
    assert (device_work(s, cuts) == 0) == (k == 0 or want == 0)


# ---------------------------------------------------------------- policy.py: records and refusals


def test_a_measurement_s_record_lists_its_cuts_and_keeps_every_field() -> None:
    m = Measurement("client3", (2, 5), 40, 1.5, 0.25, 1000, 2000, rtt_s=0.03)
    assert m.to_dict() == {"client_id": "client3", "cuts": [2, 5], "samples": 40, "compute_s": 1.5,
                           "link_s": 0.25, "bytes_up": 1000, "bytes_down": 2000, "rtt_s": 0.03, "speed": None}


def test_client_info_and_measurement_are_immutable() -> None:
    info = ClientInfo("client0", 1, 0, "rpi4", 10)
    m = Measurement("client0", (1, 3), 10, 1.0, 1.0, 5, 5)
    with pytest.raises(FrozenInstanceError):
        info.samples = 11  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        m.compute_s = 2.0  # type: ignore[misc]
    assert info.samples == 10 and m.compute_s == 1.0


def test_a_static_policy_needs_a_cut_vector() -> None:
    with pytest.raises(ConfigError, match="a static policy needs at least one cut vector"):
        StaticPolicy([])


@pytest.mark.parametrize("text", ["", " / ", "/"])
def test_static_cuts_without_a_vector_are_refused_with_an_example(text: str) -> None:
    with pytest.raises(ConfigError, match=r"static cuts need at least one cut vector, e\.g\. 'static:2,5'"):
        parse_static(text)
    with pytest.raises(ConfigError, match="static cuts need at least one cut vector"):
        make_policy(_settings(cuts=f"static:{text}"))


@pytest.mark.parametrize("spec", ["adaptive:fast", "greedy:1,3"])
def test_a_builtin_policy_takes_no_argument(spec: str) -> None:
    name, arg = spec.split(":")
    with pytest.raises(ConfigError, match=f"^cuts {name} takes no argument, got {name}:{arg}$"):
        make_policy(_settings(cuts=spec))


def test_checking_cuts_does_not_build_a_registered_policy(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Building one profiles the model: a check of the command line must not."""
    built: list[str] = []

    def factory(arg: str, settings: RunSettings) -> AssignmentPolicy:
        built.append(arg)
        return StaticPolicy([(1, 3)])

    monkeypatch.setitem(_FACTORIES, "probe", factory)
    check_policy(_settings(cuts="probe"))
    assert built == []
    make_policy(_settings(cuts="probe:x"))
    assert built == ["x"]  # the factory is real: only the check left it alone


@pytest.mark.parametrize("cuts", [(2, 5, 6), (0, 4, 5), (3, 3, 3)])
def test_device_work_of_a_u_shape_counts_its_tail(cuts: tuple[int, int, int]) -> None:
    """The tail [E, L) trains on the device too; fed by the servers it also computes its input's gradient."""
    s = _settings(u_shape=True)
    p = run_profile(s)
    k, _, e = cuts
    grad_bwd = p.grad_bwd_flops or p.bwd_flops
    tail = sum(p.fwd_flops[e:]) + sum(grad_bwd[e:] if k < e else p.bwd_flops[e:])
    want = sum(p.fwd_flops[:k]) + sum(p.bwd_flops[:k]) + tail
    assert device_work(s, cuts) == pytest.approx(want, rel=1e-12, abs=0.0)


def test_device_work_is_what_the_cost_model_prices_a_real_device_per_sample() -> None:
    """Its scratch scenario's unit speeds and links change no FLOP: a real device's priced FLOPs, per sample."""
    s = _settings(clients=1)
    sc = scenario(s, [ClientInfo("client0", 1, 0, "rpi4", 37)])
    for cuts in [(1, 3), (2, 5), (4, 6)]:
        assert client_cost(sc, "client0", cuts).flops[0] / 37 == pytest.approx(device_work(s, cuts), rel=1e-12)
