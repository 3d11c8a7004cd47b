"""What travels in Flower messages, as typed values with one conversion each way.

- model states <-> ``ArrayRecord`` (keys ``"<block>.<key>"``, dtypes kept);
- :class:`TrainInstruction` (server -> node): one node's cuts, round, model,
  data and where its edge tier is; a fresh record per node;
- :class:`TrainReport` (node -> server): samples, loss and the measured compute
  time, link time and bytes of that node's round;
- :class:`NodeInfo` (node -> server, query round): partition and device profile.

A malformed record raises :class:`~splitfed.errors.ConfigError` naming the key,
so a node that speaks another version fails clearly, not deep inside training.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

from splitfed.engine.types import OptimConfig, State
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec
from splitfed.profile.devices import LinkProfile, mbps
from splitfed.profile.fleet import MAX_SAMPLES, in_range
from splitfed.profile.speed import SpeedMeasure
from splitfed.transport.codec import AS_BITS, as_numpy

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
NODE = "node"


# torch dtypes numpy has not (the codec's AS_BITS) travel as their bits, a numpy array of the integer type of
# their size, under their own dtype name (``.numpy()`` of a bfloat16 tensor raised TypeError: a user's bfloat16
# model, which the engine and its tiers train, stopped a Flower run at its start, the global model not made
# into a record). By that name: (the dtype, its bits' dtype).
_AS_BITS = {str(d).removeprefix("torch."): (d, bits) for d, bits in AS_BITS.items()}


def state_to_record(state: State) -> ArrayRecord:
    """A (partial) model state as an ArrayRecord; ordered by key so messages are reproducible."""
    return ArrayRecord({k: _array(state[k].detach().cpu()) for k in sorted(state)})


def _array(t: torch.Tensor) -> Array:
    # np.array(order="C"), not np.ascontiguousarray: the latter turns 0-d buffers into shape (1,)
    a = Array(np.array(as_numpy(t), order="C"))
    if t.dtype not in AS_BITS:
        return a
    return Array(dtype=str(t.dtype).removeprefix("torch."), shape=a.shape, stype=a.stype, data=a.data)


def record_to_state(record: ArrayRecord) -> State:
    """The state an ArrayRecord holds. An array that does not decode (bytes that are no ``.npy``, a dtype
    torch has not, a serialization other than numpy's) is a ConfigError naming it, numpy's or torch's words
    first: raised as it was (EOFError, BadZipFile, TypeError), it ended a ClientApp with a traceback."""
    state: State = {}
    for k, a in record.items():
        try:
            t = torch.from_numpy(np.array(a.numpy(), copy=True))
            if a.dtype in _AS_BITS:
                dtype, bits = _AS_BITS[a.dtype]
                if t.dtype != bits:
                    raise TypeError(f"{a.dtype} travels as {str(bits).removeprefix('torch.')}, not as {t.dtype}")
                t = t.view(dtype)
        except Exception as e:  # noqa: BLE001 - np.load and torch raise whatever the bytes make them
            raise ConfigError(f"{e} (array {k!r} does not decode)") from None
        state[k] = t
    return state


def _get(record: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return record[key]
    except KeyError:
        raise ConfigError(f"{what}: missing {key!r}") from None


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_TYPE_WORDS = {"str": "a string", "int": "an integer", "bool": "true or false", "float": "a finite number"}


def _of_type(v: Any, typ: str) -> bool:
    """Whether a record's value is of a field's type (a bool is no integer; an integer is a float)."""
    if typ == "int":
        return _whole(v)
    if typ == "float":
        return (_whole(v) or isinstance(v, float)) and math.isfinite(v)
    return isinstance(v, {"str": str, "bool": bool}[typ])


@dataclass(frozen=True)
class TrainInstruction:
    """Everything one node needs to train its device segment for one round."""

    run_id: str
    round: int
    client_id: str
    cuts: tuple[int, ...]
    mode: str
    u_shape: bool
    model: ModelSpec
    optim: OptimConfig
    seed: int
    dataset: str
    partition: str
    batch_size: int
    local_epochs: int
    edge_address: str
    tls_ca: str = ""  # path of the CA file on the node ("": insecure)
    tls_cert: str = ""  # the node's client certificate and key (mutual TLS)
    tls_key: str = ""
    token_file: str = ""  # path of the tier token on the node
    compress: str = "none"
    deadline_s: float = 60.0
    edge_instance: str = ""  # the run's edge tier process (Describe): a node reaching another one is told
    measure_speed: bool = False  # time its training before this round (its device holds no block: see speed.py)
    # this client's binding secret for the round (SegmentLoad.secret): its steps carry it, and a tier refuses
    # every call for its segments without it; sent to this node only, never shown
    secret: str = field(default="", repr=False)

    def to_record(self) -> ConfigRecord:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("model", "optim"):
                v = json.dumps(v.to_dict(), sort_keys=True)
            elif f.name == "cuts":
                v = [int(k) for k in v]
            d[f.name.replace("_", "-")] = v
        return ConfigRecord(d)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TrainInstruction:
        what = "train instruction"
        vals: dict[str, Any] = {}
        try:
            for f in fields(cls):
                key = f.name.replace("_", "-")
                if key not in record and f.default is not MISSING:
                    continue  # optional field left out: keep its default
                v = _get(record, key, what)
                if f.name in ("model", "optim"):
                    v = (ModelSpec if f.name == "model" else OptimConfig).from_dict(json.loads(v))
                elif f.name == "cuts":
                    if not isinstance(v, list | tuple) or not all(_whole(k) for k in v):
                        raise ConfigError(f"{what}: cuts must be a list of integers, got {v!r}")
                    v = tuple(v)
                elif not _of_type(v, str(f.type)):  # a secret's value is never shown, only its type
                    got = repr(v) if f.repr else f"a value of type {type(v).__name__}"
                    raise ConfigError(f"{what}: {key} must be {_TYPE_WORDS[str(f.type)]}, got {got}")
                vals[f.name] = v
            ins = cls(**vals)
        # a model or optim that is no spec; RecursionError: JSON nested deeper than json.loads goes
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
            raise ConfigError(f"{what}: malformed ({type(e).__name__}: {e})") from None
        for name in ("round", "batch_size", "local_epochs"):  # what a node would train nothing, or forever, on
            if getattr(ins, name) < 1:
                raise ConfigError(f"{what}: {name.replace('_', '-')} must be >= 1, got {getattr(ins, name)}")
        if not ins.deadline_s > 0:
            raise ConfigError(f"{what}: deadline-s must be > 0, got {ins.deadline_s}")
        return ins


@dataclass(frozen=True)
class TrainReport:
    """A node's measured round; ``num-examples`` is the weight Flower strategies expect."""

    samples: int
    steps: int
    loss: float
    correct: int
    compute_s: float
    link_s: float
    bytes_up: int
    bytes_down: int
    rtt_ms: float = -1.0  # round trip to the edge, measured this round (< 0: not measured)
    # its training speed, timed before the round when asked (as at registration: NodeInfo); 0: not measured
    speed_blocks: int = 0
    speed_samples: int = 0
    speed_s: float = 0.0

    @property
    def speed(self) -> SpeedMeasure | None:
        """Its training speed as timed this round, or None (not asked, failed, or nonsense)."""
        try:
            return SpeedMeasure(self.speed_blocks, self.speed_samples, self.speed_s)
        except ConfigError:
            return None

    @property
    def throughput(self) -> float:
        """Bytes per second of link time (both directions): what adaptation learns the link from."""
        return (self.bytes_up + self.bytes_down) / self.link_s if self.link_s > 0 else 0.0

    def to_record(self) -> MetricRecord:
        d: dict[str, int | float | list[int] | list[float]] = {"num-examples": self.samples}  # MetricRecord's values
        for k, v in asdict(self).items():
            if k != "samples":
                d[k.replace("_", "-")] = v
        d["throughput"] = self.throughput
        return MetricRecord(d)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TrainReport:
        what = "train report"
        try:
            optional = ("rtt_ms", "speed_blocks", "speed_samples", "speed_s")  # a node from before they were
            vals = {f.name: _cast(f.type, _get(record, key := f.name.replace("_", "-"), what), key, what)
                    for f in fields(cls) if f.name != "samples" and f.name not in optional}
            for name in optional[1:]:  # a timing that is no number is no timing: the round itself stands
                vals[name] = _number(record.get(name.replace("_", "-"), 0), whole=name != "speed_s")
            rtt = _number(record.get("rtt-ms", -1.0), whole=False, default=-1.0)  # before they were measured: -1
            # anything else (no number, negative, beyond what registration believes of a link): not measured
            vals["rtt_ms"] = rtt if rtt >= 0 and in_range(rtt, "rtt_ms") else -1.0
            report = cls(samples=_integer(_get(record, "num-examples", what), "num-examples", what), **vals)
        except (TypeError, ValueError, OverflowError) as e:  # OverflowError: int() of an infinite float
            raise ConfigError(f"{what}: malformed ({e})") from None
        # what the adaptive policy learns from: a NaN or negative time would stay in its beliefs for good
        for name in ("samples", "steps", "correct", "compute_s", "link_s", "bytes_up", "bytes_down"):
            v = getattr(report, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"{what}: {name.replace('_', '-')} must be a finite number >= 0, got {v}")
        if report.loss < 0:  # a cross-entropy: one node's -1000 was the round's train loss (NaN or inf: diverged)
            raise ConfigError(f"{what}: loss must be >= 0, got {report.loss}")
        if (report.samples == 0) != (report.steps == 0) or report.correct > report.samples:
            raise ConfigError(f"{what}: {report.samples} sample(s) in {report.steps} step(s), {report.correct} "
                              "correct: no round trains so")
        return report


def _number(v: Any, whole: bool, default: float = 0) -> int | float:
    """``v`` as a finite number (a whole one if ``whole``), else ``default``."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    if not math.isfinite(x) or (whole and not x.is_integer()):
        return default
    return int(x) if whole else x


def _cast(typ: Any, v: Any, key: str, what: str) -> Any:
    return _integer(v, key, what) if str(typ) == "int" else float(v)


def _integer(v: Any, key: str, what: str) -> int:
    """A count of a record (samples, steps, bytes, a partition): an integer, or a float that is one (``12.0``).
    ``int()`` alone truncated ``9.9`` samples to 9 (a client's weight in every average) and read ``"3"`` or
    ``true`` as a partition."""
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
        raise ConfigError(f"{what}: {key} must be a whole number, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class NodeInfo:
    """A node's answer to the query round: which partition it holds, what device it is."""

    partition_id: int
    num_partitions: int
    samples: int = 0  # size of its local training set
    profile: str = ""  # device profile (fleet client) name from its node config
    edge_address: str = ""  # its edge tier, when its node config names one
    up_mbps: float = 0.0  # its link to the edge as it measured it when asked (0: not measured)
    down_mbps: float = 0.0
    rtt_ms: float = 0.0
    protocol: int = 0  # the splitfed wire protocol its library speaks (0: a splitfed too old to say)
    version: str = ""
    link_error: str = ""  # why it could not measure its link when asked ("": measured, or not asked)
    # its training speed when asked (splitfed.profile.speed): blocks [0, speed_blocks) on speed_samples samples
    # took speed_s seconds (0: not measured), or why it could not be measured
    speed_blocks: int = 0
    speed_samples: int = 0
    speed_s: float = 0.0
    speed_error: str = ""
    own_data: bool = False  # it trains on a data-file of its own (its partition-id only names it)

    @property
    def link(self) -> LinkProfile | None:
        """Its link to the edge as measured, in the cost model's units, or None."""
        if not all(in_range(v, key) for v, key in ((self.up_mbps, "up_mbps"), (self.down_mbps, "down_mbps"),
                                                    (self.rtt_ms, "rtt_ms"))) or self.up_mbps <= 0 or self.down_mbps <= 0:
            return None  # not measured, or nothing a real link does (a fleet file would be refused it too)
        return LinkProfile(mbps(self.up_mbps), mbps(self.down_mbps), self.rtt_ms / 1e3)

    @property
    def speed(self) -> SpeedMeasure | None:
        """Its training speed as measured, or None (not asked, failed, or nonsense from a faulty node)."""
        if self.speed_error:  # a node that says it failed is taken at its word, whatever numbers came with it
            return None
        try:
            return SpeedMeasure(self.speed_blocks, self.speed_samples, self.speed_s)
        except ConfigError:
            return None

    def to_record(self) -> ConfigRecord:
        return ConfigRecord({k.replace("_", "-"): v for k, v in asdict(self).items()})

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeInfo:
        what = "node info"
        try:
            info = cls(_integer(_get(record, "partition-id", what), "partition-id", what),
                       _integer(_get(record, "num-partitions", what), "num-partitions", what),
                       _integer(record.get("samples", 0), "samples", what), str(record.get("profile", "")),
                       str(record.get("edge-address", "")), float(record.get("up-mbps", 0.0)),
                       float(record.get("down-mbps", 0.0)), float(record.get("rtt-ms", 0.0)),
                       int(record.get("protocol", 0)), str(record.get("version", "")),
                       str(record.get("link-error", "")), int(record.get("speed-blocks", 0)),
                       int(record.get("speed-samples", 0)), float(record.get("speed-s", 0.0)),
                       str(record.get("speed-error", "")), record.get("own-data", False) is True)
        except (TypeError, ValueError, OverflowError) as e:  # OverflowError: int() of an infinite float
            raise ConfigError(f"{what}: malformed ({e})") from None
        if not 0 <= info.samples <= MAX_SAMPLES:  # its weight in every average, and its time on the clock
            raise ConfigError(f"{what}: samples must be in 0..{MAX_SAMPLES:,}, got {info.samples}")
        return info
