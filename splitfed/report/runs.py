"""Run folders: what ``splitfed simulate`` and the experiment scripts write, read back as typed data.

A run folder holds ``metrics.jsonl`` (one JSON object per round) and, optionally,
``summary.json``. The reader is the one place that knows that format, so the
plots, the Markdown summary, the terminal table and the experiment scripts all
agree on what a round is. Required per round: ``round``, ``accuracy`` and
``sim_round_s`` (the cost model's makespan; a run without a simulated clock,
i.e. a deployment, writes ``null`` and its ``measured_round_s`` is used); ``loss``, ``wall_s``, ``bytes_up``,
``bytes_down`` (activations and gradients on the devices' links), ``device_weight_bytes`` ([to the devices,
back]: their weight exchange) and ``cuts`` (client -> cut vector, or a list in client order) default to empty. Unknown keys are kept in :attr:`RoundRow.extra`.

A run that stopped before its end has no ``summary.json`` (it is written last), and a
crash can cut the last line of ``metrics.jsonl`` short (the rows before it are read,
by :func:`splitfed.flower.metrics.read_rows_cut`): :attr:`Run.finished` and
:attr:`Run.cut_short` say so, and :func:`run_notes` puts it in words for the reader. Its
settings (mode, tiers...) are then those its checkpoint records (:attr:`Run.settings`,
:func:`splitfed.flower.checkpoint.recorded_settings`, read without torch).
:attr:`Run.status` says what became of the run, from the record a run of splitfed keeps
of its start and end (:func:`splitfed.flower.runstatus.status`): ``finished``,
``stopped``, ``failed``, ``running``, ``crashed``, ``unknown`` (no end recorded, run on
another host), ``unfinished`` (no summary, from a splitfed that did not record how a run
ended) or ``hand-made`` (metrics no run of splitfed wrote).

Device classes (for "cuts per device class"): ``summary.json``'s ``classes``
mapping (client -> class; what a caller states wins), else a round's
``classes`` mapping, its ``profiles`` mapping or its ``per_client`` objects'
``profile`` (the fleet device the client simulates, ``pi-home-3``, whose class
is ``pi-home``), else the client name itself with a trailing ``-N`` removed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from splitfed.errors import ConfigError
from splitfed.flower.checkpoint import recorded_settings
from splitfed.flower.metrics import METRICS, SUMMARY, read_rows_cut
from splitfed.jsonio import dumps, write_atomic, write_json

REQUIRED = ("round", "accuracy", "sim_round_s")
_KNOWN = {*REQUIRED, "loss", "wall_s", "bytes_up", "bytes_down", "device_weight_bytes", "cuts", "classes"}

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
    weight_bytes: int = 0  # the devices' weight exchange, both ways (``device_weight_bytes``)
    cuts: Mapping[str, Cuts] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


@dataclass(frozen=True)
class Run:
    """A run's rounds (in round order), its summary, and each client's device class.

    ``finished``: the run folder has its ``summary.json``; ``cut_short``: the last line of its
    ``metrics.jsonl`` was cut short and left out (both read from a folder; rows in memory are whole);
    ``status``: what became of the run (see the module docstring) and ``record``, the run's own record of
    it (pid, host, since, until, error or signal; {} for a folder without one)."""

    label: str
    rounds: tuple[RoundRow, ...]
    summary: Mapping[str, Any] = field(default_factory=dict)
    classes: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = None
    finished: bool = True
    cut_short: bool = False
    status: str = "finished"
    record: Mapping[str, Any] = field(default_factory=dict)
    # the settings its checkpoint records, read where the folder has no summary.json (a run stopped before its
    # end): {} for a folder with one, or without a checkpoint that says
    checkpoint_settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> Mapping[str, Any]:
        """The run's settings (mode, tiers, u_shape...): its summary's, else its checkpoint's, else {}."""
        s = self.summary.get("settings")
        return s if isinstance(s, Mapping) else self.checkpoint_settings

    @property
    def sim_time(self) -> list[float]:
        """Simulated seconds elapsed at the end of each round."""
        return _cumsum(r.sim_round_s for r in self.rounds)

    @property
    def cum_bytes(self) -> list[float]:
        """Bytes on the wire (up + down) at the end of each round."""
        return _cumsum(r.bytes_total for r in self.rounds)

    @property
    def weight_bytes(self) -> int:
        """The devices' weight exchange over the whole run, both ways."""
        return sum(r.weight_bytes for r in self.rounds)

    @property
    def clients(self) -> list[str]:
        """Every client that had cuts in some round, grouped by device class, then by name."""
        seen: dict[str, None] = {}
        for r in self.rounds:
            seen.update(dict.fromkeys(r.cuts))
        return sorted(seen, key=lambda c: (natural_key(self.class_of(c)), natural_key(c)))

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
        try:
            return float(v)
        except OverflowError:  # an integer past a float's range: a traceback, not a row's error
            raise ConfigError(f"{where}: {key!r} is out of range (over 1e308)") from None

    time_key = "sim_round_s"
    if obj.get("sim_round_s") is None and obj.get("measured_round_s") is not None:
        obj = {**obj, "sim_round_s": obj["measured_round_s"], MEASURED: True}  # run_notes says so
        time_key = "measured_round_s"
    if obj.get("sim_round_s") is None:  # a round without a time: every time after it (the axis, the time to a
        raise ConfigError(f"{where}: 'sim_round_s' is null and there is no 'measured_round_s': the round has no "
                          "time")  # target) would read NaN, a target reached shown as never
    if not math.isfinite(num("sim_round_s")):  # NaN (Python's json reads it) as null is; inf: every later time inf
        raise ConfigError(f"{where}: {time_key!r} must be a finite number of seconds, got {obj[time_key]!r}")
    rnd = num("round")
    if not rnd.is_integer() or rnd < 0:
        raise ConfigError(f"{where}: 'round' must be a non-negative integer, got {obj['round']!r}")
    acc = num("accuracy")
    if not (math.isnan(acc) or 0 <= acc <= 1):  # null (a diverged round) reads as NaN and is kept
        raise ConfigError(f"{where}: 'accuracy' must be in [0, 1], got {obj['accuracy']!r}")
    for key in ("sim_round_s", "wall_s", "bytes_up", "bytes_down"):
        if num(key, 0) < 0:
            raise ConfigError(f"{where}: {key!r} must be >= 0, got {obj[key]!r}")
    for key in ("bytes_up", "bytes_down"):  # counted as integers: NaN or inf stopped the report with a traceback
        if not math.isfinite(num(key, 0)):
            raise ConfigError(f"{where}: {key!r} must be a finite number of bytes, got {obj[key]!r}")
    weights = obj.get("device_weight_bytes") or [0, 0]
    if not (isinstance(weights, list) and len(weights) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in weights)):
        raise ConfigError(f"{where}: 'device_weight_bytes' must be [sent, received], two integers >= 0, got "
                          f"{_short(weights) if isinstance(weights, list) else repr(weights)[:80]}")
    return RoundRow(
        round=int(rnd), accuracy=num("accuracy"), sim_round_s=num("sim_round_s"), loss=num("loss"),
        wall_s=num("wall_s"), bytes_up=int(num("bytes_up", 0)), bytes_down=int(num("bytes_down", 0)),
        weight_bytes=sum(weights),
        cuts=parse_cuts(obj.get("cuts", {}), where), extra={k: v for k, v in obj.items() if k not in _KNOWN},
    )


MAX_CUT = 10_000  # more blocks than any model splitfed cuts has (the optimizer prices every pair of cuts)


def _short(v: Sequence[int]) -> str:
    text = repr(list(v))
    return text if len(text) <= 80 else text[:77] + "..."


def parse_cuts(value: Any, where: str = "row") -> dict[str, Cuts]:
    """``{"client0": [2, 5]}`` or ``[[2, 5], ...]`` (clients ``"0"``, ``"1"``, ...) -> client -> cuts."""
    items: Iterable[tuple[str, Any]]
    if isinstance(value, Mapping):
        items = ((text(k), v) for k, v in value.items())
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
        if not all(0 <= x <= MAX_CUT for x in v):  # a cut counts blocks; the heatmap has a colour per value
            raise ConfigError(f"{where}: cuts of client {k!r} must lie in 0..{MAX_CUT:,} (blocks before each cut), "
                              f"got {_short(v)}")
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
    return Run(text(label), tuple(parsed), summary, _classes(parsed, rows, summary), path)


def run_folder(path: str | Path) -> Path:
    """The run folder ``path`` names: itself, or the folder of a ``metrics.jsonl`` given directly."""
    p = Path(path)
    return p.parent if p.is_file() else p


def _runs_below(p: Path) -> str:
    """A hint for a folder that holds run folders (an experiment's ``--out``: its runs are in ``runs/``), where
    "not a run folder" alone left the user to find them."""
    if not p.is_dir():
        return ""
    below = sorted({m.parent.parent for m in [*p.glob(f"*/{METRICS}"), *p.glob(f"*/*/{METRICS}")]})
    globs = " ".join(f"{shlex.quote(str(d))}/*" for d in below)  # pasteable: the glob outside the quotes
    return f"; its run folders are below it: splitfed report {globs}" if below else ""


def load_run(path: str | Path, label: str | None = None, *, unstarted: bool = False) -> Run:
    """Read a run folder (or a ``metrics.jsonl`` file directly). A folder whose run is alive and has finished
    no round yet (no metrics, or none whole) is refused, saying so; with ``unstarted`` it is read as a run
    without rounds (a sweep's run still in round 1, which ``splitfed report`` shows as running)."""
    p = Path(path)
    folder = run_folder(p)
    metrics = p if p.is_file() else p / METRICS
    if not metrics.is_file():
        if p.is_dir():
            live = _live(folder)
            if live is not None:
                return _unstarted(folder, label or folder.resolve().name, live, unstarted)
        what = "is not a run folder" if p.exists() else "does not exist"
        raise ConfigError(f"{p} {what}: no {METRICS} in it{_runs_below(p)}")
    if p.is_file() and p.name == SUMMARY:  # read as metrics, its first line "{" is "not valid JSON"
        raise ConfigError(f"{p} is a run's summary, not its metrics: give the run folder ({folder}) or its {METRICS}")
    try:
        rows, cut_short = read_rows_cut(metrics)  # a run still writing its last row: the rows before it
    except OSError as e:  # unreadable (its mode, an I/O error): one line, not a traceback
        raise ConfigError(f"{metrics}: cannot read it: {e.strerror or e}") from None
    summary: dict[str, Any] = {}
    sp = folder / SUMMARY
    if sp.is_file():
        try:
            summary = json.loads(sp.read_text(encoding="utf-8"))
        except OSError as e:
            raise ConfigError(f"{sp}: cannot read it: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{sp}: not valid JSON: not UTF-8 text") from None
        except json.JSONDecodeError as e:  # where, as for a metrics row ("Unterminated string" alone says not)
            raise ConfigError(f"{sp}: not valid JSON: {e.msg}: line {e.lineno} column {e.colno}") from None
        except ValueError as e:  # json's own refusals past its grammar (an integer of over 4,300 digits)
            raise ConfigError(f"{sp}: not valid JSON: {str(e).split(';')[0]}") from None
        if not isinstance(summary, dict):
            raise ConfigError(f"{sp}: expected a JSON object")
    name = label or str(summary.get("label") or summary.get("name") or folder.resolve().name)
    try:
        run = rows_to_run(rows, name, summary, folder)
    except ConfigError as e:
        raise ConfigError(f"{metrics}: {e}") from None
    if not run.rounds:
        live = _live(folder)
        if live is not None:  # round 1 still being trained (or written: a line cut short)
            return replace(_unstarted(folder, name, live, unstarted), summary=summary, cut_short=cut_short)
        torn = " (its only line was cut short: a crash, or a round still being written)" if cut_short else ""
        raise ConfigError(f"{metrics}: no rounds in it{torn}")
    from splitfed.flower.runstatus import status

    st = status(folder)
    recorded = {} if isinstance(summary.get("settings"), dict) else recorded_settings(folder)
    return replace(run, finished=(folder / SUMMARY).is_file(), cut_short=cut_short, status=st.state,
                   record=dict(st.record), checkpoint_settings=recorded)


def _live(folder: Path) -> Mapping[str, Any] | None:
    """The record of the run alive in ``folder`` (running, or starting: :func:`splitfed.flower.runstatus.status`);
    None when none is: its folder without rounds is no run to report."""
    from splitfed.flower.runstatus import status

    st = status(folder)
    return dict(st.record) if st.state == "running" else None


def _unstarted(folder: Path, name: str, record: Mapping[str, Any], allowed: bool) -> Run:
    """The run alive in ``folder`` that has finished no round yet: a run without rounds where ``allowed``, else
    refused (:func:`no_round_yet`)."""
    run = Run(text(name), (), path=folder, finished=False, status="running", record=record)
    if not allowed:
        raise ConfigError(no_round_yet(run))
    return run


def no_round_yet(run: Run) -> str:
    """That ``run``, alive, has finished no round yet: what a report of it alone (or of such runs only) says."""
    doing = "is starting" if run.record.get("starting") else "is running"
    return f"{run.path or run.label} {doing} ({_process(run.record)}) and has finished no round yet"


def _process(record: Mapping[str, Any]) -> str:
    """``pid P on HOST, started SINCE`` from a run's record, each part it holds (a run still starting may not
    be named yet)."""
    parts = [f"pid {record['pid']}" if record.get("pid") else "", f"on {record['host']}" if record.get("host") else ""]
    said = " ".join(x for x in parts if x) or "a process that has not said which"
    return f"{said}, started {record['since']}" if record.get("since") else said


MEASURED = "sim_round_s_is_measured"  # a row's marker: no simulated clock, its measured round time stands in


def clock_of(runs: Sequence[Run]) -> str:
    """What the runs' times are, for headers and axes: ``sim`` (the cost model's clock), ``measured`` (a
    deployment, which has none: its measured round times stand in) or ``sim/measured`` (both kinds)."""
    measured = {any(r.extra.get(MEASURED) for r in run.rounds) for run in runs if run.rounds}  # (none: no clock)
    return "sim/measured" if len(measured) > 1 else "measured" if measured == {True} else "sim"


def run_notes(run: Run) -> list[str]:
    """What a reader of the run's numbers must be told: how it ended if not finished (stopped, failed,
    crashed), that it is still running, or that it did not finish (without a record of how), that the
    last line of its metrics was cut short and left out, and that its metrics and its summary count other
    rounds. One line each; none for a whole, finished run."""
    where = run.path if run.path is not None else run.label
    notes = []
    ended = _ended_note(run, where)
    if ended:
        notes.append(ended)
    if run.cut_short:
        notes.append(f"{Path(where) / METRICS}: its last line was cut short (a crash, or a round still being "
                     "written) and is left out")
    rounds = _rounds_note(run, where)
    if rounds:
        notes.append(rounds)
    if any(r.extra.get(MEASURED) for r in run.rounds):
        notes.append(f"{where} has no simulated clock (a deployment): its times (the time columns and axes) "
                     "are the measured round times")
    return notes


def _ended_note(run: Run, where: str | Path) -> str:
    n = len(run.rounds)
    rounds = f"{n} round{'' if n == 1 else 's'}"
    rec = run.record
    process = _process(rec)
    if run.status == "running":  # or a run starting there (a resume's Ray): the rounds are the run's before
        doing = ("is starting again" if run.rounds else "is starting") if rec.get("starting") else "is still running"
        return f"{where} {doing} ({process}): {rounds} so far"
    if run.status == "stopped":
        signal = str(rec.get("signal") or "")
        reason = str(rec.get("reason") or "")  # a stop no signal caused (its output closed)
        by = " by Ctrl-C (SIGINT)" if signal == "SIGINT" else f" by {signal}" if signal else \
            f" ({reason})" if reason else ""
        return f"{where} was stopped{by} at {rec.get('until')}, before its end ({rounds} kept)"
    if run.status == "failed":
        error = " ".join(str(rec.get("error")).split())  # one line, as every note
        return f"{where} failed at {rec.get('until')}: {error} ({rounds} kept)"
    if run.status == "crashed":
        return (f"{where} crashed: its process ({process}) is gone and recorded no end (killed, e.g. by SIGKILL "
                f"or for lack of memory, or the machine went down) ({rounds} kept)")
    if run.status == "unknown":  # an older splitfed's run recorded no end, whichever it had
        ended = "crashed there" if "process" in rec else "ended there without recording how"
        return (f"{where} has no {SUMMARY} and no record of its end: it is still running on {rec.get('host')} "
                f"(pid {rec.get('pid')}), or {ended} ({rounds} kept)")
    if run.status == "unfinished":
        return (f"{where} has no {SUMMARY}: it did not finish (stopped, failed or crashed: the splitfed that "
                f"ran it did not record which) ({rounds} kept)")
    if not run.finished and run.status == "finished":  # its record says so: the summary went after the end
        at = f" at {rec['until']}" if rec.get("until") else ""
        return f"{where} has no {SUMMARY}, though its run recorded that it finished{at}: the summary was removed since"
    if not run.finished:  # hand-made without a summary
        return f"{where} has no {SUMMARY}: it did not finish, or is still running ({rounds} kept)"
    return ""


def _rounds_note(run: Run, where: str | Path) -> str:
    """That the summary of a finished run counts other rounds than its metrics hold (rows lost, or cut short,
    after the end): the report's numbers are the metrics', not those the run ended with."""
    said, n = run.summary.get("rounds"), len(run.rounds)
    if run.status != "finished" or isinstance(said, bool) or not isinstance(said, int) or said == n:
        return ""
    return (f"{where}: its {SUMMARY} counts {said} round{'' if said == 1 else 's'} but its {METRICS} holds {n}: "
            "the file was changed after the run ended; the numbers here are of the rounds it holds")


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Several run folders, labels made unique (:func:`unique_labels`)."""
    seen: dict[Path, str | Path] = {}
    for p in paths:
        # a folder and its metrics.jsonl are one run; any other file is itself (two stray files in a folder are
        # not one run twice: the reader names the first as no run)
        key = (run_folder(p) if Path(p).name == METRICS else Path(p)).resolve()
        if key in seen:
            raise ConfigError(f"{p} is the same run as {seen[key]}: each run once")
        seen[key] = p
    runs = []
    for p in paths:
        try:  # of several (a sweep's runs/*), one still in round 1 is a row without numbers: it is running
            runs.append(load_run(p, unstarted=len(paths) > 1))
        except ConfigError as e:  # one run of many (a glob over an experiment's runs): the way past it
            if len(paths) == 1:
                raise
            raise ConfigError(f"{e} (leave it out to report the other {len(paths) - 1})") from None
    if not any(r.rounds for r in runs):  # several, each alive in round 1: nothing to draw or sum up yet
        raise ConfigError(f"{'; '.join(no_round_yet(r) for r in runs)}: report them once one has finished a round")
    labels = unique_labels([r.label for r in runs], [r.path or Path(r.label) for r in runs])
    return [r if r.label == label else replace(r, label=text(label))  # told apart by folders that may not be UTF-8
            for r, label in zip(runs, labels, strict=True)]


def unique_labels(labels: Sequence[str], folders: Sequence[Path]) -> list[str]:
    """``labels`` with those that clash told apart by the shortest end of their folders' paths that differs
    (``a/runs/adaptive``, ``b/runs/adaptive``; ``fast (f1)``, ``fast (f2)`` where only the folder names
    differ); a label that clashes with none is left as it is. Experiment scripts write every run to
    ``OUT/runs/LABEL``, so a parent folder's name alone rarely tells two runs apart."""
    out = list(labels)
    counts = Counter(labels)
    for label in (label for label, n in counts.items() if n > 1):
        where = [i for i, x in enumerate(labels) if x == label]
        parts = [Path(os.path.abspath(folders[i])).parts[1:] or (label,) for i in where]
        others = set(labels) - {label}
        for k in range(1, max(map(len, parts)) + 1):
            names = [_told_apart(label, p, k) for p in parts]
            if len(set(names)) == len(names) and not others & set(names):
                break
        for i, name in zip(where, names, strict=True):
            out[i] = name
    used = {x for x, old in zip(out, labels, strict=True) if x == old}
    for i, (x, old) in enumerate(zip(out, labels, strict=True)):  # last resort: two paths that end alike
        if x == old:
            continue
        n, name = 1, x
        while name in used:
            n += 1
            name = f"{x}#{n}"
        used.add(name)
        out[i] = name
    return out


def _told_apart(label: str, parts: Sequence[str], k: int) -> str:
    """``label`` named by the last ``k`` parts of its folder's path (the last part being the folder itself);
    the whole path, from ``/``, when it has no more parts (``/a`` against ``/b/a``)."""
    if k == 1:
        return f"{label} ({parts[-1]})"
    return ("/" if k > len(parts) else "") + "/".join([*parts[-k:-1], label])


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


def text(value: Any) -> str:
    """``value`` as a label that every output can hold: a lone surrogate (a folder name that is not UTF-8, or
    a ``\\udcff`` in JSON) as its escape, where it would stop the figures (matplotlib) and the CSV (UTF-8)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _cumsum(values: Iterable[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def _strip_index(name: str) -> str:
    return re.sub(r"-\d+$", "", name)


def natural_key(name: str) -> tuple:
    """Sort key: runs of ASCII digits as numbers (``pi-2`` before ``pi-10``); ``str.isdigit`` also takes
    ``¹``, which ``int`` refuses (a label of it stopped the report). The one key for names shown in order: the
    heatmap's rows, the class table's, the progress line's moved clients."""
    return tuple(int(p) if p.isascii() and p.isdigit() else p for p in re.split(r"([0-9]+)", name))


def _classes(parsed: Sequence[RoundRow], raw: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in raw:
        if not isinstance(r, Mapping):
            continue
        per = r.get("per_client")
        if isinstance(per, Mapping):
            out.update({text(k): _strip_index(text(v["profile"])) for k, v in per.items()
                        if isinstance(v, Mapping) and v.get("profile")})
        prof = r.get("profiles")  # every client of the round, also those that failed
        if isinstance(prof, Mapping):
            out.update({text(k): _strip_index(text(v)) for k, v in prof.items() if v})
        rc = r.get("classes")
        if isinstance(rc, Mapping):
            out.update({text(k): text(v) for k, v in rc.items()})
    s = summary.get("classes")
    if isinstance(s, Mapping):
        out.update({text(k): text(v) for k, v in s.items()})
    return out
