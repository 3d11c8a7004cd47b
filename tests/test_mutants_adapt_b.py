"""Behaviour of the online adapter that a second mutation run found unpinned: a server measurement named
after the device tier is refused (not read as the last server's), a U-shape run moves a client's cuts (head
and tail) after a measured drift, and moves that do not pay are undone most expensive first, not slowest
first."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from splitfed.cost import Scenario, evaluate, move_cost
from splitfed.errors import ConfigError
from splitfed.optimizer import Adapter, Measurement, solve
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

# block 1: 100 MFLOP/sample and 1.5 MB of weights (as in tests/test_mutants_adapt.py)
PROF = ModelProfile.synthetic([1e6, 1e8], [1e3, 10], [1e3, 1.5e6], input_bytes=1e3)


def _chain(tiers: int) -> Scenario:
    dev = Client("d", "d", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=100)
    servers = tuple(TierProfile(5e9 * 10**t, 1e10) for t in range(tiers - 1))
    links = tuple(LinkProfile(1e9, 1e9, 0.0) for _ in range(tiers - 2))
    return Scenario(PROF, (dev,), servers, links, batch=10)


# ---------------------------------------------------------------- a server measurement names a server tier


@pytest.mark.parametrize(("tiers", "listed"), [(2, "edge"), (3, "edge, cloud"), (4, "edge, tier2, cloud")])
def test_a_server_measurement_named_after_the_device_tier_is_refused(tiers: int, listed: str) -> None:
    """"device" is a tier's name but not a server's: its FLOP/s are a client's, so a server measurement under
    that name is refused like any unknown name, and no belief changes (it is not taken for the last server)."""
    adapter = Adapter(_chain(tiers), rounds=5, assignment={"d": (1,) + (2,) * (tiers - 2)})
    before = adapter.belief
    assert before.tier_names[0] == "device"
    for name in ("device", "nope"):
        with pytest.raises(ConfigError) as e:
            adapter.update({}, servers={name: (1e9, 1.0)})
        assert str(e.value) == f"no server tier named {name!r} (tiers: {listed})"
        assert adapter.belief == before
    adapter.update({}, servers={"edge": (1e9, 1.0)})  # a server's own name is learned (5x slower: at once)
    assert adapter.belief.servers[0].flops == 1e9 and adapter.belief.servers[1:] == before.servers[1:]


# ---------------------------------------------------------------- a U-shape run moves


# blocks 0 and 2 are light, block 1 heavy; block 0's output (100 kB/sample) is what a head on the device sends
U_PROF = ModelProfile.synthetic([1e6, 1e8, 1e6], [1e5, 1e3, 10], [1e3, 1.5e6, 1e3], input_bytes=1e3)


def _u_shape(servers: tuple[TierProfile, ...], links: tuple[LinkProfile, ...]) -> Scenario:
    cl = tuple(Client(n, "d", TierProfile(1e9, 1e12), LinkProfile(1e8, 1e8, 0.0), samples=100) for n in "df")
    return Scenario(U_PROF, cl, servers, links, batch=10, u_shape=True)


@pytest.mark.parametrize(("sc", "old", "new"), [
    (_u_shape((TierProfile(5e10, 1e12),), ()), (1, 3), (0, 2)),
    (_u_shape((TierProfile(5e9, 1e12), TierProfile(2e10, 1e12)), (LinkProfile(1e8, 1e8, 0.0),)),
     (1, 1, 2), (0, 1, 2)),
], ids=["2-tier", "3-tier"])
def test_a_u_shape_client_whose_uplink_drops_moves_its_head_off_the_device(
        sc: Scenario, old: tuple[int, ...], new: tuple[int, ...]) -> None:
    """A U-shape client's cuts are its servers' cuts and its tail's: after "d"'s uplink turns out 10x slower
    (a change of regime, believed at once) sending block 0's 100 kB/sample output costs more than the input,
    so "d" hands block 0 to the servers (its tail may change too); "f" keeps its cuts. Priced here with the
    cost model."""
    rounds, left = 11, 10
    start = {"d": old, "f": old}
    # an optimal plan, as a run that began with it holds it; the optimizer's own first plan is ``new`` for both,
    # the tie of least client time
    initial = Adapter(sc, rounds=rounds, time_limit=None).assignment
    assert initial == {"d": new, "f": new}
    assert evaluate(sc, start).makespan_s == evaluate(sc, initial).makespan_s
    slower = {"d": Measurement(up_bytes=1e7, up_s=1.0)}
    adapter = Adapter(sc, rounds=rounds, hysteresis=0.0, time_limit=None, assignment=start)
    d = adapter.observe(1, slower)
    b = adapter.belief
    assert b.clients[0].link.up == 1e7
    plan = {"d": new, "f": old}
    assert d.moved == ("d",) and d.assignment == plan and adapter.assignment == plan
    first = evaluate(b, plan, extra_s={"d": move_cost(b, b.clients[0], old, new)}).makespan_s
    M_old, M_new = evaluate(b, start).makespan_s, evaluate(b, plan).makespan_s
    assert (d.before_s, d.after_s, d.move_s) == (M_old, M_new, first - M_new)
    assert M_new < M_old
    assert d.reason == f"gain {left * M_old - (first + (left - 1) * M_new):.3g} s over {left} round(s)"


# ---------------------------------------------------------------- most expensive first, not slowest first


def test_moves_are_undone_most_expensive_first_even_when_that_client_is_not_the_slowest() -> None:
    """Both devices turn out much faster (100x and 30x) and the edge, shared, is the bottleneck: the new
    optimum takes block 1 off it to both. With 1 round left J is the next round, weights included: "a"'s move
    is the dearer (1.5 MB over its 0.75 MB/s downlink, 2 s; "b"'s 1 s) but "a" is the faster client once moved.
    Undoing the dearest first undoes "a"'s move and keeps "b"'s. Undoing the slowest first would undo "b"'s
    (the round is still "a"'s weights, so J does not rise) and then keep "a"'s: the worse of the two (priced
    here with the cost model)."""
    cl = (Client("a", "d", TierProfile(1e9, 1e12), LinkProfile(1e8, 7.5e5, 0.0), samples=100),
          Client("b", "d", TierProfile(1e9, 1e12), LinkProfile(1.5e6, 1.5e6, 0.0), samples=100))
    sc = Scenario(PROF, cl, (TierProfile(1e10, 1e12),), (), batch=10)
    start = {"a": (1,), "b": (1,)}
    measured = {"a": Measurement(compute_flops=1e11, compute_s=1.0),
                "b": Measurement(compute_flops=3e10, compute_s=1.0)}
    belief = Adapter(sc, rounds=2, assignment=start)
    belief.update(measured)
    b = belief.belief
    assert (b.clients[0].device.flops, b.clients[1].device.flops) == (1e11, 3e10)
    target = solve(b, time_limit=None, prefer=start).assignment
    assert target == {"a": (2,), "b": (2,)}
    moved = evaluate(b, target).clients
    cost_a, cost_b = (move_cost(b, b.clients[i], (1,), (2,)) for i in (0, 1))
    assert cost_a > cost_b and moved[0].round_s < moved[1].round_s  # the two orders disagree

    def first(plan: Mapping[str, tuple[int, ...]]) -> float:  # the next (and last) round, moves included
        return evaluate(b, plan, extra_s={n: move_cost(b, b.clients[b.index(n)], start[n], plan[n])
                                          for n in plan if plan[n] != start[n]}).makespan_s

    only_a, only_b = {"a": (2,), "b": (1,)}, {"a": (1,), "b": (2,)}
    assert first(only_a) == first(target)  # undoing "b" first: the round is still "a"'s, J unchanged
    assert first(only_b) < first(only_a) < first(start)
    d = Adapter(sc, rounds=2, hysteresis=0.0, time_limit=None, assignment=start).observe(1, measured)
    assert d.moved == ("b",) and d.assignment == only_b
    after = evaluate(b, only_b).makespan_s
    assert (d.before_s, d.after_s, d.move_s) == (evaluate(b, start).makespan_s, after, first(only_b) - after)
