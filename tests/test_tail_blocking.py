"""A block that lets no gradient through (``x.detach()``, argmax, a comparison cast to float, ``torch.no_grad``):
trained whole, the blocks before it get no gradient (``param.grad`` stays None, so the optimizer skips them:
no weight decay, no momentum, no Adam moments). Split, they must stay exactly as whole training leaves them.

Where the block lies on a server (non-U-shape, or U-shape between head and tail) the tiers send no gradient
down (None), and the split run equals the whole one bitwise. In a U-shape tail fed by the servers the device
gets no gradient of the tail's input: before, it failed on ``assert mid.grad is not None`` (and a tail whose
output needs no gradient at all on torch's backward). A zero gradient would step the servers' blocks (weight
decay, momentum), so it sends none: the servers release the step without a backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from splitfed.engine.link import InProcessLink
from splitfed.engine.rounds import Chain, RoundConfig, initial_state, inprocess_chain, run_round
from splitfed.engine.types import OptimConfig, StepKey, StepReply, block_of
from splitfed.engine.verify import reference_round
from splitfed.models.zoo import ModelSpec, resolve_spec

KINDS = ("detach", "argmax", "compare", "no_grad")
L = 8  # blocks of blocked(): seven layers and the blocking block
OPTIMS = (OptimConfig(lr=0.05, momentum=0.9, weight_decay=0.1), OptimConfig("adam", lr=0.01, weight_decay=0.1))


class _Block(nn.Module):
    """Passes its input on (as values) with no gradient to it."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "detach":
            return x.detach()
        if self.kind == "argmax":
            return F.one_hot(x.argmax(1), x.shape[1]).to(x.dtype)
        if self.kind == "compare":
            return (x > 0).to(x.dtype)
        with torch.no_grad():
            return torch.tanh(x)


def blocked(kind: str = "detach", at: int = 3, frozen: bool = False) -> nn.Module:
    """Linear, Tanh, Linear, Tanh, Linear, Tanh, Linear with the blocking block at index ``at`` (1..7; 7: after
    the last layer, so the loss needs no gradient); ``frozen``: every parameter before it frozen."""
    layers: list[nn.Module] = [nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                               nn.Linear(8, 3)]
    for m in layers[:at] if frozen else ():
        m.requires_grad_(False)
    layers.insert(at, _Block(kind))
    return nn.Sequential(*layers)


def _spec(kind: str, at: int, frozen: bool = False) -> ModelSpec:
    return resolve_spec("tests.test_tail_blocking:blocked", input_shape=(6,), num_classes=3, kind=kind, at=at,
                        frozen=frozen)


def _batches(seed: int, steps: int = 3, b: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, 6, generator=g), torch.randint(0, 3, (b,), generator=g)) for _ in range(steps)]


def _split_and_whole(spec: ModelSpec, cuts: tuple[int, ...], u_shape: bool, mode: str, optim: OptimConfig,
                     chain: Chain | None = None) -> tuple[dict, dict, dict]:
    """(start, split, whole): the global state before, after a real round over in-process tiers, and after the
    same round trained on whole models."""
    cfg = RoundConfig("blocking", 0, spec, mode, u_shape, optim, 0)
    start = initial_state(spec, 0)
    tiers = len(cuts) - u_shape
    chain = chain or inprocess_chain(tiers)
    split, _ = run_round(cfg, chain, start, {"c": cuts}, {"c": _batches(1)})
    whole = reference_round(cfg, start, {"c": cuts}, {"c": _batches(1)}, tiers + 1)
    return start, split, whole


def _assert_bitwise(start: dict, split: dict, whole: dict, at: int) -> None:
    """Split equals whole bitwise, and every block before the blocking one is as it started (no gradient:
    not a zero one, which weight decay would have moved)."""
    assert set(split) == set(whole)
    for k in split:
        assert torch.equal(split[k], whole[k]), k
        if block_of(k) < at:
            assert torch.equal(split[k], start[k]), k


class _Recording(InProcessLink):
    """The device's own link, noting the gradients the first tier sends down."""

    def __init__(self, link: InProcessLink) -> None:
        super().__init__(link.tier)
        self.down: list[torch.Tensor | None] = []

    def step(self, key: StepKey, activation: torch.Tensor, labels: torch.Tensor) -> StepReply:
        reply = super().step(key, activation, labels)
        self.down.append(reply.grad)
        return reply

    def backward(self, key: StepKey, grad: torch.Tensor | None) -> torch.Tensor | None:
        g = super().backward(key, grad)
        self.down.append(g)
        return g


@st.composite
def on_a_server(draw: st.DrawFn) -> tuple[tuple[int, ...], bool]:
    """Cuts that put block ``at`` (drawn by the caller) on a server, one or two server tiers, U-shape or not;
    the device's head holds at least block 0 (it trains)."""
    u_shape = draw(st.booleans())
    tiers = draw(st.integers(1, 2))
    k1 = draw(st.integers(1, 3))
    inner = sorted(draw(st.lists(st.integers(k1, 6), min_size=tiers - 1, max_size=tiers - 1)))
    end = draw(st.integers(max([k1, *inner]) + 1, 7)) if u_shape else L
    return (k1, *inner, end) if u_shape else (k1, *inner), u_shape


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), plan=on_a_server(), optim=st.sampled_from(OPTIMS),
       mode=st.sampled_from(["sl", "sflv1", "sflv2"]), data=st.data())
def test_a_blocking_block_on_a_server_trains_as_the_whole_model(kind: str, plan: tuple[tuple[int, ...], bool],
                                                                optim: OptimConfig, mode: str,
                                                                data: st.DataObject) -> None:
    cuts, u_shape = plan
    servers_end = cuts[-1] if u_shape else L
    at = data.draw(st.integers(cuts[0], min(servers_end - 1, 6)), label="at")
    chain = inprocess_chain(len(cuts) - u_shape)
    link = _Recording(chain.link)  # type: ignore[arg-type]
    start, split, whole = _split_and_whole(_spec(kind, at), cuts, u_shape, mode, optim, Chain(chain.tiers, link))
    _assert_bitwise(start, split, whole, at)
    assert link.down and all(g is None for g in link.down)  # the first tier sends none down: not a zero one


@pytest.mark.parametrize("optim", OPTIMS, ids=["sgd", "adam"])
def test_the_edge_sends_no_gradient_when_its_segment_detaches(optim: OptimConfig) -> None:
    """The case the hypothesis test above draws from, fast: edge [1, 3) detaches at block 2."""
    for u_shape, cuts in ((False, (1, 3)), (True, (1, 3, 5))):
        chain = inprocess_chain(2)
        link = _Recording(chain.link)  # type: ignore[arg-type]
        start, split, whole = _split_and_whole(_spec("detach", 2), cuts, u_shape, "sflv1", optim,
                                               Chain(chain.tiers, link))
        _assert_bitwise(start, split, whole, 2)
        assert link.down and all(g is None for g in link.down)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), at=st.integers(1, 7), optim=st.sampled_from(OPTIMS),
       mode=st.sampled_from(["sl", "sflv1", "sflv2"]), tiers=st.integers(1, 2), data=st.data())
def test_a_fed_tail_that_blocks_the_gradient_trains_as_the_whole_model(kind: str, at: int, optim: OptimConfig,
                                                                         mode: str, tiers: int,
                                                                         data: st.DataObject) -> None:
    """Blocks before the tail train: the device sends no gradient up (a zero one would step them: weight decay,
    momentum, Adam's moments), and the servers release the step without a backward. Before, the device failed on
    ``assert mid.grad is not None`` (and, with the block after the last layer, on torch's own backward)."""
    u = data.draw(st.integers(1, at), label="u")
    ks = sorted(data.draw(st.lists(st.integers(0, u - 1), min_size=tiers, max_size=tiers), label="ks"))
    start, split, whole = _split_and_whole(_spec(kind, at), (*ks, u), True, mode, optim)
    _assert_bitwise(start, split, whole, at)


@pytest.mark.parametrize("optim", OPTIMS, ids=["sgd", "adam"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_blocked_tail_after_a_frozen_front_trains_as_the_whole_model(kind: str, optim: OptimConfig) -> None:
    """Nothing before the tail trains: the backward call only releases what the servers hold, and the round
    equals whole training bitwise."""
    for cuts in ((0, 2), (1, 3), (1, 2, 4)):
        start, split, whole = _split_and_whole(_spec(kind, 4, frozen=True), cuts, True, "sflv1", optim)
        _assert_bitwise(start, split, whole, 4)


@pytest.mark.parametrize("optim", OPTIMS, ids=["sgd", "adam"])
def test_a_blocked_tail_trains_as_the_whole_model_over_grpc(optim: OptimConfig) -> None:
    """The backward with no gradient crosses a real tier (a StepStream frame carrying no tensor)."""
    from splitfed.transport.chain import close_chain, grpc_chain
    from splitfed.transport.server import serve_tier

    with serve_tier("cloud", insecure=True, max_workers=8, allowed_models=["tests.test_tail_blocking:blocked"]) as srv:
        chain = grpc_chain([srv.address])
        try:
            start, split, whole = _split_and_whole(_spec("detach", 4), (1, 4), True, "sflv1", optim, chain)
        finally:
            close_chain(chain)
    _assert_bitwise(start, split, whole, 4)


@pytest.mark.parametrize("kind", KINDS)
def test_what_is_priced_around_a_blocking_block_is_what_training_does(kind: str) -> None:
    """Blocks before one that lets no gradient through never run a backward and never train: the profile says so
    (no backward FLOPs or seconds, no trainable bytes, weights alone in memory), no tier sends a gradient over a
    cut before it (the cloud at cut 4, just after it, sent one the edge could not use), and a U-shape tail that
    holds it sends none up. For every cut vector, with and without U-shape, the bytes priced are the bytes each
    link of a real 3-tier in-process chain counts, and the round equals whole training."""
    from splitfed.cost import Scenario, client_cost, cut_options
    from splitfed.profile import Client, LinkProfile, TierProfile
    from splitfed.profile.profiler import fixed_memory, profile_model

    spec, B = _spec(kind, 3), 4
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    assert prof.grad_reach == (False,) * 4 + (True,) * 5
    assert prof.train_bytes[:4] == (0.0,) * 4 and prof.bwd_flops[:4] == (0.0,) * 4 and prof.bwd_s[:3] == (0.0,) * 3
    assert prof.train_bytes[5] > 0 and prof.bwd_flops[5] > 0  # the Linear after the Tanh after it
    assert prof.fixed_bytes[0] == fixed_memory(prof.param_bytes[0], 0, prof.optimizer_slots) == prof.param_bytes[0]
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (B, 2)]
    dev = Client("c", "c", TierProfile(1e9, 1e12), LinkProfile(1e6, 1e6, 0.01), samples=B + 2)
    servers = (TierProfile(1e10, 1e12), TierProfile(1e11, 1e12))
    start = initial_state(spec, 0)
    for u in (False, True):
        for cuts in (tuple(map(int, c)) for c in cut_options(L, 3, u_shape=u)):
            chain = inprocess_chain(2)
            cfg = RoundConfig("r", 1, spec, "sflv1", u_shape=u)
            split, res = run_round(cfg, chain, start, {"c": cuts}, {"c": batches})
            edge_link = chain.tiers[0].next
            c = client_cost(Scenario(prof, (dev,), servers, (LinkProfile(1e7, 1e7, 0.005),), batch=B, u_shape=u),
                            dev, cuts)
            assert c.up_bytes == (res[0].bytes_up, edge_link.bytes_up), (u, cuts)
            assert c.down_bytes == (res[0].bytes_down, edge_link.bytes_down), (u, cuts)
            if cuts[:2] == (1, 4) and not u:
                assert edge_link.bytes_down == 0  # the cloud, past the argmax, sends the edge nothing
            whole = reference_round(cfg, start, {"c": cuts}, {"c": batches}, 3)
            _assert_bitwise(start, split, whole, 3)
