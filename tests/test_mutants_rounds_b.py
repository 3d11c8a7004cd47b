"""More of one round's bookkeeping pinned to values computed independently: which tier of a client's chain
computes the loss, a short client's mean loss and its weight in sflv1's means, which of two holders on a tier
is fetched, the errors a tier that is gone raises, and the labels of a longer chain's tiers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.engine.device import Device
from splitfed.engine.rounds import (
    Chain,
    RoundConfig,
    RoundFailed,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    tier_loads,
    train_client,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import Reduced, ReduceItem
from splitfed.errors import ResourceExhausted, Unavailable
from tests.test_mutants_rounds import KEY, OPTIM, SPEC, _batches, _blocks_bytes, _cfg
from tests.test_round_faults import Fault, _Faulty

N = 7  # SPEC's blocks; weights in blocks 0, 2, 5 and 6


def _faulty_chain(server_tiers: int, faults: Sequence[Fault]) -> tuple[Chain, list[_Faulty]]:
    chain = inprocess_chain(server_tiers)
    faulty = [_Faulty(t, i) for i, t in enumerate(chain.tiers) if isinstance(t, Tier)]
    for f in faulty:
        f.arm(faults)
    return chain, faulty


# ---------------------------------------------------------------- the tier that computes the loss


def _cuts(u_shape: bool, tiers: int) -> st.SearchStrategy[tuple[int, ...]]:
    width = tiers + (1 if u_shape else 0)
    return st.lists(st.integers(0, N), min_size=width, max_size=width).map(lambda c: tuple(sorted(c)))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), u_shape=st.booleans(), tiers=st.integers(1, 3))
def test_the_first_tier_that_reaches_the_end_of_the_servers_part_computes_the_loss(
        data: st.DataObject, u_shape: bool, tiers: int) -> None:
    """Exactly one tier ends a client's chain: the first whose segment stops where the servers' part stops
    (the model's end, or a U-shape's last cut); the empty segments after it never compute the loss."""
    cuts = data.draw(_cuts(u_shape, tiers))
    stops = list(cuts[1:]) if u_shape else [*cuts[1:], N]  # each server tier's stop, in chain order
    end = stops[-1]
    cfg = RoundConfig("mut", 1, SPEC, "sflv2", u_shape, optim=OPTIM, seed=5, binding_key=KEY)
    flags = [load.loss_here for load in tier_loads(cfg, "c", cuts, None)]
    assert flags == [t == stops.index(end) for t in range(tiers)]


@pytest.mark.parametrize(("cuts", "want"), [((1, 3), [False, True]), ((1, 7), [True, False]),
                                            ((3, 3), [False, True]), ((7, 7), [True, False])])
def test_loss_flags_of_two_tiers(cuts: tuple[int, int], want: list[bool]) -> None:
    assert [load.loss_here for load in tier_loads(_cfg("sl"), "c", cuts, None)] == want


def test_an_edge_that_holds_the_rest_of_the_model_steps_alone() -> None:
    """Cuts (1, 7): the edge's segment ends the model, so the cloud (an empty segment) serves no step."""
    chain = inprocess_chain(2)
    state = initial_state(SPEC, 5)
    drive(SplitRound(_cfg("sflv2"), chain.tiers, state, {"c": (1, 7)}), local_trainer(chain, {"c": _batches(1)}))
    edge, cloud = chain.tiers
    assert isinstance(edge, Tier) and isinstance(cloud, Tier)
    assert (edge.steps_served, cloud.steps_served) == (3, 0)


# ---------------------------------------------------------------- what a client reports


def test_a_chain_whose_link_counts_nothing_reports_no_bytes() -> None:
    """A link without byte counters (a tier called directly) counts 0 bytes each way."""
    chain = inprocess_chain(2)
    edge = chain.tiers[0]
    assert not hasattr(edge, "bytes_up") and not hasattr(edge, "bytes_down")
    assert Chain(chain.tiers, edge).bytes == (0, 0)  # type: ignore[arg-type]


def test_a_client_of_one_sample_reports_that_samples_loss() -> None:
    """The mean over one sample is that sample's loss (not half of it)."""
    cfg, cuts = _cfg("sflv2"), (1, 3)
    state = initial_state(SPEC, 5)
    dev_state = {k: v for k, v in state.items() if k.startswith("0.")}
    batch = _batches(4, n=1, size=1)

    def chain() -> Chain:
        c = inprocess_chain(2)
        for t, load in zip(c.tiers, tier_loads(cfg, "c", cuts, state), strict=True):
            t.load(load)
        return c

    ref_chain = chain()
    ref = Device(SPEC, ref_chain.link, run_id="mut", client_id="c", round=1, cuts=cuts, state=dict(dev_state),
                 u_shape=False, optim=OPTIM, seed=5, secret=cfg.secret_of("c"))
    want, _ = ref.train_step(*batch[0])
    assert want > 0
    _, res = train_client(cfg, chain(), "c", cuts, dict(dev_state), batch)
    assert res.samples == 1
    assert res.loss == pytest.approx(want, rel=1e-6)


# ---------------------------------------------------------------- sflv1's means and the weights behind them


def test_sflv1_clients_of_one_and_of_no_sample_are_weighted_by_their_samples() -> None:
    """``one`` alone holds block 2 on the edge, with 1 sample behind it; ``none`` (no batch) alone holds block
    5 there, with nothing behind it, so the edge's mean has no such key. The round takes both as they are, and
    ``none`` changes nothing: the model is the one of the other two clients alone."""
    cuts = {"a": (3, 5), "one": (1, 3), "none": (1, 6)}
    data = {"a": _batches(1), "one": _batches(2, n=1, size=1), "none": []}
    state = initial_state(SPEC, 5)
    chain = inprocess_chain(2)
    split = SplitRound(_cfg("sflv1"), chain.tiers, state, cuts)
    got = drive(split, local_trainer(chain, data))
    assert [r.samples for r in split.results] == [24, 1, 0] and not split.failed
    chain = inprocess_chain(2)
    want = drive(SplitRound(_cfg("sflv1"), chain.tiers, state, {c: cuts[c] for c in ("a", "one")}),
                 local_trainer(chain, data))
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- holders


def test_of_two_holders_on_a_tier_the_fewer_bytes_are_fetched_and_a_device_block_stays_held() -> None:
    """sflv2, a (1, 3) then b (5, 6). b's edge load takes block 5 from a's cloud holder (fetched, sent on);
    b's device blocks (0-4) are not fetched for it (its device starts from the global model). Once b's
    segments are kept, the edge has a's holder (blocks 1-2: 19080 bytes) beside b's (block 5: 33024 bytes),
    and the cloud a's (blocks 3-4: none) beside b's (block 6: 2600): a's, the fewer, are fetched on both."""
    cuts = {"a": (1, 3), "b": (5, 6)}
    state = initial_state(SPEC, 5)
    chain = inprocess_chain(2)
    split = SplitRound(_cfg("sflv2"), chain.tiers, state, cuts)
    train = local_trainer(chain, {"a": _batches(1), "b": _batches(2)})

    def step(group: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        before = [list(p) for p in split.weight_bytes]
        weights = split.begin(group)
        loaded = [[x - y for x, y in zip(p, q, strict=True)] for p, q in zip(split.weight_bytes, before, strict=True)]
        before = [list(p) for p in split.weight_bytes]
        split.end(train(split.cfg, {g: split.assignment[g] for g in weights}, weights))
        kept = [[x - y for x, y in zip(p, q, strict=True)] for p, q in zip(split.weight_bytes, before, strict=True)]
        return loaded, kept

    try:
        step(["a"])
        loaded, kept = step(["b"])
        b5 = _blocks_bytes(state, range(5, 6))
        assert loaded == [[b5, 0], [0, b5]]
        assert kept == [[0, _blocks_bytes(state, range(1, 3))], [0, _blocks_bytes(state, range(3, 5))]]
        assert kept[0][1] < _blocks_bytes(state, range(5, 6)) and kept[1][1] < _blocks_bytes(state, range(6, 7))
        split.finish()
    finally:
        split.close()


# ---------------------------------------------------------------- a tier that is gone


def test_a_tier_gone_when_a_clients_segments_are_kept_fails_the_round_with_its_error() -> None:
    """The holder's load answers UNAVAILABLE: the tier is not there, so the round fails at once with that
    error (not as if the client alone had failed)."""
    chain, faulty = _faulty_chain(2, [Fault(0, "load", 0, Unavailable, who="@held.1.0")])
    split = SplitRound(_cfg("sflv2"), faulty, initial_state(SPEC, 5), {"c": (1, 3)})
    with pytest.raises(Unavailable, match="injected: load of @held.1.0"):
        drive(split, local_trainer(chain, {"c": _batches(1)}))
    assert split.why == {} and split.failed == []


def test_a_tier_gone_when_the_holders_are_checked_fails_the_round_with_its_error() -> None:
    """Before b loads, the edge is asked after a's holder and answers UNAVAILABLE: the tier's error, not a
    holder said lost."""
    chain, faulty = _faulty_chain(2, [Fault(0, "reduce", 0, Unavailable, who="@held.1.0")])
    split = SplitRound(_cfg("sflv2"), faulty, initial_state(SPEC, 5), {"a": (1, 3), "b": (1, 3)})
    with pytest.raises(Unavailable, match="injected: reduce of @held.1.0"):
        drive(split, local_trainer(chain, {"a": _batches(1), "b": _batches(2)}))
    assert [f for t in faulty for f in t.hit] == [Fault(0, "reduce", 0, Unavailable, who="@held.1.0")]


class _Replies:
    """A real tier whose Reduce replies are kept (every other attribute is the tier's)."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier
        self.replies: list[tuple[list[float], Reduced]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tier, name)

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced:
        out = self.tier.reduce(run_id, items)
        self.replies.append(([it.weight for it in items], out))
        return out


def test_checking_segments_and_holders_moves_no_weights() -> None:
    """sflv2's checks (a client's trained segments before they are kept, the holders before a load) are
    means of weight 0: the tiers' replies carry no tensor."""
    chain = inprocess_chain(2)
    tiers = [_Replies(t) for t in chain.tiers if isinstance(t, Tier)]
    cuts = {"a": (1, 3), "b": (1, 5), "c": (2, 4)}
    split = SplitRound(_cfg("sflv2"), tiers, initial_state(SPEC, 5), cuts)
    drive(split, local_trainer(chain, {c: _batches(i) for i, c in enumerate(cuts)}))
    assert sorted(split.done) == sorted(cuts)
    replies = [r for t in tiers for r in t.replies]
    assert len(replies) >= 6
    assert all(r.means == {} and not r.refused for _, r in replies)


# ---------------------------------------------------------------- a longer chain


def test_a_longer_chain_names_its_middle_tiers_and_a_refusal_says_which() -> None:
    assert [t.name for t in inprocess_chain(3).tiers if isinstance(t, Tier)] == ["edge", "tier2", "cloud"]
    assert [t.name for t in inprocess_chain(4).tiers if isinstance(t, Tier)] == ["edge", "tier2", "tier3", "cloud"]
    for t in (1, 2):
        chain, faulty = _faulty_chain(3, [Fault(t, "reduce", 0, ResourceExhausted)])
        split = SplitRound(_cfg("sflv1"), faulty, initial_state(SPEC, 5), {"a": (1, 3, 5)})
        with pytest.raises(RoundFailed, match=f"its server tier {t + 1} segments could not be averaged"):
            drive(split, local_trainer(chain, {"a": _batches(1)}))

