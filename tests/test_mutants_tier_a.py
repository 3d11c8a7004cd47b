"""A server tier's bounds, refusals and memory accounting pinned with exact values (mutation survivors of
splitfed/engine/tier.py, its first part): how many base segments and clients it holds, the batch it takes, what
it remembers of released segments, when it sweeps, and what a failed load gives back. In-process tiers, on
the CNN's last block (a Linear: loads and steps take well under a millisecond)."""

from __future__ import annotations

import os

import pytest
import torch

from splitfed.engine import template
from splitfed.engine.link import InProcessLink
from splitfed.engine.replica import Replica
from splitfed.engine.rounds import initial_state, select
from splitfed.engine.tier import Tier, _kept, weight_refusal
from splitfed.engine.types import ReduceItem, SegmentLoad, StepKey
from splitfed.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from splitfed.models.zoo import resolve_spec
from tests.tier_fixtures import Clock

SPEC = resolve_spec("cnn")
LAST = template.num_blocks(SPEC) - 1  # a Linear(64, 10): 2600 bytes of weights
STATE = select(initial_state(SPEC, 0), LAST, LAST + 1)


def _load(client: str, run: str = "run", replica: str | None = None, secret: str | None = None,
          state: object = STATE) -> SegmentLoad:
    return SegmentLoad(run, client, 0, SPEC, LAST, LAST + 1, replica or client, state,  # type: ignore[arg-type]
                       secret=f"s-{client}" if secret is None else secret)


def _bad_state() -> dict[str, torch.Tensor]:
    return {k: torch.zeros(3, 3) for k in STATE}  # shapes the block does not have: refused inside the bind



def test_a_tier_holds_64_base_segments_and_refuses_the_65th() -> None:
    tier = Tier("edge", max_clients=1)
    for i in range(64):
        tier.load(_load(f"@base.0.{i}", run=f"run{i}", replica="@b"))
    with pytest.raises(ResourceExhausted, match="already holds 64 base segments"):
        tier.load(_load("@base.0.64", run="run64", replica="@b"))
    assert tier.clients() == 64
    tier.load(_load("c"))  # a client's place is not a base's
    assert tier.clients() == 65


def test_a_tier_remembers_why_the_last_4096_released_segments_went() -> None:
    tier = Tier("edge")
    tier.load(_load("keep", replica="r", secret="s"))  # keeps the shared replica's block bound
    for i in range(4097):
        tier.load(_load(f"c{i}", replica="r", secret="s", state=None))
        tier.release("run", f"c{i}", "s")
    with pytest.raises(NotFound) as first:
        tier.fetch("run", "c0", "s")
    assert "released by its coordinator" not in str(first.value)  # the 4097th release pushed it out
    with pytest.raises(NotFound, match=r"client 'c1' in run 'run' \(released by its coordinator\)"):
        tier.fetch("run", "c1", "s")


def test_a_replicas_repr_never_shows_its_secret() -> None:
    assert "hush-123" not in repr(Replica(secret="hush-123"))


@pytest.mark.parametrize("grad", [True, False])
def test_a_kept_output_holds_one_element_not_its_bytes(grad: bool) -> None:
    out = torch.randn(4, 16, 4, 4, requires_grad=grad) * 2 if grad else torch.randn(4, 16, 4, 4)
    kept = _kept(out)
    assert kept.shape == out.shape and kept.dtype == out.dtype and kept.requires_grad == grad
    assert kept.stride() == (0, 0, 0, 0)
    assert kept.untyped_storage().nbytes() <= out.element_size()


def test_reduce_weights_at_their_bounds_are_taken_and_just_outside_refused() -> None:
    assert weight_refusal(0.0) is None
    assert weight_refusal(1e-6) is None
    assert weight_refusal(1e15) is None
    for w in (9.999e-7, 1.0001e15, -1.0):
        why = weight_refusal(w)
        assert why is not None and why.startswith("its weight must be 0 or in 1e-06..1e+15 (its samples), got ")


def test_status_names_three_runs_and_counts_the_rest() -> None:
    tier = Tier("edge")
    for r in ("r1", "r2", "r3"):
        tier.load(_load("c", run=r))
    assert "3 segment(s) of 3 run(s) (r1, r2, r3), " in tier.status()
    tier.load(_load("c", run="r4"))
    assert "4 segment(s) of 4 run(s) (r1, r2, r3 +1 more), " in tier.status()


def test_a_default_tier_takes_batches_up_to_4096() -> None:
    tier = Tier("edge")
    tier.load(_load("a"))
    (width,) = template.boundary(SPEC, LAST)[0]
    with pytest.raises(InvalidArgument, match=r"batch size 4097 is outside 1\.\.4096"):
        tier.step(StepKey("run", "a", 0, 0, secret="s-a"), torch.zeros(4097, width), torch.zeros(4097, dtype=torch.int64))
    reply = tier.step(StepKey("run", "a", 0, 0, secret="s-a"), torch.zeros(4096, width), torch.zeros(4096, dtype=torch.int64))
    assert reply.loss is not None


def test_a_default_tier_serves_at_most_10000_clients_in_a_reduce() -> None:
    link = InProcessLink(Tier("edge"))
    items = [ReduceItem(f"c{i}", "s", 1.0) for i in range(10_001)]
    with pytest.raises(ResourceExhausted, match="10001 clients listed, but tier edge serves at most 10000"):
        link.reduce("run", items)
    assert link.reduce("run", items[:10_000]).refused.keys() == {f"c{i}" for i in range(10_000)}


def test_idle_release_takes_any_positive_seconds() -> None:
    clock = Clock()
    tier = Tier("edge", idle_release_s=0.5, clock=clock)
    tier.load(_load("a"))
    clock.now += 0.4
    assert tier.sweep() == []
    clock.now += 0.2
    assert tier.sweep() == [("run", "a")]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds or None"):
            Tier("edge", idle_release_s=bad)


def test_a_tier_without_a_memory_bound_takes_three_quarters_of_its_devices_memory() -> None:
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert Tier("edge", max_held_bytes=0).max_held_bytes == machine * 3 // 4
    assert Tier("edge", max_held_bytes=12345).max_held_bytes == 12345


def test_a_load_on_a_tier_with_room_leaves_idle_segments_to_the_sweep() -> None:
    clock = Clock()
    tier = Tier("edge", idle_release_s=10.0, clock=clock)
    tier.load(_load("a"))
    clock.now += 20.0  # a is idle past its release, but the tier has room: loading b lets it be
    tier.load(_load("b"))
    assert tier.clients() == 2
    assert set(tier.fetch("run", "a", "s-a")) == set(STATE)
    clock.now += 20.0
    assert sorted(tier.sweep()) == [("run", "a"), ("run", "b")]


def test_a_failed_load_gives_back_the_bytes_it_set_aside() -> None:
    one = 2 * 2600  # the block's weights and their gradient (plain SGD keeps no slots)
    probe = Tier("edge")
    probe.load(_load("x"))
    assert probe.held == one
    tier = Tier("edge", max_held_bytes=one)
    with pytest.raises(InvalidArgument, match="does not match"):
        tier.load(_load("a", state=_bad_state()))
    assert tier.held == 0
    tier.load(_load("a"))  # the failed load's reservation is gone: the tier has room for exactly this one
    assert tier.held == one
    with pytest.raises(ResourceExhausted, match="would add"):
        tier.load(_load("b"))


def test_a_failed_join_of_a_bound_replica_keeps_the_replica() -> None:
    tier = Tier("edge")
    tier.load(_load("a", replica="r", secret="s"))
    held = tier.held
    with pytest.raises(InvalidArgument, match="does not match"):
        tier.load(_load("b", replica="r", secret="s", state=_bad_state()))
    assert tier.held == held
    tier.load(_load("c", replica="r", secret="s", state=None))  # joins a's block: it needs no state
    assert tier.held == held and tier.clients() == 2
    with pytest.raises(FailedPrecondition, match="holds no weights"):
        tier.load(_load("d", replica="r2", secret="s", state=None))
