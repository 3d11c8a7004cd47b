"""The settings of one Flower run, from any of its three sources.

``flwr run`` gives the ServerApp a ``run_config`` (pyproject's
``[tool.flwr.app.config]``, hyphenated keys); ``splitfed simulate`` reads a TOML
file and command-line flags. All three become one :class:`RunSettings`, checked
once, so a bad value is refused with its key named whichever way it came in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitfed import tomlio
from splitfed.engine.limits import MAX_BATCH, MAX_CLIENTS, MAX_SEED, MAX_VOCAB
from splitfed.engine.modes import IN_TURN, MODES
from splitfed.errors import ConfigError, unknown_key
from splitfed.optimizer.defaults import (
    ADAPT_TIME_LIMIT_S,
    HYSTERESIS,
    MEASUREMENT_WEIGHT,
    REGIME_JUMP,
)
from splitfed.options import kwargs_json, kwargs_of
from splitfed.transport.address import parse_address

if TYPE_CHECKING:  # torch's: this module is read before a run imports it (unknown_model)
    from splitfed.engine.types import OptimConfig
    from splitfed.models.zoo import ModelSpec

FLOAT32_MAX = 3.4028234663852886e38  # the tiers' optimizers work in float32: a larger lr overflows there

# a run's name on the tiers is this, a dash and an 8-hex tag (server.app.named); tiers take ids up to 256 characters
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

ALIASES = {"num_server_rounds": "rounds", "num_clients": "clients", "num_supernodes": "clients"}


# the adaptive policy's own settings (``cuts adaptive``): an experiment's policies entry may set them per run
ADAPTIVE_SETTINGS = ("hysteresis", "measurement_weight", "regime_jump", "solve_time_limit_s")


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides what a run computes (and where its tiers and outputs are)."""

    rounds: int = 3
    clients: int = 4  # virtual clients in simulation; nodes to wait for in deployment
    mode: str = "sflv1"
    tiers: int = 3
    model: str = "cnn"
    dataset: str = "digits"
    partition: str = "iid"
    cuts: str = "static:2,5"
    hysteresis: float = HYSTERESIS  # cuts adaptive: the least predicted gain, a share of the rounds left's time
    # cuts adaptive's beliefs: the weight of a round's measurement, and the factor off a belief that is believed
    # at once (a new regime); how long each of its solves may take
    measurement_weight: float = MEASUREMENT_WEIGHT
    regime_jump: float = REGIME_JUMP
    solve_time_limit_s: float = ADAPT_TIME_LIMIT_S
    seed: int = 0
    batch_size: int = 32
    local_epochs: int = 1
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    u_shape: bool = False
    min_device_blocks: int = 0  # blocks every device keeps; >= 1: raw inputs never leave a device
    vocab: int = 0  # > 0: a module:factory model takes integer tokens below it (an nn.Embedding first)
    # the model factory's keyword arguments, a JSON object ('{"width": 32}'; a TOML table in a config file);
    # kept as sorted JSON, so that a resume compares it with the checkpoint's as one value
    model_kwargs: str = ""
    fraction: float = 1.0  # share of the registered clients sampled each round
    min_clients: int = 1  # fewest clients that must finish a round; fewer and the round fails
    round_timeout_s: float = 600.0
    # how long one call of a device to its edge may take, its retries included (capped at round_timeout_s): a
    # device on a slow link with a large boundary needs more; a shorter one fails a stalled device sooner
    call_timeout_s: float = 60.0
    node_wait_s: float = 120.0  # how long the query round waits for nodes to register
    fleet: str = "reference"  # fleet file (or shipped fleet name) the device profiles come from
    sim_clock: bool = True  # report the cost model's simulated round time (off in deployment)
    tier_addresses: str = ""  # "edge,cloud" in chain order; empty: the ServerApp starts its own
    tier_torch_device: str = "cpu"  # where the tiers the run starts compute: cpu, cuda, cuda:N
    tls_ca: str = ""  # CA of the tier servers' certificates; empty: insecure (loopback only)
    tls_cert: str = ""  # the tier servers' certificate and key (used when the app starts them)
    tls_key: str = ""
    token_file: str = ""  # shared secret the tier servers require (file holding it); the devices get it too
    # the coordinator's own token (file holding it): alone allows load, fetch, release, sum on tiers started with
    # --coordinator-token-file; never sent to a node. Empty: token-file (tiers without one), or, for the tiers a
    # run starts, one made for the run
    coordinator_token_file: str = ""
    compress: str = "none"  # codec on the wire: one for every link, or one per link ("none,int8": the WAN only)
    out: str = ""  # run folder: metrics.jsonl, summary.json, checkpoint; empty: none written
    resume: bool = False  # continue from ``out``'s checkpoint
    overwrite: bool = False  # replace the run ``out`` holds (without it, such a folder is refused)
    run_name: str = ""  # names the run on the tier servers; empty: the ServerApp picks a unique one

    def __post_init__(self) -> None:
        positive = ("rounds", "clients", "batch_size", "local_epochs")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{_key(name)} must be >= 1, got {getattr(self, name)}")
        if self.batch_size > MAX_BATCH:  # one batch of any model would outgrow the host's memory
            raise ConfigError(f"{_key('batch_size')} must be at most {MAX_BATCH:,}, got {self.batch_size}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.tiers < 2:
            raise ConfigError(f"tiers must be >= 2 (device + at least one server tier), got {self.tiers}")
        if self.tiers > 3 and (self.sim_clock or self.cuts.strip().partition(":")[0] != "static"):
            # a fleet has an edge and a cloud: before the cuts are counted, which said "4 tiers need 3 cut(s)" as
            # if 4 could run (static cuts, timed as measured, run on any number: a deployment's own tiers)
            who = "the simulated clock (sim-clock)" if self.sim_clock else f"cuts {self.cuts.strip()}"
            raise ConfigError(f"tiers must be 2 or 3, got {self.tiers}: {who} prices a fleet's server tiers, an "
                              "edge and a cloud")
        if self.run_name and not RUN_NAME.fullmatch(self.run_name):
            raise ConfigError(f"run-name must be 1..200 letters, digits, '.', '_' or '-' (starting with a letter or "
                              f"digit), got {self.run_name!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed must be an integer in 0..{MAX_SEED:,} (2**32-1), got {self.seed}")
        if self.min_device_blocks < 0:
            raise ConfigError(f"min-device-blocks must be >= 0, got {self.min_device_blocks}")
        object.__setattr__(self, "model_kwargs", kwargs_json(self.model_kwargs))
        if not (self.vocab == 0 or 2 <= self.vocab <= MAX_VOCAB):
            raise ConfigError(f"vocab must be 0 (float inputs) or in 2..{MAX_VOCAB:,}, got {self.vocab}")
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.clients > MAX_CLIENTS:
            raise ConfigError(f"clients must be at most {MAX_CLIENTS:,} (a fleet splitfed holds), got {self.clients:,}")
        if self.min_clients < 1:
            raise ConfigError(f"min-clients must be >= 1, got {self.min_clients}")
        if self.min_clients > self.clients:
            raise ConfigError(f"min-clients ({self.min_clients}) is more than clients ({self.clients}): "
                              "no round could finish")
        from splitfed.transport.client import MAX_DEADLINE_S, deadline_bound

        for name in ("round_timeout_s", "call_timeout_s", "node_wait_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"{_key(name)} must be a positive number of seconds, got {v}")
            if name != "node_wait_s" and v > MAX_DEADLINE_S:  # the tiers' calls take these as their deadline
                raise ConfigError(deadline_bound(_key(name), v))
        if not (math.isfinite(self.hysteresis) and self.hysteresis >= 0):
            raise ConfigError(f"hysteresis must be a number >= 0 (the share of the rounds left's time a move of cuts "
                              f"must save; {HYSTERESIS:g}: {HYSTERESIS:.0%}), got {self.hysteresis}")
        if not 0 < self.measurement_weight <= 1:  # written as what holds, so a NaN fails it
            raise ConfigError(f"measurement-weight must be in (0, 1] (the weight of a round's measurement in the "
                              f"adaptive policy's beliefs; 1: the last round alone), got {self.measurement_weight}")
        if not (math.isfinite(self.regime_jump) and self.regime_jump > 1):  # finite: a run's JSON records it
            raise ConfigError(f"regime-jump must be a finite number > 1 (a measurement this many times above or below "
                              f"its belief is believed at once; 1e9: all but never), got {self.regime_jump}")
        if not (math.isfinite(self.solve_time_limit_s) and self.solve_time_limit_s > 0):
            raise ConfigError(f"solve-time-limit-s must be a positive number of seconds, got {self.solve_time_limit_s}")
        if self.resume and not self.out:
            raise ConfigError("resume needs the run folder (out) holding the checkpoint, in the same settings; "
                              "to continue a run from the command line, drop resume and give --resume FOLDER")
        if self.resume and self.overwrite:
            raise ConfigError("resume continues the run in out, overwrite replaces it: choose one")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls-cert and tls-key go together")
        if self.tls_cert and not self.tls_ca:
            raise ConfigError("tls-cert needs tls-ca (the CA clients verify the tier servers with)")
        if self.addresses and len(self.addresses) != self.tiers - 1:
            raise ConfigError(f"tier-addresses names {len(self.addresses)} tier server(s); "
                              f"{self.tiers} tiers need {self.tiers - 1}")
        for address in self.addresses:
            parse_address(address, "tier-addresses entry")
        from splitfed.engine.compute import torch_device

        # its form here; whether this machine has it where the tiers start (a checkpoint's settings are read anywhere)
        tier_device = torch_device(self.tier_torch_device, "tier-torch-device", here=False)
        if self.addresses and tier_device.type != "cpu":
            raise ConfigError(f"tier-torch-device {self.tier_torch_device} is for the tiers a run starts; the tiers at "
                              "tier-addresses run already: start them with splitfed tier --torch-device "
                              f"{self.tier_torch_device}")
        # the transport's own codec parser, imported only when settings are made
        from splitfed.cost.wire import link_codecs
        from splitfed.engine.types import OptimConfig

        OptimConfig(self.optimizer, self.lr, self.momentum, self.weight_decay)  # refuses bad values
        for name in ("lr", "weight_decay"):  # finite and >= 0 by now (momentum < 1); 1e300 fails later, at a tier
            v = getattr(self, name)
            if v > FLOAT32_MAX:
                raise ConfigError(f"{_key(name)} {v:g} does not fit float32, which the tiers' optimizer works in: "
                                  f"give at most {FLOAT32_MAX:.4g}")
        codecs = link_codecs(self.compress, self.tiers - 1)  # an unknown codec, or too many: before any tier sees them
        # kept as spelt once ("none, INT8" is "none,int8"): a resume compares it with the checkpoint's
        object.__setattr__(self, "compress", codecs[0] if len(set(codecs)) == 1 else ",".join(codecs))

    # ------------------------------------------------------------ derived

    @cached_property
    def codecs(self) -> tuple[str, ...]:
        """One codec per link, device -> edge first (``compress``: one for all, or one each); parsed once, as
        a run asks for it per client and round."""
        from splitfed.cost.wire import link_codecs

        return link_codecs(self.compress, self.tiers - 1)

    @property
    def in_turn(self) -> bool:
        """Its clients train one after another (sl, sflv2): a round lasts their times' sum."""
        return self.mode in IN_TURN

    @property
    def optim(self) -> OptimConfig:
        from splitfed.engine.types import OptimConfig

        return OptimConfig(self.optimizer, self.lr, self.momentum, self.weight_decay)

    @cached_property
    def spec(self) -> ModelSpec:
        """The run's model, shaped for its dataset's samples (:func:`splitfed.data.datasets.spec_for`): worked
        out once per settings object, as it reads the dataset's files (an .npz's labels, whole)."""
        from splitfed.data.datasets import spec_for

        return spec_for(self.model, self.dataset, self.vocab, self.kwargs)

    @property
    def kwargs(self) -> dict[str, Any]:
        """The model factory's keyword arguments (``model-kwargs``)."""
        return kwargs_of(self.model_kwargs)

    @property
    def cuts_shown(self) -> str:
        """``cuts`` as a run's first line says it: an adaptive run's own settings that are not the defaults
        follow, as an experiment's policies entry writes them ("adaptive hysteresis=0.5"), so that its log
        says how it adapts."""
        if self.cuts.strip().partition(":")[0] != "adaptive":
            return self.cuts
        default = {f.name: f.default for f in fields(self)}
        return " ".join([self.cuts, *(f"{k.replace('_', '-')}={getattr(self, k):g}" for k in ADAPTIVE_SETTINGS
                                      if getattr(self, k) != default[k])])

    @property
    def call_deadline_s(self) -> float:
        """Seconds a device's call to its edge may take: no call outlasts the round it is part of."""
        return min(self.call_timeout_s, self.round_timeout_s)

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.tier_addresses.split(",") if a.strip())

    @property
    def run_id(self) -> str:
        """The tier servers' namespace for this run (not part of the math: dropout keys ignore it).

        A run through the ServerApp always has a ``run_name`` (:func:`server.app.named`); the fallback
        serves the in-process backend, whose tiers no other run shares."""
        return self.run_name or f"splitfed-{self.seed}"

    def with_(self, **changes: Any) -> RunSettings:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------ (de)serialisation

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: RunSettings | None = None,
                     source: str = "config") -> RunSettings:
        """Settings from ``values`` (hyphen or underscore keys) over ``base``; unknown keys refused."""
        return cls.layered([(values, source)], base)

    @classmethod
    def layered(cls, layers: Sequence[tuple[Mapping[str, Any], str | None]],
                base: RunSettings | None = None, *, here: bool = False) -> RunSettings:
        """Settings from ``layers`` (later ones win) over ``base``, checked once as a whole.

        Checking each layer alone would refuse a file whose ``min-clients = 9`` only a flag's ``--clients 10``
        makes right. A refusal of the whole names the layers (sources) that gave values; ``None`` names none.
        ``here``: the tiers the run starts compute on this machine, so ``tier-torch-device`` must name a device
        it has (``splitfed simulate``); else only its form is checked, as a checkpoint's settings are read
        anywhere.
        """
        types = {f.name: f.type for f in fields(cls)}
        changes: dict[str, Any] = {}
        for values, source in layers:
            where = source or "config"
            given: dict[str, str] = {}  # setting -> the key of this layer that gave it
            for raw, v in values.items():
                name = raw.replace("-", "_")
                name = ALIASES.get(name, name)
                if name not in types:
                    raise unknown_key(raw, map(_key, types), where)
                if name == "model_kwargs" and isinstance(v, dict):  # a TOML table: the options as they are
                    v = json.dumps(v, sort_keys=True, default=_not_json(raw, where))
                value = _coerce(v, str(types[name]), raw, where)
                if name in given and changes[name] != value:  # one would be dropped unseen, by the keys' order
                    raise ConfigError(f"{where}: {given[name]} = {changes[name]!r} and {raw} = {value!r} both set "
                                      f"{_key(name)}: give one")
                given[name] = raw
                changes[name] = value
        named = _sources(layers)
        try:
            settings = dataclasses.replace(base or cls(), **changes)
            _named_forms(settings)  # an unknown cut policy, dataset, model or partition: its key and source named
            if here and not settings.addresses:
                from splitfed.engine.compute import torch_device

                torch_device(settings.tier_torch_device, "tier-torch-device")
        except ConfigError as e:
            raise ConfigError(f"{' + '.join(named)}: {e}" if named else str(e)) from None
        return settings

    @classmethod
    def from_toml(cls, path: str | Path, base: RunSettings | None = None) -> RunSettings:
        return cls.layered([(toml_table(path), str(path))], base)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# What a Flower App of splitfed runs when its run config does not say: RunSettings' defaults but these (the
# optimizer's cuts on non-IID data, 2 clients as Flower's local SuperLink simulates 2 SuperNodes). The
# repository's pyproject.toml lists them for ``flwr run .``, and ``server.deploy`` writes them into the app it
# runs, so the two ways to deploy compute the same with the same flags (a test holds pyproject.toml to this).
APP_DEFAULTS: dict[str, Any] = {"clients": 2, "partition": "dirichlet:0.5", "cuts": "adaptive"}


def app_config() -> dict[str, Any]:
    """A Flower App's ``[tool.flwr.app.config]``: every setting, by its dashed key (``num-server-rounds`` for
    rounds), at :data:`APP_DEFAULTS` or RunSettings' default."""
    settings = {**RunSettings().to_dict(), **APP_DEFAULTS}
    out = {("num-server-rounds" if k == "rounds" else _key(k)): v for k, v in settings.items()}
    RunSettings.from_mapping(out, source="the app's defaults")
    return out


def toml_table(path: str | Path) -> dict[str, Any]:
    """A config file's run settings: its ``[simulate]`` table, or the whole file when it has none."""
    p = Path(path)
    data = tomlio.parse(tomlio.read_text(p, "config file"), f"config file {p}")
    table = data.get("simulate", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{p}: [simulate] must be a table")
    if table is not data:  # an experiment's own keys may sit above [simulate]; a run setting there is lost
        names = {f.name for f in fields(RunSettings)} | set(ALIASES)
        lost = sorted(k for k in data if k != "simulate" and k.replace("-", "_") in names)
        if lost:
            raise ConfigError(f"{p}: {', '.join(repr(k) for k in lost)} above [simulate] would be ignored: "
                              "put run settings under [simulate]")
    return table


# The cuts of a run that names none, by (tiers, U-shape) where RunSettings' own (static:2,5, 3 tiers) does not
# fit: its first cut on 2 tiers, and in U-shape on 3 the device's tail at the last block of the default model
# (cnn: 7 blocks). Before, ``--tiers 2`` alone was refused for cuts the user never gave.
DEFAULT_CUTS: dict[tuple[int, bool], str] = {(2, False): "static:2", (3, True): "static:2,5,6"}


def default_cuts(tiers: int, u_shape: bool) -> str:
    """The cuts a run on ``tiers`` tiers (in U-shape or not) takes when none are given."""
    return DEFAULT_CUTS.get((tiers, u_shape), RunSettings.cuts)


def fleet_beside(fleet: str, folder: str | Path, source: str) -> str:
    """A config file's relative ``fleet`` path: from the current folder if a file (or anything: load_fleet says
    what) is there, else from ``folder`` (the config's own; the experiments': ``simulations/configs``), else a
    shipped fleet's name. None of them is refused naming both folders and ``source`` (the config file): a
    shipped config's ``fleets/drift.toml`` was looked for only in the folder a command ran from. A file found
    is named by its absolute path, symbolic links resolved (:func:`absolute_paths`)."""
    from splitfed.fleets import shipped_fleets

    path = Path(fleet)
    if path.is_absolute() or path.exists():
        return str(path.resolve())
    if (Path(folder) / path).is_file():
        return str((Path(folder) / path).resolve())
    if fleet in shipped_fleets():
        return fleet
    here, there = Path.cwd(), Path(folder).resolve()
    where = f"from the current folder ({here})" + (f" or from {there}" if there != here else "")
    raise ConfigError(f"{source}: fleet {fleet!r}: no such file {where}, and no shipped fleet of that name "
                      f"(shipped: {', '.join(shipped_fleets())})")


def dataset_beside(dataset: object, folder: str | Path | None = None) -> object:
    """A dataset spec's PATH (``mnist:PATH``, ``cifar10:PATH``, ``npz:FILE``) made absolute, ``~`` expanded: from
    the current folder if anything is there, else from ``folder`` (a config file's own, as its ``fleet`` is
    found) if anything is there, else from the current folder (the reader refuses it by that name). Any other
    value as it is (its check names it). A run records its settings for ``--resume``, which may be given from
    another folder: a relative path there named another file, or none."""
    from splitfed.data.datasets import dataset_form, local_path

    try:
        name, path = dataset_form(dataset)
    except ConfigError:
        return dataset
    if not path.strip():
        return dataset
    p = local_path(path)
    if not p.is_absolute() and not p.exists() and folder is not None and (Path(folder) / p).exists():
        p = Path(folder) / p
    return f"{name}:{p.resolve()}"


def absolute_paths(settings: RunSettings) -> RunSettings:
    """``settings`` with its dataset's and fleet file's paths absolute (:func:`dataset_beside`; a fleet that is
    a file here, not a shipped fleet's name): what a new run records, so that its ``--resume`` from another
    folder reads the same files."""
    fleet = settings.fleet
    # a file only: a folder here named like a shipped fleet (small) is no fleet file the run would read
    if isinstance(fleet, str) and fleet and Path(fleet).is_file():
        fleet = str(Path(fleet).resolve())
    dataset = dataset_beside(settings.dataset)
    if (fleet, dataset) == (settings.fleet, settings.dataset):
        return settings
    return settings.with_(fleet=fleet, dataset=dataset)


def flag(values: Mapping[str, Any], key: str, source: str) -> bool:
    """One layer's boolean setting, read as :class:`RunSettings` reads it (absent: false)."""
    return key in values and bool(_coerce(values[key], "bool", key, source))


def _sources(layers: Sequence[tuple[Mapping[str, Any], str | None]]) -> list[str]:
    """The layers a refusal of :meth:`RunSettings.layered` names: those with a source that gave values."""
    named: list[str] = []
    for values, source in layers:
        if values and source and source not in named:
            named.append(source)
    return named


def unknown_model(layers: Sequence[tuple[Mapping[str, Any], str | None]]) -> None:
    """Refuse the model ``layers`` name (the last that gives one, as :meth:`RunSettings.layered` reads them) if
    it has no ':' and no zoo model has that name, with the message ``layered`` gives it (its layers and key
    named), but before what checks the rest imports torch (seconds): ``splitfed simulate --model nonsense``.
    A ``module:factory`` model, or a value that is no string, is left to ``layered``."""
    from splitfed.zoo_names import unknown_model_message

    model = None
    for values, _ in layers:
        for raw, v in values.items():
            if ALIASES.get(raw.replace("-", "_"), raw.replace("-", "_")) == "model":
                model = v
    refused = unknown_model_message(model) if isinstance(model, str) else ""
    if refused:
        named = _sources(layers)
        raise ConfigError(f"{' + '.join(named)}: model: {refused}" if named else f"model: {refused}")


def _named_forms(s: RunSettings) -> None:
    """Refuse a setting whose form no run takes, with its key, where :meth:`RunSettings.layered` names the file
    or flags it came from; before, ``--cuts bogus`` was refused only once the run was set up, as "unknown cut
    policy 'bogus'", naming neither. Only forms are checked (no file is read, no module imported): a
    checkpoint's settings are read anywhere. Settings made in code (``with_``) are checked by the run's
    validation, which callers prefix with their own label (a simulation's case)."""
    from splitfed.data.datasets import dataset_form
    from splitfed.data.partition import parse_partition
    from splitfed.flower.policy import check_policy
    from splitfed.models.zoo import resolve_spec

    checks: dict[str, Callable[[], object]] = {
        "cuts": lambda: check_policy(s),
        "dataset": lambda: dataset_form(s.dataset),  # its files are read when the run starts
        # a zoo name and its options; module:factory is imported later
        "model": lambda: ":" in s.model or resolve_spec(s.model, options=s.kwargs),
        "partition": lambda: parse_partition(s.partition),
    }
    for key, check in checks.items():
        try:
            check()
        except ConfigError as e:
            raise ConfigError(f"{key}: {e}") from None


def _not_json(key: str, source: str) -> Callable[[object], object]:
    """``json.dumps``' ``default`` for a TOML table of options: a date or time, which no tier rebuilds a model
    from, is refused naming the key."""
    def refuse(v: object) -> object:
        raise ConfigError(f"{source}: {key}: {v!r} is no JSON value (numbers, strings, true/false, lists, tables)")
    return refuse


def _key(name: str) -> str:
    return name.replace("_", "-")


def _coerce(v: Any, typ: str, key: str, source: str) -> Any:
    """A config value as the field's type; TOML and flwr already give typed values, strings are parsed."""
    try:
        if typ == "bool":
            if isinstance(v, bool):
                return v
            if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
                return v.strip().lower() in ("true", "1", "yes")
            raise ValueError
        if typ == "int":
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError
            return int(v)
        if typ == "float":
            if isinstance(v, bool):
                raise ValueError
            return float(v)
        if isinstance(v, dict):  # model = {name = "cnn"}: str() would make "{'name': 'cnn'}" of it
            hint = " (a zoo name or module:factory)" if key.replace("_", "-") == "model" else ""
            raise ConfigError(f"{source}: {key} must be a string{hint}, got a table")
        if isinstance(v, list):  # tier-addresses = ["a", "b"]; any other list was joined into a value nobody wrote
            if _key(key) not in ("tier-addresses", "compress"):
                raise ConfigError(f"{source}: {key} must be a string, got a list {v!r}")
            return ",".join(str(x) for x in v)
        return str(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: lr = 10**400
        raise ConfigError(f"{source}: {key} must be {typ}, got {v!r}") from None
