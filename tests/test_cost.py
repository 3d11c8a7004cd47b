"""The one cost model: formulas checked by hand, and its internal consistency."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from splitfed.cost import (
    Scenario,
    client_cost,
    cut_options,
    evaluate,
    move_cost,
    option_table,
    round_time,
)
from splitfed.errors import ConfigError, CutError
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

# Two blocks; per sample: forward 1 and 2 MFLOP (backward 2x), outputs 4000 and 100 bytes, input 800.
PROF = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800)
DEV = Client("c", "c", TierProfile(1e9, 1e9), LinkProfile(1e5, 2e5, 0.02), samples=10)
EDGE, CLOUD = TierProfile(1e10, 1e9), TierProfile(1e11, 1e9)
EDGE_LINK = LinkProfile(1e6, 1e6, 0.01)


def scenario(clients=(DEV,), u_shape=False, tiers=3) -> Scenario:  # noqa: ANN001
    servers = (EDGE, CLOUD) if tiers == 3 else (EDGE,)
    return Scenario(PROF, tuple(clients), servers, (EDGE_LINK,) if tiers == 3 else (), batch=4, u_shape=u_shape)


def test_cut_options_are_every_legal_vector() -> None:
    assert cut_options(2, 2).tolist() == [[0], [1], [2]]
    assert len(cut_options(15, 3)) == 16 * 17 // 2
    assert len(cut_options(4, 3, u_shape=True)) == 35 - 4  # C(4 + 3, 3), all-equal ones once: 4,4,4
    assert cut_options(3, 3, min_device_blocks=1).min() >= 0 and cut_options(3, 3, min_device_blocks=1)[:, 0].min() == 1
    with pytest.raises(CutError):
        cut_options(3, 3, min_device_blocks=4)


def test_device_then_edge_by_hand() -> None:
    c = client_cost(scenario(), "c", (1, 2))
    # compute: device 10 samples x 3 MFLOP / 1 GFLOP/s; edge 10 x 6 MFLOP / 10 GFLOP/s
    assert c.compute_s == pytest.approx((0.03, 0.006, 0.0))
    # link 1 carries block 0's output up (40 kB at 100 kB/s) with the labels (10 x 8 B), and its
    # gradient down (200 kB/s); 3 batches, half an RTT per message
    assert c.up_s == pytest.approx((0.4008 + 3 * 0.01, 0.0))
    assert c.down_s == pytest.approx((0.2 + 3 * 0.01, 0.0))
    assert c.up_bytes == (40080, 0) and c.down_bytes == (40000, 0)
    # device weights (1000 B) down and up once per round
    assert c.exchange_s == pytest.approx(1000 / 2e5 + 1000 / 1e5 + 0.02)
    assert c.round_s == pytest.approx(0.03 + 0.006 + 0.4308 + 0.23 + 0.035)
    assert c.batch_s == pytest.approx(4 * 3e6 / 1e9 + 4 * 6e6 / 1e10 + 16032 / 1e5 + 0.01 + 16000 / 2e5 + 0.01)
    # memory: fixed (params, grads, momentum) + batch x activations; the device holds its input batch, and the
    # output it sends (no block of a synthetic profile keeps it) until its gradient comes back, and that too; the
    # edge the tensor it receives (block 0's output) for the whole step; the cloud is not entered
    assert c.memory == pytest.approx((3000 + 4 * 4000 + 4 * 800 + 2 * 4 * 4000, 1500 + 4 * 100 + 4 * 4000, 0))
    assert c.batches == 3
    one = c.batch()  # one batch of 4, part by part
    assert one["forward_s"] == pytest.approx((4e6 / 1e9, 8e6 / 1e10, 0))
    assert one["backward_s"] == pytest.approx((8e6 / 1e9, 16e6 / 1e10, 0))
    assert one["up_s"] == pytest.approx((16032 / 1e5 + 0.01, 0)) and one["down_s"] == pytest.approx((0.09, 0))
    assert sum(sum(v) for v in one.values()) == pytest.approx(c.batch_s)


def test_all_on_the_cloud_sends_raw_data_and_no_gradient() -> None:
    c = client_cost(scenario(), "c", (0, 0))
    assert c.compute_s == pytest.approx((0, 0, 10 * 9e6 / 1e11))
    assert c.up_bytes == (8080, 8080) and c.down_bytes == (0, 0)  # the edge relays; nothing comes back
    assert c.up_s == pytest.approx((0.0808 + 3 * 0.01, 0.00808 + 3 * 0.005))
    assert c.down_s == pytest.approx((3 * 0.01, 3 * 0.005))  # no tensor back, but each step waits its reply
    assert c.exchange_s == pytest.approx(0.02)  # no weights, but the round's train message and its reply
    assert c.round_s == pytest.approx(0.1108 + 0.02308 + 0.0009 + 0.045 + 0.02)


def test_all_on_device_uses_no_link_during_the_round() -> None:
    c = client_cost(scenario(), "c", (2, 2))
    assert c.up_bytes == (0, 0) and c.down_bytes == (0, 0)
    assert c.round_s == pytest.approx(0.09 + 1500 / 2e5 + 1500 / 1e5 + 0.02)


def test_u_shape_returns_to_the_device() -> None:
    sc = scenario(u_shape=True)
    c = client_cost(sc, "c", (0, 1, 1))  # edge holds block 0, device the tail (block 1) and the loss
    assert c.up_bytes == (10 * (800 + 4000), 0)   # input up; gradient of the tail's input back up
    assert c.down_bytes == (10 * 4000, 0)         # the edge's output comes down; no gradient for raw data
    assert c.up_s[0] == pytest.approx(0.48 + 3 * 2 * 0.01)
    assert c.down_s[0] == pytest.approx(0.2 + 3 * 2 * 0.01)  # the backward call's reply carries no tensor
    assert c.compute_s == pytest.approx((0.06, 0.003, 0))
    assert c.exchange_s == pytest.approx(500 / 2e5 + 500 / 1e5 + 0.02)
    assert c.round_s == pytest.approx(0.54 + 0.26 + 0.063 + 0.0275)
    local = client_cost(sc, "c", (1, 1, 1))
    assert local.up_bytes == (0, 0) and local.round_s == pytest.approx(0.09 + 0.0425)


def test_two_tiers_use_the_edge() -> None:
    c = client_cost(scenario(tiers=2), "c", (1,))
    assert c.compute_s == pytest.approx((0.03, 0.006))
    assert len(c.up_s) == 1


def test_makespan_counts_shared_tiers() -> None:
    many = [Client(f"c{i}", "c", DEV.device, DEV.link, samples=10) for i in range(50)]
    sc = scenario(many)
    r = evaluate(sc, {c.name: (0, 0) for c in many})
    cloud = 50 * 10 * 9e6 / 1e11
    link = 50 * 8080 / 1e6
    assert r.shared_s["cloud compute"] == pytest.approx(cloud)
    assert r.shared_s["edge->cloud link up"] == pytest.approx(link)
    assert r.makespan_s == pytest.approx(max(link, cloud, 0.19978))
    assert r.bottleneck == "edge->cloud link up"
    assert r.shared_memory["cloud"] == pytest.approx(50 * (4500 + 4 * 4100 + 4 * 800))  # + the input it receives
    assert r.shared_memory["edge"] == pytest.approx(50 * 4 * 800)  # relaying: it holds what it passes on
    assert round_time(sc, r.assignment()) == r.makespan_s
    assert r.times()["c3"] == pytest.approx(0.19978)


def test_memory_violations_are_reported() -> None:
    small = Client("tiny", "t", TierProfile(1e9, 10_000), DEV.link, samples=10)
    # the edge has room for a batch it relays (4 x 800 bytes), not for block 1 and the tensor it takes
    sc = Scenario(PROF, (small,), (TierProfile(1e10, 4000), CLOUD), (EDGE_LINK,), batch=4)
    r = evaluate(sc, {"tiny": (1, 2)})
    assert not r.feasible
    assert any(v.startswith("tiny: device memory") for v in r.violations)
    assert any(v.startswith("edge memory") for v in r.violations)
    assert evaluate(sc, {"tiny": (0, 0)}).feasible


def test_every_option_priced_alone_equals_its_row() -> None:
    rng = random.Random(0)
    prof = ModelProfile.synthetic([rng.uniform(0, 1e7) for _ in range(5)], [rng.uniform(1, 1e5) for _ in range(5)],
                                  [0, 3e4, 0, 1e6, 5e3], input_bytes=3e4)
    for u in (False, True):
        sc = Scenario(prof, (DEV,), (EDGE, CLOUD), (EDGE_LINK,), batch=7, u_shape=u)
        t = option_table(sc, DEV)
        for r, cuts in enumerate(t.options):
            c = client_cost(sc, DEV, tuple(cuts))
            assert c.round_s == t.round_s[r] and c.memory == tuple(t.memory[r]), cuts  # bit for bit


def test_makespan_does_not_depend_on_client_order() -> None:
    rng = random.Random(1)
    clients = [Client(f"c{i}", "c", TierProfile(rng.uniform(1e9, 1e10), 1e9),
                      LinkProfile(rng.uniform(1e5, 1e6), rng.uniform(1e5, 1e6), 0.01), rng.randint(1, 99))
               for i in range(20)]
    sc = scenario(clients)
    opts = sc.options
    assignment = {c.name: tuple(opts[rng.randrange(len(opts))]) for c in clients}
    a = evaluate(sc, assignment)
    b = evaluate(sc.with_clients(clients[::-1]), assignment)
    assert a.makespan_s == b.makespan_s
    assert a.shared_s == b.shared_s


def test_move_cost_ships_the_blocks_that_change_tier() -> None:
    sc = scenario()
    assert move_cost(sc, DEV, (1, 2), (1, 2)) == 0
    # both blocks' parameters (1500 B; no optimizer state: none is kept across rounds), device -> cloud:
    # up link 1 and up link 2
    assert move_cost(sc, DEV, (2, 2), (0, 0)) == pytest.approx(1500 / 1e5 + 0.01 + 1500 / 1e6 + 0.005)
    assert move_cost(sc, DEV, (0, 0), (2, 2)) == pytest.approx(1500 / 2e5 + 0.01 + 1500 / 1e6 + 0.005)
    # block 1 (500 B) edge -> cloud only
    assert move_cost(sc, DEV, (1, 2), (1, 1)) == pytest.approx(500 / 1e6 + 0.005)


def test_bad_cuts_and_assignments_are_refused() -> None:
    sc = scenario()
    with pytest.raises(CutError, match="need 2 cut"):
        client_cost(sc, "c", (1,))
    with pytest.raises(CutError, match="non-decreasing"):
        client_cost(sc, "c", (2, 1))
    with pytest.raises(ConfigError, match="no cuts for client"):
        evaluate(sc, {})
    with pytest.raises(ConfigError, match="link"):
        Scenario(PROF, (DEV,), (EDGE, CLOUD), (), batch=4)
    with pytest.raises(CutError, match="fewer than 1 leading block"):
        client_cost(Scenario(PROF, (DEV,), (EDGE,), (), min_device_blocks=1), "c", (0,))


def test_shared_load_columns_follow_resource_names() -> None:
    sc = scenario()
    assert sc.resource_names == ("edge compute", "cloud compute", "edge->cloud link up", "edge->cloud link down")
    t = option_table(sc, DEV, np.array([[0, 1]]))
    assert t.shared_load[0].tolist() == pytest.approx([10 * 3e6, 10 * 6e6, 40080, 40000 * 1.0])


# ---------------------------------------------------------------- variants (mode)


def test_modes_match_the_engine_and_bad_ones_are_refused() -> None:
    from splitfed.cost import MODES
    from splitfed.engine.types import MODES as ENGINE_MODES

    assert MODES is ENGINE_MODES  # one definition: the engine's
    with pytest.raises(ConfigError, match="mode must be one of sl, sflv1, sflv2, got 'v3'"):
        Scenario(PROF, (DEV,), (EDGE,), (), mode="v3")
    assert scenario().mode == "sflv1" and scenario().resource_names[-1] == "edge->cloud link down"


def _fleet(n: int = 3) -> list[Client]:
    return [Client(f"c{i}", "c", TierProfile(1e9 * (i + 1), 1e9), LinkProfile(1e5, 2e5, 0.02), samples=10 + i)
            for i in range(n)]


def test_sl_runs_the_clients_in_turn() -> None:
    clients = _fleet()
    cuts = {"c0": (1, 2), "c1": (0, 0), "c2": (2, 2)}
    v1 = evaluate(replace(scenario(clients), mode="sflv1"), cuts)
    sl = evaluate(replace(scenario(clients), mode="sl"), cuts)
    assert sl.times() == v1.times()  # each client's own round is the same
    assert sl.makespan_s == pytest.approx(sum(v1.times().values())) and sl.bottleneck == "clients in turn"
    assert v1.makespan_s == max(v1.times().values())
    # one client's segment at a time, not the sum: c0's (fixed 1500 bytes; its one step's activations, 4 x 100,
    # and the tensor it received, 4 x 4000, or, its turn over, the holder it leaves there, 500), beside the
    # largest holder a client before it can have left (500); c1's relayed batch (4 x 800) is less
    assert sl.shared_memory["edge"] == 1500 + max(4 * 100 + 4 * 4000, 500) + 500
    assert v1.shared_memory["edge"] == pytest.approx(sum(c.memory[1] for c in v1.clients))
    # a client's extra time (moving weights) delays the whole round
    sc = replace(scenario(clients), mode="sl")
    assert evaluate(sc, cuts, extra_s={"c1": 2.0}).makespan_s == pytest.approx(sl.makespan_s + 2.0)
    assert round_time(sc, cuts, {"c1": 2.0}) == evaluate(sc, cuts, extra_s={"c1": 2.0}).makespan_s


def test_sflv2_runs_the_clients_in_turn_as_sl() -> None:
    """SplitFed v2 is priced as the engine runs it: one client after another, the server-side model handed
    on from each to the next (``SplitRound``: a group per client, groups in turn), so its round is sum_i R_i
    and each server holds one client's segment at a time, exactly as in sl. (It was priced as devices in
    parallel against one shared server, max(max_i R_i, sum_i V_i), with the union of the clients' blocks
    in memory: a schedule the engine does not run, 6x too short on the iot fleet.)"""
    many = [Client(f"c{i}", "c", DEV.device, DEV.link, samples=10) for i in range(50)]
    sc = replace(scenario(many), mode="sflv2")
    assert sc.in_turn and sc.resource_names[-1] == "clients in turn" and sc.capacities[-1] == 1.0
    r = evaluate(sc, {c.name: (0, 0) for c in many})
    assert r.shared_s["clients in turn"] == pytest.approx(50 * 0.19978)
    assert r.makespan_s == pytest.approx(50 * 0.19978) and r.bottleneck == "clients in turn"
    v1 = evaluate(replace(sc, mode="sflv1"), {c.name: (0, 0) for c in many})
    assert v1.makespan_s == pytest.approx(max(50 * 8080 / 1e6, 0.19978))  # in parallel: far shorter
    # one client's segment at a time: both blocks' fixed bytes (4500) + one batch of activations (4 x 4100)
    # and of input (4 x 800), beside the holder the client before left (both blocks' weights, 1500)
    assert r.shared_memory["cloud"] == pytest.approx(4500 + 4 * 4100 + 4 * 800 + 1500)
    assert v1.shared_memory["cloud"] == pytest.approx(50 * (4500 + 4 * 4100 + 4 * 800))
    # a client's extra time (moving its weights) delays every client after it
    cuts = {c.name: (0, 0) for c in many}
    assert evaluate(sc, cuts, extra_s={"c1": 2.0}).makespan_s == pytest.approx(r.makespan_s + 2.0)


def test_sflv2_costs_what_sl_costs() -> None:
    """The two variants differ in what the round computes, not in its schedule or its bytes: the same
    exchange of the device's segment (the engine sends it down and back in both), the same turns."""
    rng = random.Random(3)
    for u in (False, True):
        base = scenario(_fleet(4), u_shape=u)
        opts = [tuple(int(x) for x in o) for o in base.options]
        for _ in range(20):
            cuts = {c.name: rng.choice(opts) for c in base.clients}
            extra = {"c2": rng.random()}
            v2, sl = evaluate(replace(base, mode="sflv2"), cuts, extra), evaluate(replace(base, mode="sl"), cuts, extra)
            assert v2.clients == sl.clients and v2.shared_s == sl.shared_s
            assert v2.shared_memory == sl.shared_memory and v2.violations == sl.violations
            assert (v2.makespan_s, v2.bottleneck) == (sl.makespan_s, sl.bottleneck)
    # memory: the larger client's turn beside the larger holder, not the union of the blocks the clients put
    # there; alone, a client has no holder before it
    a, b = _fleet(2)
    r = evaluate(replace(scenario([a, b]), mode="sflv2"), {"c0": (0, 1), "c1": (1, 2)})  # edge: block 0, block 1
    # (each turn with the tensor the edge receives: the input batch, 4 x 800, or block 0's output, 4 x 4000; c0's
    # with block 0's output it sends to the cloud and the gradient that comes back, 2 x 4 x 4000)
    assert r.shared_memory["edge"] == pytest.approx(max(3000 + 4 * 4000 + 4 * 800 + 2 * 4 * 4000,
                                                        1500 + max(4 * 100 + 4 * 4000, 500)) + max(1000, 500))
    alone = evaluate(replace(scenario([a]), mode="sflv2"), {"c0": (1, 2)})
    assert alone.shared_memory["edge"] == pytest.approx(1500 + max(4 * 100 + 4 * 4000, 500))


def test_cost_model_modes_schedule_clients_as_the_engine_groups_them() -> None:
    """``Scenario.in_turn`` (clients one after another) is exactly the variants whose round runs one
    client per group (``SplitRound.groups``; the groups run in turn)."""
    from splitfed.engine.rounds import RoundConfig, SplitRound, initial_state, inprocess_chain
    from splitfed.models.zoo import resolve_spec

    spec = resolve_spec("cnn")
    state = initial_state(spec, 0)
    assignment = {"a": (1, 2), "b": (2, 3), "c": (0, 4)}
    for mode in ("sl", "sflv1", "sflv2"):
        rnd = SplitRound(RoundConfig("r", 1, spec, mode), inprocess_chain(2).tiers, state, assignment)
        in_turn = rnd.groups() == [[c] for c in assignment]
        assert in_turn == (rnd.groups() != [list(assignment)])
        assert replace(scenario(), mode=mode).in_turn == in_turn, mode


def test_shared_resources_per_mode_follow_resource_names() -> None:
    for mode, extra in (("sflv1", 0), ("sflv2", 1), ("sl", 1)):
        sc = replace(scenario(), mode=mode)
        t = option_table(sc, DEV)
        assert t.shared_load.shape[1] == len(sc.resource_names) == len(sc.capacities) == 4 + extra
        if mode != "sflv1":  # clients in turn (sl and sflv2 alike): the serial resource is the round itself
            assert (t.shared_load[:, -1] == t.round_s).all() and sc.capacities[-1] == 1.0
            assert sc.serial_resource == len(sc.resource_names) - 1


# ---------------------------------------------------------------- codecs


def test_codec_bytes_on_the_wire_by_hand() -> None:
    base = client_cost(scenario(), "c", (1, 2))
    for codec, act in (("none", 40000), ("fp16", 20000),
                       # int8: 3 messages (4, 4 and 2 samples of 1000 values): one byte a value + 8 B header
                       ("int8", 3 * 8 + 10000),
                       # top-k 10%: ceil(0.1 x values) x (4 B index + 4 B value) per message
                       ("topk:0.1", (400 + 400 + 200) * 8)):
        c = client_cost(replace(scenario(), codec=codec), "c", (1, 2))
        assert c.up_bytes == (act + 80, 0) and c.down_bytes == (act, 0), codec  # labels: exact
        assert c.exchange_s == base.exchange_s  # weights travel uncompressed
        assert c.up_s[0] == pytest.approx((act + 80) / 1e5 + 3 * 0.01)
    # per link: the device's link compressed, the edge->cloud link not
    c = client_cost(replace(scenario(), codec=("fp16", "none")), "c", (0, 1))
    assert c.up_bytes == (4000 + 80, 40000 + 80) and replace(scenario(), codec=("int8", "int8")).codec == "int8"
    with pytest.raises(ConfigError, match=r"'fp16,int8,none': 3 tiers have 2 link\(s\): give one codec for every "
                                          r"link, or 2, one per link"):
        replace(scenario(), codec=("fp16", "int8", "none"))
    assert replace(scenario(), codec="none, int8").codec == ("none", "int8")  # as a run's compress spells it
    assert replace(scenario(), codec=("fp16",)).codec == "fp16"  # one for all
    with pytest.raises(ConfigError, match="unknown codec 'zip'"):
        replace(scenario(), codec="zip")
    with pytest.raises(ConfigError, match="top-k fraction"):
        replace(scenario(), codec="topk:2")


def test_integer_inputs_travel_exactly() -> None:
    tokens = replace(PROF, spec={"name": "t", "vocab": 17})
    sc = Scenario(tokens, (DEV,), (EDGE, CLOUD), (EDGE_LINK,), batch=4, codec="fp16")
    assert client_cost(sc, "c", (0, 0)).up_bytes == (8000 + 80, 8000 + 80)  # token ids: no codec
    assert client_cost(replace(sc, profile=PROF), "c", (0, 0)).up_bytes == (4000 + 80, 4000 + 80)


@pytest.mark.parametrize("codec", ["none", "fp16", "int8", "topk:0.1"])
@pytest.mark.parametrize("model", ["cnn", "tests.models_for_tests:frozen_front"])
def test_priced_bytes_equal_what_the_in_process_link_counts(codec: str, model: str) -> None:
    """Two steps (a full batch and a short one) of a real model through a real 3-tier in-process chain:
    the bytes each link counts are exactly the bytes the cost model prices, with and without U-shape,
    for every legal cut vector (empty tiers, everything on the device, cuts after parameter-free blocks,
    a U-shape whose head and server part hold no parameters)."""
    import torch

    from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
    from splitfed.models.zoo import resolve_spec
    from splitfed.profile.profiler import profile_model
    from splitfed.transport import compress

    spec = resolve_spec(model) if model == "cnn" else resolve_spec(model, input_shape=(6,), num_classes=3)
    B = 6
    prof = profile_model(spec, batch=B, reps=1)
    state = initial_state(spec, 0)
    g = torch.Generator().manual_seed(0)
    x = spec.example_input(B + 2)
    y = torch.randint(0, spec.num_classes, (B + 2,), generator=g)
    batches = [(x[:B], y[:B]), (x[B:], y[B:])]
    dev = Client("c", "c", TierProfile(1e9, 1e12), LinkProfile(1e6, 1e6, 0.01), samples=B + 2)
    L = prof.n_blocks
    from splitfed.cost.model import cut_options

    every = [(False, tuple(map(int, c))) for c in cut_options(L, 3)]
    every += [(True, tuple(map(int, c))) for c in cut_options(L, 3, u_shape=True)]
    assert (False, (L, L)) in every and (False, (0, 0)) in every and len(every) > 10
    if model != "cnn":  # the case where no block before the tail trains
        assert any(u and sum(prof.param_bytes[:cuts[-1]]) == 0 < cuts[-1] for u, cuts in every)
    for u, cuts in every:
        chain = inprocess_chain(2, *compress.get(codec))
        _, res = run_round(RoundConfig("r", 1, spec, "sflv1", u_shape=u), chain, state, {"c": cuts}, {"c": batches})
        edge_link = chain.tiers[0].next
        sc = Scenario(prof, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B, u_shape=u, codec=codec)
        c = client_cost(sc, dev, cuts)
        assert c.up_bytes == (res[0].bytes_up, edge_link.bytes_up), (u, cuts)
        assert c.down_bytes == (res[0].bytes_down, edge_link.bytes_down), (u, cuts)


def test_a_top_k_fraction_is_priced_as_the_codec_sends_it() -> None:
    """The scenario kept ``topk:0.1000004`` as ``topk:0.1`` (``:g``), so it priced 800,000 bytes for a message
    of a million floats that the codec sends as 800,008."""
    import torch

    from splitfed.cost.wire import wire_bytes
    from splitfed.transport.codec import Codec, payload_size

    sc = replace(scenario(), codec="topk:0.1000004")
    assert sc.codec == "topk:0.1000004"
    sent = payload_size(torch.float32, (10**6,), Codec.parse("topk:0.1000004"))
    assert float(wire_bytes(sc.codec, 4.0, 10**6)) == sent == 800008
