"""Fleet files as a demanding user writes them: a valid document reads back as written; one bad field (a wrong type,
a value out of range, an unknown key, a name that says two devices) is refused in one line naming the file, the entry
(index and name) and the key."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.errors import ConfigError
from splitfed.flower.adaptive import scenario
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo
from splitfed.profile import MIB, PROFILES, load_fleet, mbps, parse_fleet
from splitfed.profile.fleet import DEFAULT_SAMPLES, MAX_CLIENTS, RANGES
from splitfed.tomlio import value

EDGE = "[edge]\nprofile = 'edge-server'\n[cloud]\nprofile = 'cloud-gpu'\n"


def _dev(name: str, profile: str = "rpi4", count: int = 1) -> str:
    return f"[[device]]\nname = {name!r}\nprofile = {profile!r}\ncount = {count}\n"


def _refused(text: str, pattern: str) -> str:
    with pytest.raises(ConfigError, match=pattern) as e:
        parse_fleet(text, "f.toml")
    assert "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)
    return str(e.value)


# ---------------------------------------------------------------- one name, one device


def test_an_entry_named_as_another_entrys_client_is_refused_before_a_node_is_priced_as_the_wrong_device(
        tmp_path: Path) -> None:
    """Before, ``pi`` (Pis, clients pi-0, pi-1) and ``pi-1`` (laptops) loaded, and a node whose device-profile
    was the entry ``pi-1`` was priced as the Pi client ``pi-1``: 4 GFLOP/s for a laptop's 80, silently."""
    path = tmp_path / "fleet.toml"
    path.write_text(EDGE + _dev("pi", "rpi4", 2) + _dev("pi-1", "laptop", 2))
    with pytest.raises(ConfigError, match=r"fleet\.toml: \[\[device\]\] #2 \('pi-1'\): 'name' 'pi-1' is also the "
                                          r"name of a client of \[\[device\]\] #1 \('pi'\)"):
        load_fleet(path)
    ok = tmp_path / "ok.toml"  # renamed, the node is priced as the laptop it is
    ok.write_text(EDGE + _dev("pi", "rpi4", 2) + _dev("lap", "laptop", 2))
    sc = scenario(RunSettings(clients=2, cuts="adaptive", fleet=str(ok)), [ClientInfo("client0", 1, 0, "lap", 10)])
    assert sc.clients[0].device.flops == PROFILES["laptop"].flops


@pytest.mark.parametrize("first, second, pattern", [
    # a run draws clients pi-0, pi-1, ... of an entry whatever its count: count 1 is as ambiguous
    (_dev("pi"), _dev("pi-3"), r"#2 \('pi-3'\): 'name' 'pi-3' is also the name of a client of \[\[device\]\] #1 "
                               r"\('pi'\) \(its clients are pi-0, pi-1, \.\.\.: two clients are named 'pi-3'\)"),
    (_dev("pi-3"), _dev("pi"), r"#2 \('pi'\): 'name' 'pi' would name its clients pi-0, pi-1, \.\.\., and "
                               r"\[\[device\]\] #1 \('pi-3'\) is one of them"),
    (_dev("pi"), _dev("pi"), r"#2 \('pi'\): 'name' 'pi' is used by an earlier device, \[\[device\]\] #1 \('pi'\)"),
    # before: "f.toml: two clients are named 'x-1' (device names with a count get -0, -1, ...)": no entry, no key
    (_dev("x", count=2), _dev("x-1"), r"#2 \('x-1'\): 'name' 'x-1' is also the name of a client of \[\[device\]\] "
                                      r"#1 \('x'\)"),
], ids=["client-of-an-earlier-entry", "earlier-entry-is-a-client", "same-name", "count-makes-the-name"])
def test_a_name_that_says_two_devices_is_refused_naming_both_entries_and_the_key(first: str, second: str,
                                                                                pattern: str) -> None:
    _refused(EDGE + first + second, r"^f\.toml: \[\[device\]\] " + pattern)


def test_names_that_only_look_alike_still_load() -> None:
    alike = ["pi-1-0", "pi-x", "pi-", "pie-1", "pi-01"]  # a client of pi-1; not a number; not "pi"; 01 is no str(int)
    fleet = parse_fleet(EDGE + _dev("pi", count=2) + "".join(map(_dev, alike)), "f.toml")
    assert [c.name for c in fleet.clients] == ["pi-0", "pi-1", *alike]
    drawn = fleet.sample(200, seed=1)
    assert len({c.name for c in drawn.clients} | set(fleet.kinds)) == len(drawn.clients) + len(fleet.kinds)


def test_a_fleet_with_no_devices_says_so_alone() -> None:
    """Before: "f.toml: the fleet has no [[device]] (device names with a count get -0, -1, ...)"."""
    assert _refused("device = []\n" + EDGE, "no") == "f.toml: the fleet has no [[device]]"


def test_a_fleet_file_saved_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    """Notepad and PowerShell 5 (``Out-File -Encoding utf8``) start UTF-8 with a BOM; before, the file was refused
    as "not valid TOML: Invalid statement (at line 1, column 1)", pointing at a character nobody can see."""
    text = (Path(__file__).resolve().parents[1] / "splitfed" / "fleets" / "small.toml").read_text()
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    got, shipped = load_fleet(path), load_fleet("small")
    assert (got.name, got.clients, got.edge, got.cloud) == (shipped.name, shipped.clients, shipped.edge, shipped.cloud)


# ---------------------------------------------------------------- generated documents


@dataclass
class Section:
    """One table of a fleet document: its header, its keys (TOML text of each value) and where a refusal names it."""

    header: str
    keys: dict[str, str]
    where: str
    drift: list[Section] = field(default_factory=list)

    def text(self) -> str:
        body = "".join(f"{k} = {v}\n" for k, v in self.keys.items())
        return f"{self.header}\n{body}" if self.header else body


def _num(key: str) -> st.SearchStrategy[float | int]:
    lo, hi, _ = RANGES[key]
    ints = st.integers(max(1, math.ceil(lo)), min(10**6, int(hi)))
    return st.one_of(st.floats(lo, hi), ints)


names = st.lists(st.text("abcdefgh_", min_size=1, max_size=5), min_size=1, max_size=3, unique=True)
device_profiles = st.sampled_from([None, *(n for n, p in PROFILES.items() if p.up_mbps is not None)])


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[Section], dict]:
    """A valid fleet document as sections, and what it says (name -> (file values, count, samples, drifts))."""
    top = Section("", {}, "top level")
    default = DEFAULT_SAMPLES
    if draw(st.booleans()):
        default = draw(st.integers(1, 10**6))
        top.keys["samples"] = value(default)
    has_cloud = draw(st.booleans())
    edge = Section("[edge]", {"profile": value("edge-server")} if draw(st.booleans()) else
                   {"flops": value(draw(_num("flops"))), "memory_mb": value(draw(_num("memory_mb"))),
                    **{k: value(draw(_num(k))) for k in ("up_mbps", "down_mbps", "rtt_ms") if has_cloud}}, "[edge]")
    sections = [top, edge]
    if has_cloud:
        sections.append(Section("[cloud]", {"profile": value("cloud-gpu")}, "[cloud]"))
    said: dict = {}
    for i, name in enumerate(draw(names), 1):
        profile = draw(device_profiles)
        keys = {"name": value(name)}
        vals = dict(PROFILES[profile].fields()) if profile else {}
        if profile:
            keys["profile"] = value(profile)
        for k in RANGES:
            if profile is None or draw(st.booleans()):
                vals[k] = draw(_num(k))
                keys[k] = value(vals[k])
        count = draw(st.integers(1, 3))
        if count > 1 or draw(st.booleans()):
            keys["count"] = value(count)
        samples = default
        if draw(st.booleans()):
            samples = draw(st.integers(1, 10**6))
            keys["samples"] = value(samples)
        where = f"[[device]] #{i} ({name!r})"
        sec = Section("[[device]]", keys, where)
        drifts = []
        # rounds apart: two drifts changing one field in one round are refused (which one was meant is a guess)
        for j, r in enumerate(draw(st.lists(st.integers(1, 20), max_size=2, unique=True))):
            change = ("up_mbps", draw(_num("up_mbps"))) if draw(st.booleans()) else ("rtt_scale", draw(st.floats(0, 1)))
            sec.drift.append(Section("[[device.drift]]", {"round": value(r), change[0]: value(change[1])},
                                     f"{where} drift #{j + 1}"))
            drifts.append({"round": r, change[0]: change[1]})
        sections.append(sec)
        said[name] = (vals, count, samples, drifts)
    return sections, said


def _text(sections: list[Section]) -> str:
    return "".join(s.text() + "".join(d.text() for d in s.drift) for s in sections)


@settings(max_examples=150)
@given(doc=fleets(), bom=st.booleans())
def test_a_valid_fleet_document_reads_back_as_written(doc: tuple[list[Section], dict], bom: bool) -> None:
    sections, said = doc
    fleet = parse_fleet(("\ufeff" if bom else "") + _text(sections), "f.toml")
    assert dict(fleet.kinds) == {n: c for n, (_, c, _, _) in said.items()}
    assert [c.name for c in fleet.clients] == [n if c == 1 else f"{n}-{j}" for n, (_, c, _, _) in said.items()
                                               for j in range(c)]
    for c in fleet.clients:
        vals, count, samples, drifts = said[c.kind]
        assert c.samples == samples and len(c.drift) == len(drifts)
        assert c.device.flops == vals["flops"] and c.device.memory == vals["memory_mb"] * MIB
        assert c.link.up == mbps(vals["up_mbps"]) and c.link.down == mbps(vals["down_mbps"])
        assert c.link.rtt == vals["rtt_ms"] / 1e3
        now = dict(vals)
        for d in sorted(drifts, key=lambda d: d["round"]):  # what at_round makes of the drift said
            now["up_mbps"] = d.get("up_mbps", now["up_mbps"])
            now["rtt_ms"] *= d.get("rtt_scale", 1.0)
        late = c.at_round(20)
        assert math.isclose(late.link.up, mbps(now["up_mbps"])) and math.isclose(late.link.rtt, now["rtt_ms"] / 1e3)


def _bad_values(key: str) -> list[str]:
    """TOML text of values ``key`` refuses: the wrong type, or out of its range."""
    wrong_type = ['"12"', "true", "[1]", "{ a = 1 }", "1979-05-27"]
    if key in ("count", "samples", "round"):
        return [*wrong_type, "2.0", "0", "-1", *([str(MAX_CLIENTS + 1)] if key == "count" else [])]
    if key in ("name", "profile"):
        return ["3", "true", "[1]", '""', *(['"rp i4"', '"rpi"'] if key == "profile" else ['"a b"'])]
    if key.endswith("_scale"):
        return [*wrong_type, "nan", "inf", "-1", "1e10"]
    lo, hi, _ = RANGES[key]
    return [*wrong_type, "nan", "inf", "-inf", "-1", f"{hi * 10:g}", *(["0"] if lo > 0 else [])]


@st.composite
def bad_fleets(draw: st.DrawFn) -> tuple[str, str, str]:
    """A fleet document with one bad field: its text, where the refusal must name and the key it must name."""
    sections, _ = draw(fleets())
    devices = [s for s in sections if s.header == "[[device]]"]
    places = sections + [d for s in devices for d in s.drift]
    sec = draw(st.sampled_from(places))
    allowed = {"top level": ["samples", "name"], "[edge]": ["profile", "flops", "memory_mb", *RANGES],
               "[cloud]": ["profile", "flops", "memory_mb"]}
    if sec.header == "[[device]]":
        keys = ["name", "profile", "count", "samples", *RANGES]
    elif sec.header == "[[device.drift]]":
        keys = ["round", "flops", "up_mbps", "down_mbps", "rtt_ms", "flops_scale", "up_scale", "rtt_scale"]
    else:
        keys = allowed[sec.where]
    kind = draw(st.sampled_from(["value", "unknown", "clash"] if sec.header == "[[device]]" and len(devices) > 1
                                else ["value", "unknown"]))
    where = sec.where
    if kind == "unknown":
        key = draw(st.sampled_from(["flopz", "Count", "memory", "up-mbps", "drift_round", "kind"]))
        sec.keys[key] = "1"
    elif kind == "clash":  # another entry's name and a number: one of that entry's clients
        key = "name"
        other = draw(st.sampled_from([d for d in devices if d is not sec]))
        new = f"{json.loads(other.keys['name'])}-{draw(st.integers(0, 99))}"
        sec.keys["name"] = value(new)  # refused at the later of the two
        where = sec.where.split(" (")[0] + f" ({new!r})" if devices.index(sec) > devices.index(other) else other.where
    else:
        key = draw(st.sampled_from(keys))
        sec.keys[key] = draw(st.sampled_from(_bad_values(key)))
        if key == "name" and sec.header == "[[device]]":
            where = sec.where.split(" (")[0]
        elif key == "name":
            where = "top level"
            sec.keys["name"] = draw(st.sampled_from(["3", '""', "[1]"]))
    return _text(sections), where, key


@settings(max_examples=300)
@given(bad=bad_fleets())
def test_one_bad_field_is_refused_naming_the_file_the_entry_and_the_key(bad: tuple[str, str, str]) -> None:
    text, where, key = bad
    with pytest.raises(ConfigError) as e:
        parse_fleet(text, "fleets/f.toml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"fleets/f.toml: {where}: "), (msg, where)
    assert f"'{key}'" in msg, (msg, key)


@pytest.mark.parametrize("name", ["pi\x1b[2J", "pi\u200b", "pi\x00", "pi\x7f", "a b", "pi\xa0x"],
                         ids=["escape", "zero-width-space", "nul", "del", "space", "no-break-space"])
def test_a_device_name_that_cannot_be_printed_as_it_is_is_refused(name: str) -> None:
    """A name is printed raw in the progress line (``moved 1: client0 (pi-0) ...``): before, ``pi\\x1b[2J`` loaded
    and cleared the user's terminal each round; ``pi\\u200b`` loaded beside ``pi``, another device looking the same."""
    _refused(EDGE + f"[[device]]\nname = {value(name)}\nprofile = 'rpi4'\n",
             r"^f\.toml: \[\[device\]\] #1: 'name' must be a non-empty string without spaces or control characters, "
             r"got '.+'$")


def test_a_device_name_in_any_script_loads() -> None:
    assert [c.name for c in parse_fleet(EDGE + _dev("téléphone") + _dev("手机"), "f.toml").clients] == ["téléphone", "手机"]


def test_a_fleet_without_a_cloud_asked_for_three_tiers_names_its_file(tmp_path: Path) -> None:
    """A fleet file's ``name`` may be any: before, /…/lab.toml saying ``name = "small"`` was refused as "fleet 'small'
    has no [cloud]", and the shipped fleet small has one."""
    path = tmp_path / "lab.toml"
    path.write_text('name = "small"\n[edge]\nprofile = "edge-server"\n' + _dev("pi"))
    fleet = load_fleet(path)
    with pytest.raises(ConfigError, match=rf"^fleet 'small' \({re.escape(str(path))}\) has no \[cloud\]"):
        fleet.servers(3)
    with pytest.raises(ConfigError, match=rf"^fleet 'small\[2\]' \({re.escape(str(path))}\) has no client 'pc'$"):
        fleet.sample(2).client("pc")


def test_a_fleet_path_that_is_no_regular_file_says_so(tmp_path):
    import os

    fifo = tmp_path / "fleet.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/null", str(fifo)):
        with pytest.raises(ConfigError, match=r"is not a regular file \(a device or a pipe\)"):
            load_fleet(path)
