"""Behaviour of the online adapter that a mutation run found unpinned: what a simulated client measures, the
defaults of a measurement and of an adapter, the exact edges of the smoothing rule, the refusals of its
settings, the decisions that move nothing, and the hysteresis rule at its edge."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import FrozenInstanceError

import pytest

from splitfed.cost import Scenario, evaluate, move_cost
from splitfed.errors import ConfigError
from splitfed.optimizer import Adapter, Measurement, solve
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

# block 1: 100 MFLOP/sample and 1.5 MB of weights; the edge (5 GFLOP/s) beats the device (1 GFLOP/s) until the
# device turns out faster (as in tests/test_adapt.py)
PROF = ModelProfile.synthetic([1e6, 1e8], [1e3, 10], [1e3, 1.5e6], input_bytes=1e3)


def _one_device(flops: float = 1e9, rtt: float = 0.0) -> Scenario:
    dev = Client("d", "d", TierProfile(flops, 1e9), LinkProfile(1e8, 0.8e6, rtt), samples=100)
    return Scenario(PROF, (dev,), (TierProfile(5e9, 1e10),), (), batch=10)


def _d(adapter: Adapter) -> Client:
    return adapter.belief.clients[0]


# ---------------------------------------------------------------- what a simulated client measures


def test_a_simulated_client_measures_its_activations_plus_its_weight_exchange_on_each_link() -> None:
    truth = _one_device(flops=2e9, rtt=0.04)
    cc = evaluate(truth, {"d": (1,)}).clients[0]  # block 0 on the device: activations and its weights
    assert cc.exchange_bytes > 0 and cc.up_bytes[0] > 0 and cc.down_bytes[0] > 0
    m = Measurement.from_cost(cc, truth.clients[0])
    up = cc.up_bytes[0] + cc.exchange_bytes
    down = cc.down_bytes[0] + cc.exchange_bytes
    link = truth.clients[0].link
    assert (m.up_bytes, m.up_s, m.down_bytes, m.down_s) == (up, up / link.up, down, down / link.down)
    assert (m.compute_flops, m.compute_s) == (cc.flops[0], cc.flops[0] / 2e9)
    assert (m.round_s, m.rtt_s) == (cc.round_s, 0.04)


def test_a_device_that_computed_nothing_times_the_probe_or_teaches_nothing() -> None:
    truth = _one_device(flops=2e9)
    cc = evaluate(truth, {"d": (0,)}).clients[0]  # all on the edge
    assert cc.flops[0] == 0
    m = Measurement.from_cost(cc, truth.clients[0])  # no probe: nothing computed, nothing timed
    assert (m.compute_flops, m.compute_s) == (0.0, 0.0)
    adapter = Adapter(_one_device(), rounds=5, assignment={"d": (0,)})
    adapter.update({"d": m})
    assert _d(adapter).device.flops == 1e9
    probed = Measurement.from_cost(cc, truth.clients[0], probe_flops=4e9)
    assert (probed.compute_flops, probed.compute_s) == (4e9, 2.0)


def test_a_device_that_computed_under_one_flop_measures_that_work_not_the_probe() -> None:
    """Work is work however little: only a device that computed nothing times the probe instead."""
    prof = ModelProfile.synthetic([1e-4, 1e-4], [1e3, 10], [1e3, 1.5e6], input_bytes=1e3)
    dev = Client("d", "d", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=1)
    sc = Scenario(prof, (dev,), (TierProfile(5e9, 1e10),), (), batch=1)
    cc = evaluate(sc, {"d": (1,)}).clients[0]
    assert 0 < cc.flops[0] <= 1
    m = Measurement.from_cost(cc, dev, probe_flops=4e9)
    assert m.compute_flops == cc.flops[0] and m.compute_s == cc.flops[0] / 1e9


# ---------------------------------------------------------------- defaults


@pytest.mark.parametrize("half", [{"compute_flops": 7e9}, {"compute_s": 2.0}, {"up_bytes": 7e6}, {"up_s": 2.0},
                                  {"down_bytes": 7e6}, {"down_s": 2.0}])
def test_half_a_measurement_teaches_nothing(half: dict[str, float]) -> None:
    """A measurement's work and seconds default to none: work without its seconds (or seconds without work)
    leaves every belief as it was."""
    m = Measurement(**half)
    assert m == Measurement(**{k: half.get(k, 0.0) for k in ("compute_flops", "compute_s", "up_bytes", "up_s",
                                                             "down_bytes", "down_s")})
    adapter = Adapter(_one_device(), rounds=5, assignment={"d": (1,)})
    before = adapter.belief
    adapter.update({"d": m})
    assert adapter.belief == before


def test_an_adapter_s_defaults() -> None:
    adapter = Adapter(_one_device(), rounds=5, assignment={"d": (1,)})
    assert (adapter.alpha, adapter.jump, adapter.hysteresis, adapter.time_limit) == (0.5, 3.0, 0.05, 30.0)
    # alpha 0.5: 20% slower is believed halfway; jump 3: 4x slower is a change of regime, believed at once
    adapter.update({"d": Measurement(compute_flops=8e8, compute_s=1.0)})
    assert _d(adapter).device.flops == 9e8
    adapter.update({"d": Measurement(compute_flops=9e8 / 4, compute_s=1.0)})
    assert _d(adapter).device.flops == 9e8 / 4


def test_decisions_and_measurements_are_frozen() -> None:
    adapter = Adapter(_one_device(), rounds=5, assignment={"d": (1,)})
    d = adapter.observe(1, {})
    with pytest.raises(FrozenInstanceError):
        d.reason = "edited"  # type: ignore[misc]
    m = Measurement(compute_flops=1.0, compute_s=1.0)
    with pytest.raises(FrozenInstanceError):
        m.compute_s = 2.0  # type: ignore[misc]


# ---------------------------------------------------------------- the smoothing rule at its edges


def test_a_rate_of_exactly_one_is_learned() -> None:
    """1 byte/s is a (slow) rate, not an underflow to 0: it is believed (a jump from 100 MB/s)."""
    adapter = Adapter(_one_device(), rounds=5, assignment={"d": (1,)})
    adapter.update({"d": Measurement(up_bytes=2.0, up_s=2.0, compute_flops=5.0, compute_s=5.0)})
    assert _d(adapter).link.up == 1.0 and _d(adapter).device.flops == 1.0


def test_a_change_of_exactly_the_jump_is_smoothed_not_believed_at_once() -> None:
    """"A jump beyond ``jump``x is a change of regime": exactly 3x (or 1/3x) is still noise, smoothed."""
    up = Adapter(_one_device(flops=1e9), rounds=5, assignment={"d": (1,)})
    assert 3e9 / 1e9 == up.jump
    up.update({"d": Measurement(compute_flops=3e9, compute_s=1.0)})
    assert _d(up).device.flops == 2e9
    down = Adapter(_one_device(flops=3e9), rounds=5, assignment={"d": (1,)})
    assert 1e9 / 3e9 == 1 / down.jump
    down.update({"d": Measurement(compute_flops=1e9, compute_s=1.0)})
    assert _d(down).device.flops == 2e9


def test_a_round_trip_measured_as_zero_is_learned() -> None:
    """A round trip of 0 s (a node on the same host) is a measurement like any other: from 40 ms it is a
    change of regime, believed at once."""
    adapter = Adapter(_one_device(rtt=0.04), rounds=5, assignment={"d": (1,)})
    adapter.update({"d": Measurement(rtt_s=0.0)})
    assert _d(adapter).link.rtt == 0.0
    adapter.update({"d": Measurement(rtt_s=-1.0)})  # negative: not a measurement
    assert _d(adapter).link.rtt == 0.0


# ---------------------------------------------------------------- refusals of the settings


def test_alpha_above_one_is_refused_and_one_is_not() -> None:
    with pytest.raises(ConfigError, match=r"alpha must be in \(0, 1\], got 1.5"):
        Adapter(_one_device(), rounds=5, alpha=1.5, assignment={"d": (1,)})
    assert Adapter(_one_device(), rounds=5, alpha=1.0, assignment={"d": (1,)}).alpha == 1.0


def test_any_jump_above_one_is_accepted() -> None:
    adapter = Adapter(_one_device(), rounds=5, jump=1.5, assignment={"d": (1,)})
    adapter.update({"d": Measurement(compute_flops=1.6e9, compute_s=1.0)})  # 1.6x > 1.5x: believed at once
    assert adapter.jump == 1.5 and _d(adapter).device.flops == 1.6e9


# ---------------------------------------------------------------- decisions that move nothing


def _still(adapter: Adapter, round: int, measured: dict[str, Measurement], reason: str) -> None:
    before = dict(adapter.assignment)
    d = adapter.observe(round, measured)
    assert reason in d.reason, d.reason
    assert d.moved == () and d.move_s == 0.0 and d.before_s == d.after_s and adapter.assignment == before


FASTER = {"d": Measurement(compute_flops=1e10, compute_s=1.0)}  # the device is 10x faster than believed


def test_a_decision_that_moves_nothing_predicts_no_move_time() -> None:
    _still(Adapter(_one_device(), rounds=5, hysteresis=0.0), 1, {}, "already optimal")
    _still(Adapter(_one_device(), rounds=3, hysteresis=0.0), 3, FASTER, "last round")
    _still(Adapter(_one_device(), rounds=2, hysteresis=0.0), 1, FASTER, "no move pays")  # 1 round left
    _still(Adapter(_one_device(), rounds=11, hysteresis=10.0), 1, FASTER, "within the hysteresis")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the cost model overflows on the absurd belief
def test_a_decision_without_a_plan_predicts_no_move_time() -> None:
    absurd = Measurement(up_bytes=1.0, up_s=1e308, down_bytes=1.0, down_s=1e308)  # every plan takes forever
    _still(Adapter(_one_device(), rounds=5, time_limit=None), 1, {"d": absurd}, "no plan")


# ---------------------------------------------------------------- the hysteresis rule at its edge


def test_a_move_is_made_exactly_when_its_gain_over_the_rounds_left_beats_the_hysteresis() -> None:
    """J(keep) = R M(current), J(move) = M1(new) + (R - 1) M(new), priced here with the cost model itself;
    the move is made iff J(keep) - J(move) > hysteresis * J(keep)."""
    rounds, left = 11, 10
    sc = _one_device()
    made = Adapter(sc, rounds=rounds, hysteresis=0.0).observe(1, FASTER)
    assert made.moved == ("d",)
    belief = Adapter(sc, rounds=rounds, hysteresis=0.0)
    belief.update(FASTER)
    old, new = {"d": (0,)}, made.assignment
    J_keep = left * evaluate(belief.belief, old).makespan_s
    J_move = (evaluate(belief.belief, new, extra_s={"d": move_cost(belief.belief, _d(belief), (0,), new["d"])}
                       ).makespan_s + (left - 1) * evaluate(belief.belief, new).makespan_s)
    share = (J_keep - J_move) / J_keep
    assert 0.1 < share < 0.9  # a gain, not a sure thing: the rule decides
    for h, moves in ((share * (1 - 1e-9), True), (share * (1 + 1e-9), False), (0.99, False)):
        d = Adapter(sc, rounds=rounds, hysteresis=h).observe(1, FASTER)
        assert (d.moved == ("d",)) is moves, (h, d.reason)
    # exactly at the edge (a hysteresis whose share of J(keep) is the gain itself, to the last bit): kept
    h = share
    for _ in range(64):
        if h * J_keep == J_keep - J_move:
            break
        h = math.nextafter(h, 1.0 if h * J_keep < J_keep - J_move else 0.0)
    assert h * J_keep == J_keep - J_move
    d = Adapter(sc, rounds=rounds, hysteresis=h).observe(1, FASTER)
    assert not d.moved and "within the hysteresis" in d.reason


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_with_clients_in_turn_a_move_s_weights_delay_every_client_after_it(mode: str) -> None:
    """In sl/sflv2 the clients train one after another: a move's weight transfer delays the whole round, not
    only the moving client. With 1 round left the move does not repay it (priced here with the cost model), so
    it is undone as one that does not pay, not weighed and kept out by the hysteresis (a negative "gain")."""
    cl = tuple(Client(f"d{i}", "d", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=100) for i in range(2))
    sc = Scenario(PROF, cl, (TierProfile(5e9, 1e10),), (), batch=10, mode=mode)
    faster = {"d0": Measurement(compute_flops=1e10, compute_s=1.0)}
    adapter = Adapter(sc, rounds=2, hysteresis=0.0)
    old = dict(adapter.assignment)
    adapter.update(faster)
    b = adapter.belief
    target = {"d0": (2,), "d1": old["d1"]}  # the new optimum: d0 keeps block 1
    assert old["d0"] != (2,) and evaluate(b, target).makespan_s < evaluate(b, old).makespan_s
    moved = evaluate(b, target, extra_s={"d0": move_cost(b, b.clients[0], old["d0"], (2,))}).makespan_s
    assert moved > evaluate(b, old).makespan_s  # ... but moving there costs more than 1 round gains
    adapter = Adapter(sc, rounds=2, hysteresis=0.0)
    _still(adapter, 1, faster, "no move pays for moving its weights")


def test_a_move_that_does_not_lower_the_cost_over_the_rounds_left_is_undone() -> None:
    """"A move that does not lower J is undone": with 1 round left J is the next round's makespan, set by c0's
    move (its weights included). c1's move is part of the new optimum (c1 turned out 2x faster) but changes
    nothing of that round, so c1 stays where it is; only c0 moves."""
    prof = ModelProfile.synthetic([2.8e5, 4.8e7, 2.0e8], [2.9e4, 2.5e4, 8.3e3], [5.2e4, 9.4e5, 1.5e3],
                                  input_bytes=1e3)
    cl = (Client("c0", "d", TierProfile(9.9e9, 1e12), LinkProfile(1.4e5, 1.8e6, 0.0), samples=200),
          Client("c1", "d", TierProfile(3.2e8, 1e12), LinkProfile(3.8e7, 2.3e6, 0.0), samples=200))
    sc = Scenario(prof, cl, (TierProfile(2.4e10, 1e12),), (), batch=10)
    start = {"c0": (0,), "c1": (1,)}
    measured = {"c0": Measurement(compute_flops=1e11, compute_s=1.0), "c1": Measurement(compute_flops=6.5e8,
                                                                                        compute_s=1.0)}
    adapter = Adapter(sc, rounds=2, hysteresis=0.0, time_limit=None, assignment=start)
    belief = Adapter(sc, rounds=2, assignment=start)
    belief.update(measured)
    b = belief.belief
    target = solve(b, time_limit=None, prefer=start).assignment  # the new optimum
    assert target == {"c0": (3,), "c1": (0,)}
    assert evaluate(b, target).makespan_s < evaluate(b, {"c0": (3,), "c1": (1,)}).makespan_s

    def first(plan: Mapping[str, tuple[int, ...]]) -> float:  # the next round, moves included
        return evaluate(b, plan, extra_s={n: move_cost(b, b.clients[b.index(n)], start[n], plan[n])
                                          for n in plan if plan[n] != start[n]}).makespan_s

    assert first(target) == first({"c0": (3,), "c1": (1,)}) < first(start)
    d = adapter.observe(1, measured)
    assert d.moved == ("c0",) and d.assignment == {"c0": (3,), "c1": (1,)}


def test_cuts_that_fill_a_server_s_memory_exactly_fit_and_are_moved_to() -> None:
    """A tier's memory is a limit, not a bound to stay below: cuts that need exactly the edge's memory fit
    (as :func:`~splitfed.cost.model.evaluate` says), so a move to them is weighed like any other."""
    dev = Client("d", "d", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=100)
    cap = evaluate(_one_device(), {"d": (0,)}).shared_memory["edge"]  # all on the edge
    sc = Scenario(PROF, (dev,), (TierProfile(5e9, cap),), (), batch=10)
    assert evaluate(sc, {"d": (0,)}).feasible and evaluate(sc, {"d": (0,)}).shared_memory["edge"] == cap
    slower = {"d": Measurement(compute_flops=1e7, compute_s=1.0)}  # the device is 100x slower than believed
    adapter = Adapter(sc, rounds=11, hysteresis=0.0, assignment={"d": (2,)})
    d = adapter.observe(1, slower)
    assert d.moved == ("d",) and d.assignment == {"d": (0,)}


def test_of_two_moves_that_each_pay_but_not_together_the_cheaper_is_kept() -> None:
    """Moves that do not lower J are undone most expensive first. Both devices turn out 30x faster and the
    edge is the bottleneck: taking block 1 off it to either device pays. With 1 round left, "e"'s weights take
    7.5 s over its 0.2 MB/s downlink and set the round, "c"'s 3 s: undoing "e"'s move first lowers J, and
    "c"'s is then kept. Undoing "c"'s first would not (the round is still "e"'s), and "e"'s move would be kept
    for good: the worse of the two (priced here with the cost model)."""
    cl = (Client("e", "d", TierProfile(1e9, 1e12), LinkProfile(1e8, 2e5, 0.0), samples=100),
          Client("c", "d", TierProfile(1e9, 1e12), LinkProfile(1e8, 5e5, 0.0), samples=100))
    sc = Scenario(PROF, cl, (TierProfile(3e9, 1e12),), (), batch=10)
    start = {"e": (1,), "c": (1,)}
    measured = {n: Measurement(compute_flops=3e10, compute_s=1.0) for n in start}
    belief = Adapter(sc, rounds=2, assignment=start)
    belief.update(measured)
    b = belief.belief
    target = solve(b, time_limit=None, prefer=start).assignment
    assert target == {"e": (2,), "c": (2,)}

    def first(plan: Mapping[str, tuple[int, ...]]) -> float:  # the next (and last) round, moves included
        return evaluate(b, plan, extra_s={n: move_cost(b, b.clients[b.index(n)], start[n], plan[n])
                                          for n in plan if plan[n] != start[n]}).makespan_s

    only_c, only_e = {"e": (1,), "c": (2,)}, {"e": (2,), "c": (1,)}
    assert move_cost(b, b.clients[0], (1,), (2,)) > move_cost(b, b.clients[1], (1,), (2,))
    assert first(only_c) < first(only_e) < first(start) and first(only_c) < first(target)
    d = Adapter(sc, rounds=2, hysteresis=0.0, time_limit=None, assignment=start).observe(1, measured)
    assert d.moved == ("c",) and d.assignment == only_c
