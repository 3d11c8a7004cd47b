"""Fleet files (splitfed/profile/fleet.py): the refusals, range edges and defaults that a mutation run found no
test pinned. Every refusal is one line naming the file, the entry and the key; a value exactly at the end of
its physical range is accepted (drift included), one step past it is refused."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError

import pytest

from splitfed.errors import ConfigError
from splitfed.profile import Drift, Fleet, mbps, parse_fleet
from splitfed.profile.fleet import DEFAULT_SAMPLES, MAX_CLIENTS, RANGES, in_range
from tests.test_fleet_input import DEV, EDGE, _refused

EDGE_LINKED = "[edge]\nprofile = 'edge-server'\n"  # has the edge -> cloud link a [cloud] needs
IN_D = r"^f\.toml: \[\[device\]\] #1 \('d'\)"


def _device(**keys: object) -> str:
    """A [[device]] "d" with explicit numbers (no profile), ``keys`` added or overriding."""
    vals: dict[str, object] = {"flops": 1e9, "memory_mb": 512, "up_mbps": 40.0, "down_mbps": 40.0, "rtt_ms": 30.0}
    vals.update(keys)
    return '[[device]]\nname = "d"\n' + "".join(f"{k} = {v!r}\n" for k, v in vals.items())


# ---------------------------------------------------------------- refusals: the file, the entry, the key


@pytest.mark.parametrize("text, pattern", [
    ("description = 3\n" + EDGE + DEV, r"^f\.toml: top level: 'description' must be a string$"),
    ("description = ['a']\n" + EDGE + DEV, r"^f\.toml: top level: 'description' must be a string$"),
    ("device = 3\n" + EDGE, r"^f\.toml: 'device' must be an array of tables \(\[\[device\]\]\)$"),
    ('device = "phone"\n' + EDGE, r"^f\.toml: 'device' must be an array of tables \(\[\[device\]\]\)$"),
    ("device = [1, 2]\n" + EDGE, r"^f\.toml: \[\[device\]\] #1 must be a table$"),
    ("edge = 3\n" + DEV, r"^f\.toml: \[edge\] must be a table$"),
    ('cloud = "gpu"\n' + EDGE_LINKED + DEV, r"^f\.toml: \[cloud\] must be a table$"),
    (EDGE + DEV + "drift = 3\n", IN_D + r": 'drift' must be an array of tables \(\[\[device\.drift\]\]\)$"),
    (EDGE + DEV + "drift = [1]\n", IN_D + r" drift #1 must be a table$"),
    (EDGE + DEV + "[[device.drift]]\nround = 2\nflops = 0\n", IN_D + r" drift #1: 'flops' must be a finite number > 0, got 0$"),
    (EDGE + DEV + "[[device.drift]]\nround = 2\nrtt_ms = -1\n", IN_D + r" drift #1: 'rtt_ms' must be a finite number >= 0, got -1$"),
], ids=["description-int", "description-list", "device-int", "device-string",
        "device-entry-int", "edge-int", "cloud-string", "drift-int", "drift-entry-int", "drift-flops-0", "drift-rtt-negative"])
def test_a_malformed_table_or_value_is_refused_naming_the_file_entry_and_key(text: str, pattern: str) -> None:
    _refused(text, pattern)


def test_a_drift_may_set_the_round_trip_time_to_zero() -> None:
    fleet = parse_fleet(EDGE + _device() + "[[device.drift]]\nround = 2\nrtt_ms = 0\n", "f.toml")
    assert fleet.at_round(2).clients[0].link.rtt == 0.0
    assert fleet.at_round(1).clients[0].link.rtt == pytest.approx(0.03)


@pytest.mark.parametrize("v, shown", [
    (10**15 - 1, "999,999,999,999,999"),  # below 10**15: every digit, grouped
    (10**15, "~1e+15"),  # from 10**15 on: three figures and the power of ten
    (10**16 - 1, "~9.99e+15"),  # log10 rounds this up to 16.0: the exponent must still be 15
    (10**16, "~1e+16"),
    (123_456 * 10**20, "~1.23e+25"),
])
def test_a_huge_integer_is_shown_in_a_refusal_as_three_figures_and_a_power_of_ten(v: int, shown: str) -> None:
    _refused(EDGE + DEV + f"samples = {v}\n",
             IN_D + r": 'samples' must be an integer from 1 to 1,000,000,000,000, got " + shown.replace("+", r"\+") + "$")
    _refused(EDGE + DEV + f"samples = -{v}\n",
             IN_D + r": 'samples' must be an integer >= 1, got " + ("~-" + shown[1:] if shown[0] == "~" else "-" + shown)
             .replace("+", r"\+") + "$")


# ---------------------------------------------------------------- ranges: the ends are in, a step past is out


@pytest.mark.parametrize("key", sorted(RANGES))
def test_both_ends_of_a_range_are_in_it_and_the_next_float_past_each_is_not(key: str) -> None:
    lo, hi, _ = RANGES[key]
    assert in_range(lo, key) and in_range(hi, key)
    assert not in_range(math.nextafter(lo, -math.inf), key)
    assert not in_range(math.nextafter(hi, math.inf), key)


@pytest.mark.parametrize("base, scale, reached", [
    ({"flops": 2.0}, "flops_scale = 0.5", ("flops", 1.0)),
    ({"flops": 1e11}, "flops_scale = 1e9", ("flops", 1e20)),
    ({"up_mbps": 2e-6}, "up_scale = 0.5", ("up", mbps(1e-6))),
    ({"up_mbps": 5e8}, "up_scale = 2.0", ("up", mbps(1e9))),
    ({"down_mbps": 2e-6}, "down_scale = 0.5", ("down", mbps(1e-6))),
    ({"down_mbps": 5e8}, "down_scale = 2.0", ("down", mbps(1e9))),
    ({"rtt_ms": 30.0}, "rtt_scale = 0.0", ("rtt", 0.0)),
    ({"rtt_ms": 5e6}, "rtt_scale = 2.0", ("rtt", 1e4)),
])
def test_a_drift_that_brings_a_value_exactly_to_the_end_of_its_range_is_accepted(
        base: dict[str, float], scale: str, reached: tuple[str, float]) -> None:
    fleet = parse_fleet(EDGE + _device(**base) + f"[[device.drift]]\nround = 3\n{scale}\n", "f.toml")
    c = fleet.at_round(3).clients[0]
    what, value = reached
    got = {"flops": c.device.flops, "up": c.link.up, "down": c.link.down, "rtt": c.link.rtt}[what]
    assert got == value


@pytest.mark.parametrize("base, scale, pattern", [
    ({"flops": 2.0}, "flops_scale = 0.25", r"'flops_scale' brings 'flops' to 0\.5 from round 3 on, outside \[1, 1e\+20\]"),
    ({"up_mbps": 5e8}, "up_scale = 4.0", r"'up_scale' brings 'up_mbps' to 2e\+09 from round 3 on, outside \[1e-06, 1e\+09\]"),
    ({"rtt_ms": 5e6}, "rtt_scale = 4.0", r"'rtt_scale' brings 'rtt_ms' to 2e\+07 from round 3 on, outside \[0, 1e\+07\]"),
])
def test_a_drift_that_takes_a_value_past_its_range_is_refused_naming_the_factor(
        base: dict[str, float], scale: str, pattern: str) -> None:
    _refused(EDGE + _device(**base) + f"[[device.drift]]\nround = 3\n{scale}\n", IN_D + " drift #1: " + pattern)


# ---------------------------------------------------------------- drift over rounds


def test_a_drift_changes_only_what_it_names_and_is_consumed_once_applied() -> None:
    fleet = parse_fleet(EDGE + _device(up_mbps=40.0, down_mbps=24.0, rtt_ms=30.0)
                        + "[[device.drift]]\nround = 5\nup_scale = 0.5\n", "f.toml")
    c = fleet.clients[0]
    assert c.at_round(4) is c  # no drift in effect yet: the client as read, nothing recomputed
    c5 = c.at_round(5)
    assert c5.link.up == mbps(20.0)
    assert (c5.link.down, c5.link.rtt, c5.device) == (c.link.down, c.link.rtt, c.device)  # untouched, exactly
    assert c5.drift == ()  # applied: a later at_round of this client must not apply it again
    assert c5.at_round(5) is c5 and c5.at_round(9) is c5
    assert fleet.at_round(5).at_round(6) == fleet.at_round(6)


# ---------------------------------------------------------------- defaults


def test_a_device_without_samples_has_the_default_and_the_top_level_samples_overrides_it() -> None:
    assert DEFAULT_SAMPLES == 500
    assert parse_fleet(EDGE + DEV, "f.toml").clients[0].samples == 500
    assert parse_fleet("samples = 77\n" + EDGE + DEV, "f.toml").clients[0].samples == 77
    assert parse_fleet("samples = 77\n" + EDGE + DEV + "samples = 9\n", "f.toml").clients[0].samples == 9


# ---------------------------------------------------------------- sampling


def test_a_sample_of_exactly_max_clients_is_drawn() -> None:
    assert len(parse_fleet(EDGE + DEV, "f.toml").sample(MAX_CLIENTS, seed=3).clients) == MAX_CLIENTS


def test_a_sample_without_a_seed_is_the_seed_0_draw() -> None:
    fleet = parse_fleet(EDGE + DEV.replace('"d"', '"a"') + "count = 3\n" + DEV.replace('"d"', '"b"') + "count = 2\n", "f.toml")
    # 62 of its 5 devices: 12 each and 2 more, which the seed picks (60, a multiple of 5, would not need it)
    assert fleet.sample(62) == fleet.sample(62, seed=0)
    assert fleet.sample(62, seed=1) != fleet.sample(62, seed=0)  # the seed matters: the test above can tell


# ---------------------------------------------------------------- the Fleet and its clients as objects


def test_a_fleet_built_with_two_clients_of_one_name_is_refused_naming_its_source() -> None:
    fleet = parse_fleet(EDGE + DEV, "f.toml")
    c = fleet.clients[0]
    with pytest.raises(ConfigError, match=r"^f\.toml: two clients are named 'd'$"):
        Fleet(fleet.name, fleet.edge, (c, c), source="f.toml")
    with pytest.raises(ConfigError, match=r"^mine: two clients are named 'd'$"):
        Fleet("mine", fleet.edge, (c, c))


def test_servers_takes_two_or_three_tiers_and_three_only_with_both_a_cloud_and_its_link() -> None:
    linked = parse_fleet(EDGE_LINKED + "[cloud]\nprofile = 'cloud-gpu'\n" + DEV, "f.toml")
    assert linked.cloud is not None and linked.edge_link is not None
    assert linked.servers(2) == ((linked.edge,), ())
    assert linked.servers(3) == ((linked.edge, linked.cloud), (linked.edge_link,))
    for tiers in (1, 4):
        with pytest.raises(ConfigError, match=rf"^tiers must be 2 or 3, got {tiers}$"):
            linked.servers(tiers)
    for half in (Fleet(linked.name, linked.edge, linked.clients, cloud=linked.cloud, source="f.toml"),
                 Fleet(linked.name, linked.edge, linked.clients, edge_link=linked.edge_link, source="f.toml")):
        with pytest.raises(ConfigError, match=r"has no \[cloud\] \(and edge link\): use 2 tiers$"):
            half.servers(3)


def test_a_fleet_its_clients_and_their_drift_cannot_be_changed_in_place() -> None:
    """Shared by every round and every node of a run: a change is a new object (``at_round``, ``sample``)."""
    fleet = parse_fleet(EDGE + DEV + "[[device.drift]]\nround = 2\nup_scale = 0.5\n", "f.toml")
    c = fleet.clients[0]
    with pytest.raises(FrozenInstanceError):
        fleet.name = "other"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        c.samples = 1  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        c.drift[0].round = 9  # type: ignore[misc]
    assert isinstance(c.drift[0], Drift) and c.drift[0].round == 2 and c.samples == DEFAULT_SAMPLES
