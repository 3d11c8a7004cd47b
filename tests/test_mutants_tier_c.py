"""A tier's data path pinned exactly: a step's accuracy count and update against the unsplit model, the label and
token-id ranges at their edge, U-shape refusals by their words, no gradient kept between steps, a relaying
tier's check of the gradient the next tier sends back, and the idle clock a refused call leaves alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, select, tier_loads
from splitfed.engine.tier import Tier
from splitfed.engine.types import SegmentLoad, StepKey
from splitfed.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TierError,
    Unavailable,
)
from splitfed.models.segment import Segment, step_rng
from splitfed.models.zoo import resolve_spec
from tests.tier_fixtures import Clock

SPEC = resolve_spec("cnn")  # 7 blocks; [2, 7) holds a BatchNorm, a Dropout and the classifier


def act(batch: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 16, 4, 4, generator=torch.Generator().manual_seed(seed))


def _cloud(cid: str = "a", secret: str = "") -> tuple[Tier, dict[str, torch.Tensor]]:
    t = Tier("cloud", idle_release_s=None)
    state = initial_state(SPEC, 0)
    (load,) = tier_loads(RoundConfig("run", 0, SPEC), cid, (2,), state)
    if secret:
        load.secret = secret
    t.load(load)
    return t, state


def _reference(state: dict[str, torch.Tensor], start: int, stop: int) -> Segment:
    """Blocks [start, stop) of the unsplit model, in training mode."""
    whole = template.whole_model(SPEC, state)
    seg = Segment({str(i): whole._modules[str(i)] for i in range(start, stop)}, start, stop)
    return seg.train()


def test_a_step_counts_exactly_the_samples_its_output_classifies_right_and_applies_one_sgd_update() -> None:
    t, state = _cloud()
    x = act()
    ref = _reference(state, 2, 7)
    with torch.no_grad():
        guess = ref(x.clone(), rng=step_rng(0, "a", 0, 0)).argmax(1)
    labels = torch.cat([guess[:3], (guess[3:] + 1) % 10])  # 3 of 8 right: not 8 - 3
    ref = _reference(state, 2, 7)  # fresh BatchNorm statistics, as the tier's
    xr = x.clone().requires_grad_(True)
    out = ref(xr, rng=step_rng(0, "a", 0, 0))
    loss = F.cross_entropy(out, labels)
    loss.backward()
    reply = t.step(StepKey("run", "a", 0, 0), x, labels)
    assert reply.correct == 3
    assert reply.loss == pytest.approx(float(loss.detach()), rel=1e-6)
    assert reply.grad is not None and torch.allclose(reply.grad, xr.grad, atol=1e-7)  # type: ignore[arg-type]
    got = t.fetch("run", "a")
    for name, p in ref.named_parameters():
        assert p.grad is not None
        assert torch.allclose(got[name], p.detach() - 0.05 * p.grad, atol=1e-7), name


def test_no_gradient_is_kept_between_steps_nor_after_a_u_shape_backward() -> None:
    """A tier holds many clients' segments between their steps: a step's gradients are freed with it."""
    t, _ = _cloud()
    t.step(StepKey("run", "a", 0, 0), act(), torch.arange(8) % 10)
    assert all(p.grad is None for p in t._bindings[("run", "a")].segment.parameters())
    u = Tier("edge", idle_release_s=None)
    (load,) = tier_loads(RoundConfig("run", 0, SPEC, u_shape=True), "a", (2, 5), initial_state(SPEC, 0))
    u.load(load)
    out = u.forward(StepKey("run", "a", 0, 0), act())
    u.backward(StepKey("run", "a", 0, 0), torch.ones_like(out))
    assert all(p.grad is None for p in u._bindings[("run", "a")].segment.parameters())


@pytest.mark.parametrize("top", [10, 11])
def test_a_label_equal_to_num_classes_is_refused_and_the_last_class_accepted(top: int) -> None:
    t, _ = _cloud()
    before = t.fetch("run", "a")
    labels = torch.tensor([0, 1, 2, top, 4, 5, 6, 7])
    with pytest.raises(InvalidArgument, match=r"labels must lie in 0\.\.9$"):
        t.step(StepKey("run", "a", 0, 0), act(), labels)
    assert all(torch.equal(before[k], v) for k, v in t.fetch("run", "a").items())
    labels[3] = 9
    assert t.step(StepKey("run", "a", 0, 0), act(), labels).loss > 0  # still step 0: nothing was applied


def _token_tier() -> Tier:
    spec = resolve_spec("transformer")  # vocab 17
    n = template.num_blocks(spec)
    tier = Tier("edge", idle_release_s=None)
    tier.load(SegmentLoad("run", "t", 0, spec, 0, n, "t", select(initial_state(spec, 0), 0, n), secret="s"))
    return tier


@pytest.mark.parametrize("low, high, words", [(0, 17, "got 0..17"), (-1, 16, "got -1..16"), (-1, 17, "got -1..17")])
def test_a_token_id_equal_to_the_vocab_or_below_zero_is_refused_with_the_range(low: int, high: int,
                                                                                words: str) -> None:
    tier = _token_tier()
    x = torch.full((2, 64), 3, dtype=torch.int64)
    x[0, 1], x[1, 5] = low, high
    with pytest.raises(InvalidArgument, match=rf"token ids must lie in 0\.\.16 \(the model's vocab\), {words}$"):
        tier.step(StepKey("run", "t", 0, 0, secret="s"), x, torch.tensor([0, 1]))
    x[0, 1], x[1, 5] = 0, 16
    assert tier.step(StepKey("run", "t", 0, 0, secret="s"), x, torch.tensor([0, 1])).loss > 0


def _u_edge() -> Tier:
    t = Tier("edge", idle_release_s=None)
    (load,) = tier_loads(RoundConfig("run", 0, SPEC, u_shape=True), "a", (2, 5), initial_state(SPEC, 0))
    t.load(load)
    return t


def test_a_u_shape_backward_for_another_round_is_refused_even_when_its_seq_was_just_applied() -> None:
    t = _u_edge()
    k = StepKey("run", "a", 0, 0)
    out = t.forward(k, act())
    g = t.backward(k, torch.ones_like(out))
    assert g is not None
    assert torch.equal(t.backward(k, torch.ones_like(out)), g)  # type: ignore[arg-type]  # a retry: its reply
    with pytest.raises(FailedPrecondition, match=r"^step for round 1, but round 0 is loaded$"):
        t.backward(StepKey("run", "a", 1, 0), torch.ones_like(out))


def test_a_forward_while_another_waits_for_its_backward_names_that_step_whatever_its_seq() -> None:
    t = _u_edge()
    t.forward(StepKey("run", "a", 0, 0), act())
    for seq in (1, 3):
        with pytest.raises(FailedPrecondition, match=rf"^step {seq} before the backward of step 0$"):
            t.forward(StepKey("run", "a", 0, seq), act())
    with pytest.raises(FailedPrecondition, match="waits for its backward"):
        t.step(StepKey("run", "a", 0, 1), act(), torch.arange(8) % 10)


def test_a_u_shape_backward_that_no_gradient_reached_sends_none_back_and_frees_the_step() -> None:
    t = _u_edge()
    before = t.fetch("run", "a")
    t.forward(StepKey("run", "a", 0, 0), act())
    assert t.backward(StepKey("run", "a", 0, 0), None) is None
    after = t.fetch("run", "a")
    assert all(torch.equal(before[k], after[k]) for k in before if "running" not in k and "batches" not in k)
    out = t.forward(StepKey("run", "a", 0, 1), act())  # the next step goes on
    assert t.backward(StepKey("run", "a", 0, 1), torch.ones_like(out)) is not None


class _Corrupting:
    """The link to a real next tier; its backward's gradient comes back corrupted ("nan", "shape": a faulty or
    hostile tier) or as sent ("none")."""

    def __init__(self, tier: Tier, how: str) -> None:
        self.tier, self.how = tier, how

    def step(self, key, activation, labels):  # type: ignore[no-untyped-def]
        return self.tier.step(key, activation, labels)

    def forward(self, key, activation):  # type: ignore[no-untyped-def]
        return self.tier.forward(key, activation)

    def backward(self, key, grad):  # type: ignore[no-untyped-def]
        g = self.tier.backward(key, grad)
        assert g is not None
        return g if self.how == "none" else g * float("nan") if self.how == "nan" else g[:, :8]


@pytest.mark.parametrize("how, words", [("nan", "contains NaN"), ("shape", r"got float32 \[4, 8, 4, 4\], expected float32 \[4, 32, 4, 4\]; nothing was applied")])
def test_a_relaying_tier_refuses_the_gradient_its_next_tier_sends_back_and_applies_nothing(how: str,
                                                                                           words: str) -> None:
    cfg = RoundConfig("run", 0, SPEC, u_shape=True)
    edge_load, cloud_load = tier_loads(cfg, "a", (2, 3, 5), initial_state(SPEC, 0))
    cloud = Tier("cloud", idle_release_s=None)
    cloud.load(cloud_load)
    edge = Tier("edge", next=_Corrupting(cloud, how), idle_release_s=None)
    edge.load(edge_load)
    before = edge.fetch("run", "a")
    k = StepKey("run", "a", 0, 0)
    out = edge.forward(k, act(4))
    with pytest.raises(TierError, match=f"^tier edge: backward 0 of a: the next tier's gradient.*{words}"):
        edge.backward(k, torch.ones_like(out))
    after = edge._bindings[("run", "a")].segment.state_dict()  # the step still waits for a backward: no fetch
    assert all(torch.equal(before[k], after[k]) for k in before if "running" not in k and "batches" not in k)
    assert all(p.grad is None for p in edge._bindings[("run", "a")].segment.parameters())



def test_a_refused_call_does_not_keep_a_segment_from_its_idle_release() -> None:
    clock = Clock()
    t = Tier("cloud", idle_release_s=100.0, clock=clock)
    (load,) = tier_loads(RoundConfig("run", 0, SPEC), "a", (2,), initial_state(SPEC, 0))
    load.secret = "right"
    t.load(load)
    clock.now += 90
    with pytest.raises(PermissionDenied, match="carries another secret"):
        t.step(StepKey("run", "a", 0, 0, secret="wrong"), act(), torch.arange(8) % 10)
    clock.now += 20
    assert t.sweep() == [("run", "a")]


def test_a_tier_exactly_as_old_as_the_idle_time_still_names_a_missing_segment_as_lost_with_a_restart() -> None:
    clock = Clock()
    t = Tier("edge", idle_release_s=3600.0, clock=clock)
    clock.now += 3600
    with pytest.raises(NotFound, match=r"\(this tier started 3600 s ago: a segment loaded before then was lost"):
        t.step(StepKey("run", "gone", 0, 0), act(), torch.arange(8) % 10)
    clock.now += 1
    with pytest.raises(NotFound, match=r"\(segments unused for 3600 s are released\)$"):
        t.step(StepKey("run", "gone", 0, 0), act(), torch.arange(8) % 10)


# ---------------------------------------------------------------- a step that fails inside its backward


class _FailsBackwardOnMarker(torch.autograd.Function):
    """Identity; its backward fails when the forward's input held the marker (a backward that runs out of
    memory half-way, say): the blocks after it already hold their gradients then."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.marked = bool((x == MARKER).any())
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        if ctx.marked:
            raise RuntimeError("backward failed half-way")
        return g


MARKER = 777.0


class _Marked(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FailsBackwardOnMarker.apply(x)


def backward_fails_on_marker() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), _Marked(), torch.nn.Linear(4, 3))


def _marked_tier() -> Tier:
    spec = resolve_spec("tests.test_mutants_tier_c:backward_fails_on_marker", input_shape=(4,), num_classes=3)
    n = template.num_blocks(spec)
    t = Tier("cloud", idle_release_s=None)
    t.load(SegmentLoad("run", "m", 0, spec, 1, n, "m", select(initial_state(spec, 0), 1, n)))
    return t


def test_a_step_that_fails_in_its_backward_leaves_no_gradient_for_the_next_step() -> None:
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2, 0])
    clean, failed = _marked_tier(), _marked_tier()
    bad = x.clone()
    bad[2, 1] = MARKER
    with pytest.raises(Exception, match="backward failed half-way"):
        failed.step(StepKey("run", "m", 0, 0), bad, labels)
    assert all(p.grad is None for p in failed._bindings[("run", "m")].segment.parameters())
    want = clean.step(StepKey("run", "m", 0, 0), x, labels)
    got = failed.step(StepKey("run", "m", 0, 0), x, labels)  # the same step 0: the failed one was not applied
    assert got.loss == want.loss and got.correct == want.correct
    a, b = clean.fetch("run", "m"), failed.fetch("run", "m")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_relaying_u_shape_tier_sends_back_the_gradient_of_the_unsplit_servers_part() -> None:
    state = initial_state(SPEC, 0)
    edge_load, cloud_load = tier_loads(RoundConfig("run", 0, SPEC, u_shape=True), "a", (2, 3, 5), state)
    cloud = Tier("cloud", idle_release_s=None)
    cloud.load(cloud_load)
    edge = Tier("edge", next=_Corrupting(cloud, "none"), idle_release_s=None)
    edge.load(edge_load)
    x = act(4)
    g_out = torch.randn(4, 128, generator=torch.Generator().manual_seed(5))
    ref = _reference(state, 2, 5)
    xr = x.clone().requires_grad_(True)
    out = ref(xr)
    out.backward(g_out)
    k = StepKey("run", "a", 0, 0)
    assert torch.allclose(edge.forward(k, x), out.detach(), atol=1e-6)
    gx = edge.backward(k, g_out)
    assert gx is not None and xr.grad is not None and torch.allclose(gx, xr.grad, atol=1e-6)
    got = {**edge.fetch("run", "a"), **cloud.fetch("run", "a")}
    for name, p in ref.named_parameters():
        assert p.grad is not None and torch.allclose(got[name], p.detach() - 0.05 * p.grad, atol=1e-6), name


def test_a_relaying_tier_steps_as_the_unsplit_servers_part_and_passes_on_the_count() -> None:
    state = initial_state(SPEC, 0)
    edge_load, cloud_load = tier_loads(RoundConfig("run", 0, SPEC), "a", (2, 3), state)
    cloud = Tier("cloud", idle_release_s=None)
    cloud.load(cloud_load)
    edge = Tier("edge", next=_Corrupting(cloud, "none"), idle_release_s=None)
    edge.load(edge_load)
    x = act()
    with torch.no_grad():
        guess = _reference(state, 2, 7)(x.clone(), rng=step_rng(0, "a", 0, 0)).argmax(1)
    labels = torch.cat([guess[:5], (guess[5:] + 1) % 10])  # 5 of 8 right
    ref = _reference(state, 2, 7)
    xr = x.clone().requires_grad_(True)
    loss = F.cross_entropy(ref(xr, rng=step_rng(0, "a", 0, 0)), labels)
    loss.backward()
    reply = edge.step(StepKey("run", "a", 0, 0), x, labels)
    assert reply.correct == 5 and reply.loss == pytest.approx(float(loss.detach()), rel=1e-6)
    assert reply.grad is not None and xr.grad is not None and torch.allclose(reply.grad, xr.grad, atol=1e-7)
    got = {**edge.fetch("run", "a"), **cloud.fetch("run", "a")}
    for name, p in ref.named_parameters():
        assert p.grad is not None and torch.allclose(got[name], p.detach() - 0.05 * p.grad, atol=1e-7), name


def u_backward_fails_on_marker() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), _Marked(), torch.nn.Linear(4, 4), torch.nn.Linear(4, 3))


def u_bn_backward_fails_on_marker() -> torch.nn.Module:
    """As above, with BatchNorm after the failing block: its running statistics move in the forward."""
    return torch.nn.Sequential(torch.nn.Linear(4, 4), _Marked(), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 4),
                               torch.nn.Linear(4, 3))


def _shared_u_tier(model: str = "u_backward_fails_on_marker", blocks: tuple[int, int] = (1, 3)) -> Tier:
    """Clients a and b in turn on one shared U-shape replica (sflv2), ``blocks`` on this tier."""
    spec = resolve_spec(f"tests.test_mutants_tier_c:{model}", input_shape=(4,), num_classes=3)
    assert template.num_blocks(spec) > blocks[1]
    cfg = RoundConfig("run", 0, spec, mode="sflv2", u_shape=True)
    t = Tier("edge", idle_release_s=None)
    (la,) = tier_loads(cfg, "a", blocks, initial_state(spec, 0), replica="S")
    (lb,) = tier_loads(cfg, "b", blocks, None, replica="S")
    t.load(la)
    t.load(lb)
    return t


def test_a_u_shape_backward_that_fails_half_way_leaves_no_gradient_on_a_shared_replica() -> None:
    """A plain step that fails frees its gradients; a U-shape backward that failed half-way kept those of the
    blocks after the failing one, and the shared replica's next client applied them with its own step."""
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    g = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    clean, failed = _shared_u_tier(), _shared_u_tier()
    bad = x.clone()
    bad[0, 0] = MARKER
    failed.forward(StepKey("run", "a", 0, 0), bad)
    with pytest.raises(Exception, match="backward failed half-way"):
        failed.backward(StepKey("run", "a", 0, 0), g)
    assert all(p.grad is None for p in failed._bindings[("run", "a")].segment.parameters())
    for t in (clean, failed):  # its coordinator gives up on a; b trains on the shared replica
        t.release("run", "a")
        t.forward(StepKey("run", "b", 0, 0), x)
        t.backward(StepKey("run", "b", 0, 0), g)
    a, b = clean.fetch("run", "b"), failed.fetch("run", "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_u_shape_step_whose_backward_fails_here_is_undone_and_lets_go_of_the_shared_replica(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its backward used up the forward's graph, so no retry of it can run: the step is undone (the running
    statistics its forward moved, its sequence) and the replica's lock let go of at once. b trains on without
    waiting for a's release, and a's retry of the whole step runs as a clean one."""
    import splitfed.engine.tier as tier_mod

    monkeypatch.setattr(tier_mod, "SHARED_WAIT_S", 0.5)  # the old code held the lock: b got UNAVAILABLE
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    g = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    shared = ("u_bn_backward_fails_on_marker", (1, 4))
    clean, failed = _shared_u_tier(*shared), _shared_u_tier(*shared)
    before = failed.fetch("run", "a")
    bad = x.clone()
    bad[0, 0] = MARKER
    failed.forward(StepKey("run", "a", 0, 0), bad)
    with pytest.raises(Exception, match="backward failed half-way"):
        failed.backward(StepKey("run", "a", 0, 0), g)
    after = failed.fetch("run", "a")  # refused while a step waits for its backward: none does now
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert any("running_mean" in k for k in before)
    with pytest.raises(FailedPrecondition, match="without its forward"):
        failed.backward(StepKey("run", "a", 0, 0), g)
    replies = []
    for t in (clean, failed):  # b first, on the replica a left; then a's retry of its step 0
        got = []
        for cid in ("b", "a"):
            got.append(t.forward(StepKey("run", cid, 0, 0), x))
            got.append(t.backward(StepKey("run", cid, 0, 0), g))
        replies.append(got)
    assert all(w is not None and v is not None and torch.equal(w, v) for w, v in zip(*replies, strict=True))
    for cid in ("a", "b"):
        want, have = clean.fetch("run", cid), failed.fetch("run", cid)
        assert want.keys() == have.keys() and all(torch.equal(want[k], have[k]) for k in want)


def test_a_u_shape_backward_the_next_tier_failed_keeps_its_step_and_its_retry_runs() -> None:
    """Only a backward that failed in this tier's own blocks is undone: one the next tier failed never ran
    here, its graph is whole, and the retry (the same step) gives the clean chain's gradient and weights."""
    state = initial_state(SPEC, 0)
    g_out = torch.randn(4, 128, generator=torch.Generator().manual_seed(5))
    k = StepKey("run", "a", 0, 0)
    results = []
    for fails in (False, True):
        edge_load, cloud_load = tier_loads(RoundConfig("run", 0, SPEC, u_shape=True), "a", (2, 3, 5), state)
        cloud = Tier("cloud", idle_release_s=None)
        cloud.load(cloud_load)
        link = _FailsBackwardOnce(cloud, fails)
        edge = Tier("edge", next=link, idle_release_s=None)  # type: ignore[arg-type]
        edge.load(edge_load)
        edge.forward(k, act(4))
        if fails:
            with pytest.raises(Unavailable, match="cloud restarting"):
                edge.backward(k, g_out)
        results.append((edge.backward(k, g_out), edge.fetch("run", "a"), cloud.fetch("run", "a")))
    (g0, e0, c0), (g1, e1, c1) = results
    assert g0 is not None and g1 is not None and torch.equal(g0, g1)
    for want, have in ((e0, e1), (c0, c1)):
        assert want.keys() == have.keys() and all(torch.equal(want[key], have[key]) for key in want)


class _FailsBackwardOnce(_Corrupting):
    """The link to the cloud, unreachable for the first backward when ``fails`` (a cloud restarting)."""

    def __init__(self, tier: Tier, fails: bool) -> None:
        super().__init__(tier, "none")
        self.fails = fails

    def backward(self, key, grad):  # type: ignore[no-untyped-def]
        if self.fails:
            self.fails = False
            raise Unavailable("cloud restarting")
        return self.tier.backward(key, grad)
