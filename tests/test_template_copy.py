"""splitfed.engine.template.copy_blocks: a block's copy is a deep copy in all but cost (a torch.fx block's copy
reuses the template's compiled forward instead of generating and exec'ing its code again)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from splitfed.engine import template
from splitfed.models import rng
from splitfed.models.zoo import ModelSpec, resolve_spec


class _User(nn.Module):
    """A user's model that torch.fx traces: a residual unit, batch norm, dropout and a tensor constant."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.a, self.b, self.out = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.norm, self.drop = nn.BatchNorm1d(8), nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm(self.inp(x)))
        h = h + self.b(F.relu(self.a(h))) * torch.tensor(0.5)
        return self.out(self.drop(h))


def user_model() -> nn.Module:
    return _User()


SPECS = {name: resolve_spec(name) for name in ("mlp", "cnn", "vgg11", "resnet18", "mobilenetv2", "transformer")}
SPECS["user"] = resolve_spec("tests.test_template_copy:user_model", input_shape=(6,), num_classes=3)


def _tensors(m: nn.Module) -> list[torch.Tensor]:
    """Every tensor a module holds: parameters, buffers and plain tensor attributes (fx's constants)."""
    out = [*m.parameters(), *m.buffers()]
    out += [v for mod in m.modules() for v in vars(mod).values() if isinstance(v, torch.Tensor)]
    return out


def _ptrs(blocks: dict[int, nn.Module]) -> set[int]:
    return {t.untyped_storage().data_ptr() for b in blocks.values() for t in _tensors(b) if t.numel()}


def _run(spec: ModelSpec, blocks: dict[int, nn.Module]) -> list[torch.Tensor]:
    """Each block in training mode on the example input, then backward: outputs, input and parameter grads."""
    x = spec.example_input(4)
    got: list[torch.Tensor] = []
    for i in sorted(blocks):
        b = blocks[i].train()
        for p in b.parameters():
            p.grad = None
        leaf = x.detach().requires_grad_(x.is_floating_point())
        with rng.seeded(100 + i):  # dropout draws the same mask in equal blocks
            y = b(leaf.clone() if leaf.requires_grad else leaf)
            y.float().mul(torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        got += [y.detach(), *([leaf.grad] if leaf.requires_grad else [])]
        got += [p.grad if p.grad is not None else torch.zeros(0) for p in b.parameters()]
        x = y.detach()
    return got


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", list(SPECS))
def test_copy_is_an_independent_deep_copy(name: str) -> None:
    spec = SPECS[name]
    n = template.num_blocks(spec)
    t = template.template(spec)
    before = {k: v.clone() for i, m in enumerate(t.modules) for k, v in m.state_dict(prefix=f"{i}.").items()}
    modes = [[m.training for m in b.modules()] for b in t.modules]
    reference = {i: copy.deepcopy(t.modules[i]) for i in range(n)}
    one, two = template.copy_blocks(spec, 0, n), template.copy_blocks(spec, 0, n)

    for i in range(n):
        assert list(one[i].state_dict()) == list(reference[i].state_dict())
        assert [p.requires_grad for p in one[i].parameters()] == [p.requires_grad for p in t.modules[i].parameters()]
    # its own tensors: none shared with the template or with another copy
    assert not _ptrs(one) & _ptrs(dict(enumerate(t.modules)))
    assert not _ptrs(one) & _ptrs(two)
    # the same forward and backward as a deep copy (same outputs, gradients and random draws)
    expected = _run(spec, reference)
    assert _same(_run(spec, one), expected)

    # a change to one copy (its weights, its mode) changes neither the template nor another copy
    with torch.no_grad():
        for b in one.values():
            for p in b.parameters():
                p.add_(1.0)
    for b in one.values():
        b.eval()
    assert _same(_run(spec, two), expected)
    for b in two.values():
        b.eval()
    for b in one.values():
        b.train()
    assert all(not m.training for b in two.values() for m in b.modules())
    after = {k: v for i, m in enumerate(t.modules) for k, v in m.state_dict(prefix=f"{i}.").items()}
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert [[m.training for m in b.modules()] for b in t.modules] == modes
    # a copy of a copy (deepcopy) still runs as the template does
    assert _same(_run(spec, {i: copy.deepcopy(b) for i, b in two.items()}), expected)


def test_copying_a_traced_model_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS["resnet18"]
    n = template.num_blocks(spec)
    assert template.template(spec).traced
    compiled: list[object] = []
    real = fx.Graph.python_code
    monkeypatch.setattr(fx.Graph, "python_code", lambda self, *a, **k: compiled.append(self) or real(self, *a, **k))
    blocks = template.copy_blocks(spec, 0, n)
    assert compiled == []  # copy.deepcopy of a GraphModule generates and execs its code again: ~3 ms a block
    assert all(isinstance(b, fx.GraphModule) for b in blocks.values())


def test_recompiling_or_pickling_a_copy_leaves_the_template_alone() -> None:
    spec = SPECS["user"]
    t = template.template(spec)
    forwards = [type(m).forward for m in t.modules]
    blocks = template.copy_blocks(spec, 0, len(t))
    expected = _run(spec, {i: copy.deepcopy(m) for i, m in enumerate(t.modules)})
    for b in blocks.values():
        assert isinstance(b, fx.GraphModule)
        b.recompile()  # what pickling one does: it sets forward on the copy's class
    assert [type(m).forward for m in t.modules] == forwards
    assert _same(_run(spec, {i: pickle.loads(pickle.dumps(b)) for i, b in blocks.items()}), expected)
    assert _same(_run(spec, blocks), expected)


def test_graph_module_nested_in_a_wrapper_is_copied_whole() -> None:
    torch.manual_seed(0)
    gm = fx.symbolic_trace(_User())
    wrapper = nn.Sequential(nn.Linear(6, 6), gm)
    got = template._copy(wrapper)
    assert isinstance(got[1], fx.GraphModule) and got[1] is not gm
    assert not {t.untyped_storage().data_ptr() for t in _tensors(got)} & {
        t.untyped_storage().data_ptr() for t in _tensors(wrapper)}
    x = torch.randn(4, 6)
    with rng.seeded(1):
        want = copy.deepcopy(wrapper)(x)
    with rng.seeded(1):
        assert torch.equal(got(x), want)
    with torch.no_grad():
        got[1].a.weight.add_(1.0)
    got.eval()
    assert gm.training and not torch.equal(got[1].a.weight, gm.a.weight)
    with rng.seeded(1):
        assert torch.equal(wrapper(x), want)
