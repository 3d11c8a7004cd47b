"""Property-based fuzzing of the Step RPC over real gRPC: random bytes, shapes, dtypes, codecs, sequence
numbers. The server never crashes or answers INTERNAL, and a refused call changes no state."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from splitfed.engine.types import StepKey
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import method, pb
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import activation, labels, load_client, same

LIMITS = wire.Limits(chunk_bytes=4096, unary_bytes=4096, max_tensor_bytes=1 << 20, max_call_bytes=2 << 20)
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[tuple[TierServer, GrpcTierClient, grpc.Channel]]:
    srv = serve_tier("cloud", insecure=True, limits=LIMITS, max_workers=4)
    load_client(srv.tier, "a")
    load_client(srv.tier, "b")
    opts = [("grpc.max_send_message_length", 1 << 20), ("grpc.max_receive_message_length", 1 << 20)]
    with GrpcTierClient(srv.address, limits=LIMITS, retries=0) as c, \
            grpc.insecure_channel(srv.address, options=opts) as ch:
        yield srv, c, ch
    srv.stop(0)



ACTIVATIONS = [activation(), activation(2, 1), activation().double(), activation()[:, :3], activation().half(),
               activation().index_fill(0, torch.tensor([0]), float("inf")), torch.zeros(0, 16, 4, 4), labels()]
LABELS = [labels(), labels(2), labels() + 10, labels() - 20, labels().float(), labels().int(), activation()]


@st.composite
def encoded(draw: st.DrawFn, choices: list[torch.Tensor]) -> list[bytes]:
    """A well-formed tensor (perhaps of the wrong kind, perhaps compressed, perhaps not finite)."""
    t = draw(st.sampled_from(choices))
    codec = draw(st.sampled_from(["none", "none", "fp16", "int8", "topk:0.5"]))
    return wire.frames(None, [("", tc.encode(t, codec))], draw(st.sampled_from([7, 4096])))


@st.composite
def garbled(draw: st.DrawFn) -> list[bytes]:
    """A tensor's meta and payload with every part possibly wrong."""
    meta = pb.TensorMeta(dtype=draw(st.integers(-1, 12)),
                         shape=draw(st.lists(st.integers(-3, 70), max_size=5)),
                         codec=pb.Codec(kind=draw(st.integers(0, 5)),
                                        topk_fraction=draw(st.floats(allow_nan=True, allow_infinity=True))),
                         nbytes=draw(st.integers(-5, 1 << 21)))
    frames = [pb.Frame(tensors=[meta], data=draw(st.binary(max_size=2048))).SerializeToString()]
    frames += draw(st.lists(st.binary(max_size=64).map(lambda b: pb.Frame(data=b).SerializeToString()), max_size=3))
    return frames


@st.composite
def step_calls(draw: st.DrawFn) -> list[bytes]:
    kind = draw(st.integers(0, 9))
    if kind == 0:  # bytes that need not parse at all
        return draw(st.lists(st.binary(max_size=200), max_size=4))
    head = pb.StepHeader(
        run_id=draw(st.sampled_from(["run", "run", "other", ""])),
        client_id=draw(st.sampled_from(["a", "a", "a", "zz", "x" * 300])),
        round=draw(st.sampled_from([0, 0, 0, 1, -1])),
        seq=draw(st.integers(-1, 4)),
        # FORWARD is left out: a well-formed one legitimately holds the replica until its BACKWARD
        phase=draw(st.sampled_from([pb.PHASE_STEP] * 4 + [pb.PHASE_BACKWARD, pb.PHASE_UNSPECIFIED, 7])),
        reply_codec=pb.Codec(kind=draw(st.sampled_from([0, 0, 1, 2, 3, 4])), topk_fraction=draw(st.floats(-1, 2))),
    )
    frames = [pb.Frame(step=head).SerializeToString()]
    if kind <= 3:  # anything
        for _ in range(draw(st.integers(0, 3))):
            frames += draw(st.one_of(garbled(), encoded(ACTIVATIONS), encoded(LABELS)))
    else:  # an activation and labels, as a device sends them
        frames += draw(encoded(ACTIVATIONS)) + draw(encoded(LABELS))
    if draw(st.booleans()) and len(frames) > 1:  # header and first tensor in one frame, as the client sends
        frames[:2] = [frames[0] + frames[1]]
    return frames


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          deadline=None)
@given(frames=step_calls(), unary=st.booleans())
def test_step_rpc_fuzz(fuzzed: tuple[TierServer, GrpcTierClient, grpc.Channel], frames: list[bytes],
                       unary: bool) -> None:
    srv, c, ch = fuzzed
    before = c.fetch("run", "a")
    try:
        if unary:  # Step takes one message: the first frame, or all frames glued into one
            ch.unary_unary(method("Step"))(b"".join(frames), timeout=20)
        else:
            list(ch.stream_stream(method("StepStream"))(iter(frames), timeout=20))
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
        assert code in REFUSALS, (code, e.details())
    event(code.name)
    if code != grpc.StatusCode.OK:
        assert same(c.fetch("run", "a"), before)


def test_server_survived_the_fuzzing(fuzzed: tuple[TierServer, GrpcTierClient, grpc.Channel]) -> None:
    srv, c, _ = fuzzed
    assert c.health()
    assert c.step(StepKey("run", "b", 0, 0), activation(), labels()).grad is not None
