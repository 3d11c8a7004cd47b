"""The engine's own optimizers (splitfed.engine.optim) against torch.optim: the same weights and state, bit for
bit, and a training process that never imports torch._dynamo (why they exist)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from splitfed.engine.types import OptimConfig


def _torch_optim(cfg: OptimConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _model(seed: int, frozen: bool) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4), torch.nn.Linear(4, 3))
    if frozen:
        m[2].requires_grad_(False)
    return m


configs = st.builds(
    OptimConfig,
    name=st.sampled_from(["sgd", "adam"]),
    lr=st.sampled_from([1e-3, 0.05, 0.3]),
    momentum=st.sampled_from([0.0, 0.5, 0.9]),
    weight_decay=st.sampled_from([0.0, 1e-4, 0.1]),
)


@given(cfg=configs, seed=st.integers(0, 2**16), steps=st.lists(st.sampled_from(["all", "head", "none"]),
                                                                  min_size=1, max_size=6),
       frozen=st.booleans())
def test_each_optimizer_steps_as_torch_optim_does_bit_for_bit(cfg: OptimConfig, seed: int, steps: list[str],
                                                              frozen: bool) -> None:
    """Steps whose loss reaches every Parameter, only the first layer's ("head": the others get no gradient and
    no state that step, as a segment off the loss's path), or none; a frozen layer never gets one."""
    ours_model, torch_model = _model(seed, frozen), _model(seed, frozen)
    ours = cfg.build(list(ours_model.parameters()))
    theirs = _torch_optim(cfg, list(torch_model.parameters()))
    assert ours is not None
    g = torch.Generator().manual_seed(seed)
    for what in steps:
        x = torch.randn(7, 5, generator=g)
        for m in (ours_model, torch_model):
            if what == "all":
                m(x).pow(2).mean().backward()
            elif what == "head":
                m[0](x).sum().backward()
        ours.step()
        theirs.step()
        ours.zero_grad(set_to_none=True)
        theirs.zero_grad(set_to_none=True)
        for (name, a), b in zip(ours_model.named_parameters(), torch_model.parameters(), strict=True):
            assert torch.equal(a, b), (cfg, name, what)
            assert a.grad is None and b.grad is None
    mine = [ours.state.get(p, {}) for p in ours_model.parameters()]
    torch_state = [theirs.state.get(p, {}) for p in torch_model.parameters()]
    for a, b in zip(mine, torch_state, strict=True):
        assert a.keys() == b.keys(), (cfg, a.keys(), b.keys())
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), (cfg, k)


def test_a_parameter_two_blocks_share_is_stepped_once() -> None:
    """A tied weight given twice (a device's head and tail holding one Parameter) is one weight: one update, one
    state, as the whole model (whose parameters() yields it once) trains it."""
    shared = torch.nn.Parameter(torch.ones(3))
    twice = OptimConfig(momentum=0.9).build([shared, shared])
    once = torch.nn.Parameter(torch.ones(3))
    reference = torch.optim.SGD([once], lr=0.05, momentum=0.9)
    for _ in range(3):
        (shared * torch.arange(3.0)).sum().backward()
        (once * torch.arange(3.0)).sum().backward()
        assert twice is not None
        twice.step()
        reference.step()
        twice.zero_grad()
        reference.zero_grad()
    assert torch.equal(shared, once) and len(twice.state) == 1


def test_zero_grad_keeping_the_tensors_zeroes_them() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    opt = OptimConfig().build([p])
    assert opt is not None
    (p * 3).sum().backward()
    grad = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and torch.equal(grad, torch.zeros(2))


def test_training_never_imports_torch_dynamo() -> None:
    """A round of every mode's engine (device and server tiers) with each optimizer, in a fresh process:
    torch.optim would have imported torch._dynamo (~2.5 s of CPU, ~70 MB) at its first step. (Profiling does
    import it: FlopCounterMode's dispatch does.)"""
    code = textwrap.dedent("""
        import sys
        import torch
        from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
        from splitfed.engine.types import OptimConfig
        from splitfed.models.zoo import resolve_spec

        spec = resolve_spec("mlp")
        for mode, optim in (("sflv1", OptimConfig(momentum=0.9)), ("sflv2", OptimConfig("adam")),
                            ("sl", OptimConfig(weight_decay=0.01))):
            cfg = RoundConfig("r", 0, spec, mode, False, optim)
            data = {c: [(torch.randn(4, *spec.input_shape), torch.randint(0, spec.num_classes, (4,)))] * 2
                    for c in ("a", "b")}
            run_round(cfg, inprocess_chain(2), initial_state(spec, 0), {"a": (1, 2), "b": (2, 3)}, data)
        assert "torch.optim" in sys.modules  # torch imports it: the check below is not vacuous for that
        print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "no dynamo"


def test_sparse_gradients_step_sgd_as_torch_does_and_adam_refuses_them() -> None:
    """An nn.Embedding(sparse=True) gives a sparse gradient: torch.optim.SGD applies it, Adam refuses it."""
    def embedding() -> torch.nn.Embedding:
        torch.manual_seed(0)
        return torch.nn.Embedding(10, 3, sparse=True)

    idx = torch.tensor([1, 4, 4, 7])
    ours_e, torch_e = embedding(), embedding()
    ours = OptimConfig(momentum=0.9).build(list(ours_e.parameters()))
    theirs = torch.optim.SGD(torch_e.parameters(), lr=0.05, momentum=0.9)
    assert ours is not None
    for _ in range(2):
        for e, opt in ((ours_e, ours), (torch_e, theirs)):
            e(idx).sum().backward()
            opt.step()
            opt.zero_grad()
    assert torch.equal(ours_e.weight, torch_e.weight)
    adam_e = embedding()
    adam = OptimConfig("adam").build(list(adam_e.parameters()))
    assert adam is not None
    adam_e(idx).sum().backward()
    with pytest.raises(RuntimeError, match="Adam does not support sparse gradients"):
        adam.step()
