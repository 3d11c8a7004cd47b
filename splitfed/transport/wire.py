"""Frames: how a call's head and tensors travel in the Tier service's streams.

A tensor's payload is cut into chunks of at most ``Limits.chunk_bytes``, one
per :class:`Frame` message, so every gRPC message stays under an explicit
bound however large the tensor. Frames are written and read here directly in
protobuf's wire format (they are ordinary ``Frame`` messages; a test checks
both directions against the generated code) because that lets the payload be
copied once on send and used in place on receive: ``pad`` puts ``data`` on a
16-byte boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from google.protobuf.message import DecodeError, Message

from splitfed.errors import ConfigError, InvalidArgument, ResourceExhausted
from splitfed.transport import codec as tc
from splitfed.transport.pb import pb

F_STEP, F_LOAD, F_RESULT, F_TENSOR, F_PAD, F_DATA = 1, 2, 3, 4, 14, 15
HEADS: dict[int, type[Message]] = {F_STEP: pb.StepHeader, F_LOAD: pb.LoadHeader, F_RESULT: pb.StepResult}
_TAG_PAD = bytes([(F_PAD << 3) | 2])
_TAG_DATA = bytes([(F_DATA << 3) | 2])
ALIGN = 16


@dataclass(frozen=True)
class Limits:
    """Size bounds of the transport, the same on both ends of a link.

    ``chunk_bytes``: payload per message (4 MiB measured as fast as larger
    chunks, see benchmarks/transport.py); gRPC's message limit is set to it
    plus room for heads. ``max_tensor_bytes`` / ``max_call_bytes``: the most
    one tensor / all tensors of one call may declare (RESOURCE_EXHAUSTED above).
    """

    chunk_bytes: int = 4 << 20
    max_tensor_bytes: int = 512 << 20
    max_call_bytes: int = 1 << 30
    max_tensors: int = 10_000
    head_room: int = 64 << 10

    def __post_init__(self) -> None:
        if not 0 < self.chunk_bytes <= 64 << 20:
            raise ConfigError(f"chunk size must lie in 1 B..64 MiB, got {self.chunk_bytes}")

    @property
    def max_message_bytes(self) -> int:
        return self.chunk_bytes + self.head_room

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


def _frame(prefix: bytes, data: memoryview) -> bytes:
    """``prefix`` fields, then pad and data such that data starts on an ALIGN boundary."""
    dl = _TAG_DATA + _varint(data.nbytes)
    pad = (-(len(prefix) + 2 + len(dl))) % ALIGN
    return b"".join([prefix, _TAG_PAD, bytes([pad]), bytes(pad), dl, data])


def codec_pb(c: tc.Codec) -> pb.Codec:
    return pb.Codec(kind=c.code, topk_fraction=c.fraction if c.kind == "topk" else 0.0)


def codec_of(m: pb.Codec) -> tc.Codec:
    kind = tc.KIND_NAMES.get(m.kind)
    if kind is None:
        raise InvalidArgument(f"unknown codec kind {m.kind}")
    try:
        return tc.Codec(kind, m.topk_fraction if kind == "topk" else 1.0)
    except ConfigError as e:
        raise InvalidArgument(str(e)) from None


def frames(head: Message | None, tensors: Sequence[tuple[str, tc.Encoded]], chunk_bytes: int) -> list[bytes]:
    """The messages of one call: ``head`` first, then each tensor's meta and payload chunks."""
    out: list[bytes] = []
    pending = b""
    if head is not None:
        num = next(k for k, v in HEADS.items() if isinstance(head, v))
        pending = _field(num, head.SerializeToString())
    for name, e in tensors:
        meta = pb.TensorMeta(name=name, dtype=tc.DTYPE_CODES[e.dtype], shape=e.shape, nbytes=e.nbytes,
                             codec=codec_pb(e.codec) if e.codec.lossy else None)
        prefix = pending + _field(F_TENSOR, meta.SerializeToString())
        pending = b""
        if e.nbytes == 0:
            out.append(prefix)
            continue
        mv = e.payload.cast("B") if e.payload.format != "B" else e.payload
        for off in range(0, e.nbytes, chunk_bytes):
            out.append(_frame(prefix, mv[off:off + chunk_bytes]))
            prefix = b""
    if pending:
        out.append(pending)
    return out


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
        key, i = _varint_at(mv, i)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise InvalidArgument("malformed frame: field number 0")
        if wt == 2:
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


def _message(cls: type[Message], segs: list[memoryview], what: str) -> Message:
    try:
        return cls.FromString(b"".join(segs))  # several occurrences merge, as protobuf says
    except DecodeError as e:
        raise InvalidArgument(f"malformed {what}: {e}") from None


@dataclass
class Received:
    name: str
    tensor: torch.Tensor
    nbytes: int  # payload bytes that travelled


@dataclass
class _Pending:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    codec: tc.Codec
    nbytes: int
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
    tensors: list[Received] = field(default_factory=list)
    _cur: _Pending | None = None
    _frames: int = 0
    _declared: int = 0

    def feed(self, raw: bytes) -> None:
        if not isinstance(raw, bytes | bytearray | memoryview):
            raise InvalidArgument(f"{self.what}: frame is not bytes")
        fields, data = parse_frame(raw)
        heads = [k for k in HEADS if k in fields]
        if heads:
            if self._frames or heads != [self.head]:
                raise InvalidArgument(f"{self.what}: unexpected header field(s) {heads} in frame {self._frames}")
            self.head_msg = _message(HEADS[heads[0]], fields[heads[0]], f"{self.what} header")
        elif self._frames == 0 and self.head is not None:
            raise InvalidArgument(f"{self.what}: the first frame carries no header")
        self._frames += 1
        if F_TENSOR in fields:
            self._start(_message(pb.TensorMeta, fields[F_TENSOR], "tensor meta"))  # type: ignore[arg-type]
        if data is not None and data.nbytes:
            self._append(data)

    def _start(self, meta: pb.TensorMeta) -> None:
        i = len(self.tensors)
        if self._cur is not None:
            raise InvalidArgument(f"{self.what}: tensor {i} has {self._cur.filled} of {self._cur.nbytes} bytes "
                                  "when the next tensor starts")
        if i >= self.limits.max_tensors:
            raise ResourceExhausted(f"{self.what}: more than {self.limits.max_tensors} tensors")
        label = f"{self.what}: tensor {meta.name or i}"
        codec = codec_of(meta.codec)
        dtype, shape = tc.check_meta(meta.dtype, list(meta.shape), codec, meta.nbytes,
                                     max_bytes=self.limits.max_tensor_bytes, what=label)
        self._declared += max(meta.nbytes, tc.payload_size(dtype, shape, tc.NONE))
        if self._declared > self.limits.max_call_bytes:
            raise ResourceExhausted(f"{self.what}: tensors exceed the limit of {self.limits.max_call_bytes} bytes")
        self._cur = _Pending(meta.name, dtype, shape, codec, meta.nbytes)
        if meta.nbytes == 0:
            self._complete(b"")

    def _append(self, data: memoryview) -> None:
        cur = self._cur
        if cur is None:
            raise InvalidArgument(f"{self.what}: data outside a tensor")
        n = data.nbytes
        if cur.filled + n > cur.nbytes:
            raise InvalidArgument(f"{self.what}: tensor {cur.name or len(self.tensors)} gets more than its "
                                  f"declared {cur.nbytes} bytes")
        if cur.buffer is None and n == cur.nbytes:
            self._complete(data)  # the whole payload in one frame: used in place
            return
        if cur.buffer is None:
            cur.buffer = torch.empty(cur.nbytes, dtype=torch.uint8)
        cur.buffer.numpy()[cur.filled:cur.filled + n] = np.frombuffer(data, dtype=np.uint8)
        cur.filled += n
        if cur.filled == cur.nbytes:
            self._complete(cur.buffer)

    def _complete(self, payload: memoryview | bytes | torch.Tensor) -> None:
        cur = self._cur
        assert cur is not None
        t = tc.decode(cur.dtype, cur.shape, cur.codec, payload, writable=self.writable)
        self.tensors.append(Received(cur.name, t, cur.nbytes))
        self._cur = None

    def finish(self) -> tuple[Message | None, list[Received]]:
        if self._cur is not None:
            raise InvalidArgument(f"{self.what} ended inside tensor {self._cur.name or len(self.tensors)} "
                                  f"({self._cur.filled} of {self._cur.nbytes} bytes)")
        if self.head is not None and self.head_msg is None:
            raise InvalidArgument(f"{self.what}: no header (empty call)")
        return self.head_msg, self.tensors


def read_all(stream, head: int | None, limits: Limits, *, writable: bool = False,  # type: ignore[no-untyped-def]
             what: str = "call") -> tuple[Message | None, list[Received]]:
    r = Reader(head, limits, writable=writable, what=what)
    for raw in stream:
        r.feed(raw)
    return r.finish()
