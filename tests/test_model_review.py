"""A user's own model is cut as the user wrote it, or refused saying why (a review's findings).

The reference here is the user's model itself, built by its factory: ``splitfed verify`` compares split blocks
with the same blocks joined, so a model that lost something on its way to blocks passed it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from splitfed.cli import main
from splitfed.engine import template
from splitfed.errors import ConfigError
from splitfed.models.zoo import build, resolve_spec

HERE = "tests.test_model_review"


class _Residual(nn.Sequential):
    """A Sequential subclass with a forward of its own: a residual around its third child."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self[1](self[0](x))
        return self[3](h + self[2](h))


class _Flattening(nn.Sequential):
    """Its forward flattens between children that do not (run as a plain Sequential it fails)."""

    def __init__(self) -> None:
        super().__init__(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Linear(4 * 8 * 8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[2](self[1](self[0](x)).flatten(1))


def residual_sequential() -> nn.Module:
    return _Residual()


def flattening_sequential() -> nn.Module:
    return _Flattening()


def hooked() -> nn.Module:
    """A pruned MLP: a hook keeps the masked weights' gradient at zero."""
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
    mask = (torch.arange(16 * 8).reshape(16, 8) % 2).float()
    m[0].weight.register_hook(lambda g: g * mask)
    return m


def lazy() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 10))


def sized(hidden: list[int] | tuple[int, ...] = (16,)) -> nn.Module:
    assert isinstance(hidden, list), f"hidden must be a list, got {type(hidden).__name__}"
    return nn.Sequential(nn.Linear(8, hidden[0]), nn.ReLU(), nn.Linear(hidden[0], 10))


def _trains_as_the_model(spec) -> None:  # type: ignore[no-untyped-def]
    """Three SGD steps of the user's model and of its blocks joined give the same outputs."""
    model, blocks = build(spec, 0), template.template(spec).whole()
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, *spec.input_shape, generator=g)
        y = torch.randint(0, spec.num_classes, (4,), generator=g)
        outs = []
        for net in (model, blocks):
            out = net(x)
            F.cross_entropy(out, y).backward()
            with torch.no_grad():
                for p in net.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
            outs.append(out.detach())
        assert torch.allclose(outs[0], outs[1], atol=1e-6), (outs[0] - outs[1]).abs().max()


@pytest.mark.parametrize(("factory", "shape"), [("residual_sequential", (8,)), ("flattening_sequential", (1, 8, 8))])
def test_a_sequential_subclass_with_its_own_forward_is_cut_as_its_forward_runs(factory, shape, capsys) -> None:  # type: ignore[no-untyped-def]
    """It was cut into its children, its forward dropped: the residual model trained without its residual
    (and verify said OK), the flattening one crashed with a shape error."""
    spec = resolve_spec(f"{HERE}:{factory}", shape, 10)
    _trains_as_the_model(spec)
    assert main(["verify", "--model", spec.name, "--input-shape", ",".join(map(str, shape)), "--num-classes", "10",
                 "--cuts", "1"]) == 0, capsys.readouterr()


def test_a_parameter_with_a_gradient_hook_is_refused_naming_it() -> None:
    """Each tier trains a copy of its blocks, and a copied parameter has no hook: the pruned weights trained."""
    with pytest.raises(ConfigError, match=r"0\.weight has a gradient hook, which the copies of it each tier trains "
                                          "do not keep"):
        template.template(resolve_spec(f"{HERE}:hooked", (8,), 10))


def test_a_lazy_module_is_sized_by_an_example_batch_and_cut_as_any_other(capsys) -> None:
    """An uninitialised parameter has no size: every command that sized the model ended in a traceback."""
    spec = resolve_spec(f"{HERE}:lazy", (8,), 10)
    assert build(spec, 0)[0].weight.shape == (16, 8)
    assert torch.equal(build(spec, 3)[0].weight, build(spec, 3)[0].weight)  # the same in every process
    _trains_as_the_model(spec)
    assert main(["verify", "--model", spec.name, "--input-shape", "8", "--num-classes", "10", "--cuts", "1"]) == 0


def test_model_keyword_arguments_must_come_back_from_json_as_given() -> None:
    """Every tier rebuilds the model from the spec as JSON: a tuple reached the factory as a list, a class
    raised a TypeError from deep inside."""
    assert resolve_spec(f"{HERE}:sized", (8,), 10, hidden=[32]).kwargs == {"hidden": [32]}
    template.template(resolve_spec(f"{HERE}:sized", (8,), 10, hidden=[32]))
    for bad in ((32, 16), nn.Tanh):
        with pytest.raises(ConfigError, match="keyword arguments .* must be JSON values"):
            resolve_spec(f"{HERE}:sized", (8,), 10, hidden=bad)
