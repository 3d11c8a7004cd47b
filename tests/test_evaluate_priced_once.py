"""``evaluate`` prices each (client kind, cut vector) pair once per scenario (``Scenario._priced``) and gives, bit
for bit, what it gave when it priced every pair of every plan anew: a brute force over thousands of plans (the
optimizer's tests, ``splitfed optimize``'s local search) prices the same few pairs in each."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, evaluate, model
from splitfed.cost.model import (
    Assignment,
    ClientCost,
    Cuts,
    RoundCost,
    _row,
    client_key,
    option_table,
    server_memory,
)
from splitfed.errors import ConfigError, CutError
from splitfed.units import mib_pair
from tests.test_optimizer import instances


def _reference(sc: Scenario, assignment: Assignment, extra_s: Mapping[str, float] | None = None) -> RoundCost:
    """``evaluate`` as it was before the pairs were kept (every group priced anew on every call)."""
    missing = [c.name for c in sc.clients if c.name not in assignment]
    if missing:
        raise ConfigError(f"assignment has no cuts for client(s) {', '.join(missing[:5])}"
                          f"{' ...' if len(missing) > 5 else ''}")
    extra = extra_s or {}
    groups: dict[tuple, list[int]] = {}
    cuts_of: list[Cuts] = []
    for i, c in enumerate(sc.clients):
        try:
            cuts = sc.check_cuts(assignment[c.name])
        except CutError as e:
            raise CutError(f"client {c.name}: {e}") from None
        cuts_of.append(cuts)
        groups.setdefault((client_key(c), cuts), []).append(i)
    costs: list[ClientCost | None] = [None] * len(sc.clients)
    loads: list[np.ndarray | None] = [None] * len(sc.clients)
    for (_, cuts), idx in groups.items():
        t = option_table(sc, sc.clients[idx[0]], np.asarray([cuts]))
        for i in idx:
            costs[i] = _row(sc, sc.clients[i], cuts, t, 0)
            loads[i] = t.shared_load[0]
    cc = tuple(c for c in costs if c is not None)
    load = np.array(loads, dtype=float).reshape(len(cc), -1)
    shared_s = {name: math.fsum(load[:, r]) / sc.capacities[r] for r, name in enumerate(sc.resource_names)}
    if sc.in_turn:
        shared_s[sc.resource_names[-1]] = math.fsum([*load[:, -1], *(extra.get(c.name, 0.0) for c in cc)])
    times = [c.round_s + extra.get(c.name, 0.0) for c in cc]
    worst = max(range(len(cc)), key=lambda i: times[i])
    makespan, bottleneck = times[worst], f"client {cc[worst].name}"
    for name, s in shared_s.items():
        if s > makespan:
            makespan, bottleneck = s, name
    names = sc.tier_names
    used = server_memory(sc, np.asarray(cuts_of), np.array([c.memory[1:] for c in cc]),
                         np.array([c.act_memory[1:] for c in cc]))
    shared_mem = {names[t]: float(used[t - 1]) for t in range(1, sc.tiers)}
    violations = [f"{c.name}: device memory {' > '.join(mib_pair(c.memory[0], sc.clients[i].device.memory))}"
                  for i, c in enumerate(cc) if not c.fits_device]
    violations += [f"{names[t]} memory {' > '.join(mib_pair(shared_mem[names[t]], cap))}"
                   for t, cap in enumerate(sc.memory_caps, 1) if shared_mem[names[t]] > cap]
    return RoundCost(cc, makespan, bottleneck, shared_s, shared_mem, tuple(violations), sc.mode)


@st.composite
def _plans(draw: st.DrawFn) -> tuple[Scenario, list[tuple[dict, dict]]]:
    sc = draw(st.sampled_from(["sflv1", "sl", "sflv2"]).flatmap(lambda mode: instances(mode, limit=600)))
    cuts = [tuple(int(x) for x in o) for o in sc.options.tolist()]
    plans = []
    for _ in range(draw(st.integers(1, 6))):
        plan = {c.name: draw(st.sampled_from(cuts)) for c in sc.clients}
        extra = {c.name: draw(st.integers(0, 50)) / 10 for c in sc.clients if draw(st.booleans())}
        plans.append((plan, extra))
    return sc, plans


@settings(max_examples=100)
@given(_plans(), st.integers(1, 8))
def test_evaluate_is_bit_for_bit_what_pricing_every_plan_anew_gave(case: tuple[Scenario, list], most: int) -> None:
    """Plan after plan on one scenario (pairs priced by an earlier plan reused, identical clients of other names
    among them, moves' extra seconds or none, the kept pairs let go of when ``most`` of them fill it): every
    field of every answer equals the old evaluate's on a scenario of its own, to the last bit."""
    sc, plans = case
    fresh = sc.with_clients(sc.clients)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model, "_PRICED_MAX", most)
        for plan, extra in [*plans, *plans]:  # again: every pair now kept (or let go of and priced again)
            got, want = evaluate(sc, plan, extra or None), _reference(fresh, plan, extra or None)
            assert got == want
            assert repr(got) == repr(want)  # -0.0 and 0.0 too
            assert len(sc._priced) <= most


def test_a_scenario_prices_each_kind_and_cut_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan of a 3-client, 2-kind fleet (the brute force's loop): one option table per (kind, cuts) pair
    met, not one per pair per plan; a scenario of the same fleet made anew prices them again (its own)."""
    from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
    from tests.plan_fixtures import every_plan

    prof = ModelProfile.synthetic([20e6, 1e6], [48e3, 40], [8e3, 20e3], input_bytes=12e3)
    kinds = [(TierProfile(1e9, 1e9), LinkProfile(1e6, 1e6, 0.01)), (TierProfile(3e9, 1e9), LinkProfile(2e6, 1e6, 0))]
    clients = tuple(Client(f"c{i}", f"k{i % 2}", *kinds[i % 2], 50) for i in range(3))
    sc = Scenario(prof, clients, (TierProfile(1e11, 1e10), TierProfile(1e12, 1e11)), (LinkProfile(1e8, 1e8, 0),))
    calls: list[int] = []
    real = model.option_table
    monkeypatch.setattr(model, "option_table", lambda *a, **k: calls.append(1) or real(*a, **k))
    plans = every_plan(sc)
    m = len(sc.options)
    assert len(plans) == m**3 and len(calls) == 2 * m
    assert every_plan(sc) == plans and len(calls) == 2 * m
    every_plan(sc.with_clients(clients))
    assert len(calls) == 4 * m
