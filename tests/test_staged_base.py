"""sflv1's staged base, priced as the tiers hold it.

Before the clients of an sflv1 round load, the coordinator sends each server tier, once, the global model's
blocks that two or more of them hold there, and their loads copy those blocks from it; it is released once they
have loaded. So while they load, a tier holds every client's fixed part (weights, gradients, optimizer slots)
and the base. The cost model prices that (:func:`splitfed.cost.model.staged_memory`), and the optimizer keeps
it under each tier's memory: the truth here is a real round's tiers, and brute force over every assignment.
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, evaluate, staged_memory
from splitfed.engine.rounds import (
    RoundConfig,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig, SegmentLoad
from splitfed.models.zoo import resolve_spec
from splitfed.optimizer import best_static, exhaustive, solve
from splitfed.profile import Client, LinkProfile, TierProfile
from splitfed.profile.profiler import ModelProfile, profile_model

B = 4
SPEC = resolve_spec("cnn", num_classes=10)
EDGE, CLOUD = TierProfile(1e10, 1e15), TierProfile(1e11, 1e15)
LINK, EDGE_LINK = LinkProfile(1e6, 1e6, 0.01), LinkProfile(1e7, 1e7, 0.005)


@cache
def _profile() -> ModelProfile:
    return profile_model(SPEC, batch=B, reps=1, use_cache=False)


def _scenario(n: int, servers: tuple[TierProfile, ...] = (EDGE, CLOUD), **kw: object) -> Scenario:
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1e9 * (1 + i), 1e15), LINK, samples=2 * B)
                    for i in range(n))
    return Scenario(_profile(), clients, servers, (EDGE_LINK,), batch=B, **kw)  # type: ignore[arg-type]


class _Peak:
    """A tier whose segments' bytes (:attr:`Tier.held`) are noted after each load: the most is reached when
    the last client of an sflv1 round has loaded, before the base is released."""

    def __init__(self, tier: Tier) -> None:
        self.tier, self.most = tier, 0

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.tier, name)

    def load(self, spec: SegmentLoad) -> None:
        self.tier.load(spec)
        self.most = max(self.most, self.tier.held)


def _batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, *SPEC.input_shape, generator=g), torch.randint(0, 10, (B,), generator=g))]


OPTIONS = [tuple(int(x) for x in o) for o in _scenario(1).options]
U_OPTIONS = [tuple(int(x) for x in o) for o in _scenario(1, u_shape=True).options]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans().flatmap(lambda u: st.tuples(st.just(u), st.lists(st.sampled_from(U_OPTIONS if u else OPTIONS),
                                                                      min_size=1, max_size=4))))
def test_a_tier_holds_each_clients_fixed_part_and_the_staged_base_while_they_load(
        drawn: tuple[bool, list[tuple[int, ...]]]) -> None:
    u_shape, cuts = drawn
    chain = inprocess_chain(2)
    tiers = [_Peak(t) for t in chain.tiers]
    assignment = {f"c{i}": c for i, c in enumerate(cuts)}
    # momentum: one optimizer slot per trained parameter, as the profile prices it (``optimizer_slots``)
    rnd = SplitRound(RoundConfig("staged", 1, SPEC, u_shape=u_shape, optim=OptimConfig("sgd", momentum=0.9)), tiers,
                     initial_state(SPEC, 0), assignment)
    drive(rnd, local_trainer(chain, {c: _batches(i) for i, c in enumerate(assignment)}))
    assert not rnd.failed
    sc = _scenario(len(cuts), u_shape=u_shape)
    cost = evaluate(sc, assignment)
    fixed = np.sum([np.subtract(c.memory, c.act_memory)[1:] for c in cost.clients], axis=0)
    staged = staged_memory(sc, np.asarray(cuts))
    assert [t.most for t in tiers] == pytest.approx(fixed + staged, abs=0.5)
    # and the model's memory is that, or the clients' activations beside their fixed parts if more
    act = np.sum([c.act_memory[1:] for c in cost.clients], axis=0)
    assert list(cost.shared_memory.values()) == pytest.approx(fixed + np.maximum(staged, act), rel=1e-12)


def test_one_client_or_clients_far_apart_stage_nothing() -> None:
    sc = _scenario(2)
    L = sc.profile.n_blocks
    assert staged_memory(sc, np.array([[1, 3]])).tolist() == [0.0, 0.0]
    # c0's edge holds block 0 only (the cloud the rest); c1's edge holds the rest: no block is held twice
    # on the edge, and on the cloud c1 holds nothing
    assert staged_memory(sc, np.array([[0, 1], [1, L]]))[0] == 0.0
    w = np.asarray(sc.profile.state_bytes)
    assert staged_memory(sc, np.array([[0, 1], [0, 3]])).tolist() == [float(w[:1].sum()), float(w[3:].sum())]


def _edge_only(n: int, memory: float = 1e15) -> Scenario:
    """Clients and one edge, at batch 1: the clients' activations there weigh less than the model's weights,
    so the base beside their fixed parts can be what fills the edge."""
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1e9 * (1 + i), 1e15), LINK, samples=2)
                    for i in range(n))
    return Scenario(_profile(), clients, (TierProfile(1e10, memory),), batch=1)


def _tight(n: int, scale: float) -> Scenario:
    """An edge of ``scale`` times what every client's whole model (cuts 0) takes there, base included."""
    sc = _edge_only(n)
    return _edge_only(n, float(evaluate(sc, {c.name: (0,) for c in sc.clients}).shared_memory["edge"]) * scale)


@pytest.mark.parametrize("scale", [0.5, 0.8, 0.9, 0.95, 1.0, 1.2])
def test_the_optimizer_equals_brute_force_where_the_staged_base_binds(scale: float) -> None:
    sc = _tight(3, scale)
    try:
        want = exhaustive(sc)
    except Exception as e:  # noqa: BLE001  # nothing fits: the optimizer must say so too
        with pytest.raises(type(e)):
            solve(sc, gap=0)
        return
    for method in ("bisect", "direct"):
        got = solve(sc, gap=0, method=method)
        assert got.cost.feasible
        assert got.makespan_s == pytest.approx(want.makespan_s, rel=1e-9)


def test_a_fleet_the_base_would_overflow_gets_other_cuts() -> None:
    """The edge holds the three clients' fixed parts and activations at the fastest cuts, but not the base
    beside their fixed parts: the optimizer's answer fits (the base counted), and brute force agrees."""
    for scale in np.linspace(0.5, 1.0, 51):
        sc = _tight(3, float(scale))
        try:
            want = exhaustive(sc)
        except Exception:  # noqa: BLE001, S112
            continue
        fastest = exhaustive(_edge_only(3)).cost  # an edge without bounds
        if evaluate(sc, fastest.assignment()).feasible:
            continue
        without = np.sum([c.memory[1] for c in fastest.clients])  # the edge, base left out
        if without > sc.servers[0].memory:
            continue
        got = solve(sc, gap=0)
        assert got.cost.feasible and got.makespan_s == pytest.approx(want.makespan_s, rel=1e-9)
        assert got.makespan_s > fastest.makespan_s
        return
    pytest.fail("no capacity in the sweep makes the base alone bind")


def test_best_static_counts_the_base() -> None:
    sc = _tight(3, 0.9)
    s = best_static(sc)
    assert s.cost.feasible
    every = [tuple(int(x) for x in o) for o in sc.options]
    fits = [o for o in every if evaluate(sc, {c.name: o for c in sc.clients}).feasible]
    best = min(evaluate(sc, {c.name: o for c in sc.clients}).makespan_s for o in fits)
    assert s.makespan_s == pytest.approx(best, rel=1e-12)


def test_brute_force_prices_the_base_per_assignment() -> None:
    sc = _scenario(3)
    for cuts in itertools.islice(itertools.product(OPTIONS, repeat=3), 0, None, 97):
        cost = evaluate(sc, {f"c{i}": c for i, c in enumerate(cuts)})
        fixed = np.sum([np.subtract(c.memory, c.act_memory)[1:] for c in cost.clients], axis=0)
        act = np.sum([c.act_memory[1:] for c in cost.clients], axis=0)
        assert list(cost.shared_memory.values()) == pytest.approx(
            fixed + np.maximum(staged_memory(sc, np.asarray(cuts)), act), rel=1e-12)
