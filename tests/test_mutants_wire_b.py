"""Frames of a call on the wire (splitfed/transport/wire.py, framing and decoding): what a real encode
produces (how tensors and metas are cut into frames of ``chunk_bytes``), and what the decoder makes of
hand-built protobuf bytes (each wire type, varint bounds, the refusals and their words). Messages are
checked against the generated ``pb.Frame`` code, never against wire.py's own parser."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitfed.errors import InvalidArgument, ResourceExhausted
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.pb import pb

LIMITS = wire.Limits(chunk_bytes=4096, unary_bytes=4096, max_tensor_bytes=1 << 20, max_call_bytes=1 << 22)


def _uv(n: int) -> bytes:
    """A protobuf varint, written here independently of wire.py."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(num: int, wt: int) -> bytes:
    return _uv((num << 3) | wt)


def _ld(num: int, payload: bytes) -> bytes:
    return _key(num, 2) + _uv(len(payload)) + payload


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _structure(msgs: list[bytes]) -> list[tuple[bool, list[str], int]]:
    """Per message (parsed by the generated code): has a head, the tensor names it declares, its data bytes."""
    out = []
    for m in msgs:
        f = pb.Frame.FromString(m)
        out.append((f.HasField("step"), [t.name for t in f.tensors], len(f.data)))
    return out


def _meta_len(name: str, numel: int) -> int:
    """The bytes of a float32 tensor's meta field in a message (by the generated code)."""
    meta = pb.TensorMeta(name=name, dtype=cast(pb.DType, tc.DTYPE_CODES[torch.float32]), shape=[numel],
                         nbytes=4 * numel)
    return len(pb.Frame(tensors=[meta]).SerializeToString())


def _f32(n: int, seed: int = 0) -> tc.Encoded:
    return tc.encode(torch.arange(n, dtype=torch.float32) + seed)


# ---- decoder: hand-built frames -------------------------------------------------------------------------

def test_unknown_fields_of_every_wire_type_are_skipped_exactly() -> None:
    """Unknown fields of wire types 0, 1, 5 and 2 (and a field number needing a two-byte key) are skipped by
    their exact widths; a 128-byte data field (a two-byte length) is returned in place, byte for byte."""
    data = bytes(range(128))
    meta = pb.TensorMeta(name="xyz").SerializeToString()
    raw = (_key(7, 0) + _uv(300) + _key(8, 1) + bytes(range(1, 9)) + _key(9, 5) + b"\x81\x82\x83\x84"
           + _key(16, 0) + b"\x05" + _key(17, 1) + b"\x07" * 8 + _key(18, 5) + b"\x05" * 4
           + _ld(10, b"abc") + _ld(wire.F_TENSOR, meta) + _ld(wire.F_DATA, data) + _key(11, 5) + bytes(4))
    assert _key(16, 0) == b"\x80\x01"  # the first byte of a two-byte key is 0x80 exactly
    fields, got = wire.parse_frame(raw)
    assert {k: [bytes(s) for s in v] for k, v in fields.items()} == {wire.F_TENSOR: [meta]}
    assert got is not None and bytes(got) == data
    want = pb.Frame.FromString(raw)  # the generated code agrees
    assert want.data == data and [t.name for t in want.tensors] == ["xyz"]


@pytest.mark.parametrize("wt,width", [(1, 8), (5, 4)])
def test_a_fixed_width_field_is_skipped_by_its_width(wt: int, width: int) -> None:
    for extra in range(0, 3):  # a field right after it is read at the right offset
        raw = _key(6, wt) + bytes([0x22] * width) + _ld(wire.F_TENSOR, b"m" * (extra + 1))
        fields, data = wire.parse_frame(raw)
        assert [bytes(s) for s in fields[wire.F_TENSOR]] == [b"m" * (extra + 1)] and data is None


@pytest.mark.parametrize("wt", [3, 4, 6, 7])
def test_an_unsupported_wire_type_is_refused(wt: int) -> None:
    raw = _key(6, wt) + bytes(12) + _ld(wire.F_TENSOR, b"x")
    with pytest.raises(InvalidArgument, match=f"^malformed frame: unsupported wire type {wt}$"):
        wire.parse_frame(raw)
    with pytest.raises(InvalidArgument, match=f"^call: malformed frame: unsupported wire type {wt}$"):
        wire.read_all([raw], None, LIMITS)


@pytest.mark.parametrize("num", [wire.F_STEP, wire.F_LOAD, wire.F_RESULT, wire.F_TENSOR, wire.F_REDUCE,
                                 wire.F_PAD, wire.F_DATA])
@pytest.mark.parametrize("wt,body", [(0, b"\x01"), (1, bytes(8)), (5, bytes(4))])
def test_a_known_field_with_another_wire_type_is_refused(num: int, wt: int, body: bytes) -> None:
    raw = _key(num, wt) + body
    with pytest.raises(InvalidArgument, match=f"^malformed frame: field {num} has wire type {wt}$"):
        wire.parse_frame(raw)


@pytest.mark.parametrize("wt,have", [(1, 0), (1, 7), (5, 0), (5, 3)])
def test_a_fixed_width_field_cut_short_is_truncated(wt: int, have: int) -> None:
    raw = _ld(wire.F_TENSOR, b"x") + _key(6, wt) + bytes(have)
    with pytest.raises(InvalidArgument, match="^malformed frame: truncated$"):
        wire.parse_frame(raw)


def test_varints_of_ten_bytes_pass_and_longer_ones_are_refused() -> None:
    ten = b"\x80" * 9 + b"\x01"  # 1 << 63: the longest varint protobuf writes
    fields, _ = wire.parse_frame(_key(6, 0) + ten + _ld(wire.F_TENSOR, b"x"))
    assert [bytes(s) for s in fields[wire.F_TENSOR]] == [b"x"]
    for raw in (_key(6, 0) + b"\x80" * 10 + b"\x01", b"\x80" * 10 + b"\x01" + b"\x00",
                _key(6, 0) + b"\xff" * 11 + b"\x00"):
        with pytest.raises(InvalidArgument, match="^malformed frame: varint longer than 10 bytes$"):
            wire.parse_frame(raw)


@pytest.mark.parametrize("raw", [_key(6, 2), _ld(wire.F_TENSOR, b"x") + _key(wire.F_DATA, 2),
                                 _key(6, 2) + b"\x80", _key(6, 0), b"\x80"])
def test_a_frame_ending_inside_a_varint_is_truncated(raw: bytes) -> None:
    """A message that ends right after a key (or inside a length or key varint) is INVALID_ARGUMENT, never an
    IndexError (an INTERNAL error on a tier)."""
    with pytest.raises(InvalidArgument, match="^malformed frame: truncated varint$"):
        wire.parse_frame(raw)
    with pytest.raises(InvalidArgument, match="^call: malformed frame: truncated varint$"):
        wire.read_all([raw], None, LIMITS)


def test_a_frame_as_a_memoryview_of_another_format_parses_as_its_bytes() -> None:
    """``parse_frame`` and ``Reader.feed`` take a memoryview: one of 4-byte items is read as its bytes."""
    t = torch.arange(12, dtype=torch.float32)
    (msg,) = wire.frames(None, [("w", tc.encode(t))], 4096)
    assert len(msg) % 8 == 0
    for fmt in ("I", "Q"):
        mv = memoryview(msg).cast(fmt)
        fields, data = wire.parse_frame(mv)
        assert [bytes(s) for s in fields[wire.F_TENSOR]] == [bytes(s) for s in wire.parse_frame(msg)[0][4]]
        assert data is not None and bytes(data) == _raw(t)
        _, got = wire.read_all([mv], None, LIMITS)
        assert [r.name for r in got] == ["w"] and torch.equal(got[0].tensor, t)


@pytest.mark.parametrize("bad", ["a frame", 42, None, [b"\x00"]])
def test_a_frame_that_is_not_bytes_is_invalid_argument(bad: object) -> None:
    r = wire.Reader(None, LIMITS, what="step")
    with pytest.raises(InvalidArgument, match="^step: frame is not bytes$"):
        r.feed(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="^call: frame is not bytes$"):
        wire.read_all([bad], None, LIMITS)  # type: ignore[list-item]


# ---- Reader -----------------------------------------------------------------------------------------------

def test_max_frames_allows_exactly_that_many_messages() -> None:
    limits = wire.Limits(chunk_bytes=16, max_frames=3)
    three = wire.frames(None, [("a", _f32(12))], 16)  # 48 bytes: 3 frames of 16
    four = wire.frames(None, [("a", _f32(16))], 16)
    assert len(three) == 3 and len(four) == 4
    _, got = wire.read_all(three, None, limits)
    assert torch.equal(got[0].tensor, torch.arange(12, dtype=torch.float32))
    with pytest.raises(ResourceExhausted, match="^call: more than 3 messages$"):
        wire.read_all(four, None, limits)


def test_a_header_after_the_first_frame_names_its_frame_number() -> None:
    head = pb.StepHeader(run_id="r", client_id="c")
    msgs = wire.frames(head, [("a", _f32(8))], 16)
    assert len(msgs) == 2
    for k in (1, 2):  # the header again in frame k
        late = msgs[:k] + [wire.frames(head, [], 16)[0]]
        with pytest.raises(InvalidArgument, match=rf"^call: unexpected header field\(s\) \[1\] in frame {k}$"):
            wire.read_all(late, wire.F_STEP, LIMITS)


def test_the_call_limit_counts_the_decoded_size_of_a_compressed_tensor() -> None:
    """An fp16 float32 tensor travels in half its bytes but declares its full size against max_call_bytes."""
    t = torch.arange(8, dtype=torch.float32)
    e = tc.encode(t, tc.Codec("fp16"))
    assert e.nbytes == 16 and t.nbytes == 32
    msgs = wire.frames(None, [("h", e)], 4096)
    _, got = wire.read_all(msgs, None, wire.Limits(max_call_bytes=32))
    assert torch.equal(got[0].tensor, t) and got[0].nbytes == 16
    with pytest.raises(ResourceExhausted, match="^call: tensors exceed the limit of 31 bytes$"):
        wire.read_all(msgs, None, wire.Limits(max_call_bytes=31))
    # two plain ones: the sum of their bytes, equal to the limit, passes
    two = wire.frames(None, [("a", _f32(4)), ("b", _f32(4))], 4096)
    assert len(wire.read_all(two, None, wire.Limits(max_call_bytes=32))[1]) == 2
    with pytest.raises(ResourceExhausted, match="limit of 31 bytes"):
        wire.read_all(two, None, wire.Limits(max_call_bytes=31))


def test_a_header_in_several_fields_of_one_frame_merges() -> None:
    """Several occurrences of a message field merge, as protobuf says (here two and three)."""
    parts = [pb.StepHeader(run_id="run"), pb.StepHeader(client_id="cli"), pb.StepHeader(seq=7)]
    for k in (2, 3):
        raw = b"".join(_ld(wire.F_STEP, p.SerializeToString()) for p in parts[:k])
        want = pb.Frame.FromString(raw).step
        head, _ = wire.read_all([raw], wire.F_STEP, LIMITS)
        assert head == want and isinstance(head, pb.StepHeader)
        assert (head.run_id, head.client_id, head.seq) == ("run", "cli", 7 if k == 3 else 0)


@pytest.mark.parametrize("chunk", [16, 32, 4096])
def test_empty_tensors_between_and_after_others_arrive_in_order(chunk: int) -> None:
    ts = [("a", torch.arange(3, dtype=torch.float32)), ("e1", torch.zeros(0)), ("b", torch.arange(5.0)),
          ("e2", torch.zeros(2, 0)), ("e3", torch.zeros(0, dtype=torch.uint8)),
          ("c", torch.tensor([1], dtype=torch.uint8)), ("e4", torch.zeros(0))]
    msgs = wire.frames(None, [(n, tc.encode(t)) for n, t in ts], chunk)
    _, got = wire.read_all(msgs, None, LIMITS)
    assert [r.name for r in got] == [n for n, _ in ts]
    for r, (_, t) in zip(got, ts, strict=True):
        assert r.tensor.dtype == t.dtype and r.tensor.shape == t.shape and torch.equal(r.tensor, t)


def test_read_all_decodes_in_place_unless_asked_for_writable_memory() -> None:
    """By default a tensor is a view of the received message (no copy); ``writable=True`` copies it."""
    t = torch.arange(64, dtype=torch.float32)
    (msg,) = wire.frames(None, [("w", tc.encode(t))], 4096)
    lo = np.frombuffer(msg, np.uint8).ctypes.data
    _, (r,) = wire.read_all([msg], None, LIMITS)
    assert lo <= r.tensor.data_ptr() < lo + len(msg) and torch.equal(r.tensor, t)
    _, (w,) = wire.read_all([msg], None, LIMITS, writable=True)
    assert not lo <= w.tensor.data_ptr() < lo + len(msg) and torch.equal(w.tensor, t)
    w.tensor += 1  # its own memory
    assert bytes(msg) == wire.frames(None, [("w", tc.encode(t))], 4096)[0]


# ---- encoder ----------------------------------------------------------------------------------------------

def test_a_payload_viewed_as_wider_items_travels_as_its_bytes() -> None:
    """An ``Encoded`` built by hand over a memoryview of float32 items (not bytes) is framed by its bytes."""
    a = np.arange(10, dtype=np.float32)
    e = tc.Encoded(torch.float32, (2, 5), tc.NONE, memoryview(a))
    assert e.payload.format == "f" and e.nbytes == 40
    for chunk in (16, 24, 4096):
        msgs = wire.frames(None, [("w", e), ("u", _f32(3))], chunk)
        assert all(len(pb.Frame.FromString(m).data) <= chunk for m in msgs)
        assert b"".join(pb.Frame.FromString(m).data for m in msgs) == a.tobytes() + bytes(8) + _raw(
            torch.arange(3, dtype=torch.float32)) + bytes(4)
        _, got = wire.read_all(msgs, None, LIMITS)
        assert torch.equal(got[0].tensor, torch.from_numpy(a).view(2, 5))
        assert torch.equal(got[1].tensor, torch.arange(3, dtype=torch.float32))


def test_an_empty_call_is_one_empty_message() -> None:
    assert wire.frames(None, [], 16) == [b""]
    head = pb.StepHeader(run_id="r")
    assert wire.frames(head, [], 16) == [_ld(wire.F_STEP, head.SerializeToString())]
    assert wire.read_all(wire.frames(None, [], 16), None, LIMITS) == (None, [])


def test_a_tensor_of_exactly_one_chunk_is_one_message() -> None:
    for head in (None, pb.StepHeader(run_id="r")):
        msgs = wire.frames(head, [("a", _f32(8))], 32)
        assert _structure(msgs) == [(head is not None, ["a"], 32)]
        msgs = wire.frames(head, [("a", _f32(8)), ("b", _f32(8))], 32)
        assert _structure(msgs) == [(head is not None, ["a", "b"], 32), (False, [], 32)]


def test_metas_fill_each_message_up_to_meta_bytes_exactly() -> None:
    """Tensors whose metas are L bytes each, meta_bytes = k * L and chunk_bytes = k * 16: every message carries
    exactly k metas and their k payloads."""
    names = [f"t{i:02d}" for i in range(10)]
    meta_len = _meta_len("t00", 4)
    for k in (1, 2, 3, 4):
        msgs = wire.frames(None, [(n, _f32(4, i)) for i, n in enumerate(names)], 16 * k, meta_bytes=k * meta_len)
        want = [(False, names[i:i + k], 16 * len(names[i:i + k])) for i in range(0, len(names), k)]
        assert _structure(msgs) == want, k
        # one byte less of meta budget: one meta fewer per message
        msgs = wire.frames(None, [(n, _f32(4, i)) for i, n in enumerate(names)], 1 << 20,
                           meta_bytes=k * meta_len - 1)
        assert [len(s[1]) for s in _structure(msgs)] == [max(k - 1, 1)] * (len(names) // max(k - 1, 1)) + \
            ([len(names) % max(k - 1, 1)] if len(names) % max(k - 1, 1) else [])


def test_a_meta_after_a_chunk_cut_joins_the_next_message() -> None:
    """After a message cut for its payload the meta budget starts afresh: the next tensor's meta rides with
    the rest of the previous payload (meta_bytes = one meta)."""
    meta_len = _meta_len("b", 4)
    msgs = wire.frames(None, [("a", _f32(16)), ("b", _f32(4))], 32, meta_bytes=meta_len)
    assert _structure(msgs) == [(False, ["a"], 32), (False, ["b"], 32), (False, [], 16)]
    msgs = wire.frames(None, [("a", _f32(4)), ("b", _f32(8))], 32)
    assert _structure(msgs) == [(False, ["a", "b"], 32), (False, [], 16)]


_DTYPES = [torch.float32, torch.uint8, torch.int16, torch.float64, torch.bfloat16]


@st.composite
def _calls(draw: st.DrawFn) -> tuple[bool, list[tuple[str, torch.Tensor]], int, int]:
    n = draw(st.integers(0, 6))
    ts = []
    for i in range(n):
        dtype = draw(st.sampled_from(_DTYPES))
        numel = draw(st.integers(0, 40))
        raw = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype) if numel else torch.zeros(0, dtype=dtype)
        ts.append((f"t{i}" * draw(st.integers(1, 3)), t))
    return draw(st.booleans()), ts, draw(st.integers(1, 80)), draw(st.integers(1, 120))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_calls())
def test_frames_are_bounded_greedy_and_round_trip_bit_exactly(
        call: tuple[bool, list[tuple[str, torch.Tensor]], int, int]) -> None:
    with_head, ts, chunk, meta_bytes = call
    head = pb.StepHeader(run_id="run", client_id="c") if with_head else None
    enc = [(n, tc.encode(t)) for n, t in ts]
    msgs = wire.frames(head, enc, chunk, meta_bytes)
    parsed = [pb.Frame.FromString(m) for m in msgs]
    head_len = len(_ld(wire.F_STEP, head.SerializeToString())) if head is not None else 0

    def metas(f: pb.Frame) -> int:  # head and meta bytes of a message
        return (head_len if f.HasField("step") else 0) + sum(len(_ld(wire.F_TENSOR, t.SerializeToString()))
                                                              for t in f.tensors)

    assert msgs and all(len(f.data) <= chunk for f in parsed)
    assert b"".join(f.data for f in parsed) == b"".join(_raw(t) + bytes(-t.nbytes % 16) for _, t in ts)
    assert [t.name for f in parsed for t in f.tensors] == [n for n, _ in ts]
    assert [f.HasField("step") for f in parsed] == [with_head] + [False] * (len(parsed) - 1)
    for k, f in enumerate(parsed):
        items = len(f.tensors) + f.HasField("step")
        assert items <= 1 or metas(f) <= meta_bytes  # one item larger than the budget travels alone
        if k + 1 < len(parsed):  # cut only when full: its payload, or its metas and the next message's first
            nxt = parsed[k + 1]
            assert len(f.data) == chunk or (
                metas(f) > 0 and len(nxt.tensors) > 0 and metas(f) + len(_ld(wire.F_TENSOR, nxt.tensors[0].SerializeToString())) > meta_bytes)
            assert items or f.data  # no empty message but an empty call's
    if not ts and head is None:
        assert msgs == [b""]
    got_head, got = wire.read_all(msgs, wire.F_STEP if head is not None else None,
                                  wire.Limits(chunk_bytes=max(chunk, 1), max_tensor_bytes=1 << 20))
    assert got_head == head
    assert [r.name for r in got] == [n for n, _ in ts]
    for r, (_, t) in zip(got, ts, strict=True):
        assert r.tensor.dtype == t.dtype and r.tensor.shape == t.shape and _raw(r.tensor) == _raw(t)
        assert r.nbytes == t.nbytes
