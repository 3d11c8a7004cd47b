"""Cut points of a model that is no ``nn.Sequential``, found by tracing it with ``torch.fx``.

A position between two graph nodes is a legal cut only if exactly one value is live across it (so no cut ever
falls inside a residual block or between a layer and a skip that uses its input), and no module or parameter is
used on both sides of it. Parameter-free blocks are merged into the block before them, which keeps the cut
*after* a pool or activation (the smaller tensor). A forward's extra parameters with defaults
(``forward(self, x, mask=None)``) are traced at their defaults; a forward that reads ``self.training`` is refused
(a graph fixes what it read).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import re
import traceback
from collections.abc import Iterable, Sequence

import torch
from torch import fx, nn

from splitfed.errors import CutError
from splitfed.models import rng as _rng
from splitfed.models import tying as _tying
from splitfed.models.check import same_values
from splitfed.models.segment import Blocks, unique_names
from splitfed.models.tying import kept

_TRACE_SEED = 0
def trace_blocks(model: nn.Module, name: str) -> Blocks:
    try:
        gm = _traced_in(model, training=True)
    except Exception as e:  # noqa: BLE001 - tracing failures come in many types
        raise CutError(f"model {name} cannot be traced by torch.fx, so no cut point can be found: "
                       f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{_where(e)}") from None
    try:
        evaluating: fx.GraphModule | None = _traced_in(model, training=False)
    except Exception:  # noqa: BLE001 - traceable in training only: it reads self.training as well
        evaluating = None
    if evaluating is None or evaluating.code != gm.code or not same_values(_constants(evaluating), _constants(gm)):
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
# frames of splitfed's own tracing code (``kept``'s context manager re-raises through contextlib and tying)
_OWN_FILES = {os.path.abspath(f) for f in (__file__, _tying.__file__, _rng.__file__, contextlib.__file__)}


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
            if not (same_values(x, y) if isinstance(x, torch.Tensor) else x == y):
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
    ``features.3.conv.3``: where each block of it starts), else the functions it calls; unique (:func:`unique_names`)."""
    used = [_used(nodes) for nodes in blocks]
    holders: dict[str, int] = {}
    for u in used:
        for label in u:
            holders[label] = holders.get(label, 0) + 1
    names = []
    for nodes, u in zip(blocks, used, strict=True):
        parts = [first if holders[label] > 1 else label for label, first in u.items()] or _functions(nodes) or ["add"]
        names.append("+".join(parts[:3]) + ("+..." if len(parts) > 3 else ""))
    return unique_names(names)


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


