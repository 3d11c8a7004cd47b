"""One built copy of each model per process: replicas are deep copies of its blocks.

Building and tracing a model is slow; every tier, device and reference in a
process reuses the template and copies only the blocks it needs.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import fx, nn

from splitfed.engine.limits import DEFAULT_LIMITS, current_limits
from splitfed.engine.types import State
from splitfed.errors import ResourceExhausted, SplitfedError
from splitfed.models import rng
from splitfed.models.segment import Blocks, Segment
from splitfed.models.tying import param_sizes
from splitfed.models.zoo import ZOO, ModelSpec, build, first_line, input_error, model_blocks
from splitfed.units import mib_pair

# Lock order: a cached function's key (:class:`_Once`), then the template's ``_lock``, then torch's generator
# (``rng.LOCK``); never one of them while holding a later one.
_lock = threading.Lock()

SMALL_INPUT_BYTES = 1 << 20  # above this, a forward pass on meta sizes the activations (~2 s once a process)
SMALL_NUM_CLASSES = 1000  # above this, a zoo model's head alone may exceed the limits: it is measured
SMALL_VOCAB = 1 << 16  # above this, a zoo token model's embedding table alone may exceed the limits: it is measured
TEMPLATE_CACHE_BYTES = 256 << 20  # built templates kept beyond the last one used: at most this many bytes of weights
TEMPLATE_CACHE_SIZE = 16


_DTYPE = "__default_dtype__"  # in a key only when torch's default dtype is not float32


def _key(spec: ModelSpec) -> str:
    """The caches' key: the spec, and torch's default dtype where a process set another (a model built then has
    float64 weights and boundaries, say: a float32 template must not serve it)."""
    d = spec.to_dict()
    if torch.get_default_dtype() != torch.float32:
        d[_DTYPE] = str(torch.get_default_dtype())
    return json.dumps(d, sort_keys=True)


def _spec(key: str) -> ModelSpec:
    d = json.loads(key)
    d.pop(_DTYPE, None)  # the build reads torch's default itself, as the key recorded it
    return ModelSpec.from_dict(d)


R = TypeVar("R")


@dataclass
class _Asked:
    """The threads asking a :class:`_Once` for one key now, and the lock the first of them computes it under."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    askers: int = 0


class _Once(Generic[R]):
    """``functools.lru_cache`` whose concurrent first calls for one key compute it once: the others wait for that
    call and take its answer from the cache. Threads asking about a new model at once each built it (9 builds of
    a user's model instead of 2), or probed it again. Other keys go on meanwhile."""

    def __init__(self, fn: Callable[..., R], maxsize: int) -> None:
        self._cached = functools.lru_cache(maxsize=maxsize)(fn)
        self._asked: dict[tuple[Hashable, ...], _Asked] = {}
        self._guard = threading.Lock()  # held only to update ``_asked``: nothing is taken under it
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Hashable) -> R:
        with self._guard:
            asked = self._asked.setdefault(args, _Asked())
            asked.askers += 1
        try:
            with asked.lock:  # a thread computing it: wait for it, then take its answer from the cache
                return self._cached(*args)
        finally:
            with self._guard:
                asked.askers -= 1
                if not asked.askers:
                    del self._asked[args]

    def cache_clear(self) -> None:
        self._cached.cache_clear()


def _once(maxsize: int) -> Callable[[Callable[..., R]], _Once[R]]:
    """Cache a function as :class:`_Once` does."""
    return lambda fn: _Once(fn, maxsize)


@_once(256)
def _size(key: str, model_bytes: int) -> tuple[int, int]:
    spec = _spec(key)
    peak = [0]

    def hook(_m: nn.Module, _i: object, out: object) -> None:
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                peak[0] = max(peak[0], t.numel() * t.element_size())

    with torch.device("meta"):  # draws nothing from torch's generator: meta tensors hold no values
        model = build(spec)
        # each storage once, as the profile counts them: two Parameters tied by ``.data`` are one weight in memory
        params = param_sizes(list(model.parameters()))[1]
        if params > model_bytes:  # refused anyway: spare the forward pass
            return params, 0
        x = spec.example_input(1)
        peak[0] = x.numel() * x.element_size()
        if peak[0] <= SMALL_INPUT_BYTES:  # activations are bounded by the parameter check
            return params, peak[0]
        hooks = [m.register_forward_hook(hook) for m in model.modules()]
        try:
            with torch.no_grad():
                model(x)
        except SplitfedError:
            raise
        except Exception as e:  # noqa: BLE001 - a shape error on meta is the input's fault
            raise input_error(spec, e) from None
        finally:
            for h in hooks:
                h.remove()
    return params, peak[0]


def size(spec: ModelSpec) -> tuple[int, int]:
    """(parameter bytes, largest tensor for one sample), measured without allocating the model; parameter
    bytes count each storage once (two Parameters tied by ``.data`` are one weight), as the profile does.

    For inputs up to SMALL_INPUT_BYTES a sample the second number is the input's size: there
    the default parameter limit already bounds every activation of the zoo's models. The
    second number is 0 when the parameters alone exceed this process's limit.
    """
    return _size(_key(spec), current_limits().model_bytes)


def admit(spec: ModelSpec) -> None:
    """Refuse a model too large to build here (see splitfed.engine.limits).

    Under the default limits a zoo model as the zoo defines it, on a small input, is
    admitted unmeasured: sizing imports PyTorch's meta kernels (1-2 s once a process),
    and those models are small.
    """
    lim = current_limits()
    if small(spec):
        return
    params, peak = size(spec)
    if params > lim.model_bytes:
        kwargs = f" {dict(spec.kwargs)}" if spec.kwargs else ""
        has, most = mib_pair(params, lim.model_bytes)
        raise ResourceExhausted(f"model {spec.name!r}{kwargs} has {has} of parameters; this process builds at "
                                f"most {most}")
    if peak > lim.sample_bytes:
        makes, most = mib_pair(peak, lim.sample_bytes)
        raise ResourceExhausted(f"model {spec.name!r} with input {list(spec.input_shape)} makes a "
                                f"{makes} tensor per sample; at most {most}")


def small(spec: ModelSpec) -> bool:
    """Whether ``spec`` is a zoo model as the zoo defines it, on a small input, under the default limits:
    admitted unmeasured, and cheap to build."""
    lim = current_limits()
    return (spec.name in ZOO and not spec.kwargs and math.prod(spec.input_shape) * 8 <= SMALL_INPUT_BYTES
            and spec.num_classes <= SMALL_NUM_CLASSES and spec.vocab <= SMALL_VOCAB
            and lim.model_bytes >= DEFAULT_LIMITS.model_bytes and lim.sample_bytes >= DEFAULT_LIMITS.sample_bytes)


_templates: OrderedDict[str, tuple[Blocks, int]] = OrderedDict()  # key -> (blocks, bytes of weights), LRU last


def _template(key: str) -> Blocks:
    """The built blocks of ``key`` (call under ``_lock``). Kept: the last one used, and others while all of them
    hold at most TEMPLATE_CACHE_BYTES of weights (a Describe of many large models does not keep them all)."""
    hit = _templates.get(key)
    if hit is not None:
        _templates.move_to_end(key)
        return hit[0]
    blocks = model_blocks(_spec(key), seed=0)[1]
    nbytes = sum(t.numel() * t.element_size() for m in blocks.modules for t in [*m.parameters(), *m.buffers()])
    _templates[key] = (blocks, nbytes)
    while len(_templates) > 1 and (len(_templates) > TEMPLATE_CACHE_SIZE
                                   or sum(n for _, n in _templates.values()) > TEMPLATE_CACHE_BYTES):
        _templates.popitem(last=False)
    return blocks


def template(spec: ModelSpec) -> Blocks:
    """The shared, never-trained blocks of ``spec`` (do not mutate them)."""
    admit(spec)  # outside the cache: limits apply to a model built before they were set
    with _lock:
        return _template(_key(spec))


def _copy(block: nn.Module) -> nn.Module:
    """A copy of ``block`` as ``copy.deepcopy`` makes it (its own parameters, buffers and tensors, its mode, the
    same forward), without recompiling the torch.fx GraphModules in it: ``GraphModule.__deepcopy__`` copies the
    graph and generates and execs its Python code again (~3 ms a block), every time a tier or device copies a
    traced model's blocks. Here each GraphModule (the block, or one nested in a wrapper) is copied as a module:
    its attributes deep-copied, its graph shared with the template's (never edited once built), and its class a
    subclass of the template's, so the copy runs the template's compiled forward, and a ``recompile`` of the
    copy (pickling one does it) sets its own class's forward, never the template's."""
    gms = [m for m in block.modules() if isinstance(m, fx.GraphModule)]
    if not gms:
        return copy.deepcopy(block)
    memo: dict[int, object] = {}
    shells: list[tuple[fx.GraphModule, fx.GraphModule]] = []
    for gm in gms:  # every GraphModule's copy made first, so the deepcopy of a wrapper finds it in ``memo``
        cls = type(gm)
        # named as fx names its per-instance classes, which GraphModule.__new__ (a deepcopy of this copy) skips;
        # the template's call wrapper its own, or a recompile of the copy makes one that calls the template
        # class's __call__, which calls the copy's wrapper again
        own = {"__qualname__": cls.__qualname__, "__module__": cls.__module__}
        if "_wrapped_call" in vars(cls):
            own["_wrapped_call"] = vars(cls)["_wrapped_call"]
        sub = type(cls.__name__, (cls,), own)
        shell: fx.GraphModule = object.__new__(sub)
        memo[id(gm)] = shell
        memo[id(gm.graph)] = gm.graph  # shared: its nodes name the targets, which each copy holds its own
        shells.append((gm, shell))
    for gm, shell in shells:
        shell.__dict__.update(copy.deepcopy(gm.__dict__, memo))
    out = copy.deepcopy(block, memo)  # the block's own copy when it is a GraphModule, else its wrapper's
    assert isinstance(out, nn.Module)
    return out


def copy_blocks(spec: ModelSpec, start: int, stop: int) -> dict[int, nn.Module]:
    """Blocks ``[start, stop)`` of ``spec``'s template, each copied on its own (:func:`_copy`)."""
    t = template(spec)
    with _lock:
        return {i: _copy(t.modules[i]) for i in range(start, stop)}


def num_blocks(spec: ModelSpec) -> int:
    return len(template(spec))


def whole_model(spec: ModelSpec, state: State) -> Segment:
    """The unsplit model (every block, copied) holding ``state``: what a run evaluates, and what split training
    is checked against."""
    n = num_blocks(spec)
    seg = Segment({str(i): b for i, b in copy_blocks(spec, 0, n).items()}, 0, n)
    with torch.no_grad():
        seg.load_state_dict(state, strict=True)
    return seg


@_once(256)
def _boundaries(key: str) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    spec = _spec(key)
    blocks = template(spec)
    x = spec.example_input(2)
    out = [(tuple(x.shape[1:]), x.dtype)]
    # seeded: a model may draw in eval mode too, from torch's generator that other threads seed and draw from
    with _lock, rng.seeded(), torch.no_grad():
        modes = [m.training for m in blocks.modules]
        try:
            for m in blocks.modules:
                m.eval()
                x = m(x)
                out.append((tuple(x.shape[1:]), x.dtype))
        finally:
            for m, mode in zip(blocks.modules, modes, strict=True):
                m.train(mode)
    return tuple(out)


def boundary(spec: ModelSpec, index: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-sample shape and dtype of the tensor entering block ``index`` (``L``: the logits)."""
    return _boundaries(_key(spec))[index]


@_once(64)
def _one_sample_error(key: str) -> str:
    spec = _spec(key)
    whole = _copy(template(spec).whole()).train()  # a copy: its statistics may move
    try:
        # dropout draws from torch's generator: under its lock, and given back as it was (splitfed.models.rng),
        # or a thread's seeded step (a tier's, a client's) draws another mask, and the caller's next draws move
        with rng.seeded(), torch.no_grad():
            whole(spec.example_input(1))
    except Exception as e:  # noqa: BLE001 - whatever a layer raises for one sample
        return first_line(e)
    return ""


def one_sample_error(spec: ModelSpec) -> str:
    """Why the model cannot train on a batch of one sample ("": it can): a BatchNorm over one value per
    channel has no spread to normalise by, so a client whose last batch holds one sample fails each round."""
    return _one_sample_error(_key(spec))


@_once(256)
def _first_block_takes(key: str, dtype: torch.dtype) -> bool:
    spec = _spec(key)
    block = copy_blocks(spec, 0, 1)[0].eval()  # a copy: the template is shared, and never run here
    try:
        with rng.seeded(0), torch.no_grad():
            block(spec.example_input(2).to(dtype))
    except Exception:  # noqa: BLE001 - whatever the block raises for that dtype: it does not take it
        return False
    return True


def first_block_takes(spec: ModelSpec, dtype: torch.dtype) -> bool:
    """Whether block 0 of the model runs on its example input given as ``dtype`` (a user's model may cast
    its own input, e.g. uint8 images): such a model keeps taking it on the device, as it did."""
    return _first_block_takes(_key(spec), dtype)


@_once(256)
def _stateful(key: str) -> tuple[bool, ...]:
    blocks = template(_spec(key))
    with _lock:
        return tuple(bool(m.state_dict()) for m in blocks.modules)


def has_state(spec: ModelSpec, index: int) -> bool:
    """Whether block ``index`` holds weights or buffers (a load must give them; a ReLU has none)."""
    return _stateful(_key(spec))[index]


def trained_sizes(module: nn.Module) -> tuple[int, int]:
    """Bytes and number of ``module``'s Parameters that train (``requires_grad``), each Parameter once (two tied
    by ``.data`` share a weight but each gets its own gradient and optimizer state): what gets a gradient and
    optimizer state where a gradient reaches the module, as the profile and a tier both count it."""
    params = [p for p in module.parameters() if p.requires_grad]
    return sum(p.numel() * p.element_size() for p in params), len(params)


@_once(256)
def _held(key: str) -> tuple[tuple[int, int, int], ...]:
    blocks = template(_spec(key))
    gets = _gets_gradient(key)  # before the lock: it takes it itself
    with _lock:
        return tuple((param_sizes([*m.parameters(), *m.buffers()])[1], *(trained_sizes(m) if got else (0, 0)))
                     for m, got in zip(blocks.modules, gets, strict=True))


def held_bytes(spec: ModelSpec, index: int) -> tuple[int, int]:
    """Block ``index``'s bytes of weights and buffers (each storage once), and of the parameters that train
    (:func:`trained_sizes`): what a tier holds for it, besides a gradient per byte that trains and the optimizer's
    state (:func:`train_tensors`). A block whose parameters no gradient reaches (:func:`gets_gradient`: one
    before a block that detaches) trains none: they never get a ``.grad``, so the optimizer, which makes its state
    lazily, keeps none for them. The cost model prices both alike (``ModelProfile.train_bytes``)."""
    weights, trains, _ = _held(_key(spec))[index]
    return weights, trains


def train_tensors(spec: ModelSpec, index: int) -> int:
    """How many Parameters of block ``index`` train (:func:`trained_sizes`; 0 where no gradient reaches it): the
    optimizer keeps a step count for each besides its slots (``engine.types.optimizer_state_bytes``)."""
    return _held(_key(spec))[index][2]


@_once(256)
def _passes(key: str) -> tuple[bool, ...]:
    """Per block, whether a gradient of its output reaches its input: not through a block that detaches,
    computes without autograd (argmax, a comparison, ``torch.no_grad``) or takes integers (token ids). Found
    by one backward per block on the example input in training mode, as a tier runs it (a block whose forward
    differs in eval mode may stop the gradient in one mode only); each block runs as a copy, so the template is
    never run with autograd on: a pruned or weight-normed layer (``torch.nn.utils.prune``, ``weight_norm``)
    recomputes its weight in a forward pre-hook, and one left in the template as a non-leaf tensor makes every
    later copy of it (a tier's, a device's) fail in ``copy.deepcopy``."""
    spec = _spec(key)
    blocks = template(spec)
    x: object = spec.example_input(2)
    out: list[bool] = []
    with _lock, rng.seeded(), torch.enable_grad():
        for block in blocks.modules:
            m = _copy(block).train()
            if not isinstance(x, torch.Tensor):  # a structure between blocks: taken as passing, as before
                out.append(True)
                x = m(x)
                continue
            leaf = x.detach().requires_grad_(x.is_floating_point())
            y = m(leaf.clone() if leaf.requires_grad else leaf)  # a clone: an in-place first op may write it
            ys = [t for t in (y if isinstance(y, tuple | list) else [y])
                  if isinstance(t, torch.Tensor) and t.requires_grad]
            got = (torch.autograd.grad(ys, [leaf], [torch.ones_like(t) for t in ys], allow_unused=True)[0]
                   if leaf.requires_grad and ys else None)
            out.append(got is not None)
            x = y.detach() if isinstance(y, torch.Tensor) else y
    return tuple(out)


def grad_reach(spec: ModelSpec) -> tuple[bool, ...]:
    """Per boundary k (``0..L``), whether training's gradient reaches the tensor there: every block from k on
    lets it through (:func:`_passes`); ``L``, the logits, always."""
    passes = _passes(_key(spec))
    reach = [True]
    for p in reversed(passes):
        reach.append(reach[-1] and p)
    return tuple(reversed(reach))


@_once(256)
def _gets_gradient(key: str) -> tuple[bool, ...]:
    """Per block, whether its parameters train in training: some ``requires_grad``, and the gradient reaches its
    output (:func:`grad_reach`)."""
    spec = _spec(key)
    blocks = template(spec)
    reach = grad_reach(spec)
    with _lock:
        return tuple(any(p.requires_grad for p in m.parameters()) and reach[i + 1]
                     for i, m in enumerate(blocks.modules))


def gets_gradient(spec: ModelSpec, index: int) -> bool:
    """Whether block ``index``'s parameters get a gradient in training (``_gets_gradient``)."""
    return _gets_gradient(_key(spec))[index]


def trains_before(spec: ModelSpec, index: int) -> bool:
    """Whether a block before ``index`` has parameters that a gradient reaches (:func:`gets_gradient`): only
    then does the gradient of the tensor entering block ``index`` have a use, so only then does a tier compute
    it and send it back (a frozen part on the device has none: its device would discard it; nor has a part
    before a block that detaches). The cost model prices it on the same rule (``ModelProfile.train_bytes``,
    measured on it)."""
    return any(_gets_gradient(_key(spec))[:index])
