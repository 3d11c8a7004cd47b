"""What the mutation run of splitfed/engine/template.py (lines 181 on) found no test for: the cache of built
templates keeps the last one used whatever its size, and others up to exactly ``TEMPLATE_CACHE_SIZE`` templates
and exactly ``TEMPLATE_CACHE_BYTES`` of weights, least recently used let go of first; ``whole_model`` spans blocks
``[0, n)`` and refuses a state that lacks a weight; ``one_sample_error`` answers "" (a str) and
``first_block_takes`` False (a bool); block 0 is tried on a batch of two (a BatchNorm that keeps no running
statistics normalises by the batch even in eval mode); a block that takes a structure in training passes the
gradient on, so the blocks before it train."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from splitfed.engine import template
from splitfed.engine.rounds import initial_state
from splitfed.models.zoo import ModelSpec, build, resolve_spec

HERE = "tests.test_mutants_template_b"

# zoo models on small inputs: admitted unmeasured, cheap to build, each its own key
A, B, C, D = (ModelSpec("mlp", (n,), 10) for n in (8, 9, 10, 11))


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> OrderedDict[str, object]:
    """An empty cache of built templates for this test (the process's own is given back afterwards)."""
    fresh: OrderedDict[str, object] = OrderedDict()
    monkeypatch.setattr(template, "_templates", fresh)
    return fresh


def _kept(cache: OrderedDict[str, object]) -> list[ModelSpec]:
    by_key = {template._key(s): s for s in (A, B, C, D)}
    return [by_key[k] for k in cache]


def _weight_bytes(spec: ModelSpec) -> int:
    model = build(spec)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


# ---------------------------------------------------------------- the cache of built templates


def test_the_cache_keeps_several_templates_under_its_limits(cache: OrderedDict[str, object]) -> None:
    """Two small models are far below both limits: both stay built, and the first is served again, not rebuilt."""
    a = template.template(A)
    template.template(B)
    assert _kept(cache) == [A, B]
    assert template.template(A) is a
    assert _kept(cache) == [B, A]  # a hit is the most recently used


def test_the_last_template_used_is_kept_even_above_the_byte_limit(cache: OrderedDict[str, object],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model alone holds more than the byte limit: the one just built is kept (asked for again, it is not
    rebuilt), the one before it let go of."""
    monkeypatch.setattr(template, "TEMPLATE_CACHE_BYTES", 1)
    a = template.template(A)
    assert _kept(cache) == [A]
    assert template.template(A) is a
    template.template(B)
    assert _kept(cache) == [B]


def test_the_cache_holds_exactly_its_number_of_templates(cache: OrderedDict[str, object],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``TEMPLATE_CACHE_SIZE`` templates are kept; one more lets the least recently used go."""
    monkeypatch.setattr(template, "TEMPLATE_CACHE_SIZE", 2)
    for s in (A, B):
        template.template(s)
    assert _kept(cache) == [A, B]
    template.template(C)
    assert _kept(cache) == [B, C]
    template.template(B)  # used: now C is the least recently used
    template.template(D)
    assert _kept(cache) == [B, D]


def test_the_cache_holds_exactly_its_bytes_of_weights(cache: OrderedDict[str, object],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Templates holding exactly ``TEMPLATE_CACHE_BYTES`` of weights together are all kept; one byte more is
    over it."""
    monkeypatch.setattr(template, "TEMPLATE_CACHE_BYTES", _weight_bytes(B) + _weight_bytes(C))
    template.template(B)
    template.template(C)
    assert _kept(cache) == [B, C]
    template.template(A)  # A holds less than B: letting B go is enough
    assert _kept(cache) == [C, A]


# ---------------------------------------------------------------- whole_model


def test_the_whole_model_spans_every_block_and_holds_the_state() -> None:
    """The unsplit model is the segment ``[0, n)``, and holds the state given."""
    spec = resolve_spec("cnn")
    state = initial_state(spec, seed=3)
    seg = template.whole_model(spec, state)
    n = template.num_blocks(spec)
    assert (seg.start, seg.stop, len(seg)) == (0, n, n)
    got = seg.state_dict()
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)


def test_the_whole_model_refuses_a_state_lacking_a_weight() -> None:
    """A state that lacks a weight is refused, not evaluated with the template's initial weight in its place."""
    spec = resolve_spec("cnn")
    state = initial_state(spec, seed=3)
    lacking = dict(list(state.items())[1:])
    with pytest.raises(RuntimeError, match=f"Missing key.*{list(state)[0]}"):
        template.whole_model(spec, lacking)
    with pytest.raises(RuntimeError, match="Unexpected key.*nope"):
        template.whole_model(spec, {**state, "nope": torch.zeros(1)})


# ---------------------------------------------------------------- one_sample_error, first_block_takes


class _Cast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


def cast_then_batchnorm() -> nn.Module:
    """Casts its own input (a user's model may take float64), then a BatchNorm that keeps no running statistics:
    it normalises by the batch even in eval mode, so one sample has no spread."""
    return nn.Sequential(nn.Sequential(_Cast(), nn.BatchNorm1d(12, track_running_stats=False)), nn.Linear(12, 10))


def test_a_model_that_trains_on_one_sample_is_answered_with_an_empty_string() -> None:
    """The answer is a str: "" where the model can train on one sample."""
    assert template.one_sample_error(A) == ""


def test_a_first_block_that_does_not_take_a_dtype_is_answered_false() -> None:
    """The answer is a bool: a Linear does not take int64 values."""
    spec = resolve_spec(f"{HERE}:structure_in_training", input_shape=(12,), num_classes=10)
    assert template.first_block_takes(spec, torch.int64) is False


def test_block_0_is_tried_on_a_batch_of_two() -> None:
    """A first block that casts its input and normalises by the batch takes float64 (on the two samples it is
    tried on; a batch of one would fail and the device would refuse the user's float64 data)."""
    spec = resolve_spec(f"{HERE}:cast_then_batchnorm", input_shape=(12,), num_classes=10)
    assert template.first_block_takes(spec, torch.float64) is True


# ---------------------------------------------------------------- a structure between blocks in training


class _Pair(nn.Module):
    """A tensor in eval mode (a legal cut after it), a pair in training (as an auxiliary head's output is)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.f(x)
        return (h, h * 2) if self.training else h


class _First(nn.Module):
    def forward(self, x: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        return x[0] if isinstance(x, tuple) else x


def structure_in_training() -> nn.Module:
    return nn.Sequential(_Pair(), _First(), nn.Linear(12, 10))


def test_a_block_taking_a_structure_in_training_passes_the_gradient() -> None:
    """A block whose training input is a structure is taken as passing the gradient: block 0 before it trains,
    its 156 float32 parameters (a tier holds a gradient and optimizer state for them)."""
    spec = resolve_spec(f"{HERE}:structure_in_training", input_shape=(12,), num_classes=10)
    assert template.grad_reach(spec) == (True, True, True, True)
    assert [template.gets_gradient(spec, i) for i in range(3)] == [True, False, True]
    assert template.held_bytes(spec, 0) == ((12 * 12 + 12) * 4, (12 * 12 + 12) * 4)
    assert template.train_tensors(spec, 0) == 2
    assert template.trains_before(spec, 1)
