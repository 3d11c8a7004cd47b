"""How a user's model becomes blocks, and how a model's spec comes back from JSON (a review's findings).

A model fx cannot trace was refused with fx's own message, which names no line: the user was left to find
which ``if`` on a tensor it meant. A spec read back from a message (``ModelSpec.from_dict``) went through
``int()``: ``64.9`` became 64, ``true`` 1, the string ``"64"`` the shape ``(6, 4)`` and ``-64`` stayed, so a
node built another model than the server's, or failed later far from the cause.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from splitfed.cli import main
from splitfed.engine.types import OptimConfig
from splitfed.engine.verify import verify
from splitfed.errors import ConfigError, CutError
from splitfed.flower.records import TrainInstruction
from splitfed.models.blocks import to_blocks
from splitfed.models.segment import is_stochastic
from splitfed.models.zoo import ModelSpec, model_blocks, resolve_spec

HERE = "tests.test_models_review"


class _Branching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:  # the line the refusal must name
            h = 2 * h
        return self.b(h)


class _Gate(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h if bool((h > 0).all()) else F.relu(h)  # deep inside the model: still named


class _NestedBranching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.gate, self.b = nn.Linear(16, 8), _Gate(), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.gate(self.a(x)))


def branching() -> nn.Module:
    return _Branching()


def nested_branching() -> nn.Module:
    return _NestedBranching()


@pytest.mark.parametrize(("factory", "line"), [("branching", "if h.sum() > 0:"),
                                               ("nested_branching", "return h if bool((h > 0).all())")])
def test_a_model_fx_cannot_trace_is_refused_naming_the_line(factory: str, line: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CutError, match="cannot be traced by torch.fx") as e:
        to_blocks(globals()[factory]())
    assert f"{__file__}:" in str(e.value) and line in str(e.value), str(e.value)
    assert main(["blocks", "--model", f"{HERE}:{factory}", "--input-shape", "16", "--num-classes", "3"]) != 0
    err = capsys.readouterr().err
    assert "control flow" in err and line in err and "\n" not in err.strip(), err


# ---------------------------------------------------------------- ModelSpec.from_dict

_GOOD = {"name": "mlp", "input_shape": [64], "num_classes": 10, "vocab": 0, "kwargs": {}}
_BAD = [("input_shape", [64.9]), ("input_shape", [64.0]), ("input_shape", [True]), ("input_shape", ["64"]),
        ("input_shape", "64"), ("input_shape", 64), ("input_shape", [-64]), ("input_shape", [0]),
        ("num_classes", 10.7), ("num_classes", True), ("num_classes", 0), ("num_classes", -3), ("num_classes", "10"),
        ("vocab", -5), ("vocab", 1), ("vocab", True), ("vocab", 17.5),
        ("name", 5), ("name", ""), ("name", None), ("kwargs", [["hidden", 8]]), ("kwargs", "hidden=8")]


@pytest.mark.parametrize(("key", "value"), _BAD)
def test_a_spec_of_the_wrong_types_is_refused_not_turned_into_another_model(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        ModelSpec.from_dict({**_GOOD, key: value})


@pytest.mark.parametrize(("key", "value"), [("input_shape", [64.9]), ("input_shape", "64"), ("num_classes", True),
                                            ("vocab", -5)])
def test_a_train_instruction_with_a_malformed_model_is_refused_in_one_line(key: str, value: object) -> None:
    """What a node receives: the instruction's model is the spec as JSON."""
    spec = resolve_spec("mlp")
    rec = TrainInstruction("run", 1, "client0", (1, 3), "sflv1", False, spec, OptimConfig(), 0, "digits", "iid", 8,
                           1, "x:1").to_record()
    rec["model"] = json.dumps({**spec.to_dict(), key: value})
    with pytest.raises(ConfigError, match=f"train instruction: malformed .*{key}"):
        TrainInstruction.from_record(rec)


_NAMES = st.sampled_from(["mlp", "cnn", "transformer", "pkg.mod:factory"])
_SPECS = st.builds(ModelSpec, _NAMES, st.lists(st.integers(1, 4096), max_size=4).map(tuple),
                   st.integers(1, 10**6), st.one_of(st.just(0), st.integers(2, 1 << 24)),
                   st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3))


@settings(max_examples=60, deadline=None)
@given(_SPECS)
def test_every_spec_comes_back_from_json_as_it_was(spec: ModelSpec) -> None:
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


# ---------------------------------------------------------------- a block that draws, told by its generator


class _StochasticDepth(nn.Module):
    """A layer skipped in training with probability 0.5: the check's two seeds may both skip it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and bool(torch.rand(()) < 0.5):
            return x
        return F.relu(self.lin(x))


def stochastic_depth() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 8), _StochasticDepth(), nn.Linear(8, 8), _StochasticDepth(), nn.Linear(8, 3))


def test_a_block_that_draws_alike_under_both_check_seeds_is_still_re_seeded_so_split_equals_whole() -> None:
    """Judged by outputs under seeds 1234 and 5678 (both skip), its blocks were not re-seeded: each tier drew
    from its own generator, and split training differed from whole training by 0.3."""
    spec = resolve_spec(f"{HERE}:stochastic_depth", (16,), 3)
    _, blocks = model_blocks(spec, 0)
    assert [is_stochastic(m) for m in blocks.modules] == [False, True, False, True, False]
    for k in (1, 2, 4):
        result = verify(spec, [(k,)], mode="sl", steps=8, batch=4)
        assert result.max_abs_diff == 0.0, (k, result.max_abs_diff)


# ---------------------------------------------------------------- a forward that takes *inputs


class _Starred(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(xs[0])))


def starred() -> nn.Module:
    return _Starred()


def test_a_forward_taking_star_args_is_refused_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    """Its blocks took the batch as ``xs``, so ``xs[0]`` was the first sample: refused as a model whose block
    "outputs a tensor whose first dimension is not the batch", which names nothing the user wrote."""
    assert main(["blocks", "--model", f"{HERE}:starred", "--input-shape", "16", "--num-classes", "3"]) != 0
    err = capsys.readouterr().err
    assert "forward takes *xs" in err and "batch" not in err, err
