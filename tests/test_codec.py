"""The one tensor codec and the frame format: exact, in place, checked, and the .proto's wire format."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from splitfed.engine.link import InProcessLink
from splitfed.engine.tier import Tier
from splitfed.engine.types import StepKey
from splitfed.errors import ConfigError, InvalidArgument, ResourceExhausted
from splitfed.transport import codec as tc
from splitfed.transport import compress, wire
from splitfed.transport.pb import pb
from tests.transport_fixtures import activation, labels, load_client

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


def test_dtype_and_codec_enums_agree_with_the_proto() -> None:
    for code, dtype in tc.DTYPES.items():
        assert pb.DType.Name(code) == "DTYPE_" + str(dtype).removeprefix("torch.").upper()
    for name, code in tc.KINDS.items():
        assert pb.CodecKind.Name(code) == f"CODEC_{name.upper()}"
    assert set(pb.DType.values()) - {0} == set(tc.DTYPES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 5), (1, 0, 4)])
def test_exact_round_trip_through_frames(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = _tensor(dtype, shape)
    for chunk in (7, 1 << 20):  # many chunks, and one
        frames = wire.frames(None, [("x", tc.encode(t))], chunk)
        _, (got,) = wire.read_all(frames, None, wire.Limits())
        assert got.tensor.dtype == dtype and got.tensor.shape == t.shape
        assert torch.equal(got.tensor, t)
        assert got.nbytes == t.numel() * t.element_size()


def test_one_copy_on_send_none_on_receive() -> None:
    t = torch.randn(64, 128)
    e = tc.encode(t)
    assert e.payload.obj is not None and torch.frombuffer(e.payload, dtype=torch.uint8).data_ptr() == t.data_ptr()
    (frame,) = wire.frames(pb.StepResult(loss=1.0), [("", e)], 1 << 20)
    r = wire.Reader(wire.F_RESULT, wire.Limits())
    r.feed(frame)
    _, (got,) = r.finish()
    base = torch.frombuffer(frame, dtype=torch.uint8).data_ptr()
    assert base <= got.tensor.data_ptr() < base + len(frame)  # decoded in place
    assert got.tensor.data_ptr() % wire.ALIGN == 0
    assert torch.equal(got.tensor, t)


def test_writable_decode_copies_out_of_the_message() -> None:
    t = torch.randn(10)
    (frame,) = wire.frames(None, [("w", tc.encode(t))], 1 << 20)
    _, (got,) = wire.read_all([frame], None, wire.Limits(), writable=True)
    got.tensor.add_(1)  # must not write into the immutable message
    _, (again,) = wire.read_all([frame], None, wire.Limits())
    assert torch.equal(again.tensor, t)


def test_misaligned_payload_from_other_encoders_is_copied() -> None:
    t = torch.randn(5, dtype=torch.float64)
    msg = pb.Frame(tensors=[pb.TensorMeta(dtype=4, shape=[5], nbytes=40)], data=t.numpy().tobytes() + bytes(8))
    for k in range(8):  # an unknown field of 3 + k bytes first shifts the payload to every offset
        raw = b"\xaa\x01" + bytes([k]) + bytes(k) + msg.SerializeToString()
        _, (got,) = wire.read_all([raw], None, wire.Limits())
        assert torch.equal(got.tensor, t)


@given(st.data())
def test_frames_are_protobuf_frames_both_ways(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(DTYPES))
    shape = tuple(data.draw(st.lists(st.integers(0, 5), max_size=3)))
    t = _tensor(dtype, shape, data.draw(st.integers(0, 100)))
    head = pb.StepHeader(run_id=data.draw(st.text(max_size=8)), client_id="c", round=data.draw(st.integers(0, 9)),
                         seq=data.draw(st.integers(0, 2**40)), phase=pb.PHASE_STEP)
    chunk = data.draw(st.integers(1, 64))
    frames = wire.frames(head, [("n", tc.encode(t))], chunk)
    # ours -> generated parser
    parsed = [pb.Frame.FromString(f) for f in frames]
    assert parsed[0].step == head
    raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    assert b"".join(p.data for p in parsed) == raw + bytes(-len(raw) % 16)  # payload, zero-padded to 16
    # generated serializer -> ours
    regen = [p.SerializeToString() for p in parsed]
    h, (got,) = wire.read_all(regen, wire.F_STEP, wire.Limits())
    assert h == head and torch.equal(got.tensor, t)


@pytest.mark.parametrize("name,tol", [("fp16", 1e-2), ("int8", 0.05), ("topk:1", 0.0)])
def test_lossy_codecs_are_close(name: str, tol: float) -> None:
    t = torch.randn(1000)
    out, n = compress.get(name)[0](t)  # type: ignore[misc]
    assert out.dtype == t.dtype and out.shape == t.shape
    assert float((out - t).abs().max()) <= tol * float(t.abs().max())
    assert n < t.numel() * 4 or name.startswith("topk")


def test_topk_keeps_the_largest() -> None:
    t = torch.tensor([0.1, -5.0, 0.2, 3.0, -0.05, 0.0, 1.0, 0.3])
    out, n = tc.roundtrip(t, "topk:0.25")
    assert torch.equal(out, torch.tensor([0, -5.0, 0, 3.0, 0, 0, 0, 0]))
    assert n == 2 * (4 + 4)


def test_codecs_never_touch_integer_tensors() -> None:
    y = labels(8)
    e = tc.encode(y, "int8")
    assert e.codec == tc.NONE and e.nbytes == 64


@given(values=st.lists(st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), st.sampled_from([float("nan"), float("inf"),
                                                                                     float("-inf")])),
                       min_size=1, max_size=64),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
def test_fp16_saturates_finite_values_and_keeps_nonfinite_ones(values: list[float], dtype: torch.dtype) -> None:
    """A finite activation beyond +-65504 arrives as +-65504, not as infinity (which the next tier would
    refuse as a diverged tensor); a real NaN or infinity still arrives as one, and is refused."""
    t = torch.tensor(values, dtype=torch.float32).to(dtype)
    out, n = tc.roundtrip(t, "fp16")
    assert n == 2 * t.numel() and out.dtype == dtype
    finite = torch.isfinite(t)
    assert torch.equal(torch.isfinite(out), finite)
    want = t[finite].float().clamp(-65504, 65504).to(torch.float16).to(dtype)
    assert torch.equal(out[finite], want)
    assert torch.equal(torch.isnan(out), torch.isnan(t))


def test_a_tier_accepts_large_finite_activations_over_fp16() -> None:
    t = Tier("cloud")
    load_client(t, "c0")
    link = InProcessLink(t, *compress.get("fp16"))
    big = activation() * 1e5  # finite, beyond float16's range
    reply = link.step(StepKey("run", "c0", 0, 0), big, labels())
    assert reply.grad is not None and bool(torch.isfinite(reply.grad).all())


def test_nonfinite_survives_int8_as_nonfinite() -> None:
    t = torch.tensor([1.0, float("nan"), 2.0])
    out, _ = tc.roundtrip(t, "int8")
    assert not bool(torch.isfinite(out).all())


@pytest.mark.parametrize("name", ["zip", "topk", "topk:0", "topk:2", "fp16:3", "topk:x"])
def test_bad_codec_names(name: str) -> None:
    with pytest.raises(ConfigError):
        compress.get(name)


def test_compress_is_what_a_link_applies() -> None:
    t = Tier("cloud")
    load_client(t, "a")
    link = InProcessLink(t, *compress.get("int8"))
    reply = link.step(tc_key(), activation(), labels())
    want, n = tc.roundtrip(activation(), "int8")
    assert link.bytes_up == n + 4 * 8 and reply.grad is not None


def tc_key():  # type: ignore[no-untyped-def]
    from splitfed.engine.types import StepKey

    return StepKey("run", "a", 0, 0)


@pytest.mark.parametrize(
    "meta,exc,match",
    [
        (dict(dtype=99, shape=[2], nbytes=8), InvalidArgument, "unknown dtype"),
        (dict(dtype=1, shape=[-2], nbytes=8), InvalidArgument, "negative"),
        (dict(dtype=1, shape=[2, 2], nbytes=15), InvalidArgument, "needs 16"),
        (dict(dtype=5, shape=[2], nbytes=16, codec=pb.Codec(kind=2)), InvalidArgument, "floating"),
        (dict(dtype=1, shape=[2], nbytes=8, codec=pb.Codec(kind=7)), InvalidArgument, "codec kind"),
        (dict(dtype=1, shape=[2], nbytes=8, codec=pb.Codec(kind=3, topk_fraction=3)), InvalidArgument, "fraction"),
        (dict(dtype=1, shape=[1 << 40], nbytes=4 << 40), ResourceExhausted, "exceed"),
        (dict(dtype=1, shape=[1] * 17, nbytes=4), InvalidArgument, "dimensions"),
    ],
)
def test_bad_meta_is_refused_before_any_byte_is_used(meta: dict, exc: type, match: str) -> None:
    frame = pb.Frame(tensors=[pb.TensorMeta(**meta)]).SerializeToString()
    with pytest.raises(exc, match=match):
        wire.read_all([frame], None, wire.Limits())


@pytest.mark.parametrize(
    "frames,match",
    [
        ([b"\xff\xff"], "malformed"),
        ([b"\x0a\x05ab"], "past the end"),
        ([pb.Frame(data=b"abc").SerializeToString()], "beyond the declared tensors"),
        ([pb.Frame(tensors=[pb.TensorMeta(dtype=1, shape=[2], nbytes=8)], data=b"x" * 4).SerializeToString()],
         "ended inside"),
        ([pb.Frame(tensors=[pb.TensorMeta(dtype=1, shape=[1], nbytes=4)], data=b"x" * 20).SerializeToString()],
         "beyond the declared tensors"),
        ([pb.Frame(tensors=[pb.TensorMeta(dtype=1, shape=[1], nbytes=4)], data=b"x" * 4).SerializeToString()],
         "and its padding"),
        ([pb.Frame(step=pb.StepHeader()).SerializeToString()], "unexpected header"),
        ([b"\xa0\x01\x01"], None),  # an unknown varint field: skipped
    ],
)
def test_malformed_frames(frames: list[bytes], match: str | None) -> None:
    if match is None:
        wire.read_all(frames, None, wire.Limits())
        return
    with pytest.raises(InvalidArgument, match=match):
        wire.read_all(frames, None, wire.Limits())


def test_counts_of_frames_and_tensors_are_bounded() -> None:
    t = torch.randn(64)
    frames = wire.frames(None, [("", tc.encode(t))], 16)  # 16 frames
    with pytest.raises(ResourceExhausted, match="more than 8 messages"):
        wire.read_all(frames, None, wire.Limits(max_frames=8))
    many = wire.frames(None, [(str(i), tc.encode(torch.zeros(1))) for i in range(5)], 1 << 20)
    with pytest.raises(ResourceExhausted, match="more than 4 tensors"):
        wire.read_all(many, None, wire.Limits(max_tensors=4))
    with pytest.raises(ResourceExhausted, match="exceed the limit of 10 bytes"):
        wire.read_all(many, None, wire.Limits(max_call_bytes=10))


def test_many_tensors_share_frames_and_metas_spill_over() -> None:
    state = {f"{i}.weight": torch.full((3,), float(i)) for i in range(2000)}
    frames = wire.frames(None, [(k, tc.encode(v)) for k, v in state.items()], 1 << 20)
    assert 1 < len(frames) < 20 and max(map(len, frames)) < wire.Limits().max_message_bytes
    _, got = wire.read_all(frames, None, wire.Limits())
    assert [r.name for r in got] == list(state) and all(torch.equal(r.tensor, state[r.name]) for r in got)


def test_topk_indices_are_checked() -> None:
    payload = torch.tensor([3, 1], dtype=torch.int32).view(torch.uint8).numpy().tobytes() + bytes(8)
    frame = pb.Frame(tensors=[pb.TensorMeta(dtype=1, shape=[4], nbytes=16, codec=pb.Codec(kind=3, topk_fraction=0.5))],
                     data=payload).SerializeToString()
    with pytest.raises(InvalidArgument, match="strictly increasing"):
        wire.read_all([frame], None, wire.Limits())


@pytest.mark.parametrize("codec", ["none", "fp16"])
def test_writable_float16_never_aliases_the_message(codec: str) -> None:
    """fp16 of a float16 tensor converts nothing: ``writable`` must still give memory of its own."""
    t = torch.randn(6).half()
    (frame,) = wire.frames(None, [("", tc.encode(t, codec))], 1 << 20)
    x = wire.read_all([frame], None, wire.Limits(), writable=True)[1][0].tensor
    x.add_(1)  # must not write into the immutable message
    assert torch.equal(wire.read_all([frame], None, wire.Limits())[1][0].tensor, t)
