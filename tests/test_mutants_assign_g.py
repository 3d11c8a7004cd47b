"""The optimizer (splitfed/optimizer/), pinned where no fast test reached (seventh list): the smallest
MILP (one row per class, nothing else), ``_sequential`` handing over to bisect (an exact tie of a server's compute
with the clients in turn; too many holder sizes), ``polish`` taking a move a hair faster or lighter (after the MILP
and on rounds handed to it), and the tie search under ``prefer`` keeping a client whose move ships nothing."""

from __future__ import annotations

import math

import pytest

from splitfed.cost import RoundCost, Scenario, evaluate, move_cost, option_table
from splitfed.optimizer import assign, exhaustive, solve
from splitfed.optimizer import classes as opt_classes
from splitfed.optimizer import solver as opt_solver
from splitfed.optimizer import ties as opt_ties
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from tests.plan_fixtures import Plan, every_plan

BIG = 1e15  # memory no option fills
INF = math.inf


def _polish(sc: Scenario, cost: RoundCost, budget: int = 200) -> RoundCost:
    return opt_ties.polish(sc, opt_classes.price_classes(sc), cost, budget)


# ---------------------------------------------------------------- the smallest MILP: the class rows alone


def _rows_of_classes_only() -> Scenario:
    """One block of no work on an edge of unbounded memory: no option loads a shared resource (no load row) and
    no memory row is built, so the MILP holds each class's row sum_o n_o = |class| and nothing else. Its two
    options trade time against edge memory: (0,) ships activations (0.04008 s), (1,) trains at home but exchanges
    1e5 bytes of weights each way (0.21 s)."""
    prof = ModelProfile.synthetic([0.0], [1e3], [1e5], input_bytes=1e3)
    x = Client("x", "x", TierProfile(1e9, BIG), LinkProfile(1e6, 1e6, 0.01), 10)
    return Scenario(prof, (x,), (TierProfile(1e10, INF),), (), batch=5)


@pytest.mark.parametrize("method", ["bisect", "direct"])
def test_a_milp_with_only_its_class_row_finds_the_optimum(method: str) -> None:
    """``run_milp``'s ``else`` (no row at all: a dummy one) is unreachable: every class adds its row unconditionally,
    and a Scenario has at least one client. This is the barest MILP there is; built wrongly (the rows dropped,
    ``if not lo``) HiGHS could put the client nowhere."""
    sc = _rows_of_classes_only()
    t = option_table(sc, sc.clients[0])
    assert t.round_s.tolist() == [0.040080000000000005, 0.21000000000000002]
    assert t.shared_load.tolist() == [[0.0], [0.0]] and t.memory[:, 1].tolist() == [310000.0, 0.0]
    got = solve(sc, method=method)
    assert got.assignment == {"x": (0,)} == exhaustive(sc).assignment
    assert got.makespan_s == 0.040080000000000005
    assert got.note.startswith(f"sflv1 {method}: 1 class(es), 2 non-dominated option(s), 1 MILP(s)")


# ---------------------------------------------------------------- sequential hands over to bisect


def _edge_ties_the_turns(mode: str, rtt: float) -> Scenario:
    """Two clients (1 and 2 samples) of one block of 3 FLOPs a sample; nothing crosses a link that costs time
    (no bytes but labels, links of infinite bandwidth) and, with ``rtt`` 0, no latency either. On the edge (3
    FLOP/s, the fastest: 1 s and 2 s) a client's round is its edge compute alone, so the edge's busy time (3 s)
    equals the clients' rounds in turn exactly; the cost model names the first resource to reach the makespan,
    the edge. With ``rtt`` 0.5 each round adds its latency and the turns (5.5 s) are the bottleneck."""
    prof = ModelProfile.synthetic([1.0], [0.0], [0.0], input_bytes=0.0)
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(1.0, BIG), LinkProfile(INF, INF, rtt), s)
                    for i, s in enumerate((1, 2)))
    return Scenario(prof, clients, (TierProfile(3.0, BIG), TierProfile(1.0, BIG)), (LinkProfile(INF, INF, 0.0),),
                    batch=1, mode=mode)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_the_fixture_s_fastest_cuts_tie_the_edge_with_the_turns(mode: str) -> None:
    sc = _edge_ties_the_turns(mode, 0.0)
    assert sc.resource_names[-1] == "clients in turn" and sc.resource_names[1] == "cloud compute"
    t0, t1 = (option_table(sc, c) for c in sc.clients)
    assert t0.options.tolist() == [[0, 0], [0, 1], [1, 1]]
    assert t0.round_s.tolist() == [3.0, 1.0, 3.0] and t1.round_s.tolist() == [6.0, 2.0, 6.0]
    fastest = evaluate(sc, {"c0": (0, 1), "c1": (0, 1)})
    assert fastest.bottleneck == "edge compute" and fastest.makespan_s == 3.0
    assert fastest.shared_s["edge compute"] == fastest.shared_s["clients in turn"] == 3.0
    slower = evaluate(_edge_ties_the_turns(mode, 0.5), {"c0": (0, 1), "c1": (0, 1)})
    assert slower.bottleneck == "clients in turn" and slower.makespan_s == 5.5


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
@pytest.mark.parametrize(("rtt", "best", "note"), [
    (0.0, 3.0, "bisect: 2 class(es), 4 non-dominated option(s), 4 MILP(s)"),
    (0.5, 5.5, "sequential: 2 class(es), 4 non-dominated option(s), no MILP (clients in turn: "
               "each takes its fastest option that fits)"),
], ids=["edge-ties-the-turns", "turns-set-it"])
def test_sequential_hands_a_round_another_resource_sets_to_bisect(mode: str, rtt: float, best: float,
                                                                  note: str) -> None:
    """``sequential`` keeps its answer only when a client or the clients in turn set the makespan. With the edge
    named (an exact tie, rtt 0) it returns None and bisect answers, and the note names bisect; the same fastest
    cuts, the optimum either way. With the turns setting it (rtt 0.5), sequential answers, no MILP."""
    sc = _edge_ties_the_turns(mode, rtt)
    got = solve(sc, method="sequential")
    assert got.method == "milp" and got.optimal
    assert got.note.startswith(f"{mode} {note}")
    assert got.assignment == {"c0": (0, 1), "c1": (0, 1)} and got.makespan_s == best
    assert solve(sc).note == got.note  # auto is sequential in sl and sflv2
    plans = every_plan(sc)
    assert min(m for _, m in plans) == best == exhaustive(sc).makespan_s
    assert [p for p, m in plans if m == best] == [{"c0": (0, 1), "c1": (0, 1)}]


_STATE = [1e3 + 40.0 * i * i for i in range(28)]  # 28 blocks of distinct state: 390 holder sizes on the edge


def _too_many_holders(mode: str) -> Scenario:
    """Two clients of 28 blocks (435 cut vectors each) on an edge of unbounded memory and a cloud of 2.3e6
    bytes. a (1 sample) is fastest with every block on the cloud, which leaves a holder of 305,200 bytes there;
    b (8 samples) is fastest with blocks 19 to 27 there, whose turn does not fit beside that holder. The holder
    sizes to try are 390 on the edge times 29 on the cloud, for 680 options: 7,690,800 pairs, past
    ``HOLDER_CANDIDATES``."""
    prof = ModelProfile.synthetic([1e8] * 28, [1e3] * 28, _STATE, input_bytes=1e3,
                                  act_bytes=[1e4 * (1 + i % 3) for i in range(28)])
    a = Client("a", "a", TierProfile(1.6e8, BIG), LinkProfile(4e7, 4e7, 0.01), 1)
    b = Client("b", "b", TierProfile(1.5e8, BIG), LinkProfile(2e7, 2e7, 0.01), 8)
    return Scenario(prof, (a, b), (TierProfile(2e10, BIG), TierProfile(1e11, 2.3e6)), (LinkProfile(6e7, 6e7, 0.001),),
                    batch=8, mode=mode)


def test_the_fixture_s_holder_sizes_are_too_many_to_search() -> None:
    sc = _too_many_holders("sl")
    s = opt_solver.Solver(sc, opt_classes.price_classes(sc), 1e-5, None)
    assert [len(c.T) for c in s.classes] == [435, 245]
    assert [c.options[0].tolist() for c in s.classes] == [[0, 0], [0, 19]]  # each class's fastest
    assert s.classes[0].held[0].tolist() == [0.0, math.fsum(_STATE)] == [0.0, 305200.0]
    assert not (s.classes[1].mem[0] + s.classes[0].held[0] <= sc.memory_caps).all()
    assert 390 * 29 * 680 > assign.HOLDER_CANDIDATES
    assert assign._holder_search(s) is None
    fastest = evaluate(sc, {"a": (0, 0), "b": (0, 19)})
    assert fastest.violations == ("cloud memory 2.25 MiB > 2.19 MiB",)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_sequential_hands_too_many_holder_sizes_to_bisect(mode: str) -> None:
    """The fastest cuts do not fit and the holder search gives up (too many candidates): ``sequential`` returns
    None, bisect answers (the note says so), and its answer is brute force's."""
    sc = _too_many_holders(mode)
    want = exhaustive(sc)
    assert want.assignment == {"a": (0, 0), "b": (0, 20)} and want.makespan_s == 2.7187129333333333
    got = solve(sc, method="sequential")
    assert got.cost.feasible and got.assignment == want.assignment and got.makespan_s == want.makespan_s
    assert got.cost.bottleneck == "clients in turn" and got.cost.shared_memory["cloud"] == 2152400.0
    assert got.note.startswith(f"{mode} bisect: 2 class(es), 680 non-dominated option(s), 12 MILP(s)")


# ---------------------------------------------------------------- polish: a shared resource a hair lighter


def _block_1_weighs_a_hair() -> Scenario:
    """Three identical clients (devices too small for a block) of two blocks: block 0 of 1e8 FLOPs, block 1 of
    1e-4, on an edge and a cloud of equal speed. Putting block 1 on the cloud ((0, 1)) instead of the edge ((0,
    2)) lightens the edge by 3e-13 s of 0.3 s. The optimum is one client on the cloud ((0, 0)) and two at (0, 1):
    0.6 s exactly; a client at (0, 2) instead costs 0.6000000000003001 s, a difference no MILP tolerance sees."""
    prof = ModelProfile.synthetic([1e8, 1e-4], [1e3, 1e3], [1e4, 0.0], input_bytes=1e3)
    clients = tuple(Client(f"c{i}", "k", TierProfile(1e8, 1e4), LinkProfile(1e7, 1e7, 0.001), 10) for i in range(3))
    return Scenario(prof, clients, (TierProfile(1e10, BIG), TierProfile(1e10, BIG)), (LinkProfile(1e9, 1e9, 1e-4),),
                    batch=5)


def test_bisect_and_polish_reach_the_optimum_a_hair_below_the_milp_s_tolerance() -> None:
    """The MILP (bisect's, gap 1e-5) may return a client at (0, 2); the polish moves it to (0, 1), the edge a hair
    lighter: the makespan is brute force's, 0.6 s exactly, not 0.6000000000003001."""
    sc = _block_1_weighs_a_hair()
    assert evaluate(sc, {"c0": (0, 2), "c1": (0, 0), "c2": (0, 1)}).makespan_s == 0.6000000000003001
    plans = every_plan(sc)
    assert min(m for _, m in plans) == 0.6
    assert {tuple(sorted(p.values())) for p, m in plans if m == 0.6} == {((0, 0), (0, 1), (0, 1))}
    got = solve(sc, method="bisect")
    assert got.makespan_s == 0.6 == exhaustive(sc).makespan_s
    assert sorted(got.assignment.values()) == [(0, 0), (0, 1), (0, 1)]
    assert got.cost.bottleneck == "edge compute"


def _block_0_weighs(tiny: float, devices: tuple[float, ...] = (1e8, 1e8, 1e8, 1e8)) -> Scenario:
    """Clients (one per device speed; equal speeds: one class) of two blocks: block 0 of ``tiny`` FLOPs and no
    parameters, block 1 of 1e8, on an edge and a cloud of equal speed. Keeping block 0 at home ((1, 2), (1, 1))
    lightens the tier it left by 3e-13 s of 0.3 s (``tiny`` 1e-4; 1.5e-9 of it for 0.15) and loads no other."""
    prof = ModelProfile.synthetic([tiny, 1e8], [1e3, 1e3], [0.0, 1e4], input_bytes=1e3)
    clients = tuple(Client(f"c{i}", f"d{d:g}", TierProfile(d, BIG), LinkProfile(1e7, 1e7, 0.001), 10)
                    for i, d in enumerate(devices))
    return Scenario(prof, clients, (TierProfile(1e10, BIG), TierProfile(1e10, BIG)), (LinkProfile(1e9, 1e9, 1e-4),),
                    batch=5)


def test_the_fixture_s_home_block_lightens_a_tier_by_a_hair() -> None:
    sc = _block_0_weighs(1e-4)
    t = option_table(sc, sc.clients[0])
    assert t.options.tolist() == [[0, 0], [0, 1], [0, 2], [1, 1], [1, 2], [2, 2]]
    edge = (t.shared_load[:, 0] / sc.capacities[0]).tolist()
    assert edge == [0.0, 3e-13, 0.30000000000029997, 0.0, 0.3, 0.0]
    assert t.round_s.tolist() == [0.3042180800003, 0.3042180800003, 0.3040080000003, 0.30421808003,
                                  0.30400800003, 30.00300000003]
    wide = option_table(_block_0_weighs(0.15), sc.clients[0]).shared_load[:, 0]
    assert 1.5e-9 < 1 - wide[4] / wide[2] < 1.6e-9


def test_polish_moves_every_edge_client_a_hair_lighter_one_per_pass() -> None:
    """Three clients at (0, 2) load the edge 0.9000000000008999 s. Each pass moves one to (1, 2) (the only option
    within 1e-9 below its load), three passes: 0.9 s exactly. An option far lighter (the cloud) is no hair and is
    not tried, though it would lower the makespan far more."""
    sc = _block_0_weighs(1e-4, (1e8, 1e8, 1e8))
    cost = evaluate(sc, {c.name: (0, 2) for c in sc.clients})
    assert cost.bottleneck == "edge compute" and cost.makespan_s == 0.9000000000008999
    got = _polish(sc, cost)
    assert got.assignment() == {"c0": (1, 2), "c1": (1, 2), "c2": (1, 2)}
    assert got.makespan_s == 0.9 and got.bottleneck == "edge compute"
    assert evaluate(sc, {"c0": (0, 0), "c1": (0, 2), "c2": (0, 2)}).makespan_s == 0.6000000000005999  # not tried


def test_polish_of_a_resource_takes_the_first_of_equal_moves_within_its_budget() -> None:
    """c0 and c1 (devices of 1e8 and 2e8 FLOP/s: two classes, equal loads) both at (0, 2): moving either lightens
    the edge alike. With two trials the first pass tries both and keeps the first (c0); the second pass has no
    budget left. With three, c1 follows."""
    sc = _block_0_weighs(1e-4, (1e8, 2e8, 1e8))
    cost = evaluate(sc, {"c0": (0, 2), "c1": (0, 2), "c2": (0, 0)})
    assert cost.bottleneck == "edge compute" and cost.makespan_s == 0.6000000000005999
    assert _polish(sc, cost, budget=0) is cost
    one = _polish(sc, cost, budget=1)
    assert one.assignment() == {"c0": (1, 2), "c1": (0, 2), "c2": (0, 0)} and one.makespan_s == 0.6000000000003001
    two = _polish(sc, cost, budget=2)
    assert two.assignment() == one.assignment() and two.makespan_s == one.makespan_s
    three = _polish(sc, cost, budget=3)
    assert three.assignment() == {"c0": (1, 2), "c1": (1, 2), "c2": (0, 0)} and three.makespan_s == 0.6


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_polish_of_a_resource_spends_one_trial_per_move(budget: int) -> None:
    """Four clients of one class on the edge: each pass tries one move (the class's, once) and takes it, so a
    budget of k moves exactly k clients."""
    sc = _block_0_weighs(1e-4)
    cost = evaluate(sc, {c.name: (0, 2) for c in sc.clients})
    got = _polish(sc, cost, budget=budget)
    assert sum(cuts == (1, 2) for cuts in got.assignment().values()) == budget
    assert got.makespan_s == [1.2000000000009, 1.2000000000006001, 1.2000000000003][budget - 1]


def test_polish_of_a_resource_leaves_a_tie_with_another_resource() -> None:
    """Two clients on the edge, two on the cloud: both tiers are busy 0.6000000000005999 s. Lightening the edge
    leaves the cloud's makespan as it is: no move is strictly better, the round is returned as given."""
    sc = _block_0_weighs(1e-4)
    cost = evaluate(sc, {"c0": (0, 2), "c1": (0, 2), "c2": (0, 0), "c3": (0, 0)})
    assert cost.shared_s["edge compute"] == cost.shared_s["cloud compute"] == 0.6000000000005999
    assert cost.bottleneck == "edge compute"
    assert _polish(sc, cost) is cost


def test_polish_of_a_resource_looks_no_further_than_1e_9_below() -> None:
    """Block 0 of 0.15 FLOPs: keeping it at home lightens the edge by 1.5e-9 of its load, past the polish's
    window (a move of more than float noise is the MILP's to make): the round is returned as given."""
    sc = _block_0_weighs(0.15, (1e8, 1e8, 1e8))
    cost = evaluate(sc, {"c0": (0, 2), "c1": (0, 2), "c2": (0, 0)})
    assert cost.bottleneck == "edge compute"
    assert _polish(sc, cost) is cost


# ---------------------------------------------------------------- polish: a client a hair faster


def _hair_faster_on_the_edge() -> Scenario:
    """One client of three blocks (1e-4, 2e7 and 8e8 FLOPs; the first without parameters) on a slow edge: all on
    the edge ((0,)) it takes 8.231008000001 s, block 0 kept at home ((1,)) 2e-12 s more, though the edge's load
    is 8.2 s rather than 8.200000000001."""
    prof = ModelProfile.synthetic([1e-4, 2e7, 8e8], [1e3] * 3, [0.0, 1e4, 1e4], input_bytes=1e3)
    x = Client("x", "x", TierProfile(1e9, BIG), LinkProfile(1e7, 1e7, 0.01), 10)
    return Scenario(prof, (x,), (TierProfile(3e9, BIG),), (), batch=5)


def test_direct_and_polish_reach_the_client_s_fastest_cuts_2e_12_apart() -> None:
    """``direct`` (one MILP, gap 1e-5) may settle on (1,); the polish moves the client to (0,), 2e-12 s faster:
    brute force's optimum, exactly."""
    sc = _hair_faster_on_the_edge()
    t = option_table(sc, sc.clients[0])
    assert t.round_s.tolist() == [8.231008000001, 8.231008000003, 8.634008000003, 24.614000000003]
    assert (t.shared_load[:, 0] / sc.capacities[0]).tolist() == [8.200000000001, 8.2, 8.0, 0.0]
    want = exhaustive(sc)
    assert want.assignment == {"x": (0,)} and want.makespan_s == 8.231008000001
    got = solve(sc, method="direct")
    assert got.assignment == want.assignment and got.makespan_s == want.makespan_s
    assert got.cost.bottleneck == "client x"


def _three_hairs(clients: int = 2, tiny0: float = 1e-6) -> Scenario:
    """Identical clients of three blocks (``tiny0`` and 1e-6 FLOPs without parameters, then 1e8) on a fast edge
    behind a slow link: each block kept at home adds 3e-13 s to a round of 0.1338 s ((0,) < (1,) < (2,), a hair
    apart; (3,) far slower). ``tiny0`` 6.7e-4 puts (1,) 1.5e-9 of its round above (0,)."""
    prof = ModelProfile.synthetic([tiny0, 1e-6, 1e8], [1e3] * 3, [0.0, 0.0, 1e4], input_bytes=1e3)
    xs = tuple(Client(f"c{i}", "k", TierProfile(1e8, BIG), LinkProfile(1e5, 1e5, 0.001), 10) for i in range(clients))
    return Scenario(prof, xs, (TierProfile(1e11, BIG),), (), batch=5)


def test_the_fixture_s_client_options_are_a_hair_apart() -> None:
    sc = _three_hairs()
    t = option_table(sc, sc.clients[0])
    assert t.round_s.tolist() == [0.1338000000000006, 0.13380000000030032, 0.1338000000006, 30.2010000000006]
    assert evaluate(sc, {"c0": (2,), "c1": (1,)}).bottleneck == "client c0"
    wide = option_table(_three_hairs(1, 6.7e-4), sc.clients[0]).round_s
    assert 1.5e-9 < 1 - wide[0] / wide[1] < 1.6e-9


def test_polish_moves_the_slowest_client_to_its_fastest_hair_and_then_the_next() -> None:
    """c0 at (2,) sets the makespan, c1 at (1,) just below. Moving c0 to (0,) or to (1,) gives the same makespan
    (c1's); the polish keeps the first tried, (0,), the fastest. Its second pass moves c1 to (0,): both at the
    fastest cuts. Taking (1,) instead left c0 and c1 tied at (1,), which no single move lowers."""
    sc = _three_hairs()
    cost = evaluate(sc, {"c0": (2,), "c1": (1,)})
    assert cost.makespan_s == 0.1338000000006
    got = _polish(sc, cost)
    assert got.assignment() == {"c0": (0,), "c1": (0,)}
    assert got.makespan_s == 0.1338000000000006 and got.bottleneck == "client c0"


@pytest.mark.parametrize("plan", [
    {"c0": (1,), "c1": (1,)},  # two clients set it: moving one leaves the other's round
    {"c0": (3,), "c1": (3,)},  # far slower than every other option: no hair
], ids=["tied", "no-hair"])
def test_polish_of_a_client_keeps_a_round_no_hair_move_lowers(plan: Plan) -> None:
    sc = _three_hairs()
    cost = evaluate(sc, plan)
    assert cost.bottleneck == "client c0"
    assert _polish(sc, cost) is cost


def test_polish_of_a_client_looks_no_further_than_1e_9_below() -> None:
    """(0,) is 1.5e-9 of the round faster than (1,): no hair, the round is returned as given."""
    sc = _three_hairs(1, 6.7e-4)
    cost = evaluate(sc, {"c0": (1,)})
    assert cost.bottleneck == "client c0"
    assert _polish(sc, cost) is cost


# ---------------------------------------------------------------- prefer: a move that ships nothing


def _block_0_ships_nothing(f0: float = 0.0, small: float = BIG) -> Scenario:
    """x1 and x2 (10 samples) and y (20) of two blocks; block 0 has no parameters and no activations, block 1 1e8
    FLOPs. Block 0 on the edge ((0,)) or at home ((1,)) costs the same in every column the optimizer compares
    (with ``f0`` 0), so (1,) is dropped as dominated, and moving between them ships nothing. Every client on
    the edge (1.2 s) is optimal; at home y takes 6.03 s. ``f0`` 1e8: block 0 at home is slow (3.331008 s).
    ``small``: x1's and x2's device memory (7e3 holds (0,) only)."""
    prof = ModelProfile.synthetic([f0, 1e8], [1e3, 1e3], [0.0, 1e5], input_bytes=1e3, act_bytes=[0.0, 1e3])

    def client(name: str, samples: int, memory: float) -> Client:
        return Client(name, "k", TierProfile(1e9, memory), LinkProfile(1e7, 1e7, 0.01), samples)

    return Scenario(prof, (client("x1", 10, small), client("x2", 10, small), client("y", 20, BIG)),
                    (TierProfile(1e10, BIG),), (), batch=5)


_NOW = {"x1": (1,), "x2": (1,), "y": (2,)}


def test_the_fixture_s_block_0_moves_for_free_and_costs_nothing_to_keep() -> None:
    sc = _block_0_ships_nothing()
    t = option_table(sc, sc.clients[0])
    assert t.round_s.tolist() == [0.331008, 0.331008, 3.03]
    assert t.shared_load[:2].tolist() == [[3e9], [3e9]] and t.memory[:2, 1].tolist() == [310000.0, 310000.0]
    x1 = sc.clients[0]
    assert move_cost(sc, x1, (1,), (0,)) == 0.0 and move_cost(sc, sc.clients[2], (2,), (0,)) == 0.015
    x_class = opt_classes.price_classes(sc, prefer=_NOW)[0]
    assert x_class.members == [0, 1] and x_class.options.ravel().tolist() == [0, 2]  # (1,) dominated by (0,)
    assert evaluate(sc, _NOW).makespan_s == 6.03
    best = solve(sc)
    assert best.assignment == {"x1": (0,), "x2": (0,), "y": (0,)} and best.makespan_s == 1.2


@pytest.mark.parametrize("tie_rel", [1e-9, 0.0])
@pytest.mark.parametrize("prefer", [_NOW, {"x1": (1,), "x2": (1,)}], ids=["all", "x-only"])
def test_a_client_whose_move_ships_nothing_keeps_its_cuts_when_staying_is_as_good(prefer: Plan,
                                                                                   tie_rel: float) -> None:
    """The tie search may only put x1 and x2 at (0,) ((1,) is dominated); moving them there ships nothing, and
    keeping (1,) gives the same 1.2 s: both keep their cuts, y alone moves (0.015 s). With ``tie_rel`` 0 too (the
    same makespan is a tie), and with y not among the preferred cuts (then nothing is moved at a cost)."""
    sc = _block_0_ships_nothing()
    got = solve(sc, prefer=prefer, tie_rel=tie_rel)
    assert got.assignment == {"x1": (1,), "x2": (1,), "y": (0,)}
    assert got.makespan_s == 1.2 and got.cost.feasible
    moved = "0.015" if "y" in prefer else "0"
    assert got.note.endswith(f"; least move cost among ties: {moved} s")


def test_the_tie_search_reports_it_looked_when_it_keeps_cuts_that_ship_nothing() -> None:
    """``closest`` itself, handed the optimum solve finds (x1 and x2 at (0,)): it returns the tie that keeps their
    cuts, and says it finished looking (the "no time left" note hangs on that flag)."""
    sc = _block_0_ships_nothing()
    best = solve(sc).cost
    chosen, looked = opt_ties.closest(sc, best, _NOW, 1e-9, 1e-5, None)
    assert looked is True
    assert chosen.assignment() == {"x1": (1,), "x2": (1,), "y": (0,)} and chosen.makespan_s == 1.2


@pytest.mark.parametrize(("f0", "small", "best"), [(1e8, BIG, 2.4), (0.0, 7e3, 1.2)],
                         ids=["staying-is-slower", "staying-does-not-fit"])
def test_a_move_that_ships_nothing_is_made_when_staying_is_not_as_good(f0: float, small: float,
                                                                       best: float) -> None:
    """x1's and x2's cuts (1,) are no tie: slower (block 0 of 1e8 FLOPs at home: x's round 3.331008 s against
    an optimum of 2.4 s) or past their device's memory. They move to (0,), shipping nothing."""
    sc = _block_0_ships_nothing(f0, small)
    stay = evaluate(sc, {"x1": (1,), "x2": (1,), "y": (0,)})
    assert stay.makespan_s > best if small == BIG else not stay.feasible
    got = solve(sc, prefer=_NOW)
    assert got.assignment == {"x1": (0,), "x2": (0,), "y": (0,)}
    assert got.makespan_s == best and got.cost.feasible


# ---------------------------------------------------------------- polish: exactly 1e-9 below is still a hair

_EDGE = 1 - 1e-9  # the polish's window, as it computes it


def _binary_exact(f0: float, f1: float, clients: int) -> Scenario:
    """Clients of one sample, two blocks of ``f0`` and ``f1`` FLOPs (no backward work, no bytes, no parameters),
    links that cost nothing, an edge of 1 FLOP/s and devices of 0.5: every time is a FLOP count, exact in binary."""
    prof = ModelProfile.synthetic([f0, f1], [0.0, 0.0], [0.0, 0.0], input_bytes=0.0, bwd_flops=[0.0, 0.0])
    xs = tuple(Client(f"c{i}", "k", TierProfile(0.5, BIG), LinkProfile(INF, INF, 0.0), 1) for i in range(clients))
    return Scenario(prof, xs, (TierProfile(1.0, BIG),), (), batch=1)


def test_polish_of_a_resource_takes_a_load_exactly_at_its_window_s_edge() -> None:
    """Blocks of 1 - c and c FLOPs (c = 1 - 1e-9 as the polish computes it): block 0 kept at home ((1,)) loads the
    edge c, exactly 1e-9 below (0,)'s 1. Two clients at (0,) load it 2 s; the window includes its edge, so both
    move, one per pass: 2c."""
    sc = _binary_exact(1 - _EDGE, _EDGE, 2)
    t = option_table(sc, sc.clients[0])
    assert t.shared_load[:2, 0].tolist() == [1.0, _EDGE] and t.round_s[:2].tolist() == [1.0, 1.000000001]
    cost = evaluate(sc, {"c0": (0,), "c1": (0,)})
    assert cost.bottleneck == "edge compute" and cost.makespan_s == 2.0
    got = _polish(sc, cost)
    assert got.assignment() == {"c0": (1,), "c1": (1,)} and got.makespan_s == 2 * _EDGE == 1.999999998


def test_polish_of_a_client_takes_a_round_exactly_at_its_window_s_edge() -> None:
    """Blocks of 1 - c and 2c - 1 FLOPs: block 0 at home ((1,)) the round takes 1 s, all on the edge ((0,)) c,
    exactly 1e-9 less. The window includes its edge: the client moves."""
    sc = _binary_exact(1 - _EDGE, 2 * _EDGE - 1, 1)
    assert option_table(sc, sc.clients[0]).round_s[:2].tolist() == [_EDGE, 1.0]
    cost = evaluate(sc, {"c0": (1,)})
    assert cost.bottleneck == "client c0" and cost.makespan_s == 1.0
    got = _polish(sc, cost)
    assert got.assignment() == {"c0": (0,)} and got.makespan_s == _EDGE
