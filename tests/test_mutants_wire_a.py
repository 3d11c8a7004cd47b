"""The wire format's bounds that a mutation run found unpinned: ``Limits``' documented defaults and the exact
edges of their validation (with the refusal's words), the edges of the model description a Load carries
(``num_classes``, ``vocab``, the size and nesting of its kwargs JSON, and that they form a JSON object), the
canonical kwargs JSON a spec travels as, and the arithmetic that decides a message's size: a payload's padding,
whether a head fits one message, and whether a call fits one frame (then it may go unary). Expected values are
literals or computed here independently (protobuf's generated code for a frame's size, ceiling division for the
padding), not read off the module's constants."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.errors import ConfigError, InvalidArgument
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.pb import pb

MIB = 1 << 20
LIMIT_FIELDS = ("chunk_bytes", "unary_bytes", "max_tensor_bytes", "max_call_bytes", "max_tensors", "max_frames",
                "head_room")

# ---------------------------------------------------------------- Limits: defaults


def test_the_documented_default_limits() -> None:
    """1 MiB frames, 4 MiB unary calls, 512 MiB a tensor, 1 GiB a call, 10,000 tensors, 65,536 frames and 64 KiB
    of head room: gRPC's message limit is then 4 MiB + 64 KiB on both ends."""
    lim = wire.Limits()
    assert dataclasses.astuple(lim) == (1_048_576, 4_194_304, 536_870_912, 1_073_741_824, 10_000, 65_536, 65_536)
    assert lim.max_message_bytes == 4_194_304 + 65_536
    assert lim.grpc_options() == [("grpc.max_send_message_length", 4_259_840),
                                  ("grpc.max_receive_message_length", 4_259_840)]
    assert lim.stream_bytes == 65_536 * 1_048_576  # 64 GiB: max_frames frames of a full chunk


def test_limits_are_frozen() -> None:
    """Both ends of a link share one Limits (and gRPC's options are derived once): it cannot be changed."""
    lim = wire.Limits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        lim.chunk_bytes = 7  # type: ignore[misc]
    assert lim.chunk_bytes == MIB


@pytest.mark.parametrize("chunk, unary", [(MIB, 4 * MIB), (4 * MIB, MIB), (3, 5), (5, 3)])
def test_the_message_limit_is_the_larger_of_chunk_and_unary_plus_head_room(chunk: int, unary: int) -> None:
    lim = wire.Limits(chunk_bytes=chunk, unary_bytes=unary, head_room=100_000)
    assert lim.max_message_bytes == (chunk if chunk > unary else unary) + 100_000


# ---------------------------------------------------------------- Limits: the edges of validation

CAPPED = ("chunk_bytes", "unary_bytes")  # 1..64 MiB
OPEN = ("max_tensor_bytes", "max_call_bytes", "max_tensors", "max_frames")  # >= 1


@pytest.mark.parametrize("name", CAPPED + OPEN)
def test_the_smallest_value_of_each_limit_is_one(name: str) -> None:
    assert getattr(wire.Limits(**{name: 1}), name) == 1
    with pytest.raises(ConfigError) as e:
        wire.Limits(**{name: 0})
    if name in CAPPED:
        assert str(e.value) == f"{name} must be a whole number of bytes in 1..67108864 (64 MiB), got 0"
    else:
        assert str(e.value) == f"{name} must be a whole number >= 1, got 0"


@pytest.mark.parametrize("name", CAPPED)
def test_chunk_and_unary_bytes_are_at_most_64_mib(name: str) -> None:
    assert getattr(wire.Limits(**{name: 64 * MIB}), name) == 67_108_864
    with pytest.raises(ConfigError) as e:
        wire.Limits(**{name: 64 * MIB + 1})
    assert str(e.value) == f"{name} must be a whole number of bytes in 1..67108864 (64 MiB), got 67108865"


def test_head_room_holds_two_meta_budgets_of_32_kib_at_least_and_64_mib_at_most() -> None:
    assert wire.Limits(head_room=65_536).head_room == 65_536
    assert wire.Limits(head_room=64 * MIB).head_room == 64 * MIB
    for bad in (65_535, 64 * MIB + 1):
        with pytest.raises(ConfigError) as e:
            wire.Limits(head_room=bad)
        assert str(e.value) == (f"head_room must be a whole number of bytes in 65536..67108864 (64 MiB; it carries "
                                f"a frame's head and metas), got {bad}")


@pytest.mark.parametrize("name", OPEN)
def test_the_uncapped_limits_take_any_large_whole_number(name: str) -> None:
    assert getattr(wire.Limits(**{name: 1 << 62}), name) == 1 << 62
    for bad in (-1, 2.0, True, "8"):
        with pytest.raises(ConfigError, match=rf"^{name} must be a whole number >= 1, got {re.escape(repr(bad))}$"):
            wire.Limits(**{name: bad})  # type: ignore[arg-type]


# ---------------------------------------------------------------- the model a Load carries


def _model(**kw: Any) -> pb.ModelSpec:
    return pb.ModelSpec(**{"name": "cnn", "input_shape": [1, 8, 8], "num_classes": 10, **kw})


def test_num_classes_runs_from_1_to_a_million() -> None:
    for ok in (1, 1_000_000):
        assert wire.model_of(_model(num_classes=ok)).num_classes == ok
    for bad in (0, 1_000_001):
        with pytest.raises(InvalidArgument, match=rf"^model: num_classes must be in 1\.\.1,000,000, got {bad}$"):
            wire.model_of(_model(num_classes=bad))


def test_vocab_is_0_or_runs_from_2_to_2_to_the_24() -> None:
    for ok in (0, 2, 1 << 24):
        assert wire.model_of(_model(vocab=ok)).vocab == ok
    for bad in (1, (1 << 24) + 1):
        with pytest.raises(InvalidArgument, match=rf"^model: vocab must be 0 \(float inputs\) or in "
                                                  rf"2\.\.16,777,216, got {bad}$"):
            wire.model_of(_model(vocab=bad))


def _kwargs_of_length(n: int) -> str:
    s = json.dumps({"a": "x" * (n - len('{"a": ""}'))})
    assert len(s) == n
    return s


def test_kwargs_json_takes_at_most_64_kib_of_characters() -> None:
    got = wire.model_of(_model(kwargs_json=_kwargs_of_length(65_536)))
    assert got.kwargs == {"a": "x" * (65_536 - 9)}
    with pytest.raises(InvalidArgument, match=r"^model: kwargs_json has 65537 characters, at most 65536$"):
        wire.model_of(_model(kwargs_json=_kwargs_of_length(65_537)))


def _nested(levels: int) -> str:
    """A JSON object whose lists and objects nest ``levels`` deep (the object itself is the first level)."""
    return '{"a": ' + "[" * (levels - 1) + "1" + "]" * (levels - 1) + "}"


def test_kwargs_nest_at_most_16_levels() -> None:
    for levels in (1, 2, 16):
        got = wire.model_of(_model(kwargs_json=_nested(levels)))
        assert got.kwargs == json.loads(_nested(levels))
    deep_objects = "{" + '"a": {' * 15 + "}" * 16
    assert wire.model_of(_model(kwargs_json=deep_objects)).kwargs == json.loads(deep_objects)  # 16 objects
    for deep in (_nested(17), "{" + '"a": {' * 16 + "}" * 17):
        with pytest.raises(InvalidArgument, match=r"^model: kwargs nest deeper than 16 levels$"):
            wire.model_of(_model(kwargs_json=deep))


def test_kwargs_too_deep_for_the_json_parser_are_refused_not_crashed() -> None:
    """Within 64 KiB of characters, JSON nests far deeper than Python's recursion limit."""
    deep = '{"a": ' + "[" * 60_000
    assert len(deep) <= 65_536
    with pytest.raises(InvalidArgument, match=r"^model: kwargs nest deeper than 16 levels$"):
        wire.model_of(_model(kwargs_json=deep))


@pytest.mark.parametrize("text", ["[1]", "[]", "3", '"s"', "null", "true"])
def test_kwargs_must_be_a_json_object(text: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^model: kwargs must be a JSON object$"):
        wire.model_of(_model(kwargs_json=text))


def test_a_spec_travels_with_canonical_kwargs_json() -> None:
    """Sorted keys: the same options give the same bytes whatever order they were given in; none gives ""."""
    a = wire.model_of(_model(kwargs_json='{"width": 4, "depth": 2}'))
    assert wire.model_pb(a).kwargs_json == '{"depth": 2, "width": 4}'
    assert wire.model_pb(dataclasses.replace(a, kwargs={"depth": 2, "width": 4})).kwargs_json == \
        wire.model_pb(a).kwargs_json
    assert wire.model_pb(dataclasses.replace(a, kwargs={})).kwargs_json == ""
    assert wire.model_of(wire.model_pb(a)) == a


# ---------------------------------------------------------------- sizes: padding, heads, single frames


@given(n=st.integers(0, 1 << 40))
def test_a_payload_is_padded_up_to_a_multiple_of_16(n: int) -> None:
    p = wire.padded(n)
    assert p == -(-n // 16) * 16
    assert p % 16 == 0 and n <= p < n + 16


def test_padding_of_small_payloads() -> None:
    assert [wire.padded(n) for n in (0, 1, 15, 16, 17, 31, 32, 33)] == [0, 16, 16, 16, 32, 32, 32, 48]


def _smallest() -> wire.Limits:
    """The smallest limits: gRPC's message limit is 65,537 bytes."""
    return wire.Limits(chunk_bytes=1, unary_bytes=1, head_room=65_536)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(65_520, 65_540), big=st.booleans())
def test_a_head_fits_when_its_frame_fits_the_message_limit(size: int, big: bool) -> None:
    """The frame carrying a head alone, as protobuf's own code writes it, decides (edge: 65,537 bytes)."""
    lim = _smallest() if not big else wire.Limits()
    head = pb.StepHeader(run_id="r" * (size if not big else size + lim.max_message_bytes - 65_537))
    frame = pb.Frame(step=head).SerializeToString()
    assert wire.head_fits(head, lim) == (len(frame) <= lim.max_message_bytes)


def test_a_head_fits_exactly_at_the_message_limit() -> None:
    sizes = {}
    for n in range(65_500, 65_560):
        head = pb.StepHeader(run_id="r" * n)
        sizes[len(pb.Frame(step=head).SerializeToString())] = head
    assert wire.head_fits(sizes[65_537], _smallest())
    assert not wire.head_fits(sizes[65_538], _smallest())


def _floats(*counts: int) -> list[tuple[str, tc.Encoded]]:
    return [(str(i), tc.encode(torch.zeros(k))) for i, k in enumerate(counts)]


def test_a_call_fits_one_frame_up_to_a_full_chunk_of_padded_payload() -> None:
    assert wire.single_frame(_floats(4, 4), 32)  # 16 + 16 bytes
    assert wire.single_frame(_floats(3, 5), 48)  # 12 -> 16, 20 -> 32
    assert not wire.single_frame(_floats(3, 5), 47)
    assert not wire.single_frame(_floats(4, 4, 1), 32)


def test_a_call_fits_one_frame_up_to_64_bytes_of_metas_a_tensor() -> None:
    """The default meta budget, 32 KiB, takes 512 tensors' metas; the 513th makes the call stream."""
    assert wire.single_frame(_floats(*[1] * 512), MIB)
    assert not wire.single_frame(_floats(*[1] * 513), MIB)
    assert wire.single_frame(_floats(1, 1), MIB, meta_bytes=128)
    assert not wire.single_frame(_floats(1, 1), MIB, meta_bytes=127)
    assert not wire.single_frame(_floats(1, 1, 1), MIB, meta_bytes=128)


def test_both_the_payload_and_the_metas_must_fit() -> None:
    assert not wire.single_frame(_floats(1, 1), MIB, meta_bytes=64)  # payload fits, metas do not
    assert not wire.single_frame(_floats(8), 16, meta_bytes=1 << 15)  # metas fit, payload does not


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(0, 40), max_size=6), chunk=st.integers(1, 200), meta=st.integers(0, 400))
def test_a_call_said_to_fit_one_frame_is_sent_as_one_frame(counts: list[int], chunk: int, meta: int) -> None:
    tensors = _floats(*counts)
    want = sum(-(-4 * k // 16) * 16 for k in counts) <= chunk and 64 * len(counts) <= meta
    assert wire.single_frame(tensors, chunk, meta) == want
    if want:
        assert len(wire.frames(None, tensors, chunk, meta)) == 1


def test_every_limit_field_is_checked() -> None:
    """No bound escapes validation: each refuses zero."""
    for name in LIMIT_FIELDS:
        with pytest.raises(ConfigError, match=rf"^{name} must be a whole number"):
            wire.Limits(**{name: 0})
