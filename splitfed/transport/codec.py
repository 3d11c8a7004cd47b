"""The one tensor codec of splitfed: a tensor <-> (dtype, shape, codec, payload bytes).

Payloads are little-endian and in C order. The exact codec (``none``) sends the
tensor's own bytes: encoding returns a view (the one copy is made when the
frame is built), decoding uses the received bytes in place when they are
aligned. Lossy codecs shrink floating tensors only (integer tensors such as
labels or token ids always travel exactly):

- ``fp16``: float16 values; finite values beyond float16's range saturate at
  +-65504 (a lossy codec stays lossy; it does not turn a finite tensor into an
  infinite one), while NaN and +-inf stay as they are and the receiver refuses them;
- ``int8``: affine per tensor: float32 scale and offset, then one uint8 per value;
  finite values beyond +-INT8_MAX (a quarter of float32's range) saturate there,
  so that the span and the decoder's steps stay finite, while a NaN or +-inf
  makes the whole tensor arrive non-finite (and the receiver refuses it);
- ``topk:F``: the ceil(F * n) largest magnitudes, F taken as the decimal it was
  written as (0.07 of 100 values keeps 7: :func:`topk_count`): int32 indices (strictly
  increasing), then their values in the tensor's dtype. F is at least
  MIN_TOPK_FRACTION (0.001), wherever a codec is made (a setting, a frame's
  codec): a receiver builds the whole dense tensor from the k values it is
  sent, so this bounds what a few received bytes may make it allocate.

Lossy codecs compute on the CPU: the same values encode to the same bytes on
a GPU tier as on a CPU one.

Receivers check everything against the declared dtype, shape and codec before
using a byte, and a bool payload for bytes other than 0 and 1; a mismatch raises
:class:`~splitfed.errors.InvalidArgument`.
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
import torch

from splitfed.engine import limits
from splitfed.errors import ConfigError, InvalidArgument, ResourceExhausted

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("splitfed's wire format is little-endian; this host is big-endian")

# Received bytes objects are immutable; tensors decoded in place from them are
# only read (the tier detaches them and autograd never writes into its inputs).
# torch warns once per process about such tensors: spend that warning here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.frombuffer(b"\0", dtype=torch.uint8)

# Values of the DType enum in tier.proto (a test checks they agree).
DTYPES: dict[int, torch.dtype] = {
    1: torch.float32, 2: torch.float16, 3: torch.bfloat16, 4: torch.float64, 5: torch.int64,
    6: torch.int32, 7: torch.int16, 8: torch.int8, 9: torch.uint8, 10: torch.bool,
}
DTYPE_CODES: dict[torch.dtype, int] = {v: k for k, v in DTYPES.items()}
# Values of the CodecKind enum in tier.proto.
KINDS = {"none": 0, "fp16": 1, "int8": 2, "topk": 3}
KIND_NAMES = {v: k for k, v in KINDS.items()}
MAX_DIMS = limits.MAX_DIMS  # the engine's, so that an in-process link keeps it too
# The smallest share of its values a top-k tensor may keep, 0.1% (deep gradient compression's 99.9% sparsity,
# the sparsest in common use): k >= MIN_TOPK_FRACTION * numel. A receiver allocates the dense tensor (numel
# values) from k values of 4 + itemsize bytes each: at most itemsize / ((4 + itemsize) * MIN_TOPK_FRACTION)
# bytes per payload byte, 500 for float32. Without it one value (a frame of ~100 bytes, fraction 1e-9) made a
# tier allocate and zero its largest tensor, 512 MiB, per call, before the call's ids or shape were checked.
MIN_TOPK_FRACTION = 1e-3


@dataclass(frozen=True)
class Codec:
    """How a floating tensor is encoded on the wire; ``fraction`` is top-k's kept share."""

    kind: str = "none"
    fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown codec {self.kind!r}: use none, fp16, int8 or topk:FRACTION")
        if self.kind == "topk" and not (MIN_TOPK_FRACTION <= self.fraction <= 1.0 and math.isfinite(self.fraction)):
            raise ConfigError(f"top-k fraction must lie in [{MIN_TOPK_FRACTION:g}, 1] (a receiver builds the dense "
                              f"tensor from the values kept: at most {round(1 / MIN_TOPK_FRACTION)} values per value "
                              f"sent), got {self.fraction}")

    @classmethod
    def parse(cls, name: str | Codec | None) -> Codec:
        """``none`` | ``fp16`` | ``int8`` | ``topk:0.1``."""
        if isinstance(name, Codec):
            return name
        text = (name or "none").strip().lower()
        kind, _, arg = text.partition(":")
        if kind == "topk":
            try:
                return cls("topk", float(arg))
            except ValueError:
                raise ConfigError(f"top-k needs a fraction, e.g. topk:0.1, got {name!r}") from None
        if arg:
            raise ConfigError(f"codec {kind!r} takes no argument, got {name!r}")
        return cls(kind)

    @property
    def name(self) -> str:
        """The codec's spelling; parsing it gives this codec back (``:g`` would round a fraction to 6 digits)."""
        if self.kind != "topk":
            return self.kind
        short = f"{self.fraction:g}"
        return f"topk:{short if float(short) == self.fraction else repr(self.fraction)}"

    @property
    def code(self) -> int:
        return KINDS[self.kind]

    @property
    def lossy(self) -> bool:
        return self.kind != "none"

    def for_tensor(self, t: torch.Tensor) -> Codec:
        """The codec actually used for ``t``: lossy codecs apply to floating tensors only."""
        return self.for_dtype(t.dtype)

    def for_dtype(self, dtype: torch.dtype) -> Codec:
        return self if self.lossy and dtype.is_floating_point else NONE


NONE = Codec()


@dataclass(frozen=True)
class Encoded:
    """A tensor ready for the wire: ``payload`` is what travels (a view where possible)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    codec: Codec
    payload: memoryview

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes


def _bytes_view(t: torch.Tensor) -> memoryview:
    """The bytes of a tensor (on the CPU, in C order), without a copy where it already is."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    try:
        a = as_numpy(t)
    except RuntimeError:  # a lazily negated view (the imaginary part of a conjugate) that is contiguous: its
        a = as_numpy(t.resolve_neg())  # values, resolved here and not on every tensor's path
    return a.data.cast("B") if a.size else memoryview(b"")  # a.data: memoryview(a), the same view


# torch dtypes numpy has not, and the integer dtype of their size whose bits stand for them wherever numpy
# holds their values (a codec's payload, a Flower record's array): numpy has no bfloat16. A view as int16
# (same size) works at any stride, unlike one as uint8 (a one-element tensor may have any stride, 0 included).
AS_BITS: dict[torch.dtype, torch.dtype] = {torch.bfloat16: torch.int16}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A dense CPU tensor's elements as numpy sees them (no copy): a dtype numpy has not as its bits (AS_BITS)."""
    bits = AS_BITS.get(t.dtype)
    if bits is not None:
        t = t.view(bits)
    return t.numpy()  # as few torch calls as possible: each costs more than the rest on a step's path


@lru_cache(maxsize=64)
def topk_share(fraction: float) -> Fraction:
    """A top-k fraction as the decimal it was written as: the shortest one that reads back as this float
    (``repr``; every decimal of up to 15 significant digits is its own). Only the float travels (a frame's
    codec), so sender and receiver both get the same decimal from it."""
    return Fraction(repr(float(fraction)))


def topk_count(numel: int, fraction: float) -> int:
    """How many values top-k keeps of ``numel``: ceil(F * numel) for the decimal F (:func:`topk_share`), at
    least 1, at most all. In floats 0.07 * 100 is 7.000000000000001: topk:0.07 of 100 values kept 8."""
    if numel == 0:
        return 0
    share = topk_share(fraction)
    return min(numel, max(1, -(-numel * share.numerator // share.denominator)))


def topk_counts(numel: np.ndarray | float, fraction: float) -> np.ndarray:
    """:func:`topk_count` over counts held as floats, whole or not (the cost model prices every option at
    once): the float product is off by at most 2 ulps, so only one that close to a whole number (F * n is
    whole often: 0.1 of 1000 values) is decided exactly."""
    n = np.asarray(numel, dtype=float)
    x = n * float(fraction)
    k = np.array(np.ceil(x))  # an array even when n is one count (0-d)
    with np.errstate(invalid="ignore"):  # an infinite count: inf - inf, no whole number near it
        near = np.abs(x - np.rint(x)) <= 4 * np.spacing(np.maximum(np.abs(x), 1.0))
    if near.any():
        share = topk_share(fraction)
        exact = {v: math.ceil(share * Fraction(v)) for v in np.unique(n[near]).tolist()}
        k[near] = [exact[v] for v in n[near].tolist()]
    return np.where(n > 0, np.minimum(n, np.maximum(1.0, k)), 0.0)


def encode(t: torch.Tensor, codec: Codec | str = NONE) -> Encoded:
    codec = Codec.parse(codec).for_tensor(t)
    if t.dtype not in DTYPE_CODES:
        raise InvalidArgument(f"dtype {t.dtype} cannot travel (supported: "
                              f"{', '.join(str(d).removeprefix('torch.') for d in DTYPE_CODES)})")
    if t.layout != torch.strided:  # the wire carries dense values; torch's own error here was an INTERNAL status
        raise InvalidArgument(f"a {str(t.layout).removeprefix('torch.')} tensor cannot travel (dense tensors only: "
                              "send its .to_dense())")
    shape = tuple(t.shape)
    if len(shape) > MAX_DIMS:  # the receiver's limit, said by the sender (in-process lossy links included)
        raise InvalidArgument(f"a tensor of {len(shape)} dimensions cannot travel (at most {MAX_DIMS})")
    if codec.kind == "none":
        return Encoded(t.dtype, shape, codec, _bytes_view(t))
    if codec.kind == "topk" and t.numel() >= 2**31:  # int32 indices; refused before a value is copied
        raise InvalidArgument("top-k needs fewer than 2**31 values")
    # a lossy codec computes on the CPU, where the bytes go anyway: a GPU divides by a reciprocal (int8's
    # scale one ulp off, a value halfway between two steps rounded the other way) and breaks top-k's ties
    # its own way, so the same values would encode to other bytes on a GPU tier than on a CPU one
    flat = t.detach().reshape(-1).cpu()
    if codec.kind == "fp16":
        return Encoded(t.dtype, shape, codec, _bytes_view(_half(flat)))
    if codec.kind == "int8":
        x = flat.to(torch.float32)
        if x.numel():
            lo, hi = x.min(), x.max()
            if not float(torch.maximum(hi, -lo)) <= INT8_MAX:  # NaN, +-inf or a huge value: rare (one sync)
                x = _saturate(flat if flat.dtype == torch.float64 else x, INT8_MAX).to(torch.float32)
                lo, hi = x.min(), x.max()
        else:
            lo = hi = torch.zeros((), dtype=torch.float32)
        scale = (hi - lo) / 255.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # NaN stays NaN: the receiver refuses it
        q = torch.round((x - lo) / scale).clamp_(0, 255).to(torch.uint8)
        head = torch.stack([scale, lo]).view(torch.uint8)
        return Encoded(t.dtype, shape, codec, _bytes_view(torch.cat([head, q])))
    k = topk_count(flat.numel(), codec.fraction)
    idx = flat.abs().topk(k, sorted=False).indices.sort().values if k else flat.new_zeros(0, dtype=torch.int64)
    vals = flat[idx]
    payload = torch.cat([idx.to(torch.int32).view(torch.uint8), vals.contiguous().view(torch.uint8)])
    return Encoded(t.dtype, shape, codec, _bytes_view(payload))


FP16_MAX = float(torch.finfo(torch.float16).max)
# int8's saturation bound: with |x| <= F32_MAX / 4 the span hi - lo, x - lo and the decoder's q * scale
# (at most 255 steps of span / 255, rounded) all stay below float32's largest value.
INT8_MAX = float(torch.finfo(torch.float32).max) / 4


def _saturate(wide: torch.Tensor, bound: float) -> torch.Tensor:
    """Finite values clamped to +-``bound``; NaN and +-inf left as they are (the receiver refuses them)."""
    return torch.where(torch.isfinite(wide), wide.clamp(-bound, bound), wide)


def _half(flat: torch.Tensor) -> torch.Tensor:
    """float16 values, finite ones saturated at +-65504 (one float32 sum checks; the mask only if needed)."""
    h = flat.to(torch.float16)
    if flat.dtype == torch.float16 or math.isfinite(h.sum(dtype=torch.float32).item()):
        return h
    wide = flat if flat.dtype == torch.float64 else flat.float()  # +-65504 is not a bfloat16 value
    return _saturate(wide, FP16_MAX).to(torch.float16)


def payload_size(dtype: torch.dtype, shape: tuple[int, ...], codec: Codec) -> int:
    """The exact payload length that ``dtype``, ``shape`` and ``codec`` imply."""
    numel = math.prod(shape)
    if codec.kind == "none":
        return numel * dtype.itemsize
    if codec.kind == "fp16":
        return numel * 2
    if codec.kind == "int8":
        return 8 + numel
    return topk_count(numel, codec.fraction) * (4 + dtype.itemsize)


def check_meta(dtype_code: int, shape: list[int] | tuple[int, ...], codec: Codec, nbytes: int, *,
               max_bytes: int | None = None, what: str = "tensor") -> tuple[torch.dtype, tuple[int, ...]]:
    """Validate a declared tensor before any of its bytes are used; returns (dtype, shape).

    Too large for ``max_bytes`` (as decoded or as sent): ResourceExhausted; anything
    inconsistent, including a payload length other than the one the meta implies:
    InvalidArgument.
    """
    dtype = DTYPES.get(dtype_code)
    if dtype is None:
        raise InvalidArgument(f"{what}: unknown dtype code {dtype_code}")
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"{what}: {len(shape)} dimensions (at most {MAX_DIMS})")
    if shape and min(shape) < 0:
        raise InvalidArgument(f"{what}: negative dimension in shape {list(shape)}")
    if codec.lossy and not dtype.is_floating_point:
        raise InvalidArgument(f"{what}: codec {codec.name} applies to floating tensors, not "
                              f"{str(dtype).removeprefix('torch.')}")
    shape = tuple(map(int, shape))
    size = math.prod(shape) * dtype.itemsize
    if max_bytes is not None and max(size, nbytes) > max_bytes:
        raise ResourceExhausted(f"{what}: {max(size, nbytes)} bytes exceed the limit of {max_bytes}")
    # An empty shape passes any byte limit, but torch still multiplies its other dimensions (strides,
    # storage size) in 64 bits: [2**62, 4, 0] would fail in torch.empty, an internal error, not a refusal.
    # (With no zero dimension that product is ``size``.)
    if (size or math.prod(max(d, 1) for d in shape) * dtype.itemsize) >= 2**63:
        raise InvalidArgument(f"{what}: shape {list(shape)} is too large for a tensor (its dimensions "
                              "multiply past 2**63 bytes)")
    want = payload_size(dtype, shape, codec)
    if nbytes != want:
        raise InvalidArgument(f"{what}: payload is {nbytes} bytes, but {str(dtype).removeprefix('torch.')} "
                              f"{list(shape)} with codec {codec.name} needs {want}")
    return dtype, shape


def _as_uint8(payload: memoryview | bytes | bytearray | torch.Tensor, align: int) -> torch.Tensor:
    """A uint8 tensor over the payload: in place when aligned, else an aligned copy."""
    if isinstance(payload, torch.Tensor):
        u8 = payload.reshape(-1).view(torch.uint8)
    else:
        mv = memoryview(payload).cast("B")
        if mv.nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        u8 = torch.frombuffer(mv, dtype=torch.uint8)
    if u8.data_ptr() % align:
        u8 = u8.clone()
    return u8


def _readonly(payload: object) -> bool:
    """Whether a decoded view of ``payload`` would share memory nobody may write (a received message)."""
    return isinstance(payload, bytes) or (isinstance(payload, memoryview) and payload.readonly)


def _check_bools(raw: torch.Tensor) -> None:
    """Refuse bool bytes other than 0 and 1. Such a byte is no bool: what torch and numpy do with it is
    undefined, and the exact codec decodes in place, so the tensor would keep it, send it on (its bytes are
    what a fetch or a forward sends) and differ, byte for byte, from an equal tensor (a view as uint8, a
    checksum)."""
    bad = raw > 1
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise InvalidArgument(f"bool payload byte {i} is {int(raw[i])}: bool values travel as bytes 0 and 1 only")


def decode(dtype: torch.dtype, shape: tuple[int, ...], codec: Codec,
           payload: memoryview | bytes | bytearray | torch.Tensor, *, writable: bool = False) -> torch.Tensor:
    """Rebuild a tensor whose meta passed :func:`check_meta`.

    The exact codec returns a view of ``payload`` when it can (read-only if the
    payload is); ``writable=True`` guarantees memory the caller may modify.
    """
    n = len(payload) if not isinstance(payload, torch.Tensor) else payload.numel()
    want = payload_size(dtype, shape, codec)
    if n != want:
        raise InvalidArgument(f"payload is {n} bytes, expected {want}")
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if dtype == torch.bool:  # lossy codecs never apply to it (check_meta)
        _check_bools(_as_uint8(payload, 1))
    if codec.kind == "none":
        if not isinstance(payload, torch.Tensor):  # received bytes: one view of them as the dtype, if aligned
            t = torch.frombuffer(payload, dtype=dtype)
            if t.data_ptr() % dtype.itemsize == 0:
                return (t.clone() if writable and _readonly(payload) else t).view(shape)
        u8 = _as_uint8(payload, dtype.itemsize)
        if writable and _readonly(payload):
            u8 = u8.clone()
        return u8.view(dtype).reshape(shape)
    if codec.kind == "fp16":
        half = _as_uint8(payload, 2).view(torch.float16)
        if dtype == torch.float16:  # no conversion: the payload itself, like the exact codec's
            return (half.clone() if writable and _readonly(payload) else half).reshape(shape)
        return half.to(dtype).reshape(shape)
    if codec.kind == "int8":
        u8 = _as_uint8(payload, 4)
        scale, lo = u8[:8].view(torch.float32)
        return (u8[8:].to(torch.float32) * scale + lo).to(dtype).reshape(shape)
    u8 = _as_uint8(payload, max(4, dtype.itemsize))
    k = topk_count(numel, codec.fraction)
    idx = u8[: 4 * k].view(torch.int32).to(torch.int64)
    vals = u8[4 * k:].clone().view(dtype) if dtype.itemsize > 4 else u8[4 * k:].view(dtype)
    if k and (int(idx[0]) < 0 or int(idx[-1]) >= numel or (k > 1 and not bool((idx[1:] > idx[:-1]).all()))):
        raise InvalidArgument(f"top-k indices must be strictly increasing and lie in 0..{numel - 1}")
    out = torch.zeros(numel, dtype=dtype)
    out[idx] = vals
    return out.reshape(shape)


def roundtrip(t: torch.Tensor, codec: Codec | str) -> tuple[torch.Tensor, int]:
    """What a receiver sees of ``t`` and the payload bytes it cost: the ``Compress`` contract."""
    e = encode(t, codec)
    if not e.codec.lossy:
        return t.detach().clone(), e.nbytes
    out = decode(e.dtype, e.shape, e.codec, e.payload, writable=True)
    # fp16 of a float16 tensor converts nothing: decoded in place, ``out`` would be ``t``'s own memory, which
    # no receiver shares (a write to either changed the other), unlike every other codec here
    if out.numel() and out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
        out = out.clone()
    return out, e.nbytes
