"""One caller cannot stop a tier from serving everyone else through its streams: a top-k frame that would decode
to far more than it sends is refused before anything is allocated, a request stream that drips frames with
next to nothing in them and a reply stream its caller never reads are cancelled (RESOURCE_EXHAUSTED, counted
as refusals), and the tier goes on serving. Real tiers on 127.0.0.1, raw gRPC where a well-behaved client could
not misbehave; short idle times (1-2 s) and generous deadlines: nothing here asserts on speed."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator

import grpc
import pytest
import torch

from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.types import StepKey
from splitfed.errors import ConfigError, InvalidArgument
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import method, pb
from splitfed.transport.server import serve_tier

SPEC = resolve_spec("cnn")  # 7 blocks; the tensor entering block 2 is 16x4x4
BIG = 1 << 20  # raw channels take any reply


def act(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 16, 4, 4, generator=torch.Generator().manual_seed(seed))


def y(batch: int = 4) -> torch.Tensor:
    return torch.arange(batch) % 10


def load_cnn(client: GrpcTierClient, cid: str = "a") -> None:
    (ld,) = tier_loads(RoundConfig("run", 0, SPEC), cid, (2,), initial_state(SPEC, 0))
    client.load(ld)


def describe(address: str) -> pb.TierInfo:
    """A Describe on a channel of its own, 20 s to answer (raises if it does not)."""
    with grpc.insecure_channel(address) as ch:
        raw = ch.unary_unary(method("Describe"))(pb.DescribeRequest(shallow=True).SerializeToString(), timeout=20)
    return pb.TierInfo.FromString(raw)


def ended_with(call: grpc.Future) -> grpc.StatusCode:  # type: ignore[type-arg]
    """How a streaming call ended (its replies read to the end, up to 30 s)."""
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


# ---------------------------------------------------------------- 1. top-k decode amplification


def _topk_frame(numel: int, fraction: float) -> bytes:
    """A step whose two tensors each declare ``numel`` float32 values as top-k but send one (k = 1)."""
    codec = pb.Codec(kind=pb.CODEC_TOPK, topk_fraction=fraction)
    meta = pb.TensorMeta(dtype=pb.DTYPE_FLOAT32, shape=[numel], codec=codec, nbytes=8)
    payload = b"\0" * 4 + b"\0\0\x80\x3f" + b"\0" * 8  # index 0, value 1.0, padding to 16
    return pb.Frame(step=pb.StepHeader(run_id="run", client_id="nobody", phase=pb.PHASE_STEP),
                    tensors=[meta, meta], data=payload * 2).SerializeToString()


@pytest.mark.parametrize("rpc", ["Step", "StepStream"])
def test_a_topk_frame_that_would_decode_to_far_more_than_it_sends_is_refused_before_it_is_built(rpc: str) -> None:
    """101 bytes declared two 512 MiB float32 tensors of one kept value each: the tier allocated and zeroed 1 GiB
    per call (concurrently: N GiB), and only then found that nobody had loaded the client (NOT_FOUND)."""
    frame = _topk_frame((512 << 20) // 4, 1e-9)  # the fraction a frame says is checked like a setting's
    assert len(frame) < 200
    with serve_tier("cloud", insecure=True, max_workers=4, idle_release_s=None) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            if rpc == "Step":
                ch.unary_unary(method("Step"))(frame, timeout=60)
            else:
                list(ch.stream_stream(method("StepStream"))(iter([frame]), timeout=60))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert "top-k fraction must lie in [0.001, 1]" in e.value.details() and "got 1e-09" in e.value.details()
        assert "tensor 0" in e.value.details()
        assert describe(srv.address).name == "cloud"


def test_the_topk_floor_is_kept_by_receivers_and_a_legit_topk_step_still_runs() -> None:
    """F >= 0.001: at the floor a tensor round-trips; below it the codec is refused where it is made, a
    setting in one line (before the run starts, not at its first step) and a frame's with INVALID_ARGUMENT."""
    t = torch.randn(100_000)
    out, n = tc.roundtrip(t, tc.Codec("topk", tc.MIN_TOPK_FRACTION))
    assert n == 100 * 8 and int((out != 0).sum()) == 100
    with pytest.raises(ConfigError, match=r"top-k fraction must lie in \[0\.001, 1\] .*got 0\.0001"):
        tc.Codec.parse("topk:1e-4")
    with pytest.raises(InvalidArgument, match="top-k fraction must lie in"):
        wire.codec_of(pb.Codec(kind=pb.CODEC_TOPK, topk_fraction=1e-9))
    assert int((tc.roundtrip(torch.randn(50), "topk:0.001")[0] != 0).sum()) == 1  # small tensors keep one value

    with serve_tier("cloud", insecure=True, max_workers=4, idle_release_s=None) as srv, \
            GrpcTierClient(srv.address, insecure=True, retries=0, compress="topk:0.01") as c:
        load_cnn(c)
        reply = c.step(StepKey("run", "a", 0, 0), act(), y())
        assert math.isfinite(reply.loss) and reply.grad is not None and reply.grad.shape == act().shape


# ---------------------------------------------------------------- 2. slow-drip request streams


def _drip(stop: threading.Event, data: bytes) -> Iterator[bytes]:
    """A StepStream that declares a 1 MiB activation, then sends ``data`` every 0.2 s (well within any idle
    time): for a minute, or until ``stop``."""
    meta = pb.TensorMeta(dtype=pb.DTYPE_FLOAT32, shape=[1 << 18], nbytes=1 << 20)
    yield pb.Frame(step=pb.StepHeader(run_id="run", client_id="x", phase=pb.PHASE_STEP),
                   tensors=[meta]).SerializeToString()
    for _ in range(300):
        if stop.wait(0.2):
            return
        yield data


@pytest.mark.parametrize("data", [b"", pb.Frame(data=bytes(16)).SerializeToString()], ids=["empty", "16-bytes"])
def test_request_streams_that_drip_frames_are_cancelled_and_the_server_keeps_serving(
        data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Both workers held by streams that send a frame every 0.2 s with nothing (or 16 bytes) in it: before,
    any frame counted as activity, so they held the tier for up to 65,536 frames (Describe timed out)."""
    stop = threading.Event()
    srv = serve_tier("cloud", insecure=True, max_workers=2, stream_idle_s=1.0, idle_release_s=None)
    assert srv.servicer is not None
    ch = grpc.insecure_channel(srv.address)
    calls = []
    try:
        with caplog.at_level(logging.WARNING, logger="splitfed.transport.server"):
            calls = [ch.stream_stream(method("StepStream"))(_drip(stop, data), timeout=90) for _ in range(2)]
            assert describe(srv.address).name == "cloud"  # served only once the drips are cancelled
            codes = [ended_with(c) for c in calls]
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
        assert srv.servicer.idle_streams.cancelled == 2
        assert "2 RESOURCE_EXHAUSTED" in srv.servicer.refusals()
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cancelled ")]
        assert len(said) == 2 and all(s.startswith("cancelled StepStream request stream from ipv4:127.0.0.1:")
                                      and "bytes/s on average" in s for s in said), said
        with GrpcTierClient(srv.address, insecure=True, retries=0) as c:  # and a client's own calls still run
            load_cnn(c)
            assert math.isfinite(c.step(StepKey("run", "a", 0, 0), act(), y()).loss)
    finally:
        stop.set()
        for call in calls:
            call.cancel()
        ch.close()
        srv.stop(0)


def test_a_stream_that_keeps_moving_is_not_cancelled_even_when_it_takes_longer_than_the_idle_time() -> None:
    """The watch is about progress: a step sent in 16 KiB frames, one every 0.3 s (about 53 KiB/s, above the
    floor of 4 KiB/s set here), takes longer than ``stream_idle_s`` in all and is served."""
    with serve_tier("cloud", insecure=True, max_workers=2, stream_idle_s=2.0, stream_min_bytes_s=4096,
                    idle_release_s=None) as srv, \
            GrpcTierClient(srv.address, insecure=True, retries=0) as c, grpc.insecure_channel(srv.address) as ch:
        load_cnn(c)
        head = pb.StepHeader(run_id="run", client_id="a", round=0, seq=0, phase=pb.PHASE_STEP)
        frames = wire.frames(head, [("", tc.encode(act(batch=128))), ("", tc.encode(y(128)))], 16 << 10)
        assert len(frames) >= 9
        gap = threading.Event()

        def slowly() -> Iterator[bytes]:
            for f in frames:
                gap.wait(0.3)
                yield f

        replies = list(ch.stream_stream(method("StepStream"))(slowly(), timeout=120))
        result, items = wire.read_all(replies, wire.F_RESULT, wire.Limits(), what="reply")
        assert isinstance(result, pb.StepResult) and math.isfinite(result.loss) and len(items) == 1
        assert srv.servicer is not None and srv.servicer.idle_streams.cancelled == 0


# ---------------------------------------------------------------- 3. reply streams nobody reads

MLP = ModelSpec("mlp", (64,), 10, kwargs={"hidden": 3072})  # blocks [1, n): ~20 MB, far beyond any window


@pytest.mark.parametrize("rpc", ["Fetch", "Reduce"])
def test_reply_streams_nobody_reads_are_cancelled_and_the_server_keeps_serving(
        rpc: str, caplog: pytest.LogCaptureFixture) -> None:
    """Both workers held by Fetch (or Reduce) calls whose callers never read their ~20 MB reply: the server
    blocked in flow control for as long as the callers liked (Describe and every step timed out)."""
    srv = serve_tier("cloud", insecure=True, max_workers=2, stream_idle_s=1.0, idle_release_s=None)
    assert srv.servicer is not None
    chans = [grpc.insecure_channel(srv.address, options=[("grpc.max_receive_message_length", 64 << 20),
                                                         ("grpc.use_local_subchannel_pool", 1)]) for _ in range(2)]
    calls = []
    c = GrpcTierClient(srv.address, insecure=True, retries=0)
    try:
        (ld,) = tier_loads(RoundConfig("run", 0, MLP), "a", (1,), initial_state(MLP, 0))
        c.load(ld)
        if rpc == "Fetch":
            req = pb.ClientRef(run_id="run", client_id="a").SerializeToString()
        else:
            req = pb.ReduceRequest(run_id="run", items=[pb.ReduceItem(client_id="a", weight=1.0)]).SerializeToString()
        with caplog.at_level(logging.WARNING, logger="splitfed.transport.server"):
            calls = [ch.unary_stream(method(rpc))(req, timeout=90) for ch in chans]  # never read (until below)
            assert describe(srv.address).name == "cloud"  # served only once a worker is freed
            assert math.isfinite(c.step(StepKey("run", "a", 0, 0), torch.randn(4, 64), y()).loss)
            for _ in range(80):  # both are cancelled within a few seconds; 40 s to say so
                if srv.servicer.idle_streams.cancelled == 2:
                    break
                threading.Event().wait(0.5)
            codes = [ended_with(call) for call in calls]
        assert srv.servicer.idle_streams.cancelled == 2
        assert "2 RESOURCE_EXHAUSTED" in srv.servicer.refusals()
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2, codes
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cancelled ")]
        assert len(said) == 2 and all(s.startswith(f"cancelled {rpc} reply from ipv4:127.0.0.1:") for s in said), said
        assert len(c.fetch("run", "a")) == len(ld.state or {})  # a caller that reads gets the whole reply
    finally:
        for call in calls:
            call.cancel()
        c.close()
        for ch in chans:
            ch.close()
        srv.stop(0)
