"""Blocks and segments: the units a model is cut into, and the run of them one tier holds.

A *segment* is the contiguous run of blocks ``[start, stop)`` one tier holds. Its ``state_dict`` keys are
``"<block index>.<key inside block>"``, the same keys as the whole model's, so replicas of a block are averaged
by key wherever they were trained. Every block that draws random numbers (dropout, ``nn.RReLU``, an RNN's or an
attention's dropout, ``torch.randn_like``... in its graph, or found by running it:
:func:`splitfed.models.check.stochastic_flags`) is re-seeded per step by :class:`Segment`, so the same block draws
the same numbers on any tier. How a model becomes blocks: :mod:`splitfed.models.blocks`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from splitfed.cut_order import check_order
from splitfed.errors import CutError
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
PRESERVED = getattr(fx.graph_module, "_USER_PRESERVED_ATTRIBUTES_KEY", "_user_preserved_attributes")


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


def is_stochastic(block: nn.Module) -> bool:
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
        self._stochastic = {name: is_stochastic(b) for name, b in blocks.items()}

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


def leaf_names(m: nn.Module) -> str:
    leaves = [type(x).__name__ for x in m.modules() if not any(True for _ in x.children())]
    return "+".join(leaves) if leaves else type(m).__name__


def unique_names(names: Sequence[str]) -> list[str]:
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
