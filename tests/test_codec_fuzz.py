"""Fuzzing the tensor codec as the gRPC boundary: every byte from the network passes through it.

1. round trips: every dtype the wire carries, every codec, odd layouts (strided, channels_last, negated
   views), empty and 0-dim shapes, extreme values, through real frames cut at several chunk sizes; what
   arrives is what :func:`~splitfed.transport.codec.roundtrip` (the in-process links) says, in the bytes the
   cost model charges, and never the sender's own memory;
2. malformed input: random metas and payloads, top-k indices out of range or repeated, refused with
   INVALID_ARGUMENT / RESOURCE_EXHAUSTED only, on the reader and on a real tier over gRPC.
tests/test_codec.py and tests/test_codec_audit.py hold the codec's other tests; nothing there is repeated.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import grpc
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cost.wire import wire_bytes
from splitfed.errors import InvalidArgument, ResourceExhausted
from splitfed.transport import codec as tc
from splitfed.transport import compress, wire
from splitfed.transport.pb import method, pb
from tests.transport_fixtures import activation, labels, load_client, plain_server  # noqa: F401

DTYPES = list(tc.DTYPE_CODES)
CODECS = ["none", "fp16", "int8", "topk:0.001", "topk:0.3", "topk:0.999", "topk:1"]
EXTREME = [0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, -1e38, 3e38, 1e-45, 5e-324, 1e308, math.inf, -math.inf, math.nan]
LIMITS = wire.Limits()


def _negated(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a lazily negated view (torch's neg bit), which numpy refuses to read."""
    return torch._neg_view(-t)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    n = math.prod(shape)
    if dtype.is_floating_point:
        v = draw(st.lists(st.one_of(st.floats(width=64), st.sampled_from(EXTREME)), min_size=n, max_size=n))
        with np.errstate(all="ignore"):
            t = torch.tensor(v, dtype=torch.float64).to(dtype).reshape(shape)
    elif dtype == torch.bool:
        t = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(shape)
    else:
        info = torch.iinfo(dtype)
        ints = draw(st.lists(st.integers(info.min, info.max), min_size=n, max_size=n))
        t = torch.tensor(ints, dtype=dtype).reshape(shape)
    how = draw(st.sampled_from(["plain", "transpose", "channels_last", "step", "grad", "negated"]))
    if how == "transpose" and t.dim() >= 2:
        t = t.transpose(0, -1)
    elif how == "channels_last" and t.dim() == 4:
        t = t.contiguous(memory_format=torch.channels_last)
    elif how == "step" and t.dim() >= 1:
        t = torch.cat([t, t])[::2]
    elif how == "grad" and t.is_floating_point():
        t = t.clone().requires_grad_(True)
    elif how == "negated" and t.is_floating_point():
        t = _negated(t)
    return t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (the wire keeps NaN as NaN, its payload bits aside)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


# ---------------------------------------------------------------- 1. round trips


@given(t=tensors(), codec=st.sampled_from(CODECS), chunk=st.sampled_from([1, 7, 16, 1 << 20]),
       writable=st.booleans())
@settings(max_examples=400)
def test_what_arrives_is_what_roundtrip_says_in_the_bytes_priced(t: torch.Tensor, codec: str, chunk: int,
                                                                 writable: bool) -> None:
    e = tc.encode(t, codec)
    assert e.nbytes == tc.payload_size(t.dtype, tuple(t.shape), e.codec)
    if t.dim() == 2 and t.is_floating_point() and t.shape[0]:  # a boundary tensor: [batch, features]
        assert int(wire_bytes(codec, float(t.shape[1] * t.element_size()), t.shape[0],
                              itemsize=float(t.element_size()))) == e.nbytes
    _, (got,) = wire.read_all(wire.frames(None, [("x", e)], chunk), None, LIMITS, writable=writable)
    want, n = tc.roundtrip(t, codec)
    assert n == e.nbytes and got.nbytes == e.nbytes
    assert _same(got.tensor, want.detach())
    if not e.codec.lossy:
        assert _same(got.tensor, t.detach().resolve_neg())


@pytest.mark.parametrize("make", [lambda: torch.tensor([1 + 2j]).conj().imag,  # torch's own public ops
                                  lambda: _negated(torch.arange(6.0).reshape(2, 3)),
                                  lambda: _negated(torch.arange(6.0).reshape(3, 2).bfloat16())])
@pytest.mark.parametrize("codec", ["none", "fp16", "int8", "topk:1"])
def test_a_negated_view_travels_as_its_values(make, codec: str) -> None:  # type: ignore[no-untyped-def]
    """A contiguous tensor with torch's negative bit (the imaginary part of a conjugated one-element complex
    tensor): the exact codec raised numpy's RuntimeError, an INTERNAL status on a tier."""
    t = make()
    assert t.is_neg() and t.is_contiguous()
    _, (got,) = wire.read_all(wire.frames(None, [("", tc.encode(t, codec))], 1 << 20), None, LIMITS)
    assert torch.equal(got.tensor, tc.roundtrip(t.resolve_neg(), codec)[0])


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("make", [lambda: torch.eye(3).to_sparse(), lambda: torch.eye(3).to_sparse_csr()])
@pytest.mark.parametrize("codec", ["none", "fp16", "int8", "topk:0.5"])
def test_a_sparse_tensor_is_refused_naming_it(make, codec: str) -> None:  # type: ignore[no-untyped-def]
    """The wire carries dense tensors: a sparse one (a model's output or buffer) raised torch's RuntimeError
    (an INTERNAL status on a tier, "unsupported memory format option") instead of a refusal saying why."""
    with pytest.raises(InvalidArgument, match="sparse.* cannot travel"):
        tc.encode(make(), codec)


@given(t=tensors(), codec=st.sampled_from(CODECS))
@settings(max_examples=200)
def test_a_round_trip_never_shares_the_senders_memory(t: torch.Tensor, codec: str) -> None:
    """What an in-process link hands on is the receiver's own, as over a wire: fp16 of a float16 tensor
    converts nothing, and the round trip returned the sender's tensor itself (a write to one changed the
    other), unlike every other codec and dtype."""
    out, _ = tc.roundtrip(t, codec)
    if t.numel():
        assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_fp16_of_a_float16_activation_through_a_link_compressor_is_a_copy() -> None:
    up, _ = compress.get("fp16")
    assert up is not None
    a = torch.randn(4, 3, dtype=torch.float16)
    got, n = up(a)
    assert torch.equal(got, a) and n == a.numel() * 2
    got.zero_()  # the receiver writes into what it was handed
    assert not torch.equal(a, got)


@given(values=st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, -2.0]), min_size=1, max_size=40),
       fraction=st.sampled_from([1e-3, 0.01, 0.5, 0.99, 1.0]), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_topk_among_ties_keeps_k_exact_values_of_the_largest_magnitude(values: list[float], fraction: float,
                                                                      dtype: torch.dtype) -> None:
    t = torch.tensor(values, dtype=dtype)
    out, n = tc.roundtrip(t, f"topk:{fraction}")
    k = tc.topk_count(t.numel(), fraction)
    assert n == k * (4 + t.element_size())
    kept = out != 0
    assert int(kept.sum()) <= k and torch.equal(out[kept], t[kept])
    if bool(kept.any()) and bool((~kept).any()):
        assert float(t[~kept].abs().max()) <= float(t[kept].abs().min())


# ---------------------------------------------------------------- 2. malformed input


DIMS = st.one_of(st.integers(0, 6), st.integers(-3, 3), st.integers(-2**63, 2**63 - 1),
                 st.sampled_from([2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -2**63]))


@given(dtype=st.integers(-1, 12), shape=st.lists(DIMS, max_size=5), kind=st.integers(-1, 5),
       fraction=st.one_of(st.floats(), st.sampled_from([1e-3, 0.5, 1.0])), consistent=st.booleans(),
       nbytes=st.integers(-2**63, 2**63 - 1), data=st.data(), chunk=st.sampled_from([0, 3, 16]))
@settings(max_examples=400)
def test_any_meta_and_payload_is_decoded_or_refused(dtype: int, shape: list[int], kind: int, fraction: float,
                                                    consistent: bool, nbytes: int, data: st.DataObject,
                                                    chunk: int) -> None:
    """Metas with any dtype code, dimensions (negative, overflowing int64 products), codec and length, and
    random payload bytes, in one frame or many: a tensor of the declared kind, or INVALID_ARGUMENT /
    RESOURCE_EXHAUSTED, never another exception."""
    codec = pb.Codec(kind=cast(pb.CodecKind, kind), topk_fraction=fraction) if kind else None
    if consistent and dtype in tc.DTYPES and min(shape, default=0) >= 0:
        try:
            want = tc.payload_size(tc.DTYPES[dtype], tuple(shape), wire.codec_of(codec) if codec else tc.NONE)
        except InvalidArgument:
            want = nbytes
        nbytes = want if want < 2**63 else nbytes
    meta = pb.TensorMeta(dtype=cast(pb.DType, dtype), shape=shape, nbytes=nbytes, codec=codec)
    n = nbytes if 0 <= nbytes <= 4096 else data.draw(st.integers(0, 64))
    payload = data.draw(st.binary(min_size=n, max_size=n)) + bytes(-n % wire.ALIGN)
    if chunk:
        frames = [pb.Frame(tensors=[meta]).SerializeToString()] + [
            pb.Frame(data=payload[i:i + chunk]).SerializeToString() for i in range(0, len(payload), chunk)]
    else:
        frames = [pb.Frame(tensors=[meta], data=payload).SerializeToString()]
    try:
        _, (got,) = wire.read_all(frames, None, wire.Limits(max_tensor_bytes=1 << 24, max_call_bytes=1 << 25))
    except (InvalidArgument, ResourceExhausted):
        return
    assert got.tensor.dtype == tc.DTYPES[dtype] and list(got.tensor.shape) == shape


def _topk_frame(dtype: torch.dtype, numel: int, fraction: float, idx: list[int], values: bytes) -> bytes:
    payload = np.array(idx, dtype="<i4").tobytes() + values
    meta = pb.TensorMeta(dtype=cast(pb.DType, tc.DTYPE_CODES[dtype]), shape=[numel], nbytes=len(payload),
                         codec=wire.codec_pb(tc.Codec("topk", fraction)))
    return pb.Frame(tensors=[meta], data=payload + bytes(-len(payload) % wire.ALIGN)).SerializeToString()


@given(dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]), numel=st.integers(1, 40),
       fraction=st.sampled_from([1e-3, 0.1, 0.5, 1.0]), data=st.data())
@settings(max_examples=300)
def test_topk_indices_out_of_range_repeated_or_unsorted_are_refused(dtype: torch.dtype, numel: int, fraction: float,
                                                                    data: st.DataObject) -> None:
    k = tc.topk_count(numel, fraction)
    idx = data.draw(st.lists(st.one_of(st.integers(-1, numel), st.integers(-2**31, 2**31 - 1)),
                             min_size=k, max_size=k))
    values = data.draw(st.binary(min_size=k * dtype.itemsize, max_size=k * dtype.itemsize))
    valid = all(0 <= i < numel for i in idx) and all(a < b for a, b in zip(idx, idx[1:], strict=False))
    try:
        _, (got,) = wire.read_all([_topk_frame(dtype, numel, fraction, idx, values)], None, LIMITS)
    except InvalidArgument as e:
        assert not valid and "strictly increasing" in str(e)
        return
    assert valid
    want = torch.zeros(numel, dtype=dtype)
    want[idx] = torch.frombuffer(bytearray(values), dtype=dtype)
    assert _same(got.tensor, want)


def _raw_step(address: str, frame: bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as ch:
        try:
            ch.unary_unary(method("Step"))(frame, timeout=30)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def _step_frame(act: tuple[int, list[int], bytes, pb.Codec | None], y: torch.Tensor) -> bytes:
    """A Step request with an activation meta and payload as given, and real labels."""
    dtype, shape, payload, codec = act
    head = pb.StepHeader(run_id="run", client_id="c", round=0, seq=0, phase=pb.PHASE_STEP)
    ys = tc.encode(y)
    metas = [pb.TensorMeta(dtype=cast(pb.DType, dtype), shape=shape, nbytes=len(payload), codec=codec),
             pb.TensorMeta(dtype=cast(pb.DType, 5), shape=list(y.shape), nbytes=ys.nbytes)]
    data = payload + bytes(-len(payload) % wire.ALIGN) + bytes(ys.payload)
    return pb.Frame(step=head, tensors=metas, data=data).SerializeToString()


def test_a_tier_answers_malformed_tensors_invalid_argument_and_serves_on(plain_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The transport's mapping, end to end: each malformed boundary tensor is INVALID_ARGUMENT from a real
    tier over gRPC (never INTERNAL), and the tier then serves a well-formed step."""
    load_client(plain_server.tier, "c")
    a, y = activation(), labels()
    shape = list(a.shape)
    n = a.numel()
    good = bytes(tc.encode(a).payload)
    k = tc.topk_count(n, 0.5)
    repeated = np.array([0] * k, dtype="<i4").tobytes() + bytes(4 * k)
    beyond = np.arange(n - k + 1, n + 1, dtype="<i4").tobytes() + bytes(4 * k)
    topk = pb.Codec(kind=cast(pb.CodecKind, 3), topk_fraction=0.5)
    bad = {
        "truncated": (1, shape, good[:-4], None),
        "negative dimension": (1, [-4, *shape[1:]], good, None),
        "unknown dtype": (42, shape, good, None),
        "overflowing shape": (1, [2**62, 2**62, 0], b"", None),
        "repeated indices": (1, shape, repeated, topk),
        "index out of range": (1, shape, beyond, topk),
        "int8 of integers": (5, shape, bytes(8 + n), pb.Codec(kind=cast(pb.CodecKind, 2))),
        "top-k below its floor": (1, shape, bytes(8), pb.Codec(kind=cast(pb.CodecKind, 3), topk_fraction=1e-9)),
        "nan": (1, shape, bytes(tc.encode(torch.full_like(a, math.nan)).payload), None),
    }
    for what, act in bad.items():
        assert _raw_step(plain_server.address, _step_frame(act, y)) == grpc.StatusCode.INVALID_ARGUMENT, what
    assert _raw_step(plain_server.address, _step_frame((1, shape, good, None), y)) == grpc.StatusCode.OK
    assert plain_server.servicer.refusals().count("INTERNAL") == 0


# a limit above what any host can allocate (1 PiB: beyond a 64-bit CPU's user address space, whatever the
# overcommit policy); a tier may be started with one above its own memory (--max-tensor-mb up to 64 GiB)
HUGE = wire.Limits(max_tensor_bytes=1 << 50, max_call_bytes=1 << 51)


def _declared_huge(head: pb.StepHeader | None = None) -> list[bytes]:
    """One small frame declaring a float32 tensor of 1 PiB, then the first 16 bytes of its payload."""
    meta = pb.TensorMeta(dtype=cast(pb.DType, 1), shape=[1 << 48], nbytes=1 << 50)
    return [pb.Frame(step=head, tensors=[meta]).SerializeToString(), pb.Frame(data=bytes(16)).SerializeToString()]


def test_a_declared_tensor_this_host_cannot_allocate_is_resource_exhausted() -> None:
    """Within the limits but beyond the host's memory: torch's allocator raised RuntimeError (INTERNAL on a
    tier, logged as a bug) for a payload's buffer, after two frames of 100 bytes."""
    with pytest.raises(ResourceExhausted, match="cannot allocate the 1125899906842624 bytes"):
        wire.read_all(_declared_huge(), None, HUGE)


def test_a_tier_answers_it_resource_exhausted_over_grpc() -> None:
    from splitfed.transport.server import serve_tier

    srv = serve_tier("cloud", insecure=True, max_workers=4, limits=HUGE)
    try:
        head = pb.StepHeader(run_id="run", client_id="c", round=0, seq=0, phase=pb.PHASE_FORWARD)
        with grpc.insecure_channel(srv.address) as ch, pytest.raises(grpc.RpcError) as e:
            list(ch.stream_stream(method("StepStream"))(iter(_declared_huge(head)), timeout=30))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        assert srv.servicer is not None and srv.servicer.refusals().count("INTERNAL") == 0
    finally:
        srv.stop(0)


_SMALL_HOST = """
import resource, sys
from typing import cast
import numpy as np
from splitfed.errors import ResourceExhausted
from splitfed.transport import codec as tc, wire
from splitfed.transport.pb import pb
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))  # a host with 1 GiB to spare
n = 1 << 30  # float32: 4 GiB dense, within the limits below, from 8.6 MB of top-k indices and values
k = tc.topk_count(n, 1e-3)
payload = np.arange(k, dtype="<i4").tobytes() + bytes(4 * k)
meta = pb.TensorMeta(dtype=cast(pb.DType, 1), shape=[n], nbytes=len(payload),
                     codec=wire.codec_pb(tc.Codec("topk", 1e-3)))
frame = pb.Frame(tensors=[meta], data=payload + bytes(-len(payload) % 16)).SerializeToString()
try:
    wire.read_all([frame], None, wire.Limits(max_tensor_bytes=8 << 30, max_call_bytes=16 << 30))
except ResourceExhausted as e:
    print("refused:", e)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status: Linux")
def test_a_topk_tensor_this_host_cannot_allocate_is_resource_exhausted() -> None:
    """Top-k builds the dense tensor from the values it is sent (up to 1000x their count): within a limit set
    above the host's memory, a few megabytes made torch's allocator raise RuntimeError (INTERNAL on a tier).
    A real process whose address space is capped stands for the small host."""
    run = subprocess.run([sys.executable, "-c", _SMALL_HOST], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "refused: call: tensor 0: this process cannot allocate the 4294967296 bytes" in run.stdout
