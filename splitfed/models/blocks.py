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
(:class:`Joined`) keeps that storage shared. A cut also needs the batch in the
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

This module turns a model into its blocks (:func:`to_blocks`) and refuses what would silently not run when cut
(hooks on the model, a ``train`` override). The parts, one job each: :mod:`~splitfed.models.segment` (blocks,
segments, cut vectors), :mod:`~splitfed.models.tying` (blocks joined to stay on one tier),
:mod:`~splitfed.models.trace` (cut points by ``torch.fx``) and :mod:`~splitfed.models.check` (blocks checked
against the model).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from splitfed.errors import ConfigError, CutError
from splitfed.models.segment import Blocks, leaf_names
from splitfed.models.trace import trace_blocks
from splitfed.models.tying import Joined, join, shared_tensors, storage_groups

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
        blocks = Blocks(mods, [leaf_names(m) for m in mods], traced=False)
    else:
        blocks, keys = trace_blocks(model, name), None
    joined = join(blocks, shared_tensors(blocks), name, keys)
    refuse_lost_modes(model, joined.modules, name)
    # a block whose own tensors share storage keeps it shared in a tier's copy only as a Joined
    return Blocks([m if isinstance(m, Joined) or not storage_groups(m) else Joined(m) for m in joined.modules],
                  joined.names, joined.traced)


