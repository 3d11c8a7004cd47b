"""The optimizer: exact (== brute force), within memory, clear when infeasible; the baseline policies; the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, event, example, given, settings
from hypothesis import strategies as st

from splitfed.cli import main
from splitfed.cost import Scenario, cut_options, evaluate, option_table
from splitfed.errors import ConfigError
from splitfed.optimizer import all_on_server, best_static, exhaustive, greedy, solve, static
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from splitfed.units import mib_text

MAX_ASSIGNMENTS = 20_000  # keeps brute force fast: every example enumerates them all


@st.composite
def instances(draw: st.DrawFn, mode: str = "sflv1", limit: int = MAX_ASSIGNMENTS) -> Scenario:
    """A random small fleet: <= 6 clients (some identical), 3 tiers, a synthetic model, any U-shape, any codec;
    at most ``limit`` assignments."""
    L = draw(st.integers(1, 4))
    u = draw(st.booleans()) if L <= 3 else False
    m = len(cut_options(L, 3, u))
    most = max([k for k in range(1, 7) if m**k <= limit] or [1])
    n = most + 1 - draw(st.integers(1, most))  # hypothesis favours small draws: favour many clients
    ints = st.integers
    prof = ModelProfile.synthetic(
        [draw(ints(0, 50)) * 1e6 for _ in range(L)], [draw(ints(1, 60)) * 1e3 for _ in range(L)],
        [draw(st.sampled_from([0, draw(ints(1, 400)) * 1e3])) for _ in range(L)],
        input_bytes=draw(ints(1, 60)) * 1e3, optimizer_slots=draw(ints(0, 2)))
    kinds = [Client(f"k{j}", f"k{j}", TierProfile(draw(ints(1, 30)) * 1e9, draw(ints(1, 60)) * 1e5),
                    LinkProfile(draw(ints(1, 40)) * 1e5, draw(ints(1, 40)) * 1e5, draw(ints(0, 80)) / 1e3),
                    draw(ints(1, 300)))
             for j in range(draw(ints(1, n)) if draw(st.booleans()) else n + 1 - draw(ints(1, n)))]
    clients = tuple(Client(f"c{i}", k.kind, k.device, k.link, k.samples)
                    for i, k in enumerate(kinds[i % len(kinds)] for i in range(n)))
    tight = mode != "sflv1" and draw(st.booleans())  # one client at a time: make the servers small enough to bind
    servers = (TierProfile(draw(ints(1, 60)) * 1e9, draw(ints(1, 40 if tight else 300)) * 1e5),
               TierProfile(draw(ints(1, 300)) * 1e9, draw(ints(1, 40 if tight else 600)) * 1e5))
    link = LinkProfile(draw(ints(1, 60)) * 1e5, draw(ints(1, 60)) * 1e5, draw(ints(0, 30)) / 1e3)
    codec = draw(st.sampled_from(["none", "none", "fp16", "int8", "topk:0.1"]))
    return Scenario(prof, clients, servers, (link,), batch=draw(ints(1, 32)), u_shape=u, mode=mode, codec=codec)


def _outcome(fn, sc: Scenario):  # noqa: ANN001, ANN202
    try:
        return fn(sc)
    except ConfigError as e:
        return e


def _within_memory(sc: Scenario, assignment: dict) -> bool:
    cost = evaluate(sc, assignment)
    devices = all(c.memory[0] <= cl.device.memory for c, cl in zip(cost.clients, sc.clients, strict=True))
    servers = all(cost.shared_memory[sc.tier_names[t]] <= sc.memory_caps[t - 1] for t in range(1, sc.tiers))
    return devices and servers and cost.feasible


def _equals_brute_force(sc: Scenario, methods: tuple[str, ...]) -> None:
    truth = _outcome(exhaustive, sc)
    event("infeasible" if isinstance(truth, ConfigError) else "feasible")
    event(f"{len(sc.clients)} client(s), {len({c.kind for c in sc.clients})} kind(s)")
    if not isinstance(truth, ConfigError):
        event(f"bottleneck: {'a client' if truth.cost.bottleneck.startswith('client ') else truth.cost.bottleneck}")
        full = max(u / cap for u, cap in zip(truth.cost.shared_memory.values(), sc.memory_caps, strict=True))
        event(f"server memory {'over' if full > 0.5 else 'under'} half full")
    for method in methods:
        got = _outcome(lambda s, m=method: solve(s, gap=0.0, method=m), sc)
        if isinstance(truth, ConfigError):
            assert isinstance(got, ConfigError), (method, got)
            assert str(got).split()[0] == str(truth).split()[0]  # same cause ("device ..." or "no assignment")
            continue
        assert not isinstance(got, ConfigError), (method, got)
        assert got.makespan_s == truth.makespan_s, (method, got.assignment, truth.assignment)
        assert got.optimal
        assert _within_memory(sc, got.assignment)
        # every policy is priced by the same cost model and can only be worse
        for policy in (greedy, best_static):
            p = _outcome(policy, sc)
            if not isinstance(p, ConfigError) and p.cost.feasible:
                assert p.makespan_s >= got.makespan_s


@settings(max_examples=250)
@given(instances())
def test_optimizer_equals_brute_force(sc: Scenario) -> None:
    _equals_brute_force(sc, ("bisect", "direct"))


@settings(max_examples=100)
@given(instances("sflv2"))
def test_optimizer_equals_brute_force_sflv2(sc: Scenario) -> None:
    """SplitFed v2: clients in turn, as the engine runs it (the round is the sum of their times; each server
    holds one client's segment at a time); ``auto`` is the sequential rule, as in sl."""
    _equals_brute_force(sc, ("auto", "bisect", "direct"))


@settings(max_examples=100)
@given(instances("sl"))
def test_optimizer_equals_brute_force_sl(sc: Scenario) -> None:
    """Vanilla split learning: clients in turn; the round is the sum of their times."""
    _equals_brute_force(sc, ("auto", "bisect", "direct"))


@st.composite
def holder_bound(draw: st.DrawFn) -> Scenario:
    """sl or sflv2 with each server's memory between what the smallest option needs beside its own holder and
    what the clients' fastest options need beside the largest of their holders: the holder binds, so the
    fastest options are not always optimal (the coupled case of the module docstring)."""
    from splitfed.cost import held_memory, turn_memory

    sc = draw(instances(draw(st.sampled_from(["sl", "sflv2"]))))
    sc = replace(sc, servers=tuple(replace(s, memory=1e15) for s in sc.servers))
    caps = []
    for s in range(len(sc.servers)):
        need_lo, need_hi, fast_turn, fast_held = math.inf, 0.0, 0.0, 0.0
        for c in sc.clients:
            t = option_table(sc, c)
            held = held_memory(sc, t.options)[:, s]
            turn = turn_memory(t.memory[:, 1:], t.act_memory[:, 1:], held_memory(sc, t.options))[:, s]
            ok = t.fits_device
            if not ok.any():
                return sc
            need_lo = min(need_lo, float((turn + held)[ok].min()))
            f = int(np.argmin(np.where(ok, t.round_s, np.inf)))
            fast_turn, fast_held = max(fast_turn, float(turn[f])), max(fast_held, float(held[f]))
        need_hi = max(need_lo, fast_turn + fast_held)
        caps.append(max(need_lo, 1.0) + draw(st.floats(0.0, 1.0)) * max(0.0, need_hi - max(need_lo, 1.0)))
    return replace(sc, servers=tuple(replace(s, memory=cap) for s, cap in zip(sc.servers, caps, strict=True)))


@settings(max_examples=150)
@given(holder_bound())
def test_optimizer_equals_brute_force_when_the_holder_binds(sc: Scenario) -> None:
    """Clients in turn, servers that hold one client's segment beside the model the client before left there
    (its holder): every method finds the optimum brute force finds, the MILPs with their holder rows."""
    _equals_brute_force(sc, ("auto", "bisect", "direct"))


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_the_holder_couples_the_clients_and_the_search_finds_the_optimum(mode: str) -> None:
    """c1's fastest cuts put block 0 on the edge: its step there (block 0's weights and gradients, 1,974 kB, the
    input batch it receives, 1,312 kB, and what block 0 keeps, sends on and gets back, 10 kB) fits beside its own holder (block 0's weights, 987 kB), not beside
    c0's (blocks 1-2, 997 kB), which c0's fastest cuts leave there. The fastest options are then not optimal:
    ``auto`` searches the holder sizes and finds what brute force finds. (Edge ranges that do not nest are what
    couple: without U-shape a 2-tier chain's edge ranges all end at the model's end, and there the fastest
    options fit.)"""
    from splitfed.cost import held_memory, turn_memory

    prof = ModelProfile.synthetic([5e6, 1e6, 5e6], [100, 3e3, 10e3], [987e3, 987e3, 10e3], input_bytes=41e3,
                                   optimizer_slots=0)
    # c1's downlink (5 MB/s) makes the weights it would hold dear: raw inputs up (cut 0) beat them
    devices = [(3e10, 1e7, 1e7, 292), (3e10, 1e7, 5e6, 51), (1e9, 1e5, 1e7, 51)]
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(f, 1e12), LinkProfile(up, down, 0.01), n)
                    for i, (f, up, down, n) in enumerate(devices))
    sc = Scenario(prof, clients, (TierProfile(5e10, 4_287_600), TierProfile(1e12, 1e15)),
                  (LinkProfile(1e7, 1e7, 0.01),), batch=32, mode=mode)
    fastest = {}
    for c in clients:
        t = option_table(sc, c)
        held = held_memory(sc, t.options)
        alone = (turn_memory(t.memory[:, 1:], t.act_memory[:, 1:], held) + held <= sc.memory_caps).all(axis=1)
        fastest[c.name] = tuple(int(x) for x in t.options[np.argmin(np.where(alone & t.fits_device, t.round_s,
                                                                             np.inf))])
    assert fastest == {"c0": (1, 3), "c1": (0, 1), "c2": (1, 3)}
    assert not evaluate(sc, fastest).feasible  # together they overflow the edge
    truth = exhaustive(sc)
    got = solve(sc, gap=0.0)
    assert got.note.startswith(f"{mode} sequential") and got.optimal
    assert got.makespan_s == truth.makespan_s and _within_memory(sc, got.assignment)
    assert got.assignment != fastest
    for method in ("bisect", "direct"):
        assert solve(sc, gap=0.0, method=method).makespan_s == truth.makespan_s


PROF = ModelProfile.synthetic([20e6, 40e6, 40e6, 1e6], [48e3, 16e3, 4e3, 40], [8e3, 300e3, 1.2e6, 20e3],
                              input_bytes=12e3)


def _client(name: str, flops: float = 10e9, memory: float = 2**30, up: float = 1e6, samples: int = 500) -> Client:
    return Client(name, name.rstrip("0123456789-"), TierProfile(flops, memory), LinkProfile(up, 4 * up, 0.03), samples)


@settings(max_examples=150)
@given(st.sampled_from(["sflv1", "sflv2"]).flatmap(instances))
def test_greedy_picks_only_cuts_that_fit_the_servers_alone(sc: Scenario) -> None:
    """Greedy prices each device as if the servers were its alone, so with one client it is the optimum. It
    kept only the device's memory: a single client was given cuts the edge could not hold."""
    one = sc.with_clients(sc.clients[:1])
    truth, got = _outcome(exhaustive, one), _outcome(greedy, one)
    if isinstance(truth, ConfigError):
        assert isinstance(got, ConfigError)
        return
    assert not isinstance(got, ConfigError), got
    assert got.cost.feasible and got.makespan_s == truth.makespan_s
    every = _outcome(greedy, sc)
    if not isinstance(every, ConfigError):
        for c in sc.clients:  # together they may overflow a server, but each pick fits it alone
            assert evaluate(sc.with_clients([c]), {c.name: every.assignment[c.name]}).feasible


@settings(max_examples=100, deadline=None)
@given(instances(), st.integers(1, 6))
def test_a_solve_cut_short_by_its_time_limit_never_claims_a_gap_it_did_not_prove(sc: Scenario, ticks: int) -> None:
    """The solve's clock runs out after ``ticks`` reads (each MILP reads it once before it starts): a
    deterministic stand-in for a time limit that falls between two MILPs. A feasibility MILP not run was
    taken as a proven "no", and the bound after a last MILP not run as the answer's own makespan: a
    solve 2.8x from the optimum reported "proven gap 0"."""
    from splitfed.optimizer import clock as opt_clock

    exact = _outcome(lambda s: solve(s, gap=0.0, time_limit=None, method="bisect"), sc)
    assume(not isinstance(exact, ConfigError))

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            self.now += 1.0
            return self.now

    real = opt_clock.time
    opt_clock.time = Clock()  # type: ignore[assignment]
    try:
        cut = _outcome(lambda s: solve(s, gap=0.0, time_limit=float(ticks), method="bisect"), sc)
    finally:
        opt_clock.time = real
    if isinstance(cut, ConfigError):
        assert "time limit ran out" in str(cut)
        return
    event("cut short" if not cut.optimal else "finished")
    assert cut.makespan_s >= exact.makespan_s * (1 - 1e-9)
    bound = cut.makespan_s * (1 - cut.gap)
    assert bound <= exact.makespan_s * (1 + 1e-9), (cut.note, exact.makespan_s)


def _scenario(clients, edge_mem: float = 2**34, cloud_mem: float = 2**35) -> Scenario:  # noqa: ANN001
    return Scenario(PROF, tuple(clients), (TierProfile(2e12, edge_mem), TierProfile(1e13, cloud_mem)),
                    (LinkProfile(1.25e8, 1.25e8, 0.02),), batch=32)


def test_infeasible_device_is_named() -> None:
    sc = _scenario([_client("phone-1"), _client("watch", memory=1e5), _client("phone-2")])
    for fn in (solve, exhaustive, greedy):
        with pytest.raises(ConfigError, match="device 'watch' cannot train any legal cut .* 0.0954 MiB"):
            fn(sc)
    with pytest.raises(ConfigError, match="do not fit device 'watch'"):
        static(sc, (2, 4))


def test_infeasible_class_is_named_with_its_count() -> None:
    sc = _scenario([_client(f"w-{i}", memory=1e5) for i in range(40)])
    with pytest.raises(ConfigError, match="device 'w-0' \\(fleet entry 'w'\\) \\(and 39 more\\) cannot"):
        solve(sc)


def test_every_device_no_cut_fits_is_named_whatever_its_sample_count() -> None:
    """Three of one device with other sample counts (a simulation's partition) are priced apart: only the
    first was named, so the user met the next one after mending the first."""
    sc = _scenario([_client("phone-1"), *(_client(f"w-{i}", memory=1e5, samples=400 + i) for i in range(3)),
                    _client("phone-2")])
    for fn in (solve, exhaustive, greedy):
        with pytest.raises(ConfigError, match="^device 'w-0' \\(fleet entry 'w'\\) \\(and 'w-1', 'w-2'\\) "
                                              "cannot train any legal cut .* 0.0954 MiB"):
            fn(sc)


def test_servers_too_small_for_everyone() -> None:
    # each client can keep at most 1.3 MB locally; the rest must fit the (tiny) servers
    clients = [_client(f"c{i}", memory=1.3e6) for i in range(20)]
    sc = _scenario(clients, edge_mem=1e6, cloud_mem=1e6)
    with pytest.raises(ConfigError, match="server tiers .* cannot hold the segments of all 20 clients"):
        solve(sc)


def test_memory_limits_bind_and_hold_for_a_large_fleet() -> None:
    # devices hold at most blocks 0-1 (5.5 MB, with the tensor they send on and its gradient); blocks 2-3
    # (~3.8 MB per client) must go to a server, and neither the edge nor the cloud can hold all 300 clients'
    # share: the optimizer must split them
    clients = [_client(f"c{i}", memory=5.5e6, up=1e7) for i in range(300)]
    sc = _scenario(clients, edge_mem=0.8e9, cloud_mem=0.8e9)
    sol = solve(sc)
    assert _within_memory(sc, sol.assignment)
    assert {c[1] for c in sol.assignment.values()} >= {2, 4} or {c[0] for c in sol.assignment.values()} >= {2}
    assert sol.cost.shared_memory["edge"] > 0 and sol.cost.shared_memory["cloud"] > 0
    assert not greedy(sc).cost.feasible  # greedy ignores sharing and overflows a server


def test_classes_make_thousands_of_clients_cheap() -> None:
    kinds = [dict(flops=4e9, up=2.5e5), dict(flops=60e9, up=6e6), dict(flops=8e9, up=1e6, samples=300)]
    clients = [_client(f"k{i % 3}-{i}", **kinds[i % 3]) for i in range(3000)]
    sol = solve(_scenario(clients))
    assert len(sol.assignment) == 3000 and "3 class(es)" in sol.note
    assert sol.makespan_s <= best_static(_scenario(clients)).makespan_s


def test_policies() -> None:
    clients = [_client("slow-link", up=1e5), _client("slow-cpu", flops=1e9, up=1e7), _client("mid")]
    sc = _scenario(clients)
    opt = solve(sc)
    g, b, a = greedy(sc), best_static(sc), all_on_server(sc)
    assert set(a.assignment.values()) == {(0, 0)}
    assert len(set(b.assignment.values())) == 1
    assert opt.makespan_s <= min(g.makespan_s, b.makespan_s, a.makespan_s)
    assert opt.makespan_s == exhaustive(sc).makespan_s
    for c in clients:  # greedy: each device alone picks its own fastest cuts
        own = min(evaluate(sc.with_clients([c]), {c.name: tuple(o)}).clients[0].round_s
                  for o in sc.options)
        assert evaluate(sc, g.assignment).times()[c.name] == own


def test_exhaustive_refuses_large_fleets() -> None:
    sc = _scenario([_client(f"c{i}") for i in range(6)])
    with pytest.raises(ConfigError, match="exhaustive search over 6 clients would check .* assignments "
                                          "\\(limit 2,000,000\\); use the default exact MILP"):
        exhaustive(sc)


def _kinds_fleet(counts: list[int]) -> str:
    kinds = ["phone-mid", "rpi4", "laptop"]
    return "[edge]\nprofile = 'edge-server'\n[cloud]\nprofile = 'cloud-gpu'\n" + "".join(
        f"[[device]]\nname = 'k{j}'\nprofile = '{kinds[j]}'\ncount = {n}\n" for j, n in enumerate(counts))


def _count_tables(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from splitfed.optimizer import classes as opt_classes

    calls: list[int] = []
    real = opt_classes.option_table

    def counted(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(opt_classes, "option_table", counted)
    return calls


def test_exhaustive_refuses_a_fleet_of_any_size_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from splitfed.profile import parse_fleet

    # before: OverflowError: int too large to convert to float (15^300 formatted with .3g)
    sc = Scenario.from_fleet(PROF, parse_fleet(_kinds_fleet([300]), "f.toml"), tiers=3)
    calls = _count_tables(monkeypatch)
    with pytest.raises(ConfigError, match=r"^exhaustive search over 300 clients would check ~6\.72e\+352 "
                                          r"assignments \(limit 2,000,000\); use the default exact MILP instead$"):
        exhaustive(sc)
    assert len(calls) == 1  # one table for 300 identical clients (before: one each)
    # 5,000 distinct clients: refused once the product passes the limit (before: 5,000 tables, 3.4 s)
    distinct = _scenario([_client(f"c{i}", up=1e5 * (1 + i)) for i in range(5000)])
    with pytest.raises(ConfigError, match=r"over 5,000 clients would check more than [0-9,]+ assignments"):
        exhaustive(distinct)
    assert len(calls) <= 1 + math.ceil(math.log(2e6) / math.log(2))


@settings(max_examples=40)
@given(counts=st.lists(st.integers(1, 3000), min_size=1, max_size=3), limit=st.sampled_from([1, 50, 5000]))
def test_exhaustive_solves_or_refuses_any_fleet_cheaply(counts: list[int], limit: int) -> None:
    from splitfed.optimizer import classes as opt_classes
    from splitfed.profile import parse_fleet

    sc = Scenario.from_fleet(PROF, parse_fleet(_kinds_fleet(counts), "f.toml"), tiers=3)
    calls: list[int] = []
    real = opt_classes.option_table

    def counted(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real(*a, **k)

    sizes = [int(option_table(sc, sc.clients[sum(counts[:j])]).fits_device.sum()) for j in range(len(counts))]
    total = math.prod(m**n for m, n in zip(sizes, counts, strict=True))
    with mock.patch.object(opt_classes, "option_table", counted):
        try:
            sol = exhaustive(sc, limit=limit)
        except ConfigError as e:
            assert total > limit and "\n" not in str(e) and f"(limit {limit:,})" in str(e)
            assert len(calls) <= len(counts)
            return
    assert total <= limit and sol.cost.feasible and len(calls) == len(counts)


def test_memory_in_refusals_keeps_three_significant_figures() -> None:
    # before: .1f: "its memory is 0.0 MiB ... needs 0.0 MiB", and 0.25 MiB read "0.2 MiB"
    tiny = _scenario([_client("tiny", memory=0.005 * 2**20)])
    for fn in (solve, exhaustive, greedy):
        with pytest.raises(ConfigError, match=r"device 'tiny' cannot train .*: its memory is 0\.005 MiB and the "
                                              r"smallest device share needs 0\.[0-9]{3} MiB|[0-9.]+ bytes"):
            fn(tiny)
    quarter = _scenario([_client("q", memory=0.25 * 2**20)])
    with pytest.raises(ConfigError, match=r"do not fit device 'q': they need [0-9.]+ MiB of its 0\.25 MiB$"):
        static(quarter, (4, 4))
    with pytest.raises(ConfigError, match=r"the server tiers \(edge 0\.25 MiB, cloud 0\.5 MiB\)"):
        solve(_scenario([_client("a", memory=2**20)], edge_mem=0.25 * 2**20, cloud_mem=0.5 * 2**20), method="direct")


@settings(max_examples=200)
@given(st.floats(0, 1e18, allow_nan=False))
@example(1000.0)  # .3g made "1e+03 bytes" of it (found by this property on a later run)
@example(1023.9)
@example(99.5)  # .0f from 99.5 up made "100 bytes" of it, 0.5% off (found by this property under -n 4)
def test_mib_text_keeps_three_significant_figures(nbytes: float) -> None:
    from splitfed.units import mib_text

    text = mib_text(nbytes)
    number, unit = text.replace(",", "").split(" ")
    back = float(number) * {"MiB": 2**20, "bytes": 1}[unit]
    assert back == pytest.approx(nbytes, rel=5e-3, abs=5e-3)  # 3 significant figures (or more)
    assert (float(number) > 0) == (nbytes > 0)  # never "0.0 MiB" for a device that has memory
    assert "e" not in number or unit == "bytes" and nbytes < 1e-3


def test_time_limit_is_one_budget_for_the_whole_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    # before: each MILP got max(0.1, what was left): past the deadline every further MILP ran 0.1 s more
    from types import SimpleNamespace

    from splitfed.optimizer import clock as opt_clock
    from splitfed.optimizer import solver as opt_solver

    sc = Scenario(PROF, tuple(_client(f"c{i}", flops=1e9 * (3 + i), up=1e6 * (1 + i)) for i in range(12)),
                  (TierProfile(3e10, 2**34), TierProfile(9e10, 2**35)), (LinkProfile(1e7, 1e7, 0.02),), batch=32)
    assert ", 10 MILP(s), " in solve(sc).note  # a bisection of several steps
    clock = [0.0]  # the solver's clock: every MILP takes 0.08 s of it, nothing else does
    monkeypatch.setattr(opt_clock, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    runs: list[tuple[float, float]] = []
    real = opt_solver.milp

    def slow(*a, options, **k):  # noqa: ANN002, ANN003, ANN202
        runs.append((clock[0], options["time_limit"]))
        clock[0] += 0.08
        return real(*a, options=options, **k)

    monkeypatch.setattr(opt_solver, "milp", slow)
    budget = 0.3
    try:
        sol = solve(sc, time_limit=budget)
        assert not sol.optimal  # the best found so far, said to be unproven
    except ConfigError as e:
        assert "time limit ran out before the MILP found any assignment" in str(e)
    assert len(runs) == 4 and all(start + limit == pytest.approx(budget) for start, limit in runs), runs


def test_a_time_limit_spent_before_any_answer_is_said_so() -> None:
    # before: each MILP still ran 0.1 s; with none allowed the refusal would have blamed server memory
    sc = _scenario([_client(f"c{i}", up=1e5 * (1 + i)) for i in range(8)])
    with pytest.raises(ConfigError, match=r"^the time limit ran out before the MILP found any assignment for the 8 "
                                          r"clients of synthetic: raise it \(--time-limit\), or price a policy that "
                                          r"needs no MILP: --greedy, --best-static$"):
        solve(sc, time_limit=1e-9)


def test_gap_and_time_limit_are_reported() -> None:
    sc = _scenario([_client(f"c{i}", up=1e5 * (1 + i)) for i in range(8)])
    sol = solve(sc)
    assert sol.optimal and sol.gap <= 1e-5 and sol.solve_s > 0
    assert sol.to_dict()["makespan_s"] == sol.makespan_s
    assert math.isfinite(sol.makespan_s)


# ---------------------------------------------------------------- CLI

FLEET = """
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "phone"
profile = "phone-mid"
count = 2
[[device]]
name = "pi"
profile = "rpi4"
samples = 200
"""


@pytest.fixture()
def fleet_file(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "fleet.toml"
    p.write_text(FLEET)
    return str(p)


def test_optimize_command_json(fleet_file: str, capsys) -> None:  # noqa: ANN001
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["makespan_s"] > 0 and out["feasible"]
    assert [c["name"] for c in out["clients"]] == ["phone-0", "phone-1", "pi"]
    assert all(len(c["cuts"]) == 2 and c["time_s"] > 0 for c in out["clients"])
    assert max(c["time_s"] for c in out["clients"]) <= out["makespan_s"]
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file]) == 0  # the table's device memory, in JSON too
    table = capsys.readouterr().out
    assert all(mib_text(c["device_memory_bytes"]) in table for c in out["clients"]), table
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--exhaustive", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan_s"] == pytest.approx(out["makespan_s"], rel=1e-5)


def test_optimize_command_table_and_policies(fleet_file: str, capsys) -> None:  # noqa: ANN001
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--tiers", "2", "--static", "3"]) == 0
    out = capsys.readouterr().out
    assert "phone-0" in out and "makespan" in out and "static 3" in out
    for flag in ("--greedy", "--best-static", "--all-on-server"):
        assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, flag]) == 0
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--u-shape", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["clients"][0]["cuts"].__len__() == 3


def test_optimize_command_errors(fleet_file: str, tmp_path, capsys) -> None:  # noqa: ANN001
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--static", "1,2,3"]) == 2
    assert "3 tiers need 2 cut(s)" in capsys.readouterr().err
    for typo in ("3,,5", "3,5,", ","):  # a number left out (before: "3,,5" ran as 3,5)
        with pytest.raises(SystemExit) as stop:
            main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--static", typo])
        assert stop.value.code == 2 and "expected comma-separated integers" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text(FLEET + "colour = 'red'\n")
    assert main(["optimize", "--model", "cnn", "--fleet", str(bad)]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(FLEET.replace('samples = 200', 'samples = 200\nmemory_mb = 0.001'))
    assert main(["optimize", "--model", "cnn", "--fleet", str(tiny)]) == 2
    assert "device 'pi' cannot train any legal cut" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "nan", "0", "inf", "-inf"])
def test_optimize_refuses_a_time_limit_that_is_not_a_positive_number(fleet_file: str, capsys, value: str) -> None:  # noqa: ANN001
    # before: -1, nan and 0 were taken silently (and run as 0.1 s per MILP)
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, f"--time-limit={value}"]) == 2
    err = capsys.readouterr().err.strip()
    refusal = f"--time-limit must be a finite number of seconds > 0, got {float(value)}"  # a message, not a timing
    assert err.count("\n") == 0 and refusal in err


def test_optimize_table_prints_device_memory_to_three_figures(fleet_file: str, capsys) -> None:  # noqa: ANN001
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--all-on-server"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith(("phone-0", "pi "))]
    assert len(rows) == 2 and all(r.endswith((" MiB", " bytes")) for r in rows), rows


def test_shipped_reference_fleet_solves() -> None:
    from splitfed.profile import load_fleet

    f = load_fleet("reference")
    sc = Scenario.from_fleet(PROF, f, tiers=3, batch=32)
    sol = solve(sc)
    assert sol.cost.feasible and len(sol.assignment) == len(f.clients)
    assert sol.makespan_s <= best_static(sc).makespan_s


# ---------------------------------------------------------------- variants


def test_sflv2_one_segment_at_a_time_lets_small_servers_serve_a_large_fleet() -> None:
    # the devices must send blocks 2-3 (~3.8 MB each) to a server; 300 sflv1 replicas do not fit
    # 2 x 0.5 GB, but sflv2 trains the clients in turn: a server holds one client's segment at a time
    clients = [_client(f"c{i}", memory=4e6, up=1e7) for i in range(300)]
    v1 = _scenario(clients, edge_mem=0.5e9, cloud_mem=0.5e9)
    with pytest.raises(ConfigError, match="cannot hold the segments of all 300 clients"):
        solve(v1)
    v2 = replace(v1, mode="sflv2")
    sol = solve(v2)
    assert _within_memory(v2, sol.assignment) and sol.cost.mode == "sflv2"
    assert max(sol.cost.shared_memory.values()) < 10e6
    # the 300 clients train in turn: the round is the sum of their times
    assert sol.makespan_s == pytest.approx(sum(sol.cost.times().values()))
    assert sol.cost.bottleneck == "clients in turn"
    assert sol.makespan_s <= best_static(v2).makespan_s


def test_sflv2_memory_binds_one_client_at_a_time_exactly() -> None:
    # servers too small for the whole model: an option fits only if it fits them on its own (the clients'
    # segments are never on a server together, so no union of their blocks is held)
    clients = [_client("a", flops=1e9, up=1e5, samples=50), _client("b", flops=5e10, up=5e6, samples=80),
               _client("c", flops=3e9, up=1e6, samples=60)]
    sc = replace(_scenario(clients, edge_mem=4.7e6, cloud_mem=2.5e6), mode="sflv2")
    truth = exhaustive(sc)
    assert solve(sc).note.startswith("sflv2 sequential")
    for method in ("auto", "bisect", "direct"):
        got = solve(sc, gap=0.0, method=method)
        assert got.makespan_s == truth.makespan_s
        assert _within_memory(sc, got.assignment)
    assert truth.makespan_s == exhaustive(replace(sc, mode="sl")).makespan_s  # priced as sl is


def test_sl_sequential_is_exact_on_a_large_fleet() -> None:
    kinds = [dict(flops=4e9, up=2.5e5), dict(flops=60e9, up=6e6), dict(flops=8e9, up=1e6, samples=300)]
    sc = replace(_scenario([_client(f"k{i % 3}-{i}", **kinds[i % 3]) for i in range(600)]), mode="sl")
    fast = solve(sc)
    assert "sl sequential" in fast.note and fast.cost.bottleneck == "clients in turn"
    assert fast.makespan_s == pytest.approx(solve(sc, method="bisect").makespan_s, rel=1e-9)
    assert fast.makespan_s == greedy(sc).makespan_s  # each client alone picks its fastest: optimal in sl
    with pytest.raises(ConfigError, match="sequential is exact for modes sl and sflv2 only"):
        solve(replace(sc, mode="sflv1"), method="sequential")


# ---------------------------------------------------------------- ties: least move cost


def _brute_ties(sc: Scenario, prefer: dict) -> tuple[float, float]:
    """(optimal makespan, least total move cost among the assignments within 1e-9 of it), by enumeration."""
    from splitfed.cost import move_cost
    from tests.plan_fixtures import every_plan

    results = [(m, math.fsum(move_cost(sc, c, prefer[c.name], a[c.name]) for c in sc.clients))
               for a, m in every_plan(sc)]
    best = min(m for m, _ in results)
    return best, min(mv for m, mv in results if m <= best * (1 + 1e-9))


@settings(max_examples=30)
@given(st.data())
def test_prefer_returns_an_optimum_of_least_move_cost(data: st.DataObject) -> None:
    mode = data.draw(st.sampled_from(["sflv1", "sflv2", "sl"]))
    sc = data.draw(instances(mode))
    if len(sc.options) ** len(sc.clients) > 250:  # brute force prices every assignment with the cost model
        sc = sc.with_clients(sc.clients[:max(1, int(math.log(250) / math.log(len(sc.options))))])
    prefer = {c.name: tuple(int(x) for x in sc.options[data.draw(st.integers(0, len(sc.options) - 1))])
              for c in sc.clients}
    try:
        best, least = _brute_ties(sc, prefer)
    except ValueError:  # nothing fits
        return
    got = solve(sc, gap=0.0, prefer=prefer)
    assert got.makespan_s <= best * (1 + 1e-9)
    from splitfed.cost import move_cost

    moved = math.fsum(move_cost(sc, c, prefer[c.name], got.assignment[c.name]) for c in sc.clients)
    assert moved <= least * (1 + 1e-6) + 1e-12
    event(f"{mode}: {'keeps' if got.assignment == prefer else 'moves'}")


def test_prefer_keeps_optimal_current_cuts() -> None:
    # a straggler on a 10 kB/s uplink sets the makespan whatever the others do: many assignments tie
    clients = [_client("straggler", flops=1e9, up=1e4), *(_client(f"f{i}", flops=5e10, up=1e7) for i in range(4))]
    sc = _scenario(clients)
    plain = solve(sc)
    current = dict(plain.assignment)
    for c in clients[1:]:  # another cut for every fast client: slower for it, but not the slowest
        t = option_table(sc, c)
        ok = (t.round_s < 0.5 * plain.makespan_s) & t.fits_device
        current[c.name] = next(tuple(int(x) for x in o) for o in t.options[ok] if tuple(o) != plain.assignment[c.name])
    assert evaluate(sc, current).makespan_s == plain.makespan_s
    kept = solve(sc, prefer=current)
    assert kept.assignment == current and kept.makespan_s == plain.makespan_s
    # the straggler's cut is not optimal: it alone moves, the others keep theirs
    worse = {**current, "straggler": (0, 0)}  # raw data over its 10 kB/s uplink
    assert evaluate(sc, worse).makespan_s > plain.makespan_s
    moved = solve(sc, prefer=worse)
    assert moved.makespan_s == plain.makespan_s
    assert {n for n in worse if moved.assignment[n] != worse[n]} == {"straggler"}


def test_optimize_exits_1_when_the_priced_policy_overflows_a_server(fleet_file: str, tmp_path, capsys) -> None:  # noqa: ANN001
    # before: the table ended with an "INFEASIBLE:" line and the command exited 0, so a script took it as a plan
    small_edge = tmp_path / "small_edge.toml"
    small_edge.write_text(FLEET.replace('profile = "edge-server"', 'profile = "edge-server"\nmemory_mb = 1', 1))
    assert main(["optimize", "--model", "cnn", "--fleet", str(small_edge), "--tiers", "2", "--all-on-server"]) == 1
    out, err = capsys.readouterr()
    assert "INFEASIBLE: edge memory" in out and "makespan" in out  # the priced result is still shown
    assert err.count("\n") == 1 and "all-on-server does not fit: edge memory" in err
    assert main(["optimize", "--model", "cnn", "--fleet", str(small_edge), "--tiers", "2", "--all-on-server",
                 "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["feasible"] is False


def test_optimize_with_two_tiers_says_the_fleets_cloud_is_not_used(fleet_file: str, capsys) -> None:  # noqa: ANN001
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--tiers", "2"]) == 0
    assert "(the fleet's [cloud] is not used)" in capsys.readouterr().out.splitlines()[0]
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--tiers", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cloud_unused"] is True
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cloud_unused"] is False


def test_optimize_names_its_codec_flag_when_the_codecs_do_not_fit_the_chain(fleet_file: str, capsys) -> None:  # noqa: ANN001
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--tiers", "2", "--compress", "none,int8"]) == 2
    assert "--compress 'none,int8': 2 tiers have 1 link(s): give one codec" in capsys.readouterr().err
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--compress", "none,int8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan_s"] > 0
