"""A tier under abuse: refused calls change nothing (locks included), concurrent loads share their replica, a
model too large or malformed is refused before it is built, Describe always answers and keeps nothing, and
request streams that go quiet do not take the server's threads for good."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import torch

import splitfed.engine.tier as tier_mod
from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, select, tier_loads
from splitfed.engine.tier import Tier
from splitfed.engine.types import SegmentLoad, StepKey
from splitfed.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    TierError,
    Unavailable,
)
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import method, pb
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import at_once, plain_server  # noqa: F401

SPEC = resolve_spec("cnn")  # 7 blocks; the tensor entering block 2 is 16x4x4


def act(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 16, 4, 4, generator=torch.Generator().manual_seed(seed))


def y(batch: int = 4) -> torch.Tensor:
    return torch.arange(batch) % 10


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def seg(cid: str, start: int, stop: int, *, replica: str | None = None, loss_here: bool = True,
        round_: int = 0) -> SegmentLoad:
    return SegmentLoad("run", cid, round_, SPEC, start, stop, replica or cid,
                       select(initial_state(SPEC, 0), start, stop), loss_here=loss_here)


# ---------------------------------------------------------------- 1. U-shape: a refused forward keeps the lock


def test_a_refused_ushape_forward_keeps_the_pending_forward_and_its_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_mod, "SHARED_WAIT_S", 0.3)
    t = Tier("edge", idle_release_s=None)
    for cid in ("u0", "u1"):  # U-shape: blocks [2, 5) of one shared replica, the output goes back to the device
        t.load(seg(cid, 2, 5, replica="shared"))
    k0 = StepKey("run", "u0", 0, 0)
    out = t.forward(k0, act())
    for bad in (StepKey("run", "u0", 0, 1), StepKey("run", "u0", 5, 0), StepKey("run", "u0", 5, 1)):
        with pytest.raises(FailedPrecondition):
            t.forward(bad, act())
    assert t.forward(k0, act()) is out  # the retry of the pending forward still gets its reply
    with pytest.raises(Unavailable):  # the other client of the replica still waits for u0's backward
        t.forward(StepKey("run", "u1", 0, 0), act())
    with pytest.raises(FailedPrecondition):
        t.backward(StepKey("run", "u0", 5, 0), torch.ones_like(out))  # another round's backward
    gx = t.backward(k0, torch.ones_like(out) * 1e-3)  # the legit backward of the pending forward
    assert gx is not None and gx.shape == act().shape
    t.forward(StepKey("run", "u0", 0, 1), act(seed=1))  # and the client goes on
    t.backward(StepKey("run", "u0", 0, 1), torch.ones_like(out) * 1e-3)
    t.forward(StepKey("run", "u1", 0, 0), act())  # the replica is free again


def test_a_malformed_ushape_forward_does_not_wait_for_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    # u0's forward holds the shared replica's lock; a waiter would give up at once and say UNAVAILABLE (busy)
    monkeypatch.setattr(tier_mod, "SHARED_WAIT_S", 0.0)
    t = Tier("edge", idle_release_s=None)
    for cid in ("u0", "u1"):
        t.load(seg(cid, 2, 5, replica="shared"))
    t.forward(StepKey("run", "u0", 0, 0), act())
    with pytest.raises(InvalidArgument):  # checked before the lock: refused for what it is, not for waiting
        t.forward(StepKey("run", "u1", 0, 0), torch.randn(4, 3))


# ---------------------------------------------------------------- 2. concurrent loads of one shared replica


def test_concurrent_loads_of_one_replica_bind_to_the_same_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    copy_blocks = template.copy_blocks

    def slow(*a, **k):  # type: ignore[no-untyped-def]
        time.sleep(0.3)  # both loads are in flight at once
        return copy_blocks(*a, **k)

    monkeypatch.setattr(template, "copy_blocks", slow)
    t = Tier("cloud", idle_release_s=None)
    bar = threading.Barrier(2)

    def go(cid: str) -> None:
        bar.wait()
        t.load(seg(cid, 2, 7, replica="shared"))

    assert not at_once(go, ("a", "b"))
    before = t.fetch("run", "b")
    t.step(StepKey("run", "a", 0, 0), act(), y())
    assert not same(before, t.fetch("run", "b"))  # b sees a's step: one replica
    assert len(t._replicas) == 1


def test_a_failed_first_load_leaves_no_replica_behind() -> None:
    t = Tier("cloud", idle_release_s=None)
    bad = seg("a", 2, 7, replica="shared")
    bad = SegmentLoad(**{**bad.__dict__, "state": None})  # a new replica needs its weights
    with pytest.raises(FailedPrecondition):
        t.load(bad)
    assert t._replicas == {} and t.clients() == 0


# ---------------------------------------------------------------- 3. a loss where there are no logits


def test_a_step_that_would_compute_the_loss_on_a_segment_that_does_not_end_the_model_is_refused() -> None:
    t = Tier("cloud", idle_release_s=None)
    t.load(seg("a", 2, 4))  # ends the chain (U-shape: the device holds the tail) but not the model
    before = t.fetch("run", "a")
    with pytest.raises(FailedPrecondition, match="ends the chain but not the model"):
        t.step(StepKey("run", "a", 0, 0), act(), y())
    assert same(before, t.fetch("run", "a")) and t.steps_served == 0
    out = t.forward(StepKey("run", "a", 0, 0), act())  # what such a segment is for
    t.backward(StepKey("run", "a", 0, 0), torch.ones_like(out))


def test_a_load_for_a_negative_round_is_refused() -> None:
    t = Tier("cloud", idle_release_s=None)
    with pytest.raises(InvalidArgument, match="round"):
        t.load(seg("a", 2, 7, round_=-1))
    assert t.clients() == 0


# ---------------------------------------------------------------- 4. vocab: sized before it is built


def test_a_token_model_with_a_huge_vocab_is_refused_before_it_is_built() -> None:
    with pytest.raises(ResourceExhausted, match="MiB of parameters"):
        template.admit(ModelSpec("transformer", (64,), 10, vocab=40_000_000))
    for vocab in (-1, 1, 2**40):
        with pytest.raises(InvalidArgument, match="vocab"):
            wire.model_of(pb.ModelSpec(name="transformer", input_shape=[64], num_classes=10, vocab=vocab))
    template.admit(resolve_spec("transformer"))  # the zoo's own is admitted


@pytest.mark.parametrize("classes", [0, -3, 10**7])
def test_a_class_count_no_label_could_fit_is_refused_with_the_model(classes: int) -> None:
    """Before, cnn with num_classes=0 loaded, and then every step was refused: no label lies in 0..-1."""
    with pytest.raises(InvalidArgument, match=r"num_classes must be in 1\.\.1,000,000"):
        wire.model_of(pb.ModelSpec(name="cnn", input_shape=[1, 8, 8], num_classes=classes))
    assert wire.model_of(pb.ModelSpec(name="cnn", input_shape=[1, 8, 8], num_classes=10)).num_classes == 10


# ---------------------------------------------------------------- servers


def _describe_raw(address: str, **model: object) -> pb.TierInfo:
    with grpc.insecure_channel(address) as ch:
        req = pb.DescribeRequest(model=pb.ModelSpec(**model), shallow=True)  # type: ignore[arg-type]
        return pb.TierInfo.FromString(ch.unary_unary(method("Describe"))(req.SerializeToString(), timeout=30))


def _load_raw(address: str, **model: object) -> grpc.StatusCode:
    h = pb.LoadHeader(run_id="X", client_id="x", round=0, model=pb.ModelSpec(**model),  # type: ignore[arg-type]
                      start=0, stop=1, replica="x", optim=pb.OptimConfig(name="sgd", lr=0.1), has_state=False)
    with grpc.insecure_channel(address) as ch:
        try:
            ch.stream_unary(method("Load"))(iter(wire.frames(h, [], 1 << 20)), timeout=30)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


# ---------------------------------------------------------------- 5. deep or long kwargs


@pytest.mark.parametrize("kwargs_json", [
    "[" * 200_000 + "]" * 200_000,
    '{"a":' * 20_000 + "1" + "}" * 20_000,
    '{"a":' * 40 + "1" + "}" * 40,
    '{"x": "' + "x" * 100_000 + '"}',
], ids=["deep-list", "deep-object", "nested-40", "long-string"])  # short ids: a value is up to 400 KB
def test_deep_or_long_kwargs_are_invalid_argument(plain_server, kwargs_json: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    model = dict(name="mlp", input_shape=[64], num_classes=10, kwargs_json=kwargs_json)
    assert _load_raw(plain_server.address, **model) == grpc.StatusCode.INVALID_ARGUMENT
    assert _describe_raw(plain_server.address, **model).model_error.startswith("INVALID_ARGUMENT: model: kwargs")
    assert plain_server.servicer.refusals().count("INTERNAL") == 0


# ---------------------------------------------------------------- 6. Describe answers


@pytest.mark.parametrize("model", [
    dict(name="mlp", input_shape=[64], num_classes=10, kwargs_json='{"nope": 1}'),
    dict(name="cnn", input_shape=[1, 2], num_classes=10),
    dict(name="transformer", input_shape=[64], num_classes=10, vocab=40_000_000),
])
def test_describe_answers_a_model_that_does_not_build_with_its_error(plain_server, model) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    info = _describe_raw(plain_server.address, **model)
    assert info.model_error.startswith("INVALID_ARGUMENT: "), info.model_error
    assert _load_raw(plain_server.address, **model) == grpc.StatusCode.INVALID_ARGUMENT


# ---------------------------------------------------------------- 8. Describe keeps no model


def test_describe_sizes_a_model_without_keeping_it(plain_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    client = GrpcTierClient(plain_server.address, insecure=True, retries=0)
    try:
        spec = ModelSpec("mlp", (64,), 10, kwargs={"hidden": 4321})
        assert client.describe(spec).model_error == ""
        assert template._key(spec) not in template._templates  # sized on meta: nothing built, nothing kept
        too_big = ModelSpec("mlp", (64,), 10, kwargs={"hidden": 1 << 22})
        assert client.describe(too_big).model_error.startswith("RESOURCE_EXHAUSTED: ")
    finally:
        client.close()


def test_the_template_cache_holds_a_bounded_number_of_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template, "TEMPLATE_CACHE_BYTES", 3 << 20)  # ~one of the models below
    specs = [ModelSpec("mlp", (64,), 10, kwargs={"hidden": 1000 + i}) for i in range(3)]
    for s in specs:
        assert len(template.template(s)) > 0
    held = [k for k in template._templates if k in {template._key(s) for s in specs}]
    assert held and held[-1] == template._key(specs[-1]) and len(held) < len(specs)
    assert len(template.template(specs[0])) > 0  # one let go of is built again when asked for


# ---------------------------------------------------------------- 7. quiet request streams


def test_quiet_request_streams_are_cancelled_and_the_server_keeps_serving() -> None:
    srv = serve_tier("cloud", insecure=True, max_workers=2, stream_idle_s=1.0)
    stop = threading.Event()
    ch = grpc.insecure_channel(srv.address)
    client = GrpcTierClient(srv.address, insecure=True, retries=0)
    try:
        def quiet() -> Iterator[bytes]:
            yield pb.Frame(step=pb.StepHeader(run_id="S", client_id="s", phase=pb.PHASE_STEP)).SerializeToString()
            stop.wait(30)

        calls = [ch.stream_stream(method("StepStream"))(quiet(), timeout=30) for _ in range(2)]
        # both workers are held by the quiet streams: only their cancellation (after 1 s) lets this be served
        # within its deadline
        assert client.describe(deadline_s=10).name == "cloud"
        for c in calls:
            with pytest.raises(grpc.RpcError):
                list(c)
        # a client's own streams (a U-shape forward and backward go as StepStream, a load always) still work
        (ld,) = tier_loads(RoundConfig("run", 0, SPEC, u_shape=True), "c", (2, 5), initial_state(SPEC, 0))
        client.load(ld)
        out = client.forward(StepKey("run", "c", 0, 0), act())
        assert client.backward(StepKey("run", "c", 0, 0), torch.ones_like(out)) is not None
    finally:
        stop.set()
        client.close()
        ch.close()
        srv.stop(0)


def test_a_step_with_a_bad_round_after_a_forward_is_refused_over_grpc(plain_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    client = GrpcTierClient(plain_server.address, insecure=True, retries=0)
    try:
        (ld,) = tier_loads(RoundConfig("ru", 0, SPEC, u_shape=True), "c", (2, 5), initial_state(SPEC, 0))
        client.load(ld)
        out = client.forward(StepKey("ru", "c", 0, 0), act())
        with pytest.raises(TierError) as e:
            client.forward(StepKey("ru", "c", 0, 1), act())
        assert e.value.code == "FAILED_PRECONDITION"
        assert client.backward(StepKey("ru", "c", 0, 0), torch.ones_like(out)) is not None
        client.release("ru", "c")
    finally:
        client.close()


def test_a_tier_process_takes_its_stream_idle_time_from_the_command_line() -> None:
    """``splitfed tier --stream-idle-s 1``: a quiet stream is cancelled after about a second (the default, 30 s,
    suits slow links; before, the time could not be set from the command line)."""
    from splitfed.transport.process import TierProcess

    with TierProcess.start("cloud", insecure=True, extra_args=["--stream-idle-s", "1"]) as cloud:
        stop = threading.Event()
        with grpc.insecure_channel(cloud.address) as ch:
            def quiet() -> Iterator[bytes]:
                yield pb.Frame(step=pb.StepHeader(run_id="S", client_id="s", phase=pb.PHASE_STEP)).SerializeToString()
                stop.wait(30)

            with pytest.raises(grpc.RpcError) as e:  # the default (30 s) would let it run into its deadline
                list(ch.stream_stream(method("StepStream"))(quiet(), timeout=20))
            stop.set()
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
