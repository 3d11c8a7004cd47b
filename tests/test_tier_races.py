"""A tier's loads and backwards under calls that race or carry what no coordinator sends: a refused load
writes nothing, a replica holds one model, a retried backward gets its reply, token ids outside the vocab and
names with line breaks are refused with their reason (an adversarial review reproduced each over gRPC)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import splitfed.engine.tier as tier_mod
from splitfed.engine import template
from splitfed.engine.compute import memory_bytes
from splitfed.engine.limits import BuildLimits
from splitfed.engine.rounds import initial_state, select
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig, SegmentLoad, StepKey, is_base
from splitfed.errors import (
    ConfigError,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
)
from splitfed.models.zoo import resolve_spec
from tests.tier_fixtures import paused_bind
from tests.transport_fixtures import at_once

SPEC = resolve_spec("cnn")  # 7 blocks


def _state(value: float | None = None) -> dict[str, torch.Tensor]:
    st = select(initial_state(SPEC, 0), 2, 7)
    return st if value is None else {k: torch.full_like(v, value) if v.is_floating_point() else v
                                     for k, v in st.items()}


def _floats(state: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [v for k, v in state.items() if v.is_floating_point() and "running" not in k]


def test_a_load_refused_because_another_bound_its_client_meanwhile_wrote_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Client b holds replica R under secret S2. A load of x into R (with S2) is checked, then, while it copies,
    a load binds x elsewhere under S1. Before, the first load was refused only after it had written R: b's
    weights became the refused load's. Now the client is the first load's until it ends: the second is
    refused before it writes anything, and every weight on the tier is one an accepted load wrote."""
    tier = Tier("edge", idle_release_s=None)
    b = SegmentLoad("run", "b", 0, SPEC, 2, 7, "R", _state(), secret="S2")
    tier.load(b)
    outcome: dict[str, BaseException | None] = {}

    def into_r() -> None:
        try:
            tier.load(replace(b, client_id="x", state=_state(7.0)))
            outcome["into R"] = None
        except BaseException as e:  # noqa: BLE001 - what the load met, asserted below
            outcome["into R"] = e

    with paused_bind(monkeypatch, "R") as (inside, _):
        t = threading.Thread(target=into_r)
        t.start()
        assert inside.wait(10)
        try:
            tier.load(SegmentLoad("run", "x", 0, SPEC, 2, 7, "X1", _state(9.0), secret="S1"))
            outcome["elsewhere"] = None
        except PermissionDenied as e:
            outcome["elsewhere"] = e
    t.join(10)
    refused = [k for k, e in outcome.items() if e is not None]
    assert refused == ["elsewhere"], outcome
    assert "being loaded now" in str(outcome["elsewhere"])
    assert all(torch.all(v == 7.0) for v in _floats(tier.fetch("run", "b", "S2")))  # the accepted load's weights
    assert not any(torch.any(v == 9.0) for cid, s in (("b", "S2"), ("x", "S2"))
                   for v in _floats(tier.fetch("run", cid, s)))
    assert ("run", "X1") not in tier._replicas and not tier._claims


def test_a_replica_holds_the_blocks_of_one_model() -> None:
    """Before, a load of cnn width 8 joined a replica of cnn width 16 and bound its blocks: every step then
    failed inside torch (INTERNAL), or, where the shapes happened to match, mixed two models silently."""
    tier = Tier("edge", idle_release_s=None)
    tier.load(SegmentLoad("run", "b", 0, SPEC, 0, 7, "R", select(initial_state(SPEC, 0), 0, 7), secret="s"))
    narrow = resolve_spec("cnn", width=8)
    with pytest.raises(FailedPrecondition, match="replica 'R' holds blocks of another model"):
        tier.load(SegmentLoad("run", "c", 0, narrow, 0, 7, "R", None, secret="s"))
    tier.load(SegmentLoad("run", "@base.1", 0, SPEC, 0, 7, "@b", select(initial_state(SPEC, 0), 0, 7),
                          secret="t"))
    with pytest.raises(FailedPrecondition, match="its base '@b' holds blocks of another model"):
        tier.load(SegmentLoad("run", "c", 0, narrow, 0, 7, "C", None, secret="u", base="@b", base_secret="t"))
    assert tier.clients() == 2 and ("run", "C") not in tier._replicas


def test_a_retried_backward_that_comes_while_the_first_runs_gets_its_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    """U-shape: the backward of a forward, sent twice at once (a client's retry after a lost reply). Before,
    both passed the checks and ran the graph's backward twice: the second got INTERNAL."""
    tier = Tier("edge", idle_release_s=None)
    tier.load(SegmentLoad("run", "u", 0, SPEC, 2, 5, "u", select(initial_state(SPEC, 0), 2, 5), secret="s"))
    key = StepKey("run", "u", 0, 0, secret="s")
    x = torch.randn(4, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    out = tier.forward(key, x)
    first_in, go_on = threading.Event(), threading.Event()
    real = tier_mod.check_tensor

    def slow(t, shape, dtype, what, *a):  # type: ignore[no-untyped-def]
        if what == "gradient" and not first_in.is_set():
            first_in.set()
            assert go_on.wait(10)
        return real(t, shape, dtype, what, *a)

    monkeypatch.setattr(tier_mod, "check_tensor", slow)
    grad = torch.ones_like(out) * 1e-3
    got: list[object] = []

    def back() -> None:
        try:
            got.append(tier.backward(key, grad))
        except BaseException as e:  # noqa: BLE001 - asserted below
            got.append(e)

    threads = [threading.Thread(target=back) for _ in range(2)]
    threads[0].start()
    assert first_in.wait(10)
    threads[1].start()
    go_on.set()
    for t in threads:
        t.join(10)
    assert len(got) == 2 and all(isinstance(g, torch.Tensor) for g in got), got
    assert torch.equal(got[0], got[1])  # type: ignore[arg-type]
    tier.forward(StepKey("run", "u", 0, 1, secret="s"), x)  # the client goes on: the lock was let go of once


@pytest.mark.parametrize("ids", [[17], [-1], [10**12]])
def test_token_ids_outside_the_vocab_are_refused_with_the_range(ids: list[int]) -> None:
    """Before, the embedding raised IndexError inside the step: INTERNAL, and on a CUDA tier a device-side
    assert that breaks the process's GPU context for every client."""
    spec = resolve_spec("transformer")  # vocab 17
    tier = Tier("edge", idle_release_s=None)
    n = template.num_blocks(spec)
    tier.load(SegmentLoad("run", "t", 0, spec, 0, n, "t", select(initial_state(spec, 0), 0, n), secret="s"))
    x = torch.zeros(2, 64, dtype=torch.int64)
    x[1, 5] = ids[0]
    with pytest.raises(InvalidArgument, match=r"token ids must lie in 0\.\.16"):
        tier.step(StepKey("run", "t", 0, 0, secret="s"), x, torch.tensor([0, 1]))
    x[1, 5] = 16
    reply = tier.step(StepKey("run", "t", 0, 0, secret="s"), x, torch.tensor([0, 1]))  # and the step is still 0
    assert reply.loss > 0


@pytest.mark.parametrize("field", ["run_id", "client_id", "replica", "base"])
def test_names_with_line_breaks_are_refused(field: str) -> None:
    """A run id with a line break was accepted and printed raw in the tier's status line: a forged log line."""
    tier = Tier("edge", idle_release_s=None)
    load = SegmentLoad("run", "c", 0, SPEC, 2, 7, "c", _state(), secret="s")
    with pytest.raises(InvalidArgument, match=f"{field} .*control character"):
        tier.load(replace(load, **{field: "x\nERROR tier: TLS key leaked"}))
    assert tier.clients() == 0


# ---------------------------------------------------------------- what a tier's segments hold at once


def _held_now(tier: Tier) -> int:
    """What the tier holds, counted afresh from its replicas and bindings (each block's weights and buffers
    and, where a client trains it, a gradient per byte that trains; each client binding's optimizer state: its
    slots and Adam's step counts, ``OptimConfig.state_bytes``). A
    coordinator's base segment (``@...``) never steps: its weights alone."""
    def trains(users: set[str]) -> bool:
        return not all(is_base(u) for u in users)

    blocks = sum(template.held_bytes(r.model, i)[0] + template.held_bytes(r.model, i)[1] * trains(r.users)
                 for r in tier._replicas.values() for i in r.blocks if r.model is not None)
    optim = sum(b.spec.optim.state_bytes(template.held_bytes(b.spec.model, i)[1],
                                         template.train_tensors(b.spec.model, i)) * trains({c})
                for (_, c), b in tier._bindings.items() for i in range(b.spec.start, b.spec.stop))
    return blocks + optim


def _segment(start: int, stop: int, optim: OptimConfig) -> int:
    return sum(sum(template.held_bytes(SPEC, i))
               + optim.state_bytes(template.held_bytes(SPEC, i)[1], template.train_tensors(SPEC, i))
               for i in range(start, stop))


def _weights(start: int, stop: int) -> int:
    return sum(template.held_bytes(SPEC, i)[0] for i in range(start, stop))


def test_a_load_beyond_what_the_tier_may_hold_is_refused_and_a_release_makes_room() -> None:
    """Before, only the number of clients bounded a tier: 40 loads of 68 bytes each, copying a base, took a
    tier from 467 to 1,791 MiB, towards the machine's out-of-memory killer."""
    momentum = OptimConfig("sgd", momentum=0.9)
    one, base_bytes = _segment(2, 7, momentum), _weights(2, 7)
    tier = Tier("edge", idle_release_s=None, max_held_bytes=2 * one + base_bytes + one // 2)
    tier.load(SegmentLoad("run", "@base.1", 0, SPEC, 2, 7, "@b", _state(), secret="t", optim=momentum))
    for c in ("c0", "c1"):
        tier.load(SegmentLoad("run", c, 0, SPEC, 2, 7, c, None, secret=c, optim=momentum, base="@b",
                              base_secret="t"))
    with pytest.raises(ResourceExhausted, match="would add"):  # the base and three copies of it
        tier.load(SegmentLoad("run", "c2", 0, SPEC, 2, 7, "c2", None, secret="c2", optim=momentum, base="@b",
                              base_secret="t"))
    assert tier.clients() == 3 and tier.held == _held_now(tier) == 2 * one + base_bytes
    assert ("run", "c2") not in tier._replicas  # the refused load left nothing
    tier.release("run", "c0", "c0")
    tier.load(SegmentLoad("run", "c2", 0, SPEC, 2, 7, "c2", None, secret="c2", optim=momentum, base="@b",
                          base_secret="t"))
    for c, s in (("c1", "c1"), ("c2", "c2"), ("@base.1", "t")):
        tier.release("run", c, s)
    assert tier.held == 0 and not tier._replicas


@pytest.mark.parametrize("optim", [OptimConfig("adam"), OptimConfig("sgd", momentum=0.9), OptimConfig("sgd")])
def test_a_coordinators_base_segment_holds_its_weights_alone_and_never_steps(optim: OptimConfig) -> None:
    """A base (sflv1) or a holder (sl, sflv2) is copied and summed, never stepped: it holds no gradient and no
    optimizer slots, as the cost model prices a holder (its state, ``H_c,t``). Before, each was counted as a
    client training (adam: four times its weights), so a tier sized to the plan refused the holder, and the
    coordinator fetched the weights instead."""
    trained = _segment(2, 7, optim)
    tier = Tier("edge", idle_release_s=None, max_held_bytes=trained + _weights(2, 7))
    tier.load(SegmentLoad("run", "c0", 0, SPEC, 2, 7, "c0", _state(), secret="c0", optim=optim))
    tier.load(SegmentLoad("run", "@held.0.0", 0, SPEC, 2, 7, "@held.0.0", None, secret="t", optim=optim,
                          base="c0", base_secret="c0"))  # as rounds.SplitRound._keep copies a finished client
    assert tier.held == _held_now(tier) == trained + _weights(2, 7)
    assert tier._bindings[("run", "@held.0.0")].optim is None
    x = torch.zeros(2, *template.boundary(SPEC, 2)[0][1:])
    key = StepKey("run", "@held.0.0", 0, 0, "t")
    with pytest.raises(FailedPrecondition, match="never stepped"):
        tier.step(key, x, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(FailedPrecondition, match="never stepped"):
        tier.forward(key, x)
    with pytest.raises(FailedPrecondition, match="never stepped"):
        tier.backward(key, torch.zeros(2, *template.boundary(SPEC, 7)[0][1:]))
    # its blocks are counted as a base's: a client may not bind to them, nor a base to a client's
    with pytest.raises(FailedPrecondition, match="a coordinator's base segment, which never trains"):
        tier.load(SegmentLoad("run", "c1", 0, SPEC, 2, 7, "@held.0.0", None, secret="t", optim=optim))
    with pytest.raises(FailedPrecondition, match="a client's segment, which trains"):
        tier.load(SegmentLoad("run", "@base.1", 0, SPEC, 2, 7, "c0", None, secret="c0", optim=optim))
    assert tier.held == _held_now(tier) == trained + _weights(2, 7) and tier._reserved == 0
    for c, s in (("c0", "c0"), ("@held.0.0", "t")):
        tier.release("run", c, s)
    assert tier.held == 0 and not tier._replicas


def test_the_bound_on_what_a_tier_holds_comes_from_its_process_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_mod, "current_limits", lambda: BuildLimits(held_bytes=12345))
    assert Tier("edge").max_held_bytes == 12345
    monkeypatch.setattr(tier_mod, "current_limits", lambda: BuildLimits())
    assert 0 < Tier("edge").max_held_bytes < memory_bytes(torch.device("cpu"))
    with pytest.raises(ConfigError, match="held_bytes must be >= 0"):
        BuildLimits(held_bytes=-1)


_ops = st.lists(st.tuples(st.sampled_from(["load", "release"]), st.integers(0, 3),
                          st.sampled_from(["own", "R", "from base", "from a base it may not copy"]),
                          st.integers(0, 6), st.integers(1, 7), st.sampled_from(["sgd", "adam"])),
                min_size=1, max_size=25)


@given(_ops, st.integers(1, 4))
def test_what_a_tier_holds_is_its_segments_and_never_more_than_its_bound(ops, room: int) -> None:  # type: ignore[no-untyped-def]
    """Loads (own replicas and a shared one, copies of a base, refused copies of one, any blocks, optimizers
    with and without slots), re-loads and releases in any order: the tier's count is what its replicas and
    bindings hold, never above its bound, nothing is left reserved between loads (before, a load its base
    refused kept its reservation, until the tier refused every load), and nothing is held once all is
    released."""
    limit = room * _segment(0, 7, OptimConfig("adam")) // 2
    tier = Tier("edge", idle_release_s=None, max_held_bytes=limit)
    glob = initial_state(SPEC, 0)
    try:
        tier.load(SegmentLoad("run", "@base.1", 0, SPEC, 0, 7, "@b", glob, secret="t"))
    except ResourceExhausted:
        pass
    for op, c, how, start, length, opt in ops:
        cid, stop = f"c{c}", min(7, start + length)
        if op == "release":
            tier.release("run", cid, "s")
        else:
            replica = cid if how != "R" else "R"
            state, base = (None, "@b") if how.startswith("from") else (select(glob, start, stop), "")
            try:
                tier.load(SegmentLoad("run", cid, 0, SPEC, start, stop, replica, state, secret="s",
                                      optim=OptimConfig(opt), base=base,
                                      base_secret="t" if how == "from base" else "guess"))
            except (ResourceExhausted, FailedPrecondition, PermissionDenied):
                pass  # over the bound; a re-load into another replica; a base not there, or not to be copied
        assert tier.held == _held_now(tier) <= limit and tier._reserved == 0
    for c in range(4):
        tier.release("run", f"c{c}", "s")
    tier.release("run", "@base.1", "t")
    assert tier.held == 0 and not tier._replicas and not tier._claims


def test_loads_from_one_base_build_their_segments_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The base's lock is held for the copy alone: before, it was held for the whole load (building the
    blocks, checking, the optimizer), so every client of a round waited for the others (SplitFed v1's round
    start). Two loads meet inside the build here; one at a time, they never would (the barrier breaks)."""
    tier = Tier("edge", idle_release_s=None)
    tier.load(SegmentLoad("run", "@base.1", 0, SPEC, 2, 7, "@b", _state(), secret="t"))
    meet = threading.Barrier(2, timeout=10)
    real = template.copy_blocks

    def building(spec, start, stop):  # type: ignore[no-untyped-def]
        meet.wait()
        return real(spec, start, stop)

    monkeypatch.setattr(template, "copy_blocks", building)
    failed = at_once(lambda cid: tier.load(SegmentLoad("run", cid, 0, SPEC, 2, 7, cid, None, secret=cid, base="@b",
                                                       base_secret="t")), ("c0", "c1"))
    assert not failed, failed
    assert all(torch.equal(v, _state()[k]) for c in ("c0", "c1") for k, v in tier.fetch("run", c, c).items())


def test_a_tier_process_takes_its_bound_from_the_command_line() -> None:
    """``splitfed tier --max-held-mb 1``: a load of vgg11's block 4 (a 1.1 MiB convolution, and its gradient) is
    refused over gRPC with RESOURCE_EXHAUSTED, naming the option; the tier keeps serving (a small load after)."""
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.process import TierProcess

    vgg = resolve_spec("vgg11")
    with TierProcess.start("cloud", insecure=True, extra_args=["--max-held-mb", "1"]) as cloud:
        client = GrpcTierClient(cloud.address, insecure=True, retries=0)
        try:
            with pytest.raises(ResourceExhausted, match="--max-held-mb"):
                client.load(SegmentLoad("run", "big", 0, vgg, 4, 5, "big", select(initial_state(vgg, 0), 4, 5),
                                        secret="s"))
            client.load(SegmentLoad("run", "small", 0, SPEC, 6, 7, "small", select(initial_state(SPEC, 0), 6, 7),
                                    secret="s"))
        finally:
            client.close()
