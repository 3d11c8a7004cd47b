"""An audit of the tensor codec against a reference written here from its documented format.

The expectations are built with numpy and struct only (never with the codec's own helpers): the
exact codec is the tensor's logical C-order bytes, little-endian; fp16 is float16 values saturated
at +-65504; int8 is ``<ff`` (scale, offset) then one uint8 a value; top-k is ``ceil(F n)`` int32
indices (strictly increasing) then the kept values in the tensor's dtype. Decoding is checked from
frames built by protobuf around the reference bytes, so a shared mistake in encoder and decoder
cannot hide. tests/test_codec.py holds the codec's own tests; nothing there is repeated here.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import cast

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cost.wire import wire_bytes
from splitfed.engine.checks import check_tensor
from splitfed.errors import InvalidArgument, ResourceExhausted
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.pb import pb

# dtype -> (DType code of tier.proto, numpy type holding its bits)
REF: dict[torch.dtype, tuple[int, type[np.generic]]] = {
    torch.float32: (1, np.int32), torch.float16: (2, np.int16), torch.bfloat16: (3, np.int16),
    torch.float64: (4, np.int64), torch.int64: (5, np.int64), torch.int32: (6, np.int32),
    torch.int16: (7, np.int16), torch.int8: (8, np.int8), torch.uint8: (9, np.uint8), torch.bool: (10, np.uint8),
}
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# bit patterns as unsigned ints: +-0, +-inf, NaNs with payloads (quiet, signalling, negative), the
# smallest and largest subnormal, the smallest normal, the largest finite value, -1 ulp of zero
SPECIAL = {
    torch.float32: [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC12345, 0x7F800001, 0xFFFFFFFF,
                    0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x80000001],
    torch.float64: [0, 1 << 63, 0x7FF0 << 48, 0xFFF0 << 48, 0x7FF8 << 48, (0x7FF8 << 48) | 0xABCDEF, (0x7FF0 << 48) | 1,
                    (1 << 64) - 1, 1, (1 << 52) - 1, 1 << 52, 0x7FEFFFFFFFFFFFFF, (1 << 63) | 1],
    torch.float16: [0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7E5A, 0x7C01, 0xFFFF, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x8001],
    torch.bfloat16: [0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC5, 0x7F81, 0xFFFF, 0x0001, 0x007F, 0x0080, 0x7F7F, 0x8001],
}
LIMITS = wire.Limits()


def _tensor(dtype: torch.dtype, words: list[int], shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor whose elements have exactly the given bit patterns (unsigned ints; 0/1 for bool)."""
    bits = REF[dtype][1]
    width = np.dtype(bits).itemsize
    raw = np.array(words, dtype=f"<u{width}").view(bits) if dtype != torch.bool else np.array(words, np.uint8)
    return torch.from_numpy(raw.copy()).view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> bytes:
    """The reference exact payload: the logical elements' bytes in C order (numpy, whatever the strides)."""
    t = t.detach()
    a = t.numpy() if t.dtype == torch.bool else t.view(torch.int8 if t.element_size() == 1 else
                                                        {2: torch.int16, 4: torch.int32, 8: torch.int64}[
                                                            t.element_size()]).numpy()
    return np.ascontiguousarray(a).tobytes()


def _frame(dtype: torch.dtype, shape: tuple[int, ...], payload: bytes, kind: int = 0, fraction: float = 0.0) -> bytes:
    """A Frame built by protobuf's generated code around a payload (zero-padded to 16, as the format says)."""
    codec = pb.Codec(kind=cast(pb.CodecKind, kind), topk_fraction=fraction) if kind else None
    meta = pb.TensorMeta(dtype=cast(pb.DType, REF[dtype][0]), shape=shape, nbytes=len(payload), codec=codec)
    return pb.Frame(tensors=[meta], data=payload + bytes(-len(payload) % 16)).SerializeToString()


def _received(frame: bytes) -> torch.Tensor:
    _, (got,) = wire.read_all([frame], None, LIMITS)
    return got.tensor


@st.composite
def words(draw: st.DrawFn, dtype: torch.dtype, n: int) -> list[int]:
    if dtype == torch.bool:
        return draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    width = 8 * np.dtype(REF[dtype][1]).itemsize
    each = st.integers(0, (1 << width) - 1)
    if dtype in SPECIAL:
        each = st.one_of(st.sampled_from(SPECIAL[dtype]), each)
    return draw(st.lists(each, min_size=n, max_size=n))


LAYOUTS = ["plain", "transpose", "step", "expand", "channels_last", "permute", "offset", "overlap", "grad", "nonleaf"]


def _layout(t: torch.Tensor, how: str, seed: int) -> torch.Tensor:
    """A view of ``t``'s elements with other strides (the logical values are what must travel)."""
    if how == "transpose" and t.dim() >= 2:
        return t.transpose(0, -1)
    if how == "step" and t.dim() >= 1:
        return t[::2]
    if how == "expand":
        return t.unsqueeze(1).expand(t.shape[0], 3, *t.shape[1:]) if t.dim() else t.expand(2, 2)
    if how == "channels_last" and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if how == "permute" and t.dim() >= 2:
        return t.permute(*np.random.default_rng(seed).permutation(t.dim()).tolist())
    if how == "offset" and t.numel() > 1:
        return t.reshape(-1)[1:]
    if how == "overlap" and t.numel() > 2:
        return t.reshape(-1).as_strided((t.numel() - 1, 2), (1, 1))
    if how in ("grad", "nonleaf") and t.is_floating_point():
        leaf = t.clone().requires_grad_(True)
        return leaf if how == "grad" else leaf.view_as(leaf)
    return t


# ---------------------------------------------------------------- 1. exact codec


@given(data=st.data(), dtype=st.sampled_from(list(REF)), how=st.sampled_from(LAYOUTS),
       shape=st.lists(st.integers(0, 4), max_size=5).map(tuple))
@settings(max_examples=300)
def test_exact_codec_is_the_logical_c_order_bits(data: st.DataObject, dtype: torch.dtype, how: str,
                                                 shape: tuple[int, ...]) -> None:
    """Every dtype, every bit pattern (NaN payloads, -0.0, +-inf, subnormals), any layout: the payload is the
    logical C-order bytes; those bytes, framed by protobuf, decode to the same bits; our frames too."""
    base = _tensor(dtype, data.draw(words(dtype, math.prod(shape))), shape)
    t = _layout(base, how, data.draw(st.integers(0, 99)))
    want = _bits(t)
    e = tc.encode(t)
    assert (e.dtype, e.shape, e.codec, e.nbytes) == (dtype, tuple(t.shape), tc.NONE, len(want))
    assert bytes(e.payload) == want
    got = _received(_frame(dtype, tuple(t.shape), want))
    assert got.dtype == dtype and got.shape == t.shape and _bits(got) == want
    chunk = data.draw(st.sampled_from([1, 5, 16, 1 << 20]))
    _, (again,) = wire.read_all(wire.frames(None, [("x", e)], chunk), None, LIMITS)
    assert _bits(again.tensor) == want


@pytest.mark.parametrize("dtype", list(REF))
def test_large_rank_and_zero_dim_tensors_travel_exactly(dtype: torch.dtype) -> None:
    for shape in [(2, 1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 3), (), (1,) * 16, (3, 0) + (2,) * 14]:
        n = math.prod(shape)
        t = _tensor(dtype, [(i * 2654435761) % (2 if dtype == torch.bool else 256) for i in range(n)], shape)
        got = _received(_frame(dtype, shape, _bits(t)))
        assert got.shape == t.shape and _bits(got) == _bits(t) == bytes(tc.encode(t).payload)


@pytest.mark.parametrize("codec", ["none", "fp16", "int8", "topk:0.5"])
def test_a_tensor_of_17_dimensions_is_refused_by_its_sender_as_by_its_receiver(codec: str) -> None:
    """The receiver refuses more than 16 dimensions; the sender (and so an in-process lossy link, which ran
    the same encoder and then accepted it) now says so before anything is sent."""
    t = torch.ones((1,) * 17)
    with pytest.raises(InvalidArgument, match="a tensor of 17 dimensions cannot travel \\(at most 16\\)"):
        tc.encode(t, codec)
    with pytest.raises(InvalidArgument, match="17 dimensions"):
        tc.roundtrip(t, codec)


@pytest.mark.parametrize("codec", ["none", "fp16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_an_in_process_link_refuses_17_dimensions_whatever_its_codec(codec: str, dtype: torch.dtype) -> None:
    """The default in-process link (no codec) never reached the encoder, nor did an integer tensor under a
    lossy one: a simulation passed what a deployment refused."""
    from splitfed.engine.link import InProcessLink
    from splitfed.engine.tier import Tier
    from splitfed.engine.types import StepKey
    from splitfed.transport import compress

    link = InProcessLink(Tier("cloud"), *compress.get(codec))
    with pytest.raises(InvalidArgument, match="a tensor of 17 dimensions cannot travel \\(at most 16\\)"):
        link.step(StepKey("r", "c", 0, 0), torch.ones((1,) * 17, dtype=dtype), torch.zeros(1, dtype=torch.int64))
    assert link.bytes_up == 8  # the labels only: the activation never left


@pytest.mark.parametrize("make", [
    lambda: torch.tensor(1.5, dtype=torch.bfloat16).expand(1),       # one element, stride 0
    lambda: torch.arange(3.0).to(torch.bfloat16).reshape(1, 3)[:, ::3],  # one element, stride 3
    lambda: torch.from_numpy(np.zeros(0, np.int16)).view(torch.bfloat16),  # empty, stride 0
    lambda: torch.arange(6.0).to(torch.bfloat16)[2::4].unsqueeze(0).expand(1, 1),
])
def test_bfloat16_of_any_stride_is_encoded(make: Callable[[], torch.Tensor]) -> None:
    """torch calls these contiguous, but viewing them as bytes needs stride 1: encoding one (a batch-1
    bfloat16 activation sliced with a step, a one-element state entry) raised RuntimeError."""
    t = make()
    assert bytes(tc.encode(t).payload) == _bits(t)
    assert _bits(_received(_frame(torch.bfloat16, tuple(t.shape), _bits(t)))) == _bits(t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no second device type on this host")
def test_a_tensor_on_another_device_travels_exactly() -> None:
    t = _tensor(torch.float32, SPECIAL[torch.float32], (13,))
    assert bytes(tc.encode(t.cuda()).payload) == _bits(t)


# ---------------------------------------------------------------- 2. lossy codecs


def _wide(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()  # exact for every floating dtype


def _ref_fp16(x: np.ndarray) -> np.ndarray:
    """float16, finite values saturated at +-65504, NaN and +-inf as they are.

    float64 is rounded through float32 (torch's conversion; at most 2**-13 ulp beyond round-to-nearest),
    which is exact rounding for float32, bfloat16 and float16 inputs.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        sat = np.where(np.isfinite(x), np.clip(x, -65504.0, 65504.0), x)
        return sat.astype(np.float32).astype(np.float16)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, NaN where NaN, and the sign of every zero."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return bool(np.array_equal(a, b, equal_nan=True) and (np.signbit(a) == np.signbit(b))[~np.isnan(a)].all())


float_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
                         st.floats(-1e-38, 1e-38), st.floats(-7e4, 7e4), st.sampled_from([65504.0, 65519.99, 65520.0,
                                                                                         -0.0, 6e-8, 2.98e-8]))


@given(values=st.lists(float_values, max_size=40), dtype=st.sampled_from(FLOATS))
def test_fp16_is_the_reference_saturating_float16(values: list[float], dtype: torch.dtype) -> None:
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    x = _wide(t)
    want = _ref_fp16(x)
    e = tc.encode(t, "fp16")
    assert e.nbytes == 2 * len(values)
    assert _same(np.frombuffer(bytes(e.payload), "<f2"), want)
    got = _received(_frame(dtype, (len(values),), want.tobytes(), kind=1))
    assert got.dtype == dtype and _same(_wide(got), _wide(torch.from_numpy(want).to(dtype)))
    # a finite tensor stays finite: never an overflow to inf
    assert np.isfinite(want[np.isfinite(x)]).all()


F32_MAX = float(np.finfo(np.float32).max)
H = F32_MAX / 4  # the documented int8 saturation bound


def _ref_int8(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32]:
    """(values as float32, scale, offset) of the documented affine scheme, in float32 arithmetic."""
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = np.where(np.isfinite(x), np.clip(x, -H, H), x).astype(np.float32)
        lo, hi = (x32.min(), x32.max()) if x32.size else (np.float32(0), np.float32(0))
        scale = np.float32((hi - lo) / np.float32(255))
        return x32, (scale if scale > 0 else np.float32(1)), lo


def _quantise(x32: np.ndarray, scale: np.float32, lo: np.float32) -> np.ndarray:
    return np.clip(np.rint((x32 - lo) / scale), 0, 255).astype(np.uint8)


def _check_int8(t: torch.Tensor) -> None:
    """Payload equal to the reference; decoding the reference payload gives q * scale + lo; error <= scale / 2."""
    x = _wide(t).reshape(-1)
    e = tc.encode(t, "int8")
    payload = bytes(e.payload)
    assert len(payload) == 8 + x.size
    scale, lo = (np.float32(v) for v in struct.unpack("<ff", payload[:8]))
    x32, rscale, rlo = _ref_int8(x)
    assert lo == rlo and abs(scale - rscale) <= np.spacing(rscale)  # one rounding of a division may differ
    q = _quantise(x32, scale, lo)
    assert np.frombuffer(payload, np.uint8, offset=8).tolist() == q.tolist()
    ref = struct.pack("<ff", scale, lo) + q.tobytes()
    got = _received(_frame(t.dtype, tuple(t.shape), ref, kind=2))
    want = q.astype(np.float32) * scale + lo
    assert got.dtype == t.dtype and got.shape == t.shape
    assert _same(_wide(got).reshape(-1), _wide(torch.from_numpy(want).to(t.dtype)))
    assert np.isfinite(_wide(got)).all()  # a finite tensor arrives finite, however large
    # the bound: half a step, plus float32's own roundings (of x, of the step, of q * step + lo);
    # a subnormal step has an absolute rounding error of 2**-150 times each of 255 steps
    inside = np.abs(x) <= H
    err = np.abs(_wide(got).reshape(-1) - np.clip(x, -H, H))
    top = float(np.abs(np.clip(x, -H, H)).max()) if x.size else 0.0
    unit = float(np.spacing(np.float32(top))) if t.dtype != torch.float16 else 0.0
    tol = scale / 2 + 2.5 * unit + 255 * 2.0**-150
    if t.dtype in (torch.float16, torch.bfloat16) and x.size:  # and the final rounding to the tensor's dtype
        tol += float(np.abs(x).max()) * 2.0 ** -(11 if t.dtype == torch.float16 else 8)
    assert (err[inside] <= tol).all(), (err.max(), tol)


finite = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True)


@given(values=st.one_of(st.lists(finite, max_size=40),
                        st.tuples(st.floats(-1e3, 1e3), st.floats(1e-30, 1e30), st.lists(st.floats(-1, 1), max_size=40))
                        .map(lambda a: [a[0] + a[1] * v for v in a[2]])),
       dtype=st.sampled_from(FLOATS))
@settings(max_examples=300)
def test_int8_is_the_reference_affine_scheme_and_keeps_its_bound(values: list[float], dtype: torch.dtype) -> None:
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    if not torch.isfinite(t).all():  # a float64 beyond float16/bfloat16's range
        t = torch.tensor(values, dtype=torch.float64)
    _check_int8(t)


@pytest.mark.parametrize("values", [
    [0.0] * 7, [-0.0, 0.0], [3.25] * 5, [-1e-30] * 3, [1e-45, 0.0, 1e-40, 3e-41], [1.0, 1.0 + 2**-23],
    [1000.0, 1000.0 + 2**-13, 1000.0 - 2**-13], [5.0],
])
@pytest.mark.parametrize("dtype", FLOATS)
def test_int8_degenerate_tensors(values: list[float], dtype: torch.dtype) -> None:
    """All-zero, constant, subnormal and near-constant tensors: the reference, a finite result, the bound;
    a constant tensor arrives exactly (a zero span is sent as scale 1, never divided by)."""
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    _check_int8(t)
    if len(set(t.tolist())) == 1:  # exactly, once in float32 (the scheme's arithmetic)
        out, _ = tc.roundtrip(t, "int8")
        assert torch.equal(out, t.float().to(t.dtype))


def test_int8_of_an_empty_and_a_zero_dim_tensor() -> None:
    e = tc.encode(torch.zeros(0, 3), "int8")
    assert bytes(e.payload) == struct.pack("<ff", 1.0, 0.0)
    assert _received(_frame(torch.float32, (0, 3), bytes(e.payload), kind=2)).shape == (0, 3)
    _check_int8(torch.tensor(-2.5))


@pytest.mark.parametrize("values,dtype", [
    ([-3e38, 3e38], torch.float32),                 # the span overflows float32: hi - lo = inf
    ([-F32_MAX, 0.0, F32_MAX], torch.float32),
    ([2e38, 1.0], torch.float32),                   # q * scale would overflow in the decoder
    ([1e39, 1.0], torch.float64),                   # beyond float32's range: inf after the cast
    ([-1e300, 1e300, 0.0, 7.0], torch.float64),
    ([3e38, -3e38], torch.bfloat16),
])
def test_int8_keeps_huge_finite_tensors_finite(values: list[float], dtype: torch.dtype) -> None:
    """A finite tensor must not arrive as NaN (it did: the float32 span overflowed, and every value
    became NaN, which the next tier refused as a diverged tensor): values saturate at +-F32_MAX/4."""
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    out, _ = tc.roundtrip(t, "int8")
    assert bool(torch.isfinite(out).all()), out
    x = _wide(t)
    assert np.abs(_wide(out) - np.clip(x, -H, H)).max() <= (np.ptp(np.clip(x, -H, H)) / 255) * 0.51
    _check_int8(t)


@pytest.mark.parametrize("values", [[1.0, float("nan"), 2.0], [float("inf"), 0.0], [float("-inf"), 5.0],
                                    [float("nan")], [float("inf"), float("-inf")]])
@pytest.mark.parametrize("codec", ["fp16", "int8", "topk:1"])
def test_nonfinite_tensors_arrive_nonfinite_and_are_refused(values: list[float], codec: str) -> None:
    """The documented route for NaN/inf: they travel as non-finite values, and the receiving tier refuses them
    with a clear message (a lossy codec never turns them into finite garbage)."""
    t = torch.tensor([values], dtype=torch.float32)
    out, _ = tc.roundtrip(t, codec)
    assert not bool(torch.isfinite(out).all())
    with pytest.raises(InvalidArgument, match="NaN or infinite"):
        check_tensor(out, (len(values),), torch.float32, "activation", 8)


@pytest.mark.parametrize("scale,lo,finite_out", [
    (float("nan"), 0.0, False), (float("inf"), 0.0, False), (1.0, float("nan"), False), (1.0, float("-inf"), False),
    (0.0, 2.0, True), (-0.5, 1.0, True), (3e38, 3e38, False),
])
def test_int8_header_from_the_wire(scale: float, lo: float, finite_out: bool) -> None:
    """Any header decodes without an internal error: a non-finite result is what the tier refuses (as for
    fp16 NaN); scale 0 or negative is a (strange but) well-defined constant or mirrored grid."""
    q = bytes([0, 1, 255])
    got = _received(_frame(torch.float32, (3,), struct.pack("<ff", scale, lo) + q, kind=2))
    assert bool(torch.isfinite(got).all()) == finite_out
    if finite_out:
        assert got.tolist() == [lo, lo + scale, lo + 255 * scale]


@given(values=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=60),
       fraction=st.floats(1e-3, 1.0), dtype=st.sampled_from(FLOATS))
def test_topk_is_the_reference_selection(values: list[float], fraction: float, dtype: torch.dtype) -> None:
    t = torch.tensor(values, dtype=torch.float32).to(dtype)
    x = _wide(t)
    n = x.size
    k = min(n, max(1, math.ceil(fraction * n)))  # the documented count
    item = t.element_size()
    e = tc.encode(t, tc.Codec("topk", fraction))
    payload = bytes(e.payload)
    assert len(payload) == k * (4 + item)
    idx = np.frombuffer(payload[:4 * k], "<i4")
    assert (np.diff(idx) > 0).all() and 0 <= idx[0] and idx[-1] < n
    kept = np.zeros(n, bool)
    kept[idx] = True
    assert np.abs(x[kept]).min() >= (np.abs(x[~kept]).max() if (~kept).any() else 0)  # the largest magnitudes
    assert payload[4 * k:] == _bits(t[torch.from_numpy(idx.astype(np.int64))])  # their exact values
    got = _received(_frame(dtype, (n,), payload, kind=3, fraction=fraction))
    assert _same(_wide(got), np.where(kept, x, 0.0))


@pytest.mark.parametrize("idx", [[-1, 2], [0, 4], [2, 2], [3, 1], [0, 2**31 - 1]])
def test_bad_topk_indices_are_refused(idx: list[int]) -> None:
    payload = struct.pack(f"<{len(idx)}i", *idx) + struct.pack(f"<{len(idx)}f", *[1.0] * len(idx))
    with pytest.raises(InvalidArgument, match="strictly increasing"):
        _received(_frame(torch.float32, (4,), payload, kind=3, fraction=0.5))


# ---------------------------------------------------------------- 3. bytes the cost model charges


@pytest.mark.parametrize("codec", ["none", "fp16", "int8", "topk:0.1", "topk:0.07", "topk:0.3", "topk:1", "topk:0.001"])
@pytest.mark.parametrize("samples,features", [(1, 1), (32, 10), (7, 3 * 32 * 32), (64, 256), (100, 1), (5, 7)])
def test_the_cost_model_prices_the_payload_the_codec_sends(codec: str, samples: int, features: int) -> None:
    """A float32 boundary tensor (every model of the zoo) and int64 labels or token ids: the payload the
    encoder produces is, byte for byte, what the cost model charges for one message on that link."""
    act = torch.randn(samples, features)
    assert int(wire_bytes(codec, 4.0 * features, samples)) == tc.encode(act, codec).nbytes
    ids = torch.zeros(samples, features, dtype=torch.int64)
    assert int(wire_bytes(codec, 8.0 * features, samples, floating=False)) == tc.encode(ids, codec).nbytes


# ---------------------------------------------------------------- 4. malformed input from the wire


@pytest.mark.parametrize("shape", [[2**62, 4, 0], [3, 0, 2**63 - 1, 2**63 - 1], [0, 2**62, 2**62], [2**40, 0, 2**40],
                                   [0, 2**61]])
@pytest.mark.parametrize("kind", [0, 3])
def test_an_empty_shape_with_overflowing_dimensions_is_refused(shape: list[int], kind: int) -> None:
    """Zero elements pass every byte limit, but torch multiplies the other dimensions in 64 bits: most of
    these shapes raised torch's RuntimeError (an INTERNAL status on a tier) instead of INVALID_ARGUMENT.
    One rule now refuses every shape whose dimensions (a zero counted as one) multiply past 2**63 bytes."""
    meta = pb.TensorMeta(dtype=cast(pb.DType, 1), shape=shape, nbytes=0,
                         codec=pb.Codec(kind=cast(pb.CodecKind, kind), topk_fraction=0.5))
    with pytest.raises(InvalidArgument, match="too large for a tensor"):
        wire.read_all([pb.Frame(tensors=[meta]).SerializeToString()], None, LIMITS)


@given(shape=st.lists(st.one_of(st.integers(0, 8), st.integers(0, 2**63 - 1)), min_size=1, max_size=6)
       .map(lambda s: [*s, 0]), dtype=st.sampled_from(list(REF)))
def test_any_empty_shape_is_decoded_or_refused(shape: list[int], dtype: torch.dtype) -> None:
    meta = pb.TensorMeta(dtype=cast(pb.DType, REF[dtype][0]), shape=shape, nbytes=0)
    try:
        _, (got,) = wire.read_all([pb.Frame(tensors=[meta]).SerializeToString()], None, LIMITS)
    except InvalidArgument:
        return
    assert list(got.tensor.shape) == shape and got.tensor.dtype == dtype


@pytest.mark.parametrize("meta,exc,match", [
    (dict(dtype=1, shape=[2**62, 2**62], nbytes=16), ResourceExhausted, "exceed"),  # refused before allocating
    (dict(dtype=1, shape=[2], nbytes=-8), InvalidArgument, "needs 8"),
    (dict(dtype=1, shape=[2], nbytes=2**62), ResourceExhausted, "exceed"),
    (dict(dtype=0, shape=[2], nbytes=8), InvalidArgument, "unknown dtype code 0"),
    (dict(dtype=1, shape=[4], nbytes=16, codec=pb.Codec(kind=cast(pb.CodecKind, 2))), InvalidArgument, "needs 12"),
    (dict(dtype=1, shape=[4], nbytes=8, codec=pb.Codec(kind=cast(pb.CodecKind, 3), topk_fraction=float("nan"))), InvalidArgument,
     "fraction"),
    (dict(dtype=1, shape=[4], nbytes=8, codec=pb.Codec(kind=cast(pb.CodecKind, 3), topk_fraction=-0.5)), InvalidArgument, "fraction"),
    (dict(dtype=1, shape=[4], nbytes=16, codec=pb.Codec(kind=cast(pb.CodecKind, 1))), InvalidArgument, "needs 8"),
])
def test_bad_metas(meta: dict, exc: type, match: str) -> None:
    frame = pb.Frame(tensors=[pb.TensorMeta(**meta)]).SerializeToString()
    with pytest.raises(exc, match=match):
        wire.read_all([frame], None, LIMITS)


def _valid_call() -> list[bytes]:
    t = torch.linspace(-3, 3, 40).reshape(4, 10)
    return wire.frames(pb.StepHeader(run_id="r", client_id="c"), [
        ("a", tc.encode(t, "int8")), ("b", tc.encode(t, "topk:0.2")), ("c", tc.encode(t.double(), "fp16")),
        ("d", tc.encode(torch.arange(6))), ("e", tc.encode(torch.zeros(0, 2))), ("f", tc.encode(t.bool()))], 48)


@given(data=st.data())
@settings(max_examples=300)
def test_truncated_or_corrupted_frames_give_only_the_documented_errors(data: st.DataObject) -> None:
    """Cut, drop, repeat or flip bytes of a well-formed call: the reader either rebuilds tensors of the declared
    kinds or refuses with InvalidArgument / ResourceExhausted, never any other exception."""
    frames = _valid_call()
    i = data.draw(st.integers(0, len(frames) - 1))
    f = bytearray(frames[i])
    what = data.draw(st.sampled_from(["cut", "flip", "drop", "repeat"]))
    if what == "cut":
        frames[i] = bytes(f[:data.draw(st.integers(0, len(f) - 1))])
    elif what == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            j = data.draw(st.integers(0, len(f) - 1))
            f[j] ^= 1 << data.draw(st.integers(0, 7))
        frames[i] = bytes(f)
    elif what == "drop":
        del frames[i]
    else:
        frames.insert(i, frames[i])
    try:
        _, got = wire.read_all(frames, wire.F_STEP, wire.Limits(max_tensor_bytes=1 << 16, max_call_bytes=1 << 17))
    except (InvalidArgument, ResourceExhausted):
        return
    for r in got:
        assert r.tensor.dtype in REF


# ---------------------------------------------------------------- 5. determinism


@given(values=st.lists(st.sampled_from([0.0, -0.0, 1.5, -1.5, 2.0, 1e-3, -7.0]), min_size=1, max_size=48),
       how=st.sampled_from(LAYOUTS), codec=st.sampled_from(["none", "fp16", "int8", "topk:0.25", "topk:0.5"]))
def test_the_same_values_always_encode_to_the_same_bytes(values: list[float], how: str, codec: str) -> None:
    """Ties included (top-k among equal magnitudes): the bytes depend on the values only, not on the layout
    or the copy, so a retried request carries, and digests to, exactly what the first one did."""
    base = torch.tensor(values).reshape(len(values), 1)
    t = _layout(base, how, 0)
    first = bytes(tc.encode(t, codec).payload)
    assert bytes(tc.encode(t.detach().clone(), codec).payload) == first
    assert bytes(tc.encode(t.detach().contiguous(), codec).payload) == first
    assert bytes(tc.encode(t, codec).payload) == first
    again = tc.encode(t, codec)
    assert wire.frames(None, [("", again)], 32) == wire.frames(None, [("", tc.encode(t.detach().clone(), codec))], 32)


# ---------------------------------------------------------------- codec names


@given(fraction=st.floats(1e-3, 1.0))
def test_a_codec_name_parses_back_to_the_same_codec(fraction: float) -> None:
    """A tier reports its next hop's codec by name and a run compares names: ``topk:{:g}`` rounded the
    fraction to 6 digits, so topk:0.1234567 and topk:0.1234568 were reported (and compared) alike."""
    c = tc.Codec("topk", fraction)
    assert tc.Codec.parse(c.name) == c
    assert tc.Codec("topk", 0.1).name == "topk:0.1" and tc.Codec("topk", 1.0).name == "topk:1"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("codec", ["fp16", "int8", "topk:0.5", "topk:0.75"])
def test_a_lossy_codec_gives_a_gpu_tensor_the_bytes_it_gives_on_the_cpu(codec: str) -> None:
    """On a GPU, int8's scale came out one ulp off (a division by a reciprocal), so a value halfway between two
    steps went to 127 there and to 128 here; top-k's ties may be broken either way. The same activation then
    crossed the wire as other bytes from a GPU tier than from a CPU one."""
    t = torch.cat([torch.arange(13, dtype=torch.float32) - 6.5, torch.ones(8)])
    assert bytes(tc.encode(t.cuda(), codec).payload) == bytes(tc.encode(t, codec).payload)
