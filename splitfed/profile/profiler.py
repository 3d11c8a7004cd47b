"""Block profiler: what each block of a model costs to train, measured once per (model, batch).

Per block and per sample: forward and backward FLOPs (``torch.utils.flop_counter``;
it counts matmuls and convolutions, so a block of only pooling or activations
costs ~0 FLOPs), the bytes and dtype of its output activation (what crosses a
cut after it; the dtype decides what a link's codec sends), the activation
memory autograd keeps for backward (saved tensors, unique storages, parameters
excluded), and which of it a block keeps of a tensor a block before it keeps too (counted once on a tier that
holds both: ``ModelProfile.shared_act``) and of the tensor a tier starting at it receives (a server holds that
tensor for the step anyway: ``ModelProfile.input_kept``); the input's bytes and dtype. Per block: parameter bytes (each storage once: two
Parameters tied by ``.data`` are one weight in memory), trainable parameter bytes (``requires_grad``:
what gets a gradient and optimizer state; a frozen parameter gets neither), fixed memory
(parameters and buffers, each storage once, as a tier holds them (``engine.template.held_bytes``): a causal
mask or BatchNorm's running statistics take memory too; + gradients and optimizer state of the trainable
parameters) and state bytes (what the weight
exchange sends for the block: every key of its state dict, a tied tensor under each of its names,
persistent buffers such as BatchNorm statistics included). A block's backward is measured
as training runs it: its input's gradient is computed only when a block before it has trainable
parameters (a frozen part first on the device has no backward); each block's backward FLOPs and saved
activations with an input gradient are kept beside (a U-shape tail's blocks compute one: the device sends
the gradient of the tail's input back up). Measured forward/backward seconds
per batch on this host (or on one of its GPUs: ``torch_device``) are kept beside
the FLOPs so that predictions can be checked against measurement.

Profiles are cached in memory per (model spec, batch, optimizer slots) and, when
a cache directory is given (or ``SPLITFED_PROFILE_CACHE`` is set), on disk. A cached
profile answers a request for as many timed repetitions as it was measured with, or
fewer; a request for more measures again and keeps the better profile (see
:func:`profile_model`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from splitfed.engine import compute
from splitfed.engine.types import optimizer_state_bytes
from splitfed.errors import ConfigError
from splitfed.jsonio import write_atomic
from splitfed.models import rng
from splitfed.models.segment import Blocks
from splitfed.models.tying import param_sizes
from splitfed.models.zoo import ModelSpec, first_line, model_blocks
from splitfed.profile.digest import code_digest
from splitfed.units import mib_pair, mib_text

PROFILE_VERSION = 13  # 2: blocks that share a weight or pass a tuple are one block; 3: boundary dtypes recorded;
# 4: state bytes and the backward with an input gradient recorded (an older profile on disk has another cache
# key: it is measured again, not read with float32 guessed or its parameter bytes taken for what the weight
# exchange sends); 5: fixed bytes hold the buffers (an older profile left a block's causal mask or running
# statistics out of its memory, where a tier counts them) and the user's files the model's forward calls are
# in the key of a user's model; 6: the saved bytes two neighbouring blocks share recorded (an older profile
# counted a boundary tensor once for each of the two blocks that keep it); 7: what a tier's blocks keep of the
# tensor it receives recorded (an older profile left a server tier's received input out of its memory), and what
# they keep of the tensor it sends on; 8: where training's gradient reaches recorded (an older profile priced a
# backward, gradients and optimizer state for blocks before one that detaches); 9: that reach found in training
# mode (an older profile took it in eval mode: a block that stops the gradient in one mode only was priced wrong);
# 10: fixed bytes hold Adam's step count per Parameter that trains (an older profile left them out); 11: a fused
# RNN kernel's FLOPs counted (an older profile priced an LSTM on CPU, and any RNN on a GPU, at 0 FLOPs); 12:
# mobilenetv2's width above 1 widens it (an older profile of such a width priced the width-1 model, all it built);
# 13: block names unique (an older profile named mobilenetv2's blocks 5-10 all features.3)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelProfile:
    """Per-block costs of one model (lists indexed by block; ``*_bytes`` per sample unless fixed)."""

    model: str
    batch: int
    names: tuple[str, ...]
    input_bytes: float            # one input sample
    fwd_flops: tuple[float, ...]  # per sample
    bwd_flops: tuple[float, ...]  # per sample
    param_bytes: tuple[float, ...]
    out_bytes: tuple[float, ...]  # output activation, per sample
    act_bytes: tuple[float, ...]  # kept for backward, per sample
    fixed_bytes: tuple[float, ...]  # params and buffers + (grads + optimizer state) of the trainable params
    fwd_s: tuple[float, ...] = ()  # measured seconds per batch on ``host`` (may be empty)
    bwd_s: tuple[float, ...] = ()
    optimizer_slots: int = 1      # optimizer tensors per parameter (SGD momentum: 1, Adam: 2)
    host: str = ""
    spec: dict | None = None
    reps: int = 0                 # timed repetitions behind fwd_s and bwd_s (0: none or not recorded)
    # The dtype (torch's name: "float32", "bfloat16", "int64") of the input and of each block's output, as
    # measured; "" and () mean not recorded (a synthetic profile, or one older than this field): see ``dtypes``.
    input_dtype: str = ""
    out_dtype: tuple[str, ...] = ()
    # Bytes of the parameters that train (requires_grad), per block: each gets a gradient and optimizer state
    # (a Parameter each, so two tied by ``.data`` count twice here, once in ``param_bytes``). A gradient goes
    # back over a cut only if some block before it has any. () (a synthetic profile, or one older than this
    # field): every parameter trains, ``param_bytes``.
    train_bytes: tuple[float, ...] = ()
    # Bytes of each block's state dict as the weight exchange and a cut move send it (``splitfed.engine.rounds.
    # state_bytes`` of the block's keys): every key, so a tensor tied under two names (one Parameter held by two
    # modules, or two tied by ``.data``) travels under each, and persistent buffers (BatchNorm's running
    # statistics and its int64 counter) travel too; non-persistent buffers do not. () (a synthetic profile, or
    # one older than this field): ``param_bytes``.
    state_bytes: tuple[float, ...] = ()
    # Per sample, each block's backward FLOPs and saved activation bytes when its input needs a gradient, as a
    # U-shape tail's blocks run on the device (it sends the gradient of the tail's input back up, so it computes
    # it even when no block before the tail trains, where ``bwd_flops`` and ``act_bytes`` have none). Equal to
    # those wherever a block before it trains. () (a synthetic profile, or an older one): those.
    grad_bwd_flops: tuple[float, ...] = ()
    grad_act_bytes: tuple[float, ...] = ()
    # Per sample, what two blocks on one tier keep as one tensor, counted in both blocks' ``act_bytes``: a
    # triple (j, i, bytes) says block i keeps, of its input, bytes that block j < i keeps too (the ReLU ending
    # block j keeps its output; the conv starting block i = j + 1 keeps it as its input; a Flatten between them
    # passes the same storage on). j = -1: the input batch, which the device holds anyway. j is the last block
    # before i that keeps it, so the pair is one tensor whenever j and i are on one tier. ``grad_shared_act``
    # is the same with every input needing a gradient (``grad_act_bytes``, a U-shape tail). () (a synthetic
    # profile): none shared, every block's bytes its own.
    shared_act: tuple[tuple[int, int, float], ...] = ()
    grad_shared_act: tuple[tuple[int, int, float], ...] = ()
    # Per sample, what a server tier's blocks keep of the tensor it receives, which it holds for the whole step
    # anyway: a triple (k, i, bytes) says block i >= k, the first block from boundary k on to keep it (or a view
    # of it), keeps bytes of the boundary-k tensor as a tier starting at k takes it. None for a tensor a tier
    # takes with a gradient: it keeps a clone (``Segment``), never what it received. () (a synthetic profile):
    # nothing kept, every server tier holds its input besides its blocks' activations.
    input_kept: tuple[tuple[int, int, float], ...] = ()
    # Per sample, what blocks keep of the tensor a tier sends on, which it holds until the gradient comes back
    # anyway: a triple (k, j, bytes) says block j < k, the last block to keep it (j = -1: the input batch, a view
    # of which it is), keeps bytes of the boundary-k tensor (k >= 1). () (a synthetic profile): nothing kept.
    out_kept: tuple[tuple[int, int, float], ...] = ()
    # Per sample, a tensor a tier sends on that is (a view of) the one it received, which no block keeps: a
    # triple (k, lo, bytes) says the boundary-k tensor is bytes of the boundary-lo tensor as a tier starting at
    # lo takes it (without a gradient: with one, its segment works on a clone). () (a synthetic profile): none.
    out_views: tuple[tuple[int, int, float], ...] = ()
    # Per boundary (``n_blocks + 1``), whether training's gradient reaches the tensor there: no block from it on
    # detaches or computes without autograd (``engine.template.grad_reach``). A block whose output it does not
    # reach never runs a backward (its ``bwd_flops``, ``bwd_s`` and ``grad_bwd_flops`` are 0) and its
    # parameters never train (``train_bytes`` 0: no gradient, no optimizer state). () (a synthetic profile):
    # it reaches every boundary.
    grad_reach: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.names)
        if isinstance(self.reps, bool) or not isinstance(self.reps, int) or self.reps < 0:
            raise ConfigError(f"profile of {self.model}: reps must be an integer >= 0, got {self.reps!r}")
        object.__setattr__(self, "out_dtype", tuple(self.out_dtype))
        if self.out_dtype and len(self.out_dtype) != n:
            raise ConfigError(f"profile of {self.model}: out_dtype has {len(self.out_dtype)} entries for {n} blocks")
        for name in filter(None, (self.input_dtype, *self.out_dtype)):  # "": not recorded
            if not isinstance(name, str) or not isinstance(getattr(torch, name, None), torch.dtype):
                raise ConfigError(f"profile of {self.model}: {name!r} is not a torch dtype")
        if not self.train_bytes:
            object.__setattr__(self, "train_bytes", self.param_bytes)
        if not self.state_bytes:
            object.__setattr__(self, "state_bytes", self.param_bytes)
        if not self.grad_bwd_flops:
            object.__setattr__(self, "grad_bwd_flops", self.bwd_flops)
        if not self.grad_act_bytes:
            object.__setattr__(self, "grad_act_bytes", self.act_bytes)
        for f in ("fwd_flops", "bwd_flops", "param_bytes", "out_bytes", "act_bytes", "fixed_bytes", "train_bytes",
                  "state_bytes", "grad_bwd_flops", "grad_act_bytes"):
            v = getattr(self, f)
            object.__setattr__(self, f, tuple(float(x) for x in v))
            if len(v) != n:
                raise ConfigError(f"profile of {self.model}: {f} has {len(v)} entries for {n} blocks")
            if any(not x >= 0 for x in getattr(self, f)):
                raise ConfigError(f"profile of {self.model}: {f} has a negative or NaN entry")
        for f, whole in (("shared_act", self.act_bytes), ("grad_shared_act", self.grad_act_bytes)):
            object.__setattr__(self, f, _shared(self.model, f, getattr(self, f), whole))
        object.__setattr__(self, "input_kept", _kept(self.model, self.input_kept, self.act_bytes))
        object.__setattr__(self, "out_kept", _out_kept(self.model, "out_kept", self.out_kept, self.out_bytes, -1))
        object.__setattr__(self, "out_views", _out_kept(self.model, "out_views", self.out_views, self.out_bytes, 0))
        reach = tuple(self.grad_reach) or (True,) * (n + 1)
        if len(reach) != n + 1 or not all(isinstance(r, bool) for r in reach):
            raise ConfigError(f"profile of {self.model}: grad_reach needs {n + 1} booleans (one per boundary), got "
                              f"{list(self.grad_reach)!r}")
        object.__setattr__(self, "grad_reach", reach)
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "fwd_s", tuple(float(x) for x in self.fwd_s))
        object.__setattr__(self, "bwd_s", tuple(float(x) for x in self.bwd_s))
        if n < 1:
            raise ConfigError(f"profile of {self.model} has no blocks")

    @property
    def n_blocks(self) -> int:
        return len(self.names)

    @cached_property
    def dtypes(self) -> tuple[str, ...]:
        """The dtype of the tensor at each boundary: the input, then each block's output (``n_blocks + 1``).

        As measured; a profile that recorded none has float32 activations and a float32 input, or int64 token
        ids for a model with a vocabulary (``spec["vocab"]``), as :class:`~splitfed.models.zoo.ModelSpec` feeds it.
        """
        token = bool(self.spec and self.spec.get("vocab"))
        return (self.input_dtype or ("int64" if token else "float32"),
                *(self.out_dtype or ("float32",) * self.n_blocks))

    @cached_property
    def float_itemsize(self) -> tuple[float, ...]:
        """Per boundary, the bytes of one value if its tensor is floating, else 0: what a lossy codec
        compresses (it sends integer tensors, such as token ids, exactly)."""
        out = []
        for name in self.dtypes:
            d = getattr(torch, name)
            out.append(float(d.itemsize) if d.is_floating_point else 0.0)
        return tuple(out)

    def host_flops(self) -> float | None:
        """This host's measured training FLOP/s over the whole model (None if not measured)."""
        t = sum(self.fwd_s) + sum(self.bwd_s)
        work = (sum(self.fwd_flops) + sum(self.bwd_flops)) * self.batch
        return work / t if t > 0 and work > 0 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        d["version"] = PROFILE_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ModelProfile:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def synthetic(cls, fwd_flops: Sequence[float], out_bytes: Sequence[float], param_bytes: Sequence[float],
                  *, input_bytes: float, bwd_flops: Sequence[float] | None = None,
                  act_bytes: Sequence[float] | None = None, optimizer_slots: int = 1,
                  name: str = "synthetic", train_bytes: Sequence[float] | None = None,
                  state_bytes: Sequence[float] | None = None) -> ModelProfile:
        """A made-up profile (tests, what-if studies): backward = 2x forward, act = output, every parameter
        trains (``train_bytes`` = ``param_bytes``) and the state is the parameters (``state_bytes`` =
        ``param_bytes``: no buffer, no tie) by default; it knows no Parameters, so no Adam step counts."""
        n = len(fwd_flops)
        train = tuple(train_bytes if train_bytes is not None else param_bytes)
        if len(train) != len(param_bytes):
            raise ConfigError(f"profile of {name}: train_bytes has {len(train)} entries for {len(param_bytes)} blocks")
        state = tuple(state_bytes if state_bytes is not None else param_bytes)
        return cls(name, 1, tuple(f"b{i}" for i in range(n)), float(input_bytes), tuple(fwd_flops),
                   tuple(bwd_flops if bwd_flops is not None else [2 * f for f in fwd_flops]),
                   tuple(param_bytes), tuple(out_bytes),
                   tuple(act_bytes if act_bytes is not None else out_bytes),
                   tuple(fixed_memory(p, t, optimizer_slots) for p, t in zip(param_bytes, train, strict=True)),
                   optimizer_slots=optimizer_slots, train_bytes=train, state_bytes=state)


def _triples(model: str, field: str, triples: Sequence[Sequence[float]],
             legal: Callable[[int, int, float], bool], form: str) -> tuple[tuple[int, int, float], ...]:
    """``triples`` of the ``ModelProfile`` field ``field``: each two integers and bytes that are ``legal``, else
    refused, naming ``form``."""
    out: list[tuple[int, int, float]] = []
    for t in triples:
        try:
            a, b, n = t
            ok = float(a) == int(a) and float(b) == int(b) and legal(int(a), int(b), float(n))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"profile of {model}: {field} entry {t!r} is not {form}")
        out.append((int(a), int(b), float(n)))
    return tuple(out)


def _shared(model: str, field: str, triples: Sequence[Sequence[float]],
            act: Sequence[float]) -> tuple[tuple[int, int, float], ...]:
    """``triples`` checked as ``ModelProfile.shared_act`` (see there) against each block's ``act`` bytes."""
    out = _triples(model, field, triples, lambda j, i, b: -1 <= j < i < len(act) and b >= 0,
                   f"(j, i, bytes) with -1 <= j < i < {len(act)} and bytes >= 0")
    per_block = [0.0] * len(act)
    for _, i, b in out:
        per_block[i] += b
    if any(s > a * (1 + 1e-9) for s, a in zip(per_block, act, strict=True)):
        raise ConfigError(f"profile of {model}: {field} exceeds a block's activation bytes (a block shares more "
                          "than it keeps)")
    return out


def _kept(model: str, triples: Sequence[Sequence[float]],
          act: Sequence[float]) -> tuple[tuple[int, int, float], ...]:
    """``triples`` checked as ``ModelProfile.input_kept`` (see there) against each block's ``act`` bytes."""
    return _triples(model, "input_kept", triples,
                    lambda k, i, b: 0 <= k <= i < len(act) and 0 <= b <= act[i] * (1 + 1e-9),
                    f"(k, i, bytes) with 0 <= k <= i < {len(act)} and 0 <= bytes <= block i's activation bytes")


def _out_kept(model: str, field: str, triples: Sequence[Sequence[float]], out: Sequence[float],
              least: int) -> tuple[tuple[int, int, float], ...]:
    """``triples`` checked as ``ModelProfile.out_kept`` or ``out_views`` (see there; ``least``: the smallest j)
    against each boundary's bytes."""
    return _triples(model, field, triples,
                    lambda k, j, b: 1 <= k <= len(out) and least <= j < k and 0 <= b <= out[k - 1] * (1 + 1e-9),
                    f"(k, j, bytes) with 1 <= k <= {len(out)}, {least} <= j < k and 0 <= bytes <= the boundary's "
                    "bytes")


def fixed_memory(weight_bytes: float, train_bytes: float, optimizer_slots: int, train_tensors: int = 0) -> float:
    """A block's fixed memory: its weights (``weight_bytes``: its parameters and buffers, each storage once, as
    a tier holds them: ``splitfed.engine.template.held_bytes``), and for the parameters that train
    (``train_bytes``, ``train_tensors`` Parameters: ``template.trained_sizes``) a gradient and the optimizer's
    state, ``optimizer_slots`` tensors shaped as each and Adam's step counts (``engine.types.
    optimizer_state_bytes``, which a tier reserves too; the optimizer keeps no state for a parameter that never
    has a gradient)."""
    return weight_bytes + train_bytes + optimizer_state_bytes(optimizer_slots, train_bytes, train_tensors)


def state_dict_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s state dict as the weight exchange sends it (``splitfed.engine.rounds.state_bytes``):
    each key's tensor whole, so a tensor under two names counts twice; persistent buffers in, others out."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


_MEMORY: dict[str, ModelProfile] = {}



def _key(spec: ModelSpec, batch: int, optimizer_slots: int, where: torch.device) -> str:
    key = {"spec": spec.to_dict(), "batch": batch, "slots": optimizer_slots, "torch": torch.__version__,
           "host": platform.node(), "v": PROFILE_VERSION}
    code = code_digest(spec)
    if code:  # zoo models keep the keys they had
        key["code"] = code
    if where.type != "cpu":  # CPU profiles keep the keys they had before a device was a choice
        key["device"] = compute.describe(where)
    if torch.get_default_dtype() != torch.float32:  # a process that set another builds other parameters and
        key["default_dtype"] = str(torch.get_default_dtype())  # activations; float32 keeps the keys it had
    raw = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def default_cache_dir() -> Path | None:
    """Where measured profiles are kept: ``SPLITFED_PROFILE_CACHE``, else ``profiles`` in splitfed's cache
    (:func:`splitfed.cache.root`). None (no cache) passed on to :func:`profile_model` falls back to the variable,
    which is unset then: no cache at all is ``use_cache=False``."""
    from splitfed import cache

    mine = _variable_dir()
    if mine is not None:
        return mine
    base = cache.root()
    return None if base is None else base / "profiles"


def _variable_dir() -> Path | None:
    """``SPLITFED_PROFILE_CACHE`` as a folder (``~`` and a relative one as :func:`splitfed.cache.folder` reads
    them); None when unset."""
    from splitfed import cache

    env = os.environ.get(cache.PROFILE_ENV, "").strip()
    return cache.folder(env) if env else None


def profile_model(spec: ModelSpec, batch: int = 32, *, optimizer_slots: int = 1, reps: int = 3,
                  cache_dir: str | Path | None = None, seed: int = 0,
                  torch_device: str | torch.device = "cpu", use_cache: bool = True) -> ModelProfile:
    """The model's block profile; profiled once per (spec, batch, optimizer slots, device) and cached. Its
    times are measured on ``torch_device`` (a GPU: what a GPU tier's profile should say it does), each the
    median of ``reps`` timed runs.

    The cache (in memory, and on disk in ``cache_dir``, else ``SPLITFED_PROFILE_CACHE`` when set) holds
    one profile per key, the one timed with the most repetitions: one timed with fewer than ``reps`` is
    measured again and replaced; one with as many or more is returned (its medians are at least as good;
    FLOPs and bytes do not depend on ``reps``). Reps are not in the key, so the 1-rep profile ``optimize``
    keeps (it uses no times) gives way to the 3 reps ``profile`` asks for, and a 500-rep one serves both,
    with one file per model rather than one per reps ever asked. ``use_cache=False`` measures afresh and
    neither reads nor writes any cache (``--no-cache``; ``cache_dir=None`` means the default cache). A batch
    of ``GUARD_BATCH`` or more whose memory this host (or GPU) has not got is refused before it is measured.
    """
    if batch < 1:
        raise ConfigError(f"batch must be >= 1, got {batch}")
    if type(optimizer_slots) is not int or optimizer_slots not in (0, 1, 2):  # True and 1.0 are no count
        raise ConfigError(f"optimizer_slots must be 0 (plain SGD), 1 (SGD with momentum) or 2 (Adam), got "
                          f"{optimizer_slots!r}")
    if batch == 1:
        from splitfed.engine import template

        if why := template.one_sample_error(spec):  # as verify refuses it: not a traceback from the measurement
            raise ConfigError(f"batch 1: model {spec.name} cannot train on one sample ({why}); give a batch of 2 "
                              "or more")
    reps = max(1, reps)
    where = compute.torch_device(str(torch_device), "torch_device")  # "cuda" -> cuda:N, and there
    if not use_cache:
        return _measured(spec, batch, optimizer_slots, reps, seed, where)
    key = _key(spec, batch, optimizer_slots, where)
    if key in _MEMORY and _MEMORY[key].reps >= reps:
        return _MEMORY[key]
    cache_dir = cache_dir or _variable_dir()
    path = Path(cache_dir) / f"{spec.name.replace(':', '_').replace('/', '_')}-{key}.json" if cache_dir else None
    prof = _read_cache(path) if path is not None else None
    if prof is not None and prof.reps >= reps:
        _MEMORY[key] = prof
        return prof
    prof = _measured(spec, batch, optimizer_slots, reps, seed, where)
    _MEMORY[key] = prof
    if path is not None:
        _write_cache(path, prof)
    return prof


def _measured(spec: ModelSpec, batch: int, slots: int, reps: int, seed: int, where: torch.device) -> ModelProfile:
    from splitfed.engine.template import admit

    admit(spec)  # a model too large to build here is refused before it is built
    if batch >= GUARD_BATCH:
        _refuse_beyond_memory(spec, batch, slots, seed, where)
    return _measure(spec, batch, slots, reps, seed, where)


GUARD_BATCH = 4096  # from this batch on, a profile's memory is estimated before it is measured (a batch of 2 first)


def _refuse_beyond_memory(spec: ModelSpec, batch: int, slots: int, seed: int, where: torch.device) -> None:
    """Refuse a batch whose memory cannot be had here, before allocating it: Linux grants a large allocation and
    its OOM killer ends the process later (exit 137, no message), so ``_measure``'s MemoryError never comes.
    The estimate is a lower bound from a batch-2 profile: the parameters, and per sample the most any block
    holds at once of its input, the activations it keeps and its output (the measured peak was 2-5x it)."""
    small = _measure(spec, 2, slots, 1, seed, where)
    per_sample = max(i + a + o for i, a, o in zip((small.input_bytes, *small.out_bytes[:-1]), small.act_bytes,
                                                    small.out_bytes, strict=True))
    need = batch * per_sample + sum(small.param_bytes)
    if where.type == "cuda":  # what this process's allocator keeps cached is free to it too
        free = torch.cuda.mem_get_info(where)[0] + torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where)
        place = compute.describe(where)
    else:
        import psutil

        free, place = psutil.virtual_memory().available, "this host"
    if need > free:
        needs, has = mib_pair(need, free)  # a need just over what is free reads apart from it
        raise ConfigError(f"profiling model {spec.name} at batch {batch:,} needs at least {needs} "
                          f"({mib_text(per_sample)} a sample), and {place} has {has} available: use a "
                          "smaller --batch (a run's batch_size)")


def _read_cache(path: Path) -> ModelProfile | None:
    """The cached profile at ``path``; None (measure again) when absent, stale, broken or unreadable."""
    try:
        if not path.is_file():
            return None
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning("profile cache entry %s cannot be read (%s: %s); measuring again", path, type(e).__name__, e)
        return None
    try:
        if not isinstance(d, dict):
            raise TypeError(f"a JSON {type(d).__name__}, not an object")
        if any(f not in d for f in ("train_bytes", "state_bytes", "grad_bwd_flops", "grad_act_bytes",
                                    "shared_act", "input_kept", "out_kept", "out_views", "grad_reach")):
            # measured before frozen parameters were told apart: it may price a frozen part as trainable (its
            # gradients, optimizer state and backward) and a weight tied by .data twice; or before state bytes
            # were: its weight exchange would price the parameters only (no buffer, a tie once); or before a
            # U-shape tail's input gradient was: its tail would be priced without it; or before the bytes two
            # blocks share were: a tier's activations would be priced high; or before what a server tier keeps of
            # its input was: its input would be priced as kept by its blocks or not at all; measured again
            return None
        return ModelProfile.from_dict(d)
    except (ValueError, TypeError, ConfigError):
        return None  # a stale or broken cache entry is re-measured (and overwritten)


def _write_cache(path: Path, prof: ModelProfile) -> None:
    """Keep ``prof`` at ``path``; a cache that cannot be written is skipped with one warning."""
    try:
        write_atomic(path, json.dumps(prof.to_dict()))
    except OSError as e:
        log.warning("profile cache %s cannot be written (%s: %s); the profile is not kept on disk",
                    path.parent, type(e).__name__, e)


def _tensors(x: object) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, tuple | list):
        return [t for v in x for t in _tensors(v)]
    return []


def _nbytes(x: object) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(x))


def _dtype(x: object) -> str:
    """The dtype of a boundary's tensor (a link carries one; the model's output, which no link carries, may
    be a tuple: its first tensor's)."""
    ts = _tensors(x)
    return str(ts[0].dtype).removeprefix("torch.") if ts else "float32"


def _detach(x: object, grad: bool) -> object:
    """``x`` as a tier takes it: detached, needing a gradient if ``grad`` (and floating), and then cloned as
    :class:`~splitfed.models.segment.Segment` does (an in-place first op may not write a leaf that needs one)."""
    if isinstance(x, torch.Tensor):
        y = x.detach().requires_grad_(grad and x.is_floating_point())
        return y.clone() if y.requires_grad else y
    if isinstance(x, tuple | list):
        return type(x)(_detach(v, grad) for v in x)
    return x


def _backward(out: object) -> None:
    outs = [t for t in _tensors(out) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def _to(x: object, where: torch.device) -> object:
    if isinstance(x, torch.Tensor):
        return x.to(where)
    if isinstance(x, tuple | list):
        return type(x)(_to(v, where) for v in x)
    return x


def _measure(spec: ModelSpec, batch: int, slots: int, reps: int, seed: int,
             where: torch.device = torch.device("cpu")) -> ModelProfile:
    model, blocks = model_blocks(spec, seed)  # a wrong input shape is refused clearly, before batch-sized work
    model.train()
    try:
        return _measure_blocks(spec, blocks, batch, slots, reps, seed, where)
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, MemoryError) or "alloc" in str(e).lower() or "out of memory" in str(e).lower():
            raise ConfigError(f"profiling model {spec.name} at batch {batch} runs out of memory: "
                              f"{first_line(e)}; "
                              "use a smaller batch") from None
        raise


@dataclass(frozen=True)
class _Count:
    """One forward and backward of a block: its FLOPs and the bytes autograd saved for backward, with which
    of them are its input's (per input tensor: the bytes of its storage if saved, else 0) and which of its
    output tensors it saved or passes on from its input (a view: ``view_of``, the input tensor's index)."""

    out: object
    fwd_flops: int
    bwd_flops: int
    act_bytes: int
    kept_in: tuple[int, ...]
    kept_out: tuple[bool, ...]
    view_of: tuple[int | None, ...]


def _storages(x: object) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in _tensors(x)]


def _rnn_flops(input: Sequence[int], weights: Sequence[Sequence[int]]) -> int:
    """The matmul FLOPs of a fused RNN kernel: each weight matrix (``w_ih``, ``w_hh``, ``w_hr``) multiplies one
    vector per time step and sample (``input``'s leading dimensions, packed or not)."""
    steps = 1
    for d in input[:-1]:
        steps *= d
    return 2 * steps * sum(w[0] * w[1] for w in weights if len(w) == 2)


def _rnn_layer(input: Sequence[int], w_ih: Sequence[int], w_hh: Sequence[int], *_: object, **__: object) -> int:
    return _rnn_flops(input, [w_ih, w_hh])  # one layer, one direction (mkldnn's LSTM on CPU)


def _rnn(input: Sequence[int], weights: Sequence[Sequence[int]], *_: object, **__: object) -> int:
    return _rnn_flops(input, weights)  # every layer and direction at once (cuDNN, MIOpen)


_aten = torch.ops.aten
# kernels torch's FlopCounterMode has no formula for, so an LSTM on CPU (mkldnn) and any RNN on a GPU counted 0
# FLOPs and was priced free; the backward computes the gradients of the input and of the weights: twice the forward
_RNN_FLOPS: dict[object, Callable[..., int]] = {
    _aten.mkldnn_rnn_layer: _rnn_layer, _aten._cudnn_rnn: _rnn, _aten.miopen_rnn: _rnn,
    _aten.mkldnn_rnn_layer_backward: lambda *a, **k: 2 * _rnn_layer(*a, **k),
    _aten._cudnn_rnn_backward: lambda *a, **k: 2 * _rnn(*a, **k),
    _aten.miopen_rnn_backward: lambda *a, **k: 2 * _rnn(*a, **k),
}


def _count(block: torch.nn.Module, xin: object, own: set[int]) -> _Count:
    """One forward and backward of ``block`` on ``xin``: FLOPs both ways and the tensors autograd saves for
    backward (unique storages, the block's own parameters and buffers excluded)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with FlopCounterMode(display=False, custom_mapping=_RNN_FLOPS) as fc, \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(xin)
    f_flops = fc.get_total_flops()
    with FlopCounterMode(display=False, custom_mapping=_RNN_FLOPS) as fc:
        _backward(out)
    # the saved storages are alive until the backward: none of them can have the address of ``out``'s or
    # ``xin``'s (both still alive here) without being it
    ins, outs = _storages(xin), _storages(out)
    kept_in = tuple(saved[p] if p in saved and p and p not in ins[:q] else 0 for q, p in enumerate(ins))
    view_of = tuple(ins.index(p) if p in ins and p else None for p in outs)
    return _Count(out, f_flops, fc.get_total_flops(), sum(saved.values()), kept_in,
                  tuple(bool(p) and p in saved for p in outs), view_of)


class _Received:
    """Which boundaries' tensors each input of the block being crossed is (itself or a view), among those a
    tier starting there takes without a gradient and no block since has kept: what makes the triples of
    ``ModelProfile.input_kept``."""

    def __init__(self, inputs: int) -> None:
        self.open: list[list[int]] = [[0] for _ in range(inputs)]  # nothing trains before block 0: no clone
        self.kept: list[tuple[int, int, float]] = []
        self.views: list[tuple[int, int, float]] = []  # ModelProfile.out_views

    def cross(self, i: int, run: _Count, batch: int, cloned: Sequence[bool]) -> None:
        """Block ``i`` ran; ``cloned[p]``: a tier starting after it takes output ``p`` with a gradient."""
        opened = self.open + [[] for _ in range(len(run.kept_in) - len(self.open))]
        for q, b in enumerate(run.kept_in):
            if b:
                self.kept += [(k, i, b / batch) for k in opened[q]]
                opened[q] = []
        outs = _tensors(run.out)
        for v, t in zip(run.view_of, outs, strict=True):
            if v is not None:
                self.views += [(i + 1, k, min(t.untyped_storage().nbytes(), _nbytes(t)) / batch) for k in opened[v]]
        self.open = [([] if v is None else opened[v]) + ([] if c else [i + 1])
                     for v, c in zip(run.view_of, cloned, strict=True)]


class _Keepers:
    """Which block last kept each tensor at the boundary being crossed, block after block: what makes the
    triples of ``ModelProfile.shared_act``."""

    def __init__(self, inputs: int, batch: bool) -> None:
        self.last: list[int | None] = [-1 if batch else None] * inputs  # -1: the batch the device holds
        self.shared: list[tuple[int, int, float]] = []

    def cross(self, i: int, run: _Count, batch: int) -> None:
        last = self.last + [None] * (len(run.kept_in) - len(self.last))
        for q, b in enumerate(run.kept_in):
            if b:
                j = last[q]
                if j is not None:
                    self.shared.append((j, i, b / batch))
                last[q] = i
        self.last = [i if kept else (None if v is None else last[v])
                     for kept, v in zip(run.kept_out, run.view_of, strict=True)]


def _measure_blocks(spec: ModelSpec, blocks: Blocks, batch: int, slots: int, reps: int,
                    seed: int, where: torch.device) -> ModelProfile:
    x: object = _to(spec.example_input(batch), where)
    input_bytes, input_dtype = _nbytes(x) / batch, _dtype(x)
    dtypes: list[str] = []

    def now() -> float:  # a GPU runs behind its caller: wait for it before reading the clock
        if where.type == "cuda":
            torch.cuda.synchronize(where)
        return time.perf_counter()

    names, fwd, bwd, pbytes, tbytes, sbytes, obytes, abytes, fixed, fwd_s, bwd_s, gbwd, gact = (
        [] for _ in range(13))
    keepers = _Keepers(len(_tensors(x)), batch=True)  # as training runs the blocks
    grad_keepers = _Keepers(len(_tensors(x)), batch=False)  # with an input gradient (a tail: never block 0's)
    received = _Received(len(_tensors(x)))
    sent: list[tuple[int, int, float]] = []  # out_kept
    from splitfed.engine import template  # the engine's own rule for what gets a gradient

    reach = template.grad_reach(spec)  # blocks whose output no gradient reaches never run a backward
    # which inputs need a gradient, as a tier takes them: asked now, as the template's lock is taken before
    # torch's generator (template's own order), never while the generator is held (two threads would deadlock)
    trains = [template.trains_before(spec, i) for i in range(len(blocks.modules) + 1)]
    with rng.seeded(seed):  # dropout draws from torch's generator; a tier or run may share the process
        for i, block in enumerate(blocks.modules):
            block.to(where)
            trained = trains[i]  # its input needs a gradient, as a tier takes it
            xin = _detach(x, grad=trained)
            params = list(block.parameters())
            p_bytes = param_sizes(params)[1]
            # what trains: a gradient reaches it (none through a block after it that detaches)
            t_bytes, t_tensors = template.trained_sizes(block) if reach[i + 1] else (0, 0)
            own = {p.untyped_storage().data_ptr() for p in [*params, *block.buffers()]}
            run = _count(block, xin, own)
            out = run.out
            tf, tb = [], []
            for rep in range(reps + 1):  # the first run warms caches up and is not counted
                xin = _detach(x, grad=trained)
                t0 = now()
                o = block(xin)
                t1 = now()
                _backward(o)
                t2 = now()
                if rep:
                    tf.append(t1 - t0)
                    tb.append(t2 - t1)
            # a U-shape tail's input always needs a gradient (the device sends it back up): its blocks as then
            grad_run = run if trained else _count(block, _detach(x, grad=True), own)
            block.zero_grad(set_to_none=True)
            names.append(blocks.names[i])
            fwd.append(run.fwd_flops / batch)
            bwd.append(run.bwd_flops / batch if reach[i + 1] else 0.0)
            pbytes.append(p_bytes)
            tbytes.append(t_bytes)
            sbytes.append(state_dict_bytes(block))
            obytes.append(_nbytes(out) / batch)
            dtypes.append(_dtype(out))
            abytes.append(run.act_bytes / batch)
            gbwd.append(grad_run.bwd_flops / batch if reach[i + 1] else 0.0)
            gact.append(grad_run.act_bytes / batch)
            keepers.cross(i, run, batch)
            sent += [(i + 1, j, min(t.untyped_storage().nbytes(), _nbytes(t)) / batch)
                     for t, j in zip(_tensors(out), keepers.last, strict=True) if j is not None]
            grad_keepers.cross(i, grad_run, batch)
            fixed.append(fixed_memory(param_sizes([*params, *block.buffers()])[1], t_bytes, slots, t_tensors))
            fwd_s.append(statistics.median(tf))
            bwd_s.append(statistics.median(tb) if reach[i + 1] else 0.0)
            x = _detach(out, grad=False)
            received.cross(i, run, batch, [trains[i + 1] and t.is_floating_point() for t in _tensors(out)])
    return ModelProfile(spec.name, batch, tuple(names), input_bytes, tuple(fwd), tuple(bwd), tuple(pbytes),
                        tuple(obytes), tuple(abytes), tuple(fixed), tuple(fwd_s), tuple(bwd_s),
                        optimizer_slots=slots, spec=spec.to_dict(), reps=reps,
                        host=platform.node() + (f" ({compute.describe(where)})" if where.type != "cpu" else ""),
                        input_dtype=input_dtype, out_dtype=tuple(dtypes), train_bytes=tuple(tbytes),
                        state_bytes=tuple(sbytes), grad_bwd_flops=tuple(gbwd), grad_act_bytes=tuple(gact),
                        shared_act=tuple(keepers.shared), grad_shared_act=tuple(grad_keepers.shared),
                        input_kept=tuple(received.kept), out_kept=tuple(sent), out_views=tuple(received.views),
                        grad_reach=tuple(reach))


def clear_cache() -> None:
    """Forget in-memory profiles (tests)."""
    _MEMORY.clear()


__all__ = ["ModelProfile", "clear_cache", "fixed_memory", "param_sizes", "profile_model", "state_dict_bytes"]
