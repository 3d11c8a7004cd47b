"""The segment-optimizer benchmark (benchmarks/optimizer.py), its parts run in this process: tests that run the
script as a subprocess are out of a mutation run's coverage, so nothing there pinned which kind is the
straggler, what each line of the explanation says, how a sweep point is bound, or what the policies' table holds.

Every scenario is a hand-made 3-block profile and a few clients (no model is profiled). The seconds the strings
quote are worked out from the cost model's formulas, e.g. a client of 1e9 FLOP/s with a 1e7 B/s link, 100
samples, batch 10, 10 ms round trip, all on the cloud (cuts 0,0): device->edge up (3e6 + 800) / 1e7 + 10 x 5 ms
= 0.35008 s, down 10 x 5 ms, edge->cloud up (3e6 + 800) / 1e8 + 0.05, down 0.05, cloud compute 2.1e10 / 1e12,
exchange one round trip: 0.561088 s."""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from splitfed.cost import Scenario, client_cost, evaluate
from splitfed.cost.model import RoundCost
from splitfed.optimizer import Solution, best_static, solve
from splitfed.optimizer.compare import by_class
from splitfed.optimizer.explain import _times, explain, largest_part
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from splitfed.profile.fleet import Fleet
from tests.bench_fixtures import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    """The benchmark under a name of its own: ``optimizer`` is also a package of splitfed's, and a bare
    ``import optimizer`` from benchmarks/ would depend on sys.path order and stay in sys.modules."""
    return load_benchmark("optimizer")


bo = _load()

BIG = 1e15  # memory no option fills
# per sample: forward 1e7, 2e7, 4e7 FLOPs (backward twice that: 2.1e8 a sample for the whole model), outputs
# 4e4, 2e4, 1e4 bytes, 1e3 bytes of weights a block, input 3e4 bytes
PROF = ModelProfile.synthetic([1e7, 2e7, 4e7], [4e4, 2e4, 1e4], [1e3, 1e3, 1e3], input_bytes=3e4)
KW: dict = {"tiers": 3, "batch": 10}
SLOW_ALONE = 0.561088  # the docstring's sum: a slow client all on the cloud
FAST_ALONE = 0.432     # a fast client all on its device: 2.1e10 / 5e10 + 2 x 3e3 / 3e6 + 0.01


def _client(name: str, kind: str, flops: float, up: float, down: float | None = None, memory: float = BIG,
            rtt: float = 0.01) -> Client:
    return Client(name, kind, TierProfile(flops, memory), LinkProfile(up, up if down is None else down, rtt), 100)


def _fleet(clients: tuple[Client, ...], edge_memory: float = BIG, cloud_memory: float = BIG,
           edge_flops: float = 1e11, cloud_flops: float = 1e12, edge_link: LinkProfile | None = None) -> Fleet:
    kinds: dict[str, int] = {}
    for c in clients:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    return Fleet("t", TierProfile(edge_flops, edge_memory), clients, TierProfile(cloud_flops, cloud_memory),
                 edge_link or LinkProfile(1e8, 1e8, 0.01), kinds=kinds)


def _mixed(**kw: Any) -> Fleet:
    """Two fast devices behind a slow link (best all on the device) and two slow ones behind a fast link (best
    all on the cloud): no single cut suits both."""
    return _fleet((_client("fast-0", "fast", 5e10, 3e6), _client("fast-1", "fast", 5e10, 3e6),
                   _client("slow-0", "slow", 1e9, 1e7), _client("slow-1", "slow", 1e9, 1e7)), **kw)


def _slow_only(n: int) -> Fleet:
    """Slow-ish devices (2.5e10 FLOP/s) whose servers hold two clients' replicas all on the cloud at most (a
    replica of all three blocks is 1,009,000 bytes; the cloud holds 2 MiB)."""
    return _fleet(tuple(_client(f"slow-{i}", "slow", 2.5e10, 1e7) for i in range(n)),
                  edge_memory=2.0**22, cloud_memory=2.0**21)


def _sc(fleet: Fleet, **kw: object) -> Scenario:
    return Scenario.from_fleet(PROF, fleet, **KW, **kw)  # type: ignore[arg-type]


def _cost(sc: Scenario, cuts: dict[str, tuple[int, int]]) -> RoundCost:
    return evaluate(sc, cuts)


# ---------------------------------------------------------------- best alone, straggler class


def test_best_alone_is_each_kinds_fastest_round_at_any_cut() -> None:
    """Each kind's own best: fast all on its device, slow all on the cloud (not the other kind's)."""
    sc = _sc(_mixed())
    assert bo.best_alone(sc, "fast") == (FAST_ALONE, (3, 3))
    assert bo.best_alone(sc, "slow") == (SLOW_ALONE, (0, 0))


def test_best_alone_skips_cuts_its_device_cannot_hold() -> None:
    """A fast device (3,3 alone: 2.1e10 / 5e10 + 2 x 3e3 / 1e7 + 0.01 = 0.4306 s) that holds no block (300,000
    bytes: its input batch only) is best all on the cloud instead, at 0.561088 s."""
    sc = _sc(_fleet((_client("a", "a", 5e10, 1e7, memory=3e5),)))
    unfit = client_cost(sc, "a", (3, 3))
    assert not unfit.fits_device and unfit.round_s == pytest.approx(0.4306, rel=1e-12)
    assert bo.best_alone(sc, "a") == (SLOW_ALONE, (0, 0))
    roomy = _sc(_fleet((_client("a", "a", 5e10, 1e7),)))
    assert bo.best_alone(roomy, "a") == (pytest.approx(0.4306, rel=1e-12), (3, 3))


def test_best_alone_is_the_slowest_client_of_the_kind() -> None:
    """Two clients of one kind, the second with twice the samples: the kind's best alone is the second's (the
    benchmark took the first client of a kind, which is not its straggler here), whichever comes first."""
    one = _client("a-0", "a", 1e9, 1e7)
    two = dataclasses.replace(_client("a-1", "a", 1e9, 1e7), samples=200)
    doubled = bo.best_alone(_sc(_fleet((two,))), "a")
    assert doubled[0] > SLOW_ALONE
    assert bo.best_alone(_sc(_fleet((one, two))), "a") == doubled
    assert bo.best_alone(_sc(_fleet((two, one))), "a") == doubled
    assert bo.best_alone(_sc(_fleet((one, dataclasses.replace(one, name="a-2")))), "a") == (SLOW_ALONE, (0, 0))


def test_straggler_class_is_the_kind_slowest_at_its_best() -> None:
    """slow (0.561 s at 0,0) over fast (0.432 s at 3,3): by time, not by the cuts (3,3 sorts last)."""
    assert bo.straggler_class(_sc(_mixed())) == "slow"
    # the fast kind straggles once its link is slow enough that even its exchange costs more
    slow_link = _fleet((_client("f", "fast", 5e10, 1e3), _client("s", "slow", 1e9, 1e7)))
    assert bo.straggler_class(_sc(slow_link)) == "fast"


# ---------------------------------------------------------------- the largest part of a client's round

DECOY = _client("decoy", "d", 5e10, 1e9)  # first in the fleet: its costs are not the ones asked for

PARTS = [
    ("device compute", _client("x", "k", 1e9, 1e7), {}, (3, 3),
     "device compute at 1 GFLOP/s is 21.0 s of its 21.0 s"),
    ("device up", _client("x", "k", 1e9, 1e7), {}, (0, 0),
     "device->edge up at 80 Mbit/s is 0.4 s of its 0.6 s"),
    # the gradient of 4e4 bytes x 100 samples at 1.25e5 B/s, + 10 x 5 ms
    ("device down", _client("x", "k", 5e10, 1e8, 1.25e5), {}, (1, 1),
     "device->edge down at 1 Mbit/s is 32.0 s of its 32.4 s"),
    ("edge compute", _client("x", "k", 5e10, 1e8), {"edge_flops": 1e9}, (0, 3),
     "edge compute is 21.0 s of its 21.1 s"),
    ("cloud compute", _client("x", "k", 5e10, 1e8), {"cloud_flops": 1e9}, (0, 0),
     "cloud compute is 21.0 s of its 21.3 s"),
    ("edge up", _client("x", "k", 5e10, 1e8), {"edge_link": LinkProfile(1e5, 1e8, 0.01)}, (0, 0),
     "edge->cloud up is 30.1 s of its 30.3 s"),
    ("edge down", _client("x", "k", 5e10, 1e8), {"edge_link": LinkProfile(1e8, 1e5, 0.01)}, (1, 1),
     "edge->cloud down is 40.0 s of its 40.4 s"),
    # 3e3 bytes of weights down and up at 1e3 B/s, + 0.01 s
    ("exchange", _client("x", "k", 5e10, 1e3), {}, (3, 3), "weight exchange is 6.0 s of its 6.4 s"),
]


@pytest.mark.parametrize(("client", "fleet_kw", "cuts", "want"), [p[1:] for p in PARTS], ids=[p[0] for p in PARTS])
def test_largest_part_names_the_part_and_the_devices_speed(client: Client, fleet_kw: dict,
                                                           cuts: tuple[int, int], want: str) -> None:
    sc = _sc(_fleet((DECOY, client), **fleet_kw))
    cost = _cost(sc, {"decoy": (0, 0), "x": cuts})
    assert largest_part(sc, cost, "x") == want


# ---------------------------------------------------------------- explain: its four kinds of line

STRAGGLER = ("straggler-bound: a slow client needs 0.6 s even alone at its best cuts 0,0 (device->edge up at "
             "80 Mbit/s is 0.4 s of its 0.6 s); no policy can be faster")


def test_explain_straggler_bound_when_the_makespan_is_the_stragglers_best() -> None:
    sc = _sc(_mixed())
    cost = _cost(sc, {"fast-0": (3, 3), "fast-1": (3, 3), "slow-0": (0, 0), "slow-1": (0, 0)})
    assert (cost.makespan_s, cost.bottleneck) == (SLOW_ALONE, "client slow-0")
    assert explain(sc, cost) == STRAGGLER


def test_explain_allows_a_rounding_of_1e9_relative_and_no_more() -> None:
    """0.5e-9 over the best alone, or 1e-9 to the last bit, is still the straggler's own time; 1.5e-9 over is a
    client held back."""
    sc = _sc(_mixed())
    cost = _cost(sc, {"fast-0": (3, 3), "fast-1": (3, 3), "slow-0": (0, 0), "slow-1": (0, 0)})
    for over in (0.5e-9, 1e-9):
        assert explain(sc, dataclasses.replace(cost, makespan_s=SLOW_ALONE * (1 + over))) == STRAGGLER
    held = explain(sc, dataclasses.replace(cost, makespan_s=SLOW_ALONE * (1 + 1.5e-9)))
    assert held.startswith("client-bound: slow-0 (slow) at 0,0 takes 0.6 s, 1.0x its 0.6 s alone, because")


def test_explain_client_bound_by_the_busiest_shared_resource() -> None:
    """All at 0,3: fast-0 needs (3e6 + 800) / 3e6 + 0.05 = 1.05 s up, 0.05 down, 0.21 on the edge, 0.012 exchange
    = 1.3202667 s, 3.06x its 0.432 s; the edge computes 4 x 0.21 = 0.84 s; memory is far from full."""
    sc = _sc(_mixed(edge_memory=2.0**30, cloud_memory=2.0**30))
    cost = _cost(sc, dict.fromkeys(("fast-0", "fast-1", "slow-0", "slow-1"), (0, 3)))
    assert explain(sc, cost) == (
        "client-bound: fast-0 (fast) at 0,3 takes 1.3 s, 3.1x its 0.4 s alone, because its faster cuts would put "
        "more on the shared servers: busiest shared resource edge compute at 0.8 s; device->edge up at 24 Mbit/s "
        "is 1.1 s of its 1.3 s")


def test_explain_client_bound_by_server_memory_one_replica_per_client() -> None:
    """Two replicas all on the cloud fill it (2,018,000 of 2 MiB: 96%), so two clients compute on the edge
    (0,3: 0.62008 s, 1.1x their 0.561 s alone): what the optimizer does here."""
    sc = _sc(_slow_only(4))
    cost = _cost(sc, {"slow-0": (0, 0), "slow-1": (0, 0), "slow-2": (0, 3), "slow-3": (0, 3)})
    assert cost.shared_memory == {"edge": 2_618_000.0, "cloud": 2_018_000.0}
    assert explain(sc, cost) == (
        "client-bound: slow-2 (slow) at 0,3 takes 0.6 s, 1.1x its 0.6 s alone, because its faster cuts would put "
        "more on the shared servers: the servers' memory is edge 62% full, cloud 96% full (one replica per "
        "client); device->edge up at 80 Mbit/s is 0.4 s of its 0.6 s")
    # exactly 90% full is not "full": the busiest resource is named instead
    at_90 = dataclasses.replace(cost, shared_memory={"edge": 0.9 * 2.0**22, "cloud": 0.0})
    assert "busiest shared resource edge compute at 0.4 s; " in explain(sc, at_90)


def test_explain_client_bound_by_server_memory_one_client_at_a_time() -> None:
    """sl, one client at 0,3 (its best is 0,0): the edge holds its 1,009,000 bytes of 1 MiB (96%)."""
    sc = _sc(_fleet((_client("solo", "slow", 2.5e10, 1e7),), edge_memory=2.0**20, cloud_memory=2.0**20),
             mode="sl")
    cost = _cost(sc, {"solo": (0, 3)})
    assert explain(sc, cost) == (
        "client-bound: solo (slow) at 0,3 takes 0.6 s, 1.1x its 0.6 s alone, because its faster cuts would put "
        "more on the shared servers: the servers' memory is edge 96% full, cloud 0% full (one client at a time); "
        "device->edge up at 80 Mbit/s is 0.4 s of its 0.6 s")


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_explain_clients_in_turn_adds_up_their_rounds(mode: str) -> None:
    """2 x 0.432 + 2 x 0.561088 = 1.986 s; one client at a time: the edge holds one input batch (3e5 of
    4 MiB), the cloud one replica (1,012,000 of 2 MiB)."""
    sc = _sc(_mixed(edge_memory=2.0**22, cloud_memory=2.0**21), mode=mode)
    cost = _cost(sc, {"fast-0": (3, 3), "fast-1": (3, 3), "slow-0": (0, 0), "slow-1": (0, 0)})
    assert cost.bottleneck == "clients in turn"
    assert explain(sc, cost) == ("clients in turn: the 4 clients' rounds add up to 2.0 s; cuts shorten each "
                                    "client's own round (memory: edge 7% full, cloud 48% full)")


def test_explain_shared_resource_bound() -> None:
    """A cloud of 2e9 FLOP/s computing four whole models: 4 x 2.1e10 / 2e9 = 42 s, past every client's round."""
    sc = _sc(_mixed(cloud_flops=2e9, edge_memory=2.0**22, cloud_memory=2.0**23))
    cost = _cost(sc, dict.fromkeys(("fast-0", "fast-1", "slow-0", "slow-1"), (0, 0)))
    assert explain(sc, cost) == (
        "shared-resource-bound: cloud compute is busy 42.0 s with 4 clients' work; cuts trade it against the "
        "devices and other tiers (memory: edge 29% full, cloud 48% full)")


def test_explain_reads_a_server_of_no_memory_and_an_unbounded_one() -> None:
    """A cloud of memory 0 that holds nothing is empty (a ratio of 0/0 raised ZeroDivisionError where
    ``splitfed optimize`` explains a user's fleet), one that holds something is over full, and an unbounded edge
    never fills."""
    sc = _sc(_mixed(edge_memory=float("inf"), cloud_memory=0.0, cloud_flops=2e9))
    cost = _cost(sc, dict.fromkeys(("fast-0", "fast-1", "slow-0", "slow-1"), (3, 3)))
    assert cost.shared_memory == {"edge": 0.0, "cloud": 0.0}
    assert explain(sc, dataclasses.replace(cost, bottleneck="edge compute")).endswith(
        "(memory: edge 0% full, cloud 0% full)")
    held = dataclasses.replace(cost, shared_memory={"edge": 5.0, "cloud": 1.0}, bottleneck="client slow-0",
                               makespan_s=SLOW_ALONE * 2)
    assert "the servers' memory is edge 0% full, cloud inf% full (one replica per client)" in explain(sc, held)


def test_times_alone_says_how_many_times_and_infx_for_a_client_of_no_work() -> None:
    """A client whose best round alone is 0 s (no work) would divide by zero in the client-bound line."""
    assert _times(2.6, 1.3) == "2.0x"
    assert _times(1.3, 0.0) == "infx"
    assert _times(0.0, 0.0) == "infx"


# ---------------------------------------------------------------- table cells, cuts by class


def test_by_class_counts_each_kinds_cuts_in_client_order() -> None:
    sc = _sc(_mixed())
    cost = _cost(sc, {"fast-0": (3, 3), "fast-1": (3, 3), "slow-0": (0, 0), "slow-1": (0, 3)})
    got = by_class(sc, Solution("hand", cost, 0.0, False))
    assert got == {"fast": {"3,3": 2}, "slow": {"0,0": 1, "0,3": 1}}
    assert list(got) == ["fast", "slow"] and list(got["slow"]) == ["0,0", "0,3"]


def test_cell_and_yes() -> None:
    assert bo._cell({"makespan_s": None}) == " " * 15 + "n/a"
    assert bo._cell({"makespan_s": 12.345, "ratio_vs_optimizer": 2.5, "feasible": True}) == "    12.35 ( 2.50x) "
    assert bo._cell({"makespan_s": 0.5, "ratio_vs_optimizer": 0.25, "feasible": False}) == "     0.50 ( 0.25x)!"
    assert [bo._yes(v) for v in (True, False, None)] == ["yes", "NO", "n/a"]


# ---------------------------------------------------------------- distinct, without


def test_distinct_nudges_each_clients_flops_and_keeps_the_problem() -> None:
    """Client i at flops x (1 + i x 1e-9): no two share a class (the solver sees 4, not 2), the makespan is
    the same within 1e-6."""
    fleet = _mixed(cloud_flops=2e9)
    got = bo.distinct(fleet)
    assert [c.device.flops for c in got.clients] == [5e10, 5e10 * (1 + 1e-9), 1e9 * (1 + 2e-9), 1e9 * (1 + 3e-9)]
    assert [dataclasses.replace(c, device=o.device) for c, o in zip(got.clients, fleet.clients, strict=True)] \
        == list(fleet.clients)
    assert [c.device.memory for c in got.clients] == [BIG] * 4
    assert (got.name, got.kinds, got.edge, got.cloud) == (fleet.name, fleet.kinds, fleet.edge, fleet.cloud)
    same, apart = solve(_sc(fleet)), solve(_sc(got))
    assert " 2 class(es)" in same.note and " 4 class(es)" in apart.note
    assert apart.makespan_s == pytest.approx(same.makespan_s, rel=1e-6)


def test_without_drops_a_kinds_clients_and_its_count() -> None:
    fleet = _mixed()
    got = bo.without(fleet, "fast")
    assert [c.name for c in got.clients] == ["slow-0", "slow-1"]
    assert dict(got.kinds) == {"slow": 2}
    assert len(fleet.clients) == 4 and dict(fleet.kinds) == {"fast": 2, "slow": 2}  # the fleet itself kept


# ---------------------------------------------------------------- the contention sweep


def test_sweep_records_each_size_and_what_bounds_it() -> None:
    """1 client: the optimizer is its best alone (straggler); 4: the two kinds apart, 0.561 s against the best
    static 0,0 (the fast devices' slow links: 1.261 s); 40: the servers' work sets the makespan (shared): each of
    the 4 devices dealt 10 times, the 20 slow clients at 0,0 send their 100 samples' inputs and labels (3e6 + 800
    bytes) up the edge->cloud link (1e8 B/s), 20 x 3,000,800 / 1e8 = 0.60016 s, over their own 0.561 s."""
    fleet = _mixed()
    got = bo.sweep(PROF, fleet, [1, 4, 40], KW)
    assert [(p["clients"], p["bound"], p["best_static_cuts"]) for p in got] == \
        [(1, "straggler", [0, 0]), (4, "straggler", [0, 0]), (40, "shared", [0, 0])]
    for p in got:
        sc = _sc(fleet.sample(p["clients"], seed=0))
        opt, static = solve(sc), best_static(sc)
        assert p["optimizer_s"] == pytest.approx(opt.makespan_s, rel=1e-12)
        assert p["best_static_s"] == pytest.approx(static.makespan_s, rel=1e-12)
        assert p["ratio"] == pytest.approx(static.makespan_s / opt.makespan_s, rel=1e-12)
        assert set(p) == {"clients", "optimizer_s", "best_static_s", "best_static_cuts", "ratio", "bound"}
    assert got[1]["optimizer_s"] == SLOW_ALONE
    assert got[1]["ratio"] == pytest.approx(1.2612746666666668 / SLOW_ALONE, rel=1e-12)
    assert got[2]["optimizer_s"] == pytest.approx(20 * (3e6 + 800) / 1e8, rel=1e-9)
    assert Counter(c.kind for c in fleet.sample(40, seed=0).clients) == {"fast": 20, "slow": 20}


def test_sweep_client_bound_when_server_memory_holds_it_back() -> None:
    """Four clients, room on the cloud for two: two compute on the edge at 0,3 (0.62008 s, 1.1x their best
    alone), the best static cut is 0,3 for all (the edge computes 4 x 0.21 s = 0.84 s)."""
    got = bo.sweep(PROF, _slow_only(1), [4], KW)
    assert got == [{"clients": 4, "optimizer_s": pytest.approx(0.62008, rel=1e-12),
                    "best_static_s": pytest.approx(0.84, rel=1e-12), "best_static_cuts": [0, 3],
                    "ratio": pytest.approx(0.84 / 0.62008, rel=1e-12), "bound": "client"}]


# ---------------------------------------------------------------- flags


def test_fleet_sizes_reads_sizes_in_range_or_none() -> None:
    assert bo.fleet_sizes("") == ()
    assert bo.fleet_sizes("  ") == ()
    assert bo.fleet_sizes("1,60,100000") == (1, 60, 100_000)
    for bad in ("0", "5,100001", "-3"):
        with pytest.raises(argparse.ArgumentTypeError) as e:
            bo.fleet_sizes(bad)
        assert str(e.value) == f"fleet sizes must lie in 1..100,000, got {bad!r}"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected comma-separated integers, got '1,x'$"):
        bo.fleet_sizes("1,x")


def test_codec_accepts_what_the_transport_reads_and_refuses_the_rest() -> None:
    for ok in ("none", "fp16", "int8", "topk:0.1"):
        assert bo.codec(ok) == ok
    for bad, why in (("junk", "unknown codec 'junk': use none, fp16, int8 or topk:FRACTION"),
                     ("topk:2", "top-k fraction must lie in [0.001, 1] (a receiver builds the dense tensor from "
                                "the values kept: at most 1000 values per value sent), got 2.0")):
        with pytest.raises(argparse.ArgumentTypeError) as e:
            bo.codec(bad)
        assert str(e.value) == why and e.value.__suppress_context__


# ---------------------------------------------------------------- the policies of one case


def test_policies_price_every_policy_and_judge_the_targets() -> None:
    """Best static and all-on-server: 0,0 for all, 1.2613 s (a fast device sends 3e6 bytes at 3e6 B/s), 2.25x
    the optimizer's 0.561 s (above 1.3, below 2.6); greedy is the optimizer here (ratio exactly 1)."""
    sc = _sc(_mixed())
    got = bo.policies(sc)
    assert list(got) == ["optimizer", "best_static", "greedy", "all_on_server", "targets"]
    opt = got["optimizer"]
    assert opt["makespan_s"] == SLOW_ALONE and opt["feasible"] is True and opt["bottleneck"] == "client slow-0"
    assert opt["cuts_by_class"] == {"fast": {"3,3": 2}, "slow": {"0,0": 2}}
    assert opt["explanation"] == STRAGGLER and "ratio_vs_optimizer" not in opt
    static_s = 1.2612746666666668
    for name, method in (("best_static", "best static 0,0"), ("all_on_server", "all-on-server")):
        assert got[name]["makespan_s"] == pytest.approx(static_s, rel=1e-12)
        assert got[name]["ratio_vs_optimizer"] == got[name]["makespan_s"] / SLOW_ALONE
        assert (got[name]["method"], got[name]["feasible"], got[name]["note"]) == (method, True, "")
        assert got[name]["cuts_by_class"] == {"fast": {"0,0": 2}, "slow": {"0,0": 2}}
    assert got["greedy"]["ratio_vs_optimizer"] == 1.0 and got["greedy"]["feasible"] is True
    assert got["greedy"]["cuts_by_class"] == opt["cuts_by_class"]
    assert got["targets"] == {"vs_best_static": True, "not_slower_than_greedy": True}
    assert bo.TARGET == 1.3


def test_policies_below_target_and_a_policy_refused() -> None:
    """Raw data stays (>= 1 block on the device): all-on-server is refused with its reason and no ratio; here
    the best static cut is the optimizer's (ratio 1: below target)."""
    sc = _sc(_fleet((_client("s", "slow", 1e9, 1e7),)), min_device_blocks=1)
    got = bo.policies(sc)
    assert got["all_on_server"] == {"makespan_s": None, "note": "cuts 0,0 keep fewer than 1 leading block(s) on the device",
                                    "ratio_vs_optimizer": None}
    assert got["best_static"]["ratio_vs_optimizer"] == 1.0
    assert got["targets"] == {"vs_best_static": False, "not_slower_than_greedy": True}


def test_policies_no_static_cut_fits_and_greedy_overflows_memory() -> None:
    """Two devices hold only their input (cuts 0,x), the servers hold two clients' replicas: no single cut
    suits all four (refused: no ratio, no verdict) and greedy, blind to sharing, overflows the cloud (priced,
    but no rival: no verdict either)."""
    tiny = tuple(_client(f"tiny-{i}", "tiny", 1e9, 1e7, memory=3.1e5) for i in range(2))
    big = tuple(_client(f"big-{i}", "big", 1e9, 1e7) for i in range(2))
    sc = _sc(_fleet(tiny + big, edge_memory=2.0**21, cloud_memory=2.0**21))
    got = bo.policies(sc)
    assert got["best_static"] == {
        "makespan_s": None, "ratio_vs_optimizer": None,
        "note": "no single cut vector fits every device and server of the fleet for synthetic"}
    assert got["greedy"]["feasible"] is False and got["greedy"]["note"] == "violates: cloud memory 3.85 MiB > 2 MiB"
    assert got["greedy"]["ratio_vs_optimizer"] == SLOW_ALONE / got["optimizer"]["makespan_s"]
    assert got["optimizer"]["feasible"] is True
    assert got["targets"] == {"vs_best_static": None, "not_slower_than_greedy": None}


def test_policies_when_the_optimizer_refuses_keep_the_others_times() -> None:
    """Servers that hold no replica and a device that holds no block: the optimizer refuses (no assignment
    fits); the table kept all-on-server's time (over memory) and had no ratio to divide by, where before
    `m / None` raised a TypeError and the whole benchmark ended in a traceback (found by helper-222)."""
    sc = _sc(_fleet((_client("s", "slow", 1e9, 1e7, memory=3.1e5),), edge_memory=1e3, cloud_memory=1e3))
    got = bo.policies(sc)
    assert got["optimizer"]["makespan_s"] is None
    assert got["optimizer"]["explanation"] == f"no assignment: {got['optimizer']['note']}"
    assert got["optimizer"]["note"].startswith("no assignment fits")
    aos = got["all_on_server"]
    assert aos["makespan_s"] == pytest.approx(SLOW_ALONE) and aos["feasible"] is False
    assert aos["ratio_vs_optimizer"] is None
    assert got["targets"] == {"vs_best_static": None, "not_slower_than_greedy": None}
    assert bo._cell(aos) == "     0.56         !"


def test_solve_times_times_a_solve_and_the_re_solve_from_its_own_answer() -> None:
    """Four slow clients, room on the cloud for two replicas (the sweep case above): the solve from nothing asks
    5 MILPs; the re-solve from its answer (an adaptive round whose beliefs did not change) asks 2 (the tau below
    the answer's is the lower bound: no; then the least load capped at the answer's tau) and keeps its makespan.
    The decision after beliefs moved by up to 2 % asks one: no plan 5 % faster than the cuts in force."""
    sc = _sc(_slow_only(1).sample(4, seed=0))
    got = bo.solve_times(sc)
    assert set(got) == {"solve_s", "makespan_s", "optimal", "gap", "note", "resolve_s", "resolve_makespan_s",
                        "resolve_note", "decide_s", "decide_kept", "decide_note", "decide_unasked_s"}
    noisy = bo.moved(sc)
    current = evaluate(noisy, solve(sc).assignment).makespan_s
    assert noisy != sc and got["decide_kept"] and got["decide_s"] > 0 and got["decide_unasked_s"] > 0
    assert f"is at most {0.95 * current:.6g} s (1 MILP(s)); the preferred cuts' {current:.6g} s kept" in got["decide_note"]
    assert got["makespan_s"] == got["resolve_makespan_s"] == solve(sc).makespan_s == 0.6200800000000001
    assert got["optimal"] and got["solve_s"] > 0 and got["resolve_s"] > 0
    assert ", 5 MILP(s)," in got["note"] and ", 2 MILP(s)," in got["resolve_note"], got


def test_moved_beliefs_stay_within_the_noise_and_keep_identical_devices_alike() -> None:
    """Each distinct device's FLOP/s and uplink move by a factor in [0.98, 1.02], the same for identical devices
    (a classes fleet stays one of classes), seeded; nothing else moves."""
    sc = _sc(_slow_only(1).sample(4, seed=0))
    sc = dataclasses.replace(sc, clients=(*sc.clients, dataclasses.replace(
        sc.clients[0], name="other", device=dataclasses.replace(sc.clients[0].device, flops=3e9))))
    got = bo.moved(sc)
    assert got == bo.moved(sc) and got != bo.moved(sc, seed=1)
    for was, now in zip(sc.clients, got.clients, strict=True):
        assert 0.98 <= now.device.flops / was.device.flops <= 1.02 and 0.98 <= now.link.up / was.link.up <= 1.02
        assert (now.device.memory, now.link.down, now.link.rtt) == (was.device.memory, was.link.down, was.link.rtt)
    alike = {(c.device.flops, c.link.up) for c in got.clients[:4]}
    assert len(alike) == 1 and (got.clients[4].device.flops / 3e9) != (got.clients[0].device.flops
                                                                       / sc.clients[0].device.flops)
    assert got.servers == sc.servers and got.profile == sc.profile
