"""Frozen parameters (``requires_grad=False``) are weights that travel but do not train.

A frozen parameter gets no gradient and (so) no optimizer state: a block's fixed memory is its parameters
plus a gradient and the optimizer's slots for each trainable one (``ModelProfile.train_bytes``), not 3x every
parameter. With nothing trainable before a cut (a frozen part on the device), nobody upstream can use the
gradient of the boundary there: the tier after the cut neither computes nor sends it, and the cost model
prices none, so priced bytes stay what the in-process link counts at every cut. Split training still equals
whole training exactly. Two Parameters tied by ``.data`` (one storage) are one weight: counted once in the
profile's parameter bytes and in ``splitfed blocks``, while each has its own gradient and optimizer state.

The models are defined here and loaded by ``module:factory`` path, as a user's would be.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from splitfed.cost import Scenario, client_cost
from splitfed.cost.model import LABEL_BYTES, cut_options
from splitfed.engine import template
from splitfed.engine.types import OptimConfig, step_count_bytes
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from splitfed.profile import profiler as profiler_mod
from splitfed.profile.profiler import profile_model

CLASSES = 3
EDGE, CLOUD = TierProfile(1e10, 1e12), TierProfile(1e11, 1e12)
LINK, EDGE_LINK = LinkProfile(1e6, 1e6, 0.01), LinkProfile(1e7, 1e7, 0.005)
F32 = 4


# ---------------------------------------------------------------- the models


def _freeze(*modules: nn.Module) -> None:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)


def frozen_first() -> nn.Module:
    """A frozen Linear first, then trainable layers: a device part of blocks 0-1 holds nothing to train."""
    m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, CLASSES))
    _freeze(m[0])
    return m


def frozen_middle() -> nn.Module:
    """Trainable, frozen, trainable: a gradient still goes back over a cut after the frozen block."""
    m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, CLASSES))
    _freeze(m[2])
    return m


def frozen_backbone() -> nn.Module:
    """A frozen conv + batch-norm backbone (its running statistics still move in training) and a Flatten:
    the whole device part is frozen for every cut up to 4."""
    m = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
                      nn.Linear(32, 8), nn.ReLU(), nn.Linear(8, CLASSES))
    _freeze(m[0], m[1])
    return m


def half_frozen() -> nn.Module:
    """A Linear whose weight is frozen but whose bias trains: the block trains (a gradient goes back)."""
    m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, CLASSES))
    m[0].weight.requires_grad_(False)
    return m


class _Tied(nn.Module):
    """``b.weight.data = a.weight.data``: two Parameters, one storage (``a`` and ``b`` are one block)."""

    def __init__(self, frozen: bool) -> None:
        super().__init__()
        self.inp, self.a, self.b, self.out = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, CLASSES)
        self.b.weight.data = self.a.weight.data
        if frozen:
            _freeze(self.inp, self.a, self.b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        x = torch.tanh(self.a(x))
        x = torch.tanh(self.b(x))
        return self.out(x)


def tied() -> nn.Module:
    return _Tied(frozen=False)


def tied_frozen() -> nn.Module:
    """The tied model with everything but its head frozen."""
    return _Tied(frozen=True)


# Per block, by hand: (parameter elements, each storage once; elements of the Parameters that train, each
# Parameter once). Linear(i, o): i*o + o; Conv2d(1, 2, 3): 18 + 2; BatchNorm2d(2): 2 + 2.
HAND: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "frozen_first": ((56, 0, 72, 0, 27), (0, 0, 72, 0, 27)),
    "frozen_middle": ((56, 0, 72, 0, 27), (56, 0, 0, 0, 27)),
    "frozen_backbone": ((20, 4, 0, 0, 264, 0, 27), (0, 0, 0, 0, 264, 0, 27)),
    "half_frozen": ((56, 0, 27), (8, 0, 27)),
    # a+b: a.weight 64 (b.weight is the same storage), a.bias 8, b.bias 8; each tied Parameter trains on its own
    "tied": ((56, 80, 27), (56, 144, 27)),
    "tied_frozen": ((56, 80, 27), (0, 0, 27)),
}
# Per block, how many Parameters train (each once; Adam keeps a step count for each): a Linear's weight and bias.
TRAINED: dict[str, tuple[int, ...]] = {"frozen_first": (0, 0, 2, 0, 2), "frozen_middle": (2, 0, 0, 0, 2),
                                       "frozen_backbone": (0, 0, 0, 0, 2, 0, 2), "half_frozen": (1, 0, 2),
                                       "tied": (2, 4, 2), "tied_frozen": (0, 0, 2)}
# Per block, bytes of buffers a tier holds beside the parameters (and the profile's fixed bytes count):
# BatchNorm2d(2)'s running mean and variance (2 + 2 float32) and its step counter (one int64).
BUFFERS: dict[str, dict[int, int]] = {"frozen_backbone": {1: F32 * 4 + 8}}
MODELS = tuple(HAND)
INPUT = {"frozen_backbone": (1, 4, 4)}


def _spec(model: str) -> ModelSpec:
    return resolve_spec(f"tests.test_frozen_params:{model}", input_shape=INPUT.get(model, (6,)),
                        num_classes=CLASSES)


def _first_trainable(model: str) -> int:
    return next(i for i, n in enumerate(HAND[model][1]) if n > 0)


def _batches(spec: ModelSpec, B: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A full batch and a short one."""
    x = spec.example_input(B + 2)
    y = torch.randint(0, CLASSES, (B + 2,), generator=torch.Generator().manual_seed(0))
    return [(x[:B], y[:B]), (x[B:], y[B:])]


# ---------------------------------------------------------------- the profile


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("optim", [OptimConfig("sgd"), OptimConfig("sgd", momentum=0.9), OptimConfig("adam")],
                         ids=["sgd", "momentum", "adam"])
def test_fixed_bytes_are_the_hand_count(model: str, optim: OptimConfig) -> None:
    """Parameter bytes count each storage once; trainable bytes each trainable Parameter; fixed bytes are
    parameters and buffers + (gradient + optimizer slots) x trainable parameters + Adam's step count per trainable
    Parameter, frozen ones 1x their weights."""
    elements, trainable = HAND[model]
    prof = profile_model(_spec(model), batch=4, reps=1, optimizer_slots=optim.slots, use_cache=False)
    assert prof.param_bytes == tuple(F32 * n for n in elements)
    buffers = BUFFERS.get(model, {})
    assert prof.fixed_bytes == tuple(F32 * (p + t * (1 + optim.slots)) + n * step_count_bytes(optim.slots)
                                     + buffers.get(i, 0)
                                     for i, (p, t, n) in enumerate(zip(elements, trainable, TRAINED[model], strict=True)))
    assert prof.train_bytes == tuple(F32 * n for n in trainable)


def _storages(ts: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``ts``."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}.values())


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("optim", [OptimConfig("sgd"), OptimConfig("sgd", momentum=0.9), OptimConfig("adam")],
                         ids=["sgd", "momentum", "adam"])
def test_fixed_bytes_are_what_a_tier_holds_after_a_step(model: str, optim: OptimConfig) -> None:
    """A tier's copy of each block and the optimizer it builds over ``segment.parameters()`` (frozen ones
    included), after a step: the parameters', buffers', gradients' and optimizer state's storages add up to the
    profile's fixed bytes (the optimizer keeps nothing for a parameter that never has a gradient; Adam's
    one-value step counts are counted too)."""
    spec = _spec(model)
    prof = profile_model(spec, batch=4, reps=1, optimizer_slots=optim.slots, use_cache=False)
    blocks = template.copy_blocks(spec, 0, prof.n_blocks)
    opts = [optim.build(list(blocks[i].parameters())) for i in range(prof.n_blocks)]
    (x, y), _ = _batches(spec, 4)
    for i in range(prof.n_blocks):
        x = blocks[i](x)
    F.cross_entropy(x, y).backward()
    for i in range(prof.n_blocks):
        params = list(blocks[i].parameters())
        opt = opts[i]
        if opt is not None:
            opt.step()
        state = [] if opt is None else [t for p in params for t in opt.state.get(p, {}).values()
                                        if isinstance(t, torch.Tensor)]
        held = (_storages([*params, *blocks[i].buffers()]) + _storages([p.grad for p in params if p.grad is not None])
                + _storages(state))
        assert held == prof.fixed_bytes[i], (model, i)
        assert all((p.grad is None) == (not p.requires_grad) for p in params)


def test_a_frozen_part_first_has_no_backward_and_the_next_block_no_input_gradient() -> None:
    """Measured as training runs: a frozen block with nothing trainable before it does no backward at all,
    and the trainable Linear after it computes its weight's gradient only (its input needs none), where
    every block after the first was measured with an input gradient (2x forward)."""
    prof = profile_model(_spec("frozen_first"), batch=4, reps=1, use_cache=False)
    assert prof.bwd_flops[0] == 0 and prof.fwd_flops[0] > 0
    assert prof.bwd_flops[2] == pytest.approx(prof.fwd_flops[2]) and prof.fwd_flops[2] > 0
    assert prof.bwd_flops[4] == pytest.approx(2 * prof.fwd_flops[4])  # a trainable block before it
    middle = profile_model(_spec("frozen_middle"), batch=4, reps=1, use_cache=False)
    assert middle.bwd_flops[2] == pytest.approx(middle.fwd_flops[2])  # frozen: its input's gradient only


def test_data_tied_parameters_are_counted_once_in_the_profile_and_in_blocks(capsys) -> None:  # noqa: ANN001
    from splitfed.cli import main
    from splitfed.commands.blocks import describe

    for model in ("tied", "tied_frozen"):
        spec = _spec(model)
        rows = describe(spec)
        assert [r["params"] for r in rows] == list(HAND[model][0])
        assert [r["trainable"] for r in rows] == ([56, 80, 27] if model == "tied" else [0, 0, 27])
        prof = profile_model(spec, batch=2, reps=1, use_cache=False)
        assert sum(prof.param_bytes) == F32 * (56 + 80 + 27)
        whole = template.template(spec).whole()
        assert sum(p.numel() for p in whole.parameters()) == 56 + 80 + 27 + 64  # what was counted before
    assert main(["blocks", "--model", "tests.test_frozen_params:tied_frozen", "--input-shape", "6",
                 "--num-classes", str(CLASSES)]) == 0
    out = capsys.readouterr().out
    assert "trainable" in out and " 80 " in out.replace(",", "") and "144" not in out
    assert main(["blocks", "--model", "tests.test_frozen_params:frozen_first", "--input-shape", "6",
                 "--num-classes", str(CLASSES), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["blocks"]
    assert [(r["params"], r["trainable"]) for r in rows] == [(56, 0), (0, 0), (72, 72), (0, 0), (27, 27)]


# ---------------------------------------------------------------- the engine


@pytest.mark.parametrize("model", MODELS)
def test_a_tier_takes_no_input_gradient_where_nothing_before_trains(model: str, monkeypatch) -> None:  # noqa: ANN001
    """2 tiers, every cut: the edge's input needs a gradient (and the edge sends one back) exactly where a
    block before the cut has a trainable parameter; a frozen device part gets none (it had one, discarded)."""
    from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
    from splitfed.engine.tier import Tier

    spec, B = _spec(model), 4
    L = template.num_blocks(spec)
    first = _first_trainable(model)
    taken: list[bool] = []
    real = Tier._input

    def spy(self: Tier, b: Any, x: torch.Tensor) -> torch.Tensor:
        out = real(self, b, x)
        taken.append(out.requires_grad)
        return out

    monkeypatch.setattr(Tier, "_input", spy)
    state = initial_state(spec, 0)
    for k in range(L):  # k = L: everything on the device, no tier
        assert template.trains_before(spec, k) == (first < k), k
        taken.clear()
        chain = inprocess_chain(1)
        _, res = run_round(RoundConfig("r", 1, spec, "sflv1", optim=OptimConfig(momentum=0.9)), chain, state,
                           {"c": (k,)}, {"c": _batches(spec, B)})
        assert taken == [first < k] * 2, k
        assert (res[0].bytes_down > 0) == (first < k), k


@pytest.mark.parametrize("model", MODELS)
def test_split_training_equals_whole_training(model: str) -> None:
    """Split and whole training agree exactly, frozen device parts and U-shapes included, and frozen
    weights stay as they were."""
    from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
    from splitfed.engine.verify import verify

    spec = _spec(model)
    L = template.num_blocks(spec)
    first = _first_trainable(model)
    cuts = sorted({(1, 2), (first, first + 1), (first + 1, L), (0, L - 1), (L - 1, L)})
    for c in cuts:
        assert verify(spec, [c], steps=2, batch=4).max_abs_diff == 0.0, c
    for c in [(1, 2, L), (first, first + 1, L), (first + 1, first + 1, L)]:
        assert verify(spec, [c], u_shape=True, steps=2, batch=4).max_abs_diff == 0.0, c
    state = initial_state(spec, 0)
    after, _ = run_round(RoundConfig("r", 1, spec, "sflv1", optim=OptimConfig(momentum=0.9, weight_decay=0.1)),
                         inprocess_chain(2), state, {"c": (first + 1, first + 1)}, {"c": _batches(spec, 4)})
    frozen = {f"{i}.{n}" for i, m in enumerate(template.template(spec).modules)
              for n, p in m.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert bool(frozen) == (model != "tied") and all(torch.equal(after[k], state[k]) for k in frozen)
    assert any(not torch.equal(after[k], state[k]) for k in state if k not in frozen and "running" not in k)


# ---------------------------------------------------------------- the cost model


@pytest.mark.parametrize("codec", ["none", "int8"])
@pytest.mark.parametrize("model", MODELS)
def test_priced_bytes_equal_what_the_in_process_link_counts(model: str, codec: str) -> None:
    """Two steps (a full batch and a short one) through a real 3-tier in-process chain, for every cut vector,
    with and without U-shape: what each link counts is what the cost model prices; no gradient comes down a
    link whose cut has nothing trainable before it (a frozen device part), and one does where something trains."""
    from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
    from splitfed.transport import compress

    spec, B = _spec(model), 6
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    state = initial_state(spec, 0)
    batches = _batches(spec, B)
    dev = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=B + 2)
    L, first = prof.n_blocks, _first_trainable(model)
    every = [(False, tuple(map(int, c))) for c in cut_options(L, 3)]
    every += [(True, tuple(map(int, c))) for c in cut_options(L, 3, u_shape=True)]
    for u, cuts in every:
        chain = inprocess_chain(2, *compress.get(codec))
        _, res = run_round(RoundConfig("r", 1, spec, "sflv1", u_shape=u), chain, state, {"c": cuts}, {"c": batches})
        edge_link = chain.tiers[0].next
        counted_up, counted_down = (res[0].bytes_up, edge_link.bytes_up), (res[0].bytes_down, edge_link.bytes_down)
        c = client_cost(Scenario(prof, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B, u_shape=u, codec=codec),
                        dev, cuts)
        assert c.up_bytes == counted_up, (u, cuts)
        assert c.down_bytes == counted_down, (u, cuts)
        if not u:
            for j in range(2):  # only activations and labels cross: a gradient iff something trains before
                crosses = cuts[j] < L
                assert (counted_down[j] > 0) == (crosses and first < cuts[j]), (cuts, j)


def test_the_gradient_rule_prices_trainable_bytes_and_weights_travel_frozen_or_not() -> None:
    """By hand, a synthetic profile whose first block is frozen: no gradient comes down at cut 1, one does at
    cut 2; the device's weights (frozen or not) are exchanged; memory holds the frozen block once."""
    prof = ModelProfile.synthetic([1e6, 2e6, 1e6], [4000, 100, 40], [1000, 500, 200], input_bytes=800,
                                  train_bytes=[0, 500, 200], optimizer_slots=2)
    assert prof.fixed_bytes == (1000, 500 * 4, 200 * 4)
    dev = Client("c", "c", TierProfile(1e9, 1e9), LINK, samples=4)
    sc = Scenario(prof, (dev,), (EDGE,), batch=4)
    one = client_cost(sc, dev, (1,))
    assert one.up_bytes == (4 * 4000 + 4 * LABEL_BYTES,) and one.down_bytes == (0.0,)
    # memory: the frozen block, its activations, the batch, and the output it sends on (kept by no block of a
    # synthetic profile) until the step's reply, with no gradient in it
    assert one.exchange_bytes == 1000 and one.memory[0] == 1000 + 4 * 4000 + 4 * 800 + 4 * 4000
    two = client_cost(sc, dev, (2,))
    assert two.down_bytes == (4 * 100,) and two.exchange_bytes == 1500
    assert client_cost(sc, dev, (0,)).down_bytes == (0.0,)
    every = ModelProfile.synthetic([1e6, 2e6, 1e6], [4000, 100, 40], [1000, 500, 200], input_bytes=800)
    assert every.train_bytes == every.param_bytes  # by default every parameter trains, as before
    assert client_cost(Scenario(every, (dev,), (EDGE,), batch=4), dev, (1,)).down_bytes == (4 * 4000,)


# ---------------------------------------------------------------- old profiles


def test_a_profile_without_train_bytes_trains_every_parameter_and_a_cached_one_is_measured_again(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A profile's JSON from before trainable bytes were recorded reads with every parameter trainable (as
    it priced); the on-disk cache measures such an entry again (it may price a frozen part as trainable)."""
    syn = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800, train_bytes=[0, 500])
    old: dict[str, Any] = syn.to_dict()
    del old["train_bytes"]
    back = ModelProfile.from_dict(old)
    assert back.train_bytes == back.param_bytes == (1000, 500)
    assert ModelProfile.from_dict(syn.to_dict()) == syn
    spec = _spec("frozen_first")
    fresh = profile_model(spec, batch=3, reps=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    stale = json.loads(path.read_text())
    del stale["train_bytes"]
    stale["fixed_bytes"] = [3 * p for p in stale["param_bytes"]]
    path.write_text(json.dumps(stale))
    profiler_mod.clear_cache()
    measured: list[int] = []
    real = profiler_mod._measure
    monkeypatch.setattr(profiler_mod, "_measure", lambda *a, **k: measured.append(1) or real(*a, **k))
    again = profile_model(spec, batch=3, reps=1, cache_dir=tmp_path)
    assert measured == [1] and again.train_bytes == fresh.train_bytes == (0, 0, 288, 0, 108)
    assert "train_bytes" in json.loads(path.read_text())  # kept for next time
    profiler_mod.clear_cache()
    assert profile_model(spec, batch=3, reps=1, cache_dir=tmp_path).fixed_bytes == fresh.fixed_bytes
    assert measured == [1]
