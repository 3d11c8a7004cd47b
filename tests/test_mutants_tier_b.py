"""A server tier's memory bound, failed loads, releases, fetches, sums and idle sweeps, pinned with exact byte
counts and the refusals' words (tests a mutation run of ``splitfed/engine/tier.py`` showed missing).

In-process tiers on the CPU, the zoo's cnn (7 blocks), a fake clock for the idle horizon: no sleeping.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch

from splitfed.engine import template
from splitfed.engine.rounds import initial_state, select
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig, ReduceItem, SegmentLoad, StepKey
from splitfed.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from splitfed.models.zoo import resolve_spec
from splitfed.units import mib_text
from tests.tier_fixtures import Clock, paused_bind

SPEC = resolve_spec("cnn")  # 7 blocks: weights in 0, 2, 5 and 6
GLOBAL = initial_state(SPEC, 0)
IDLE = 100.0
SGD, MOMENTUM, ADAM = OptimConfig("sgd"), OptimConfig("sgd", momentum=0.9), OptimConfig("adam")



def _held(start: int, stop: int, optim: OptimConfig) -> int:
    """What a client's own segment ``[start, stop)`` holds: weights and buffers, a gradient per trained byte,
    and its optimizer's slots (computed here from the model's blocks, not from the tier)."""
    total = 0
    for i in range(start, stop):
        weights, trains = template.held_bytes(SPEC, i)
        total += weights + trains + optim.state_bytes(trains, template.train_tensors(SPEC, i))
    return total


def _slots(start: int, stop: int, optim: OptimConfig) -> int:
    return sum(optim.state_bytes(template.held_bytes(SPEC, i)[1], template.train_tensors(SPEC, i))
               for i in range(start, stop))


def _load(client: str, start: int = 2, stop: int = 7, optim: OptimConfig = SGD, **kw) -> SegmentLoad:  # type: ignore[no-untyped-def]
    state = kw.pop("state", select(GLOBAL, start, stop))
    return SegmentLoad("run", client, 0, SPEC, start, stop, kw.pop("replica", client), state, optim=optim,
                       secret=kw.pop("secret", f"s-{client}"), **kw)


def _tier(clock: Clock, max_held_bytes: int) -> Tier:
    return Tier("edge", idle_release_s=IDLE, clock=clock, max_held_bytes=max_held_bytes)


# ---------------------------------------------------------------- the bound on what a tier holds


def test_a_load_landing_exactly_on_the_bound_is_taken_and_a_sweep_then_makes_exactly_enough_room() -> None:
    """At the bound is within it: no idle segment is let go of for it. One byte over, the idle one goes, and
    what is left then lands exactly on the bound again: taken."""
    one = _held(2, 7, SGD)
    clock = Clock()
    tier = _tier(clock, 2 * one)
    tier.load(_load("a"))
    clock.now += 150
    tier.load(_load("b"))  # a is idle by now, but the tier has room for b: nothing swept
    assert tier.clients() == 2 and tier.held == 2 * one and tier._reserved == 0
    clock.now += 50  # a unused for 200 s, b for 50 s
    tier.load(_load("c"))  # over by one segment: the sweep lets go of a, and c fits exactly
    assert sorted(c for _, c in tier._bindings) == ["b", "c"]
    assert tier.held == 2 * one and tier._reserved == 0
    with pytest.raises(NotFound, match=r"released unused for 100 s"):
        tier.fetch("run", "a", "s-a")
    clock.now += 10
    with pytest.raises(ResourceExhausted, match=r"load of client 'd' would add .*its segments hold .*and it holds "
                                                r"at most .*--max-held-mb"):
        tier.load(_load("d"))  # nothing idle to let go of
    assert tier.clients() == 2 and tier.held == 2 * one and tier._reserved == 0


def test_a_reload_counts_the_optimizer_it_replaces_as_freed_and_sweeps_nothing_it_fits_without() -> None:
    """A re-load of a with the same optimizer adds its slots and frees the old ones: the tier holds what it
    held, so an idle segment beside it stays."""
    a = _held(2, 7, MOMENTUM)
    z = _held(6, 7, SGD)
    clock = Clock()
    tier = _tier(clock, a + z)
    tier.load(_load("z", 6, 7))
    clock.now += 150
    tier.load(_load("a", optim=MOMENTUM))
    assert tier.held == a + z
    clock.now += 50  # z idle; a re-loaded, its weights kept (no state), its momentum slots new
    tier.load(_load("a", optim=MOMENTUM, state=None))
    assert sorted(c for _, c in tier._bindings) == ["a", "z"]
    assert tier.held == a + z and tier._reserved == 0


def test_a_reload_with_a_larger_optimizer_fits_after_a_sweep_exactly_with_the_old_slots_freed() -> None:
    """a re-loaded from momentum to adam adds adam's slots less momentum's: over the bound until the idle z
    goes, then exactly on it."""
    a_adam = _held(2, 7, ADAM)
    z = _held(6, 7, SGD)
    assert 0 < z <= _slots(2, 7, ADAM) - _slots(2, 7, MOMENTUM)  # z fits beside a before, not after
    clock = Clock()
    tier = _tier(clock, a_adam)
    tier.load(_load("z", 6, 7))
    clock.now += 150
    tier.load(_load("a", optim=MOMENTUM))
    assert tier.held == _held(2, 7, MOMENTUM) + z
    clock.now += 50
    tier.load(_load("a", optim=ADAM, state=None))
    assert [c for _, c in tier._bindings] == ["a"]
    assert tier.held == a_adam and tier._reserved == 0
    assert tier._bindings[("run", "a")].held == _slots(2, 7, ADAM)


def test_a_reload_over_the_bound_says_what_it_would_add_and_changes_nothing() -> None:
    a = _held(2, 7, MOMENTUM)
    tier = _tier(Clock(), _held(2, 7, ADAM) - 1)
    tier.load(_load("a", optim=MOMENTUM))
    with pytest.raises(ResourceExhausted, match="load of client 'a' would add"):
        tier.load(_load("a", optim=ADAM, state=None))
    assert tier.held == a and tier._reserved == 0
    assert tier._bindings[("run", "a")].held == _slots(2, 7, MOMENTUM)


def test_what_loads_under_way_set_aside_counts_against_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """a's load is paused while it binds, its bytes set aside: b, which would fit beside a by one byte less,
    is refused (naming what the load under way may add), and the tier then holds a alone."""
    one = _held(2, 7, SGD)
    tier = _tier(Clock(), 2 * one - 1)
    with paused_bind(monkeypatch, "a") as (inside, _):
        loading = threading.Thread(target=tier.load, args=(_load("a"),))
        loading.start()
        assert inside.wait(10)
        assert tier._reserved == one and tier.held == 0
        with pytest.raises(ResourceExhausted, match=re.escape(
                f"load of client 'b' would add {mib_text(one)}: its segments hold {mib_text(0)} and loads "
                f"under way may add {mib_text(one)}, and it holds at most")):
            tier.load(_load("b"))
    loading.join(10)  # a's load goes on once the pause ends
    assert [c for _, c in tier._bindings] == ["a"] and tier.held == one and tier._reserved == 0


# ---------------------------------------------------------------- a load that fails while it binds


def test_a_failed_first_load_leaves_no_replica_and_gives_its_reservation_back() -> None:
    tier = _tier(Clock(), 10 * _held(2, 7, ADAM))
    bad = {k: v[..., :1] if v.dim() else v for k, v in select(GLOBAL, 2, 7).items()}
    with pytest.raises(InvalidArgument, match=r"state '2\.0\.weight': .* does not match"):
        tier.load(_load("x", state=bad, optim=ADAM))
    assert tier.held == 0 and tier._reserved == 0 and not tier._replicas and not tier._claims
    # the replica is gone: a load under another secret may make it afresh
    tier.load(_load("y", replica="x", optim=ADAM))
    assert tier.held == _held(2, 7, ADAM) and tier._reserved == 0


def test_a_failed_load_joining_a_replica_keeps_the_replica_its_users_hold() -> None:
    tier = _tier(Clock(), 10 * _held(2, 7, ADAM))
    tier.load(_load("a", secret="R", replica="R"))
    before = tier.held
    assert before == _held(2, 7, SGD)
    with pytest.raises(FailedPrecondition, match=r"replica 'R' holds no weights for block 0: the load must carry its state"):
        tier.load(_load("b", 0, 7, secret="R", replica="R", state=select(GLOBAL, 2, 7)))
    assert tier.held == before and tier._reserved == 0 and ("run", "R") in tier._replicas
    tier.step(StepKey("run", "a", 0, 0, "R"), torch.zeros(2, *template.boundary(SPEC, 2)[0]),
              torch.zeros(2, dtype=torch.int64))  # a's segment is whole
    tier.release("run", "a", "R")
    assert tier.held == 0 and not tier._replicas


# ---------------------------------------------------------------- loads that write some blocks of a replica


def test_a_reload_may_write_some_blocks_and_keep_the_rest() -> None:
    tier = Tier("edge", idle_release_s=None)
    tier.load(_load("a"))
    five = {k: torch.full_like(v, 0.5) for k, v in GLOBAL.items() if k.startswith("5.")}
    tier.load(_load("a", state=five))
    got = tier.fetch("run", "a", "s-a")
    for k, v in got.items():
        assert torch.equal(v, five[k] if k in five else GLOBAL[k]), k


# ---------------------------------------------------------------- release, fetch, reduce


def test_a_release_with_another_secret_is_refused_and_one_of_an_unknown_client_does_nothing() -> None:
    tier = Tier("edge", idle_release_s=None)
    tier.load(_load("a"))
    with pytest.raises(PermissionDenied):
        tier.release("run", "a", "guess")
    assert tier.clients() == 1 and tier.held == _held(2, 7, SGD)
    tier.release("run", "nobody", "guess")
    tier.release("run", "a", "s-a")
    assert tier.clients() == 0 and tier.held == 0


def test_releasing_one_user_of_a_shared_replica_keeps_the_replica_for_the_other() -> None:
    tier = Tier("edge", idle_release_s=None)
    tier.load(_load("a", optim=ADAM, replica="R", secret="R"))
    alone = tier.held
    tier.load(_load("b", optim=ADAM, replica="R", secret="R", state=None))
    assert tier.held == alone + _slots(2, 7, ADAM)
    tier.release("run", "b", "R")
    assert tier.held == alone == _held(2, 7, ADAM) and ("run", "R") in tier._replicas
    assert set(tier.fetch("run", "a", "R")) == set(select(GLOBAL, 2, 7))


def test_a_fetch_of_an_empty_block_range_is_refused() -> None:
    tier = Tier("edge", idle_release_s=None)
    tier.load(_load("a"))
    for blocks in ((3, 3), (2, 2), (7, 7), (5, 4), (1, 3), (2, 8)):
        with pytest.raises(InvalidArgument, match=rf"blocks \[{blocks[0]}, {blocks[1]}\) are not a range inside "
                                                  r"its segment \[2, 7\)"):
            tier.fetch("run", "a", "s-a", blocks)
    assert set(tier.fetch("run", "a", "s-a", (5, 6))) == {"5.0.weight", "5.0.bias"}
    assert set(tier.fetch("run", "a", "s-a", (2, 7))) == set(select(GLOBAL, 2, 7))


def test_a_reduce_names_the_client_listed_twice() -> None:
    tier = Tier("edge", idle_release_s=None)
    with pytest.raises(InvalidArgument, match=r"reduce: client 'b' is listed twice"):
        tier.reduce("run", [ReduceItem("a", "s", 1.0), ReduceItem("b", "s", 1.0), ReduceItem("b", "s", 2.0)])


# ---------------------------------------------------------------- a release during a U-shape step


def test_a_backward_that_raced_a_release_is_told_its_forward_is_gone() -> None:
    """The release lets go of the replica's lock the forward kept. A backward that got the binding just before
    (as it checks the secret) then finds no forward waiting: refused, the lock not let go of twice."""
    tier = Tier("edge", idle_release_s=None)
    tier.load(_load("a"))
    key = StepKey("run", "a", 0, 0, "s-a")
    out = tier.forward(key, torch.zeros(2, *template.boundary(SPEC, 2)[0]))
    b = tier._trainer(key)  # the backward's first move, before the release
    tier.release("run", "a", "s-a")
    assert not b.holds_lock and b.replica.lock.acquire(blocking=False)
    b.replica.lock.release()
    with pytest.raises(FailedPrecondition, match="backward of step 0 without its forward"):
        tier._backward(b, key, torch.ones_like(out))


# ---------------------------------------------------------------- the idle horizon


def test_a_segment_unused_for_exactly_the_idle_time_is_kept_and_one_a_moment_longer_is_released() -> None:
    clock = Clock()
    tier = Tier("edge", idle_release_s=IDLE, clock=clock)
    tier.load(_load("a"))
    clock.now += IDLE
    assert tier.sweep() == [] and tier.clients() == 1
    clock.now += 0.5
    assert tier.sweep() == [("run", "a")] and tier.clients() == 0 and tier.held == 0
