"""The weight exchange and a cut move cost what the engine really sends: each block's state dict.

The engine ships a segment's weights as its state dict (``splitfed.engine.rounds.device_state`` down to the
device, ``Device.state`` back up, ``select`` to a tier): every key, so a tensor tied under two names goes
under each, and every persistent buffer (BatchNorm's running statistics and its int64 counter); a
non-persistent buffer stays home. The profile records those bytes per block (``ModelProfile.state_bytes``)
and the cost model prices the exchange (X) and ``move_cost`` with them, where it once priced the parameter
bytes (each storage once, no buffer), a little low for such models. The expected numbers here come from the
engine's own functions on the real state, never from a hand count.

Also: ``template.size`` (the tier's build limit) counts a weight tied by ``.data`` once, as the profile does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
import torch
from torch import nn

from splitfed.cost import Scenario, client_cost, move_cost
from splitfed.cost.model import cut_options
from splitfed.engine import template
from splitfed.engine.limits import DEFAULT_LIMITS, BuildLimits, set_limits
from splitfed.engine.rounds import (
    Outcome,
    RoundConfig,
    SplitRound,
    device_state,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    select,
    state_bytes,
)
from splitfed.engine.types import State
from splitfed.errors import ResourceExhausted
from splitfed.models.segment import segment_bounds
from splitfed.models.tying import param_sizes
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile import Client, LinkProfile, TierProfile
from splitfed.profile import profiler as profiler_mod
from splitfed.profile.profiler import ModelProfile, profile_model

CLASSES = 3
EDGE, CLOUD = TierProfile(1e10, 1e12), TierProfile(1e11, 1e12)
LINK, EDGE_LINK = LinkProfile(1e6, 2e6, 0.01), LinkProfile(1e7, 3e7, 0.005)
DEV = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=8)


# ---------------------------------------------------------------- the models


def conv_bn() -> nn.Module:
    """BatchNorm2d and BatchNorm1d: running mean, variance (float32) and a step counter (int64) per norm."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, CLASSES))


def shared_param() -> nn.Module:
    """One nn.Parameter held by two Linears (``b.weight = a.weight``): one block, two state-dict keys."""
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    b.weight = a.weight
    return nn.Sequential(nn.Linear(6, 8), a, nn.Tanh(), b, nn.Tanh(), nn.Linear(8, CLASSES))


class _Scaled(nn.Module):
    """A non-persistent buffer (not in the state dict: it never travels) beside a persistent one."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5), persistent=False)
        self.register_buffer("shift", torch.zeros(8, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale + self.shift.to(x.dtype)


def buffers() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), _Scaled(), nn.ReLU(), nn.Linear(8, CLASSES))


SPECS: dict[str, ModelSpec] = {
    "conv_bn": resolve_spec("tests.test_state_bytes:conv_bn", input_shape=(1, 4, 4), num_classes=CLASSES),
    "shared_param": resolve_spec("tests.test_state_bytes:shared_param", input_shape=(6,), num_classes=CLASSES),
    "data_tied": resolve_spec("tests.test_frozen_params:tied", input_shape=(6,), num_classes=CLASSES),
    "buffers": resolve_spec("tests.test_state_bytes:buffers", input_shape=(6,), num_classes=CLASSES),
}
SMALL = tuple(SPECS)


def _spec(model: str) -> ModelSpec:
    return resolve_spec(model) if model == "resnet18" else SPECS[model]


@cache  # one profile per model for the module's tests (none changes it): resnet18's was measured three times
def _profile(model: str) -> ModelProfile:
    return profile_model(_spec(model), batch=4, reps=1, use_cache=False)


def _batches(spec: ModelSpec, B: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A full batch and a short one (of two: a BatchNorm needs two samples)."""
    x = spec.example_input(B + 2)
    y = torch.randint(0, CLASSES, (B + 2,), generator=torch.Generator().manual_seed(0))
    return [(x[:B], y[:B]), (x[B:], y[B:])]


def _every(L: int) -> list[tuple[bool, tuple[int, ...]]]:
    out = [(False, tuple(map(int, c))) for c in cut_options(L, 3)]
    return out + [(True, tuple(map(int, c))) for c in cut_options(L, 3, u_shape=True)]


def _scenario(prof: ModelProfile, u: bool) -> Scenario:
    return Scenario(prof, (DEV,), (EDGE, CLOUD), (EDGE_LINK,), batch=6, u_shape=u)


# ---------------------------------------------------------------- the profile


@pytest.mark.parametrize("model", [*SMALL, "resnet18"])
def test_state_bytes_are_each_blocks_keys_as_the_engine_selects_them(model: str) -> None:
    """Per block, the profile's state bytes are ``state_bytes(select(state, i, i + 1))`` of the engine's initial
    state; for these models that is more than the parameter bytes (buffers, a tie under two names), except
    where a non-persistent buffer is all a block has beyond its weights."""
    spec = _spec(model)
    prof = _profile(model)
    state = initial_state(spec, 0)
    sent = tuple(float(state_bytes(select(state, i, i + 1))) for i in range(prof.n_blocks))
    assert prof.state_bytes == sent
    assert sum(sent) == state_bytes(state)
    assert sum(prof.state_bytes) > sum(prof.param_bytes)  # what was priced before: too little
    assert ModelProfile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof


def test_what_the_state_holds() -> None:
    """The keys that make the difference are in the engine's state, and a non-persistent buffer is not."""
    bn = initial_state(_spec("conv_bn"), 0)
    assert bn["1.num_batches_tracked"].dtype == torch.int64 and {"1.running_mean", "1.running_var"} <= set(bn)
    tied = initial_state(_spec("shared_param"), 0)
    assert tied["1.0.weight"] is tied["1.2.weight"] or torch.equal(tied["1.0.weight"], tied["1.2.weight"])
    buf = initial_state(_spec("buffers"), 0)
    assert "2.shift" in buf and not any(k.endswith("scale") for k in buf)
    prof = _profile("buffers")
    assert prof.state_bytes[2] == prof.param_bytes[2] + 8 * 8  # the float64 shift travels, the scale does not


# ---------------------------------------------------------------- the cost model against the engine


def _spy(train: Any, seen: dict[str, list[State]]) -> Any:
    """The trainer, recording each client's device weights as sent down and as sent back up."""

    def run(cfg: RoundConfig, cuts: Mapping[str, tuple[int, ...]], weights: Mapping[str, State]) -> Any:
        seen["down"] = [dict(w) for w in weights.values()]
        out: Mapping[str, Outcome] = train(cfg, cuts, weights)
        seen["up"] = [o.state for o in out.values()]
        return out

    return run


@pytest.mark.parametrize("model", SMALL)
def test_priced_exchange_is_the_device_state_the_engine_sends_both_ways(model: str) -> None:
    """A real round through a real 3-tier in-process chain, every cut vector, with and without U-shape: the
    weights the round hands the device and the weights the device hands back are each exactly the priced
    exchange bytes W, and X = W / down + W / up + rtt (the round trip even when the device holds no state: its
    train message and reply go all the same)."""
    spec = _spec(model)
    prof = profile_model(spec, batch=6, reps=1, use_cache=False)
    state = initial_state(spec, 0)
    batches = _batches(spec)
    for u, cuts in _every(prof.n_blocks):
        chain = inprocess_chain(2)
        cfg = RoundConfig("r", 1, spec, "sflv1", u_shape=u)
        seen: dict[str, list[State]] = {}
        drive(SplitRound(cfg, chain.tiers, state, {"c": cuts}), _spy(local_trainer(chain, {"c": batches}), seen))
        (down,), (up,) = seen["down"], seen["up"]
        c = client_cost(_scenario(prof, u), DEV, cuts)
        assert c.exchange_bytes == state_bytes(down) == state_bytes(up), (u, cuts)
        assert c.exchange_bytes == state_bytes(device_state(state, cuts, prof.n_blocks, u)), (u, cuts)
        w = c.exchange_bytes
        assert c.exchange_s == pytest.approx(w / LINK.down + w / LINK.up + LINK.rtt, rel=1e-12)


@pytest.mark.parametrize("model", [*SMALL, "resnet18"])
def test_priced_exchange_equals_the_device_state_for_every_cut(model: str) -> None:
    """Without training (resnet18 is large): for every cut vector, U-shape or not, the priced exchange bytes
    are the bytes of the engine's device state (``device_state`` of the initial state) and of the Flower
    record that carries it."""
    from splitfed.flower.records import state_to_record

    spec = _spec(model)
    prof = _profile(model)
    state = initial_state(spec, 0)
    L = prof.n_blocks
    every = _every(L)
    assert len(every) > 10
    for u, cuts in every:
        dev = device_state(state, cuts, L, u)
        assert client_cost(_scenario(prof, u), DEV, cuts).exchange_bytes == state_bytes(dev), (u, cuts)
    whole = state_to_record(device_state(state, (L, L), L, False))
    assert sum(a.numpy().nbytes for a in whole.values()) == state_bytes(state) == \
        client_cost(_scenario(prof, False), DEV, (L, L)).exchange_bytes


def _moved(state: State, L: int, u: bool, old: tuple[int, ...], new: tuple[int, ...],
           links: tuple[LinkProfile, ...]) -> float:
    """Seconds to ship, over each link between a block's old and new tier, the keys the engine would load
    there for it (``select`` of the block), by ``segment_bounds``'s tiers (the device's U-shape tail: tier 0)."""

    def tiers(cuts: tuple[int, ...]) -> list[int]:
        bounds = segment_bounds(cuts, L, u)
        of = [0] * L
        for t, (a, z) in enumerate(bounds):
            for i in range(a, z):
                of[i] = 0 if u and t == len(bounds) - 1 else t
        return of

    was, now = tiers(old), tiers(new)
    total = 0.0
    for j, lk in enumerate(links, 1):
        up = sum(state_bytes(select(state, i, i + 1)) for i in range(L) if was[i] < j <= now[i])
        down = sum(state_bytes(select(state, i, i + 1)) for i in range(L) if now[i] < j <= was[i])
        total += up / lk.up + (up > 0) * lk.rtt / 2 + down / lk.down + (down > 0) * lk.rtt / 2
    return total


@pytest.mark.parametrize("model", [*SMALL, "resnet18"])
def test_move_cost_ships_the_state_of_the_blocks_that_change_tier(model: str) -> None:
    """Every pair of cut vectors (a sample of them for the larger option sets), U-shape or not: ``move_cost``
    is the time of the state dicts of the blocks that change tier, over each link they cross."""
    spec = _spec(model)
    prof = _profile(model)
    state = initial_state(spec, 0)
    L = prof.n_blocks
    for u in (False, True):
        sc = _scenario(prof, u)
        opts = [tuple(map(int, c)) for c in sc.options]
        pairs = [(a, b) for a in opts[::max(1, len(opts) // 12)] for b in opts[::max(1, len(opts) // 9)]]
        assert len(pairs) > 20
        moved = 0
        for old, new in pairs:
            want = _moved(state, L, u, old, new, (LINK, EDGE_LINK))
            assert move_cost(sc, DEV, old, new) == pytest.approx(want, rel=1e-12, abs=1e-15), (u, old, new)
            moved += want > 0
        assert moved > len(pairs) // 2


def test_a_move_of_a_batch_norm_block_alone_is_its_statistics_too() -> None:
    """conv_bn: moving only the BatchNorm2d block from the edge to the device ships its weight, bias, running
    mean and variance (4 x 4 float32 each) and its int64 counter: 72 bytes, not the 32 of its parameters."""
    prof = _profile("conv_bn")
    sc = _scenario(prof, False)
    assert prof.param_bytes[1] == 32 and prof.state_bytes[1] == 72
    assert move_cost(sc, DEV, (1, 8), (2, 8)) == pytest.approx(72 / LINK.down + LINK.rtt / 2)


# ---------------------------------------------------------------- old profiles


@pytest.mark.parametrize("field", ["state_bytes", "grad_bwd_flops", "grad_act_bytes"])
def test_a_cached_profile_without_a_new_field_is_measured_again(field: str, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """An older profile's JSON reads as it was priced (state = parameters; a tail's backward as measured), but
    the on-disk cache measures such an entry again; the version (4) is in the cache key besides."""
    spec = _spec("conv_bn")
    profiler_mod.clear_cache()  # measured and written here, not answered from memory
    fresh = profile_model(spec, batch=3, reps=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    stale: dict[str, Any] = json.loads(path.read_text())
    assert stale["version"] == profiler_mod.PROFILE_VERSION >= 4
    del stale[field]
    old = ModelProfile.from_dict(stale)
    assert (old.state_bytes, old.grad_bwd_flops, old.grad_act_bytes) == (
        fresh.param_bytes if field == "state_bytes" else fresh.state_bytes,
        fresh.bwd_flops if field == "grad_bwd_flops" else fresh.grad_bwd_flops,
        fresh.act_bytes if field == "grad_act_bytes" else fresh.grad_act_bytes)
    path.write_text(json.dumps(stale))
    profiler_mod.clear_cache()
    measured: list[int] = []
    real = profiler_mod._measure
    monkeypatch.setattr(profiler_mod, "_measure", lambda *a, **k: measured.append(1) or real(*a, **k))
    again = profile_model(spec, batch=3, reps=1, cache_dir=tmp_path)
    assert measured == [1] and getattr(again, field) == getattr(fresh, field)
    assert field in json.loads(path.read_text())  # kept for next time
    profiler_mod.clear_cache()
    assert getattr(profile_model(spec, batch=3, reps=1, cache_dir=tmp_path), field) == getattr(fresh, field)
    assert measured == [1]
    assert fresh.state_bytes != fresh.param_bytes and fresh.grad_bwd_flops != fresh.bwd_flops
    syn = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800, state_bytes=[1016, 500])
    assert syn.state_bytes == (1016, 500) and ModelProfile.from_dict(syn.to_dict()) == syn


def test_the_profile_version_is_in_the_cache_key(monkeypatch) -> None:  # noqa: ANN001
    """A profile cached by an older version (3: no state bytes) has another key: it is never read back."""
    spec = _spec("conv_bn")
    now = profiler_mod._key(spec, 4, 1, torch.device("cpu"))
    monkeypatch.setattr(profiler_mod, "PROFILE_VERSION", 3)
    assert profiler_mod._key(spec, 4, 1, torch.device("cpu")) != now


# ---------------------------------------------------------------- the build limit


@pytest.fixture
def restore_limits():  # type: ignore[no-untyped-def]
    yield
    set_limits(DEFAULT_LIMITS)


def test_template_size_counts_a_data_tie_once_as_the_profile_does(restore_limits) -> None:  # type: ignore[no-untyped-def]
    """tests.test_frozen_params:tied has ``b.weight.data = a.weight.data``: 163 parameters in memory, 227 as
    Parameter objects. The build limit sizes it (on meta) at the profile's bytes, so a limit between the two
    admits it; a limit below the true size still refuses it."""
    spec = _spec("data_tied")
    prof = _profile("data_tied")
    params, _ = template.size(spec)
    assert params == sum(prof.param_bytes) == 4 * 163
    set_limits(BuildLimits(model_bytes=4 * 200))
    template.admit(spec)  # 652 bytes fit in 800 (908 would not)
    set_limits(BuildLimits(model_bytes=4 * 150))
    with pytest.raises(ResourceExhausted, match="has 652 bytes of parameters; this process builds at most 600 bytes"):
        template.admit(spec)
    set_limits(DEFAULT_LIMITS)
    shared, _ = template.size(_spec("shared_param"))  # one Parameter object in two modules: once, as before
    assert shared == sum(_profile("shared_param").param_bytes)


def test_param_sizes_on_meta_tell_a_tie_from_two_equal_tensors() -> None:
    """On the meta device a ``.data`` tie shares one storage (counted once); two untied tensors of the same
    shape do not (counted twice); a view of part of a storage counts the part it covers."""
    with torch.device("meta"):
        a, b, c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        b.weight.data = a.weight.data
        flat = torch.empty(100)
    assert param_sizes([a.weight, b.weight]) == (64, 256)
    assert param_sizes([a.weight, c.weight]) == (128, 512)
    assert param_sizes([flat[:10], flat[5:20]]) == (20, 80)
    assert param_sizes([flat[:10], flat[50:60]]) == (20, 80)
    real = nn.Linear(8, 8), nn.Linear(8, 8)
    real[1].weight.data = real[0].weight.data
    assert param_sizes([real[0].weight, real[1].weight]) == param_sizes([a.weight, b.weight])
    assert math.isclose(param_sizes([a.weight, a.bias])[1], 4 * 72)


def test_a_tiers_status_counts_a_data_tie_once() -> None:
    """The operator's status line summed every parameter object: a weight tied by .data, one tensor in memory,
    read twice (so did the size that decides whether a user model is trained beside itself)."""
    from splitfed.engine.tier import Tier
    from splitfed.engine.types import OptimConfig, SegmentLoad
    from splitfed.units import mib_text

    spec = _spec("data_tied")
    n = template.num_blocks(spec)
    t = Tier("cloud")
    t.load(SegmentLoad("run", "a", 0, spec, 0, n, "a", select(initial_state(spec, 0), 0, n), OptimConfig()))
    held = sum(_profile("data_tied").param_bytes)  # each storage once
    assert held < sum(p.numel() * p.element_size() for m in template.template(spec).modules for p in m.parameters())
    assert f", {mib_text(held)} of weights held;" in t.status(), t.status()
