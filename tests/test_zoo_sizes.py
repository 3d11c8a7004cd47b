"""A zoo model's size options never derive a size of 0.

``mlp`` with ``hidden: 1`` was taken: its second layer is ``hidden // 2`` wide, so it built a zero-width layer (a
model of empty tensors, torch warning of each). It is refused as any size option out of range is, before the
model is built; every other zoo option at its least builds no empty tensor.
"""

from __future__ import annotations

import warnings

import pytest

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec, build, resolve_spec


def test_mlp_hidden_1_is_refused_before_it_is_built() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before: torch warned of the empty tensors it built
        with pytest.raises(ConfigError) as e:
            resolve_spec("mlp", options={"hidden": 1})
    assert str(e.value) == "model mlp: option hidden must be >= 2, got 1"


def test_mlp_hidden_1_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["blocks", "--model", "mlp", "--model-kwargs", '{"hidden": 1}']) == 2
    assert capsys.readouterr().err == "splitfed blocks: error: model mlp: option hidden must be >= 2, got 1\n"


def test_an_mlp_spec_that_bypassed_resolve_spec_is_refused_at_build() -> None:
    spec = ModelSpec("mlp", (64,), 10, kwargs={"hidden": 1})  # as a tier reads one off the wire
    with pytest.raises(ConfigError) as e:
        build(spec, 0)
    assert str(e.value) == ("model mlp fails with its keyword arguments {'hidden': 1} (--model-kwargs) on inputs of "
                            "shape (64,): hidden must be at least 2 (its second layer is hidden // 2 wide), got 1")


@pytest.mark.parametrize("model,kwargs", [
    ("mlp", {"hidden": 2}),
    ("cnn", {"width": 1}),
    ("vgg11", {"width": 1e-9}),
    ("resnet18", {"width": 1}),
    ("mobilenetv2", {"width": 1e-9}),
    ("transformer", {"d": 4, "layers": 1}),
])
def test_every_zoo_size_at_its_least_builds_no_empty_tensor(model: str, kwargs: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net = build(resolve_spec(model, options=kwargs), 0)
    empty = [name for name, t in (*net.named_parameters(), *net.named_buffers()) if t.numel() == 0]
    assert empty == []
    assert sum(p.numel() for p in net.parameters()) > 0
