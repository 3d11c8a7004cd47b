"""The optimizer (splitfed/optimizer/), pinned where a mutation run found gaps (third list): the best
single cut where server memory binds (against every static cut priced), brute force against a plain
enumeration, the numbers and names a refusal gives."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cost import Scenario, evaluate, option_table
from splitfed.errors import ConfigError
from splitfed.optimizer import best_static, exhaustive, greedy, solve
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from splitfed.units import mib_text

BIG = 1e15  # memory no option fills


def _model(L: int = 3, state: float = 1e5) -> ModelProfile:
    return ModelProfile.synthetic([(i + 1) * 1e7 for i in range(L)], [(L - i) * 2e4 for i in range(L)],
                                  [(i + 2) * state for i in range(L)], input_bytes=3e4)


def _fleet(n: int, kinds: int, *, server_memory: float = BIG, mode: str = "sflv1", L: int = 3, tiers: int = 3,
           state: float = 1e5, device_memory: float = BIG) -> Scenario:
    """``n`` clients of ``kinds`` kinds (faster devices and links per kind), ``tiers - 1`` servers."""
    clients = tuple(Client(f"c{i}", f"k{i % kinds}", TierProfile(2e9 * (1 + i % kinds), device_memory),
                           LinkProfile(4e6 * (1 + i % kinds), 4e6, 0.01), 100) for i in range(n))
    servers = tuple(TierProfile(5e9 * (t + 1), server_memory) for t in range(tiers - 1))
    links = tuple(LinkProfile(2e7, 2e7, 0.005) for _ in range(tiers - 2))
    return Scenario(_model(L, state), clients, servers, links, batch=8, mode=mode)


def _with_memory(sc: Scenario, memory: list[float]) -> Scenario:
    return replace(sc, servers=tuple(TierProfile(s.flops, m) for s, m in zip(sc.servers, memory, strict=True)))


def _feasible_statics(sc: Scenario) -> list[tuple[float, tuple[int, ...]]]:
    """Every single cut vector that fits every device, priced by the cost model: (makespan, cuts), feasible only."""
    out = []
    for o in sc.options:
        cost = evaluate(sc, {c.name: tuple(int(x) for x in o) for c in sc.clients})
        if cost.feasible:
            out.append((cost.makespan_s, tuple(int(x) for x in o)))
    return out


# ---------------------------------------------------------------- the best single cut where server memory binds


@settings(max_examples=25)
@given(n=st.integers(1, 4), kinds=st.integers(1, 2), mode=st.sampled_from(["sflv1", "sl", "sflv2"]),
       tiers=st.sampled_from([2, 3]), state=st.sampled_from([1e4, 1e6]),
       frac=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2))
def test_best_static_is_the_best_feasible_static_cut_when_memory_binds(n: int, kinds: int, mode: str, tiers: int,
                                                                      state: float, frac: list[float]) -> None:
    """Servers sized between the least and the most any static cut needs: best_static's screen must neither
    drop the best cut that fits nor let through one that does not; it is the best of every static priced
    (ties: the same makespan), and refuses exactly when none fits."""
    loose = _fleet(n, kinds, mode=mode, tiers=tiers, state=state)
    need = np.array([list(evaluate(loose, {c.name: tuple(int(x) for x in o) for c in loose.clients})
                          .shared_memory.values()) for o in loose.options])
    lo, hi = need.min(axis=0), need.max(axis=0)
    sc = _with_memory(loose, [float(a + f * (b - a)) for a, b, f in zip(lo, hi, frac, strict=False)])
    truth = _feasible_statics(sc)
    if not truth:
        with pytest.raises(ConfigError, match="no single cut vector fits"):
            best_static(sc)
        return
    got = best_static(sc)
    assert got.cost.feasible
    assert got.makespan_s == min(t for t, _ in truth)
    cuts = tuple(int(x) for x in got.method.removeprefix("best static ").split(","))
    assert (got.makespan_s, cuts) in truth


@pytest.mark.parametrize("mode", ["sflv1", "sl", "sflv2"])
@pytest.mark.parametrize("n", [2, 3])
def test_best_static_takes_the_best_cut_when_servers_hold_exactly_its_need(mode: str, n: int) -> None:
    """Activations outweigh the state (sflv1's staged base adds nothing then): servers of exactly the bytes the
    best static cut needs, as priced, still take it (not a byte is added to its estimate)."""
    loose = _fleet(n, 2, mode=mode, state=1e3)
    ranked = sorted(_feasible_statics(loose))
    for _, cuts in ranked:
        need = list(evaluate(loose, {c.name: cuts for c in loose.clients}).shared_memory.values())
        if all(m > 0 for m in need):
            break
    sc = _with_memory(loose, need)
    truth = min(_feasible_statics(sc))
    assert evaluate(sc, {c.name: cuts for c in sc.clients}).feasible
    got = best_static(sc)
    assert got.makespan_s == truth[0]


# ---------------------------------------------------------------- brute force against a plain enumeration


@settings(max_examples=20)
@given(n=st.integers(1, 3), kinds=st.integers(1, 3), mode=st.sampled_from(["sflv1", "sl", "sflv2"]),
       frac=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2),
       method=st.sampled_from(["auto", "direct", "bisect"]))
def test_exhaustive_and_solve_match_a_plain_enumeration(n: int, kinds: int, mode: str, frac: list[float],
                                                        method: str) -> None:
    """Every assignment of a small fleet priced by the cost model: brute force and the MILP find its least
    makespan, on servers sized anywhere between the least and the most an assignment needs (or refuse, as
    memory, exactly when none fits)."""
    loose = _fleet(n, kinds, mode=mode, L=2, state=1e6)
    opts = [tuple(int(x) for x in o) for o in loose.options]
    combos = [dict(zip((c.name for c in loose.clients), pick, strict=True))
              for pick in itertools.product(opts, repeat=n)]
    need = np.array([list(evaluate(loose, a).shared_memory.values()) for a in combos])
    lo, hi = need.min(axis=0), need.max(axis=0)
    sc = _with_memory(loose, [float(a + f * (b - a)) for a, b, f in zip(lo, hi, frac, strict=True)])
    costs = [evaluate(sc, a) for a in combos]
    ok = [c.makespan_s for c in costs if c.feasible]
    if not ok:
        for run in (lambda: exhaustive(sc), lambda: solve(sc, gap=0.0, time_limit=None, method=method)):
            with pytest.raises(ConfigError, match="no assignment fits"):
                run()
        return
    truth = min(ok)
    ex = exhaustive(sc)
    assert ex.cost.feasible and ex.makespan_s == truth
    sol = solve(sc, gap=0.0, time_limit=None, method=method)
    assert sol.cost.feasible and sol.makespan_s == pytest.approx(truth, rel=1e-9)


@pytest.mark.parametrize("mode", ["sflv1", "sl", "sflv2"])
@pytest.mark.parametrize("method", ["auto", "direct", "bisect"])
@pytest.mark.parametrize("cloud", [1e-89, 1e-30, 1e-3])
def test_servers_of_almost_no_memory_leave_the_cuts_that_put_nothing_there(mode: str, method: str,
                                                                          cloud: float) -> None:
    """An edge of 0 bytes and a cloud of a sliver of one: only every block on the device fits, and every method
    finds it. Before: the MILP's memory rows in units of the cloud's memory held ratios of 1e95, and HiGHS
    called the model infeasible ("no assignment fits") though brute force had the answer (found by the
    hypothesis test above: frac 6.8e-97)."""
    sc = _with_memory(_fleet(1, 1, mode=mode, L=2, state=1e6), [0.0, cloud])
    assert exhaustive(sc).assignment == {"c0": (2, 2)}
    sol = solve(sc, gap=0.0, time_limit=None, method=method)
    assert sol.assignment == {"c0": (2, 2)} and sol.cost.feasible


# ---------------------------------------------------------------- refusals: the device share, the names


def _tiny_devices(sc: Scenario, memory: float) -> Scenario:
    return replace(sc, clients=tuple(Client(c.name, c.kind, TierProfile(c.device.flops, memory), c.link, c.samples)
                                     for c in sc.clients))


@pytest.mark.parametrize("run", [lambda sc: solve(sc), exhaustive, greedy],
                         ids=["solve", "exhaustive", "greedy"])
def test_a_device_no_cut_fits_is_told_the_device_share_it_needs(run: object) -> None:
    """The refusal gives the least bytes any cut needs on the device itself (column 0 of the memory table, not
    a server's), and that cut."""
    sc = _tiny_devices(_fleet(2, 1), 1.0)
    t = option_table(sc, sc.clients[0])
    best = int(np.argmin(t.memory[:, 0]))
    other = int(np.argmin(t.memory[:, 1]))  # a server's column would name other numbers
    assert (t.memory[best, 0], best) != (t.memory[other, 1], other)
    with pytest.raises(ConfigError) as e:
        run(sc)  # type: ignore[operator]
    msg = str(e.value)
    assert f"the smallest device share needs {mib_text(t.memory[best, 0])} " \
           f"(cuts {','.join(map(str, t.options[best]))})" in msg
    assert f"its memory is {mib_text(1.0)}" in msg


def test_five_devices_no_cut_fits_name_the_first_and_count_four() -> None:
    """More than three further unfit devices: counted, not listed."""
    sc = _tiny_devices(_fleet(5, 5), 1.0)
    with pytest.raises(ConfigError, match=re.escape("device 'c0' (fleet entry 'k0') (and 4 more) cannot")):
        solve(sc)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the cost model overflows on absurd beliefs
def test_servers_of_unbounded_memory_with_a_client_priced_infinite_say_it_never_ends() -> None:
    """No memory row at all (every server unbounded): the probe for "does anything fit" is a MILP without
    rows, which fits; the refusal is that the round never ends, not that nothing fits."""
    prof = ModelProfile.synthetic([1e6, 2e6, 3e6], [1e3, 2e3, 1e3], [1e4, 2e4, 1e4], input_bytes=1e3)
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1e9, BIG), LinkProfile(1e-308 if i == 0 else 1e6, 1e6, 0.01),
                           4) for i in range(2))
    sc = Scenario(prof, clients, (TierProfile(1e10, float("inf")),), (), batch=2, mode="sflv1")
    with pytest.raises(ConfigError, match=re.escape("(every cut of client(s) 'c0' is priced infinite)")):
        solve(sc, gap=0.0, time_limit=None)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
@pytest.mark.parametrize("q", [0.3, 0.5])
def test_best_static_screens_out_cuts_whose_holder_overflows_among_many(mode: str, q: float) -> None:
    """Clients in turn, each beside the holder its cut leaves, on servers most fast cuts overflow: the screen
    counts the holder, so the best cut that fits is among the few re-priced, not crowded out by many faster
    ones that do not fit."""
    loose = _fleet(3, 1, mode=mode, L=6, tiers=3, state=1e6)
    need = np.array([list(evaluate(loose, {c.name: tuple(int(x) for x in o) for c in loose.clients})
                          .shared_memory.values()) for o in loose.options])
    sc = _with_memory(loose, [float(x) for x in np.quantile(need, q, axis=0)])
    truth = min(_feasible_statics(sc))
    got = best_static(sc)
    assert (got.makespan_s, got.method) == (truth[0], f"best static {','.join(map(str, truth[1]))}")


def test_best_static_of_two_equal_cuts_names_the_first() -> None:
    """A block of no work, no state and the same output as the one before: cutting before or after it costs
    exactly the same; best_static names the first such cut (the options' order), deterministically."""
    prof = ModelProfile.synthetic([1e7, 0.0, 1e7], [2e4, 2e4, 1e4], [1e5, 0.0, 1e5], input_bytes=3e5)
    clients = tuple(Client(f"c{i}", "k", TierProfile(2e9, BIG), LinkProfile(4e7, 4e7, 0.01), 100) for i in range(2))
    sc = Scenario(prof, clients, (TierProfile(3e9, BIG),), (), batch=8, mode="sflv1")
    ranked = sorted(_feasible_statics(sc))
    assert ranked[0][0] == ranked[1][0] and [ranked[0][1], ranked[1][1]] == [(1,), (2,)]
    got = best_static(sc)
    assert (got.makespan_s, got.method) == (ranked[0][0], "best static 1")


# ---------------------------------------------------------------- greedy: the cut that fits beside its own holder


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("q", [0.2, 0.5, "exact", "under"])
def test_greedy_of_one_kind_is_the_fastest_cut_that_fits_beside_its_holder(mode: str, n: int, q: object) -> None:
    """Clients of one kind in turn: each one's cut is the fastest for it alone among those that fit the servers
    beside the holder such a cut leaves (none for one client): the fastest feasible static cut by own time.
    "exact": servers of exactly the bytes the fastest cut needs keep it; "under": a cloud 1% smaller, it does not fit."""
    loose = _fleet(n, 1, mode=mode, L=5, tiers=3, state=1e6)
    priced = [(evaluate(loose, {c.name: tuple(int(x) for x in o) for c in loose.clients}), tuple(int(x) for x in o))
              for o in loose.options]
    need = np.array([list(cost.shared_memory.values()) for cost, _ in priced])
    if q in ("exact", "under"):
        fastest = min(range(len(priced)), key=lambda j: (priced[j][0].clients[0].round_s, j))
        caps = [float(x) for x in need[fastest]]
        caps[-1] *= 0.99 if q == "under" else 1.0  # the cloud, which holds a holder
    else:
        caps = [float(x) for x in np.quantile(need, float(q), axis=0)]  # type: ignore[arg-type]
    sc = _with_memory(loose, caps)
    fits = [(evaluate(sc, {c.name: cuts for c in sc.clients}), cuts) for _, cuts in priced]
    want = min((cost.clients[0].round_s, j, cuts) for j, (cost, cuts) in enumerate(fits) if cost.feasible)
    got = greedy(sc)
    assert got.cost.feasible and not got.note
    assert set(got.assignment.values()) == {want[2]}


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_exhaustive_names_a_device_no_cut_fits_before_blaming_the_servers(mode: str) -> None:
    """Clients in turn: c0's device holds only cuts that need the servers, which hold nothing; c1's device holds
    no cut at all. Brute force refuses as the MILP does: the device no cut fits first (a larger server would
    not help it), not "the server tiers cannot hold" found at c0."""
    sc = _fleet(2, 2, mode=mode, server_memory=1.0)
    least = float(option_table(sc, sc.clients[0]).memory[:, 0].min())
    c0, c1 = sc.clients
    sc = replace(sc, clients=(replace(c0, device=TierProfile(c0.device.flops, least * 1.01)),
                              replace(c1, device=TierProfile(c1.device.flops, 1.0))))
    for run in (solve, exhaustive):
        with pytest.raises(ConfigError, match=r"^device 'c1' \(fleet entry 'k1'\) cannot train any legal cut"):
            run(sc)
