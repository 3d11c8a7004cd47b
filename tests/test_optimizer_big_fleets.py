"""sflv1 fleets the servers cannot hold whatever the cuts are refused before any MILP (a sound bound: never a
fleet that fits), and the refusal when the time limit runs out names the policies that need no MILP."""

from __future__ import annotations

import math
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario
from splitfed.errors import ConfigError
from splitfed.optimizer import classes as opt_classes
from splitfed.optimizer import exhaustive, solve
from splitfed.optimizer import solver as opt_solver
from splitfed.profile import TierProfile
from tests.test_optimizer import PROF, _client, _scenario, instances


def _no_milp(*a, **k):  # noqa: ANN002, ANN003, ANN202
    raise AssertionError("a MILP ran for a fleet the least shares already refuse")


def _least(sc: Scenario) -> tuple[np.ndarray, float]:
    """Per server tier, and for all of them together, the sum over clients of their least share there."""
    classes = opt_classes.price_classes(replace(sc, servers=tuple(replace(s, memory=math.inf) for s in sc.servers)))
    n = np.array([len(c.members) for c in classes], dtype=float)
    per = n @ np.array([c.mem.min(axis=0) for c in classes])
    return per, float(n @ np.array([c.mem.sum(axis=1).min() for c in classes]))


def test_tiers_that_each_could_hold_their_share_but_not_together_are_refused_at_once() -> None:
    """20 clients that keep at most 1.3 MB each: either server alone could take every client's least share
    there (7.3 MiB on the edge, 0 on the cloud), both together cannot (136 MiB). HiGHS took 13-34 s to say so
    for 1,000 distinct clients; now no MILP runs, and the refusal says which tiers and by how much."""
    sc = _scenario([_client(f"c{i}", memory=1.3e6) for i in range(20)], edge_mem=2e7, cloud_mem=2e7)
    with mock.patch.object(opt_solver, "milp", _no_milp), pytest.raises(ConfigError) as e:
        solve(sc)
    assert str(e.value) == (
        "no assignment fits: the server tiers (edge 19.1 MiB, cloud 19.1 MiB) cannot hold the segments of all 20 "
        "clients of synthetic at batch 32, whatever the cuts; edge and cloud together need at least 136 MiB for "
        "the 20 clients' least shares, have 38.1 MiB")


def test_one_tier_short_is_named_alone() -> None:
    """One server tier: it alone is named, in the singular; and a cloud of memory 0 beside an unbounded edge
    bounds nothing (every client could leave the cloud empty): such a fleet fits."""
    clients = tuple(_client(f"c{i}", memory=1.3e6) for i in range(3))
    sc = Scenario(PROF, clients, (TierProfile(2e12, 1e6),), (), batch=32)
    with mock.patch.object(opt_solver, "milp", _no_milp), pytest.raises(ConfigError) as e:
        solve(sc)
    assert str(e.value) == (
        "no assignment fits: the server tiers (edge 0.954 MiB) cannot hold the segments of all 3 clients of "
        "synthetic at batch 32, whatever the cuts; edge needs at least 20.4 MiB for the 3 clients' least shares, "
        "has 0.954 MiB")
    no_cloud = _scenario(clients, edge_mem=math.inf, cloud_mem=0.0)
    assert opt_classes.least_shares(no_cloud, opt_classes.price_classes(no_cloud)) is None
    assert solve(no_cloud).cost.feasible
    one = _scenario(clients[:1], edge_mem=1e3, cloud_mem=1e3)
    with mock.patch.object(opt_solver, "milp", _no_milp), pytest.raises(ConfigError) as e:
        solve(one)
    assert str(e.value).endswith(", whatever the cuts; edge needs at least 0.366 MiB for the 1 client's least "
                                 "share, has 1000 bytes")


def _times(x: float, f: float) -> float:
    return 0.0 if x == 0 or f == 0 else x * f  # inf * 0 is nan: a tier of memory 0 stays 0


@st.composite
def tight(draw: st.DrawFn) -> Scenario:
    """A small random sflv1 fleet whose server memories sit around the least shares' sums (each tier's, and
    the two together): just under, on, just over, far from them."""
    sc = draw(instances("sflv1", limit=3_000))
    try:
        per, both = _least(sc)
    except ConfigError:  # a device no cut fits: refused before any of this
        return sc
    near = st.sampled_from([0.0, 0.5, 0.9, 1.0 - 1e-12, 1.0, 1.0 + 1e-12, 1.1, 2.0, math.inf])
    caps = [_times(p, draw(near)) if p > 0 else draw(st.sampled_from([0.0, 1e5, math.inf])) for p in per]
    if draw(st.booleans()):  # the two together binding: split their sum
        share = draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]))
        total = _times(both, draw(near))
        caps = [_times(total, share), _times(total, 1 - share)]
    return replace(sc, servers=tuple(replace(s, memory=c) for s, c in zip(sc.servers, caps, strict=True)))


@settings(max_examples=120, deadline=None)
@given(tight())
def test_the_bound_never_refuses_a_fleet_that_fits(sc: Scenario) -> None:
    """Whenever the least shares refuse, brute force finds no assignment that fits either, and solve refuses
    with the bound's words without a MILP; where they do not, solve and brute force agree as before."""
    try:
        refusal = opt_classes.least_shares(sc, opt_classes.price_classes(sc))
    except ConfigError:
        event("a device no cut fits")
        return
    try:
        truth: object = exhaustive(sc)
    except ConfigError as e:
        truth = e
    event(f"bound refuses: {refusal is not None}; brute force: {'refuses' if isinstance(truth, ConfigError) else 'fits'}")
    if refusal is None:
        return
    assert isinstance(truth, ConfigError) and str(truth).startswith("no assignment fits: "), truth
    with mock.patch.object(opt_solver, "milp", _no_milp), pytest.raises(ConfigError) as e:
        solve(sc)
    assert str(e.value) == str(refusal)
    assert str(e.value).startswith(str(truth) + "; ")  # brute force's refusal, with the tiers that tell it


def test_the_bound_fires_on_a_seeded_sample_and_is_sound_there() -> None:
    """Not left to hypothesis's luck: of 40 seeded fleets around their bounds, some are refused by it, and
    brute force finds none of those fits."""
    rng = np.random.default_rng(58)
    refused = 0
    for _ in range(40):
        n = int(rng.integers(1, 5))
        clients = [_client(f"c{i}", memory=float(rng.choice([1.3e6, 3e6, 6e6, 2**30])), up=float(rng.integers(1, 9)) * 1e6)
                   for i in range(n)]
        sc = _scenario(clients, edge_mem=math.inf, cloud_mem=math.inf)
        _, both = _least(sc)
        total = both * float(rng.choice([0.5, 0.99, 1.0, 1.01, 2.0]))
        share = float(rng.choice([0.2, 0.5, 0.8]))
        sc = _scenario(clients, edge_mem=total * share, cloud_mem=total * (1 - share))
        if opt_classes.least_shares(sc, opt_classes.price_classes(sc)) is None:
            continue
        refused += 1
        with pytest.raises(ConfigError, match="^no assignment fits: "):
            exhaustive(sc)
    assert refused >= 5, refused


def test_sl_and_sflv2_are_left_to_their_own_checks() -> None:
    """In turn a tier holds one client's segment at a time: a sum over clients bounds nothing there. Servers
    that cannot hold 20 sflv1 replicas serve the same fleet in sl and sflv2."""
    sc = _scenario([_client(f"c{i}", memory=1.3e6) for i in range(20)], edge_mem=2e7, cloud_mem=2e7)
    assert opt_classes.least_shares(sc, opt_classes.price_classes(sc)) is not None
    for mode in ("sl", "sflv2"):
        turns = replace(sc, mode=mode)
        assert opt_classes.least_shares(turns, opt_classes.price_classes(turns)) is None
        assert solve(turns).cost.feasible


def test_a_time_limit_spent_before_any_answer_names_the_policies_that_need_no_milp() -> None:
    """The refusal asked only for more time; --greedy and --best-static price a plan at once."""
    sc = _scenario([_client(f"c{i}", up=1e5 * (1 + i)) for i in range(8)])
    with pytest.raises(ConfigError) as e:
        solve(sc, time_limit=1e-9)
    assert str(e.value) == ("the time limit ran out before the MILP found any assignment for the 8 clients of "
                            "synthetic: raise it (--time-limit), or price a policy that needs no MILP: --greedy, "
                            "--best-static")
