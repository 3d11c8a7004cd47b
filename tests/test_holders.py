"""sl and sflv2 hand the server-side model from client to client on the tiers, through holders (segments only
the coordinator reaches, ``@held.<round>.<n>``). A tier keeps at most one holder beside the client training
there, as the cost model prices it (:func:`splitfed.cost.model.server_memory`); before, sflv2 clients whose
device took more blocks each turn left a holder per client on the edge."""

from __future__ import annotations

import pytest
import torch

from splitfed.engine import template
from splitfed.engine.rounds import (
    RoundConfig,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    select,
    server_bounds,
    state_bytes,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig, SegmentLoad
from splitfed.errors import ResourceExhausted
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("cnn", num_classes=10)  # 7 blocks; weights in blocks 0, 2, 5 and 6
RUN = "holders"
N_BLOCKS = 7
# each client's device takes more of the model than the one before: its edge segment is a suffix of the last's
RISING = {"c0": (0, 7), "c1": (1, 7), "c2": (3, 7), "c3": (6, 7)}
# and back and forth, with the cloud in play
MIXED = {"c0": (2, 6), "c1": (3, 5), "c2": (0, 7), "c3": (6, 6), "c4": (1, 4), "c5": (2, 6)}
# b trains only block 6 on the edge (sflv2: its device trains 0..5 from the global model), between two that
# train 2..6 there: keeping a's holder (blocks 2 and 5) and fetching b's block 6 is the cheaper way to one holder
NARROW = {"a": (2, 7), "b": (6, 7), "c": (2, 7)}


def _batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, *SPEC.input_shape, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(2)]


class _Watched:
    """A tier whose control calls note, after each, the holders it has and their weights' bytes."""

    def __init__(self, tier: Tier, seen: list[tuple[str, str, list[str], int]]) -> None:
        self.tier, self.seen = tier, seen

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.tier, name)

    def _note(self, call: str, who: str) -> None:
        held = sorted(c for (_, c) in self.tier._bindings if c.startswith("@held"))
        size = sum(state_bytes(self.tier._bindings[(RUN, c)].segment.state_dict()) for c in held)
        self.seen.append((call, who, held, size))

    def load(self, spec: SegmentLoad) -> None:
        self.tier.load(spec)
        self._note("load", spec.client_id)

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        self.tier.release(run_id, client_id, secret)
        self._note("release", client_id)


class _NoHolders:
    """A tier too full to keep a holder: the trained segments are fetched instead (the path before holders)."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.tier, name)

    def load(self, spec: SegmentLoad) -> None:
        if spec.client_id.startswith("@held"):
            raise ResourceExhausted("no room for a holder")
        self.tier.load(spec)


def _round(mode: str, assignment: dict, wrap=None) -> tuple[SplitRound, dict]:  # type: ignore[no-untyped-def]
    chain = inprocess_chain(2)
    tiers = [wrap(t) if wrap else t for t in chain.tiers]
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, mode), tiers, initial_state(SPEC, 0), assignment)
    new = drive(rnd, local_trainer(chain, {c: _batches(i) for i, c in enumerate(assignment)}))
    assert not rnd.failed and [t.clients() for t in chain.tiers] == [0, 0]
    return rnd, new


@pytest.mark.parametrize(("mode", "assignment"), [("sflv2", RISING), ("sl", RISING), ("sflv2", MIXED),
                                                  ("sl", MIXED), ("sflv2", NARROW), ("sl", NARROW)])
def test_a_tier_keeps_one_holder_beside_the_client_training(mode: str, assignment: dict) -> None:
    seen: list[tuple[str, str, list[str], int]] = []
    _round(mode, assignment, lambda t: _Watched(t, seen))
    state = initial_state(SPEC, 0)
    largest = max(state_bytes(select(state, a, z)) for cuts in assignment.values()
                  for a, z in server_bounds(cuts, N_BLOCKS, False))
    for call, who, held, size in seen:
        # a client's load finds at most one holder; when its turn ends, its own holder is made beside the one
        # before it (and the client released), and the one before it released right after
        assert len(held) <= (1 if call == "load" and not who.startswith("@held") else 2), (call, who, held)
        # a holder keeps one client's segment: what the cost model prices as the largest holder
        assert size <= len(held) * largest
    assert any(len(h) == 1 for _, _, h, _ in seen)  # holders were kept at all


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
@pytest.mark.parametrize("assignment", [RISING, MIXED, NARROW])
def test_one_holder_per_tier_changes_no_weight(mode: str, assignment: dict) -> None:
    """Fetching an older holder's blocks early moves weights, not values: the round's model is bitwise the one
    of tiers that keep no holder at all (every trained segment fetched)."""
    _, kept = _round(mode, assignment)
    _, fetched = _round(mode, assignment, _NoHolders)
    assert kept.keys() == fetched.keys()
    assert all(torch.equal(kept[k], fetched[k]) for k in kept)


def test_the_holder_with_fewer_latest_bytes_is_the_one_fetched() -> None:
    """a's holder keeps blocks 2 and 5 (52 kB), b's block 6 (2.6 kB): b's is fetched when its turn ends and
    sent with c's load, which copies 2..5 from a's holder on the edge. (Fetching a's instead, as the first
    version of one holder per tier did, sent 52 kB each way more.)"""
    state = initial_state(SPEC, 0)

    def b(*blocks: int) -> int:
        return sum(state_bytes(select(state, i, i + 1)) for i in blocks)

    rnd, _ = _round("sflv2", NARROW)
    # to the edge: a's segment, then block 6 with c's load; back: b's block 6, then c's segment at the end
    assert rnd.weight_bytes[0] == [b(2, 5, 6) + b(6), b(6) + b(2, 5, 6)] and b(6) < b(2, 5)


def test_holders_cost_no_more_bytes_than_a_copy_per_client() -> None:
    """The early fetches send each block no more often than a copy per client each way would."""
    rnd, _ = _round("sflv2", RISING)
    state = initial_state(SPEC, 0)
    per_client = sum(state_bytes(select(state, a, z)) for cuts in RISING.values()
                     for a, z in server_bounds(cuts, N_BLOCKS, False)[:1])
    sent, got = rnd.weight_bytes[0]
    assert sent <= per_client and got <= per_client


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
@pytest.mark.parametrize("assignment", [RISING, MIXED])
def test_a_tier_sized_as_the_cost_model_prices_holders_keeps_them(mode: str, assignment: dict) -> None:
    """Each tier may hold what the memory model prices beside activations: the client training there with its
    optimizer (adam: two slots), its own holder as its turn ends, and the holder before it (``turn_c,t`` and
    ``max_c H_c,t``, a holder its weights alone). Before, a tier counted a holder as a client training (adam:
    four times its weights), refused it, and the round fetched every trained segment instead."""
    adam = OptimConfig("adam")

    def sized(tier: Tier, t: int) -> Tier:
        spans = [server_bounds(cuts, N_BLOCKS, False)[t] for cuts in assignment.values()]
        weights = [sum(template.held_bytes(SPEC, i)[0] for i in range(a, z)) for a, z in spans]
        fixed = [sum(w + g + adam.state_bytes(g, template.train_tensors(SPEC, i))
                     for i in range(a, z) for w, g in [template.held_bytes(SPEC, i)]) for a, z in spans]
        tier.max_held_bytes = max(1, max(f + h for f, h in zip(fixed, weights, strict=True)) + max(weights))
        return tier

    def run(tight: bool) -> tuple[SplitRound, dict]:
        chain = inprocess_chain(2)
        tiers = [sized(t, i) if tight else t for i, t in enumerate(chain.tiers)]
        rnd = SplitRound(RoundConfig(RUN, 1, SPEC, mode, optim=adam), tiers, initial_state(SPEC, 0), assignment)
        new = drive(rnd, local_trainer(chain, {c: _batches(i) for i, c in enumerate(assignment)}))
        assert not rnd.failed and [t.clients() for t in chain.tiers] == [0, 0]
        return rnd, new

    (tight, kept), (roomy, same) = run(True), run(False)
    assert tight.weight_bytes == roomy.weight_bytes  # no holder refused: nothing fetched that a roomy tier kept
    assert all(torch.equal(kept[k], same[k]) for k in kept)
