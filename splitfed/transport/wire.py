"""Frames: how a call's head and tensors travel in the Tier service's messages.

The tensors of a call form one payload stream (each payload padded to a
multiple of 16 bytes) cut into frames of at most ``Limits.chunk_bytes``, so
every gRPC message stays under an explicit bound however large the tensors,
and small calls (a step's activation and labels) fit in a single message.
Frames are written and read here directly in protobuf's wire format (they are
ordinary ``Frame`` messages; a test checks both directions against the
generated code) because that lets a payload be copied once on send and used in
place on receive: ``pad`` puts ``data`` on a 16-byte boundary of the message.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np
import torch
from google.protobuf.message import DecodeError, Message

from splitfed.engine.limits import MAX_KWARGS_JSON
from splitfed.errors import ConfigError, InvalidArgument, ResourceExhausted
from splitfed.models.zoo import MAX_CLASSES, MAX_VOCAB, ModelSpec
from splitfed.transport import codec as tc
from splitfed.transport.pb import pb

F_STEP, F_LOAD, F_RESULT, F_TENSOR, F_REDUCE, F_PAD, F_DATA = 1, 2, 3, 4, 5, 14, 15
HEADS: dict[int, type[Message]] = {F_STEP: pb.StepHeader, F_LOAD: pb.LoadHeader, F_RESULT: pb.StepResult,
                                   F_REDUCE: pb.ReduceResult}
_HEAD_NUMS: dict[type[Message], int] = {v: k for k, v in HEADS.items()}
_TAG_PAD = bytes([(F_PAD << 3) | 2])
_TAG_DATA = bytes([(F_DATA << 3) | 2])
ALIGN = 16
META_BYTES = 32 << 10
"""The most bytes of head and tensor metas one frame carries (a larger head travels alone: see
:func:`iter_frames`); ``Limits.head_room`` holds twice this."""


@dataclass(frozen=True)
class Limits:
    """Size bounds of the transport, the same on both ends of a link.

    ``unary_bytes``: a step whose tensors (and reply) fit this goes as one
    message each way, decoded in place; larger calls stream in frames of
    ``chunk_bytes``, which pipeline copying with sending. gRPC's message limit
    is the larger of the two plus ``head_room`` for heads and metas (see
    benchmarks/transport.py for the measurements behind the defaults).
    ``max_tensor_bytes`` / ``max_call_bytes``: the most one tensor / all
    tensors of one call may declare; ``max_tensors`` and ``max_frames`` bound a
    call's count of each (RESOURCE_EXHAUSTED above any).

    Every bound is checked here: a zero or negative one refused every call with a message about the call
    ("more than 0 messages"), and a ``head_room`` below a frame's head and metas made gRPC refuse frames the
    sender built itself.
    """

    chunk_bytes: int = 1 << 20
    unary_bytes: int = 4 << 20
    max_tensor_bytes: int = 512 << 20
    max_call_bytes: int = 1 << 30
    max_tensors: int = 10_000
    max_frames: int = 1 << 16
    head_room: int = 64 << 10

    def __post_init__(self) -> None:
        mib = 64 << 20
        for name, low, high in (("chunk_bytes", 1, mib), ("unary_bytes", 1, mib), ("head_room", 2 * META_BYTES, mib),
                                ("max_tensor_bytes", 1, None), ("max_call_bytes", 1, None), ("max_tensors", 1, None),
                                ("max_frames", 1, None)):
            v = getattr(self, name)
            if isinstance(v, int) and not isinstance(v, bool) and low <= v <= (high or v):
                continue
            if high is None:
                raise ConfigError(f"{name} must be a whole number >= {low}, got {v!r}")
            why = "; it carries a frame's head and metas" if name == "head_room" else ""
            raise ConfigError(f"{name} must be a whole number of bytes in {low}..{high} (64 MiB{why}), got {v!r}")

    @property
    def max_message_bytes(self) -> int:
        return max(self.chunk_bytes, self.unary_bytes) + self.head_room

    @property
    def stream_bytes(self) -> int:
        """The most payload one call's frames carry (``max_frames`` of ``chunk_bytes``): a larger tensor could
        never arrive, whatever ``max_tensor_bytes`` says."""
        return self.max_frames * self.chunk_bytes

    def grpc_options(self) -> list[tuple[str, int]]:
        m = self.max_message_bytes
        return [("grpc.max_send_message_length", m), ("grpc.max_receive_message_length", m)]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return bytes([(num << 3) | 2]) + _varint(len(payload)) + payload


def codec_pb(c: tc.Codec) -> pb.Codec:
    return pb.Codec(kind=cast(pb.CodecKind, c.code), topk_fraction=c.fraction if c.kind == "topk" else 0.0)


_FIXED_CODECS = {c.code: c for c in (tc.NONE, tc.Codec("fp16"), tc.Codec("int8"))}  # those without a parameter


def codec_of(m: pb.Codec) -> tc.Codec:
    fixed = _FIXED_CODECS.get(m.kind)
    if fixed is not None:
        return fixed
    kind = tc.KIND_NAMES.get(m.kind)
    if kind is None:
        raise InvalidArgument(f"unknown codec kind {m.kind}")
    try:
        return tc.Codec(kind, m.topk_fraction if kind == "topk" else 1.0)
    except ConfigError as e:
        raise InvalidArgument(str(e)) from None


def model_pb(spec: ModelSpec) -> pb.ModelSpec:
    return pb.ModelSpec(name=spec.name, input_shape=spec.input_shape, num_classes=spec.num_classes, vocab=spec.vocab,
                        kwargs_json=json.dumps(spec.kwargs, sort_keys=True) if spec.kwargs else "")


MAX_KWARGS_DEPTH = 16  # nesting of lists and objects in them


def _depth(value: object, limit: int) -> int:
    """How deep lists and objects nest in ``value`` (counted without recursion), or ``limit + 1`` if deeper."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            d += 1
            if d > limit:
                return d
            deepest = max(deepest, d)
            todo.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def model_of(m: pb.ModelSpec) -> ModelSpec:
    """The spec a message names (INVALID_ARGUMENT if malformed); whether it may be built is the tier's call."""
    if len(m.kwargs_json) > MAX_KWARGS_JSON:
        raise InvalidArgument(f"model: kwargs_json has {len(m.kwargs_json)} characters, at most {MAX_KWARGS_JSON}")
    if not 1 <= m.num_classes <= MAX_CLASSES:  # else it loads, and every step is refused (no label fits)
        raise InvalidArgument(f"model: num_classes must be in 1..{MAX_CLASSES:,}, got {m.num_classes}")
    if not (m.vocab == 0 or 2 <= m.vocab <= MAX_VOCAB):
        raise InvalidArgument(f"model: vocab must be 0 (float inputs) or in 2..{MAX_VOCAB:,}, got {m.vocab}")
    try:
        kwargs = json.loads(m.kwargs_json) if m.kwargs_json else {}
        if not isinstance(kwargs, dict):
            raise ValueError("kwargs must be a JSON object")
        if _depth(kwargs, MAX_KWARGS_DEPTH) > MAX_KWARGS_DEPTH:
            raise ValueError(f"kwargs nest deeper than {MAX_KWARGS_DEPTH} levels")
        return ModelSpec(m.name, tuple(int(d) for d in m.input_shape), int(m.num_classes), int(m.vocab), kwargs)
    except RecursionError:
        raise InvalidArgument(f"model: kwargs nest deeper than {MAX_KWARGS_DEPTH} levels") from None
    except (ValueError, ConfigError) as e:
        raise InvalidArgument(f"model: {e}") from None


def head_fits(head: Message, limits: Limits) -> bool:
    """Whether ``head`` fits one message of ``limits`` (alone, as :func:`iter_frames` sends a large one)."""
    n = head.ByteSize()
    return 1 + len(_varint(n)) + n <= limits.max_message_bytes


def padded(n: int) -> int:
    """A payload's length in the stream: rounded up to ALIGN."""
    return n + (-n) % ALIGN


def frames(head: Message | None, tensors: Sequence[tuple[str, tc.Encoded]], chunk_bytes: int,
           meta_bytes: int = META_BYTES) -> list[bytes]:
    """All messages of one call (see :func:`iter_frames`)."""
    return list(iter_frames(head, tensors, chunk_bytes, meta_bytes))


def single_frame(tensors: Sequence[tuple[str, tc.Encoded]], chunk_bytes: int, meta_bytes: int = META_BYTES) -> bool:
    """Whether the call fits one message (then it may go as a unary call)."""
    return sum(padded(e.nbytes) for _, e in tensors) <= chunk_bytes and len(tensors) * 64 <= meta_bytes


def iter_frames(head: Message | None, tensors: Sequence[tuple[str, tc.Encoded]], chunk_bytes: int,
                meta_bytes: int = META_BYTES) -> Iterator[bytes]:
    """The messages of one call, built as they are sent: ``head`` first, then metas and payload stream.

    A frame carries at most ``chunk_bytes`` of payload stream and about
    ``meta_bytes`` of head and tensor metas (a state of many small tensors takes several
    frames). The head counts in that budget: one larger than it travels alone, in a frame without payload.
    Else a head near ``Limits.head_room`` (a Load's model options may take 64 KiB) plus a full chunk made a
    frame larger than gRPC's message limit, and the sender's own gRPC refused the call.
    Built lazily, a frame's copy overlaps the sending of the previous one.
    """
    prefix: list[bytes] = []
    parts: list[memoryview | bytes] = []
    used = metas = 0
    sent = False
    if head is not None:
        prefix.append(_field(_HEAD_NUMS[type(head)], head.SerializeToString()))
        metas = len(prefix[0])
    for name, e in tensors:
        meta = _meta_field(name, e.dtype, e.shape, e.nbytes, e.codec)
        if metas and metas + len(meta) > meta_bytes:
            yield _frame(b"".join(prefix), parts)
            sent = True
            prefix, parts, used, metas = [], [], 0, 0
        prefix.append(meta)
        metas += len(meta)
        mv = e.payload.cast("B") if e.payload.format != "B" else e.payload
        for piece in (mv, bytes((-e.nbytes) % ALIGN)):
            off = 0
            while off < len(piece):
                if used == chunk_bytes:
                    yield _frame(b"".join(prefix), parts)
                    sent = True
                    prefix, parts, used, metas = [], [], 0, 0
                take = min(chunk_bytes - used, len(piece) - off)
                parts.append(piece[off:off + take])
                used += take
                off += take
    if prefix or parts or not sent:
        yield _frame(b"".join(prefix), parts)


@functools.lru_cache(maxsize=4096)
def _meta_field(name: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int, codec: tc.Codec) -> bytes:
    """A tensor's meta as a Frame field; cached: a step sends the same metas step after step."""
    return _field(F_TENSOR, pb.TensorMeta(name=name, dtype=cast(pb.DType, tc.DTYPE_CODES[dtype]), shape=shape,
                                          nbytes=nbytes, codec=codec_pb(codec) if codec.lossy else None
                                          ).SerializeToString())


def _frame(prefix: bytes, parts: list[memoryview | bytes]) -> bytes:
    """``prefix`` fields, then pad and data such that data starts on an ALIGN boundary."""
    n = sum(len(p) for p in parts)
    if n == 0:
        return prefix
    dl = _TAG_DATA + _varint(n)
    pad = (-(len(prefix) + 2 + len(dl))) % ALIGN
    return b"".join([prefix, _TAG_PAD, bytes([pad]), bytes(pad), dl, *parts])


def _varint_at(buf: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf):
            raise InvalidArgument("malformed frame: truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift >= 70:
            raise InvalidArgument("malformed frame: varint longer than 10 bytes")


def parse_frame(raw: bytes | memoryview) -> tuple[dict[int, list[memoryview]], memoryview | None]:
    """Top-level fields of a Frame: message fields as slices, ``data`` in place; unknown fields skipped."""
    mv = memoryview(raw).cast("B") if not isinstance(raw, bytes) else memoryview(raw)
    n = len(mv)
    fields: dict[int, list[memoryview]] = {}
    data = None
    i = 0
    while i < n:
        key = mv[i]
        if key < 0x80:  # one byte: every field of a Frame (inlined: this loop runs on every message)
            i += 1
        else:
            key, i = _varint_at(mv, i)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise InvalidArgument("malformed frame: field number 0")
        if wt == 2:
            if i < n and mv[i] < 0x80:
                ln = mv[i]
                i += 1
            else:
                ln, i = _varint_at(mv, i)
            if i + ln > n:
                raise InvalidArgument("malformed frame: a field runs past the end of the message")
            seg = mv[i:i + ln]
            i += ln
            if num == F_DATA:
                data = seg
            elif num in HEADS or num == F_TENSOR:
                fields.setdefault(num, []).append(seg)
        elif num in HEADS or num in (F_TENSOR, F_PAD, F_DATA):
            raise InvalidArgument(f"malformed frame: field {num} has wire type {wt}")
        elif wt == 0:
            _, i = _varint_at(mv, i)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise InvalidArgument(f"malformed frame: unsupported wire type {wt}")
        if i > n:
            raise InvalidArgument("malformed frame: truncated")
    return fields, data


_M = TypeVar("_M", bound=Message)
_NO_MEMORY = "can't allocate memory"  # torch's CPU allocator's words (a plain RuntimeError, no type of its own)


def _message(cls: type[_M], segs: list[memoryview], what: str) -> _M:
    try:  # several occurrences merge, as protobuf says; one (the usual case) parses in place
        return cls.FromString(segs[0] if len(segs) == 1 else b"".join(segs))
    except DecodeError as e:
        raise InvalidArgument(f"malformed {what}: {e}") from None


@dataclass
class Received:
    name: str
    tensor: torch.Tensor
    nbytes: int  # payload bytes that travelled


@dataclass
class _Pending:
    index: int
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    codec: tc.Codec
    nbytes: int
    pad: int
    buffer: torch.Tensor | None = None
    filled: int = 0


@dataclass
class Reader:
    """Assembles the frames of one call into its head and tensors, checking each as it arrives.

    ``head``: the head field the first frame must carry (None: no head).
    Nothing here touches a tier: a refused call leaves no trace.
    """

    head: int | None
    limits: Limits
    writable: bool = False
    what: str = "call"
    head_msg: Message | None = None
    _done: list[Received | None] = field(default_factory=list)
    _queue: list[_Pending] = field(default_factory=list)  # declared, payload not complete
    _frames: int = 0
    _declared: int = 0

    def feed(self, raw: bytes) -> None:
        if not isinstance(raw, bytes | bytearray | memoryview):
            raise InvalidArgument(f"{self.what}: frame is not bytes")
        try:
            fields, data = parse_frame(raw)
        except InvalidArgument as e:  # named as the Reader's other refusals are
            raise InvalidArgument(f"{self.what}: {e}") from None
        heads = [k for k in HEADS if k in fields]
        if heads:
            if self._frames or heads != [self.head]:
                raise InvalidArgument(f"{self.what}: unexpected header field(s) {heads} in frame {self._frames}")
            self.head_msg = _message(HEADS[heads[0]], fields[heads[0]], f"{self.what} header")
        elif self._frames == 0 and self.head is not None:
            raise InvalidArgument(f"{self.what}: the first frame carries no header")
        self._frames += 1
        if self._frames > self.limits.max_frames:
            raise ResourceExhausted(f"{self.what}: more than {self.limits.max_frames} messages")
        for seg in fields.get(F_TENSOR, ()):
            self._declare(_message(pb.TensorMeta, [seg], "tensor meta"))
        if data is not None and data.nbytes:
            self._consume(data)

    def _declare(self, meta: pb.TensorMeta) -> None:
        i = len(self._done)
        if i >= self.limits.max_tensors:
            raise ResourceExhausted(f"{self.what}: more than {self.limits.max_tensors} tensors")
        label = f"{self.what}: tensor {meta.name or i}"
        try:
            codec = codec_of(meta.codec)
        except InvalidArgument as e:
            raise InvalidArgument(f"{label}: {e}") from None
        dtype, shape = tc.check_meta(meta.dtype, list(meta.shape), codec, meta.nbytes,
                                     max_bytes=self.limits.max_tensor_bytes, what=label)
        self._declared += max(meta.nbytes, tc.payload_size(dtype, shape, tc.NONE))
        if self._declared > self.limits.max_call_bytes:
            raise ResourceExhausted(f"{self.what}: tensors exceed the limit of {self.limits.max_call_bytes} bytes")
        self._done.append(None)
        p = _Pending(i, meta.name, dtype, shape, codec, meta.nbytes, (-meta.nbytes) % ALIGN)
        if not self._queue and p.nbytes == 0:
            self._complete(p, b"")
        else:
            self._queue.append(p)

    def _consume(self, data: memoryview) -> None:
        off, n = 0, data.nbytes
        while off < n:
            if not self._queue:
                raise InvalidArgument(f"{self.what}: {n - off} payload bytes beyond the declared tensors")
            cur = self._queue[0]
            if cur.filled < cur.nbytes:
                take = min(cur.nbytes - cur.filled, n - off)
                if cur.filled == 0 and take == cur.nbytes:
                    cur.filled = take
                    self._complete(cur, data[off:off + take])  # the whole payload in this frame: in place
                else:
                    if cur.buffer is None:
                        cur.buffer = self._buffer(cur)
                    cur.buffer.numpy()[cur.filled:cur.filled + take] = np.frombuffer(data[off:off + take], np.uint8)
                    cur.filled += take
                    if cur.filled == cur.nbytes:
                        self._complete(cur, cur.buffer)
                off += take
            if cur.filled == cur.nbytes:
                skip = min(cur.pad, n - off)
                cur.pad -= skip
                off += skip
                if cur.pad == 0:
                    self._queue.pop(0)
                    while self._queue and self._queue[0].nbytes == 0:  # empty tensors need no bytes
                        self._complete(self._queue.pop(0), b"")

    def _buffer(self, cur: _Pending) -> torch.Tensor:
        """Memory for a payload that comes in pieces (RESOURCE_EXHAUSTED if this process has none: see
        :meth:`_no_memory`)."""
        try:
            return torch.empty(cur.nbytes, dtype=torch.uint8)
        except RuntimeError:  # of a valid size, torch.empty fails in its allocator only
            raise self._no_memory(cur, cur.nbytes) from None

    def _no_memory(self, cur: _Pending, nbytes: int) -> ResourceExhausted:
        """A declared tensor this process cannot allocate is RESOURCE_EXHAUSTED, as one beyond the limits:
        torch's RuntimeError was an INTERNAL error, logged as a bug, whenever a limit lay above the host's
        memory (``splitfed tier --max-tensor-mb``, up to 64 GiB) and a peer declared such a tensor (a payload
        that comes in pieces) or sent a few megabytes of top-k values for one."""
        return ResourceExhausted(f"{self.what}: tensor {cur.name or cur.index}: this process cannot allocate "
                                 f"the {nbytes} bytes it declares")

    def _complete(self, cur: _Pending, payload: memoryview | bytes | torch.Tensor) -> None:
        try:
            t = tc.decode(cur.dtype, cur.shape, cur.codec, payload, writable=self.writable)
        except InvalidArgument as e:  # the payload's own checks (bool bytes, top-k indices): name the tensor
            raise InvalidArgument(f"{self.what}: tensor {cur.name or cur.index}: {e}") from None
        except RuntimeError as e:
            if _NO_MEMORY not in str(e):
                raise
            raise self._no_memory(cur, tc.payload_size(cur.dtype, cur.shape, tc.NONE)) from None
        self._done[cur.index] = Received(cur.name, t, cur.nbytes)
        cur.buffer = None

    def finish(self) -> tuple[Message | None, list[Received]]:
        if self._queue:
            cur = self._queue[0]
            raise InvalidArgument(f"{self.what} ended inside tensor {cur.name or cur.index} "
                                  f"({cur.filled} of {cur.nbytes} bytes and its padding)")
        if self.head is not None and self.head_msg is None:
            raise InvalidArgument(f"{self.what}: no header (empty call)")
        return self.head_msg, [r for r in self._done if r is not None]


def read_all(stream: Iterable[bytes], head: int | None, limits: Limits, *, writable: bool = False,
             what: str = "call") -> tuple[Message | None, list[Received]]:
    r = Reader(head, limits, writable=writable, what=what)
    for raw in stream:
        r.feed(raw)
    return r.finish()
