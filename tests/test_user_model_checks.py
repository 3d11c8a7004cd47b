"""What a user's model is told by ``blocks``, ``verify`` and ``simulate`` (a prober's findings K1-K4).

- K1: a model whose logits are not floating point (a last child returning ``x.long()``, or a complex tensor) was
  accepted, then failed in a tier's first step with a traceback (``log_softmax ... not implemented for 'Long'``);
  now every command refuses it up front, naming the dtype;
- K2: ``verify --transport grpc`` computed with torch's default threads while its tier processes use one: a
  BatchNorm model differed by ~6e-8. Now verify trains with one thread and gives the caller's count back;
- K3: a MISMATCH named only the difference; now it names the weight it is largest in, and its block;
- K4: a Sequential of fewer than 2 children was told "0 child", with nothing to do.

The models are in this file and load by path (``tests.test_user_model_checks:<factory>``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from splitfed.cli import main
from splitfed.engine.verify import largest_diff, max_abs_diff, verify
from splitfed.errors import ConfigError, CutError
from splitfed.models.blocks import to_blocks
from splitfed.models.zoo import model_blocks, resolve_spec

HERE = "tests.test_user_model_checks"
FLOAT_FIX = ("logits must be floating point (float32, as a last nn.Linear gives them): return them uncast "
             "(no .long(), .argmax() or torch.complex last)")


# ---------------------------------------------------------------- models


class _Cast(nn.Module):
    """Casts its input: to ``dtype`` always, or only when training (``training_only``)."""

    def __init__(self, dtype: torch.dtype, training_only: bool = False) -> None:
        super().__init__()
        self.dtype, self.training_only = dtype, training_only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training_only and not self.training:
            return x
        return torch.complex(x, x) if self.dtype.is_complex else x.to(self.dtype)


def _head(last: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10), last)


def int_out() -> nn.Module:
    return _head(_Cast(torch.int64))


def complex_out() -> nn.Module:
    return _head(_Cast(torch.complex64))


def bool_out() -> nn.Module:
    return _head(_Cast(torch.bool))


def int_when_training() -> nn.Module:
    return _head(_Cast(torch.int64, training_only=True))


def double_out() -> nn.Module:
    return _head(_Cast(torch.float64))


def bn_drop() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))


class _Counter(nn.Module):
    """Counts its forwards in a non-persistent buffer and scales by it: split and whole count otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        return x * self.n


def counter() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), _Counter(), nn.ReLU(), nn.Linear(32, 10))


def _spec(factory: str):  # type: ignore[no-untyped-def]
    return resolve_spec(f"{HERE}:{factory}", input_shape=(64,), num_classes=10)


# ---------------------------------------------------------------- K1: logits that are not floating point


@pytest.mark.parametrize(("factory", "dtype"), [("int_out", "int64"), ("complex_out", "complex64"),
                                                ("bool_out", "bool")])
def test_logits_that_are_not_floating_point_are_refused_by_every_command(
        factory: str, dtype: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Before: ``blocks`` listed int_out (exit 0), ``verify`` printed a traceback and "tier cloud: internal error
    in step: NotImplementedError: ... not implemented for 'Long'", ``simulate`` failed in its first round."""
    message = f"model {HERE}:{factory} outputs {dtype} values: {FLOAT_FIX}"
    with pytest.raises(ConfigError) as e:
        model_blocks(_spec(factory))
    assert str(e.value) == message
    model = ["--model", f"{HERE}:{factory}", "--input-shape", "64"]
    out = tmp_path / "run"
    for command in (["blocks", *model], ["verify", *model, "--cuts", "1,2"],
                    ["simulate", "--model", f"{HERE}:{factory}", "--rounds", "1", "--clients", "2", "--cuts",
                     "static:1,2", "--out", str(out)]):
        assert main(command) == 2
        stdout, stderr = capsys.readouterr()
        assert (stdout, stderr) == ("", f"splitfed {command[0]}: error: {message}\n")
    assert not out.exists()


def test_logits_cast_only_in_training_mode_are_refused_saying_so() -> None:
    with pytest.raises(ConfigError) as e:
        model_blocks(_spec("int_when_training"))
    assert str(e.value) == f"model {HERE}:int_when_training outputs int64 values in training mode: {FLOAT_FIX}"


def test_float64_logits_are_still_accepted() -> None:
    assert len(model_blocks(_spec("double_out"))[1]) == 3


# ---------------------------------------------------------------- K2: one thread, as the tiers


@pytest.fixture
def four_threads() -> Iterator[None]:
    """torch's count on a machine of 4 cores or more (the tests' conftest sets 1, which hides the difference)."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.xdist_group("transport-processes")
def test_verify_of_a_batchnorm_model_over_grpc_is_exact_whatever_the_callers_threads(
        four_threads: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: 5.96e-08 (the tier processes sum with one thread, verify's own whole model with 4)."""
    code = main(["verify", "--model", f"{HERE}:bn_drop", "--input-shape", "64", "--cuts", "3,7/1,9",
                 "--transport", "grpc", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and (out["max_abs_diff"], out["worst_key"], out["ok"]) == (0.0, "", True)
    assert torch.get_num_threads() == 4  # the caller's count, given back


def test_verify_from_python_gives_the_callers_thread_count_back(four_threads: None) -> None:
    assert verify(_spec("bn_drop"), [(3, 7)]).max_abs_diff == 0.0
    assert torch.get_num_threads() == 4


# ---------------------------------------------------------------- K3: where a MISMATCH is


def test_a_mismatch_names_the_weight_and_the_block_it_is_largest_in(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "... max |w_split - w_whole| = 3.701e-02 (tolerance 1e-05) MISMATCH", nothing more."""
    args = ["verify", "--model", f"{HERE}:counter", "--input-shape", "64", "--cuts", "2,3/3,4", "--rounds", "2",
            "--mode", "sl"]
    assert main(args) == 1
    assert capsys.readouterr().out == (
        f"verify {HERE}:counter mode=sl tiers=3 cuts=2,3/3,4 transport=inproc: max |w_split - w_whole| = 3.701e-02 "
        "(tolerance 1e-05) MISMATCH, largest in 4.weight (block 4, Linear[4])\n")
    assert main([*args, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["worst_key"], out["ok"]) == ("4.weight", False)
    assert list(out) == ["model", "cuts", "mode", "tiers", "u_shape", "rounds", "clients", "steps", "max_abs_diff",
                         "tolerance", "transport", "worst_key", "ok"]


def test_the_largest_difference_comes_with_its_key() -> None:
    a = {"0.w": torch.tensor([1.0, 2.0]), "1.w": torch.tensor([3.0]), "2.e": torch.zeros(0)}
    b = {"0.w": torch.tensor([1.5, 2.0]), "1.w": torch.tensor([2.0]), "2.e": torch.zeros(0)}
    assert largest_diff(a, b) == (1.0, "1.w") and max_abs_diff(a, b) == 1.0
    assert largest_diff(a, a) == (0.0, "")  # nothing differs: no key to name


# ---------------------------------------------------------------- K4: a Sequential too short to cut


@pytest.mark.parametrize(("children", "counted"), [(0, "0 children"), (1, "1 child")])
def test_a_sequential_of_fewer_than_two_children_is_told_how_to_give_it_more(children: int, counted: str) -> None:
    """Before: "Sequential model has 0 child; it needs at least 2 to be cut", and no way out."""
    with pytest.raises(CutError) as e:
        to_blocks(nn.Sequential(*[nn.Linear(64, 10)][:children]))
    assert str(e.value) == (f"Sequential model has {counted}; it needs at least 2 to be cut: make each layer a child "
                            "of its own, e.g. nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), not "
                            "nn.Sequential(net)")
