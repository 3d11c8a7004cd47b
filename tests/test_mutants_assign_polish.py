"""The optimizer's polish (splitfed/optimizer/ties.py, ``polish``), pinned where a mutation run found gaps: it
takes a move a hair faster only when the round it gives fits memory and is strictly faster, and it stops after
its budget of trials."""

from __future__ import annotations

import pytest

from splitfed.cost import RoundCost, Scenario, evaluate
from splitfed.optimizer import classes as opt_classes
from splitfed.optimizer import ties as opt_ties
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

# block 1 does almost no work (on the edge or the cloud: ~1e-12 relative apart) but its activation is 1e6 bytes,
# so (0, 1) (block 1 on the cloud) is a hair faster than (0, 2) for the client and the edge, and needs ~1 MB more
# cloud memory (and ~1 MB less edge memory)
_TINY = ModelProfile.synthetic([1e6, 1e-4, 1e6], [1000.0, 1000.0, 100.0], [0.0, 0.0, 0.0], input_bytes=1000,
                               act_bytes=[1000.0, 1e6, 100.0])
BIG = 1e12


def _tiny(n: int, cloud_memory: float = BIG) -> Scenario:
    clients = tuple(Client(f"c{i}", "k", TierProfile(1e9, BIG), LinkProfile(1e6, 1e6, 0.01), samples=8)
                    for i in range(n))
    return Scenario(_TINY, clients, (TierProfile(1e10, BIG), TierProfile(1e11, cloud_memory)),
                    (LinkProfile(1e7, 1e7, 0.001),), batch=4)


def _all_on_edge(sc: Scenario) -> RoundCost:
    return evaluate(sc, {c.name: (0, 2) for c in sc.clients})


def _moved(cost: RoundCost) -> int:
    return sum(cuts == (0, 1) for cuts in cost.assignment().values())


def _cloud_need(n: int, moved: int) -> float:
    """Cloud bytes of ``n`` clients, ``moved`` of them on (0, 1), as the cost model prices them."""
    sc = _tiny(n)
    return evaluate(sc, {c.name: (0, 1) if i < moved else (0, 2) for i, c in enumerate(sc.clients)}
                    ).shared_memory["cloud"]


def test_the_fixture_has_a_move_a_hair_faster_that_needs_more_cloud_memory() -> None:
    sc = _tiny(1)
    slow, fast = evaluate(sc, {"c0": (0, 2)}), evaluate(sc, {"c0": (0, 1)})
    assert slow.bottleneck == "client c0"
    assert slow.makespan_s * (1 - 1e-9) < fast.makespan_s < slow.makespan_s
    assert fast.shared_memory["cloud"] > slow.shared_memory["cloud"] + 9e5
    many = _all_on_edge(_tiny(20))
    assert many.bottleneck == "edge compute"


@pytest.mark.parametrize("room", [0.0, 1.0])
def test_polish_of_the_slowest_client_never_takes_a_move_that_overflows_memory(room: float) -> None:
    """The cloud holds (0, 2)'s activations and no more (room 0): the faster (0, 1) overflows it, so the polish
    keeps the round as given; with room for it (room 1), it takes it."""
    need = _cloud_need(1, 0) + room * (_cloud_need(1, 1) - _cloud_need(1, 0))
    sc = _tiny(1, cloud_memory=need)
    cost = _all_on_edge(sc)
    assert cost.feasible and cost.bottleneck == "client c0"
    got = opt_ties.polish(sc, opt_classes.price_classes(sc), cost)
    assert got.feasible
    assert got.makespan_s <= cost.makespan_s
    if room:
        assert got.assignment() == {"c0": (0, 1)} and got.makespan_s < cost.makespan_s
    else:
        assert got is cost


@pytest.mark.parametrize("fit", [0, 2, 5])
def test_polish_of_a_shared_resource_moves_clients_while_memory_holds_them(fit: int) -> None:
    """Twenty clients load the edge's compute; each on (0, 1) unloads it a hair but adds ~1 MB to the cloud,
    which holds ``fit`` of them: the polish moves exactly ``fit`` (one per pass), never one more, and every
    round it returns fits and is no slower."""
    n = 20
    sc = _tiny(n, cloud_memory=_cloud_need(n, fit))
    cost = _all_on_edge(sc)
    assert cost.feasible and cost.bottleneck == "edge compute"
    got = opt_ties.polish(sc, opt_classes.price_classes(sc), cost)
    assert got.feasible, got.violations
    assert _moved(got) == fit
    assert got.makespan_s == evaluate(sc, got.assignment()).makespan_s
    if fit:
        assert got.makespan_s < cost.makespan_s
    else:
        assert got is cost


@pytest.mark.parametrize("budget", [0, 1, 2, 3])
def test_polish_of_a_shared_resource_stops_after_its_budget(budget: int) -> None:
    """Each pass tries one move (the first client's (0, 1); the others share its class and cuts), and it
    lowers the edge's load: a budget of k trials moves exactly k clients (none for 0), each strictly faster."""
    sc = _tiny(20)
    cost = _all_on_edge(sc)
    got = opt_ties.polish(sc, opt_classes.price_classes(sc), cost, budget=budget)
    assert _moved(got) == budget
    assert got.feasible
    if budget:
        assert got.makespan_s < cost.makespan_s
    else:
        assert got is cost
    one_more = opt_ties.polish(sc, opt_classes.price_classes(sc), cost, budget=budget + 1)
    assert one_more.makespan_s < got.makespan_s  # each trial counted is a move taken


def test_polish_of_the_slowest_client_tries_nothing_once_its_deadline_has_passed() -> None:
    """The move a hair faster is there (room for it), but the deadline has passed: no trial starts, and the round
    comes back as given (a mutation run found this return unwatched: made to give None, no test failed)."""
    sc = _tiny(1)
    cost = _all_on_edge(sc)
    assert cost.bottleneck == "client c0"
    classes = opt_classes.price_classes(sc)
    assert opt_ties.polish(sc, classes, cost).assignment() == {"c0": (0, 1)}  # with time: taken
    assert opt_ties.polish(sc, classes, cost, deadline=float("-inf")) is cost
