"""A tier checks every message, refuses with a precise code, and changes nothing when it refuses."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from splitfed.engine.checks import all_finite
from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.tier import Tier
from splitfed.engine.types import StepKey
from splitfed.errors import FailedPrecondition, InvalidArgument, NotFound, TierError, Unavailable
from splitfed.models.zoo import resolve_spec
from splitfed.units import mib_text

SPEC = resolve_spec("cnn")


@pytest.fixture
def tier() -> Tier:
    t = Tier("cloud")
    cfg = RoundConfig("run", 0, SPEC)
    state = initial_state(SPEC, 0)
    for cid in ("a", "b"):
        (load,) = tier_loads(cfg, cid, (2,), state)
        t.load(load)
    return t


def act(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 16, 4, 4, generator=torch.Generator().manual_seed(batch))


def y(batch: int = 4) -> torch.Tensor:
    return torch.arange(batch) % 10


def snapshot(t: Tier, cid: str = "a") -> dict[str, torch.Tensor]:
    return t.fetch("run", cid)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "make,code,match",
    [
        (lambda: (StepKey("run", "zz", 0, 0), act(), y()), "NOT_FOUND", "no segment loaded"),
        (lambda: (StepKey("other", "a", 0, 0), act(), y()), "NOT_FOUND", "run 'other'"),
        (lambda: (StepKey("run", "a", 0, 0), torch.randn(4, 16, 4, 5), y()), "INVALID_ARGUMENT", "shape"),
        (lambda: (StepKey("run", "a", 0, 0), act().double(), y()), "INVALID_ARGUMENT", "dtype"),
        (lambda: (StepKey("run", "a", 0, 0), act().index_fill(0, torch.tensor([1]), float("nan")), y()),
         "INVALID_ARGUMENT", "NaN"),
        (lambda: (StepKey("run", "a", 0, 0), act(), y(3)), "INVALID_ARGUMENT", "labels"),
        (lambda: (StepKey("run", "a", 0, 0), act(), y() + 10), "INVALID_ARGUMENT", "labels must lie"),
        (lambda: (StepKey("run", "a", 0, 5), act(), y()), "FAILED_PRECONDITION", "out-of-order"),
        (lambda: (StepKey("run", "a", 3, 0), act(), y()), "FAILED_PRECONDITION", "round"),
    ],
)
def test_bad_step_is_refused_and_changes_nothing(tier: Tier, make, code: str, match: str) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(tier)
    with pytest.raises(TierError, match=match) as e:
        tier.step(*make())
    assert e.value.code == code
    assert same(before, snapshot(tier))
    # and the tier keeps serving: client b trains normally
    reply = tier.step(StepKey("run", "b", 0, 0), act(), y())
    assert reply.grad is not None and reply.grad.shape == act().shape


def test_retried_step_is_applied_once_and_stale_is_refused(tier: Tier) -> None:
    r0 = tier.step(StepKey("run", "a", 0, 0), act(), y())
    after_one = snapshot(tier)
    again = tier.step(StepKey("run", "a", 0, 0), act(), y())
    assert again is r0 and same(after_one, snapshot(tier))
    tier.step(StepKey("run", "a", 0, 1), act(), y())
    with pytest.raises(FailedPrecondition, match="stale"):
        tier.step(StepKey("run", "a", 0, 0), act(), y())


def test_bad_load_changes_nothing(tier: Tier) -> None:
    before = snapshot(tier)
    cfg = RoundConfig("run", 0, SPEC)
    state = initial_state(SPEC, 1)
    (load,) = tier_loads(cfg, "a", (2,), state)
    load.state["2.0.weight"] = torch.zeros(3)  # type: ignore[index]
    with pytest.raises(InvalidArgument, match="2.0.weight"):
        tier.load(load)
    (load,) = tier_loads(cfg, "a", (2,), state)
    load.state["2.0.weight"] = load.state["2.0.weight"] * float("inf")  # type: ignore[index]
    with pytest.raises(InvalidArgument, match="NaN or infinite"):
        tier.load(load)
    (load,) = tier_loads(cfg, "a", (2,), state)
    load.stop = 99
    with pytest.raises(InvalidArgument, match="outside"):
        tier.load(load)
    assert same(before, snapshot(tier))


def test_release_forgets_the_client(tier: Tier) -> None:
    tier.release("run", "a")
    with pytest.raises(NotFound):
        tier.fetch("run", "a")
    assert tier.clients() == 1


def test_u_shape_backward_needs_its_forward() -> None:
    t = Tier("edge")
    cfg = RoundConfig("run", 0, SPEC, u_shape=True)
    (load,) = tier_loads(cfg, "a", (2, 5), initial_state(SPEC, 0))
    t.load(load)
    with pytest.raises(FailedPrecondition, match="without its forward"):
        t.backward(StepKey("run", "a", 0, 0), torch.randn(4, 128))
    out = t.forward(StepKey("run", "a", 0, 0), act())
    assert out.shape == (4, 128)
    with pytest.raises(InvalidArgument, match="shape"):
        t.backward(StepKey("run", "a", 0, 0), torch.randn(4, 127))
    g = t.backward(StepKey("run", "a", 0, 0), torch.randn(4, 128))
    assert g is not None and g.shape == act().shape


def test_vanished_u_shape_client_blocks_nobody_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    import splitfed.engine.tier as tier_mod

    monkeypatch.setattr(tier_mod, "SHARED_WAIT_S", 0.2)
    t = Tier("edge")
    cfg = RoundConfig("run", 0, SPEC, mode="sflv2", u_shape=True)
    state = initial_state(SPEC, 0)
    (la,) = tier_loads(cfg, "a", (2, 5), state, replica="shared")
    (lb,) = tier_loads(cfg, "b", (2, 5), None, replica="shared")
    t.load(la)
    t.load(lb)
    t.forward(StepKey("run", "a", 0, 0), act())  # a never sends its backward
    with pytest.raises(FailedPrecondition, match="waits for its backward"):
        t.step(StepKey("run", "a", 0, 1), act(), y())
    with pytest.raises(tier_mod.Unavailable, match="busy"):
        t.forward(StepKey("run", "b", 0, 0), act())
    with pytest.raises(tier_mod.Unavailable, match="busy"):
        t.fetch("run", "b")
    t.release("run", "a")  # the orchestrator gives up on a: b goes on
    out = t.forward(StepKey("run", "b", 0, 0), act())
    assert t.backward(StepKey("run", "b", 0, 0), torch.zeros_like(out)) is not None


FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@given(dtype=st.sampled_from(FLOATS), n=st.integers(1, 3000),
       special=st.lists(st.tuples(st.integers(0, 2999), st.sampled_from(["nan", "inf", "-inf", "max", "-max"])),
                        max_size=6),
       seed=st.integers(0, 2**16))
def test_all_finite_agrees_with_the_elementwise_check(dtype: torch.dtype, n: int, special: list[tuple[int, str]],
                                                      seed: int) -> None:
    # the fast path (one sum) must equal isfinite().all() exactly, including sums of finite values that
    # overflow ("max" terms) and infinities of both signs that cancel to NaN
    t = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    big = torch.finfo(dtype).max
    values = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "max": big, "-max": -big}
    for i, kind in special:
        t[i % n] = values[kind]
    assert all_finite(t) == bool(torch.isfinite(t).all())


def test_all_finite_survives_overflowing_sums() -> None:
    # finite values whose sum overflows are finite: the sum alone would refuse them
    for dtype in FLOATS:
        t = torch.full((64, 3), torch.finfo(dtype).max, dtype=dtype)
        assert not bool(torch.isfinite(t.sum())) and all_finite(t)
        t[5, 1] = float("nan")
        assert not all_finite(t)
    assert all_finite(torch.tensor([1, 2, 3]))  # integers are always finite


def test_overflowing_but_finite_activation_is_accepted(tier: Tier) -> None:
    x = torch.full((4, 16, 4, 4), torch.finfo(torch.float32).max)
    # the boundary check accepts it; the forward overflows, which the loss check then refuses
    with pytest.raises(InvalidArgument, match="loss is not finite"):
        tier.step(StepKey("run", "a", 0, 0), x, y())


class FlakyNext:
    """The next tier, unreachable the first time step ``fail_seq`` reaches it (a cloud restarting)."""

    def __init__(self, tier: Tier, fail_seq: int | None) -> None:
        self.tier, self.fail_seq = tier, fail_seq

    def _fail(self, key: StepKey) -> None:
        if key.seq == self.fail_seq:
            self.fail_seq = None
            raise Unavailable("cloud restarting")

    def step(self, key, activation, labels):  # type: ignore[no-untyped-def]
        self._fail(key)
        return self.tier.step(key, activation, labels)

    def forward(self, key, activation):  # type: ignore[no-untyped-def]
        self._fail(key)
        return self.tier.forward(key, activation)

    def backward(self, key, grad):  # type: ignore[no-untyped-def]
        return self.tier.backward(key, grad)


def _edge_and_cloud(fail_seq: int | None, u_shape: bool = False) -> tuple[Tier, Tier]:
    cfg = RoundConfig("run", 0, SPEC, u_shape=u_shape)
    cuts = (2, 3, 5) if u_shape else (2, 3)
    edge_load, cloud_load = tier_loads(cfg, "a", cuts, initial_state(SPEC, 0))  # BatchNorm in both segments
    cloud = Tier("cloud")
    cloud.load(cloud_load)
    edge = Tier("edge", next=FlakyNext(cloud, fail_seq))  # type: ignore[arg-type]
    edge.load(edge_load)
    return edge, cloud


def test_a_step_the_next_tier_failed_is_retried_exactly_once() -> None:
    """The edge's forward already moved BatchNorm's running statistics when the cloud failed: the retry
    must not count the batch twice (both tiers end as if nothing had failed)."""
    clean_edge, clean_cloud = _edge_and_cloud(None)
    edge, cloud = _edge_and_cloud(1)
    for s in range(3):
        k = StepKey("run", "a", 0, s)
        want = clean_edge.step(k, act(), y())
        if s == 1:
            before = edge.fetch("run", "a")
            with pytest.raises(Unavailable):
                edge.step(k, act(), y())
            assert same(before, edge.fetch("run", "a"))  # running statistics included
        got = edge.step(k, act(), y())
        assert want.grad is not None and got.grad is not None and torch.equal(want.grad, got.grad)
    assert same(clean_edge.fetch("run", "a"), edge.fetch("run", "a"))
    assert same(clean_cloud.fetch("run", "a"), cloud.fetch("run", "a"))


def test_a_u_shape_forward_the_next_tier_failed_is_retried_exactly_once() -> None:
    clean_edge, _ = _edge_and_cloud(None, u_shape=True)
    edge, _ = _edge_and_cloud(0, u_shape=True)
    k = StepKey("run", "a", 0, 0)
    before = edge.fetch("run", "a")
    with pytest.raises(Unavailable):
        edge.forward(k, act())
    assert same(before, edge.fetch("run", "a"))
    want, got = clean_edge.forward(k, act()), edge.forward(k, act())
    assert torch.equal(want, got)
    clean_edge.backward(k, torch.ones_like(want))
    edge.backward(k, torch.ones_like(got))
    assert same(clean_edge.fetch("run", "a"), edge.fetch("run", "a"))


class AnswersWith:
    """A link (the edge, seen from the device) that answers with ``grad`` and, in U-shape, ``mid``."""

    def __init__(self, grad: torch.Tensor | None = None, mid: torch.Tensor | None = None) -> None:
        self.grad, self.mid = grad, mid

    def step(self, key, activation, labels):  # type: ignore[no-untyped-def]
        from splitfed.engine.types import StepReply

        return StepReply(self.grad, 0.5, 1)

    def forward(self, key, activation):  # type: ignore[no-untyped-def]
        return self.mid

    def backward(self, key, grad):  # type: ignore[no-untyped-def]
        return self.grad


NAN = torch.full((4, 16, 4, 4), float("nan"))


@pytest.mark.parametrize("link, u_shape, words", [
    (AnswersWith(grad=NAN), False, "step 0 of a: the edge's gradient: contains NaN"),
    (AnswersWith(grad=torch.zeros(4, 16, 4)), False, "got float32 [4, 16, 4], expected float32 [4, 16, 4, 4]"),
    (AnswersWith(grad=torch.zeros(4, 16, 4, 4, dtype=torch.float64)), False, "got float64"),
    (AnswersWith(mid=torch.zeros(3, 128)), True, "forward 0 of a: the servers' output: got float32 [3, 128], "
                                               "expected batch 4"),
    (AnswersWith(mid=torch.full((4, 128), float("inf"))), True, "the servers' output: contains NaN"),
    (AnswersWith(mid=torch.zeros(4, 128), grad=NAN), True, "backward 0 of a: the edge's gradient: contains NaN"),
])
def test_device_refuses_what_the_edge_sends_back_and_applies_nothing(  # type: ignore[no-untyped-def]
        link, u_shape: bool, words: str) -> None:
    from splitfed.data import synthetic
    from splitfed.engine.device import Device

    cuts = (2, 3, 5) if u_shape else (2,)
    dev = Device(SPEC, link, run_id="run", client_id="a", round=0, cuts=cuts, state=initial_state(SPEC, 0),
                 u_shape=u_shape)
    before = dev.state()
    x, labels = synthetic(SPEC, 4, 0).tensors
    with pytest.raises(TierError, match=re.escape(words)):
        dev.train_step(x, labels)
    after = dev.state()
    # no weight moved (its forward did move BatchNorm statistics: a client that fails is dropped whole)
    assert all(torch.equal(before[k], after[k]) for k in before if "running" not in k and "batches" not in k)


# ------------------------------------------------------------ segments a vanished coordinator left behind


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _loaded(clock: FakeClock, clients: tuple[str, ...] = ("a", "b"), **kw) -> Tier:  # type: ignore[no-untyped-def]
    t = Tier("cloud", idle_release_s=100.0, clock=clock, **kw)
    cfg = RoundConfig("run", 0, SPEC)
    state = initial_state(SPEC, 0)
    for cid in clients:
        (load,) = tier_loads(cfg, cid, (2,), state)
        t.load(load)
    return t


def test_segments_unused_for_the_idle_time_are_released_and_the_rest_kept(caplog) -> None:  # type: ignore[no-untyped-def]
    import gc
    import weakref

    clock = FakeClock()
    t = _loaded(clock)
    gone = weakref.ref(next(iter(t._bindings[("run", "b")].replica.blocks.values())))
    clock.now += 60
    t.step(StepKey("run", "a", 0, 0), act(), y())  # a trains on; b's coordinator vanished
    clock.now += 60  # b unused for 120 s, a for 60 s
    assert t.sweep() == [("run", "b")]
    assert t.clients() == 1 and "released 1 segment(s) unused for 100 s" in caplog.text
    with pytest.raises(NotFound, match=r"client 'b' in run 'run' \(released unused for 100 s\)$"):
        t.step(StepKey("run", "b", 0, 0), act(), y())
    gc.collect()
    assert gone() is None  # b's replica (weights, optimizer state) is freed, not just unlisted
    t.step(StepKey("run", "a", 0, 1), act(), y())  # a is untouched
    assert t.sweep() == [] and t.clients() == 1
    clock.now += 101
    assert t.sweep() == [("run", "a")] and t.clients() == 0


def test_a_segment_a_young_tier_never_held_is_named_as_lost_with_a_restart_not_as_released() -> None:
    """A tier restarted mid-run answered the round's next step with "segments unused for 3600 s are released"
    after 10 s up, and a Reduce with "its edge no segment is loaded on tier edge"."""
    from splitfed.engine.types import ReduceItem

    clock = FakeClock()
    t = Tier("edge", idle_release_s=3600.0, clock=clock)
    clock.now += 10
    young = r"no segment loaded for client 'gone' in run 'run' \(this tier started 10 s ago: a segment loaded " \
            r"before then was lost with the process that held it\)"
    with pytest.raises(NotFound, match=young):
        t.step(StepKey("run", "gone", 0, 0), act(), y())
    assert re.fullmatch("segment is missing: tier edge: " + young,
                        t.reduce("run", [ReduceItem("gone", "", 1.0)]).refused["gone"])
    clock.now += 3600
    with pytest.raises(NotFound, match=r"'run' \(segments unused for 3600 s are released\)$"):
        t.step(StepKey("run", "gone", 0, 0), act(), y())
    # one it held says why it went, however young the tier
    fresh = _loaded(FakeClock())
    fresh.release("run", "a")
    with pytest.raises(NotFound, match=r"client 'a' in run 'run' \(released by its coordinator\)$"):
        fresh.step(StepKey("run", "a", 0, 0), act(), y())


def test_fetch_counts_as_use_and_no_idle_time_means_never() -> None:
    clock = FakeClock()
    t = _loaded(clock)
    clock.now += 90
    t.fetch("run", "a")
    clock.now += 20
    assert t.sweep() == [("run", "b")]
    never = Tier("cloud", idle_release_s=None, clock=clock)
    (load,) = tier_loads(RoundConfig("run", 0, SPEC), "a", (2,), initial_state(SPEC, 0))
    never.load(load)
    clock.now += 10**9
    assert never.sweep() == [] and never.clients() == 1
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="idle_release_s"):
            Tier("cloud", idle_release_s=bad)


def test_a_full_tier_lets_go_of_abandoned_segments_before_refusing() -> None:
    from splitfed.errors import ResourceExhausted

    clock = FakeClock()
    t = _loaded(clock, max_clients=2)
    (load,) = tier_loads(RoundConfig("run2", 0, SPEC), "c", (2,), initial_state(SPEC, 0))
    with pytest.raises(ResourceExhausted, match="already serves 2 clients"):
        t.load(load)  # a and b are recent: nothing to let go of
    clock.now += 101
    t.load(load)
    assert t.clients() == 1 and t.fetch("run2", "c")


def test_an_abandoned_u_shape_step_stops_blocking_its_shared_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """sflv2 + U-shape: a's device vanished between its forward and backward, holding the shared replica;
    b is told the replica is busy. Once a's segment is released for idleness, b trains on."""
    import splitfed.engine.tier as tier_mod

    monkeypatch.setattr(tier_mod, "SHARED_WAIT_S", 0.2)
    clock = FakeClock()
    t = Tier("edge", idle_release_s=100.0, clock=clock)
    cfg = RoundConfig("run", 0, SPEC, mode="sflv2", u_shape=True)
    (la,) = tier_loads(cfg, "a", (2, 5), initial_state(SPEC, 0), replica="shared")
    (lb,) = tier_loads(cfg, "b", (2, 5), None, replica="shared")
    t.load(la)
    t.load(lb)
    t.forward(StepKey("run", "a", 0, 0), act())  # a never sends its backward
    clock.now += 101
    with pytest.raises(tier_mod.Unavailable, match="busy"):
        t.forward(StepKey("run", "b", 0, 0), act())  # b is alive: it asked just now
    assert t.sweep() == [("run", "a")]
    out = t.forward(StepKey("run", "b", 0, 0), act())
    assert t.backward(StepKey("run", "b", 0, 0), torch.zeros_like(out)) is not None


@given(events=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 250)), max_size=12),
       at=st.integers(0, 400))
def test_exactly_the_segments_unused_for_longer_than_the_idle_time_are_released(
        events: list[tuple[str, int]], at: int) -> None:
    clock = FakeClock()
    start = clock.now
    t = _loaded(clock, clients=("a", "b", "c"))
    last = {"a": start, "b": start, "c": start}
    for cid, when in sorted(events, key=lambda e: e[1]):
        clock.now = start + when
        t.fetch("run", cid)
        last[cid] = clock.now
    clock.now = start + max([at, *(w for _, w in events)])
    released = {c for _, c in t.sweep()}
    assert released == {c for c, used in last.items() if clock.now - used > 100.0}
    assert t.clients() == 3 - len(released)


def test_status_says_what_the_tier_holds_and_has_served() -> None:
    clock = FakeClock()
    t = _loaded(clock)
    t.step(StepKey("run", "a", 0, 0), act(), y())
    t.step(StepKey("run", "a", 0, 1), act(), y())
    line = t.status()
    weights = sum(v.numel() * v.element_size() for v in t.fetch("run", "a").values()) * 2  # a's and b's replicas
    assert line == f"tier cloud: 2 segment(s) of 1 run(s) (run), {mib_text(weights)} of weights held; " \
                   "2 step(s) served"
    t.release("run", "a")
    t.release("run", "b")
    assert t.status() == "tier cloud: 0 segment(s) of 0 run(s), 0 bytes of weights held; 2 step(s) served"
