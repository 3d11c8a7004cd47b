"""Blocks that must stay on one tier, joined into one: tied tensors, and boundaries that carry no single tensor.

Blocks that hold one tensor between them (weight tying: a parameter or buffer object two blocks use) become one
block, as do blocks with a tuple crossing between them (:func:`join_at_tuples`): a tier trains its own copy of
its blocks and sends one tensor on, so a cut there would untie the weight or have nothing to send. Tensors that
share storage (``b.weight.data = a.weight.data``: two Parameters, one storage) tie their blocks as one tensor
object does, and a joined block's copy (:class:`Joined`) keeps that storage shared. A cut also needs the batch in
the first dimension of the tensor crossing it (a sequence-first LSTM's ``[T, B, d]`` is no legal boundary).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from splitfed.errors import CutError
from splitfed.models.segment import Blocks, unique_names


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
    return join(blocks, spans, model)


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


def shared_tensors(blocks: Blocks) -> list[tuple[int, int, str]]:
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


def storage_groups(m: nn.Module) -> list[tuple[torch.UntypedStorage, list[_View]]]:
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


class Joined(nn.Sequential):
    """Blocks that stay on one tier, as one block. Tensors of it that share storage (``b.weight.data =
    a.weight.data``: two Parameters, one storage) share it in its copies too, and on the device it is moved to:
    ``copy.deepcopy`` clones each Parameter's data apart, and ``.to(device)`` moves each apart."""

    def __deepcopy__(self, memo: dict[int, object]) -> Joined:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        for storage, views in storage_groups(self):  # one new storage: a copy of what the tied views span
            _view_again(new, views, storage)
        return new

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]  # nn.Module's signature
        groups = storage_groups(self)
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


def join(blocks: Blocks, spans: Sequence[tuple[int, int, str]], model: str,
         keys: Sequence[str] | None = None) -> Blocks:
    """Blocks ``first..last`` of every span as one block (a :class:`Joined` ``nn.Sequential`` of them, so their
    shared tensors stay shared when a tier copies it), each named by its parts. A name that recurs is told apart
    by ``keys[first]`` where given (a Sequential's child's key: ``Linear[2]`` is ``model[2]``), else by
    :func:`unique_names`."""
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
            modules.append(Joined(*blocks.modules[i: j + 1]))
            parts = blocks.names[i: j + 1]
            names.append("+".join(parts[:3]) + ("+..." if len(parts) > 3 else ""))
        firsts.append(i)
        i = j + 1
    if spans and len(modules) < 2:
        raise CutError(f"model {model} has no legal cut: {spans[0][2]}, so blocks {spans[0][0]}..{spans[0][1]} "
                       "and all between must stay on one tier, and that is the whole model")
    if keys is not None:
        names = [f"{n}[{keys[i]}]" if names.count(n) > 1 else n for n, i in zip(names, firsts, strict=True)]
    return Blocks(modules, unique_names(names), traced=blocks.traced)


# ---------------------------------------------------------------- checks against the model itself
