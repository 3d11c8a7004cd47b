"""Model -> blocks -> segments.

A *block* is the unit between two legal cut positions. Sequential models give
their children. Other models are traced with ``torch.fx``; a position between
two graph nodes is a legal cut only if exactly one value is live across it (so
no cut ever falls inside a residual block or between a layer and a skip that
uses its input), and no module or parameter is used on both sides of it.
Parameter-free blocks of a traced model are merged into the block before them,
which keeps the cut *after* a pool or activation (the smaller tensor).

Whatever the model's kind, blocks that hold one tensor between them (weight
tying: a parameter or buffer object two blocks use) become one block, as do
blocks with a tuple crossing between them (:func:`join_at_tuples`): a tier
trains its own copy of its blocks and sends one tensor on, so a cut there would
untie the weight or have nothing to send.

A *segment* is the contiguous run of blocks ``[start, stop)`` one tier holds.
Its ``state_dict`` keys are ``"<block index>.<key inside block>"``, the same keys
as the whole model's, so replicas of a block are averaged by key wherever they
were trained.

Tensors that share storage (``b.weight.data = a.weight.data``: two Parameters, one
storage) tie their blocks as one tensor object does, and a joined block's copy
(:class:`_Joined`) keeps that storage shared. A cut also needs the batch in the
first dimension of the tensor crossing it (a sequence-first LSTM's ``[T, B, d]``
is no legal boundary): :func:`join_at_tuples` joins the blocks around one that is
not. A forward's extra parameters with defaults (``forward(self, x, mask=None)``)
are traced at their defaults.

Tracing can change what a model computes: a custom ``torch.autograd.Function``
loses its backward, ``torch.no_grad()`` in forward is not recorded, tensor code
that does not depend on the input runs once at trace time, and hooks on the model
itself never run. Hooks on the model are refused up front (:func:`refuse_root_hooks`);
:func:`check_trains_as_model` trains a traced model's blocks beside a second
instance of the model and refuses the model if any number differs.

Every block that draws random numbers (dropout, ``nn.RReLU``, an RNN's or an
attention's dropout, ``torch.randn_like``... in its graph, or found by running it
twice under two seeds: :func:`stochastic_flags`) is re-seeded per step by
:class:`Segment`, so the same block draws the same numbers on any tier.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
import os
import re
import traceback
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import fx, nn

from splitfed.cut_order import check_order
from splitfed.errors import ConfigError, CutError
from splitfed.models import rng as _rng

_F = torch.nn.functional
# functions and tensor methods that draw from torch's generator (dropout, random activations, noise)
_STOCHASTIC_FUNCS = {
    f for f in (
        _F.dropout, _F.dropout1d, _F.dropout2d, _F.dropout3d, _F.alpha_dropout, _F.feature_alpha_dropout,
        _F.rrelu, _F.rrelu_, _F.gumbel_softmax,
        *(getattr(torch, n, None) for n in (
            "dropout", "dropout_", "alpha_dropout", "alpha_dropout_", "feature_dropout", "feature_dropout_",
            "feature_alpha_dropout", "feature_alpha_dropout_", "native_dropout", "rrelu", "rrelu_",
            "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
            "normal", "bernoulli", "multinomial", "poisson", "binomial")),
    ) if f is not None
}
_STOCHASTIC_METHODS = {"uniform_", "normal_", "bernoulli", "bernoulli_", "random_", "exponential_", "geometric_",
                       "cauchy_", "log_normal_", "multinomial"}
STOCHASTIC_ATTR = "_splitfed_stochastic"  # set on a block found to draw random numbers by running it
_PRESERVED = getattr(fx.graph_module, "_USER_PRESERVED_ATTRIBUTES_KEY", "_user_preserved_attributes")


@dataclass
class Blocks:
    """The ordered blocks of one model; ``modules[i]`` shares parameters with the model."""

    modules: list[nn.Module]
    names: list[str]
    traced: bool

    def __len__(self) -> int:
        return len(self.modules)

    def whole(self) -> Segment:
        return make_segment(self, 0, len(self))


def _is_stochastic(block: nn.Module) -> bool:
    """Whether ``block`` draws random numbers in training: a module or graph node known to, or a block
    :func:`stochastic_flags` saw doing so (:data:`STOCHASTIC_ATTR`)."""
    if getattr(block, STOCHASTIC_ATTR, False):
        return True
    for m in block.modules():
        if isinstance(m, (nn.modules.dropout._DropoutNd, nn.RReLU)):
            return True
        if isinstance(m, (nn.RNNBase, nn.MultiheadAttention)) and float(getattr(m, "dropout", 0) or 0) > 0:
            return True
        if isinstance(m, fx.GraphModule) and any(
                (n.op == "call_function" and n.target in _STOCHASTIC_FUNCS)
                or (n.op == "call_method" and n.target in _STOCHASTIC_METHODS) for n in m.graph.nodes):
            return True
    return False


class Segment(nn.Sequential):
    """Blocks ``[start, stop)`` of one model, keyed by their global index.

    ``forward(x, rng=...)`` re-seeds torch's generator before every block with
    dropout from ``(rng, block index)``, so the same block draws the same mask
    whichever tier or process runs it.
    """

    def __init__(self, blocks: Mapping[str, nn.Module], start: int, stop: int) -> None:
        super().__init__(OrderedDict(blocks))
        self.start, self.stop = start, stop
        self._stochastic = {name: _is_stochastic(b) for name, b in blocks.items()}

    def forward(self, x: torch.Tensor, rng: int | None = None) -> torch.Tensor:
        if x.is_leaf and x.requires_grad:  # a tier's input, whose .grad it sends back: an in-place first op
            x = x.clone()                  # (ReLU(inplace=True)) may not write a leaf that requires grad
        for name, block in self._modules.items():
            if rng is not None and self._stochastic[name]:
                # torch's generators are process-wide (splitfed.models.rng): the one of the device x is on,
                # given back as it was (a caller's own draws after a step are theirs, not this step's)
                with _rng.LOCK:
                    gen = _generator(x.device)
                    before = gen.get_state()
                    gen.manual_seed(_mix(rng, int(name)))
                    try:
                        x = block(x)
                    finally:
                        gen.set_state(before)
            else:
                x = block(x)
        return x


def _generator(device: torch.device) -> torch.Generator:
    """The default generator dropout draws from on ``device`` (a CUDA kernel takes its seed when launched)."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None
                                             else torch.cuda.current_device()]
    return torch.default_generator


def _mix(rng: int, block: int) -> int:
    """A 63-bit seed from a step key and a block index (splitmix64 finaliser)."""
    z = (rng * 0x9E3779B97F4A7C15 + block + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def step_rng(seed: int, client: str, round_: int, seq: int) -> int:
    """The dropout key of one training step: equal on every tier that runs the step."""
    h = seed & 0xFFFFFFFF
    for ch in client.encode():
        h = (h * 1000003 + ch) & 0xFFFFFFFFFFFFFFFF
    return _mix(_mix(h, round_), seq)


def make_segment(blocks: Blocks, start: int, stop: int) -> Segment:
    if not 0 <= start <= stop <= len(blocks):
        raise CutError(f"segment [{start}, {stop}) is outside the model's {len(blocks)} blocks")
    return Segment(OrderedDict((str(i), blocks.modules[i]) for i in range(start, stop)), start, stop)


# ---------------------------------------------------------------- cutting

_ROOT_HOOKS = (("_forward_pre_hooks", "a forward pre-hook"), ("_forward_hooks", "a forward hook"),
               ("_backward_pre_hooks", "a backward pre-hook"), ("_backward_hooks", "a backward hook"))


def refuse_root_hooks(model: nn.Module, name: str | None = None) -> None:
    """A ConfigError if ``model`` has a hook on itself: tiers run its blocks, never the model's own call, so
    such a hook would silently never run (a hook on a module inside the model runs with that module)."""
    for attr, what in _ROOT_HOOKS:
        if getattr(model, attr, None):
            raise ConfigError(f"model {name or type(model).__name__} has {what} on the model itself, which never "
                              "runs when splitfed cuts it (tiers run its blocks, not the model's own call): do the "
                              "hook's work in a module inside the model (an nn.Sequential's first or last child, say)")


def refuse_tensor_hooks(model: nn.Module, name: str | None = None) -> None:
    """A ConfigError if a parameter or buffer of ``model`` has a hook (``register_hook``, as pruning by a
    gradient mask does): every tier trains a copy of its blocks, and a copied tensor has none, so the hook
    would silently stop working (and could not be carried over: its closure holds the original tensor)."""
    for key, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if getattr(t, "_backward_hooks", None) or getattr(t, "_post_accumulate_grad_hooks", None):
            raise ConfigError(f"model {name or type(model).__name__}: {key} has a gradient hook, which the copies "
                              "of it each tier trains do not keep: do the hook's work in a module (a mask applied "
                              "in forward, say), or with torch.nn.utils.prune")


def refuse_lost_modes(model: nn.Module, blocks: Sequence[nn.Module], name: str | None = None) -> None:
    """A ConfigError if ``model.train()`` or ``model.eval()`` leaves a module of it in another mode than setting
    its ``blocks``' mode does (a ``train`` override that keeps a frozen BatchNorm in eval mode): a tier sets each
    block's mode, and an override runs there only on a block itself (a Sequential's child), never on the model
    or on a traced model's own modules, so the module would silently train otherwise (its running statistics
    updated, the batch's used). Every module's mode is given back."""
    if all(type(m).train is nn.Module.train and type(m).eval is nn.Module.eval for m in model.modules()):
        return
    subs = [(n, m) for n, m in model.named_modules() if n]
    modes = [(m, m.training) for top in (model, *blocks) for m in top.modules()]
    try:
        for mode in (True, False):
            model.train() if mode else model.eval()
            own = [m.training for _, m in subs]
            for b in blocks:
                b.train(mode)
            odd = next(((n, m, was) for (n, m), was in zip(subs, own, strict=True) if m.training != was), None)
            if odd is not None:
                n, m, was = odd
                raise ConfigError(
                    f"model {name or type(model).__name__}: its {'train' if mode else 'eval'}() puts {n} "
                    f"({type(m).__name__}) in {'training' if was else 'eval'} mode, and the tiers would not: they "
                    "set each block's mode, and a train() or eval() override runs there only on a child of an "
                    "nn.Sequential model (not on the model, nor on a traced model's own modules). Make the model "
                    "an nn.Sequential whose child overrides train(), or freeze the layer so that it keeps no "
                    "statistics (requires_grad=False and torchvision.ops.FrozenBatchNorm2d)")
    finally:
        for m, training in modes:
            m.training = training


def to_blocks(model: nn.Module, name: str | None = None) -> Blocks:
    """The model's blocks: children of a Sequential, else cut points found by tracing; blocks that share a
    parameter or buffer (one tensor, or one storage) are one block. A model with a hook on itself, or whose own
    ``train`` sets a module's mode otherwise than its blocks' would (:func:`refuse_lost_modes`), is refused.
    ``name`` is what a refusal calls the model (the ``--model`` the user gave); by default its class."""
    name = name or type(model).__name__
    refuse_root_hooks(model, name)
    refuse_tensor_hooks(model, name)
    if isinstance(model, nn.Sequential) and type(model).forward is nn.Sequential.forward:  # else: its own forward
        # every entry, in order: children() yields a module used twice only once, silently dropping its
        # second use (Sequential(lin, act, lin2, act) would lose its last activation)
        keys: list[str] | None = [k for k, m in model._modules.items() if m is not None]
        mods = [m for m in model._modules.values() if m is not None]
        if len(mods) < 2:
            raise CutError(f"Sequential model has {len(mods)} {'child' if len(mods) == 1 else 'children'}; it needs "
                           "at least 2 to be cut: make each layer a child of its own, e.g. "
                           "nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), not nn.Sequential(net)")
        blocks = Blocks(mods, [_leaf_names(m) for m in mods], traced=False)
    else:
        blocks, keys = _trace_blocks(model, name), None
    joined = _join(blocks, _shared(blocks), name, keys)
    refuse_lost_modes(model, joined.modules, name)
    # a block whose own tensors share storage keeps it shared in a tier's copy only as a _Joined
    return Blocks([m if isinstance(m, _Joined) or not _storage_groups(m) else _Joined(m) for m in joined.modules],
                  joined.names, joined.traced)


def join_at_tuples(blocks: Blocks, example: torch.Tensor, model: str = "model") -> Blocks:
    """``blocks`` with each block whose output is no legal boundary joined to the next one: a link carries one
    tensor (not a tuple, not a dict) whose first dimension is the batch (not a sequence-first ``[T, B, d]``;
    told by a batch of one more sample). ``example`` is a batch of the model's input (the model runs it in eval
    mode without gradients; every module's mode and every tensor's value is given back)."""
    n = int(example.shape[0]) if example.dim() else 0
    x: object = example
    y: object = torch.cat([example, example[:1]]) if n else None  # one sample more
    spans: list[tuple[int, int, str]] = []
    with kept(blocks.modules), torch.no_grad():
        for i, m in enumerate(blocks.modules[:-1]):
            m.eval()
            x = m(x)
            if y is not None:
                try:
                    y = m(y)
                except Exception:  # noqa: BLE001 - a model that takes one batch size only: not told here
                    y = None
            if not isinstance(x, torch.Tensor):
                spans.append((i, i + 1, f"block {i} ({blocks.names[i]}) outputs a {type(x).__name__}, "
                                        "not one tensor"))
            elif y is not None and not _batch_first(x, y, n):
                other = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
                spans.append((i, i + 1, f"block {i} ({blocks.names[i]}) outputs a tensor whose first "
                                        f"dimension is not the batch ({list(x.shape)} for {n} samples, "
                                        f"{other} for {n + 1})"))
    return _join(blocks, spans, model)


def _batch_first(x: torch.Tensor, y: object, n: int) -> bool:
    """Whether ``x`` (for ``n`` samples) and ``y`` (for ``n + 1``) are one tensor per sample along dim 0."""
    return (isinstance(y, torch.Tensor) and x.dim() >= 1 and y.dim() == x.dim() and x.shape[0] == n
            and y.shape[0] == n + 1 and x.shape[1:] == y.shape[1:])


def _held(m: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False)]


@contextmanager
def kept(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Run ``modules`` and give back afterwards every module's mode and every parameter's and buffer's value: a
    look at a model (its output shape, its trace) must not move what it would train from (a running mean
    updated in forward, even in eval mode, a counter)."""
    mods = list(modules)
    modes = [(m, m.training) for top in mods for m in top.modules()]
    state = {id(t): (t, t.detach().clone()) for top in mods for _, t in _held(top)}
    try:
        yield
    finally:
        with torch.no_grad():
            for t, saved in state.values():
                t.copy_(saved)
        for m, mode in modes:
            m.training = mode


def view_span(size: Sequence[int], stride: Sequence[int]) -> int:
    """Elements from a view's first to its last (strides may skip some): the memory it reaches."""
    return 1 + sum((n - 1) * abs(st) for n, st in zip(size, stride, strict=True))


def memory_extent(t: torch.Tensor) -> tuple[tuple[str, int], int, int] | None:
    """``(storage, first byte, end byte)`` of the memory ``t`` views; None for a tensor without memory."""
    if t.numel() == 0 or t.device.type == "meta":
        return None
    span = view_span(t.shape, t.stride())
    return (str(t.device), t.untyped_storage().data_ptr()), t.data_ptr(), t.data_ptr() + span * t.element_size()


def _extent(t: torch.Tensor) -> tuple[tuple[str, int], int, int] | None:
    """:func:`memory_extent`, and on the meta device (no addresses) the storage's
    identity and the byte range the view covers in it: a ``.data`` tie made on meta shares one storage there
    too (``splitfed.engine.template.size`` sizes a model built on meta)."""
    if t.device.type != "meta" or t.numel() == 0:
        return memory_extent(t)
    lo = int(t.storage_offset()) * t.element_size()
    return ("meta", int(t.untyped_storage()._cdata)), lo, lo + view_span(t.shape, t.stride()) * t.element_size()


def param_sizes(params: Sequence[torch.Tensor]) -> tuple[int, int]:
    """(elements, bytes) of ``params``, memory viewed by several of them counted once (Parameters tied by
    ``.data``: two objects, one storage), on the meta device too (by storage identity and offsets)."""
    elements = nbytes = 0
    spans: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
    for t in {id(t): t for t in params}.values():
        ext = _extent(t)
        if ext is None:  # no memory to share (empty): counted whole
            elements, nbytes = elements + t.numel(), nbytes + t.numel() * t.element_size()
            continue
        storage, lo, hi = ext
        spans.setdefault(storage, []).append((lo, hi, t.numel() * t.element_size(), t.element_size()))
    for views in spans.values():
        whole = sum(v[2] for v in views)
        covered, reach = 0, 0
        for lo, hi, _, _ in sorted(views):  # the union of the byte ranges they view (at most their own bytes)
            if hi > reach:
                covered, reach = covered + hi - max(lo, reach), hi
        covered = whole if len(views) == 1 else min(covered, whole)
        nbytes += covered
        elements += covered // views[0][3]
    return elements, nbytes


def _shared(blocks: Blocks) -> list[tuple[int, int, str]]:
    """``(first, last, why)`` for every parameter or buffer object that blocks ``first`` and ``last`` both hold,
    and every two that view the same memory (``b.weight.data = a.weight.data``: one storage, two objects)."""
    seen: dict[int, tuple[int, str]] = {}
    memory: dict[tuple[str, int], list[tuple[int, str, int, int]]] = {}
    spans = []
    for i, m in enumerate(blocks.modules):
        for name, t in _held(m):
            first = seen.setdefault(id(t), (i, name))
            if first[0] != i:
                spans.append((first[0], i, f"block {first[0]}'s {first[1]!r} is also block {i}'s {name!r} "
                                            "(a shared weight)"))
            if first != (i, name) or (ext := memory_extent(t)) is None:
                continue
            storage, lo, hi = ext
            for j, other, a, b in memory.get(storage, []):
                if j != i and a < hi and lo < b:
                    spans.append((j, i, f"block {j}'s {other!r} and block {i}'s {name!r} share memory (a weight "
                                        "tied by .data)"))
            memory.setdefault(storage, []).append((i, name, lo, hi))
    return spans


_View = tuple[str, int, torch.Size, tuple[int, ...], torch.dtype]  # name, storage offset, size, stride, dtype


def _storage_groups(m: nn.Module) -> list[tuple[torch.UntypedStorage, list[_View]]]:
    """Each set of distinct tensor objects of ``m`` whose memory overlaps (a tie), with its storage and how each
    views it. Tensors that only lie side by side in one storage (a flat parameter buffer) are no tie."""
    by_storage: dict[tuple[str, int], tuple[torch.UntypedStorage, list[tuple[int, int, _View]]]] = {}
    seen: set[int] = set()
    for name, t in _held(m):
        ext = memory_extent(t)
        if ext is not None and id(t) not in seen:
            seen.add(id(t))
            by_storage.setdefault(ext[0], (t.untyped_storage(), []))[1].append(
                (ext[1], ext[2], (name, int(t.storage_offset()), t.size(), t.stride(), t.dtype)))
    groups: list[tuple[torch.UntypedStorage, list[_View]]] = []
    for storage, spans in by_storage.values():
        cluster: list[_View] = []
        reach = -1
        for lo, hi, view in sorted(spans, key=lambda v: (v[0], v[1])):
            if cluster and lo >= reach:  # no overlap with what came before: a new cluster
                if len(cluster) > 1:
                    groups.append((storage, cluster))
                cluster = []
            cluster.append(view)
            reach = max(reach, hi)
        if len(cluster) > 1:
            groups.append((storage, cluster))
    return groups


def _view_again(m: nn.Module, views: list[_View], storage: torch.UntypedStorage,
                device: torch.device | str | None = None) -> None:
    """Point each tensor of ``views`` in ``m`` at a copy (on ``device``, else where it is) of just the bytes of
    ``storage`` they view, viewed as before: a tie inside a flat buffer copies the tie, not the buffer."""
    ends = [(off * dtype.itemsize, (off + view_span(size, stride)) * dtype.itemsize)
            for _, off, size, stride, dtype in views]
    lo = min(a for a, _ in ends)
    lo -= lo % max(v[4].itemsize for v in views)  # every view's offset stays a whole number of its elements
    hi = max(b for _, b in ends)
    raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))
    part = raw[lo:hi].to(device=device if device is not None else storage.device, copy=True).untyped_storage()
    now = dict(_held(m))
    for name, offset, size, stride, dtype in views:
        now[name].data = torch.empty(0, dtype=dtype, device=part.device).set_(
            part, offset - lo // dtype.itemsize, size, stride)


class _Joined(nn.Sequential):
    """Blocks that stay on one tier, as one block. Tensors of it that share storage (``b.weight.data =
    a.weight.data``: two Parameters, one storage) share it in its copies too, and on the device it is moved to:
    ``copy.deepcopy`` clones each Parameter's data apart, and ``.to(device)`` moves each apart."""

    def __deepcopy__(self, memo: dict[int, object]) -> _Joined:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        for storage, views in _storage_groups(self):  # one new storage: a copy of what the tied views span
            _view_again(new, views, storage)
        return new

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]  # nn.Module's signature
        groups = _storage_groups(self)
        out = super()._apply(fn, recurse)
        now = dict(_held(self))
        for storage, views in groups:
            moved = [now[v[0]] for v in views]
            if len({t.untyped_storage().data_ptr() for t in moved}) == 1:
                continue  # still one (a move to where it was)
            if all(t.dtype == v[4] for t, v in zip(moved, views, strict=True)):  # moved, not cast
                _view_again(self, views, storage, device=moved[0].device)
            else:  # cast: tensors that viewed the old storage alike view the first one's new data
                for t, v in zip(moved[1:], views[1:], strict=True):
                    if v[1:] == views[0][1:] and t.dtype == moved[0].dtype:
                        t.data = moved[0].data
        return out


def _join(blocks: Blocks, spans: Sequence[tuple[int, int, str]], model: str,
          keys: Sequence[str] | None = None) -> Blocks:
    """Blocks ``first..last`` of every span as one block (a :class:`_Joined` ``nn.Sequential`` of them, so their
    shared tensors stay shared when a tier copies it), each named by its parts. A name that recurs is told apart
    by ``keys[first]`` where given (a Sequential's child's key: ``Linear[2]`` is ``model[2]``), else by
    :func:`_unique`."""
    last_of = list(range(len(blocks)))  # each block joins up to this index
    for a, b, _ in spans:
        for i in range(a, b + 1):
            last_of[i] = max(last_of[i], b)
    modules: list[nn.Module] = []
    names: list[str] = []
    firsts: list[int] = []
    i = 0
    while i < len(blocks):
        j = i
        while j < last_of[j]:
            j = last_of[j]  # a span that starts inside this one carries it further
        if i == j:
            modules.append(blocks.modules[i])
            names.append(blocks.names[i])
        else:
            modules.append(_Joined(*blocks.modules[i: j + 1]))
            parts = blocks.names[i: j + 1]
            names.append("+".join(parts[:3]) + ("+..." if len(parts) > 3 else ""))
        firsts.append(i)
        i = j + 1
    if spans and len(modules) < 2:
        raise CutError(f"model {model} has no legal cut: {spans[0][2]}, so blocks {spans[0][0]}..{spans[0][1]} "
                       "and all between must stay on one tier, and that is the whole model")
    if keys is not None:
        names = [f"{n}[{keys[i]}]" if names.count(n) > 1 else n for n, i in zip(names, firsts, strict=True)]
    return Blocks(modules, _unique(names), traced=blocks.traced)


# ---------------------------------------------------------------- checks against the model itself

_CHECK_SEEDS = (1234, 5678)  # one per training step of the check; neither is the tracing seed
_TRACE_SEED = 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _same(a: object, b: object) -> bool:
    """Bitwise the same values (NaN where the other has NaN), through tuples, lists and dicts."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or a.layout != b.layout:
            return False
        if a.is_meta:  # no values to tell apart (a model sized on the meta device)
            return True
        a, b = _dense(a), _dense(b)
        if torch.equal(a, b):
            return True
        if not (a.is_floating_point() or a.is_complex()):
            return False
        nan = a.isnan()
        return torch.equal(nan, b.isnan()) and torch.equal(a.masked_fill(nan, 0), b.masked_fill(nan, 0))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a strided tensor: a sparse one (``nn.Embedding(sparse=True)``'s gradient) has no ``equal``,
    ``max`` or ``isnan``."""
    return t.to_dense() if t.layout != torch.strided else t


def _close(a: object, b: object, floor: float = 0.0) -> bool:
    """:func:`_same`, or floating tensors equal to rounding: within 1e-6 of the larger's magnitude (a few float32
    ulps; or ``floor``, if more) plus 1e-6 relative, NaN where the other has NaN; anything else exactly."""
    if _same(a, b):
        return True
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point()
            and a.shape == b.shape and a.dtype == b.dtype and not a.is_meta):
        return False
    x, y = _dense(a.detach()).double(), _dense(b.detach()).double()
    nan = x.isnan()
    if not torch.equal(nan, y.isnan()):
        return False
    x, y = x.masked_fill(nan, 0), y.masked_fill(nan, 0)
    scale = float(max(x.abs().max(), y.abs().max())) if x.numel() else 0.0
    return bool(torch.allclose(x, y, rtol=1e-6, atol=max(1e-6 * scale, floor)))


def _clone(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _block_inputs(blocks: Blocks, example: torch.Tensor) -> list[object]:
    """What each block takes for ``example`` (blocks run in eval mode without gradients; modes given back)."""
    ins: list[object] = [example]
    with kept(blocks.modules), torch.no_grad():
        for m in blocks.modules[:-1]:
            m.eval()
            ins.append(m(_clone(ins[-1])))
    return ins


def _draws(block: nn.Module, x: object) -> bool:
    """Whether ``block`` (copies of it, in training mode) draws from torch's generator for ``x`` (its state
    moves), or gives other outputs under two seeds; a block that cannot be copied or run so counts as drawing
    (re-seeding a block that draws nothing is harmless). Outputs alone miss a draw both seeds act on alike (a
    layer skipped with probability 0.5 may be skipped under both), and it then drew apart on every tier."""
    outs = []
    try:
        for seed in _CHECK_SEEDS:
            twin = copy.deepcopy(block).train()  # a copy: its statistics may move
            with _rng.seeded(seed), torch.no_grad():
                before = torch.default_generator.get_state()
                outs.append(twin(_clone(x)))
                if not torch.equal(before, torch.default_generator.get_state()):
                    return True
    except Exception:  # noqa: BLE001 - whatever a user's block raises
        return True
    return not _same(outs[0], outs[1])


def stochastic_flags(blocks: Blocks, example: torch.Tensor, run: bool = True) -> list[bool]:
    """Per block, whether it draws random numbers in training: by its modules and graph (:func:`_is_stochastic`),
    else (``run``) by running copies of it on its input for ``example`` under two seeds (an untraced module of
    one's own, a random op no list names). The blocks themselves do not change."""
    if not run:
        return [_is_stochastic(m) for m in blocks.modules]
    inputs = _block_inputs(blocks, example)
    return [_is_stochastic(m) or _draws(m, x) for m, x in zip(blocks.modules, inputs, strict=True)]


def mark_stochastic(blocks: Blocks, flags: Sequence[bool]) -> None:
    """Record :func:`stochastic_flags` on the blocks (an attribute, so a tier's copy of a block keeps it: a
    traced block's copy keeps only what its ``meta`` lists as preserved, so it is listed there too)."""
    for m, flag in zip(blocks.modules, flags, strict=True):
        setattr(m, STOCHASTIC_ATTR, bool(flag))
        if isinstance(m, fx.GraphModule):
            m.meta.setdefault(_PRESERVED, {})[STOCHASTIC_ATTR] = bool(flag)


def check_trains_as_model(blocks: Blocks, model: nn.Module, reference: nn.Module, example: torch.Tensor,
                          name: str) -> None:
    """A one-line ConfigError unless ``blocks`` (cut from ``model``) train exactly as ``reference``, another
    instance of the model (same factory, same seed): two training steps on ``example`` in training mode, torch's
    generator seeded alike for both, must give the same outputs, the same gradient of every parameter and the
    same buffers. ``reference`` starts from ``model``'s state; both are trained, so pass instances of one's own.

    Equal to rounding (:func:`_close`): a traced graph calls what forward called, but a custom backward that is
    the ordinary derivative written by hand (a memory-efficient Swish) rounds apart by an ulp; a lost gradient
    reversal, a lost buffer update or an op run once at trace time differ by far more."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    ref_params = dict(reference.named_parameters())
    ref_buffers = dict(reference.named_buffers())

    def refuse(what: str) -> ConfigError:
        return ConfigError(
            f"model {name} would not train as itself when cut: the blocks torch.fx traced from it differ from it "
            f"({what}). Tracing cannot keep a custom torch.autograd.Function, hooks on the model itself, state "
            "its forward changes apart from the input (self.buf.mul_(0.9), a counter), or torch.no_grad() in "
            "forward: make the model an nn.Sequential whose children hold that code (splitfed runs a "
            "Sequential's children as they are, untraced). Or the factory builds another model each time "
            "(drawing with numpy or random, not torch's generator): it must build the same one from a seed")

    missing = [n for n in ref_params if n not in params] + [n for n in ref_buffers if n not in buffers]
    if missing:
        raise refuse(f"the traced model has no {missing[0]!r}")
    with torch.no_grad():  # the same start, whatever tracing or the factory did
        for n, rt in (*ref_params.items(), *ref_buffers.items()):
            mine = params.get(n, buffers.get(n))
            assert mine is not None
            if rt.shape != mine.shape:
                raise ConfigError(f"model {name}'s factory does not build the same model twice from one seed "
                                  f"({n!r} is {list(mine.shape)}, then {list(rt.shape)}): every process of a run "
                                  "builds it, so it must draw its sizes and weights from torch's generator only")
            rt.copy_(mine)
    whole = blocks.whole().train()
    reference.train()
    weights: torch.Tensor | None = None
    for step, seed in enumerate(_CHECK_SEEDS, 1):
        outs = []
        for net in (reference, whole):
            try:
                with _rng.seeded(seed):
                    out = net(example.clone())
                    if not isinstance(out, torch.Tensor):
                        raise TypeError(f"the model outputs a {type(out).__name__}")
                    if weights is None:  # a loss that weighs every output apart
                        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
                    if out.requires_grad:
                        (out.float() * weights.to(out.device)).sum().backward()
            except Exception as e:  # noqa: BLE001 - whatever the model raises
                if net is reference:
                    raise ConfigError(f"model {name} cannot train a step on {len(example)} samples: "
                                      f"{_first_line(e)}") from None
                raise refuse(f"its blocks raise {_first_line(e)} in training step {step}") from None
            outs.append(out)
        if not _close(outs[0].detach(), outs[1].detach()):
            raise refuse(f"its output differs in training step {step}")
        # a gradient that should cancel out (a bias before a BatchNorm) is rounding noise: it is judged against
        # the largest gradient of the model, not its own size
        floor = 1e-6 * max((float(_dense(r.grad.detach()).abs().max()) for r in ref_params.values()
                            if r.grad is not None and r.grad.numel() and r.grad.is_floating_point()), default=0.0)
        for n, r in ref_params.items():
            p = params[n]
            if (r.grad is None) != (p.grad is None) or (r.grad is not None and not _close(r.grad, p.grad, floor)):
                raise refuse(f"the gradient of parameter {n!r} differs in training step {step}")
        with torch.no_grad():  # plain SGD on both, then no gradients
            for group in (ref_params, params):
                for q in group.values():
                    if q.grad is not None:
                        q.sub_(0.1 * q.grad)
                        q.grad = None
        for n, rb in ref_buffers.items():
            if not _close(rb, buffers[n]):
                raise refuse(f"buffer {n!r} differs after training step {step}")
        for n, r in ref_params.items():
            if not _close(r.detach(), params[n].detach()):
                raise refuse(f"parameter {n!r} differs after training step {step}")


def _leaf_names(m: nn.Module) -> str:
    leaves = [type(x).__name__ for x in m.modules() if not any(True for _ in x.children())]
    return "+".join(leaves) if leaves else type(m).__name__


def _unique(names: Sequence[str]) -> list[str]:
    """``names`` with each that recurs numbered by its occurrence (``relu[0]``, ``relu[1]``): a block's name is
    how a profile, ``splitfed blocks`` and an error tell it from the others."""
    out: list[str] = []
    for n in names:
        if names.count(n) > 1 or n in out:
            k = 0
            while f"{n}[{k}]" in names or f"{n}[{k}]" in out:  # never one a block has already
                k += 1
            n = f"{n}[{k}]"
        out.append(n)
    return out


def _trace_blocks(model: nn.Module, name: str) -> Blocks:
    try:
        gm = _traced_in(model, training=True)
    except Exception as e:  # noqa: BLE001 - tracing failures come in many types
        raise CutError(f"model {name} cannot be traced by torch.fx, so no cut point can be found: "
                       f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{_where(e)}") from None
    try:
        evaluating: fx.GraphModule | None = _traced_in(model, training=False)
    except Exception:  # noqa: BLE001 - traceable in training only: it reads self.training as well
        evaluating = None
    if evaluating is None or evaluating.code != gm.code or not _same(_constants(evaluating), _constants(gm)):
        # a graph fixes what forward read of self.training (F.dropout(x, p, self.training), `if
        # self.training:`) when it was traced: its blocks would train as traced and evaluate so too
        reader = _training_reader(gm, evaluating)
        who = (f"model {name} reads self.training in forward" if reader is None else
               f"model {name} reads self.training in its own forward" if not reader else
               f"model {name}: its submodule {reader!r} ({type(model.get_submodule(reader)).__name__}) reads "
               "self.training in forward")
        raise CutError(f"{who}, which torch.fx fixes when it traces: its blocks would act the same in training "
                       "and evaluation. Do what differs in torch's modules (nn.Dropout, nn.BatchNorm), which the "
                       "tracer keeps whole, or make the model an nn.Sequential whose children do it (a Sequential's children run untraced)")
    nodes = list(gm.graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    starred = [str(n.target) for n in inputs if str(n.target).startswith("*")]
    if starred:  # a block is called with one tensor: *xs would be that tensor, not a tuple of it
        raise CutError(f"model {name}'s forward takes {starred[0]}; splitfed calls a model with one tensor and "
                       "cuts it as forward(self, x): name its input (wrap the model in a module whose forward "
                       "takes one)")
    if len(inputs) != 1:
        raise CutError(f"model {name} takes {len(inputs)} inputs ({', '.join(str(n.target) for n in inputs)}); "
                       "splitfed cuts single-input models: give the others defaults, or wrap the model in a module "
                       "whose forward takes one")
    compute = [n for n in nodes if n.op in ("call_module", "call_function", "call_method")]
    if len(compute) < 2:
        raise CutError(f"model {name} has {len(compute)} operation(s): nothing to cut")
    pos = {n: i for i, n in enumerate(compute)}
    pos[inputs[0]] = -1
    end = len(compute)
    output = next(n for n in nodes if n.op == "output")
    pos[output] = end

    # last use of every value, and the span of uses of every module / attribute
    last_use: dict[fx.Node, int] = {}
    for n in [inputs[0], *compute]:
        last_use[n] = max((_use_pos(u, pos) for u in n.users), default=pos[n])
    spans: dict[str, list[int]] = {}
    for n in nodes:
        if n.op == "call_module":
            spans.setdefault(str(n.target), []).append(pos[n])
        elif n.op == "get_attr":
            for u in n.users:
                spans.setdefault(str(n.target), []).append(_use_pos(u, pos))
    forbidden: set[int] = set()
    for uses in spans.values():
        forbidden.update(range(min(uses), max(uses)))

    cuts = []  # cut after compute[i]
    for i in range(end - 1):
        if i in forbidden:
            continue
        live = [n for n in [inputs[0], *compute[: i + 1]] if last_use[n] > i]
        if len(live) == 1:
            cuts.append((i, live[0]))
    if not cuts:
        raise CutError(f"model {name} has no legal cut: no point in its graph where a single tensor "
                       "carries the whole state (every position has a skip connection or shared layer across it)")

    # ranges [a, b] of compute nodes; merge parameter-free ranges into the previous one
    ranges: list[tuple[int, int, fx.node.Argument]] = []  # (first, last, value out)
    a = 0
    for i, live in cuts:
        ranges.append((a, i, live))
        a = i + 1
    ranges.append((a, end - 1, output.args[0]))
    merged: list[tuple[int, int, fx.node.Argument]] = []
    for r in ranges:
        if merged and not _has_state(gm, compute[r[0]: r[1] + 1]):
            merged[-1] = (merged[-1][0], r[1], r[2])
        else:
            merged.append(r)
    if len(merged) < 2:
        raise CutError(f"model {name} has no legal cut that leaves parameters on both sides")

    modules: list[nn.Module] = []
    value_in: fx.Node = inputs[0]
    for first, last, out in merged:
        modules.append(_extract(gm, value_in, compute[first: last + 1], out))
        if isinstance(out, fx.Node):  # always, but after the last block: the model's output may be a tuple
            value_in = out
    return Blocks(modules, _block_names([compute[first: last + 1] for first, last, _ in merged]), traced=True)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_FILES = {os.path.abspath(f) for f in (__file__, _rng.__file__, contextlib.__file__)}


def _where(e: BaseException) -> str:
    """`` (at file:line: code)``, the last line of the model's own code a tracing failure passed through (the
    ``if x.sum() > 0:`` fx cannot follow), or "" when none did: fx's own message names no line."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not os.path.abspath(f.filename).startswith(_TORCH_DIR) and os.path.abspath(f.filename) not in _OWN_FILES
              and not f.filename.startswith("<")]
    if not frames:
        return ""
    f = frames[-1]
    code = f": {f.line.strip()}" if f.line else ""
    return f" (at {f.filename}:{f.lineno}{code})"


def _traced_in(model: nn.Module, training: bool) -> fx.GraphModule:
    """``model`` traced in training or evaluation mode, its forward's parameters with defaults at their defaults;
    every module's mode and every tensor's value is given back. Two traces in the two modes give the same code
    unless forward reads ``self.training``: each starts from the same state, torch's generator seeded alike (a
    ``torch.randn(16)`` becomes the same constant), and the tensor constants fx leaves on the model
    (``_tensor_constant0``) are taken off it again (the graph keeps its own), or the second trace would name its
    constants apart."""
    before = set(vars(model))
    try:
        with kept([model]):  # tracing runs forward on the model's own tensors (self.calls += 1)
            model.train(training)
            defaults = _defaults(model)
            with _rng.seeded(_TRACE_SEED):
                gm = fx.symbolic_trace(model, concrete_args=defaults or None)
        _drop_specialised(gm, defaults)
        return gm
    finally:
        for attr in set(vars(model)) - before:
            if attr.startswith("_tensor_constant"):
                delattr(model, attr)


def _defaults(model: nn.Module) -> dict[str, object]:
    """The parameters of ``model.forward`` after its first that have defaults (the model is called with one)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in params[1:] if p.kind in kinds and p.default is not inspect.Parameter.empty}


def _drop_specialised(gm: fx.GraphModule, names: Iterable[str]) -> None:
    """Take the placeholders fx keeps for ``concrete_args`` (``names``) out of ``gm``, with the checks of their
    values it adds (``torch._assert(scale == 1.0)``): forward is traced at those values and called without them."""
    pattern = re.compile("|".join(rf"{re.escape(n)}(_\d+)?" for n in names) or "(?!)")
    special = [n for n in gm.graph.nodes if n.op == "placeholder" and pattern.fullmatch(str(n.target))]
    if not special:
        return
    derived = set(special)  # nodes computed from the specialised arguments alone: fx's checks of their values
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.all_input_nodes and all(a in derived for a in n.all_input_nodes):
            derived.add(n)
    for n in reversed(list(gm.graph.nodes)):
        if n in derived and not n.users:  # the checks, then what only they used, then the placeholders
            gm.graph.erase_node(n)
    gm.recompile()


def _training_reader(training: fx.GraphModule, evaluating: fx.GraphModule | None) -> str | None:
    """The path of the module whose forward made the training and evaluation traces differ ("": the model's
    own), by the first op they do not share (its module, from the tracer's ``nn_module_stack``); None when the
    model could not be traced for evaluation (nothing to compare) or no op tells."""
    if evaluating is None:
        return None
    a = [n for n in training.graph.nodes if n.op != "placeholder"]
    b = [n for n in evaluating.graph.nodes if n.op != "placeholder"]

    def op(n: fx.Node) -> tuple[str, str, str]:
        return n.op, str(n.target), _owner(n)

    def detail(gm: fx.GraphModule, n: fx.Node) -> object:  # its arguments (each node as its op), or its constant
        if n.op == "get_attr":
            return getattr(gm, str(n.target), None)
        return repr(fx.node.map_arg((n.args, n.kwargs), lambda x: f"{x.op}:{x.target}"))

    ops_a, ops_b = [op(n) for n in a], [op(n) for n in b]
    for tag, i1, i2, j1, _ in difflib.SequenceMatcher(None, ops_a, ops_b, autojunk=False).get_opcodes():
        if tag != "equal":  # ops only one trace has, or others in their place: the training trace's first
            return (ops_a[i1] if i1 < i2 else ops_b[j1])[2]
        for k in range(i2 - i1):
            x, y = detail(training, a[i1 + k]), detail(evaluating, b[j1 + k])
            if not (_same(x, y) if isinstance(x, torch.Tensor) else x == y):
                return ops_a[i1 + k][2]
    return None


def _owner(n: fx.Node) -> str:
    """The path of the module whose forward made node ``n`` ("" the traced model's own)."""
    stack = [str(v[0]) if isinstance(v, tuple) else str(k) for k, v in (n.meta.get("nn_module_stack") or {}).items()]
    if n.op == "call_module" and stack and stack[-1] == str(n.target):  # the module called, not its caller
        stack.pop()
    return stack[-1] if stack else ""


def _constants(gm: fx.GraphModule) -> list[tuple[str, object]]:
    """The tensor constants tracing made (``torch.tensor(d)``, ``torch.arange(8)`` in forward), by name."""
    return [(str(n.target), getattr(gm, str(n.target))) for n in gm.graph.nodes
            if n.op == "get_attr" and str(n.target).startswith("_tensor_constant")]


def _use_pos(u: fx.Node, pos: dict[fx.Node, int]) -> int:
    return pos[u] if u in pos else max((_use_pos(x, pos) for x in u.users), default=0)


def _has_state(gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> bool:
    for n in nodes:
        if n.op == "call_module":
            m = gm.get_submodule(str(n.target))
            if any(True for _ in m.parameters()) or any(True for _ in m.buffers()):
                return True
        for a in n.all_input_nodes:
            if a.op == "get_attr":
                return True
    return False


def _extract(gm: fx.GraphModule, value_in: fx.Node, block_nodes: list[fx.Node], out: fx.node.Argument) -> fx.GraphModule:
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {value_in: g.placeholder("x")}

    def lookup(n: fx.Node) -> fx.Node:
        if n not in env:
            if n.op != "get_attr":
                raise CutError(f"internal: value {n.name} crosses a cut")
            env[n] = g.node_copy(n, lookup)
        return env[n]

    for n in block_nodes:
        env[n] = g.node_copy(n, lookup)
    g.output(fx.node.map_arg(out, lookup))
    block = fx.GraphModule(gm, g)
    block.graph.lint()
    return block


def _block_names(blocks: Sequence[list[fx.Node]]) -> list[str]:
    """Each traced block's name: the modules and parameters it uses by their first two path parts (``layer1.0``,
    ``pos``), one split over several blocks by the full path of the first it uses of it (``features.3.conv.0``,
    ``features.3.conv.3``: where each block of it starts), else the functions it calls; unique (:func:`_unique`)."""
    used = [_used(nodes) for nodes in blocks]
    holders: dict[str, int] = {}
    for u in used:
        for label in u:
            holders[label] = holders.get(label, 0) + 1
    names = []
    for nodes, u in zip(blocks, used, strict=True):
        parts = [first if holders[label] > 1 else label for label, first in u.items()] or _functions(nodes) or ["add"]
        names.append("+".join(parts[:3]) + ("+..." if len(parts) > 3 else ""))
    return _unique(names)


def _used(nodes: Iterable[fx.Node]) -> dict[str, str]:
    """The modules ``nodes`` call and the parameters and buffers they read (not tracing's tensor constants), in
    order: each path cut to its first two parts, to the first full path under it."""
    used: dict[str, str] = {}
    for n in nodes:
        targets = [str(a.target) for a in n.all_input_nodes
                   if a.op == "get_attr" and not str(a.target).startswith("_tensor_constant")]
        for t in [*targets, *([str(n.target)] if n.op == "call_module" else [])]:
            used.setdefault(".".join(t.split(".")[:2]), t)
    return used


def _functions(nodes: Iterable[fx.Node]) -> list[str]:
    funcs: list[str] = []
    for n in nodes:
        if n.op in ("call_function", "call_method"):
            label = getattr(n.target, "__name__", str(n.target))
            if label not in funcs and label not in ("getitem", "getattr", "add", "size"):
                funcs.append(label)
    return funcs


def validate_cuts(cuts: Sequence[int], n_blocks: int, tiers: int | None = None, u_shape: bool = False,
                  model: str = "model") -> tuple[int, ...]:
    """Check a cut vector; the U-shape adds a last cut where the device's tail begins."""
    cuts = tuple(int(k) for k in cuts)
    if tiers is not None:
        want = tiers - 1 + (1 if u_shape else 0)
        if len(cuts) != want:
            raise CutError(f"{tiers} tiers{' in U-shape' if u_shape else ''} need {want} cut(s), got {len(cuts)}: "
                           f"{','.join(map(str, cuts)) or '(none)'}")
    if not cuts:
        raise CutError("at least one cut is needed (2 tiers)")
    for k in cuts:
        if not 0 <= k <= n_blocks:
            raise CutError(f"cut {k} is out of range: {model} has {n_blocks} blocks, cuts lie in 0..{n_blocks}")
    return check_order(cuts)  # (a negative cut was refused above, with the model's range)


def segment_bounds(cuts: Sequence[int], n_blocks: int, u_shape: bool = False) -> list[tuple[int, int]]:
    """``[start, stop)`` per tier in chain order; with U-shape the device's tail comes last."""
    ks = list(cuts)
    tail = ks.pop() if u_shape else n_blocks
    edges = [0, *ks, tail]
    bounds = [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
    if u_shape:
        bounds.append((tail, n_blocks))
    return bounds
