"""The optimizer's refusals say what is wrong, and it does not refuse what fits: beliefs that price every plan
at infinite time (not a memory refusal), a server tier of no memory (not NaN rows), an assignment a hair over a
tier's memory (not "numerical trouble")."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, evaluate
from splitfed.errors import ConfigError
from splitfed.optimizer import exhaustive, solve
from splitfed.optimizer.adapt import Adapter
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from tests.test_optimizer import instances

PROF = ModelProfile.synthetic([1e6, 2e6, 3e6], [1e3, 2e3, 1e3], [1e4, 2e4, 1e4], input_bytes=1e3)
ROOM = 1e12
METHODS = {"sflv1": ("bisect", "direct"), "sl": ("sequential", "bisect", "direct"),
           "sflv2": ("sequential", "bisect", "direct")}
CASES = [(mode, method) for mode, ms in METHODS.items() for method in ms]


def _fleet(mode: str, *, link: float = 1e6, edge_flops: float = 1e10, edge_mem: float = ROOM,
           cloud_mem: float = ROOM, device_mem: float = ROOM, u_shape: bool = False) -> Scenario:
    """Three clients on edge and cloud; ``link`` is the first client's link."""
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1e9, device_mem),
                           LinkProfile(link if i == 0 else 1e6, 1e6, 0.01), 4) for i in range(3))
    servers = (TierProfile(edge_flops, edge_mem), TierProfile(1e11, cloud_mem))
    return Scenario(PROF, clients, servers, (LinkProfile(1e6, 1e6, 0.005),), batch=2, u_shape=u_shape, mode=mode)


def _refusal(sc: Scenario, method: str) -> str:
    with pytest.raises(ConfigError) as e:
        solve(sc, gap=0, method=method, time_limit=None)
    return str(e.value)


# ---------------------------------------------------------------- every plan priced at infinite time


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the cost model overflows on absurd beliefs
@pytest.mark.parametrize("u_shape", [False, True])
@pytest.mark.parametrize("mode, method", CASES)
def test_a_client_priced_infinite_at_every_cut_is_named_not_blamed_on_memory(mode: str, method: str,
                                                                             u_shape: bool) -> None:
    """A link believed at 1e-308 B/s: every cut of that client takes forever, and memory is plentiful. The
    refusal said the servers "cannot hold the segments ... whatever the cuts" (NaN rows: inf * a scale of 0);
    sl and sflv2 returned a plan of infinite makespan."""
    sc = _fleet(mode, link=1e-308, u_shape=u_shape)
    plan = {c.name: tuple(int(x) for x in sc.options[-1]) for c in sc.clients}
    assert evaluate(sc, plan).feasible and evaluate(sc, plan).makespan_s == math.inf
    msg = _refusal(sc, method)
    assert msg.startswith("no assignment ends: every assignment of the 3 clients of synthetic at batch 2 that fits ")
    assert msg.endswith("takes infinitely long as priced (every cut of client(s) 'c0' is priced infinite)")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mode, method", CASES)
def test_the_only_plans_that_fit_memory_being_infinite_is_said_so(mode: str, method: str) -> None:
    """The edge believed at 1e-308 FLOP/s, the cloud with 1 byte and devices that cannot keep the model: what
    fits memory puts blocks on the edge and takes forever; the finite plans (on the cloud) do not fit."""
    sc = _fleet(mode, edge_flops=1e-308, cloud_mem=1.0, device_mem=5e4)
    on_edge = evaluate(sc, {c.name: (1, 3) for c in sc.clients})
    assert on_edge.feasible and on_edge.makespan_s == math.inf
    msg = _refusal(sc, method)
    assert msg.startswith("no assignment ends: ") and "(edge 953,674 MiB, cloud 1 bytes)" in msg
    assert "takes infinitely long as priced (" in msg and "cannot hold" not in msg


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mode", ["sflv1", "sl"])
def test_memory_that_no_plan_fits_is_still_refused_as_memory_when_prices_are_infinite(mode: str) -> None:
    """The new refusal is only for plans that fit: with the servers full whatever the cuts, memory is named."""
    sc = _fleet(mode, link=1e-308, edge_mem=1.0, cloud_mem=1.0, device_mem=5e4)
    assert _refusal(sc, "auto").startswith("no assignment fits: the server tiers (edge 1 bytes, cloud 1 bytes)")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_adapter_keeps_its_cuts_and_says_why_when_every_plan_is_infinite() -> None:
    sc = _fleet("sflv1")
    adapter = Adapter(sc, rounds=3, time_limit=None)
    before = dict(adapter.assignment)
    adapter.belief = _fleet("sflv1", link=1e-308)
    d = adapter.observe(1, {})
    assert not d.moved and adapter.assignment == before
    assert d.reason.startswith("no plan: no assignment ends: ") and "'c0'" in d.reason


# ---------------------------------------------------------------- a server tier of no memory


@pytest.mark.parametrize("mode, method", CASES)
@pytest.mark.parametrize("tier", ["edge", "cloud"])
def test_a_tier_of_no_memory_takes_nothing_and_the_rest_is_optimal(mode: str, method: str, tier: str) -> None:
    """Memory rows were divided by the tier's 0 bytes (NaN, even for an option putting nothing there):
    "no assignment fits" although keeping that tier empty fits."""
    sc = _fleet(mode, **{f"{tier}_mem": 0.0})  # type: ignore[arg-type]
    got = solve(sc, gap=0, method=method, time_limit=None)
    assert got.cost.feasible and got.cost.shared_memory[tier] == 0.0
    assert got.makespan_s == pytest.approx(exhaustive(sc).makespan_s, rel=1e-9)


@pytest.mark.parametrize("mode, method", CASES)
def test_tiers_of_no_memory_still_refuse_a_device_that_cannot_keep_the_model(mode: str, method: str) -> None:
    sc = _fleet(mode, edge_mem=0.0, cloud_mem=0.0, device_mem=5e4)
    assert _refusal(sc, method).startswith("no assignment fits: the server tiers (edge 0 bytes, cloud 0 bytes)")
    with pytest.raises(ConfigError, match="^no assignment fits"):
        exhaustive(sc)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["sflv1", "sl", "sflv2"]).flatmap(instances), st.sampled_from([0, 1]))
def test_solve_equals_brute_force_with_a_tier_of_no_memory(sc: Scenario, t: int) -> None:
    sc = replace(sc, servers=tuple(replace(s, memory=0.0) if i == t else s for i, s in enumerate(sc.servers)))
    try:
        want = exhaustive(sc).makespan_s
    except ConfigError:
        for method in METHODS[sc.mode]:
            with pytest.raises(ConfigError):  # which cause comes first may differ (a device, or the servers)
                solve(sc, gap=0, method=method, time_limit=None)
        return
    for method in METHODS[sc.mode]:
        got = solve(sc, gap=0, method=method, time_limit=None)
        assert got.cost.feasible and got.makespan_s == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- a hair over a tier's memory


def test_assignments_an_ulp_over_a_tier_are_passed_over_not_a_numerical_trouble() -> None:
    """Three clients each put 132,000 fixed bytes on the edge and share its 44,000-byte block: 440,000 bytes
    in exact arithmetic, the edge's memory, but the cost model's sum lands an ulp over. The staged base's bound
    landed exactly on the memory (no base rows), and a row tightened by 1e-12 (under HiGHS's tolerance) gave the
    same answer again: "the MILP solver's answers keep overflowing a server's memory (numerical trouble)"."""
    prof = ModelProfile.synthetic([1e6, 1e6], [13.346406078407682, 19.949999999999992], [0.0, 44000.0],
                                  input_bytes=100.0)
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1e8, 1e15), LinkProfile(1e5, 1e5, 0.01), samples=1)
                    for i in range(3))
    sc = Scenario(prof, clients, (TierProfile(1e9, 440000.0),), (), batch=2)
    over = evaluate(sc, {c.name: (1,) for c in sc.clients})
    assert not over.feasible and over.shared_memory["edge"] == pytest.approx(440000.0, rel=1e-15)
    want = exhaustive(sc).makespan_s
    for method in ("bisect", "direct"):
        got = solve(sc, gap=0, method=method, time_limit=None)
        assert got.cost.feasible and got.makespan_s == want


def test_brute_force_takes_an_assignment_that_fills_a_tier_to_the_byte_as_priced() -> None:
    """c0 and c2 put all four blocks on the edge, c1 the last two: 437,000 bytes, the edge's memory, and
    evaluate() says it fits; brute force's own sum (another order) landed an ulp over and dropped it, returning
    a slower plan (0.10628 s, not 0.10123 s) than solve."""
    prof = ModelProfile.synthetic([1e6] * 4, [10.0, 10.0, 10.0, 19.756930174896752], [0.0, 1000.0, 0.0, 43000.0],
                                  input_bytes=100.0)
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1e8, 1e15), LinkProfile(1e5, 2e5 if i == 1 else 1e5, 0.01),
                           samples=1) for i in range(3))
    sc = Scenario(prof, clients, (TierProfile(1e9, 437000.0),), (), batch=2)
    plan = {"c0": (0,), "c1": (2,), "c2": (0,)}
    assert evaluate(sc, plan).feasible and evaluate(sc, plan).shared_memory["edge"] == 437000.0
    want = evaluate(sc, plan).makespan_s
    assert exhaustive(sc).makespan_s == want
    assert solve(sc, gap=0, method="direct", time_limit=None).makespan_s == want
