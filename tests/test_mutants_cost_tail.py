"""More prices of the cost model that a mutation run found unpinned (the second half of its run): a U-shape batch's
bytes on the device's link, what a tier holds of the tensor it sends on (kept by its own blocks, not by another
tier's), a tier that holds no block, when a gradient comes back (any trainable byte, any floating boundary, none
through token ids), a move's half round trip, a holder's bytes under U-shape, the names of a long chain, the
options of a U-shape (2 and 3 tiers) against the cut check, and pricing a cut vector outside the option set. Each
expected value is worked out here from the module docstring's formulas on a small hand-made profile, not read off
the implementation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from splitfed.cost import Scenario, client_cost
from splitfed.cost.model import held_memory, move_cost, option_table
from splitfed.cost.wire import wire_bytes
from splitfed.errors import ConfigError, CutError
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

# three blocks with distinct, easily told apart numbers (per sample unless fixed); float32 boundaries
IN = 4.0
FWD = (1.0, 10.0, 100.0)
BWD = (2.0, 20.0, 200.0)
PARAM = (5.0, 50.0, 500.0)      # state bytes too (a synthetic profile)
OUT = (8.0, 80.0, 800.0)        # a_1, a_2, a_3
ACT = (12.0, 120.0, 1200.0)
FIXED = (1000.0, 20000.0, 300000.0)

DEV_FLOPS, EDGE_FLOPS = 1000.0, 2000.0
UP, DOWN, RTT = 100.0, 400.0, 0.1
INF = math.inf


def _profile(**kw: object) -> ModelProfile:
    return ModelProfile("m", 1, ("a", "b", "c"), IN, FWD, BWD, PARAM, OUT, ACT, FIXED, **kw)  # type: ignore[arg-type]


def _client(name: str = "c", samples: int = 10) -> Client:
    return Client(name, "c", TierProfile(DEV_FLOPS, INF), LinkProfile(UP, DOWN, RTT), samples)


def _chain(prof: ModelProfile, tiers: int = 2, batch: int = 4, **kw: object) -> tuple[Scenario, Client]:
    """One client on a chain of ``tiers`` tiers (servers 2000, 4000, ... FLOP/s; every link UP/DOWN/RTT)."""
    c = _client()
    servers = tuple(TierProfile(EDGE_FLOPS * (t + 1), INF) for t in range(tiers - 1))
    links = tuple(LinkProfile(UP, DOWN, RTT) for _ in range(tiers - 2))
    return Scenario(prof, (c,), servers, links, batch=batch, **kw), c  # type: ignore[arg-type]


def test_a_u_shape_batch_sends_the_head_s_output_and_the_tail_s_gradient_up_and_both_back_down() -> None:
    """U-shape cuts (1, 2), one batch of 4: up the device's link go a_1 (the head's output) and the gradient of
    the tail's input a_2; down come a_2 (the tail's input) and a_1's gradient (block 0 trains). Two calls a
    batch (forward, backward), each a round trip."""
    sc, c = _chain(_profile(), u_shape=True)
    parts = client_cost(sc, c, (1, 2)).batch()
    B = 4
    assert parts["up_s"] == pytest.approx(((B * OUT[0] + B * OUT[1]) / UP + 2 * RTT / 2,))
    assert parts["down_s"] == pytest.approx(((B * OUT[0] + B * OUT[1]) / DOWN + 2 * RTT / 2,))


def test_a_u_shape_tail_whose_input_training_s_gradient_does_not_reach_sends_none_up() -> None:
    """Blocks 0 and 1 compute without autograd (``grad_reach`` False up to boundary 2; nothing before the tail
    trains): the tail's input a_2 comes down all the same and a_1 goes up, but no gradient of either travels;
    the backward call still goes (a round trip)."""
    prof = _profile(train_bytes=(0.0, 0.0, PARAM[2]), grad_reach=(False, False, False, True))
    sc, c = _chain(prof, u_shape=True)
    parts = client_cost(sc, c, (1, 2)).batch()
    B = 4
    assert parts["up_s"] == pytest.approx((B * OUT[0] / UP + RTT,))
    assert parts["down_s"] == pytest.approx((B * OUT[1] / DOWN + RTT,))


def test_the_device_s_output_kept_by_its_input_batch_is_held_once() -> None:
    """Cut (1,), batch 4: the device holds its fixed part, block 0's activations, its input batch a_0, the
    output a_1 it sent on (less the x bytes of it that are a view of the input batch, ``out_kept`` j = -1,
    held anyway) and a_1's gradient when it comes back: m_0 + B (h_0 + a_0 + (a_1 - x) + a_1)."""
    x = 6.0
    sc, c = _chain(_profile(out_kept=((1, -1, x),)))
    B = 4
    assert client_cost(sc, c, (1,)).memory[0] == pytest.approx(FIXED[0] + B * (ACT[0] + IN + (OUT[0] - x) + OUT[0]))


def test_a_server_s_output_kept_by_a_block_of_another_tier_is_held_in_full() -> None:
    """3 tiers, cuts (1, 2): the edge holds block 1 only. Boundary 2 is x bytes of a view kept by block 0 (on
    the device: ``out_kept`` (2, 0, x)) and, on a tier starting at 1, y bytes of a view of what the tier
    received (``out_views`` (2, 1, y), held anyway). The edge holds m_1 + B (h_1 + a_1 (received) + (a_2 - y)
    (sent on) + a_2 (its gradient)): block 0's keep is on the device, not here."""
    x, y = 48.0, 30.0
    sc, c = _chain(_profile(out_kept=((2, 0, x),), out_views=((2, 1, y),)), tiers=3)
    B = 4
    assert client_cost(sc, c, (1, 2)).memory[1] == pytest.approx(FIXED[1] + B * (ACT[1] + OUT[0] + (OUT[1] - y)
                                                                                  + OUT[1]))


@pytest.mark.parametrize("cuts", [(1, 2, 2), (1, 1, 2)])
def test_a_tier_that_holds_no_block_keeps_the_clone_of_a_tensor_taken_with_a_gradient(cuts: tuple[int, ...]) -> None:
    """4 tiers, block 0 frozen (no gradient at boundary 1), block 1 trains (one at boundary 2). The tier that
    holds no block receives a_k, keeps it, and sends on the clone its segment makes of it if it came with a
    gradient, then holds the gradient that comes back: B (a_k + grad_k a_k + grad_k a_k)."""
    prof = _profile(train_bytes=(0.0, PARAM[1], PARAM[2]))
    sc, c = _chain(prof, tiers=4)
    B = 4
    empty = 2 if cuts[1] == cuts[2] else 1  # the tier with lo == hi
    a, g = OUT[cuts[empty] - 1], 1.0 if cuts[empty] == 2 else 0.0
    assert client_cost(sc, c, cuts).memory[empty] == pytest.approx(B * (a + g * a + g * a))


@pytest.mark.parametrize(("kw", "gradient"), [
    ({"train_bytes": (1.0, PARAM[1], PARAM[2])}, True),         # one trainable byte before the cut is enough
    ({"out_dtype": ("float8_e4m3fn", "float32", "float32")}, True),  # a 1-byte float boundary carries one
    ({"out_dtype": ("int64", "float32", "float32")}, False),     # none through token ids
    ({"train_bytes": (0.0, PARAM[1], PARAM[2])}, False),         # nothing before the cut trains
])
def test_a_gradient_comes_back_iff_a_block_before_the_cut_trains_and_the_boundary_is_floating(
        kw: dict[str, tuple], gradient: bool) -> None:
    """Cut (1,), 10 samples, batches of 4 (3 calls): down the device's link come S a_1 bytes iff a gradient
    does; the round trips are priced all the same (the reply carries the loss)."""
    sc, c = _chain(_profile(**kw))
    cc = client_cost(sc, c, (1,))
    down = 10 * OUT[0] if gradient else 0.0
    assert cc.down_bytes == pytest.approx((down,))
    assert cc.down_s == pytest.approx((down / DOWN + 3 * RTT / 2,))


@pytest.mark.parametrize(("old", "new", "seconds"), [((1,), (0,), 1.0 / UP + RTT / 2),
                                                     ((0,), (1,), 1.0 / DOWN + RTT / 2)])
def test_moving_a_single_byte_of_state_costs_a_half_round_trip(old: tuple[int], new: tuple[int],
                                                               seconds: float) -> None:
    """Block 0's state dict is one byte (a bool buffer, say): moving it up to the edge or back down to the
    device sends it and pays the link's half round trip, like any other move."""
    sc, c = _chain(_profile(state_bytes=(1.0, PARAM[1], PARAM[2])))
    assert move_cost(sc, c, old, new) == pytest.approx(seconds)


@pytest.mark.parametrize(("tiers", "cuts", "held"), [(2, (1, 2), (PARAM[1],)),
                                                     (3, (0, 1, 2), (PARAM[0], PARAM[1]))])
def test_a_u_shape_holder_is_the_state_of_the_server_segments_up_to_the_tail(
        tiers: int, cuts: tuple[int, ...], held: tuple[float, ...]) -> None:
    """sl: a holder keeps a client's server segment's state when its turn ends; with U-shape the servers
    hold [k_t, k_t+1) up to the tail cut u, never the tail."""
    sc, _ = _chain(_profile(), tiers=tiers, u_shape=True, mode="sl")
    assert held_memory(sc, np.asarray([cuts])).tolist() == [list(held)]


@pytest.mark.parametrize(("tiers", "names"), [(2, ("device", "edge")), (3, ("device", "edge", "cloud")),
                                              (4, ("device", "edge", "tier2", "cloud")),
                                              (5, ("device", "edge", "tier2", "tier3", "cloud"))])
def test_a_chain_s_tiers_are_named_device_edge_tierN_cloud(tiers: int, names: tuple[str, ...]) -> None:
    """Every tier has its own name (and so its own compute resource) however long the chain."""
    sc, _ = _chain(_profile(), tiers=tiers)
    assert sc.tier_names == names
    assert sc.resource_names[: tiers - 1] == tuple(f"{n} compute" for n in names[1:])


@pytest.mark.parametrize("tiers", [2, 3])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float16", "int64"])
def test_u_shape_options_are_exactly_the_cuts_check_cuts_accepts(dtype: str, tiers: int) -> None:
    """The option table the optimizer searches and the cut check agree, whatever the dtype at boundary 2: a
    tail may start at any floating tensor (1-byte floats too), not at an integer one fed by the servers. With
    3 tiers (k_1, k_2, u): a tail fed by the servers (k_1 < u) may not start at an integer tensor, whatever
    k_2; a tail fed by the head alone (k_1 = u) may."""
    sc, _ = _chain(_profile(out_dtype=("float32", dtype, "float32")), tiers=tiers, u_shape=True)
    accepted = set()
    for row in itertools.combinations_with_replacement(range(4), tiers):  # every vector, all-equal ones too
        try:
            accepted.add(sc.check_cuts(row))
        except CutError:
            pass
    # one row for each placement: the all-equal vectors (the whole model on the device) as 3,...,3
    assert {tuple(r) for r in sc.options.tolist()} == {(3,) * len(c) if c[0] == c[-1] else c for c in accepted}
    floating = dtype != "int64"
    if tiers == 2:
        assert ((1, 2) in accepted) is floating
    else:
        assert ((1, 1, 2) in accepted) is ((0, 1, 2) in accepted) is floating
        assert (2, 2, 2) in accepted


def test_a_cut_vector_outside_the_option_set_is_priced_as_any_other() -> None:
    """``option_table`` prices the cut vectors it is given even when none is among the scenario's options
    (the adapter prices a client's current cuts; here below ``min_device_blocks``): the same as a scenario
    whose options include it."""
    prof = _profile()
    strict, c = _chain(prof, min_device_blocks=1)
    free, _ = _chain(prof)
    got, want = option_table(strict, c, np.asarray([[0]])), option_table(free, c, np.asarray([[0]]))
    assert got.round_s.tolist() == want.round_s.tolist()
    assert got.up_bytes.tolist() == want.up_bytes.tolist() == [[10 * (IN + 8.0)]]


def test_a_scalar_element_size_past_every_known_dtype_is_refused() -> None:
    """An element size no floating dtype on the wire has, even one just past the largest (9 bytes), is a
    ConfigError naming it, not an index error."""
    with pytest.raises(ConfigError, match="9 bytes"):
        wire_bytes("int8", 36.0, 4, itemsize=9.0)
    assert float(wire_bytes("int8", 32.0, 4, itemsize=8.0)) == 8.0 + 4 * 32.0 / 8.0  # float64: 8 + one byte a value
