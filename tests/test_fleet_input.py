"""Fleet files written wrongly: every refusal is one line naming the file, entry and key; every number has a
physical range, and what a fleet inside the ranges says never overflows in the cost model's units."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, option_table
from splitfed.errors import ConfigError
from splitfed.profile import PROFILES, ModelProfile, load_fleet, parse_fleet, shipped_fleets
from splitfed.profile.fleet import MAX_SAMPLES, RANGES, SCALE_RANGE

ROOT = Path(__file__).resolve().parents[1]
EDGE = "[edge]\nflops = 1e12\nmemory_mb = 1024\n"
DEV = '[[device]]\nname = "d"\nprofile = "rpi4"\n'
IN_D = r"^f\.toml: \[\[device\]\] #1 \('d'\): "
BIG = "1" + "0" * 400  # a TOML integer no float holds


def _refused(text: str, pattern: str) -> str:
    with pytest.raises(ConfigError, match=pattern) as e:
        parse_fleet(text, "f.toml")
    line = str(e.value)
    assert "\n" not in line and len(line) < 400, line
    return line


@pytest.mark.parametrize("text, pattern", [
    # before: TypeError: unhashable type: 'list' / 'dict'
    (EDGE + '[[device]]\nname = "d"\nprofile = ["rpi4"]\n',
     IN_D + r"'profile' must be a string naming a device profile \(known: rpi4, .*\), got list \['rpi4'\]$"),
    ('[edge]\nprofile = {name = "edge-server"}\n' + DEV,
     r"^f\.toml: \[edge\]: 'profile' must be a string naming .*got dict \{'name': 'edge-server'\}$"),
    ('[edge]\nprofile = 3\n' + DEV, r"^f\.toml: \[edge\]: 'profile' must be a string .*got int 3$"),
    # before: OverflowError: int too large to convert to float
    (EDGE + DEV + f"flops = {BIG}\n", IN_D + r"'flops' must be in \[1, 1e\+20\] FLOP/s \(.*\), got ~1e\+400$"),
    (EDGE + DEV + f"[[device.drift]]\nround = 2\nflops_scale = {BIG}\n",
     IN_D[:-2] + r" drift #1: 'flops_scale' must be in \[1e-09, 1e\+09\] \(a factor.*\), got ~1e\+400$"),
    (EDGE + DEV + f"flops = -{BIG}\n", IN_D + r"'flops' must be a finite number > 0, got ~-1e\+400$"),
    (f"[edge]\nflops = 1e12\nmemory_mb = {BIG}\n" + DEV, r"^f\.toml: \[edge\]: 'memory_mb' must be in .*got ~1e\+400$"),
    (EDGE + DEV + f"samples = {BIG}\n", IN_D + r"'samples' must be an integer from 1 to 1,000,000,000,000, got ~1e\+400$"),
    (EDGE + DEV + f"count = {BIG}\n", IN_D + r"'count' ~1e\+400 brings the fleet to ~1e\+400 clients, more than"),
    (EDGE + DEV + "flops = 1" + "0" * 5000 + "\n", r"^f\.toml: not valid TOML: .*4300 digits"),  # before: ValueError
], ids=['profile-list', 'profile-table', 'profile-int', 'flops-huge-int', 'flops_scale-huge-int', 'flops-huge-negative', 'memory_mb-huge-int', 'samples-huge-int', 'count-huge-int', 'integer-past-4300-digits'])
def test_a_value_of_the_wrong_type_or_size_is_refused_in_one_line(text: str, pattern: str) -> None:
    _refused(text, pattern)


@pytest.mark.parametrize("text, pattern", [
    # before: inf bytes (every cut fitted), overflow warnings and a refusal blaming server memory, leaked warnings
    (EDGE + DEV + "memory_mb = 1e308\n", IN_D + r"'memory_mb' must be in \[1e-06, 1e\+09\] MiB \(.*\), got 1e\+308$"),
    (EDGE + DEV + "up_mbps = 1e-320\n", IN_D + r"'up_mbps' must be in \[1e-06, 1e\+09\] Mbit/s \(.*\), got 1e-320$"),
    (EDGE + DEV + "flops = 5e-324\n", IN_D + r"'flops' must be in \[1, 1e\+20\] FLOP/s \(.*\), got 5e-324$"),
    (EDGE + DEV + "down_mbps = 1e10\n", IN_D + r"'down_mbps' must be in \[1e-06, 1e\+09\] Mbit/s"),
    (EDGE + DEV + "rtt_ms = 1e300\n", IN_D + r"'rtt_ms' must be in \[0, 1e\+07\] ms \(.*\), got 1e\+300$"),
    ("[edge]\nflops = 1e21\nmemory_mb = 1024\n" + DEV, r"^f\.toml: \[edge\]: 'flops' must be in \[1, 1e\+20\]"),
    (EDGE.replace("[edge]\n", "[edge]\nup_mbps = 1e-9\ndown_mbps = 1\nrtt_ms = 1\n") + "[cloud]\nprofile = 'cloud-gpu'\n"
     + DEV, r"^f\.toml: \[edge\]: 'up_mbps' must be in \[1e-06, 1e\+09\]"),
    (EDGE.replace("[edge]\n", "[edge]\nprofile = 'edge-server'\n") + "[cloud]\nflops = 1e13\nmemory_mb = 2e9\n" + DEV,
     r"^f\.toml: \[cloud\]: 'memory_mb' must be in \[1e-06, 1e\+09\] MiB"),
    (EDGE + DEV + "[[device.drift]]\nround = 2\nup_mbps = 1e-9\n", r"drift #1: 'up_mbps' must be in \[1e-06, 1e\+09\]"),
    (EDGE + DEV + "[[device.drift]]\nround = 2\nrtt_scale = 1e10\n", r"drift #1: 'rtt_scale' must be in \[0, 1e\+09\]"),
    # factors in range that compound out of it: 4e9 FLOP/s x 1e9 x 1e9, from round 7 on
    (EDGE + DEV + "[[device.drift]]\nround = 7\nflops_scale = 1e9\n[[device.drift]]\nround = 3\nflops_scale = 1e9\n",
     IN_D[:-2] + r" drift #1: 'flops_scale' brings 'flops' to 4e\+27 from round 7 on, outside \[1, 1e\+20\] FLOP/s"),
], ids=['memory_mb-1e308', 'up_mbps-1e-320', 'flops-5e-324', 'down_mbps-1e10', 'rtt_ms-1e300', 'edge-flops-1e21', 'edge-link-up_mbps-1e-9', 'cloud-memory_mb-2e9', 'drift-up_mbps-1e-9', 'drift-rtt_scale-1e10', 'drift-compounds'])
def test_a_number_outside_its_physical_range_is_refused_with_the_range(text: str, pattern: str) -> None:
    _refused(text, pattern)


def _toml(v: object) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml, v)) + "]"
    return json.dumps(v)


anything = st.one_of(st.floats(), st.integers(), st.integers(10**300, 10**600), st.integers(-(10**600), -(10**300)),
                     st.booleans(), st.text("ab1. -", max_size=3), st.lists(st.integers(0, 9), max_size=2))


@settings(max_examples=300)
@given(key=st.sampled_from([*RANGES, "flops_scale", "up_scale", "down_scale", "rtt_scale"]), v=anything,
       place=st.sampled_from(["[edge]", "[[device]]", "drift"]))
def test_any_value_is_kept_in_range_or_refused_in_one_line(key: str, v: object, place: str) -> None:
    scale = key.endswith("_scale")
    if scale:
        place = "drift"
    elif key == "memory_mb" and place == "drift":  # drift does not change memory
        place = "[[device]]"
    line = f"{key} = {_toml(v)}\n"
    edge = "[edge]\nprofile = 'edge-server'\n"
    if place == "[edge]":
        text = edge + line + DEV
    elif place == "[[device]]":
        text = edge + DEV + line
    else:
        text = edge + DEV + "[[device.drift]]\nround = 2\n" + line
    if scale:
        lo, hi = (0.0 if key == "rtt_scale" else SCALE_RANGE[0]), SCALE_RANGE[1]
    else:
        lo, hi, _ = RANGES[key]
    number = isinstance(v, int | float) and not isinstance(v, bool)
    try:
        fleet = parse_fleet(text, "f.toml")
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith("f.toml: ") and f"'{key}'" in msg, msg
        if place != "[edge]":
            assert "[[device]] #1 ('d')" in msg, msg
        in_range = number and lo <= v <= hi  # type: ignore[operator]
        assert not in_range or scale, msg  # a factor in range may still take its value out of range
        return
    assert number and lo <= v <= hi  # type: ignore[operator]
    c = fleet.at_round(2).clients[0]
    for x in (c.device.flops, c.device.memory, c.link.up, c.link.down, fleet.edge.flops, fleet.edge.memory):
        assert math.isfinite(x) and x >= np.finfo(float).tiny
    assert math.isfinite(c.link.rtt) and c.link.rtt >= 0


# a VGG-sized model: 1 GFLOP and 1 MB of activations a sample, 100 MB of parameters
BIG_MODEL = ModelProfile.synthetic([2e8] * 5, [2e5] * 5, [2e7] * 5, input_bytes=1.2e4)
ends = st.sampled_from(["lo", "hi", "mid"])


@settings(max_examples=60)
@given(flops=ends, memory=ends, up=ends, down=ends, rtt=ends, samples=st.sampled_from([1, 7, MAX_SAMPLES]),
       batch=st.sampled_from([1, 32, 1 << 20]), u_shape=st.booleans())
def test_every_figure_of_a_fleet_in_range_stays_finite_in_the_cost_model(flops: str, memory: str, up: str, down: str,
                                                                        rtt: str, samples: int, batch: int,
                                                                        u_shape: bool) -> None:
    def pick(key: str, end: str) -> float:
        lo, hi, _ = RANGES[key]
        return {"lo": lo, "hi": hi, "mid": math.sqrt(max(lo, 1e-3) * hi)}[end]

    vals = {"flops": pick("flops", flops), "memory_mb": pick("memory_mb", memory), "up_mbps": pick("up_mbps", up),
            "down_mbps": pick("down_mbps", down), "rtt_ms": pick("rtt_ms", rtt)}
    body = "".join(f"{k} = {v!r}\n" for k, v in vals.items())
    fleet = parse_fleet(f"[edge]\n{body}[cloud]\n{body.split('up_mbps')[0]}[[device]]\nname = \"d\"\n{body}"
                        f"samples = {samples}\n", "f.toml")
    sc = Scenario.from_fleet(BIG_MODEL, fleet, tiers=3, batch=batch, u_shape=u_shape)
    with np.errstate(all="raise"):  # before the ranges: overflow in divide, inf bytes
        t = option_table(sc, fleet.clients[0])
    for a in (t.round_s, t.batch_s, t.memory, t.shared_load, t.exchange_s):
        assert np.isfinite(a).all()


def _fleet_files() -> list[Path]:
    where = [ROOT / "simulations", ROOT / "splitfed", ROOT / "benchmarks"]
    return sorted(p for d in where for p in d.rglob("*.toml") if "[[device]]" in p.read_text())


@pytest.mark.parametrize("path", _fleet_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fleet_file_in_the_repository_loads_within_range(path: Path) -> None:
    fleet = load_fleet(path)
    rounds = {d.round for c in fleet.clients for d in c.drift}
    for r in [1, *rounds]:
        for c in fleet.at_round(r).clients:
            assert RANGES["flops"][0] <= c.device.flops <= RANGES["flops"][1]


def test_the_shipped_fleets_are_the_files_checked() -> None:
    checked = {p.stem for p in _fleet_files() if p.parent.name == "fleets" and p.parent.parent.name == "splitfed"}
    assert checked == set(shipped_fleets()) and checked


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_named_profile_is_within_range_and_loads(name: str) -> None:
    for key, v in PROFILES[name].fields().items():
        lo, hi, _ = RANGES[key]
        assert lo <= v <= hi, (name, key, v)
    link = "" if PROFILES[name].up_mbps is not None else "up_mbps = 10\ndown_mbps = 10\nrtt_ms = 10\n"
    fleet = parse_fleet(f"[edge]\nprofile = {name!r}\n{link}[cloud]\nprofile = {name!r}\n"
                        f"[[device]]\nname = \"d\"\nprofile = {name!r}\n{link}", "f.toml")
    assert fleet.clients[0].device.flops == PROFILES[name].flops
