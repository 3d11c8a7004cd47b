"""The gRPC link against a tier served in this process: same numbers, idempotent retries, deadlines,
and every malformed message refused with its exact status while nothing changes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from splitfed.engine.link import InProcessLink
from splitfed.engine.tier import Tier
from splitfed.engine.types import StepKey
from splitfed.errors import FailedPrecondition, NotFound
from splitfed.transport import codec as tc
from splitfed.transport import compress, wire
from splitfed.transport.client import DEADLINE, GrpcTierClient
from splitfed.transport.errors import DeadlineExceeded, PermissionDenied, RpcFailed
from splitfed.transport.pb import method, pb
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import SPEC, activation, labels, load_client, plain_server, same  # noqa: F401

RAW_LIMIT = 64 << 20


def key(seq: int, cid: str = "a", run: str = "run", round_: int = 0) -> StepKey:
    return StepKey(run, cid, round_, seq)


@pytest.fixture
def served(plain_server: TierServer) -> Iterator[tuple[TierServer, GrpcTierClient]]:  # noqa: F811
    for cid in ("a", "b"):
        load_client(plain_server.tier, cid)
    with GrpcTierClient(plain_server.address, deadline_s=20, retries=0) as c:
        yield plain_server, c


# ---------------------------------------------------------------- same numbers


@pytest.mark.parametrize("codec", ["none", "fp16", "int8", "topk:0.3"])
@pytest.mark.parametrize("chunk", [1 << 20, 100])
def test_grpc_link_gives_the_in_process_numbers(codec: str, chunk: int) -> None:
    limits = wire.Limits(chunk_bytes=chunk, unary_bytes=chunk)  # 100 B: every tensor travels in many frames
    local = Tier("cloud")
    load_client(local, "a")
    link = InProcessLink(local, *compress.get(codec))
    with serve_tier("cloud", insecure=True, limits=limits) as srv, \
            GrpcTierClient(srv.address, compress=codec, limits=limits) as c:
        load_client(c, "a")
        for s in range(3):
            x = activation(seed=s)
            want, got = link.step(key(s), x, labels()), c.step(key(s), x, labels())
            assert want.loss == got.loss and want.correct == got.correct
            assert want.grad is not None and got.grad is not None and torch.equal(want.grad, got.grad)
        assert same(local.fetch("run", "a"), c.fetch("run", "a"))
        assert (link.bytes_up, link.bytes_down) == (c.bytes_up, c.bytes_down)


class FaultyCloud:
    """A next tier whose gradients cannot be applied (a diverged or broken cloud)."""

    name = "cloud"

    def __init__(self, grad: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.grad = grad

    def step(self, key, activation, labels):  # type: ignore[no-untyped-def]
        from splitfed.engine.types import StepReply

        return StepReply(self.grad(activation), 0.5, 1)


@pytest.mark.parametrize("bad, words", [
    (lambda a: torch.full_like(a, float("nan")), "contains NaN or infinite values"),
    (lambda a: torch.zeros(a.shape[0], 3), "got float32 [4, 3], expected float32 [4, "),
])
def test_edge_refuses_a_bad_gradient_from_the_next_tier_and_changes_nothing(  # type: ignore[no-untyped-def]
        bad, words) -> None:
    from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads

    cloud = FaultyCloud(bad)
    with serve_tier("cloud", insecure=True, tier=cloud) as c_srv, \
            serve_tier("edge", next_address=c_srv.address, insecure=True) as e_srv, \
            GrpcTierClient(e_srv.address, retries=0) as device:
        edge_load, _ = tier_loads(RoundConfig("run", 0, SPEC), "a", (2, 3), initial_state(SPEC, 0))
        e_srv.tier.load(edge_load)
        before = e_srv.tier.fetch("run", "a")
        with pytest.raises(RpcFailed) as e:
            device.step(key(0), activation(), labels())
        assert e.value.code == "INTERNAL"
        assert "tier edge: step 0 of a: the next tier's gradient" in str(e.value) and words in str(e.value)
        assert "nothing was applied" in str(e.value)
        assert same(before, e_srv.tier.fetch("run", "a"))
        cloud.grad = torch.ones_like  # the cloud recovers: the same step goes through
        assert device.step(key(0), activation(), labels()).grad is not None
        assert not same(before, e_srv.tier.fetch("run", "a"))


def test_u_shape_halves_over_grpc(plain_server: TierServer) -> None:  # noqa: F811
    from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads

    cfg = RoundConfig("run", 0, SPEC, u_shape=True)
    (load,) = tier_loads(cfg, "u", (2, 6), initial_state(SPEC, 0))
    local = Tier("cloud")
    local.load(load)
    with GrpcTierClient(plain_server.address) as c:
        c.load(load)
        x = activation()
        out_l, out_g = local.forward(key(0, "u"), x), c.forward(key(0, "u"), x)
        assert torch.equal(out_l, out_g)
        g = torch.ones_like(out_l)
        gl, gg = local.backward(key(0, "u"), g), c.backward(key(0, "u"), g)
        assert gl is not None and gg is not None and torch.equal(gl, gg)
        assert same(local.fetch("run", "u"), c.fetch("run", "u"))


# ---------------------------------------------------------------- idempotency and retries


class _Lost(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection lost (injected)"


class LoseFirstReply(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """The first step reaches the tier and is applied; its reply is lost on the way back."""

    def __init__(self) -> None:
        self.lost = 0

    def _maybe_lose(self, call):  # type: ignore[no-untyped-def]
        if self.lost == 0:
            self.lost += 1
            call.result() if hasattr(call, "result") and not hasattr(call, "__iter__") else list(call)
            raise _Lost()
        return call

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return self._maybe_lose(continuation(client_call_details, request))

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return self._maybe_lose(continuation(client_call_details, request_iterator))


@pytest.mark.parametrize("chunk", [1 << 20, 256])  # unary Step, StepStream
def test_a_retried_step_is_applied_once(plain_server: TierServer, chunk: int) -> None:  # noqa: F811
    load_client(plain_server.tier, "a")
    ref = Tier("cloud")
    load_client(ref, "a")
    want = ref.step(key(0), activation(), labels())
    lose = LoseFirstReply()
    with GrpcTierClient(plain_server.address, interceptors=[lose], backoff_s=0.01,
                        limits=wire.Limits(chunk_bytes=chunk, unary_bytes=chunk)) as c:
        got = c.step(key(0), activation(), labels())
        assert lose.lost == 1 and c.retried == 1
        assert got.grad is not None and want.grad is not None and torch.equal(got.grad, want.grad)
        assert same(c.fetch("run", "a"), ref.fetch("run", "a"))  # one step's worth, not two
        again = c.step(key(0), activation(), labels())  # a plain repeat: the cached reply
        assert again.grad is not None and torch.equal(again.grad, want.grad)
        assert same(c.fetch("run", "a"), ref.fetch("run", "a"))
        c.step(key(1), activation(seed=1), labels())
        with pytest.raises(FailedPrecondition, match="stale step 0"):
            c.step(key(0), activation(), labels())


def test_unavailable_tier_gives_a_clear_error_after_bounded_retries() -> None:
    srv = serve_tier("cloud", insecure=True)
    address = srv.address
    srv.stop(0)
    with GrpcTierClient(address, retries=3, backoff_s=0.05, deadline_s=10) as c:
        t0 = time.monotonic()
        with pytest.raises(Exception, match="unavailable after 4 attempt") as e:
            c.step(key(0), activation(), labels())
        assert getattr(e.value, "code", None) == "UNAVAILABLE"
        assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------- deadlines


def test_deadline_exceeded_is_a_clear_error_and_the_tier_keeps_serving(
        served: tuple[TierServer, GrpcTierClient]) -> None:
    srv, c = served
    slow_step = srv.tier.step

    def slow(*a, **k):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        return slow_step(*a, **k)

    srv.tier.step = slow  # type: ignore[method-assign]
    with GrpcTierClient(srv.address, deadline_s=0.2) as hasty:
        with pytest.raises(DeadlineExceeded, match="deadline of 0.2s"):
            hasty.step(key(0, "b"), activation(), labels())
    srv.tier.step = slow_step  # type: ignore[method-assign]
    assert c.step(key(0), activation(), labels()).grad is not None


def test_a_forwarding_tier_never_waits_longer_than_its_caller() -> None:
    c = GrpcTierClient("127.0.0.1:1", deadline_s=60)
    token = DEADLINE.set(time.monotonic() + 2.0)
    try:
        assert 1.5 < c._budget() < 2.0
    finally:
        DEADLINE.reset(token)
        c.close()


# ---------------------------------------------------------------- malformed messages


def step_frames(seq: int = 0, cid: str = "a", run: str = "run", x: torch.Tensor | None = None,
                y: torch.Tensor | None = None, phase: int = pb.PHASE_STEP, **head: object) -> list[bytes]:
    h = pb.StepHeader(run_id=run, client_id=cid, round=0, seq=seq, phase=phase, **head)  # type: ignore[arg-type]
    x = activation() if x is None else x
    y = labels() if y is None else y
    return wire.frames(h, [("", tc.encode(x)), ("", tc.encode(y))], 1 << 20)


def meta_frame(**meta: object) -> bytes:
    return pb.Frame(step=pb.StepHeader(run_id="run", client_id="a", phase=pb.PHASE_STEP),
                    tensors=[pb.TensorMeta(**meta)]).SerializeToString()  # type: ignore[arg-type]


def raw_step(address: str, frames: list[bytes], unary: bool = False) -> tuple[grpc.StatusCode, str]:
    """Send frames as they are (StepStream, or Step when ``unary``); the status that comes back."""
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", RAW_LIMIT),
                                                 ("grpc.max_receive_message_length", RAW_LIMIT)]) as ch:
        try:
            if unary:
                ch.unary_unary(method("Step"))(frames[0] if frames else b"", timeout=20)
            else:
                list(ch.stream_stream(method("StepStream"))(iter(frames), timeout=20))
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


NAN = activation().index_fill(0, torch.tensor([1]), float("nan"))
CASES: dict[str, tuple[Callable[[], list[bytes]], grpc.StatusCode, str]] = {
    "unknown client": (lambda: step_frames(cid="zz"), grpc.StatusCode.NOT_FOUND, "no segment loaded for client 'zz'"),
    "unknown run": (lambda: step_frames(run="other"), grpc.StatusCode.NOT_FOUND, "run 'other'"),
    "wrong shape": (lambda: step_frames(x=torch.randn(4, 16, 4, 5)), grpc.StatusCode.INVALID_ARGUMENT, "shape"),
    "wrong dtype": (lambda: step_frames(x=activation().double()), grpc.StatusCode.INVALID_ARGUMENT, "dtype float64"),
    "length != shape x dtype": (lambda: [meta_frame(dtype=1, shape=[4, 16, 4, 4], nbytes=1000)],
                                grpc.StatusCode.INVALID_ARGUMENT, "payload is 1000 bytes"),
    "short payload": (lambda: [step_frames()[0][:-10]], grpc.StatusCode.INVALID_ARGUMENT, "past the end"),
    "non-finite": (lambda: step_frames(x=NAN), grpc.StatusCode.INVALID_ARGUMENT, "NaN"),
    "labels out of range": (lambda: step_frames(y=labels() + 10), grpc.StatusCode.INVALID_ARGUMENT, "labels"),
    "out-of-order seq": (lambda: step_frames(seq=5), grpc.StatusCode.FAILED_PRECONDITION, "out-of-order step 5"),
    "wrong round": (lambda: wire.frames(pb.StepHeader(run_id="run", client_id="a", round=3, phase=1),
                                        [("", tc.encode(activation())), ("", tc.encode(labels()))], 1 << 20),
                    grpc.StatusCode.FAILED_PRECONDITION, "round"),
    "declared too large": (lambda: [meta_frame(dtype=1, shape=[1 << 30], nbytes=4 << 30)],
                           grpc.StatusCode.RESOURCE_EXHAUSTED, "exceed the limit"),
    "message too large": (lambda: [step_frames()[0] + pb.Frame(pad=bytes(wire.Limits().max_message_bytes)).SerializeToString()],
                          grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
    "garbage": (lambda: [b"\xff\x00\x13garbage"], grpc.StatusCode.INVALID_ARGUMENT, "malformed"),
    "no header": (lambda: wire.frames(None, [("", tc.encode(activation()))], 1 << 20),
                  grpc.StatusCode.INVALID_ARGUMENT, "no header"),
    "no frames": (lambda: [], grpc.StatusCode.INVALID_ARGUMENT, "no header"),
    "one tensor for STEP": (lambda: wire.frames(pb.StepHeader(run_id="run", client_id="a", phase=1),
                                                [("", tc.encode(activation()))], 1 << 20),
                            grpc.StatusCode.INVALID_ARGUMENT, "carries 2 tensor"),
    "unknown phase": (lambda: step_frames(phase=9), grpc.StatusCode.INVALID_ARGUMENT, "phase"),
    "bad reply codec": (lambda: step_frames(reply_codec=pb.Codec(kind=3, topk_fraction=-1)),
                        grpc.StatusCode.INVALID_ARGUMENT, "fraction"),
    "backward without forward": (lambda: wire.frames(
        pb.StepHeader(run_id="run", client_id="a", phase=pb.PHASE_BACKWARD), [("", tc.encode(torch.ones(4, 10)))],
        1 << 20), grpc.StatusCode.FAILED_PRECONDITION, "without its forward"),
    "empty client id": (lambda: step_frames(cid=""), grpc.StatusCode.INVALID_ARGUMENT, "client_id"),
}


@pytest.mark.parametrize("unary", [False, True], ids=["StepStream", "Step"])
@pytest.mark.parametrize("case", list(CASES))
def test_malformed_step_is_refused_with_its_status_and_changes_nothing(
        served: tuple[TierServer, GrpcTierClient], case: str, unary: bool) -> None:
    srv, c = served
    make, code, match = CASES[case]
    frames = make()
    if unary and len(frames) > 1:
        pytest.skip("more than one message")
    if unary and case == "backward without forward":
        code, match = grpc.StatusCode.INVALID_ARGUMENT, "use StepStream"
    if unary and case == "no frames":
        match = "no header"
    before = c.fetch("run", "a")
    got, details = raw_step(srv.address, frames, unary)
    assert got == code, details
    assert match in details
    assert same(c.fetch("run", "a"), before)
    # the tier keeps serving everyone, the refused client included
    assert c.step(key(0, "b"), activation(), labels()).grad is not None
    assert c.step(key(0, "a"), activation(), labels()).grad is not None


def test_unary_step_refuses_a_reply_too_large_for_one_message_before_acting(
        served: tuple[TierServer, GrpcTierClient]) -> None:
    srv, c = served
    small = wire.Limits(chunk_bytes=2048, unary_bytes=2048)

    with serve_tier("cloud", insecure=True, limits=small) as tiny:
        load_client(tiny.tier, "a")
        before = tiny.tier.fetch("run", "a")
        # an int8 activation fits one message, but a float32 gradient asked for in reply would not
        h = pb.StepHeader(run_id="run", client_id="a", phase=pb.PHASE_STEP)
        frames = wire.frames(h, [("", tc.encode(activation(), "int8")), ("", tc.encode(labels()))], 2048)
        assert len(frames) == 1
        code, details = raw_step(tiny.address, frames, unary=True)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "StepStream" in details
        assert same(tiny.tier.fetch("run", "a"), before)
        with GrpcTierClient(tiny.address, limits=small, compress="int8") as ic:  # the client picks the stream
            assert ic.step(key(0), activation(), labels()).grad is not None


def test_stale_seq_is_refused(served: tuple[TierServer, GrpcTierClient]) -> None:
    srv, c = served
    c.step(key(0), activation(), labels())
    c.step(key(1), activation(seed=1), labels())
    before = c.fetch("run", "a")
    code, details = raw_step(srv.address, step_frames(seq=0))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale step 0" in details
    assert same(c.fetch("run", "a"), before)


def test_control_calls_are_checked(served: tuple[TierServer, GrpcTierClient]) -> None:
    srv, c = served
    from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
    from splitfed.models.zoo import resolve_spec

    with pytest.raises(NotFound):
        c.fetch("run", "nobody")
    user = resolve_spec("tests.models_for_tests:small_sequential", input_shape=(6,), num_classes=3)
    (load,) = tier_loads(RoundConfig("run", 0, user), "u", (1,), initial_state(user, 0))
    with pytest.raises(PermissionDenied, match="does not serve model"):
        c.load(load)
    with serve_tier("cloud", insecure=True, allowed_models=[user.name]) as open_srv, \
            GrpcTierClient(open_srv.address) as oc:
        oc.load(load)
        assert oc.fetch("run", "u").keys() == load.state.keys()  # type: ignore[union-attr]
    (bad,) = tier_loads(RoundConfig("run", 0, SPEC), "a", (2,), initial_state(SPEC, 0))
    bad.state = {k: v.double() for k, v in bad.state.items()}  # type: ignore[union-attr]
    before = c.fetch("run", "a")
    with pytest.raises(Exception, match="does not match") as e:
        c.load(bad)
    assert getattr(e.value, "code", "") == "INVALID_ARGUMENT"
    assert same(c.fetch("run", "a"), before)
    with grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(method("Release"))(b"\xff\xff", timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    c.release("run", "a")
    with pytest.raises(NotFound):
        c.fetch("run", "a")


def test_health_is_served(plain_server: TierServer) -> None:  # noqa: F811
    with GrpcTierClient(plain_server.address) as c:
        assert c.health()
