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
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from splitfed.errors import CutError
from splitfed.models import rng as _rng

_STOCHASTIC_FUNCS = {
    torch.nn.functional.dropout,
    torch.nn.functional.dropout1d,
    torch.nn.functional.dropout2d,
    torch.nn.functional.dropout3d,
    torch.nn.functional.alpha_dropout,
    torch.dropout,
}


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
    if any(isinstance(m, nn.modules.dropout._DropoutNd) for m in block.modules()):
        return True
    if isinstance(block, fx.GraphModule):
        return any(n.op == "call_function" and n.target in _STOCHASTIC_FUNCS for n in block.graph.nodes)
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


def to_blocks(model: nn.Module) -> Blocks:
    """The model's blocks: children of a Sequential, else cut points found by tracing; blocks that share a
    parameter or buffer are one block."""
    if isinstance(model, nn.Sequential):
        # every entry, in order: children() yields a module used twice only once, silently dropping its
        # second use (Sequential(lin, act, lin2, act) would lose its last activation)
        mods = [m for m in model._modules.values() if m is not None]
        if len(mods) < 2:
            raise CutError(f"Sequential model has {len(mods)} child; it needs at least 2 to be cut")
        blocks = Blocks(mods, [_leaf_names(m) for m in mods], traced=False)
    else:
        blocks = _trace_blocks(model)
    return _join(blocks, _shared(blocks), type(model).__name__)


def join_at_tuples(blocks: Blocks, example: torch.Tensor, model: str = "model") -> Blocks:
    """``blocks`` with each block whose output is not one tensor (a tuple, a dict) joined to the next one:
    a link carries one tensor. ``example`` is a batch of the model's input (the model runs it in eval mode
    without gradients; every module's mode is given back)."""
    x: object = example
    spans: list[tuple[int, int, str]] = []
    modes = [(m, m.training) for b in blocks.modules for m in b.modules()]
    try:
        with torch.no_grad():
            for i, m in enumerate(blocks.modules[:-1]):
                m.eval()
                x = m(x)
                if not isinstance(x, torch.Tensor):
                    spans.append((i, i + 1, f"block {i} ({blocks.names[i]}) outputs a {type(x).__name__}, "
                                            "not one tensor"))
    finally:
        for m, mode in modes:
            m.training = mode
    return _join(blocks, spans, model)


def _shared(blocks: Blocks) -> list[tuple[int, int, str]]:
    """``(first, last, why)`` for every parameter or buffer object that blocks ``first`` and ``last`` both hold."""
    seen: dict[int, tuple[int, str]] = {}
    spans = []
    for i, m in enumerate(blocks.modules):
        held = [*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False)]
        for name, t in held:
            first = seen.setdefault(id(t), (i, name))
            if first[0] != i:
                spans.append((first[0], i, f"block {first[0]}'s {first[1]!r} is also block {i}'s {name!r} "
                                            "(a shared weight)"))
    return spans


def _join(blocks: Blocks, spans: Sequence[tuple[int, int, str]], model: str) -> Blocks:
    """Blocks ``first..last`` of every span as one block (an ``nn.Sequential`` of them, so their shared tensors
    stay shared when a tier copies it)."""
    if not spans:
        return blocks
    last_of = list(range(len(blocks)))  # each block joins up to this index
    for a, b, _ in spans:
        for i in range(a, b + 1):
            last_of[i] = max(last_of[i], b)
    modules: list[nn.Module] = []
    names: list[str] = []
    i = 0
    while i < len(blocks):
        j = i
        while j < last_of[j]:
            j = last_of[j]  # a span that starts inside this one carries it further
        if i == j:
            modules.append(blocks.modules[i])
            names.append(blocks.names[i])
        else:
            modules.append(nn.Sequential(*blocks.modules[i: j + 1]))
            parts = blocks.names[i: j + 1]
            names.append("+".join(parts[:3]) + ("+..." if len(parts) > 3 else ""))
        i = j + 1
    if len(modules) < 2:
        raise CutError(f"model {model} has no legal cut: {spans[0][2]}, so blocks {spans[0][0]}..{spans[0][1]} "
                       "and all between must stay on one tier, and that is the whole model")
    return Blocks(modules, names, traced=blocks.traced)


def _leaf_names(m: nn.Module) -> str:
    leaves = [type(x).__name__ for x in m.modules() if not any(True for _ in x.children())]
    return "+".join(leaves) if leaves else type(m).__name__


def _trace_blocks(model: nn.Module) -> Blocks:
    name = type(model).__name__
    try:
        gm = _traced_in(model, training=True)
    except Exception as e:  # noqa: BLE001 - tracing failures come in many types
        raise CutError(f"model {name} cannot be traced by torch.fx, so no cut point can be found: "
                       f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        evaluating = _traced_in(model, training=False).code
    except Exception:  # noqa: BLE001 - traceable in training only: it reads self.training as well
        evaluating = None
    if evaluating != gm.code:
        # a graph fixes what forward read of self.training (F.dropout(x, p, self.training), `if
        # self.training:`) when it was traced: its blocks would train as traced and evaluate so too
        raise CutError(f"model {name} reads self.training in its own forward, which torch.fx fixes when it "
                       "traces: its blocks would act the same in training and evaluation. Do what differs in "
                       "modules (nn.Dropout, nn.BatchNorm, or a module of your own, which the tracer keeps whole)")
    nodes = list(gm.graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise CutError(f"model {name} takes {len(inputs)} inputs; splitfed cuts single-input models")
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
    names: list[str] = []
    value_in: fx.Node = inputs[0]
    for first, last, out in merged:
        block_nodes = compute[first: last + 1]
        modules.append(_extract(gm, value_in, block_nodes, out))
        names.append(_describe(block_nodes))
        if isinstance(out, fx.Node):  # always, but after the last block: the model's output may be a tuple
            value_in = out
    return Blocks(modules, names, traced=True)


def _traced_in(model: nn.Module, training: bool) -> fx.GraphModule:
    """``model`` traced in training or evaluation mode; every module's mode is given back."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.train(training)
        return fx.symbolic_trace(model)
    finally:
        for m, mode in modes:
            m.training = mode


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


def _describe(nodes: list[fx.Node]) -> str:
    """A readable block name: the top-level modules it calls, else its functions."""
    mods: list[str] = []
    funcs: list[str] = []
    for n in nodes:
        if n.op == "call_module":
            p = str(n.target).split(".")
            label = ".".join(p[:2]) if len(p) > 2 else str(n.target)
            if label not in mods:
                mods.append(label)
        elif n.op in ("call_function", "call_method"):
            label = getattr(n.target, "__name__", str(n.target))
            if label not in funcs and label not in ("getitem", "getattr", "add", "size"):
                funcs.append(label)
    parts = mods or funcs or ["add"]
    return "+".join(parts[:3]) + ("+..." if len(parts) > 3 else "")


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
    if any(b < a for a, b in zip(cuts, cuts[1:], strict=False)):
        raise CutError(f"cuts must be non-decreasing, got {','.join(map(str, cuts))}")
    return cuts


def segment_bounds(cuts: Sequence[int], n_blocks: int, u_shape: bool = False) -> list[tuple[int, int]]:
    """``[start, stop)`` per tier in chain order; with U-shape the device's tail comes last."""
    ks = list(cuts)
    tail = ks.pop() if u_shape else n_blocks
    edges = [0, *ks, tail]
    bounds = [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
    if u_shape:
        bounds.append((tail, n_blocks))
    return bounds
