"""Checks of a model's blocks against the model itself: that they train as it does, and which draw random numbers.

Tracing can change what a model computes: a custom ``torch.autograd.Function`` loses its backward,
``torch.no_grad()`` in forward is not recorded, and tensor code that does not depend on the input runs once at
trace time. :func:`check_trains_as_model` trains a traced model's blocks beside a second instance of the model
and refuses the model if any number differs. :func:`stochastic_flags` finds the blocks that draw random numbers
(by their modules and graph, else by running them under two seeds), which :class:`~splitfed.models.segment.Segment`
re-seeds per step.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import fx, nn

from splitfed.errors import ConfigError
from splitfed.models import rng as _rng
from splitfed.models.segment import PRESERVED, STOCHASTIC_ATTR, Blocks, is_stochastic
from splitfed.models.tying import kept

_CHECK_SEEDS = (1234, 5678)  # one per training step of the check; neither is the tracing seed


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def same_values(a: object, b: object) -> bool:
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
        return type(a) is type(b) and len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    return bool(a == b)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a strided tensor: a sparse one (``nn.Embedding(sparse=True)``'s gradient) has no ``equal``,
    ``max`` or ``isnan``."""
    return t.to_dense() if t.layout != torch.strided else t


def close_values(a: object, b: object, floor: float = 0.0) -> bool:
    """:func:`same_values`, or floating tensors equal to rounding: within 1e-6 of the larger's magnitude (a few float32
    ulps; or ``floor``, if more) plus 1e-6 relative, NaN where the other has NaN; anything else exactly."""
    if same_values(a, b):
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
    return not same_values(outs[0], outs[1])


def stochastic_flags(blocks: Blocks, example: torch.Tensor, run: bool = True) -> list[bool]:
    """Per block, whether it draws random numbers in training: by its modules and graph (:func:`is_stochastic`),
    else (``run``) by running copies of it on its input for ``example`` under two seeds (an untraced module of
    one's own, a random op no list names). The blocks themselves do not change."""
    if not run:
        return [is_stochastic(m) for m in blocks.modules]
    inputs = _block_inputs(blocks, example)
    return [is_stochastic(m) or _draws(m, x) for m, x in zip(blocks.modules, inputs, strict=True)]


def mark_stochastic(blocks: Blocks, flags: Sequence[bool]) -> None:
    """Record :func:`stochastic_flags` on the blocks (an attribute, so a tier's copy of a block keeps it: a
    traced block's copy keeps only what its ``meta`` lists as preserved, so it is listed there too)."""
    for m, flag in zip(blocks.modules, flags, strict=True):
        setattr(m, STOCHASTIC_ATTR, bool(flag))
        if isinstance(m, fx.GraphModule):
            m.meta.setdefault(PRESERVED, {})[STOCHASTIC_ATTR] = bool(flag)


def check_trains_as_model(blocks: Blocks, model: nn.Module, reference: nn.Module, example: torch.Tensor,
                          name: str) -> None:
    """A one-line ConfigError unless ``blocks`` (cut from ``model``) train exactly as ``reference``, another
    instance of the model (same factory, same seed): two training steps on ``example`` in training mode, torch's
    generator seeded alike for both, must give the same outputs, the same gradient of every parameter and the
    same buffers. ``reference`` starts from ``model``'s state; both are trained, so pass instances of one's own.

    Equal to rounding (:func:`close_values`): a traced graph calls what forward called, but a custom backward that is
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
        if not close_values(outs[0].detach(), outs[1].detach()):
            raise refuse(f"its output differs in training step {step}")
        # a gradient that should cancel out (a bias before a BatchNorm) is rounding noise: it is judged against
        # the largest gradient of the model, not its own size
        floor = 1e-6 * max((float(_dense(r.grad.detach()).abs().max()) for r in ref_params.values()
                            if r.grad is not None and r.grad.numel() and r.grad.is_floating_point()), default=0.0)
        for n, r in ref_params.items():
            p = params[n]
            if (r.grad is None) != (p.grad is None) or (r.grad is not None and not close_values(r.grad, p.grad, floor)):
                raise refuse(f"the gradient of parameter {n!r} differs in training step {step}")
        with torch.no_grad():  # plain SGD on both, then no gradients
            for group in (ref_params, params):
                for q in group.values():
                    if q.grad is not None:
                        q.sub_(0.1 * q.grad)
                        q.grad = None
        for n, rb in ref_buffers.items():
            if not close_values(rb, buffers[n]):
                raise refuse(f"buffer {n!r} differs after training step {step}")
        for n, r in ref_params.items():
            if not close_values(r.detach(), params[n].detach()):
                raise refuse(f"parameter {n!r} differs after training step {step}")


