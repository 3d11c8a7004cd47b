"""The codec's bfloat16-as-int16 rule known in one place, and top-k's count of the decimal fraction written.

1. numpy has no bfloat16: a codec payload and a Flower record both carry its bits as int16. The rule lives in
   :data:`splitfed.transport.codec.AS_BITS`, which records.py reads; neither the codec's bytes nor a
   record's changed with the move (checked against the rule computed here).
2. ``topk:0.07`` of 100 values kept 8: ceil(0.07 * 100) in floats is ceil(7.000000000000001). The count is
   now ceil of the decimal written (7), in :func:`~splitfed.transport.codec.topk_count`, which sender,
   receiver (payload sizes) and the cost model's ``payload_size`` all read.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from splitfed.errors import InvalidArgument
from splitfed.flower import records
from splitfed.transport import codec as tc

ROOT = Path(__file__).resolve().parents[1]


def _tensors() -> list[torch.Tensor]:
    """Every dtype the wire carries, in the layouts a state or a boundary has (0-d, empty, strided, expanded)."""
    g = torch.Generator().manual_seed(25)
    out = []
    for d in tc.DTYPE_CODES:
        base = (torch.randn(3, 4, generator=g) * 50).to(d) if d.is_floating_point else \
            torch.randint(0, 2 if d == torch.bool else 100, (3, 4), generator=g).to(d)
        out += [base, base.t(), base[0, 1].clone(), base[:0], base[:1, :1].expand(2, 3)]
    return out


def _array_fields(a: object) -> tuple[object, ...]:
    return (a.dtype, tuple(a.shape), a.stype, bytes(a.data))  # type: ignore[attr-defined]


def test_bfloat16_travels_as_int16_bits_by_one_rule() -> None:
    """records.py takes the rule from the codec: one entry, read by both."""
    assert tc.AS_BITS == {torch.bfloat16: torch.int16}
    assert records._AS_BITS == {"bfloat16": (torch.bfloat16, torch.int16)}
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert tc.as_numpy(t).dtype == np.int16 and records._array(t).dtype == "bfloat16"


@pytest.mark.parametrize("codec", ["none", "fp16", "int8"])
def test_codec_bytes_are_the_raw_memory_and_decode_back(codec: str) -> None:
    """Every dtype's exact payload is the tensor's own little-endian bytes (bfloat16's: its bits), and every
    payload decodes back to the tensor (exact codec) or its dtype and shape."""
    for t in _tensors():
        e = tc.encode(t, codec)
        if e.codec.kind == "none":
            assert bytes(e.payload) == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        back = tc.decode(e.dtype, e.shape, e.codec, bytes(e.payload))
        assert back.dtype == t.dtype and back.shape == t.shape
        if e.codec.kind == "none":
            assert torch.equal(back, t)


def test_records_hold_numpys_arrays_or_the_bits_and_round_trip() -> None:
    """A state's record holds each tensor as numpy has it (bfloat16: its int16 bits under its own name, the
    rule computed here, not read off the codec), and reads back to the same tensors, bits included."""
    state = {f"k{i}": t for i, t in enumerate(_tensors())}
    rec = records.state_to_record(state)
    assert sorted(rec) == sorted(state)
    for k, t in state.items():
        if t.dtype == torch.bfloat16:
            want = records.Array(np.array(t.view(torch.int16).numpy(), order="C"))
            assert rec[k].dtype == "bfloat16" and tuple(rec[k].shape) == tuple(t.shape)
            assert bytes(rec[k].data) == bytes(want.data)
        else:
            assert _array_fields(rec[k]) == _array_fields(records.Array(np.array(t.numpy(), order="C"))), k
    back = records.record_to_state(rec)
    for k, t in state.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k


def test_top_k_of_0_07_keeps_7_of_100() -> None:
    """0.07 * 100 is 7.000000000000001 in floats: the sender kept 8 values, 64 bytes, and the receiver
    expected them; 7 values (56 bytes) is what topk:0.07 says, and a payload of 8 is refused."""
    c = tc.Codec.parse("topk:0.07")
    assert tc.topk_count(100, c.fraction) == 7
    assert tc.payload_size(torch.float32, (100,), c) == 7 * 8
    out, sent = tc.roundtrip(torch.arange(1.0, 101.0), c)
    assert sent == 56 and torch.equal(out.nonzero().flatten(), torch.arange(93, 100))
    with pytest.raises(InvalidArgument, match="needs 56"):
        tc.check_meta(tc.DTYPE_CODES[torch.float32], [100], c, 64)


def _decimals() -> st.SearchStrategy[str]:
    """Short decimals in (0, 1]: 0.d...d with 1 to 7 places, or 1."""
    return st.integers(1, 7).flatmap(lambda places: st.integers(1, 10**places).map(
        lambda m: "1" if m == 10**places else f"0.{m:0{places}d}"))


@st.composite
def _counts(draw: st.DrawFn) -> tuple[str, int]:
    """A fraction and a count; the count often a multiple of the fraction's denominator, where F * n is whole
    and the float product may land just above it."""
    f = draw(_decimals())
    den = Fraction(f).denominator
    n = draw(st.one_of(st.integers(1, 10**6), st.integers(1, max(1, 10**6 // den)).map(lambda j: j * den)))
    return f, n


@given(_counts())
@example(("0.07", 100))
@example(("0.3", 10))
def test_top_k_count_is_the_ceiling_of_the_decimal_written(case: tuple[str, int]) -> None:
    f, n = case
    want = min(n, max(1, math.ceil(Fraction(f) * n)))
    assert tc.topk_count(n, float(f)) == want
    assert float(tc.topk_counts(float(n), float(f))) == want  # the cost model's, on counts held as floats
    assert tc.topk_counts(np.array([n, n, 0.0]), float(f)).tolist() == [want, want, 0]
    if Fraction(f) >= Fraction(tc.MIN_TOPK_FRACTION):  # what a codec may be: its payload, sent and expected
        c = tc.Codec.parse(f"topk:{f}")
        assert tc.payload_size(torch.float32, (n,), c) == want * 8
        assert tc.Codec.parse(c.name) == c


@given(_decimals(), st.floats(0, 1e7, allow_nan=False))
@example("0.07", 100.0)
@example("0.25", 4.000000000000001)
def test_top_k_counts_of_counts_that_are_not_whole(f: str, n: float) -> None:
    """The cost model's counts need not be whole (bytes per sample over a value's size): the same rule,
    exact in the float count too."""
    want = min(n, max(1, math.ceil(Fraction(f) * Fraction(n)))) if n > 0 else 0
    assert float(tc.topk_counts(n, float(f))) == want


def test_top_k_counts_keep_what_is_no_count() -> None:
    """None, negative or NaN: nothing kept; infinite: infinitely many (as the cost model had it)."""
    out = tc.topk_counts(np.array([[0.0, -3.0], [math.nan, math.inf]]), 0.5)
    assert out.shape == (2, 2) and out.tolist() == [[0.0, 0.0], [0.0, math.inf]]
