"""Fleets: the clients (devices, or device classes with counts) and the shared edge and cloud.

A fleet file is TOML::

    name = "small"              # optional
    samples = 500               # optional default local dataset size
    [edge]                      # shared by every client
    profile = "edge-server"     # optional named profile; explicit keys override it
    flops = 3.2e12              # effective FLOP/s
    memory_mb = 16384           # MiB
    up_mbps = 1000              # edge -> cloud link (needed when there is a [cloud])
    down_mbps = 1000
    rtt_ms = 20
    [cloud]
    profile = "cloud-gpu"       # or flops, memory_mb
    [[device]]
    name = "phone"
    profile = "phone-mid"       # optional; flops, memory_mb, up_mbps, down_mbps, rtt_ms override
    count = 10                  # optional: 10 clients "phone-0" .. "phone-9"
    samples = 400               # optional local dataset size
    [[device.drift]]            # optional: from round 5 on (rounds count from 1)
    round = 5
    up_scale = 0.1              # multiply (flops_scale, up_scale, down_scale, rtt_scale) ...
    # rtt_ms = 200              # ... or set (flops, up_mbps, down_mbps, rtt_ms)

Unknown keys and impossible values are refused with the file, entry and key named; so is a fleet of
more than :data:`MAX_CLIENTS` clients (counts added up), which would exhaust memory before anything ran,
and a number outside its field's physical range (:data:`RANGES`; drift included, as it compounds). A name says
one device: an entry may not be named as another entry's client (``phone-3`` beside ``phone``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from splitfed import tomlio
from splitfed.engine.limits import MAX_CLIENTS
from splitfed.errors import ConfigError, nearest, unknown_key
from splitfed.fleets import shipped_fleets
from splitfed.profile.devices import PROFILES, DeviceProfile, LinkProfile, TierProfile, mbps
from splitfed.units import MIB

_LINK = ("up_mbps", "down_mbps", "rtt_ms")
_TOP_KEYS = {"name", "description", "samples", "edge", "cloud", "device"}
_EDGE_KEYS = {"profile", "flops", "memory_mb", *_LINK}
_CLOUD_KEYS = {"profile", "flops", "memory_mb"}
_DEVICE_KEYS = {"name", "profile", "flops", "memory_mb", *_LINK, "count", "samples", "drift"}
_DRIFT_SET = ("flops", "up_mbps", "down_mbps", "rtt_ms")
_DRIFT_SCALE = {"flops_scale": "flops", "up_scale": "up_mbps", "down_scale": "down_mbps", "rtt_scale": "rtt_ms"}
_DRIFT_KEYS = {"round", *_DRIFT_SET, *_DRIFT_SCALE}
DEFAULT_SAMPLES = 500
MAX_SAMPLES = 10**12  # one device's local dataset: beyond any device's; samples x epochs stays exact in a float

# The range of each number a fleet file gives, in file units, and why. Outside it a value is a typo or a
# unit mix-up, not a device; inside it every internal figure (bytes, bytes/s, seconds of a round) stays
# finite and normal: memory_mb = 1e308 was inf bytes (every cut fitted), up_mbps = 1e-320 overflowed a
# division (and the refusal then blamed server memory), flops = 5e-324 did the same.
RANGES: dict[str, tuple[float, float, str]] = {  # key: (low, high, "unit (why)")
    "flops": (1.0, 1e20, "FLOP/s (1e20 is ~50x the fastest supercomputer)"),
    "memory_mb": (1e-6, 1e9, "MiB (1e-6 MiB is ~1 byte; 1e9 MiB, ~1 PiB, is 1000x any one machine)"),
    "up_mbps": (1e-6, 1e9, "Mbit/s (1 bit/s to 1 Pbit/s)"),
    "down_mbps": (1e-6, 1e9, "Mbit/s (1 bit/s to 1 Pbit/s)"),
    "rtt_ms": (0.0, 1e7, "ms (1e7 ms is ~3 hours; Earth to Mars and back is under 45 minutes)"),
}


def in_range(value: float, key: str) -> bool:
    """Whether ``value`` (file units) is one a fleet file accepts for ``key`` (:data:`RANGES`): also how a
    node's own measurement of itself is judged before the plan believes it."""
    lo, hi, _ = RANGES[key]
    return math.isfinite(value) and lo <= value <= hi


SCALE_RANGE = (1e-9, 1e9)  # a drift factor (rtt_scale may be 0); what it makes must stay in RANGES too


@dataclass(frozen=True)
class Drift:
    """From ``round`` on, set some of a device's numbers (file units) and scale others."""

    round: int
    set: tuple[tuple[str, float], ...] = ()
    scale: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Client:
    """One device of the fleet; ``kind`` is the fleet entry (device class) it came from."""

    name: str
    kind: str
    device: TierProfile
    link: LinkProfile
    samples: int
    drift: tuple[Drift, ...] = ()

    def at_round(self, r: int) -> Client:
        """This client with every drift of rounds <= r applied (in round order)."""
        vals = {"flops": self.device.flops, "up_mbps": self.link.up * 8 / 1e6,
                "down_mbps": self.link.down * 8 / 1e6, "rtt_ms": self.link.rtt * 1e3}
        changed = False
        for d in sorted(self.drift, key=lambda d: d.round):
            if d.round > r:
                break
            changed = True
            for k, v in d.set:
                vals[k] = v
            for k, v in d.scale:
                vals[k] *= v
        if not changed:
            return self
        return replace(self, device=TierProfile(vals["flops"], self.device.memory),
                       link=_link(vals), drift=tuple(d for d in self.drift if d.round > r))


@dataclass(frozen=True)
class Fleet:
    """The clients and the shared server tiers; ``edge_link`` joins edge and cloud."""

    name: str
    edge: TierProfile
    clients: tuple[Client, ...]
    cloud: TierProfile | None = None
    edge_link: LinkProfile | None = None
    source: str = ""
    description: str = ""
    kinds: Mapping[str, int] = field(default_factory=dict)  # entry -> count, in file order

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for c in self.clients:
            if c.name in seen:
                raise ConfigError(f"{self.source or self.name}: two clients are named {c.name!r}")
            seen.add(c.name)
        if not self.clients:
            raise ConfigError(f"{self.source or self.name}: the fleet has no [[device]]")

    def said(self) -> str:
        """The fleet for a message: its name and its file (a fleet file's ``name`` may be any, a shipped one's too)."""
        return f"fleet {self.name!r}" + (f" ({self.source})" if self.source else "")

    def servers(self, tiers: int) -> tuple[tuple[TierProfile, ...], tuple[LinkProfile, ...]]:
        """The shared tiers of a chain of ``tiers`` (device first) and the links between them.

        2 tiers: device -> edge (the device's link is its link to the edge).
        3 tiers: device -> edge -> cloud.
        """
        if tiers == 2:
            return (self.edge,), ()
        if tiers == 3:
            if self.cloud is None or self.edge_link is None:
                raise ConfigError(f"{self.said()} has no [cloud] (and edge link): use 2 tiers")
            return (self.edge, self.cloud), (self.edge_link,)
        raise ConfigError(f"tiers must be 2 or 3, got {tiers}")

    def at_round(self, r: int) -> Fleet:
        """The fleet as it is in round ``r`` (drift applied)."""
        return replace(self, clients=tuple(c.at_round(r) for c in self.clients))

    def drifts_after(self, rounds: int) -> dict[str, int]:
        """Each device entry (``kind``) with a drift that a run of ``rounds`` rounds never reaches -> the first such
        drift's round, earliest first: what a run shorter than the fleet's story leaves out (a fleet serves runs of
        any length)."""
        late: dict[str, int] = {}
        for c in self.clients:
            r = min((d.round for d in c.drift if d.round > rounds), default=None)
            if r is not None:
                late[c.kind] = min(r, late.get(c.kind, r))
        return dict(sorted(late.items(), key=lambda kr: (kr[1], kr[0])))

    def client(self, name: str) -> Client:
        for c in self.clients:
            if c.name == name:
                return c
        raise ConfigError(f"{self.said()} has no client {name!r}")

    def sample(self, n: int, seed: int = 0) -> Fleet:
        """``n`` clients dealt from the fleet's devices (:func:`deal`): ``n`` equal to the fleet's size trains the
        fleet as listed, fewer a subset of it, more each device as often as it goes into ``n`` and the rest of a
        subset. A client is named after its entry (``pi-home-0``, ``pi-home-1``...), in the fleet's order."""
        if not 1 <= n <= MAX_CLIENTS:
            raise ConfigError(f"sample size must be in 1..{MAX_CLIENTS:,} (MAX_CLIENTS), got {n:,}")
        counter = dict.fromkeys((c.kind for c in self.clients), 0)
        out = []
        for c, times in zip(self.clients, deal(len(self.clients), n, seed), strict=True):
            for _ in range(times):
                out.append(replace(c, name=f"{c.kind}-{counter[c.kind]}"))
                counter[c.kind] += 1
        return replace(self, clients=tuple(out), name=f"{self.name}[{n}]",
                       kinds={k: v for k, v in counter.items() if v})


def deal(size: int, n: int, seed: int) -> list[int]:
    """How many of ``n`` clients each of a fleet's ``size`` devices gets: ``n // size`` each, and one more for
    ``n % size`` of them drawn without replacement by ``seed``. A fleet file lists the devices a user means, so
    ``--clients`` equal to its size must train exactly those (a draw with replacement trained 3 of one class and
    none of another); the seed picks only the part that does not divide evenly."""
    whole, part = divmod(n, size)
    times = [whole] * size
    for i in np.random.default_rng(seed).choice(size, size=part, replace=False) if part else ():
        times[int(i)] += 1
    return times


# ---------------------------------------------------------------- writing


def device_entry(name: str, device: DeviceProfile, notes: Mapping[str, str] | None = None) -> str:
    """One ``[[device]]`` entry of a fleet file (what :func:`parse_fleet` reads back), each number
    followed by its ``notes`` (where it came from) as a comment."""
    notes = notes or {}
    values = {"flops": device.flops, "memory_mb": device.memory_mb, "up_mbps": device.up_mbps,
              "down_mbps": device.down_mbps, "rtt_ms": device.rtt_ms}
    lines = ["[[device]]", f"name = {tomlio.value(name)}"]
    for key, v in values.items():
        if v is None:
            continue
        text = f"{key} = {float(v):.6g}"
        lines.append(f"{text:<28}# {notes[key]}" if key in notes else text)
    entry = "\n".join(lines) + "\n"
    parse_fleet("[edge]\nflops = 1e12\nmemory_mb = 1024\n" + entry, source=f"device entry {name!r}")  # reads back
    return entry


# ---------------------------------------------------------------- parsing


def load_fleet(path: str | Path) -> Fleet:
    """Read a fleet file, or a shipped fleet by name (:func:`shipped_fleets`)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"fleet {str(path)!r} is a folder, not a fleet file")
    if p.exists() and not p.is_file():  # /dev/null, a pipe: not "no such file" (a pipe's read would wait)
        raise ConfigError(f"fleet {str(path)!r} is not a regular file (a device or a pipe), not a fleet file")
    if not p.is_file():
        shipped = resources.files("splitfed") / "fleets" / f"{path}.toml"
        if not shipped.is_file():
            raise ConfigError(f"fleet {str(path)!r}: no such file, and no shipped fleet of that name "
                              f"(shipped: {', '.join(shipped_fleets())})")
        return parse_fleet(shipped.read_text(), source=f"{path}.toml")
    return parse_fleet(tomlio.read_text(p, "fleet file"), source=str(p))


DEALT = "dealt:"  # a checkpoint's digest of the run's clients as dealt; without it, of the fleet file (older runs)


def fleet_digest(path: str | Path) -> str:
    """The sha256 of the devices and tiers a fleet file says, as read (not its bytes: a comment changes
    nothing). Checkpoints written before the clients were dealt kept this one (:func:`dealt_digest`)."""
    return _digest(load_fleet(path))


def dealt_digest(fleet: Fleet) -> str:
    """What a checkpoint keeps of a run's fleet: the sha256 of its clients as dealt (:meth:`Fleet.sample`) and
    its tiers, marked :data:`DEALT`. A resume whose clients would be other devices than the rounds before it
    were simulated and cut on (the fleet file changed, or a splitfed that deals otherwise) is refused."""
    return DEALT + _digest(fleet)


def _digest(fleet: Fleet) -> str:
    import hashlib
    import json
    from dataclasses import asdict

    said = {k: v for k, v in asdict(fleet).items() if k not in ("name", "source", "description")}
    return hashlib.sha256(json.dumps(said, sort_keys=True, default=str).encode()).hexdigest()


def parse_fleet(text: str, source: str = "<fleet>") -> Fleet:
    doc = tomlio.parse(text, source)
    _keys(doc, _TOP_KEYS, source, "top level")
    default_samples = _int(doc, "samples", source, "top level", default=DEFAULT_SAMPLES, most=MAX_SAMPLES)
    name = _printed(doc.get("name", Path(source).stem), "name", source, "top level")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{source}: top level: 'description' must be a string")  # never printed: any text

    if "edge" not in doc:
        raise ConfigError(f"{source}: missing [edge] table")
    edge_d = _table(doc["edge"], source, "[edge]")
    _keys(edge_d, _EDGE_KEYS, source, "[edge]")
    has_cloud = "cloud" in doc
    edge_v = _resolved(edge_d, source, "[edge]", need_link=has_cloud, link_to="[cloud]")
    edge = TierProfile(edge_v["flops"], edge_v["memory_mb"] * MIB)
    cloud = edge_link = None
    if has_cloud:
        cloud_d = _table(doc["cloud"], source, "[cloud]")
        _keys(cloud_d, _CLOUD_KEYS, source, "[cloud]")
        cloud_v = _resolved(cloud_d, source, "[cloud]", need_link=False)
        cloud = TierProfile(cloud_v["flops"], cloud_v["memory_mb"] * MIB)
        edge_link = _link(edge_v)

    devices = doc.get("device")
    if devices is None:
        raise ConfigError(f"{source}: no [[device]] entries")
    if not isinstance(devices, list):
        raise ConfigError(f"{source}: 'device' must be an array of tables ([[device]])")
    clients: list[Client] = []
    kinds: dict[str, int] = {}
    entries: dict[str, str] = {}  # entry name -> where it is
    numbered: dict[str, str] = {}  # "pi" -> "pi-3": an earlier entry named as a client of a later "pi"
    total = 0
    for i, d in enumerate(devices, 1):
        where = f"[[device]] #{i}"
        d = _table(d, source, where)
        if "name" not in d:
            raise ConfigError(f"{source}: {where}: missing 'name'")
        dname = _printed(d["name"], "name", source, where, spaces=False)  # a client's name, one word
        where = f"[[device]] #{i} ({dname!r})"
        if (clash := _name_clash(dname, entries, numbered)) is not None:
            raise ConfigError(f"{source}: {where}: 'name' {dname!r} {clash}: rename one (a name says one device)")
        entries[dname] = where
        if (m := _NUMBERED.fullmatch(dname)) is not None:
            numbered.setdefault(m[1], dname)
        _keys(d, _DEVICE_KEYS, source, where)
        v = _resolved(d, source, where, need_link=True)
        count = _int(d, "count", source, where, default=1)
        total += count
        if total > MAX_CLIENTS:  # refused before any client is made: 10**8 of them exhaust memory
            raise ConfigError(f"{source}: {where}: 'count' {_shown(count)} brings the fleet to {_shown(total)} "
                              f"clients, more than the {MAX_CLIENTS:,} splitfed holds (MAX_CLIENTS): lower 'count'")
        samples = _int(d, "samples", source, where, default=default_samples, most=MAX_SAMPLES)
        drift = _drifts(d.get("drift", []), source, where, v)
        base = Client(dname, dname, TierProfile(v["flops"], v["memory_mb"] * MIB), _link(v), samples, drift)
        kinds[dname] = count
        if count == 1:
            clients.append(base)
        else:
            clients.extend(replace(base, name=f"{dname}-{j}") for j in range(count))
    return Fleet(name, edge, tuple(clients), cloud, edge_link, source, description, kinds)  # names: _name_clash


_NUMBERED = re.compile(r"(.+)-(?:0|[1-9][0-9]*)")  # an entry's clients: its name, "-" and a number (str(int))


def _name_clash(name: str, entries: Mapping[str, str], numbered: Mapping[str, str]) -> str | None:
    """Why an entry may not be called ``name`` beside the earlier ``entries`` (name -> where), or None.

    An entry ``pi`` names its clients ``pi-0``, ``pi-1``, ... (by its count, and whatever its count when a run
    draws clients from the fleet), so an entry ``pi-1`` beside it is ambiguous: a node's ``device-profile``
    ``pi-1`` was priced as a client of ``pi``, silently. ``numbered`` maps ``pi`` to an earlier ``pi-N``."""
    if name in entries:
        return f"is used by an earlier device, {entries[name]}"
    if (m := _NUMBERED.fullmatch(name)) is not None and m[1] in entries:
        return (f"is also the name of a client of {entries[m[1]]} (its clients are {m[1]}-0, {m[1]}-1, ...: "
                f"two clients are named {name!r})")
    if name in numbered:
        return f"would name its clients {name}-0, {name}-1, ..., and {entries[numbered[name]]} is one of them"
    return None


def _printed(v: Any, key: str, source: str, where: str, spaces: bool = True) -> str:
    """``v``, a fleet string printed as it is (a device's name in progress lines and reports, the fleet's name in
    optimize's header): an escape (ESC [2J) in it acts on the terminal, a zero-width space passes for another name."""
    if not isinstance(v, str) or not v or not v.isprintable() or (" " in v and not spaces):
        raise ConfigError(f"{source}: {where}: {key!r} must be a non-empty string without "
                          f"{'' if spaces else 'spaces or '}control characters, got {_shown(v)}")
    return v


def _link(v: Mapping[str, float]) -> LinkProfile:
    return LinkProfile(mbps(v["up_mbps"]), mbps(v["down_mbps"]), v["rtt_ms"] / 1e3)


def _table(d: Any, source: str, where: str) -> dict:
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: {where} must be a table")
    return d


def _keys(d: Mapping[str, Any], allowed: set[str], source: str, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise unknown_key(k, allowed, f"{source}: {where}")


def _int(d: Mapping[str, Any], key: str, source: str, where: str, default: int, most: int | None = None) -> int:
    if key not in d:
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{source}: {where}: {key!r} must be an integer >= 1, got {_shown(v)}")
    if most is not None and v > most:
        raise ConfigError(f"{source}: {where}: {key!r} must be an integer from 1 to {most:,}, got {_shown(v)}")
    return v


def _shown(v: Any) -> str:
    """``v`` for a message; an integer of hundreds of digits as ~1.23e+400 (its ``repr`` is a line of
    digits, and past 4300 digits ``repr`` raises)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**15:
        e = int(math.log10(abs(v)))
        e -= abs(v) < 10**e  # log10 rounds up just below a power of ten
        lead = abs(v) // 10 ** (e - 2)
        return f"~{'-' if v < 0 else ''}{lead / 100:g}e+{e}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else repr(v)


def _num(v: Any, key: str, source: str, where: str, bounds: tuple[float, float, str], zero_ok: bool = False) -> float:
    """``v`` as a float: a number (not a bool), finite, > 0 (>= 0 with ``zero_ok``) and within ``bounds``
    (low, high, why), else a one-line refusal naming the file, entry, key and range."""
    want = ">= 0" if zero_ok else "> 0"
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{source}: {where}: {key!r} must be a finite number {want}, got {v!r}")
    try:
        f = float(v)
    except OverflowError:  # an integer beyond any float (1 and 400 zeros): math.isfinite raised on it
        f = math.inf if v > 0 else -math.inf
    if math.isnan(f) or (isinstance(v, float) and math.isinf(f)) or not (f >= 0 if zero_ok else f > 0):
        raise ConfigError(f"{source}: {where}: {key!r} must be a finite number {want}, got {_shown(v)}")
    if not bounds[0] <= f <= bounds[1]:
        lo, hi, why = bounds
        raise ConfigError(f"{source}: {where}: {key!r} must be in [{lo:g}, {hi:g}] {why}, got {_shown(v)}")
    return f


def _resolved(d: Mapping[str, Any], source: str, where: str, need_link: bool, link_to: str = "") -> dict[str, float]:
    """Profile fields overridden by explicit ones, every number checked; ``link_to`` names the tier a missing link
    key joins (the edge's link is needed because the fleet has a [cloud], whatever tiers a command then uses)."""
    vals: dict[str, float] = {}
    if "profile" in d:
        pname = d["profile"]
        if not isinstance(pname, str):  # a list or table: `in PROFILES` raised "unhashable type"
            raise ConfigError(f"{source}: {where}: 'profile' must be a string naming a device profile "
                              f"(known: {', '.join(PROFILES)}), got {type(pname).__name__} {pname!r}")
        if pname not in PROFILES:
            near = nearest(pname, PROFILES)
            raise ConfigError(f"{source}: {where}: 'profile' {pname!r} is unknown ("
                              + (f"did you mean {near!r}? " if near else "") + f"known: {', '.join(PROFILES)})")
        vals.update(PROFILES[pname].fields())
    for k in ("flops", "memory_mb", *_LINK):
        if k in d:
            vals[k] = _num(d[k], k, source, where, RANGES[k], zero_ok=(k == "rtt_ms"))
    need = ["flops", "memory_mb", *(_LINK if need_link else ())]
    for k in need:
        if k not in vals:
            link = f" (its link to {link_to}: give it, or a 'profile' that has it, or drop {link_to})" \
                if link_to and k in _LINK else " (give it, or a 'profile' that has it)"
            raise ConfigError(f"{source}: {where}: missing {k!r}{link}")
    return vals


def _drifts(items: Any, source: str, where: str, base: Mapping[str, float]) -> tuple[Drift, ...]:
    if not isinstance(items, list):
        raise ConfigError(f"{source}: {where}: 'drift' must be an array of tables ([[device.drift]])")
    out: list[Drift] = []
    for j, d in enumerate(items, 1):
        w = f"{where} drift #{j}"
        d = _table(d, source, w)
        _keys(d, _DRIFT_KEYS, source, w)
        if "round" not in d:
            raise ConfigError(f"{source}: {w}: missing 'round' (the first round it applies to, from 1)")
        r = _int(d, "round", source, w, default=1)
        sets = tuple((k, _num(d[k], k, source, w, RANGES[k], zero_ok=(k == "rtt_ms"))) for k in _DRIFT_SET if k in d)
        scales = tuple((f, _num(d[k], k, source, w, _scale_range(k), zero_ok=(k == "rtt_scale")))
                       for k, f in _DRIFT_SCALE.items() if k in d)
        if not sets and not scales:
            raise ConfigError(f"{source}: {w}: changes nothing (give one of "
                              f"{', '.join(sorted(_DRIFT_KEYS - {'round'}))})")
        both = next(((f, k) for k, f in _DRIFT_SCALE.items() if k in d and f in d), None)
        if both is not None:  # set, then scaled (up_mbps = 1 and up_scale = 0.1 gave 0.1), as in two tables
            raise ConfigError(f"{source}: {w}: changes {both[0]!r} twice in round {r} ({both[0]!r} and {both[1]!r}): "
                              "give one drift per field and round")
        seen = next(((k, i) for i, e in enumerate(out, 1) if e.round == r
                     for k in sorted({f for f, _ in (*e.set, *e.scale)} & {f for f, _ in (*sets, *scales)})), None)
        if seen is not None:  # which one the user meant is not ours to guess (a later one won, or they compounded)
            raise ConfigError(f"{source}: {w}: changes {seen[0]!r} in round {r}, as drift #{seen[1]} does: give one "
                              "drift per field and round")
        out.append(Drift(r, sets, scales))
    _check_drifted(out, base, source, where)
    return tuple(out)


def _scale_range(key: str) -> tuple[float, float, str]:
    lo, hi = SCALE_RANGE
    return (0.0 if key == "rtt_scale" else lo), hi, "(a factor; what it gives must stay in range too)"


def _check_drifted(drifts: list[Drift], base: Mapping[str, float], source: str, where: str) -> None:
    """Apply the drifts as :meth:`Client.at_round` does (round order, sets then scales) and refuse one that
    takes a value out of its range: scales compound, so each factor in range is not enough."""
    vals = dict(base)
    order = sorted(range(len(drifts)), key=lambda j: drifts[j].round)
    for j in order:
        d = drifts[j]
        for k, v in d.set:
            vals[k] = v
        for k, v in d.scale:
            vals[k] *= v
            lo, hi, why = RANGES[k]
            if not lo <= vals[k] <= hi:
                key = next(s for s, f in _DRIFT_SCALE.items() if f == k)
                raise ConfigError(f"{source}: {where} drift #{j + 1}: {key!r} brings {k!r} to {vals[k]:.3g} "
                                  f"from round {d.round} on, outside [{lo:g}, {hi:g}] {why}")
