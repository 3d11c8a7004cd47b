"""What blocks are called, and what a refusal to cut a model calls it and the module at fault:

- a traced module split over several blocks gave each its parent's name (mobilenetv2's blocks 5-10 were all
  ``features.3``), and a Sequential's like children one name (vgg11: eight ``Conv2d+BatchNorm2d+ReLU``); now
  every block's name is its own and says where the block is;
- a model whose child reads ``self.training`` in forward was refused as reading it "in its own forward": now
  the child is named, by its path and class;
- a user's model was refused by its class alone: now by the ``--model`` given, and its class.

The models are in this file and load by path (``tests.test_model_names:<factory>``).
"""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from splitfed.cli import main
from splitfed.errors import CutError
from splitfed.models.blocks import to_blocks
from splitfed.models.segment import unique_names
from splitfed.models.zoo import build, cut_name, model_blocks, resolve_spec

HERE = "tests.test_model_names"
FIX = ("which torch.fx fixes when it traces: its blocks would act the same in training and evaluation. Do what "
       "differs in torch's modules (nn.Dropout, nn.BatchNorm), which the tracer keeps whole, or make the model an "
       "nn.Sequential whose children do it (a Sequential's children run untraced)")


# ---------------------------------------------------------------- models


class _Doubling(nn.Module):
    """Doubles its input while training, by ``if self.training:``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            x = x * 2
        return self.lin(x)


class _FlagDropout(nn.Module):
    """F.dropout(x, p, self.training): the same op in both modes, with another argument."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, self.training)


class _ModeConstant(nn.Module):
    """A constant that depends on the mode: the same code in both traces, another value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tensor(1.0 if self.training else 0.0)


class Outer(nn.Module):
    """A plain forward over a body whose child ``body.1`` reads self.training."""

    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), child)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(torch.relu(self.inp(x))))


class Own(nn.Module):
    """Reads self.training in its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if self.training:
            x = x + 1
        return self.b(x)


class _Inverted(nn.Module):
    """Three layers in one child, no skip across them: tracing cuts inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Split(nn.Module):
    """``features.1`` is cut into three blocks; ``pos`` is a parameter forward reads itself."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(4, 4), _Inverted())
        self.pos = nn.Parameter(torch.zeros(4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x) + self.pos)


def child_reads_training() -> nn.Module:
    return Outer(_Doubling())


def own_reads_training() -> nn.Module:
    return Own()


def split() -> nn.Module:
    return Split()


def _spec(factory: str):  # type: ignore[no-untyped-def]
    return resolve_spec(f"{HERE}:{factory}", input_shape=(4,), num_classes=2)


# ---------------------------------------------------------------- unique names that say where


def test_a_module_cut_into_several_blocks_names_each_by_the_path_it_starts_at() -> None:
    """Before: ['features.0', 'features.1', 'features.1', 'features.1', 'add', 'fc']."""
    assert to_blocks(Split()).names == ["features.0", "features.1.conv.0", "features.1.conv.2",
                                        "features.1.conv.3", "pos", "fc"]


def test_mobilenetv2s_blocks_are_named_apart() -> None:
    """Before: blocks 5-10 were all 'features.3', 13-18 'features.6'..."""
    names = to_blocks(build(resolve_spec("mobilenetv2"), 0)).names
    assert len(set(names)) == len(names) == 47
    assert names[4:12] == ["features.2", "features.3.conv.0", "features.3.conv.1", "features.3.conv.3",
                           "features.3.conv.4", "features.3.conv.6", "features.3.conv.7", "features.4"]


def test_a_sequentials_like_children_are_named_by_their_keys() -> None:
    """A name two children share gets each child's key (``model[2]``); one only one has stays bare."""
    blocks = to_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert blocks.names == ["Linear[0]", "ReLU", "Linear[2]", "Tanh", "Linear[4]"]
    named = to_blocks(nn.Sequential(OrderedDict(fc1=nn.Linear(4, 4), act=nn.ReLU(), fc2=nn.Linear(4, 2))))
    assert named.names == ["Linear[fc1]", "ReLU", "Linear[fc2]"]


def test_children_joined_by_a_tie_are_named_by_their_plain_parts() -> None:
    """The joined block's parts are named as they are, the others told apart by key."""
    a, d = nn.Linear(4, 4), nn.Linear(4, 4)
    d.weight = a.weight
    blocks = to_blocks(nn.Sequential(nn.Linear(4, 4), a, nn.ReLU(), d, nn.ReLU(), nn.Linear(4, 2)))
    assert blocks.names == ["Linear[0]", "Linear+ReLU+Linear", "ReLU", "Linear[5]"]


def test_names_left_alike_are_numbered_never_onto_a_name_a_block_has() -> None:
    assert unique_names(["relu", "relu", "relu[1]"]) == ["relu[0]", "relu[2]", "relu[1]"]
    assert unique_names(["a", "b"]) == ["a", "b"]


def test_splitfed_blocks_json_lists_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["blocks", "--model", f"{HERE}:split", "--input-shape", "4", "--num-classes", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["blocks"]
    assert [r["name"] for r in rows] == ["features.0", "features.1.conv.0", "features.1.conv.2",
                                         "features.1.conv.3", "pos", "fc"]


# ---------------------------------------------------------------- who reads self.training


@pytest.mark.parametrize("child", [_Doubling, _FlagDropout, _ModeConstant])
def test_a_child_that_reads_self_training_is_named(child: type[nn.Module]) -> None:
    """Before: 'model Outer reads self.training in its own forward' (Outer's own forward reads nothing)."""
    with pytest.raises(CutError) as e:
        to_blocks(Outer(child()))
    assert str(e.value) == (f"model Outer: its submodule 'body.1' ({child.__name__}) reads self.training in "
                            f"forward, {FIX}")


def test_a_model_that_reads_self_training_itself_is_told_so() -> None:
    with pytest.raises(CutError) as e:
        to_blocks(Own())
    assert str(e.value) == f"model Own reads self.training in its own forward, {FIX}"


# ---------------------------------------------------------------- the model as the user named it


def test_a_users_model_is_refused_by_its_model_path_and_class(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: 'model Outer ...', the factory child_reads_training left to find."""
    message = (f"model {HERE}:child_reads_training (class Outer): its submodule 'body.1' (_Doubling) reads "
               f"self.training in forward, {FIX}")
    with pytest.raises(CutError) as e:
        model_blocks(_spec("child_reads_training"))
    assert str(e.value) == message
    with pytest.raises(CutError) as e:
        model_blocks(_spec("own_reads_training"))
    assert str(e.value) == (f"model {HERE}:own_reads_training (class Own) reads self.training in its own forward, "
                            f"{FIX}")
    assert main(["blocks", "--model", f"{HERE}:child_reads_training", "--input-shape", "4"]) == 2
    assert capsys.readouterr() == ("", f"splitfed blocks: error: {message}\n")


def test_a_zoo_model_keeps_its_class_name() -> None:
    spec = resolve_spec("resnet18")
    assert cut_name(spec, build(spec, 0)) is None
    assert cut_name(_spec("split"), Split()) == f"{HERE}:split (class Split)"
