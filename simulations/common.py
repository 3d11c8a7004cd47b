"""What every experiment script shares: its command line, its config file, its output folder.

Each script is ``python -m simulations.NAME --config FILE.toml --out DIR``. It
declares its settings as a frozen dataclass; :func:`load_config` reads the TOML
file into it (unknown keys and wrong types refused with the file and key named,
so a typo never silently runs the default experiment). :func:`main` is the one
entry point: it parses the command line, reads the config, makes the output
folder, runs the experiment, and prints where the results are.

Training goes through :func:`train`: by default the simulate runner's Python
API (Flower's simulation engine and gRPC tier servers, exactly ``splitfed
simulate``), or ``backend = "inprocess"``, the same rounds in one process for
smoke tests and quick looks. Either writes a run folder (``metrics.jsonl``,
``summary.json``) that is read back with :mod:`splitfed.report.runs` and drawn
with :mod:`splitfed.report.plots`. The cost-model-only scripts build a
:class:`~splitfed.cost.Scenario` with :func:`scenario`.
"""

from __future__ import annotations

import argparse
import contextvars
import csv
import dataclasses
import io
import json
import math
import os
import shutil
import signal
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from splitfed import jsonio, tomlio
from splitfed.cli import line_buffered
from splitfed.errors import ConfigError, SplitfedError, Terminated, unknown_key

C = TypeVar("C")
CONFIGS = Path(__file__).resolve().parent / "configs"
# the folder of the config file load_config is reading: a TrainingConfig's relative paths are looked up there
_FOLDER: contextvars.ContextVar[Path | None] = contextvars.ContextVar("config_folder", default=None)
RESULTS = "results.json"
RUNS = "runs"  # each training run's own run folder, under the output folder
MARK = ".experiment"  # in RUNS: the name of the experiment whose runs these are (before its results.json)
OUTPUTS = (RESULTS, "results.csv", "summary.md", RUNS)  # what an experiment writes (and figures, *.png)
# figures are an experiment's beside these: results.csv too, which the cost-model sweep writes before its figures
# and results.json (stopped while drawing, it left results.csv and figures alone)
OWNS_FIGURES = frozenset({RESULTS, "results.csv", RUNS})


# ---------------------------------------------------------------- config files


def load_config(path: str | Path, cls: type[C]) -> C:
    """Read a TOML file into the dataclass ``cls`` (top-level keys are its fields); a :class:`TrainingConfig`
    looks up its relative file paths beside the file first (:func:`base_settings`)."""
    p = Path(path)
    data = tomlio.parse(tomlio.read_text(p, "config file"), f"config file {p}")
    token = _FOLDER.set(p.parent)
    try:
        return config_from_mapping(data, cls, str(p))
    finally:
        _FOLDER.reset(token)


def config_from_mapping(data: Mapping[str, Any], cls: type[C], source: str = "config") -> C:
    """``data`` (hyphen or underscore keys) as ``cls``; each value checked against the field's type."""
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for raw, v in data.items():
        key = raw.replace("-", "_")
        if key not in names:
            raise unknown_key(raw, names, source)
        values[key] = _coerce(v, hints[key], f"{source}: {raw}")
    try:
        return cls(**values)
    except (TypeError, ValueError, ConfigError) as e:
        raise ConfigError(f"{source}: {e}") from None


def _coerce(v: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(v, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {v!r}")
    if origin in (tuple, list):
        if not isinstance(v, list):
            raise ConfigError(f"{where}: expected a list, got {v!r}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(x, args[0], f"{where}[{i}]") for i, x in enumerate(v))
        if origin is tuple:
            if len(v) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} values, got {len(v)}")
            return tuple(_coerce(x, a, f"{where}[{i}]") for i, (x, a) in enumerate(zip(v, args, strict=True)))
        return [_coerce(x, args[0], f"{where}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise ConfigError(f"{where}: expected a table, got {v!r}")
        return dict(v)
    if typ is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{where}: expected true or false, got {v!r}")
        return v
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{where}: expected an integer, got {v!r}")
        return v
    if typ is float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{where}: expected a number, got {v!r}")
        return float(v)
    if typ is str:
        if not isinstance(v, str):
            raise ConfigError(f"{where}: expected a string, got {v!r}")
        return v
    return v


# ---------------------------------------------------------------- outputs


def write_json(path: str | Path, obj: Any) -> Path:
    return jsonio.write_json(path, obj, default=_jsonable)


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows of flat dicts as CSV; the header is the union of keys in first-seen order. Replaced in one step (as
    results.json is): a write stopped part way (Ctrl-C, a full disk) left half a table, rows missing unseen."""
    header: dict[str, None] = {}
    for r in rows:
        header.update(dict.fromkeys(r))
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=list(header))
    w.writeheader()
    for r in rows:
        w.writerow({k: _csv_value(v) for k, v in r.items()})
    return jsonio.write_atomic(path, text.getvalue())


def write_results(out: Path, records: Sequence[Mapping[str, Any]], series: Sequence[str] = ()) -> Path:
    """``out/results.csv``: one row per run, without the per-round series (those are in results.json)."""
    drop = {"accuracy", "sim_round_s", *series}
    return write_csv(out / "results.csv", [{k: v for k, v in r.items() if k not in drop} for r in records])


def _csv_value(v: Any) -> Any:
    """A cell of results.csv as ``splitfed report``'s CSV files write one (``csv_cell``): text that would start a
    spreadsheet formula led by ``'``, a missing or non-finite number (a diverged run's accuracy) empty, where it
    was ``nan``, text to a spreadsheet, beside ``null`` in results.json."""
    from splitfed.report.summary import csv_cell, csv_text

    if isinstance(v, list | tuple):
        return csv_text(",".join(map(str, v)))
    if isinstance(v, Mapping):  # a policy's options: as its entry writes them, "hysteresis=0.2 regime-jump=5"
        return csv_text(" ".join(f"{str(k).replace('_', '-')}={x:g}" if isinstance(x, float) else f"{k}={x}"
                                 for k, x in v.items()))
    return csv_cell(v)


def as_written(v: Any) -> Any:
    """A config's values with each non-finite number as TOML spells it (``inf``, ``-inf``, ``nan``): strict
    JSON (:mod:`splitfed.jsonio`) writes it as null, which in a measurement says "no number" but in a config
    reads as "not set" (``solve_time_limit_s = inf`` is no limit, not the default 60 s)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
    if isinstance(v, Mapping):
        return {k: as_written(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [as_written(x) for x in v]
    return v


def _jsonable(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    if isinstance(v, Path):
        return str(v)
    if hasattr(v, "tolist"):  # numpy arrays and scalars (not .item: an array has it, for one element only)
        return v.tolist()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


# ---------------------------------------------------------------- shared building blocks


def scenario(model: str, fleet: Any, tiers: int, batch: int) -> Any:
    """The cost model's scenario of ``fleet`` (a :class:`~splitfed.profile.Fleet`) training ``model``."""
    from splitfed.cost import Scenario
    from splitfed.models.zoo import resolve_spec
    from splitfed.profile import profile_model

    return Scenario.from_fleet(profile_model(resolve_spec(model), batch=batch), fleet, tiers=tiers, batch=batch)


BACKENDS = ("flower", "inprocess")
_EXPERIMENT_OWN = ("out", "resume", "overwrite")  # set by train() for each run


@dataclass(frozen=True)
class TrainingConfig:
    """What every training experiment's config has: ``[simulate]`` (the runs' shared
    :class:`~splitfed.flower.config.RunSettings`) and the backend that trains them."""

    simulate: dict[str, Any] = field(default_factory=dict)
    backend: str = "flower"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for key in self.simulate:
            if key.replace("-", "_") in _EXPERIMENT_OWN:  # would be ignored: say so rather than drop it
                raise ValueError(f"[simulate] {key}: an experiment gives each run a folder of its own under "
                                 "--out; remove the key")
        # the folder of the config file it is read from (load_config), where its relative paths are looked up
        object.__setattr__(self, "_folder", _FOLDER.get())
        self.settings()  # a bad [simulate] key or value is refused when the file is read

    def settings(self) -> Any:
        """``[simulate]`` as :class:`~splitfed.flower.config.RunSettings`."""
        return base_settings(self.simulate, folder=getattr(self, "_folder", None))


def check_target(value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"target_accuracy must be in (0, 1], got {value}")


def train(settings: Any, out: Path, label: str, backend: str = "flower") -> Any:
    """One training run into run folder ``out``, read back as a :class:`~splitfed.report.runs.Run`.

    ``settings`` is a :class:`splitfed.flower.config.RunSettings`. ``flower``: the simulate
    runner (Flower's simulation engine, tier servers over gRPC), exactly what
    ``splitfed simulate`` runs. ``inprocess``: the same rounds without Flower or
    gRPC (:func:`splitfed.sim.inprocess.train_inprocess`), for smoke tests and quick looks.
    """
    check_cases([(label, settings)], backend)
    return _train_checked(settings, out, label, backend)


def _train_checked(settings: Any, out: Path, label: str, backend: str) -> Any:
    """:func:`train` of settings :func:`check_cases` has passed (each case is checked once)."""
    from splitfed.report.runs import load_run

    settings = settings.with_(out=str(out), overwrite=True)  # the experiment's own folder: a rerun replaces it
    mark = out.parent / MARK
    if _NAME.get() and out.parent.name == RUNS and not mark.is_file():
        # whose runs these are: another experiment's --resume is refused before this one's results.json is there
        out.parent.mkdir(parents=True, exist_ok=True)
        jsonio.write_atomic(mark, json.dumps({"experiment": _NAME.get()}))
    if _RESUME.get():
        if _finished(settings, out):
            print(f"  [{label}] kept: its {settings.rounds} round(s) in {out}", flush=True)
            return load_run(out, label=label)
        if backend == "flower" and (out / "checkpoint.pt").is_file():
            settings = settings.with_(resume=True, overwrite=False)  # refused if its math differs (server.app)
    print(f"  [{label}] {backend}: cuts={settings.cuts} mode={settings.mode} compress={settings.compress} "
          f"{'continues in' if settings.resume else '->'} {out}", flush=True)
    if backend == "flower":
        from splitfed.sim.runner import simulate

        simulate(settings, progress=lambda line: print(f"  [{label}] {line}", flush=True))
    else:
        from splitfed.sim.inprocess import train_inprocess

        train_inprocess(settings, progress=lambda line: print(f"  [{label}] {line}", flush=True))
    _label_run(out, label)
    return load_run(out, label=label)


def _finished(settings: Any, out: Path) -> bool:
    """Whether ``out`` holds this run finished: its summary, of as many rounds (:func:`_check_same`: one that
    ran other math is refused)."""
    summary = _check_same(settings, out)
    return summary is not None and summary.get("rounds") == settings.rounds


def _check_same(settings: Any, out: Path) -> dict[str, Any] | None:
    """The summary of the run in ``out`` (None: none to read), refused, in simulate's words, if it ran with other
    math than ``settings``: ``--resume`` keeps the runs that finished, and one resumed with another config was
    trained over, unsaid."""
    from server.app import RESUMABLE
    from splitfed.flower.config import RunSettings, absolute_paths
    from splitfed.report.runs import SUMMARY

    try:
        summary = json.loads((out / SUMMARY).read_text())
        # as simulate compares a checkpoint's: defaults filled in, files named alike
        before = absolute_paths(RunSettings.from_mapping(summary["settings"], source=str(out / SUMMARY))).to_dict()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError):
        return None
    now = absolute_paths(settings).to_dict()
    changed = [k for k, v in now.items() if k not in RESUMABLE and before[k] != v]
    if changed:
        raise ConfigError(f"run {out}: cannot resume with different " + ", ".join(
            f"{k.replace('_', '-')} ({before[k]!r} -> {now[k]!r})" for k in changed)
            + ": --resume with the config it ran with, or give another --out, or --overwrite to start over")
    return dict(summary)


def _label_run(out: Path, label: str) -> None:
    """Name the run in its ``summary.json``, so ``splitfed report`` on the folder shows the label."""
    from splitfed.report.runs import SUMMARY

    path = out / SUMMARY
    summary = json.loads(path.read_text()) if path.is_file() else {}
    jsonio.write_json(path, {**summary, "label": label}, sort_keys=True)  # whole or not at all: the run's summary


def config_fleet(fleet: str, folder: Path | None, where: str) -> str:
    """A config's ``fleet``: from the current folder, else the first of the config's folder and
    ``simulations/configs`` that holds it, else a shipped fleet's name (:func:`~splitfed.flower.config.fleet_beside`;
    found nowhere: refused naming the config's folder)."""
    from splitfed.flower.config import fleet_beside

    folders = _config_folders(folder)
    return fleet_beside(fleet, next((f for f in folders if (f / fleet).is_file()), folders[0]), where)


def _config_folders(folder: Path | None) -> list[Path]:
    """Where a config's relative paths are looked for after the current folder: its own, then the shipped configs'."""
    return [f for f in (folder, CONFIGS) if f is not None]


def config_folder() -> Path | None:
    """The folder of the config file being read (:func:`load_config`), where its relative paths are looked up."""
    return _FOLDER.get()


def base_settings(table: Mapping[str, Any], source: str = "", folder: Path | None = None) -> Any:
    """A config's ``[simulate]`` table as :class:`~splitfed.flower.config.RunSettings` (keys as in ``splitfed simulate``).

    A ``fleet`` or ``dataset`` path that is not a file from here is looked up beside the config (``folder``), as
    ``splitfed simulate --config`` looks (:func:`~splitfed.flower.config.fleet_beside`,
    :func:`~splitfed.flower.config.dataset_beside`), then under ``simulations/configs/``: before, only there,
    so a config's own fleet was missed for a shipped file of that name. A table without
    ``cuts`` takes simulate's default for its tiers (:func:`~splitfed.flower.config.default_cuts`): ``tiers = 2``
    alone was refused for the 3-tier default's two cuts, which simulate does not give it.
    """
    from splitfed.flower.config import RunSettings, dataset_beside, default_cuts

    where = f"{source} [simulate]".strip()
    folders = _config_folders(folder)
    if isinstance(fleet := table.get("fleet"), str):
        table = {**table, "fleet": config_fleet(fleet, folder, where)}
    if "dataset" in table:  # so is a dataset's file or folder (absolute: a run's settings name it wherever read)
        here = dataset_beside(table["dataset"])  # from the current folder: what a folder that holds it changes
        table = {**table, "dataset": next((d for d in (dataset_beside(table["dataset"], f) for f in folders)
                                           if d != here), here)}
    settings = RunSettings.from_mapping(table, source=where)
    if "cuts" not in table:  # as splitfed simulate: the default's are for 3 tiers, 2 or a U-shape take theirs
        settings = settings.with_(cuts=default_cuts(settings.tiers, settings.u_shape))
    return settings


def best_static_cuts(settings: Any) -> tuple[int, ...]:
    """The single cut vector of least round-1 makespan for the run's clients (the optimizer's ``best_static``).

    Priced in the cost model's view of the registered clients that ``--cuts adaptive``
    and ``--cuts greedy`` plan with: the same devices and sample counts as the run's clock.
    """
    from splitfed.flower.adaptive import scenario
    from splitfed.optimizer import best_static
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.inprocess import sim_clients

    clients = sim_clients(settings, fleet_for(settings))
    return best_static(scenario(settings, clients)).assignment[clients[0].client_id]


def resolve_policy(policy: str, settings: Any) -> tuple[str, str]:
    """(label, ``--cuts`` value) of a policy; ``static:best`` becomes the cost model's best single cut vector."""
    if policy == "static:best":
        cuts = ",".join(map(str, best_static_cuts(settings)))
        return f"best static ({cuts})", f"static:{cuts}"
    return policy, policy


@dataclass(frozen=True)
class Policy:
    """One entry of an experiment's ``policies``, resolved: what the user wrote, what figures call it, the
    settings its run trains with, and the label of the run that trains its cuts."""

    written: str  # as the config says it: "static:best"
    label: str  # as figures and tables name it: "best static (0,7)"
    settings: Any  # RunSettings, ``static:best`` resolved to its cut vector
    trained_as: str  # its own label, or that of an earlier entry whose cuts it resolved to
    options: Mapping[str, Any] = field(default_factory=dict)  # the settings the entry sets: {"hysteresis": 0.2}


def policy_options(written: str, settings: Any) -> tuple[str, Any, dict[str, Any]]:
    """A ``policies`` entry's ``--cuts`` value, ``settings`` with the adaptive policy's settings it gives
    (``KEY=VALUE`` words after the value, :data:`~splitfed.flower.config.ADAPTIVE_SETTINGS`: one experiment then
    compares ways of adapting on the same runs), and those (name -> value, as checked).
    Refused, naming the entry: a word that is no ``KEY=VALUE``, another key, a key given twice, a value its
    setting refuses, and any of them on a static or greedy policy (which never move their cuts)."""
    from splitfed.flower.config import ADAPTIVE_SETTINGS, RunSettings
    from splitfed.flower.policy import policy_name

    where = f"policies entry {written!r}"
    kind = (written.split() or [""])[0].partition(":")[0]
    if kind == "static":  # its cut vectors may hold spaces ("static:0, 7"); it takes no setting
        if "=" in written:
            raise ConfigError(f"{where}: a static policy never moves its cuts: the adaptive policy's settings "
                              "(KEY=VALUE) are not its")
        return written, settings, {}
    cuts, *words = written.split() or [written]
    given: dict[str, str] = {}
    keys = [k.replace("_", "-") for k in ADAPTIVE_SETTINGS]
    for word in words:
        key, eq, value = word.partition("=")
        name = key.replace("-", "_")
        if not eq or not key or not value:
            raise ConfigError(f"{where}: {word!r} is not KEY=VALUE (after the cuts, a setting of the adaptive "
                              f"policy: {', '.join(keys)})")
        if name not in ADAPTIVE_SETTINGS:
            if name in {f.name for f in dataclasses.fields(RunSettings)}:  # lr=0.1: every run's, not a policy's
                raise ConfigError(f"{where}: {key} is not the adaptive policy's to set: it is the same for every "
                                  f"run, in the config's [simulate] table (an entry sets {', '.join(keys)})")
            raise unknown_key(key, keys, where)
        if name in given:
            raise ConfigError(f"{where}: {key.replace('_', '-')} is given twice: give it once")
        given[name] = value
    if given and policy_name(cuts)[0] == "greedy":
        named = [k.replace("_", "-") for k in given]
        raise ConfigError(f"{where}: {' and '.join(named)} {'sets' if len(named) == 1 else 'set'} how the adaptive "
                          f"policy moves cuts; {cuts} never moves them")
    if not given:
        return cuts, settings, {}
    mine = RunSettings.layered([(given, where)], settings)
    return cuts, mine, {name: getattr(mine, name) for name in given}


def resolve_policies(policies: Sequence[str], settings: Any) -> list[Policy]:
    """Each of ``policies`` resolved (:func:`resolve_policy`, :func:`policy_options`). An entry whose cuts only
    resolving shows to be an earlier one's (``static:best`` is ``static:0,7`` for this fleet, which no one can
    see in the config) trains once and is recorded under both labels; the same cuts written twice are refused,
    naming both entries, and so is an adaptive entry whose settings are another's (a default written out)."""
    from splitfed.flower.config import ADAPTIVE_SETTINGS

    out: list[Policy] = []
    same: dict[Any, list[Policy]] = {}  # what each entry assigns -> the entries before it that assign it
    for written in policies:
        cuts, mine, options = policy_options(written, settings)
        label, cuts = resolve_policy(cuts, mine)
        if options:  # named by what it sets, as checked: "adaptive hysteresis=0.2"
            label += "".join(f" {k.replace('_', '-')}={v:g}" for k, v in options.items())
        how = tuple(getattr(mine, k) for k in ADAPTIVE_SETTINGS)
        earlier = same.setdefault((_assignment(cuts), how), [])
        if any(e.written == written for e in earlier):
            raise ConfigError(f"policies lists {written!r} twice: list it once")
        spelled = next((e for e in earlier if "static:best" not in (e.written, written)), None)
        if spelled is not None:
            what = "cuts" if not (options or spelled.options) else "policy and settings"
            raise ConfigError(f"policies: {written!r} and {spelled.written!r} are the same {what}: list them once")
        if earlier:
            entry = Policy(written, label, earlier[0].settings, earlier[0].label, options)
            print(f"  {written}: the same cuts as {earlier[0].written} ({earlier[0].settings.cuts}): trained "
                  "once, recorded under both", flush=True)
        else:
            entry = Policy(written, label, mine.with_(cuts=cuts), label, options)
        earlier.append(entry)
        out.append(entry)
    return out


def _assignment(cuts: str) -> Any:
    """What a ``--cuts`` value assigns, whatever its spelling: static cut vectors as numbers, else the name and
    argument (a value that does not parse is itself: :func:`check_cases` refuses it, naming its entry)."""
    from splitfed.flower.policy import parse_static, policy_name

    name, arg = policy_name(cuts)
    if name == "static":
        try:
            return name, tuple(parse_static(arg))
        except ConfigError:
            pass
    return name, arg.strip()


def trained_cases(entries: Sequence[Policy]) -> list[tuple[str, Any]]:
    """The ``(label, settings)`` of the runs ``entries`` need, each once (for :func:`run_cases`)."""
    return [(e.label, e.settings) for e in entries if e.trained_as == e.label]


def shown_runs(entries: Sequence[Policy], runs: Mapping[str, Any]) -> list[Any]:
    """The runs trained (``runs``: by label), each once, named by every entry it holds ("best static (0,7) =
    static:0,7"): the figures and summary.md draw one curve per run, and show every label asked for."""
    names: dict[str, list[str]] = {}
    for e in entries:
        names.setdefault(e.trained_as, []).append(e.label)
    return [dataclasses.replace(runs[t], label=" = ".join(labels)) for t, labels in names.items()]


def policy_record(entry: Policy, run: Any, target: float | None = None) -> dict[str, Any]:
    """One entry's record in ``results.json``: ``policy`` as the config wrote it, ``label`` as figures name it,
    ``cuts`` as its run trained, ``same_run_as`` the label of the entry whose run it shares (null: its own),
    ``options`` the adaptive policy's settings it gives (:func:`policy_options`), and its run's numbers
    (:func:`run_record`)."""
    return {"policy": entry.written, "label": entry.label, "cuts": entry.settings.cuts,
            "same_run_as": None if entry.trained_as == entry.label else entry.trained_as, "options": dict(entry.options),
            **{k: v for k, v in run_record(run, target).items() if k != "label"}}


def run_cases(cases: Sequence[tuple[str, Any]], out: Path, backend: str) -> list[Any]:
    """Train each ``(label, settings)`` into ``out/runs/<label>``; the runs, in order. Every case is checked
    before the first trains: a typo in the last policy must not cost the minutes of the ones before it."""
    from splitfed.report.plots import slug

    check_cases(cases, backend)
    if _RESUME.get():  # a finished run of other math is refused before any run trains
        for label, settings in cases:
            _check_same(settings, out / RUNS / slug(label))
    runs = []
    for label, settings in cases:
        runs.append(_train_checked(settings, out / RUNS / slug(label), label, backend))
    return runs


def check_cases(cases: Sequence[tuple[str, Any]], backend: str) -> None:
    """Refuse, before anything trains, what one of ``cases`` would fail on when its turn came, and two cases
    that would train into one folder."""
    from splitfed.report.plots import slug
    from splitfed.sim.inprocess import check_inprocess
    from splitfed.sim.runner import validate

    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    seen: dict[str, str] = {}
    for label, settings in cases:
        if slug(label) in seen and seen[slug(label)] == label:
            raise ConfigError(f"{label!r} is given twice: each run needs a folder of its own; list it once")
        if slug(label) in seen:  # told apart only past a folder name's 60 characters, or by what it cannot hold
            raise ConfigError(f"{label!r} and {seen[slug(label)]!r} would train into one folder, "
                              f"{RUNS}/{slug(label)}: each run needs a folder of its own; tell them apart sooner")
        seen[slug(label)] = label
        try:
            mine = settings.with_(out="", resume=False, overwrite=False)  # the folder is train()'s
            if backend == "inprocess":
                check_inprocess(mine)
            validate(mine)
        except SplitfedError as e:
            raise type(e)(f"{label}: {e}") from None


def report_runs(runs: Sequence[Any], out: Path, target: float | None = None, title: str = "") -> dict[str, str]:
    """The standard figures and ``summary.md`` of ``runs`` in ``out`` (what ``splitfed report`` makes)."""
    from splitfed.report.plots import standard_plots
    from splitfed.report.summary import summary_markdown, summary_rows
    from splitfed.report.table import format_table

    images = standard_plots(runs, out, target)
    jsonio.write_atomic(out / "summary.md", summary_markdown(runs, target, {k: p.relative_to(out)
                                                                           for k, p in images.items()},
                                                             title=title or "results"))
    print(format_table(*summary_rows(runs, target)), flush=True)
    return {k: recorded(p) for k, p in images.items()}


def recorded(path: str | Path) -> str:
    """A run's folder or a figure as ``results.json`` names it: absolute, symbolic links resolved, since it is
    read from other folders than the one the experiment ran in (before, figures were relative to that one)."""
    return str(Path(path).resolve())


def run_record(run: Any, target: float | None = None) -> dict[str, Any]:
    """One run's headline numbers for ``results.json`` (as ``splitfed report`` counts them)."""
    from splitfed.report.summary import best_accuracy

    rec: dict[str, Any] = {
        # absolute: results.json and results.csv are read from other folders than the one the experiment ran in
        "label": run.label, "path": None if run.path is None else recorded(run.path),
        "rounds": len(run.rounds),
        "final_accuracy": run.final.accuracy, "best_accuracy": best_accuracy(run),
        "sim_time_s": run.sim_time[-1], "mean_round_s": run.sim_time[-1] / len(run.rounds),
        "bytes_up": sum(r.bytes_up for r in run.rounds), "bytes_down": sum(r.bytes_down for r in run.rounds),
        "weight_bytes": run.weight_bytes,  # the devices' weight exchange, both ways
        "accuracy": [r.accuracy for r in run.rounds], "sim_round_s": [r.sim_round_s for r in run.rounds],
    }
    if target is not None:
        rec["time_to_target_s"] = run.time_to_target(target)
        rec["rounds_to_target"] = run.rounds_to_target(target)
    return rec


# ---------------------------------------------------------------- the command line


def main(name: str, config_cls: type[C], experiment: Callable[[C, Path], Mapping[str, Any]],
         argv: Sequence[str] | None = None, doc: str | None = None, runs: bool = True) -> int:
    """``python -m simulations.NAME [--config FILE] [--out DIR]``: run, write, print the folder (each line
    as it is printed, to a pipe or file as well). ``runs``: whether the experiment trains runs (into
    ``out/runs``), which ``--resume`` continues; one that trains none (the cost-model sweep) refuses it."""
    line_buffered()
    parser = argparse.ArgumentParser(prog=f"python -m simulations.{name}", description=doc)
    parser.add_argument("--config", default=str(CONFIGS / f"{name}.toml"),
                        help=f"TOML config (default: simulations/configs/{name}.toml)")
    parser.add_argument("--out", default=None, help=f"output folder (default: runs/simulations/{name})")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results the --out folder holds (without it, such a folder is refused)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the experiment the --out folder holds, stopped part way: its finished runs "
                             "are kept, a stopped one continues from its checkpoint (Flower backend; the in-process "
                             "one starts it again), the rest train" if runs else argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.resume and not runs:  # it keeps no runs: output_folder would only refuse the folder it left
        parser.error(f"--resume: {name} trains no runs to continue (it prices the cost model): run it again, "
                     "with --overwrite to replace what it wrote")
    if args.out is not None and not args.out.strip():
        parser.error("--out is empty: name a folder, or leave --out out for the default")
    if args.resume and args.overwrite:
        parser.error("--resume continues the experiment in --out, --overwrite replaces it: give one")
    _threads()
    out = Path(args.out or Path("runs") / "simulations" / name)
    prog = f"simulations.{name}"
    try:
        with _interrupts():
            cfg = load_config(args.config, config_cls)
            with output_folder(out, args.overwrite, args.resume, name), _resuming(args.resume, name):
                print(f"{name}: config {args.config}; {'continuing in' if args.resume else 'writing to'} {out}",
                      flush=True)
                t0 = time.perf_counter()
                results = experiment(cfg, out)
                write_json(out / RESULTS, {"experiment": name,
                                           "config": as_written(dataclasses.asdict(cfg)),  # type: ignore[call-overload]
                                           "elapsed_s": time.perf_counter() - t0, **results})
    except SplitfedError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated): the runs that ended are kept
        terminated = isinstance(e, Terminated)
        print(f"{prog}: {'terminated' if terminated else 'interrupted'}; {_kept(out)}", file=sys.stderr)
        return 143 if terminated else 130
    print(f"{name}: results in {out.resolve()}")
    return 0


def _kept(out: Path) -> str:
    """What a stopped experiment left in ``out``: runs that ``--resume`` continues, or (the cost-model sweep, or
    one stopped before its first run) none, where pointing at ``--resume`` would only be refused; what it wrote
    before its results.json (the sweep's results.csv and figures) is replaced with ``--overwrite`` only."""
    if (out / RUNS).is_dir():
        return f"the runs that ended are in {out / RUNS}, without {RESULTS}; to continue: the same command with --resume"
    again = "the same command with --overwrite" if _held(out) else "the same command"
    return f"it keeps no runs to continue from ({RESULTS} comes at the end); to start again: {again}"


def _held(out: Path) -> list[str]:
    """What ``out`` holds, by name: not its lock, nor drafts (:func:`~splitfed.jsonio.is_draft`), which are no one's results."""
    from splitfed.flower import runfolder

    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name != runfolder.LOCK and not jsonio.is_draft(p.name))


def _drop_drafts(out: Path) -> None:
    """Remove the drafts a killed experiment left in ``out`` (its lock is held now: none is being written)."""
    for p in out.iterdir():
        if jsonio.is_draft(p.name) and p.is_file():
            p.unlink(missing_ok=True)


def _experiment_of(results: Path) -> str:
    """The experiment whose ``results.json`` (or runs' :data:`MARK`) this is ("" if none can be read)."""
    try:
        obj = json.loads(results.read_text())
    except (OSError, ValueError):
        return ""
    name = obj.get("experiment") if isinstance(obj, dict) else None
    return name if isinstance(name, str) else ""


_ASIDE = ".replaced-"  # where --overwrite keeps the results it replaces until the experiment writes anything


_RESUME = contextvars.ContextVar("experiment_resumes", default=False)  # main's --resume, for run_cases
_NAME = contextvars.ContextVar("experiment_name", default="")  # main's experiment, marked beside its runs


@contextmanager
def _resuming(resume: bool, name: str = "") -> Iterator[None]:
    token, named = _RESUME.set(resume), _NAME.set(name)
    try:
        yield
    finally:
        _RESUME.reset(token)
        _NAME.reset(named)


@contextmanager
def output_folder(out: Path, overwrite: bool, resume: bool = False, name: str = "") -> Iterator[Path]:
    """Hold ``out`` for one experiment (as a run holds its run folder), refusing one that holds an earlier
    experiment's results unless ``overwrite`` (which moves them aside, and removes them once the experiment
    has written anything: no stale ``results.json`` beside new runs, and a config refused before anything ran
    costs nothing) and one that holds anything an experiment does not write (a run folder, say). ``resume``
    continues the experiment ``name`` only: the results of another are refused, naming it."""
    from splitfed.flower import runfolder

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    _check_free(out)  # first: a folder being written holds runs, figures and drafts that say nothing
    held = _held(out)
    ours = bool(OWNS_FIGURES & set(held))  # figures are an experiment's only beside its results or runs
    foreign = [n for n in held if n not in OUTPUTS and not (ours and n.endswith(".png"))
               and not n.startswith(_ASIDE)]
    if foreign:
        raise ConfigError(f"--out {out} holds what no experiment writes ({', '.join(foreign[:3])}"
                          f"{', ...' if len(foreign) > 3 else ''}): choose another --out")
    if resume:
        if RUNS not in held:
            raise ConfigError(f"--resume: --out {out} holds no experiment's runs to continue: leave --resume out to "
                              "start one there")
        other = _experiment_of(out / RESULTS) or _experiment_of(out / RUNS / MARK)
        if name and other and other != name:
            raise ConfigError(f"--resume: --out {out} holds the results of experiment {other!r}, not {name!r}: "
                              "continue it with its own script, or choose another --out")
        with runfolder.claim(out, resume=False, overwrite=False):  # results.json is written again at the end
            _drop_drafts(out)
            yield out
        return
    if held and not overwrite:
        resumable = "continue them with --resume, " if RUNS in held else ""  # no runs: --resume is refused
        raise ConfigError(f"--out {out} already holds an experiment's results ({', '.join(held[:3])}"
                          f"{', ...' if len(held) > 3 else ''}): {resumable}replace them with --overwrite, or "
                          "choose another --out")
    with runfolder.claim(out, resume=False, overwrite=False):  # one experiment at a time in a folder
        _drop_drafts(out)
        # the results replaced wait aside until the experiment has written anything: one that refuses its
        # config first (a typo in its last policy) leaves them as they were
        aside = out / f"{_ASIDE}{os.getpid()}"
        if held:
            aside.mkdir()
            for entry in held:
                os.replace(out / entry, aside / entry)
        try:
            yield out
        except BaseException:
            if held and not any(p.name not in (runfolder.LOCK, aside.name) for p in out.iterdir()):
                for entry in held:  # a killed experiment's aside folder too: the only copy of its results
                    os.replace(aside / entry, out / entry)
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)


def _check_free(out: Path) -> None:
    """Refuse ``out`` while another process holds it, in an experiment's words: the holder may be an experiment
    or a run (``splitfed simulate --out`` there), and its record does not say which."""
    from splitfed.flower import runfolder

    runfolder.check_free(out, ("--out", "run or experiment", "--out"))


@contextmanager
def _interrupts() -> Iterator[None]:
    """SIGTERM as Ctrl-C (:class:`Terminated`) outside a Flower run too (which handles both itself)."""
    def terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: signals are not ours to take
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _threads() -> None:
    """One torch thread unless OMP_NUM_THREADS says otherwise: experiments share small machines. Its first
    level counts (OpenMP's ``4,2`` was a traceback before the config was read); a value that is no count is
    taken as unset, as OpenMP does."""
    import torch

    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    torch.set_num_threads(max(1, int(first)) if first.isascii() and first.isdigit() else 1)
