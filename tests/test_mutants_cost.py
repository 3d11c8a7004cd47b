"""Prices of the cost model that a mutation run found unpinned: a round's latency counts every batch of every
epoch, a U-shape device's forward and fixed memory include its tail, a scenario's default batch, an in-turn
server's memory (the largest turn plus the largest holder), an empty codec setting, and the refusal of an
element size no dtype has. Each expected value is worked out here from the module docstring's formulas on a
small hand-made profile, not read off the implementation."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError

import numpy as np
import pytest

from splitfed.cost import Scenario, client_cost, evaluate
from splitfed.cost.model import option_table
from splitfed.cost.wire import link_codecs, parse_codec, wire_bytes
from splitfed.errors import ConfigError
from splitfed.profile import Client, Fleet, LinkProfile, ModelProfile, TierProfile

# three blocks with distinct, easily told apart numbers (per sample unless fixed); float32 boundaries
FWD = (1.0, 10.0, 100.0)
BWD = (2.0, 20.0, 200.0)
PARAM = (5.0, 50.0, 500.0)      # state bytes too (a synthetic profile): what the weight exchange sends
OUT = (8.0, 80.0, 800.0)        # a_1, a_2, a_3
ACT = (12.0, 120.0, 1200.0)
FIXED = (1000.0, 20000.0, 300000.0)
PROF = ModelProfile("m", 1, ("a", "b", "c"), 4.0, FWD, BWD, PARAM, OUT, ACT, FIXED)

DEV_FLOPS, EDGE_FLOPS = 1000.0, 2000.0
UP, DOWN, RTT = 100.0, 400.0, 0.1


def _scenario(samples: int = 10, batch: int = 4, epochs: int = 1, u_shape: bool = False,
              codec: str = "none") -> tuple[Scenario, Client]:
    c = Client("c", "c", TierProfile(DEV_FLOPS, math.inf), LinkProfile(UP, DOWN, RTT), samples)
    sc = Scenario(PROF, (c,), (TierProfile(EDGE_FLOPS, math.inf),), (), batch=batch, epochs=epochs,
                  u_shape=u_shape, codec=codec)
    return sc, c


@pytest.mark.parametrize("epochs", [1, 2, 3])
def test_a_round_s_price_counts_every_batch_of_every_epoch(epochs: int) -> None:
    """Cut after block 0 on device + edge: 10 samples in batches of 4 is 3 batches an epoch (4, 4, 2), each a
    call answered before the next, so n = 3 x epochs half round trips each way; S = 10 x epochs samples carry
    their activation a_1 and an int64 label up, the gradient a_1 down (block 0 trains)."""
    sc, c = _scenario(epochs=epochs)
    cc = client_cost(sc, c, (1,))
    S, n = 10 * epochs, 3 * epochs
    assert cc.batches == n
    assert cc.up_bytes == pytest.approx((S * (OUT[0] + 8.0),))
    assert cc.down_bytes == pytest.approx((S * OUT[0],))
    up_s = S * (OUT[0] + 8.0) / UP + n * RTT / 2
    down_s = S * OUT[0] / DOWN + n * RTT / 2
    assert cc.up_s == pytest.approx((up_s,))
    assert cc.down_s == pytest.approx((down_s,))
    compute = (S * (FWD[0] + BWD[0]) / DEV_FLOPS, S * (FWD[1] + BWD[1] + FWD[2] + BWD[2]) / EDGE_FLOPS)
    assert cc.compute_s == pytest.approx(compute)
    exchange = PARAM[0] / DOWN + PARAM[0] / UP + RTT  # block 0's state down and back up, one train call
    assert cc.exchange_s == pytest.approx(exchange)
    assert cc.round_s == pytest.approx(sum(compute) + up_s + down_s + exchange)


def test_labels_travel_as_int64_beside_a_compressed_boundary() -> None:
    """int8 sends a message of v float32 values as 8 + v bytes; labels are never compressed (8 bytes each).
    A round of 10 samples in batches of 4: messages of 4, 4 and 2 samples."""
    sc, c = _scenario(codec="int8")
    cc = client_cost(sc, c, (1,))
    values = OUT[0] / 4.0  # float32 values per sample at boundary 1
    acts = sum(8.0 + b * values for b in (4, 4, 2))
    assert cc.up_bytes == pytest.approx((acts + 10 * 8.0,))
    assert cc.down_bytes == pytest.approx((acts,))


def test_a_u_shape_device_s_forward_and_fixed_memory_include_its_tail() -> None:
    """U-shape cuts (1, 2): the device holds block 0 and the tail block 2, the edge block 1. One batch of 4:
    the device's forward is f_0 + f_2 (its backward b_0 + b_2), and its fixed memory m_0 + m_2 (the rest of
    its memory is the activation part)."""
    sc, c = _scenario(u_shape=True)
    cc = client_cost(sc, c, (1, 2))
    parts = cc.batch()
    B = 4
    assert parts["forward_s"] == pytest.approx((B * (FWD[0] + FWD[2]) / DEV_FLOPS, B * FWD[1] / EDGE_FLOPS))
    assert parts["backward_s"] == pytest.approx((B * (BWD[0] + BWD[2]) / DEV_FLOPS, B * BWD[1] / EDGE_FLOPS))
    fixed = tuple(m - a for m, a in zip(cc.memory, cc.act_memory, strict=True))
    assert fixed == pytest.approx((FIXED[0] + FIXED[2], FIXED[1]))


def test_the_default_round_is_3_tiers_batch_32_one_epoch_in_both_constructors() -> None:
    """The plain constructor and ``Scenario.from_fleet`` price the same round when none is given: batch 32
    (100 samples: 4 batches), one epoch, and from a fleet the 3-tier chain device -> edge -> cloud."""
    c = Client("c", "c", TierProfile(DEV_FLOPS, math.inf), LinkProfile(UP, DOWN, RTT), 100)
    sc = Scenario(PROF, (c,), (TierProfile(EDGE_FLOPS, math.inf),))
    assert (sc.batch, sc.epochs) == (32, 1)
    assert client_cost(sc, c, (1,)).batches == 4
    edge, cloud = TierProfile(EDGE_FLOPS, math.inf), TierProfile(2 * EDGE_FLOPS, math.inf)
    fleet = Fleet("f", edge, (c,), cloud, LinkProfile(UP, DOWN, RTT))
    ff = Scenario.from_fleet(PROF, fleet)
    assert (ff.tiers, ff.servers, ff.batch, ff.epochs) == (3, (edge, cloud), 32, 1)
    assert client_cost(ff, c, (1, 2)).batches == 4


# big weights, tiny activations: a holder (its state) outweighs one step's activations on the edge
BIG_PARAM = (5e5, 5e6, 5e7)
BIG_FIXED = (2e6, 2e7, 2e8)
HEAVY = ModelProfile("heavy", 1, ("a", "b", "c"), 4.0, FWD, BWD, BIG_PARAM, OUT, ACT, BIG_FIXED)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_in_turn_edge_memory_is_the_largest_turn_plus_the_largest_holder(mode: str) -> None:
    """sl and sflv2: turn_c = fixed_c + max(B h_c, H_c), memory = max_c turn_c + max_c H_c (one client: its
    turn alone). Client a holds blocks 1, 2 on the edge (H_a = w_1 + w_2), b block 2 (H_b = w_2); batch 1, so
    each holder outweighs a step's activations and a turn ends at fixed + H."""
    def client(name: str) -> Client:
        return Client(name, "c", TierProfile(DEV_FLOPS, math.inf), LinkProfile(UP, DOWN, RTT), 10)

    a, b = client("a"), client("b")
    sc = Scenario(HEAVY, (a, b), (TierProfile(EDGE_FLOPS, math.inf),), (), batch=1, mode=mode)
    h_a, h_b = BIG_PARAM[1] + BIG_PARAM[2], BIG_PARAM[2]
    f_a, f_b = BIG_FIXED[1] + BIG_FIXED[2], BIG_FIXED[2]
    for c, cuts, h, f in ((a, (1,), h_a, f_a), (b, (2,), h_b, f_b)):
        cc = client_cost(sc, c, cuts)
        assert cc.memory[1] - cc.act_memory[1] == pytest.approx(f)
        assert 0 < cc.act_memory[1] < h  # the premise: the holder is the larger
    got = evaluate(sc, {"a": (1,), "b": (2,)}).shared_memory["edge"]
    assert got == pytest.approx(max(f_a + h_a, f_b + h_b) + max(h_a, h_b))
    alone = sc.with_clients((b,))
    assert evaluate(alone, {"b": (2,)}).shared_memory["edge"] == pytest.approx(f_b + h_b)


# ---------------------------------------------------------------- codecs: the empty setting, odd element sizes


@pytest.mark.parametrize("empty", ["", " ", [""]])
def test_an_empty_compress_setting_is_no_codec_on_every_link(empty: str | list[str]) -> None:
    """One empty codec is ``none`` for every link (as the transport parses it); only an empty one among
    several (``int8,``) is refused, naming which."""
    assert link_codecs(empty, 2) == ("none", "none")
    c = Client("c", "c", TierProfile(DEV_FLOPS, math.inf), LinkProfile(UP, DOWN, RTT), 10)
    sc = Scenario(PROF, (c,), (TierProfile(EDGE_FLOPS, math.inf), TierProfile(EDGE_FLOPS, math.inf)),
                  (LinkProfile(UP, DOWN, RTT),), codec="")
    assert sc.codec == "none"
    with pytest.raises(ConfigError, match="codec 2 of 2 is empty"):
        link_codecs("int8,", 2)


@pytest.mark.parametrize("size", [3.0, 9.0, 16.0])
def test_a_boundary_of_an_element_size_no_dtype_has_is_refused_in_a_table(size: float) -> None:
    """The option tables price boundaries as arrays: an element size the wire has no floating dtype for (just
    past float64's 8 bytes too) is a ConfigError naming it, as for one message; float32 beside it is fine."""
    with pytest.raises(ConfigError, match=f"codec int8: no floating dtype the wire carries has values of {size:g} "
                                          "bytes"):
        wire_bytes("int8", np.array([4.0 * size, 8.0]), 4, itemsize=np.array([size, 4.0]))
    with pytest.raises(ConfigError, match=f"values of {size:g} bytes"):
        wire_bytes("int8", 4.0 * size, 4, itemsize=size)
    # int8: 8 header bytes + one byte a value; 4 samples of 2 float32 values
    assert wire_bytes("int8", np.array([8.0]), 4, itemsize=np.array([4.0])).tolist() == [8.0 + 4 * 2]


def test_a_scenario_and_its_option_table_are_immutable() -> None:
    """A scenario caches what its prices are made of (prefix sums, message sizes, capacities), so changing a
    field in place would price the old scenario: it is frozen (``dataclasses.replace`` makes a new one), and so
    is an option table."""
    sc, c = _scenario()
    before = client_cost(sc, c, (1,)).round_s
    with pytest.raises(FrozenInstanceError):
        sc.batch = 8  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        sc.profile = HEAVY  # type: ignore[misc]
    assert client_cost(sc, c, (1,)).round_s == before
    table = option_table(sc, c)
    with pytest.raises(FrozenInstanceError):
        table.round_s = table.round_s * 0  # type: ignore[misc]
    rc = evaluate(sc, {"c": (1,)})
    with pytest.raises(FrozenInstanceError):
        rc.makespan_s = 0.0  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        rc.clients[0].round_s = 0.0  # type: ignore[misc]


def test_a_device_whose_memory_equals_the_price_fits() -> None:
    """The device fits when its priced memory is at most its own: exactly equal fits (no violation), a byte
    less does not."""
    sc, c = _scenario()
    need = client_cost(sc, c, (1,)).memory[0]
    for cap, fits in ((need, True), (need - 1.0, False)):
        d = Client("c", "c", TierProfile(DEV_FLOPS, cap), LinkProfile(UP, DOWN, RTT), 10)
        tight = sc.with_clients((d,))
        assert client_cost(tight, d, (1,)).fits_device is fits
        got = evaluate(tight, {"c": (1,)})
        assert got.feasible is fits
        assert [v.startswith("c: device memory") for v in got.violations] == ([] if fits else [True])


@pytest.mark.parametrize("name", [None, "", "none", " NONE ", "fp16", "int8", "topk:0.1"])
def test_parse_codec_is_the_transport_s_reading(name: str | None) -> None:
    """``parse_codec`` (public) gives the transport's own (kind, fraction): ``none`` keeps every value, 1.0."""
    from splitfed.transport.codec import Codec

    c = Codec.parse(name)
    assert parse_codec(name) == (c.kind, c.fraction)
    if c.kind == "none":
        assert parse_codec(name) == ("none", 1.0)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_one_client_in_turn_is_its_own_bottleneck(mode: str) -> None:
    """In turn, the round is the clients' sum; with one client that is its own time, and the report names the
    client, not the "clients in turn" resource that ties with it."""
    sc, c = _scenario()
    sc = Scenario(PROF, (c,), sc.servers, (), batch=4, mode=mode)
    got = evaluate(sc, {"c": (1,)})
    assert got.makespan_s == pytest.approx(client_cost(sc, c, (1,)).round_s)
    assert got.shared_s["clients in turn"] == got.makespan_s
    assert got.bottleneck == "client c"


def test_sflv1_u_shape_edge_memory_includes_the_staged_base() -> None:
    """sflv1, U-shape cuts (1, 2) for two clients: both hold block 1 on the edge, so the round stages its
    state w_1 there once; batch 1, so that base outweighs the two clients' activations:
    memory = 2 m_1 + max(w_1, sum of activations) = 2 m_1 + w_1."""
    def client(name: str) -> Client:
        return Client(name, "c", TierProfile(DEV_FLOPS, math.inf), LinkProfile(UP, DOWN, RTT), 10)

    a, b = client("a"), client("b")
    sc = Scenario(HEAVY, (a, b), (TierProfile(EDGE_FLOPS, math.inf),), (), batch=1, u_shape=True)
    acts = sum(client_cost(sc, c, (1, 2)).act_memory[1] for c in (a, b))
    assert 0 < acts < BIG_PARAM[1]  # the premise
    got = evaluate(sc, {"a": (1, 2), "b": (1, 2)}).shared_memory["edge"]
    assert got == pytest.approx(2 * BIG_FIXED[1] + BIG_PARAM[1])


@pytest.mark.parametrize(("mode", "clients", "holders"), [("sl", 1, False), ("sflv2", 1, False), ("sl", 2, True),
                                                          ("sflv2", 3, True), ("sflv1", 2, False)])
def test_a_tier_keeps_a_holder_only_in_turn_and_behind_another_client(mode: str, clients: int, holders: bool) -> None:
    """A holder is the model as the client before left it: none for sflv1 (replicas), none for a lone client."""
    fleet = tuple(Client(f"c{i}", "c", TierProfile(DEV_FLOPS, math.inf), LinkProfile(UP, DOWN, RTT), 10)
                  for i in range(clients))
    sc = Scenario(HEAVY, fleet, (TierProfile(EDGE_FLOPS, math.inf),), (), batch=1, mode=mode)
    assert sc.holders is holders


def test_a_lone_in_turn_client_may_fill_the_edge_with_its_turn() -> None:
    """sl, one client, the edge exactly as large as its turn at cut 1 (fixed m_1 + m_2 plus its holder, which
    outweighs a step's activations), and the device too small for block 1: cut 1 is feasible and chosen (no
    holder of another client is priced beside it)."""
    from splitfed.optimizer import solve

    turn = BIG_FIXED[1] + BIG_FIXED[2] + BIG_PARAM[1] + BIG_PARAM[2]
    probe = Client("c", "c", TierProfile(DEV_FLOPS, math.inf), LinkProfile(UP, DOWN, RTT), 10)
    dev_mem = client_cost(Scenario(HEAVY, (probe,), (TierProfile(EDGE_FLOPS, math.inf),), (), batch=1, mode="sl"),
                          probe, (1,)).memory[0]
    c = Client("c", "c", TierProfile(DEV_FLOPS, dev_mem), LinkProfile(UP, DOWN, RTT), 10)
    sc = Scenario(HEAVY, (c,), (TierProfile(EDGE_FLOPS, turn),), (), batch=1, mode="sl")
    assert evaluate(sc, {"c": (1,)}).shared_memory["edge"] == pytest.approx(turn)
    assert evaluate(sc, {"c": (1,)}).feasible
    assert tuple(solve(sc).assignment["c"]) == (1,)


