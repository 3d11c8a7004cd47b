"""What an optimizer really keeps after a step is what the profile's fixed bytes and a tier's reservation count.

torch's Adam keeps, besides its two moments per parameter, a step count per Parameter that trains (a 0-d float32
tensor on the CPU, 4 bytes); nothing counted it: a tier holding a segment held 4 bytes per trained Parameter more
than it reserved and the cost model priced. SGD with momentum keeps a buffer per parameter, SGD without none.
"""

from __future__ import annotations

import pytest
import torch

from splitfed.engine import template
from splitfed.engine.optim import SegmentOptimizer
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, tier_loads
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig, StepKey
from splitfed.errors import ResourceExhausted
from splitfed.models.tying import param_sizes
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile.profiler import profile_model

B = 4
OPTIMS = (OptimConfig("sgd"), OptimConfig("sgd", momentum=0.9), OptimConfig("adam", lr=0.01))
# (spec, the two server tiers' cuts): the zoo's digits CNN (BatchNorm buffers); two Parameters tied by ``.data``
# (one weight, a gradient and optimizer state each); one Parameter held by two modules (its state once); a
# frozen weight beside a bias that trains (no state for the frozen one).
MODELS = {
    "cnn": (resolve_spec("cnn"), (2, 4)),
    "data_tied": (resolve_spec("tests.test_frozen_params:tied", input_shape=(6,), num_classes=3), (1, 2)),
    "shared_param": (resolve_spec("tests.own_models:tied_sequential", input_shape=(16,), num_classes=3), (1, 3)),
    "half_frozen": (resolve_spec("tests.test_frozen_params:half_frozen", input_shape=(6,), num_classes=3), (0, 2)),
}


def _state_bytes(opt: SegmentOptimizer | None) -> int:
    """Every tensor the optimizer keeps, whatever its shape (moments, momentum buffers, step counts)."""
    if opt is None:
        return 0
    return sum(v.nbytes for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


def _grads_into(opt: SegmentOptimizer, grads: dict[str, int], name: str) -> None:
    """Keeps, under ``name``, the bytes of the gradients present as ``opt`` steps."""
    step = opt.step

    def hooked() -> None:
        grads[name] = param_sizes([p.grad for p in opt.params if p.grad is not None])[1]
        step()

    opt.step = hooked  # type: ignore[method-assign]


def _trained(spec: ModelSpec, cuts: tuple[int, int], optim: OptimConfig) -> list[tuple[Tier, int, int, int]]:
    """Each server tier of a real 2-tier chain after two steps, with what its segment holds: weights and buffers,
    the gradients present when its optimizer steps, and every tensor of the optimizer's state."""
    chain = inprocess_chain(2)
    tiers = [t for t in chain.tiers if isinstance(t, Tier)]
    cfg = RoundConfig("r", 0, spec, "sflv1", False, optim)
    grads: dict[str, int] = {}
    for tier, load in zip(tiers, tier_loads(cfg, "c", cuts, initial_state(spec, 0)), strict=True):
        tier.load(load)
        opt = tier._bindings[("r", "c")].optim
        if opt is not None:
            _grads_into(opt, grads, tier.name)
    g = torch.Generator().manual_seed(0)
    shape, dtype = template.boundary(spec, cuts[0])
    for seq in range(2):
        chain.link.step(StepKey("r", "c", 0, seq, cfg.secret_of("c")), torch.randn(B, *shape, generator=g).to(dtype),
                        torch.randint(0, spec.num_classes, (B,), generator=g))
    out = []
    for tier in tiers:
        b = tier._bindings[("r", "c")]
        weights = param_sizes([*b.segment.parameters(), *b.segment.buffers()])[1]
        out.append((tier, weights, grads.get(tier.name, 0), _state_bytes(b.optim)))
    return out


@pytest.mark.parametrize("optim", OPTIMS, ids=["sgd", "momentum", "adam"])
@pytest.mark.parametrize("model", MODELS)
def test_the_optimizer_state_after_a_step_is_what_the_profile_and_the_tier_count(model: str,
                                                                                 optim: OptimConfig) -> None:
    spec, cuts = MODELS[model]
    prof = profile_model(spec, batch=B, reps=1, optimizer_slots=optim.slots, use_cache=False)
    bounds = (*cuts, prof.n_blocks)
    cfg = RoundConfig("r", 0, spec, "sflv1", False, optim)
    loads = tier_loads(cfg, "c", cuts, initial_state(spec, 0))
    for k, (tier, weights, grads, state) in enumerate(_trained(spec, cuts, optim)):
        if optim.name == "sgd" and not optim.momentum:
            assert state == 0, (model, tier.name)  # plain SGD keeps nothing
        elif grads:
            assert state > 0, (model, tier.name)
        real = weights + grads + state
        assert sum(prof.fixed_bytes[bounds[k]:bounds[k + 1]]) == real, (model, tier.name, state)
        assert tier.held == real, (model, tier.name, state)
        # the reservation is those bytes: a tier bounded to them admits the load, one byte less refuses it
        assert real > 0, (model, tier.name)  # 0 would be the tier's default bound
        Tier(tier.name, max_held_bytes=real, idle_release_s=None).load(loads[k])
        with pytest.raises(ResourceExhausted, match="would add"):
            Tier(tier.name, max_held_bytes=real - 1, idle_release_s=None).load(loads[k])


@pytest.mark.parametrize("default", [torch.float32, torch.float64])
def test_adams_step_count_is_what_the_rule_counts_per_parameter(default: torch.dtype) -> None:
    """Adam's step count is a 0-d tensor of torch's default float dtype where that is float64, else float32;
    SGD with or without momentum keeps none besides its slots."""
    from splitfed.engine.types import optimizer_state_bytes

    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        for optim in OPTIMS:
            params = [torch.nn.Parameter(torch.ones(3, dtype=torch.float32)), torch.nn.Parameter(torch.ones(2))]
            opt = optim.build(params)
            assert opt is not None
            for p in params:
                p.grad = torch.ones_like(p)
            opt.step()
            train = sum(p.numel() * p.element_size() for p in params)
            assert _state_bytes(opt) == optimizer_state_bytes(optim.slots, train, len(params)) \
                == optim.state_bytes(train, len(params)), (optim, default)
    finally:
        torch.set_default_dtype(before)
