"""What a mutation run found unpinned in the codec, the aggregation and the simulated clock: the wire's codes and
bytes, the receiver's refusals and their words, in-place decoding, top-k's counts, int8's saturation bound,
:class:`Partial`'s weights and dtypes, and the sample counts the simulated clock prices."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from splitfed.aggregate import Partial
from splitfed.errors import ConfigError, InvalidArgument, ResourceExhausted
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo
from splitfed.sim.clock import fleet_for, make_clock
from splitfed.transport import codec as tc
from splitfed.transport import wire

# ---------------------------------------------------------------- the wire's codes and bytes


def test_the_wire_codes_are_the_released_ones() -> None:
    """Tiers of another version read these numbers: a code changed on both ends here (and in the .proto) is a
    wire-format change, however consistent this process stays."""
    assert tc.DTYPES == {1: torch.float32, 2: torch.float16, 3: torch.bfloat16, 4: torch.float64, 5: torch.int64,
                         6: torch.int32, 7: torch.int16, 8: torch.int8, 9: torch.uint8, 10: torch.bool}
    assert tc.KINDS == {"none": 0, "fp16": 1, "int8": 2, "topk": 3}
    assert tc.MIN_TOPK_FRACTION == 0.001
    assert tc.NONE == tc.Codec("none", 1.0) and tc.Codec.parse("none") == tc.NONE


# One frame per tensor, as built today: dtype code, shape, codec kind (and top-k's fraction), payload, padding.
GOLDEN = [
    (torch.tensor([1.0, -2.0]), "none",
     "220a0a017810011a0102280872007a100000803f000000c00000000000000000"),
    (torch.tensor([1.0, -2.0]), "fp16",
     "220e0a017810011a0102220208012804720c0000000000000000000000007a10003c00c0000000000000000000000000"),
    (torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), "int8",
     "220e0a017810041a010322020802280b720c0000000000000000000000007a108180003c00000000007fff0000000000"),
    (torch.tensor([0.5, -3.0, 1.0, 0.25], dtype=torch.bfloat16), "topk:0.5",
     "22170a017810031a0104220b080311000000000000e03f280c72030000007a10010000000200000040c0803f00000000"),
    (torch.tensor([[True, False]]), "fp16",  # a lossy codec never applies to a bool tensor: it travels exactly
     "220b0a0178100a1a0201022802720f0000000000000000000000000000007a1001000000000000000000000000000000"),
    (torch.tensor([7, -1], dtype=torch.int16), "none",
     "220a0a017810071a0102280472007a100700ffff000000000000000000000000"),
]


@pytest.mark.parametrize(("t", "codec", "hexed"), GOLDEN)
def test_golden_frames(t: torch.Tensor, codec: str, hexed: str) -> None:
    (frame,) = wire.frames(None, [("x", tc.encode(t, codec))], 1 << 20)
    assert bytes(frame).hex() == hexed
    _, (got,) = wire.read_all([bytes.fromhex(hexed)], None, wire.Limits())
    want, _ = tc.roundtrip(t, codec)
    assert got.name == "x" and got.tensor.dtype == t.dtype and torch.equal(got.tensor, want)


# ---------------------------------------------------------------- refusals


def test_topk_of_2_31_values_is_refused_before_any_value_is_read() -> None:
    """int32 indices: 2**31 values cannot travel as top-k (a meta tensor: the check needs no memory)."""
    t = torch.empty(2**31, dtype=torch.float16, device="meta")
    with pytest.raises(InvalidArgument, match=r"top-k needs fewer than 2\*\*31 values"):
        tc.encode(t, "topk:0.001")


@pytest.mark.parametrize("shape", [[-1], [3, -2], [0, -1, 4]])
def test_a_negative_dimension_is_refused_naming_it(shape: list[int]) -> None:
    with pytest.raises(InvalidArgument, match=r"^in: negative dimension in shape"):
        tc.check_meta(1, shape, tc.NONE, 0, what="in")


@pytest.mark.parametrize("codec", ["fp16", "int8", "topk:0.5"])
@pytest.mark.parametrize("code", [5, 6, 7, 8, 9, 10])
def test_a_lossy_codec_on_an_integer_tensor_is_refused_even_at_its_payload_size(codec: str, code: int) -> None:
    """The payload length of the lossy codec (8 bytes of fp16 for 4 values) must not make it pass."""
    c = tc.Codec.parse(codec)
    nbytes = tc.payload_size(torch.float32, (4,), c) if c.kind != "topk" else 2 * (4 + tc.DTYPES[code].itemsize)
    with pytest.raises(InvalidArgument, match=f"codec {c.name} applies to floating tensors, not"):
        tc.check_meta(code, [4], c, nbytes)


def test_the_decoded_size_counts_against_the_limit_not_only_the_bytes_sent() -> None:
    """topk:0.001 of 1000 float32 values: 8 bytes sent, 4000 bytes decoded."""
    c = tc.Codec.parse("topk:0.001")
    assert tc.check_meta(1, [1000], c, 8, max_bytes=4000) == (torch.float32, (1000,))
    with pytest.raises(ResourceExhausted, match="4000 bytes exceed the limit of 3999"):
        tc.check_meta(1, [1000], c, 8, max_bytes=3999)
    with pytest.raises(ResourceExhausted, match="8000 bytes exceed"):
        tc.check_meta(4, [1000], tc.Codec.parse("topk:0.001"), 12, max_bytes=7999)


def test_an_empty_shape_just_under_2_63_bytes_is_decoded() -> None:
    """The overflow bound multiplies the non-zero dimensions only: [2**62, 0] of bytes is an empty tensor."""
    assert tc.check_meta(9, [2**62, 0], tc.NONE, 0) == (torch.uint8, (2**62, 0))
    assert tuple(tc.decode(torch.uint8, (2**62, 0), tc.NONE, b"").shape) == (2**62, 0)
    with pytest.raises(InvalidArgument, match="too large"):
        tc.check_meta(9, [2**63, 0], tc.NONE, 0)


@pytest.mark.parametrize(("raw", "where", "value"), [(b"\x02", 0, 2), (b"\x01\x00\x02", 2, 2), (b"\x00\xff", 1, 255),
                                                     (b"\x01\x03\x00\x00", 1, 3)])
def test_a_bool_byte_other_than_0_or_1_is_refused_naming_it(raw: bytes, where: int, value: int) -> None:
    for payload in (raw, bytearray(raw), memoryview(raw), torch.frombuffer(bytearray(raw), dtype=torch.uint8)):
        with pytest.raises(InvalidArgument, match=f"bool payload byte {where} is {value}: bool values travel"):
            tc.decode(torch.bool, (len(raw),), tc.NONE, payload)
    assert tc.decode(torch.bool, (3,), tc.NONE, b"\x01\x00\x01").tolist() == [True, False, True]


@pytest.mark.parametrize("name", ["topk", "topk:", " TOPK "])
def test_topk_without_a_fraction_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="top-k needs a fraction, e.g. topk:0.1"):
        tc.Codec.parse(name)


@pytest.mark.parametrize("name", ["fp16:1", "int8:0.5", "none:x"])
def test_a_codec_that_takes_no_argument_refuses_one(name: str) -> None:
    with pytest.raises(ConfigError, match="takes no argument"):
        tc.Codec.parse(name)


def test_codecs_and_encoded_tensors_are_values() -> None:
    """A codec is a setting shared by every link of a run (and a cache key): equal ones hash alike, none
    changes under its users."""
    c = tc.Codec.parse("topk:0.1")
    assert hash(c) == hash(tc.Codec("topk", 0.1)) and len({c, tc.Codec("topk", 0.1), tc.NONE}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.fraction = 0.5  # type: ignore[misc]
    e = tc.encode(torch.ones(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.codec = c  # type: ignore[misc]


# ---------------------------------------------------------------- decoding in place, or into memory of its own


def _aligned(n: int, offset: int = 0) -> tuple[np.ndarray, int]:
    """``n`` bytes at ``offset`` from a 64-byte boundary, and their address."""
    base = np.zeros(n + offset + 64, dtype=np.uint8)
    start = (-base.ctypes.data) % 64 + offset
    a = base[start:start + n]
    return a, a.ctypes.data


def test_the_exact_codec_decodes_a_received_message_in_place_unless_asked_for_memory_of_its_own() -> None:
    a, addr = _aligned(16)
    a[:] = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), np.uint8)
    ro = a.data.toreadonly()
    t = tc.decode(torch.float32, (2, 2), tc.NONE, ro)  # the default: a view, read-only like the message
    assert t.data_ptr() == addr and t.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    w = tc.decode(torch.float32, (2, 2), tc.NONE, ro, writable=True)
    assert w.data_ptr() != addr
    msg = np.arange(4, dtype=np.float32).tobytes()
    w = tc.decode(torch.float32, (4,), tc.NONE, msg, writable=True)
    w.add_(1)  # must not write into the immutable message
    assert np.frombuffer(msg, np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert tc.decode(torch.float32, (4,), tc.NONE, msg).tolist() == [0.0, 1.0, 2.0, 3.0]
    # fp16 of a float16 tensor converts nothing: the same, in place unless asked for memory of its own
    a[:8] = np.frombuffer(np.array([1.0, -2.0, 0.5, 4.0], np.float16).tobytes(), np.uint8)
    h = tc.decode(torch.float16, (4,), tc.Codec.parse("fp16"), a[:8].data.toreadonly())
    assert h.data_ptr() == addr and h.tolist() == [1.0, -2.0, 0.5, 4.0]
    assert tc.decode(torch.float16, (4,), tc.Codec.parse("fp16"), a[:8].data.toreadonly(), writable=True).data_ptr() != addr


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int16, torch.float16])
def test_a_misaligned_payload_is_decoded_into_aligned_memory(dtype: torch.dtype) -> None:
    values = torch.arange(5).to(dtype)
    raw = values.view(torch.uint8).numpy().tobytes()
    for offset in range(1, dtype.itemsize):
        a, addr = _aligned(len(raw), offset)
        a[:] = np.frombuffer(raw, np.uint8)
        t = tc.decode(dtype, (5,), tc.NONE, a.data)
        assert t.data_ptr() % dtype.itemsize == 0 and torch.equal(t, values)


def test_a_tensor_payload_is_decoded_in_place() -> None:
    """A payload already in a tensor (one that came in pieces, assembled in the reader's own memory) is used in
    place, ``writable`` or not: float32 bits, and fp16 of a float16 tensor, which converts nothing, at every even
    offset. A copy would double the memory of a tensor of up to 512 MiB."""
    buf = torch.zeros(64, dtype=torch.uint8)
    fp16 = tc.Codec.parse("fp16")
    for writable in (False, True):
        buf[:16] = torch.arange(4, dtype=torch.float32).view(torch.uint8)
        t = tc.decode(torch.float32, (4,), tc.NONE, buf[:16], writable=writable)
        assert t.data_ptr() == buf.data_ptr() and t.tolist() == [0.0, 1.0, 2.0, 3.0]
        for offset in (0, 2, 4, 6, 8, 10):
            part = buf[offset:offset + 8]
            part.copy_(torch.tensor([1.0, -2.0, 0.5, 4.0], dtype=torch.float16).view(torch.uint8))
            h = tc.decode(torch.float16, (2, 2), fp16, part, writable=writable)
            assert h.data_ptr() == part.data_ptr() and h.tolist() == [[1.0, -2.0], [0.5, 4.0]]


# ---------------------------------------------------------------- what lossy codecs keep


def test_int8_saturates_a_huge_negative_value_at_minus_int8_max() -> None:
    """The bound holds on both sides: lo = -3e38 with hi = 0 saturates at -F32_MAX / 4, exactly."""
    f32_max = float(torch.finfo(torch.float32).max)
    for dtype in (torch.float32, torch.float64):
        got, nbytes = tc.roundtrip(torch.tensor([-3e38, 0.0], dtype=dtype), "int8")
        assert nbytes == 10 and got.dtype == dtype
        assert got[0].item() == -f32_max / 4 and got[1].item() == 0.0
        got, _ = tc.roundtrip(torch.tensor([-1e38, 2e37], dtype=dtype), "int8")  # span 1.2e38 < F32_MAX...
        assert got[0].item() == -f32_max / 4  # ...but still saturated: it is |x|, not the span, that is bound


@pytest.mark.parametrize(("n", "fraction", "k"), [(100, 0.07, 7), (1000, 0.1, 100), (300, 0.07, 21),
                                                  (10, 0.3, 3), (1000, 0.001, 1), (7, 0.5, 4), (2, 0.001, 1)])
def test_topk_counts_of_whole_counts_are_the_decimal_ceilings(n: int, fraction: float, k: int) -> None:
    assert tc.topk_count(n, fraction) == k
    assert tc.topk_counts(np.array([float(n)]), fraction).tolist() == [k]
    assert float(tc.topk_counts(float(n), fraction)) == k


@given(st.integers(1, 10**7), st.integers(1, 1000).map(lambda m: m / 1000))
def test_topk_counts_agree_with_topk_count(n: int, fraction: float) -> None:
    want = min(n, max(1, math.ceil(Fraction(repr(fraction)) * n)))
    assert tc.topk_count(n, fraction) == want
    assert tc.topk_counts(np.array([float(n), 0.0]), fraction).tolist() == [want, 0.0]


# ---------------------------------------------------------------- Partial: weights, chaining, dtypes


def test_add_and_merge_give_the_partial_back_for_chaining() -> None:
    p = Partial()
    assert p.add({"w": torch.tensor([1.0])}, 2) is p
    assert p.add({"w": torch.tensor([9.0])}, 0) is p  # a zero weight adds nothing, and still chains
    q = Partial().add({"w": torch.tensor([4.0])}, 1)
    assert p.merge(q) is p
    assert p.mean()["w"].tolist() == [2.0] and p.weights == {"w": 3.0}


@pytest.mark.parametrize("w", [-1.0, -1e-12, math.nan, math.inf, -math.inf])
def test_add_refuses_a_weight_that_is_no_sample_count_and_changes_nothing(w: float) -> None:
    p = Partial().add({"w": torch.tensor([1.0])}, 2)
    with pytest.raises(InvalidArgument, match=r"contribution weight must be a finite number >= 0, got"):
        p.add({"w": torch.tensor([5.0]), "v": torch.tensor([1.0])}, w)
    assert p.weights == {"w": 2.0} and set(p.sums) == {"w"} and p.sums["w"].tolist() == [2.0]


def test_of_means_takes_any_finite_positive_weight() -> None:
    p = Partial.of_means({"w": torch.tensor([2.0, 4.0])}, {"w": 0.5})
    assert p.weights == {"w": 0.5} and p.sums["w"].tolist() == [1.0, 2.0]
    p.add({"w": torch.tensor([5.0, 8.0])}, 1.5)
    assert p.mean()["w"].tolist() == [4.25, 7.0]
    for w in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(InvalidArgument, match="needs a finite weight > 0"):
            Partial.of_means({"w": torch.tensor([1.0])}, {"w": w})


def test_a_mean_of_unknown_dtype_takes_the_previous_keys_or_float32() -> None:
    """Means summed without their dtypes (``of_means`` without ``dtypes``): the previous state's dtype, float32
    where there is none."""
    p = Partial.of_means({"w": torch.tensor([1.25]), "n": torch.tensor([2.6])}, {"w": 2.0, "n": 2.0})
    out = p.mean()
    assert out["w"].dtype == torch.float32 and out["w"].tolist() == [1.25]
    prev = {"w": torch.zeros(1, dtype=torch.float64), "n": torch.zeros(1, dtype=torch.int64), "x": torch.ones(1)}
    out = p.mean(prev)
    assert out["w"].dtype == torch.float64 and out["w"].tolist() == [1.25]
    assert out["n"].dtype == torch.int64 and out["n"].tolist() == [3]  # an integer buffer: its rounded mean
    assert out["x"] is prev["x"]
    out = p.mean({"x": torch.ones(1, dtype=torch.float64)})  # previous without the summed keys
    assert out["w"].dtype == torch.float32 and out["n"].dtype == torch.float32


# ---------------------------------------------------------------- the simulated clock's sample counts


_SETTINGS = RunSettings(clients=2, model="mlp", dataset="synthetic")


def test_the_clock_prices_each_clients_own_sample_count() -> None:
    """A client's real sample count sets its round's time; 0 (unknown) takes its device's count from the fleet."""
    fleet = fleet_for(_SETTINGS)
    clock = make_clock(_SETTINGS, fleet)
    c = fleet.clients[0]

    def time_of(samples: int) -> float:
        t = clock(1, {"client0": (1, 2)}, [ClientInfo("client0", 0, 0, profile=c.name, samples=samples)], {})
        assert t is not None
        return t

    few, many = time_of(8), time_of(80_000)
    assert 0 < few < many
    assert time_of(0) == time_of(fleet.at_round(1).client(c.name).samples)
