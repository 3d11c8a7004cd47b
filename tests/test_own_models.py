"""A user's model trains as itself when split: checked against plain torch training of the user's own module.

``verify`` compares split training with whole training of the same *blocks*, so a model
the blocks misrepresent passes it. These tests train the module the factory returns,
with plain torch, beside splitfed's split training of it. Each model here once trained
as something else: a module used twice lost its second use, tied weights were untied,
a tuple crossing a cut, an in-place first op and a statistics-only BatchNorm crashed
or were refused.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
from splitfed.engine.types import OptimConfig
from splitfed.errors import ConfigError, CutError
from splitfed.models.segment import Segment
from splitfed.models.zoo import build, resolve_spec

SEED, STEPS, BATCH = 3, 4, 6
OPTIM = OptimConfig(lr=0.1, momentum=0.9, weight_decay=1e-3)


def _spec(factory: str):  # type: ignore[no-untyped-def]
    return resolve_spec(f"tests.own_models:{factory}", input_shape=(16,), num_classes=3)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, 16, generator=g), torch.randint(0, 3, (BATCH,), generator=g)) for _ in range(STEPS)]


def _blocks_as_model(spec, state) -> Segment:  # type: ignore[no-untyped-def]
    """The model's blocks, end to end, holding ``state`` (the keys a split run's global state has)."""
    n = template.num_blocks(spec)
    whole = Segment({str(i): m for i, m in template.copy_blocks(spec, 0, n).items()}, 0, n)
    whole.load_state_dict(state)
    return whole


MODELS = ["reused_activation", "reused_layer", "tied_sequential", "tied_traced", "tuple_between", "inplace_first",
          "batch_statistics"]


@pytest.mark.parametrize("factory", MODELS)
def test_split_training_equals_plain_torch_training_of_the_users_own_module(factory: str) -> None:
    spec = _spec(factory)
    n = template.num_blocks(spec)
    probe = torch.randn(5, 16, generator=torch.Generator().manual_seed(11))

    own = build(spec, SEED)  # the module the user wrote, trained by plain torch
    start = _blocks_as_model(spec, initial_state(spec, SEED))
    own.eval(), start.eval()
    with torch.no_grad():
        assert torch.equal(start(probe), own(probe)), "the blocks compute another function than the model"
    own.train()
    opt = OPTIM.build(list(own.parameters()))
    assert opt is not None
    for x, y in _batches():
        F.cross_entropy(own(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for cuts in [(1, n - 1), (n - 1, n - 1), (1, 1)]:  # 3 tiers; every tier's first op after a cut included
        cfg = RoundConfig("own", 0, spec, "sl", False, OPTIM, SEED)
        state, results = run_round(cfg, inprocess_chain(2), initial_state(spec, SEED), {"c0": cuts},
                                   {"c0": _batches()})
        assert [r.error for r in results if getattr(r, "error", None)] == []
        split = _blocks_as_model(spec, state)
        split.eval(), own.eval()
        with torch.no_grad():
            diff = (split(probe) - own(probe)).abs().max().item()
        assert diff <= 1e-6, (factory, cuts, diff)
        own.train()


def test_a_module_used_twice_keeps_both_uses() -> None:
    assert template.num_blocks(_spec("reused_activation")) == 5  # before: 4, the second ReLU gone


def test_blocks_that_share_a_weight_are_one_block() -> None:
    blocks = template.template(_spec("tied_sequential"))
    assert len(blocks) == 4 and blocks.names[1] == "Linear+ReLU+Linear"  # children 1..3 joined
    joined = blocks.modules[1]
    assert joined[0].weight is joined[2].weight  # type: ignore[index]  # one tensor, as the user tied it
    copy = template.copy_blocks(_spec("tied_sequential"), 1, 2)[1]
    assert copy[0].weight is copy[2].weight  # type: ignore[index]  # and still one in a tier's copy


def test_a_weight_tied_across_the_whole_model_is_refused_in_one_line() -> None:
    with pytest.raises(CutError, match=r"model tests\.own_models:tied_ends \(class Sequential\) has no legal cut: "
                                       r"block 0's 'weight' is also block 4's 'weight' \(a shared weight\), so "
                                       r"blocks 0\.\.4 and all between must stay"):
        template.template(_spec("tied_ends"))


def test_a_traced_model_that_reads_self_training_is_refused() -> None:
    """torch.fx fixes F.dropout(x, p, self.training) at trace time: evaluation would drop units too."""
    with pytest.raises(CutError, match=r"model tests\.own_models:dropout_by_flag \(class _DropoutByFlag\) reads "
                                       r"self\.training in its own forward"):
        template.template(_spec("dropout_by_flag"))


def test_a_tuple_crossing_is_never_a_cut() -> None:
    blocks = template.template(_spec("tuple_between"))
    assert blocks.names[:2] == ["Linear[0]", "_Pair+Linear[2]"]  # the leaves of children 1 and 2, joined
    assert all(isinstance(template.boundary(_spec("tuple_between"), i)[0], tuple) for i in range(len(blocks) + 1))


def test_an_input_of_the_wrong_kind_says_which_kind_the_model_takes() -> None:
    with pytest.raises(ConfigError, match=r"does not take inputs of shape \(7,\) \(floats; "):
        template.template(resolve_spec("tests.own_models:reused_layer", input_shape=(7,), num_classes=3))


def test_a_token_model_of_ones_own_takes_integer_inputs(tmp_path) -> None:
    """``--vocab`` (and an .npz of integers) make a user's model take tokens; before, only a zoo model could,
    and a user's nn.Embedding was handed floats and refused "does not take inputs of shape"."""
    import numpy as np

    from splitfed.cli import main
    from splitfed.data.datasets import spec_for

    spec = resolve_spec("tests.own_models:tokens", input_shape=(6,), num_classes=3, vocab=20)
    assert spec.input_dtype == torch.int64 and template.num_blocks(spec) == 4
    assert main(["verify", "--model", "tests.own_models:tokens", "--input-shape", "6", "--num-classes", "3",
                 "--vocab", "20", "--cuts", "1,3"]) == 0
    with pytest.raises(ConfigError, match="model cnn takes floats, not tokens"):
        resolve_spec("cnn", vocab=20)
    rng = np.random.default_rng(0)
    path = tmp_path / "tok.npz"
    np.savez(path, x_train=rng.integers(0, 20, (12, 6)), y_train=np.arange(12) % 3,
             x_test=rng.integers(0, 15, (4, 6)), y_test=np.arange(4) % 3)
    spec = spec_for("tests.own_models:tokens", f"npz:{path}", vocab=20)  # a run's vocab setting
    assert (spec.input_shape, spec.num_classes, spec.vocab) == ((6,), 3, 20)
    template.template(spec)
    # without it, integer inputs are numbers (uint8 pixels, say): a float model of one's own takes them
    pixels = tmp_path / "pixels.npz"
    np.savez(pixels, x_train=rng.integers(0, 255, (12, 16), dtype=np.uint8), y_train=np.arange(12) % 3,
             x_test=rng.integers(0, 255, (4, 16), dtype=np.uint8), y_test=np.arange(4) % 3)
    spec = spec_for("tests.own_models:reused_layer", f"npz:{pixels}")
    assert spec.vocab == 0
    template.template(spec)
    from splitfed.flower.config import RunSettings

    assert RunSettings(model="tests.own_models:tokens", dataset=f"npz:{path}", vocab=20).spec.vocab == 20
    with pytest.raises(ConfigError, match=r"vocab must be 0 \(float inputs\) or in 2\.\."):
        RunSettings(vocab=1)


def test_a_step_leaves_torch_s_generator_as_it_was() -> None:
    """Dropout draws from a generator reseeded per block and step; before, it stayed reseeded, so a
    Python-API user's own torch.rand after a step (or a verify) drew other numbers than without it."""
    from splitfed.models.segment import make_segment

    spec = resolve_spec("mlp")  # has Dropout
    seg = make_segment(template.template(spec), 0, template.num_blocks(spec)).train()
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    seg(spec.example_input(4), rng=99)
    assert torch.equal(torch.rand(3), want)
    a = seg(spec.example_input(4), rng=5)
    assert torch.equal(seg(spec.example_input(4), rng=5), a)  # the same key, the same mask


class _NormaliseInPlace(torch.nn.Module):
    """Scales its own input in place (a user's preprocessing): legal torch, and split training is right."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(0.5)


def writes_its_input() -> torch.nn.Module:
    return torch.nn.Sequential(_NormaliseInPlace(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def batchnorm_mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3))


def test_verify_gives_each_side_its_own_batches() -> None:
    """verify ran the split round and then the reference on the same batch tensors: a model that writes its
    input saw them written twice on the reference side, and verify reported a MISMATCH (8.8e-2) for a split
    run that was right."""
    from splitfed.engine.verify import verify

    spec = resolve_spec("tests.test_own_models:writes_its_input", input_shape=(16,), num_classes=3)
    result = verify(spec, [(1, 2), (2, 3)], mode="sflv1", steps=3)
    assert result.ok and result.max_abs_diff == 0.0, result


def test_verify_with_batch_one_refuses_a_batchnorm_model_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A traceback from BatchNorm (``Expected more than 1 value per channel``) before; simulate refused it."""
    from splitfed.cli import main

    assert main(["verify", "--model", "tests.test_own_models:batchnorm_mlp", "--input-shape", "16",
                 "--num-classes", "3", "--cuts", "1,3", "--batch", "1"]) == 2
    err = capsys.readouterr().err
    assert "batch 1: model tests.test_own_models:batchnorm_mlp cannot train on one sample" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["verify", "--model", "tests.test_own_models:batchnorm_mlp", "--input-shape", "16",
                 "--num-classes", "3", "--cuts", "1,3", "--batch", "2"]) == 0


def float64_without_a_cast() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()


def test_a_model_in_another_dtype_that_takes_no_cast_is_told_to_cast() -> None:
    """It was told its shape was wrong and that it might need --vocab: the shape was right, and splitfed feeds
    float32, so the model must cast its input itself."""
    with pytest.raises(ConfigError) as e:
        template.num_blocks(resolve_spec("tests.test_own_models:float64_without_a_cast", input_shape=(16,),
                                         num_classes=3))
    msg = str(e.value)
    assert "does not take float32 inputs, which splitfed feeds it: mat1 and mat2 must have the same dtype" in msg
    assert "casts its input itself, e.g. x = x.to(self.weight.dtype)" in msg and "of shape" not in msg
