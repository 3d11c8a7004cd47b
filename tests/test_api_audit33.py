"""The Python API with a user's own model, as the README shows it: ``resolve_spec`` and ``verify``.

Each test failed before its fix: a pruned layer's copy raised torch's deepcopy RuntimeError once the
template had run with autograd on; a ``train()`` override that keeps a BatchNorm in eval mode was
silently dropped on the tiers (a Sequential subclass) or refused as a tracing fault; an input shape of
floats, or a bare int, was taken and broke later in a traceback; ``verify`` with ``steps=0`` said OK
having trained nothing, and a flat cut list raised a TypeError; an LSTM was profiled at 0 FLOPs.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
from splitfed.engine.types import OptimConfig
from splitfed.engine.verify import verify
from splitfed.errors import ConfigError
from splitfed.models.zoo import resolve_spec
from splitfed.profile import profile_model


def _spec(factory: str, **kw: object):  # type: ignore[no-untyped-def]
    return resolve_spec(f"tests.models_audit33:{factory}", input_shape=(16,), num_classes=3, **kw)


@pytest.mark.parametrize("factory", ["pruned", "pruned_traced"])
def test_a_pruned_layer_is_copied_after_its_gradient_reach_is_found(factory: str) -> None:
    spec = _spec(factory)
    n = template.num_blocks(spec)
    template.grad_reach(spec)  # ran the template with autograd on: the pruned weight was left a non-leaf
    copies = template.copy_blocks(spec, 0, n)  # was: RuntimeError (deepcopy of a non-leaf tensor)
    assert len(copies) == n


@pytest.mark.parametrize("factory", ["pruned", "pruned_traced"])
def test_a_pruned_model_with_nothing_on_the_device_trains_split_as_whole(factory: str) -> None:
    for mode in ("sflv1", "sl", "sflv2"):
        result = verify(_spec(factory), cuts=[(0,)], mode=mode, steps=2)  # was: RuntimeError from deepcopy
        assert result.ok and result.max_abs_diff == 0.0, mode


@pytest.mark.parametrize(("factory", "module"), [("frozen_stats_sequential", "1"),
                                                 ("frozen_stats_traced", "backbone.bn")])
def test_a_train_override_the_tiers_would_not_run_is_refused_naming_the_module(factory: str, module: str) -> None:
    with pytest.raises(ConfigError, match=rf"its train\(\) puts {module} \(BatchNorm1d\) in eval mode, and the "
                                          r"tiers would not.*nn\.Sequential whose child overrides train\(\)"):
        template.num_blocks(_spec(factory))


def test_a_train_override_on_a_sequential_models_child_runs_on_the_tiers() -> None:
    spec = _spec("frozen_stats_child")
    assert verify(spec, cuts=[(1,), (0,)], steps=2).ok
    start = initial_state(spec, 0)
    cfg = RoundConfig("audit33", 0, spec, "sflv1", False, OptimConfig(lr=0.1), 0)
    g = torch.Generator().manual_seed(1)
    data = {"c0": [(torch.randn(4, 16, generator=g), torch.randint(0, 3, (4,), generator=g))]}
    state, _ = run_round(cfg, inprocess_chain(1), start, {"c0": (1,)}, data)
    for key in ("0.bn.running_mean", "0.bn.running_var", "0.bn.num_batches_tracked"):  # kept in eval mode
        assert torch.equal(state[key], start[key]), key
    assert not torch.equal(state["0.a.weight"], start["0.a.weight"])  # and trained


@pytest.mark.parametrize(("shape", "why"), [(16, "must be a tuple of integers"), ("16", "must be a tuple of integers"),
                                            ((16.0,), "must be an integer, got 16.0"),
                                            ((3, -1), "must be >= 1, got -1"), ((True,), "must be an integer")])
def test_an_input_shape_that_is_not_positive_integers_is_refused_at_once(shape: object, why: str) -> None:
    for name in ("tests.models_audit33:pruned", "mlp"):
        with pytest.raises(ConfigError, match=f"model {name}: .*input_shape {why}"):
            resolve_spec(name, input_shape=shape, num_classes=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_classes must be an integer, got 3.0"):
        resolve_spec("tests.models_audit33:pruned", input_shape=(16,), num_classes=3.0)  # type: ignore[arg-type]


def test_numpy_and_torch_integers_make_a_spec_of_plain_ints() -> None:
    spec = resolve_spec("tests.models_audit33:pruned", input_shape=(np.int64(16),),
                        num_classes=np.int64(3))  # type: ignore[arg-type]
    assert spec.input_shape == (16,) and all(type(d) is int for d in spec.input_shape) and type(spec.num_classes) is int
    json.dumps(spec.to_dict())  # as every tier receives it
    assert resolve_spec("mlp", input_shape=torch.Size([16])).input_shape == (16,)


@pytest.mark.parametrize("what", ["steps", "rounds", "batch"])
def test_verify_refuses_a_run_that_trains_nothing(what: str) -> None:
    with pytest.raises(ConfigError, match=f"verify: {what} must be an integer >= 1, got 0"):
        verify(resolve_spec("mlp"), cuts=[(2,)], **{what: 0})  # type: ignore[arg-type]


@pytest.mark.parametrize("cuts", [[2, 4], ["2,4"], [(2.5,)], [()], []])
def test_verify_refuses_cuts_that_are_not_a_vector_per_client(cuts: object) -> None:
    with pytest.raises(ConfigError, match=r"verify needs a cut vector .*per client, e\.g\. cuts=\[\(2, 5\)\]"):
        verify(resolve_spec("mlp"), cuts=cuts)  # type: ignore[arg-type]


def test_an_lstm_is_profiled_at_its_matmul_flops_not_zero() -> None:
    spec = resolve_spec("tests.models_audit33:lstm_head", input_shape=(5, 8), num_classes=3)
    prof = profile_model(spec, batch=4, reps=1, use_cache=False)
    per_step = 4 * 16 * 8 + 4 * 16 * 16  # w_ih and w_hh: four gates of 16
    assert prof.fwd_flops[0] == 2 * 5 * per_step  # was 0: torch counts no FLOPs for the fused kernel
    assert prof.bwd_flops[0] == 2 * prof.fwd_flops[0]
    assert prof.fwd_flops[1] == 2 * 16 * 3


@pytest.mark.parametrize("make", [lambda: nn.LSTM(8, 16, num_layers=2, bidirectional=True), lambda: nn.GRU(8, 16),
                                  lambda: nn.LSTM(8, 16, proj_size=4), lambda: nn.RNN(8, 16, num_layers=3)])
def test_a_fused_gpu_rnn_kernel_is_counted_as_its_matmuls(make: Callable[[], nn.RNNBase]) -> None:
    """cuDNN's one kernel for all layers and directions gets the weights as a flat list (``_flat_weights``)."""
    from splitfed.profile.profiler import _RNN_FLOPS, _rnn

    rnn = make()
    expected = sum(2 * 7 * 3 * w.numel() for w in rnn._flat_weights if w is not None and w.dim() == 2)
    weights = [tuple(w.shape) for w in rnn._flat_weights if w is not None]
    assert _rnn((7, 3, 8), weights) == expected
    assert _RNN_FLOPS[torch.ops.aten._cudnn_rnn_backward]((7, 3, 8), weights) == 2 * expected
