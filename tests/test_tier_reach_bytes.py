"""What a tier reserves for a segment is what it holds, and a new model is built once however many threads ask.

A block before one that lets no gradient through (detach, argmax, a comparison, ``torch.no_grad``) never gets a
``.grad``, and torch's optimizers make their state lazily, for parameters with a gradient only: a tier holding it
holds its weights alone. The tier reserved a gradient and the optimizer's slots for it all the same (Adam: four
times the weights), refusing loads the cost model had planned for. Two Parameters tied by ``.data`` it reserved
once, though each gets its own gradient and slots. And the template's cached sizes and probes computed without
a lock: threads asking for a new user model at once each built it.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import splitfed
from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig
from splitfed.errors import ResourceExhausted
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile.profiler import profile_model
from tests.test_optimizer_state_bytes import _trained
from tests.test_tail_blocking import KINDS
from tests.transport_fixtures import SPEC as CNN

OPTIMS = (OptimConfig("sgd"), OptimConfig("sgd", momentum=0.9, weight_decay=0.1),
          OptimConfig("adam", lr=0.01, weight_decay=0.1))
B = 4


def _blocked(kind: str, at: int, frozen: bool = False) -> ModelSpec:
    return resolve_spec("tests.test_tail_blocking:blocked", input_shape=(6,), num_classes=3, kind=kind, at=at,
                        frozen=frozen)


# ---------------------------------------------------------------- what a tier reserves is what it holds


def _held_in_training(spec: ModelSpec, cuts: tuple[int, int], optim: OptimConfig) -> list[tuple[Tier, int]]:
    """Each server tier of a real 2-tier chain, and the bytes its segment really holds after two steps: weights
    and buffers, the gradients present when the optimizer steps, and every tensor of the optimizer's state (its
    slots, and Adam's step count per Parameter)."""
    return [(tier, weights + grads + state) for tier, weights, grads, state in _trained(spec, cuts, optim)]


def _assert_reserved_is_held(spec: ModelSpec, cuts: tuple[int, int], optim: OptimConfig) -> list[int]:
    """The tier counts what its segment really holds, and a tier bounded to exactly that admits the load, one
    byte less refuses it: the reservation is those bytes, not more."""
    held = _held_in_training(spec, cuts, optim)
    for tier, real in held:
        assert tier.held == real, (tier.name, tier.held, real)
    cfg = RoundConfig("r", 0, spec, "sflv1", False, optim)
    for (tier, real), load in zip(held, tier_loads(cfg, "c", cuts, initial_state(spec, 0)), strict=True):
        Tier(tier.name, max_held_bytes=real or None, idle_release_s=None).load(load)
        if real > 1:  # 0 bytes: the tier's default bound
            with pytest.raises(ResourceExhausted, match="would add"):
                Tier(tier.name, max_held_bytes=real - 1, idle_release_s=None).load(load)
    return [real for _, real in held]


@st.composite
def _plans(draw: st.DrawFn) -> tuple[ModelSpec, tuple[int, int]]:
    """A blocking block anywhere, the blocks before it frozen or not, and two non-empty server segments."""
    spec = _blocked(draw(st.sampled_from(KINDS)), draw(st.integers(1, 7)), draw(st.booleans()))
    k1 = draw(st.integers(1, 6))
    return spec, (k1, draw(st.integers(k1 + 1, 7)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=_plans(), optim=st.sampled_from(OPTIMS))
def test_a_tier_reserves_what_its_segment_holds_around_a_blocking_block(
        plan: tuple[ModelSpec, tuple[int, int]], optim: OptimConfig) -> None:
    spec, cuts = plan
    _assert_reserved_is_held(spec, cuts, optim)


@pytest.mark.parametrize("optim", OPTIMS, ids=["sgd", "momentum", "adam"])
def test_an_edge_past_which_no_gradient_flows_reserves_its_weights_alone(optim: OptimConfig) -> None:
    """The edge holds [1, 5) with a detach at 3: its Linear (block 2) never trains. Before, the tier reserved
    (and counted) 1 + 1 + slots times its weights; the cost model priced its weights alone."""
    spec = _blocked("detach", 3)
    edge, cloud = _assert_reserved_is_held(spec, (1, 5), optim)
    prof = profile_model(spec, batch=B, reps=1, optimizer_slots=optim.slots, use_cache=False)
    assert edge == sum(prof.fixed_bytes[1:5]) == template.held_bytes(spec, 2)[0]  # one Linear's weights
    assert cloud == sum(prof.fixed_bytes[5:8])
    assert template.held_bytes(spec, 2)[1] == 0 and template.held_bytes(spec, 5)[1] > 0


TIED = resolve_spec("tests.test_frozen_params:tied", input_shape=(6,), num_classes=3)


@pytest.mark.parametrize("optim", OPTIMS, ids=["sgd", "momentum", "adam"])
@pytest.mark.parametrize(("spec", "cuts"), [(CNN, (2, 4)), (TIED, (1, 2))], ids=["cnn", "tied"])
def test_a_tier_reserves_what_its_segment_holds_in_a_model_that_blocks_nothing(
        spec: ModelSpec, cuts: tuple[int, int], optim: OptimConfig) -> None:
    """The digits CNN (BatchNorm buffers, every block trains), and a block of two Parameters tied by ``.data``:
    one weight, but a gradient and optimizer slots for each (before, the tier reserved them once, 960 bytes of
    the 1,472 the edge holds with momentum), as the cost model prices them."""
    edge, cloud = _assert_reserved_is_held(spec, cuts, optim)
    prof = profile_model(spec, batch=B, reps=1, optimizer_slots=optim.slots, use_cache=False)
    assert (edge, cloud) == (sum(prof.fixed_bytes[cuts[0]:cuts[1]]), sum(prof.fixed_bytes[cuts[1]:]))


# ---------------------------------------------------------------- a new model is built once


class _Probe(nn.Module):
    """Passes its input on, noting each forward pass (a probe of the template runs one)."""

    def __init__(self, tag: int) -> None:
        super().__init__()
        self.tag = tag

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _event(self.tag, "forward")
        return x


def counted(tag: int) -> nn.Module:
    """A small model whose builds and forward passes are counted per ``tag`` (one tag: one cache key)."""
    _event(tag, "build")
    return nn.Sequential(_Probe(tag), nn.Linear(6, 8), nn.Dropout(0.1), nn.Tanh(), nn.Linear(8, 3))


_counts: Counter[tuple[int, str]] = Counter()
_workers: dict[int, list[threading.Thread]] = {}
_count_lock = threading.Lock()


def _event(tag: int, what: str) -> None:
    """Count it; the first of its kind for ``tag`` waits until every other thread asking is blocked on a lock
    (the template's, torch's generator's, or one waiting for this build): each thread has then asked, and either
    waits for this very computation or, computing again, makes another event."""
    with _count_lock:
        _counts[tag, what] += 1
        first = _counts[tag, what] == 1
    if not first:
        return
    me = threading.get_ident()
    others = [t for t in _workers.get(tag, []) if t.ident != me]
    give_up = threading.Event()
    timer = threading.Timer(60.0, give_up.set)  # never hangs the suite; the counts then say what happened
    timer.start()
    try:
        while not give_up.is_set() and not all(_waiting(t) for t in others):
            give_up.wait(0.001)
    finally:
        timer.cancel()


def _waiting(thread: threading.Thread) -> bool:
    """Whether ``thread`` has finished or waits on a lock (its innermost frame's line takes one)."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or not thread.is_alive():
        return True
    return (frame.f_code.co_filename.startswith(PACKAGE)
            and "lock" in linecache.getline(frame.f_code.co_filename, frame.f_lineno).lower())


PACKAGE = os.path.dirname(splitfed.__file__)
_tags = iter(range(10_000, 1 << 30))


def _spec() -> ModelSpec:
    """A model no cache of this process has seen."""
    return resolve_spec("tests.test_tier_reach_bytes:counted", input_shape=(6,), num_classes=3, tag=next(_tags))


ASKS: dict[str, Callable[[ModelSpec], object]] = {
    "size": template.size,
    "template": template.template,
    "boundary": lambda s: template.boundary(s, 1),
    "grad_reach": template.grad_reach,
    "gets_gradient": lambda s: template.gets_gradient(s, 1),
    "held_bytes": lambda s: template.held_bytes(s, 1),
    "has_state": lambda s: template.has_state(s, 1),
    "one_sample_error": template.one_sample_error,
}


def _work(ask: Callable[[ModelSpec], object], threads: int) -> tuple[Counter[str], list[object]]:
    """What ``threads`` real threads asking ``ask`` of a new model at once cost (builds, forward passes), and
    what each got."""
    spec = _spec()
    tag = int(spec.kwargs["tag"])  # type: ignore[call-overload]
    got: list[object] = [None] * threads
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(i: int) -> None:
        try:
            start.wait()
            got[i] = ask(spec)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    _workers[tag] = pool
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    return Counter({what: n for (t, what), n in _counts.items() if t == tag}), got


@pytest.mark.parametrize("name", sorted(ASKS))
def test_threads_asking_for_a_new_model_at_once_cost_what_one_ask_does(name: str) -> None:
    """Eight threads ask at once: the builds and forward passes are those of one thread asking alone, and all
    get its answer. Before, each thread that asked before the first answer was cached computed it again
    (``size``: one meta build each; ``boundary``: one forward pass each)."""
    alone, (want,) = _work(ASKS[name], 1)
    together, got = _work(ASKS[name], 8)
    assert together == alone, (together, alone)
    assert got == [want] * 8 or name == "template"  # a template is its own object per model
