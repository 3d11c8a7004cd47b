"""The first law: cuts are invisible to the math, for every zoo model, variant, chain length."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.engine import template
from splitfed.engine.link import InProcessLink
from splitfed.engine.rounds import Chain, inprocess_chain
from splitfed.engine.verify import TOLERANCE, verify
from splitfed.models.zoo import ZOO, resolve_spec

SMALL = {"vgg11": {"width": 0.125}, "resnet18": {"width": 8}}


def spec_of(name: str):
    return resolve_spec(name, **SMALL.get(name, {}))


@st.composite
def cut_plans(draw: st.DrawFn, n_blocks: int) -> tuple[int, bool, list[tuple[int, ...]]]:
    tiers = draw(st.integers(2, 4))
    u = draw(st.booleans())
    clients = draw(st.integers(1, 2))
    width = tiers - 1 + (1 if u else 0)
    plans = [tuple(sorted(draw(st.lists(st.integers(0, n_blocks), min_size=width, max_size=width))))
             for _ in range(clients)]
    return tiers, u, plans


@pytest.mark.parametrize("mode", ["sl", "sflv1", "sflv2"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_split_equals_whole_for_random_cuts(name: str, mode: str) -> None:
    spec = spec_of(name)
    n = template.num_blocks(spec)

    @settings(max_examples=4)
    @given(plan=cut_plans(n))
    def check(plan: tuple[int, bool, list[tuple[int, ...]]]) -> None:
        tiers, u, cuts = plan
        r = verify(spec, cuts, mode=mode, u_shape=u, steps=2, batch=3, rounds=1)
        assert r.tiers == tiers
        assert r.ok, f"{name} {mode} cuts={cuts} u={u}: diff {r.max_abs_diff}"

    check()


@pytest.mark.parametrize("mode", ["sl", "sflv1", "sflv2"])
def test_chains_that_end_early_equal_whole(mode: str) -> None:
    """Cuts that leave tiers empty: the chain ends at the last tier holding a block (that tier takes
    the loss), and a client holding every block trains alone; the math must not notice."""
    spec = spec_of("cnn")
    n = template.num_blocks(spec)
    for u, cuts in ((False, [(n, n), (2, n), (0, 0)]), (False, [(0, n), (n, n)]),
                    (True, [(3, 3, 3), (1, n - 1, n - 1)]), (True, [(0, n - 1, n - 1), (2, 2, n - 1)])):
        r = verify(spec, cuts, mode=mode, u_shape=u, steps=2, batch=3, rounds=2)
        assert r.ok, f"{mode} cuts={cuts} u={u}: diff {r.max_abs_diff}"


def test_heterogeneous_cuts_aggregate_like_fedavg_of_whole_model() -> None:
    spec = spec_of("cnn")
    r = verify(spec, [(2, 6), (5, 6)], mode="sflv1", steps=3, batch=4, rounds=2)
    assert r.ok and r.max_abs_diff <= TOLERANCE


class _Nudge(InProcessLink):
    """A faulty transport: shifts every activation by 1e-3."""

    def step(self, key, activation, labels):  # type: ignore[no-untyped-def]
        return super().step(key, activation + 1e-3, labels)


def test_verify_catches_a_transport_that_changes_numbers() -> None:
    spec = spec_of("cnn")
    good = inprocess_chain(2)
    bad = Chain(good.tiers, _Nudge(good.link.tier))  # type: ignore[attr-defined]
    r = verify(spec, [(2, 5)], chain=bad, steps=2)
    assert not r.ok and r.max_abs_diff > 1e-4


def test_verify_catches_a_tier_that_trains_differently() -> None:
    spec = spec_of("mlp")
    chain = inprocess_chain(1)
    tier = chain.tiers[0]
    orig = tier.load

    def load(s):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        orig(replace(s, optim=replace(s.optim, lr=s.optim.lr * 1.01)))

    tier.load = load  # type: ignore[method-assign]
    r = verify(spec, [(2,)], chain=chain, steps=2)
    assert not r.ok


def test_dropout_masks_follow_the_step_not_the_tier() -> None:
    """Same step key, same masks: a model with dropout trains identically however it is split."""
    spec = spec_of("mlp")
    a = verify(spec, [(1,)], mode="sl", steps=3, rounds=2)
    b = verify(spec, [(4,)], mode="sl", steps=3, rounds=2)
    assert a.ok and b.ok
    torch.manual_seed(0)
