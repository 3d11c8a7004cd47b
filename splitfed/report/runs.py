"""Run folders: what ``splitfed simulate`` and the experiment scripts write, read back as typed data.

A run folder holds ``metrics.jsonl`` (one JSON object per round) and, optionally,
``summary.json``. The reader is the one place that knows that format, so the
plots, the Markdown summary, the terminal table and the experiment scripts all
agree on what a round is. Required per round: ``round``, ``accuracy`` and
``sim_round_s`` (the cost model's makespan; a run without a simulated clock,
i.e. a deployment, writes ``null`` and its ``measured_round_s`` is used); ``loss``, ``wall_s``, ``bytes_up``,
``bytes_down`` and ``cuts`` (client -> cut vector, or a list in client order)
default to empty. Unknown keys are kept in :attr:`RoundRow.extra`.

Device classes (for "cuts per device class"): ``summary.json``'s ``classes``
mapping (client -> class; what a caller states wins), else a round's
``classes`` mapping, its ``profiles`` mapping or its ``per_client`` objects'
``profile`` (the fleet device the client simulates, ``pi-home-3``, whose class
is ``pi-home``), else the client name itself with a trailing ``-N`` removed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitfed.errors import ConfigError
from splitfed.flower.metrics import METRICS, SUMMARY, read_rows
from splitfed.jsonio import dumps, write_atomic, write_json

REQUIRED = ("round", "accuracy", "sim_round_s")
_KNOWN = {*REQUIRED, "loss", "wall_s", "bytes_up", "bytes_down", "cuts", "classes"}

Cuts = tuple[int, ...]


@dataclass(frozen=True)
class RoundRow:
    """One round of one run."""

    round: int
    accuracy: float
    sim_round_s: float
    loss: float = math.nan
    wall_s: float = math.nan
    bytes_up: int = 0
    bytes_down: int = 0
    cuts: Mapping[str, Cuts] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


@dataclass(frozen=True)
class Run:
    """A run's rounds (in round order), its summary, and each client's device class."""

    label: str
    rounds: tuple[RoundRow, ...]
    summary: Mapping[str, Any] = field(default_factory=dict)
    classes: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = None

    @property
    def sim_time(self) -> list[float]:
        """Simulated seconds elapsed at the end of each round."""
        return _cumsum(r.sim_round_s for r in self.rounds)

    @property
    def cum_bytes(self) -> list[float]:
        """Bytes on the wire (up + down) at the end of each round."""
        return _cumsum(r.bytes_total for r in self.rounds)

    @property
    def clients(self) -> list[str]:
        """Every client that had cuts in some round, grouped by device class, then by name."""
        seen: dict[str, None] = {}
        for r in self.rounds:
            seen.update(dict.fromkeys(r.cuts))
        return sorted(seen, key=lambda c: (self.class_of(c), _natural(c)))

    def class_of(self, client: str) -> str:
        return self.classes.get(client) or _strip_index(client)

    def time_to_target(self, target: float) -> float | None:
        """Simulated seconds until the global model first reaches ``target`` accuracy (None: never)."""
        for t, r in zip(self.sim_time, self.rounds, strict=True):
            if r.accuracy >= target:
                return t
        return None

    def rounds_to_target(self, target: float) -> int | None:
        for r in self.rounds:
            if r.accuracy >= target:
                return r.round
        return None

    @property
    def final(self) -> RoundRow:
        if not self.rounds:
            raise ConfigError(f"run {self.label!r} has no rounds")
        return self.rounds[-1]


# ---------------------------------------------------------------- reading


def parse_row(obj: Mapping[str, Any], where: str = "row") -> RoundRow:
    """One metrics object as a :class:`RoundRow`; a missing or mistyped field is named."""
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(repr(k) for k in missing)}")

    def num(key: str, default: float = math.nan) -> float:
        v = obj.get(key, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{where}: {key!r} must be a number, got {v!r}")
        return float(v)

    if obj.get("sim_round_s") is None and obj.get("measured_round_s") is not None:
        obj = {**obj, "sim_round_s": obj["measured_round_s"]}
    rnd = num("round")
    if not rnd.is_integer() or rnd < 0:
        raise ConfigError(f"{where}: 'round' must be a non-negative integer, got {obj['round']!r}")
    acc = num("accuracy")
    if not (math.isnan(acc) or 0 <= acc <= 1):  # null (a diverged round) reads as NaN and is kept
        raise ConfigError(f"{where}: 'accuracy' must be in [0, 1], got {obj['accuracy']!r}")
    for key in ("sim_round_s", "wall_s", "bytes_up", "bytes_down"):
        if num(key, 0) < 0:
            raise ConfigError(f"{where}: {key!r} must be >= 0, got {obj[key]!r}")
    return RoundRow(
        round=int(rnd), accuracy=num("accuracy"), sim_round_s=num("sim_round_s"), loss=num("loss"),
        wall_s=num("wall_s"), bytes_up=int(num("bytes_up", 0)), bytes_down=int(num("bytes_down", 0)),
        cuts=parse_cuts(obj.get("cuts", {}), where), extra={k: v for k, v in obj.items() if k not in _KNOWN},
    )


def parse_cuts(value: Any, where: str = "row") -> dict[str, Cuts]:
    """``{"client0": [2, 5]}`` or ``[[2, 5], ...]`` (clients ``"0"``, ``"1"``, ...) -> client -> cuts."""
    items: Iterable[tuple[str, Any]]
    if isinstance(value, Mapping):
        items = ((str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        raise ConfigError(f"{where}: 'cuts' must be an object (client -> cuts) or a list, got {value!r}")
    out: dict[str, Cuts] = {}
    for k, v in items:
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, list | tuple) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ConfigError(f"{where}: cuts of client {k!r} must be a list of integers, got {v!r}")
        out[k] = tuple(v)
    return out


def rows_to_run(rows: Sequence[Mapping[str, Any]], label: str = "run", summary: Mapping[str, Any] | None = None,
                path: Path | None = None) -> Run:
    """A :class:`Run` from metrics objects already in memory (what the simulate runner holds)."""
    parsed = sorted((parse_row(r, f"{label}: round object #{i + 1}") for i, r in enumerate(rows)),
                    key=lambda r: r.round)
    twice = sorted({a.round for a, b in zip(parsed, parsed[1:], strict=False) if a.round == b.round})
    if twice:  # one run writes each round once: two runs' rows in one file would add up wrong
        raise ConfigError(f"{label}: round(s) {', '.join(map(str, twice))} appear more than once "
                          "(rows of two runs in one metrics file?)")
    summary = dict(summary or {})
    return Run(label, tuple(parsed), summary, _classes(parsed, rows, summary), path)


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Read a run folder (or a ``metrics.jsonl`` file directly)."""
    p = Path(path)
    folder, metrics = (p.parent, p) if p.is_file() else (p, p / METRICS)
    if not metrics.is_file():
        what = "is not a run folder" if p.exists() else "does not exist"
        raise ConfigError(f"{p} {what}: no {METRICS} in it")
    rows = read_rows(metrics)  # a run still writing its last row: the rows before it
    summary: dict[str, Any] = {}
    sp = folder / SUMMARY
    if sp.is_file():
        try:
            summary = json.loads(sp.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{sp}: not valid JSON: {e.msg}") from None
        if not isinstance(summary, dict):
            raise ConfigError(f"{sp}: expected a JSON object")
    name = label or str(summary.get("label") or summary.get("name") or folder.resolve().name)
    try:
        run = rows_to_run(rows, name, summary, folder)
    except ConfigError as e:
        raise ConfigError(f"{metrics}: {e}") from None
    if not run.rounds:
        raise ConfigError(f"{metrics}: no rounds in it")
    return run


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Several run folders, labels made unique (a clash gets the parent folder's name prefixed)."""
    seen: dict[Path, str | Path] = {}
    for p in paths:
        key = Path(p).resolve()
        if key in seen:
            raise ConfigError(f"{p} is the same run as {seen[key]}: each run once")
        seen[key] = p
    runs = [load_run(p) for p in paths]
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    out = []
    for i, r in enumerate(runs):
        if counts[r.label] > 1:
            parent = r.path.resolve().parent.name if r.path else ""
            r = Run(f"{parent}/{r.label}" if parent else f"{r.label}#{i + 1}", r.rounds, r.summary, r.classes,
                    r.path)
        out.append(r)
    labels = [r.label for r in out]
    if len(set(labels)) != len(labels):
        out = [Run(f"{r.label}#{i + 1}", r.rounds, r.summary, r.classes, r.path) for i, r in enumerate(out)]
    return out


# ---------------------------------------------------------------- writing


def write_run(folder: str | Path, rows: Iterable[Mapping[str, Any]], summary: Mapping[str, Any] | None = None) -> Path:
    """Write a run folder in the format :func:`load_run` reads (every row is checked first)."""
    d = Path(folder)
    rows = list(rows)
    for i, r in enumerate(rows):
        parse_row(r, f"round object #{i + 1}")
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / METRICS, "".join(dumps(r, sort_keys=True) + "\n" for r in rows))
    if summary is not None:
        write_json(d / SUMMARY, summary, sort_keys=True, default=str)
    return d


# ---------------------------------------------------------------- internals


def _cumsum(values: Iterable[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def _strip_index(name: str) -> str:
    return re.sub(r"-\d+$", "", name)


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _classes(parsed: Sequence[RoundRow], raw: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in raw:
        if not isinstance(r, Mapping):
            continue
        per = r.get("per_client")
        if isinstance(per, Mapping):
            out.update({str(k): _strip_index(str(v["profile"])) for k, v in per.items()
                        if isinstance(v, Mapping) and v.get("profile")})
        prof = r.get("profiles")  # every client of the round, also those that failed
        if isinstance(prof, Mapping):
            out.update({str(k): _strip_index(str(v)) for k, v in prof.items() if v})
        rc = r.get("classes")
        if isinstance(rc, Mapping):
            out.update({str(k): str(v) for k, v in rc.items()})
    s = summary.get("classes")
    if isinstance(s, Mapping):
        out.update({str(k): str(v) for k, v in s.items()})
    return out
