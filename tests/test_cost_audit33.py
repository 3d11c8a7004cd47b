"""Cost-model audit (session 33): hand-computed rounds on a tiny fleet where the old code priced wrong."""

from __future__ import annotations

import pytest

from splitfed.cost import Scenario, client_cost
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

# three blocks; per sample forward 1 MFLOP each (backward 2x), outputs 1000, 2000 and 40 bytes, input 500
PROF = ModelProfile.synthetic([1e6, 1e6, 1e6], [1000, 2000, 40], [100, 200, 300], input_bytes=500)
# 1 GFLOP/s; 1 MB/s up (8 Mbit/s), 2 MB/s down (16 Mbit/s), 100 ms round trip; 10 samples in batches of 5: 2 batches
DEV = Client("a", "a", TierProfile(1e9, 1e9), LinkProfile(1e6, 2e6, 0.1), samples=10)
EDGE, CLOUD = TierProfile(1e10, 1e9), TierProfile(1e11, 1e9)
EDGE_LINK = LinkProfile(1e7, 2e7, 0.01)


def _sc(u_shape: bool = False) -> Scenario:
    return Scenario(PROF, (DEV,), (EDGE, CLOUD), (EDGE_LINK,), batch=5, u_shape=u_shape)


def test_a_step_that_returns_no_gradient_still_waits_a_round_trip() -> None:
    """Every step is a call the device waits on (its reply carries the loss), gradient or not: a full round
    trip per batch on every link it crosses. The old code charged only the half RTT up when no gradient came
    back (cut 0: raw inputs up, nothing to send back), pricing a device at cut 0 n x rtt/2 too fast per link."""
    c = client_cost(_sc(), "a", (0, 0))
    assert c.down_bytes == (0.0, 0.0)  # no gradient for raw inputs
    assert c.up_s == pytest.approx((5080 / 1e6 + 2 * 0.05, 5080 / 1e7 + 2 * 0.005))
    assert c.down_s == pytest.approx((2 * 0.05, 2 * 0.005))  # the replies (old: 0, 0)
    assert c.exchange_s == pytest.approx(0.1)  # no weights; the round's train message and reply (below)
    assert c.round_s == pytest.approx(10 * 9e6 / 1e11 + 5080 / 1e6 + 5080 / 1e7 + 2 * (0.1 + 0.01) + 0.1)
    assert c.batch()["down_s"] == pytest.approx((0.05, 0.005))
    # with a gradient the step's reply carries it: one round trip as well, as before
    g = client_cost(_sc(), "a", (1, 3))
    assert g.up_s[0] + g.down_s[0] == pytest.approx(10080 / 1e6 + 10000 / 2e6 + 2 * 0.1)


def test_a_u_shape_batch_is_two_round_trips_whatever_comes_back() -> None:
    """U-shape: a forward call (answered with the tail's input) and a backward call (answered with the gradient,
    or with nothing when no block before the servers trains): two round trips a batch. The old code charged
    1.5 when no gradient came back down."""
    c = client_cost(_sc(u_shape=True), "a", (0, 2, 2))  # edge holds blocks 0-1, the device the tail (block 2)
    assert c.up_bytes[0] == 10 * 500 + 10 * 2000 and c.down_bytes[0] == 10 * 2000
    assert c.up_s[0] == pytest.approx(25000 / 1e6 + 2 * 2 * 0.05)
    assert c.down_s[0] == pytest.approx(20000 / 2e6 + 2 * 2 * 0.05)  # old: 2 x 1 x 0.05


def test_a_client_with_fewer_samples_than_a_batch_is_priced_at_the_batch_it_runs() -> None:
    """A client of 3 samples at batch 32 runs one batch of 3 (``splitfed.data.batches`` keeps the short
    batch): its activations are 3 samples' worth. The old code priced 32, so a device that holds its
    3-sample batch was refused as one that no cut fits."""
    from dataclasses import replace

    from splitfed.optimizer import solve

    few = replace(DEV, samples=3)
    at = {b: client_cost(Scenario(PROF, (few,), (EDGE, CLOUD), (EDGE_LINK,), batch=b), "a", (3, 3)) for b in (3, 32)}
    assert at[32].memory == at[3].memory
    many = client_cost(Scenario(PROF, (replace(DEV, samples=32),), (EDGE, CLOUD), (EDGE_LINK,), batch=32), "a", (3, 3))
    assert many.memory[0] > at[32].memory[0]
    # a device whose memory holds its 3-sample input batch (cut 0: nothing else) but not 32 samples' of any cut
    cap = client_cost(Scenario(PROF, (few,), (EDGE, CLOUD), (EDGE_LINK,), batch=32), "a", (0, 0)).memory[0] + 1
    assert cap == 3 * 500 + 1
    tiny = replace(few, device=replace(few.device, memory=cap))
    sol = solve(Scenario(PROF, (tiny,), (EDGE, CLOUD), (EDGE_LINK,), batch=32))
    assert sol.assignment["a"][0] == 0 and sol.cost.clients[0].memory[0] <= cap


def test_a_device_that_holds_no_block_still_pays_its_round_s_message() -> None:
    """The round's train message reaches a device at cut 0 and its reply (metrics, no weights) comes back: a
    round trip on its link. The old code priced the weight exchange at 0 when it sent no weight, so cut 0 was
    rtt_1 cheaper than the engine runs it."""
    for cuts in ((0, 0), (0, 3), (3, 3)):
        c = client_cost(_sc(), "a", cuts)
        w = c.exchange_bytes
        assert c.exchange_s == pytest.approx(w / DEV.link.down + w / DEV.link.up + DEV.link.rtt)
    assert client_cost(_sc(), "a", (0, 0)).exchange_bytes == 0
