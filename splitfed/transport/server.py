"""The tier service over gRPC: decode, call the :class:`~splitfed.engine.tier.Tier`, encode.

All step logic, checks and idempotency live in the ``Tier``; the servicer only
turns frames into tensors (refusing malformed ones), maps each ``TierError`` to
its status with the error's message, and never lets an unexpected exception
take the server down (INTERNAL, logged). The gRPC health service is served
beside it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import math
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import grpc
import torch
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import splitfed
from splitfed.engine import compute
from splitfed.engine.limits import IDLE_RELEASE_S, STREAM_IDLE_S, STREAM_MIN_BYTES_S, current_limits
from splitfed.engine.link import MAX_ID, Link, check_ids, check_reduce, check_replica  # noqa: F401 - MAX_ID re-exported
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig, ReduceItem, SegmentLoad, StepKey
from splitfed.errors import (
    ConfigError,
    InvalidArgument,
    ResourceExhausted,
    SplitfedError,
    TierError,
)
from splitfed.models.zoo import ZOO, ModelSpec, model_blocks
from splitfed.ports import cannot_listen
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.address import parse_address
from splitfed.transport.client import DEADLINE, GrpcTierClient, server_options
from splitfed.transport.describe import PROTOCOL, TierInfo
from splitfed.transport.errors import IDLE_CANCELLED, SENT_BY_TIER, PermissionDenied, status_of
from splitfed.transport.pb import SERVICE, method, pb
from splitfed.transport.security import TlsConfig, TokenInterceptor

log = logging.getLogger(__name__)

CONTROL = ("Load", "Fetch", "Release", "Reduce")  # the coordinator's calls: a coordinator token keeps them its own
PHASE_TENSORS = {pb.PHASE_STEP: ("activation", "labels"), pb.PHASE_FORWARD: ("activation",),
                 pb.PHASE_BACKWARD: ("gradient",)}


@dataclass(eq=False)
class _Watched:
    """One open stream: ``left`` seconds of waiting it may still spend, counted from ``since`` while the tier waits
    for its caller (None: while the tier itself works on it, which the caller is not charged for)."""

    context: grpc.ServicerContext
    what: str  # "StepStream request stream", "Fetch reply", ...
    left: float
    since: float | None
    started: float
    bytes: int = 0
    frames: int = 0


class _IdleStreams:
    """Cancels streams that stop making progress: each holds one of the server's few worker threads while it is
    open, so a caller that opens streams and then goes quiet, drips, or never reads would otherwise stop every
    call.

    A request stream (StepStream, Load) makes progress by delivering frames, a reply stream (Fetch, Reduce,
    StepStream's reply) by gRPC taking its frames, which it does only as fast as the caller reads. A stream
    starts with ``idle_s`` seconds of credit; each frame of n bytes adds n / ``min_bytes_s`` seconds (at most
    ``idle_s`` in all), and the time the tier waits for the caller spends it. A stream out of credit is cancelled
    (RESOURCE_EXHAUSTED, counted as a refusal, logged): one that moves nothing for ``idle_s`` is, as before, and
    so, after about ``idle_s``, is one that moves frames with next to nothing in them (an empty frame a second).
    Time the tier spends on a stream itself (decoding, computing the reply) is not charged to its caller.

    The floor, 16 kB/s (128 kbit/s) by default: a fifth of the slowest link of the shipped fleets
    (iot.toml's BLE microcontrollers, 0.7 Mbit/s), so a real device meets it with room for protocol overhead
    and a shared link; a frame of
    ``chunk_bytes`` (1 MiB) then buys the whole ``idle_s``, and a client sends a call's frames as fast as its
    link takes them. A caller that holds a worker must keep spending that bandwidth on it: a drip holds no
    worker for free. A floor of 0 counts frames alone (any frame restores the whole ``idle_s``). One watcher
    thread, only while streams are open."""

    def __init__(self, idle_s: float | None, min_bytes_s: float = STREAM_MIN_BYTES_S, tier: str = "") -> None:
        if idle_s is not None and not (math.isfinite(idle_s) and idle_s > 0):
            raise ConfigError(f"stream_idle_s must be a positive number of seconds or None, got {idle_s}")
        if not (math.isfinite(min_bytes_s) and min_bytes_s >= 0):
            raise ConfigError(f"stream_min_bytes_s must be a number of bytes per second >= 0, got {min_bytes_s}")
        self.idle_s = idle_s
        self.min_bytes_s = float(min_bytes_s)
        self.tier = tier  # its name, in the cancel's details
        self.on_cancel: Callable[[grpc.StatusCode], None] | None = None  # counts it as a refusal
        self.cancelled = 0
        self._lock = threading.Lock()
        self._open: dict[int, _Watched] = {}
        self._ids = itertools.count()
        self._watcher: threading.Thread | None = None

    def watch(self, frames: Iterable[bytes], context: grpc.ServicerContext, what: str = "request stream"
              ) -> Iterator[bytes]:
        """``frames`` (a request stream), cancelled when its caller stops delivering them."""
        if self.idle_s is None:
            yield from frames
            return
        key, entry = self._add(context, what, waiting=True)
        try:
            for f in frames:  # the tier waits for its caller: charged
                self._moved(entry, f)
                yield f  # the tier works on it: not charged
                self._wait(entry)
        finally:
            self._remove(key)

    def reply(self, frames: Iterable[bytes], context: grpc.ServicerContext, what: str) -> Iterator[bytes]:
        """``frames`` (a reply stream), cancelled when gRPC stops taking them: its caller does not read."""
        if self.idle_s is None:
            yield from frames
            return
        key, entry = self._add(context, what, waiting=False)
        try:
            for f in frames:  # making the frame: not charged
                self._wait(entry)
                yield f  # gRPC sends it, as flow control lets it: charged until it asks for the next
                self._moved(entry, f)
        finally:
            self._remove(key)

    def _add(self, context: grpc.ServicerContext, what: str, waiting: bool) -> tuple[int, _Watched]:
        assert self.idle_s is not None
        now = time.monotonic()
        entry = _Watched(context, what, self.idle_s, now if waiting else None, now)
        with self._lock:
            key = next(self._ids)
            self._open[key] = entry
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._loop, name="tier-idle-streams", daemon=True)
                self._watcher.start()
        return key, entry

    def _remove(self, key: int) -> None:
        with self._lock:
            self._open.pop(key, None)

    def _moved(self, entry: _Watched, frame: object) -> None:
        """A frame went (arrived, or was taken by gRPC): the wait is charged, the frame's bytes credited."""
        assert self.idle_s is not None
        n = len(frame) if isinstance(frame, bytes | bytearray | memoryview) else 0
        now = time.monotonic()
        with self._lock:
            spent = 0.0 if entry.since is None else now - entry.since
            gain = n / self.min_bytes_s if self.min_bytes_s else self.idle_s
            entry.left = min(self.idle_s, max(entry.left - spent, 0.0) + gain)
            entry.since = None
            entry.bytes += n
            entry.frames += 1

    def _wait(self, entry: _Watched) -> None:
        with self._lock:
            entry.since = time.monotonic()

    def _loop(self) -> None:
        assert self.idle_s is not None
        while True:
            time.sleep(min(1.0, self.idle_s / 4))
            now, stalled = time.monotonic(), []
            with self._lock:
                if not self._open:
                    self._watcher = None
                    return
                for key, e in list(self._open.items()):
                    if e.since is not None and now - e.since > e.left:
                        del self._open[key]  # once: its handler may never run again to unwatch it
                        stalled.append(e)
            for e in stalled:
                self._cancel(e, now)

    def _cancel(self, e: _Watched, now: float) -> None:
        try:
            if not e.context.is_active():  # its caller went away (or it ended): nothing to free, nothing refused
                return
            peer = e.context.peer()
        except Exception:  # noqa: BLE001 - the call is gone already
            return
        why = (f"it moved {e.bytes} bytes in {e.frames} frame(s) in {now - e.started:.1f} s: a stream must move a "
               f"frame at least every {self.idle_s:g} s and {self.min_bytes_s:g} bytes/s on average (it holds "
               "one of the tier's worker threads)")
        log.warning("cancelled %s from %s: %s", e.what, peer, why)
        with self._lock:  # counted before the caller can see it: whoever it tells may look at once
            self.cancelled += 1
        if self.on_cancel is not None:
            self.on_cancel(grpc.StatusCode.RESOURCE_EXHAUSTED)
        details = f"{IDLE_CANCELLED}{self.tier}: {e.what}: {why}"  # marked: its caller takes it as the tier's word
        try:  # with a status that says why: grpc's call object (internal); a plain CANCELLED otherwise
            e.context._rpc_event.call.cancel(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], details)
        except Exception:  # noqa: BLE001 - another grpc version: cancel all the same
            e.context.cancel()


class TierServicer:
    """The RPCs of ``splitfed.v1.Tier`` over one tier (raw-bytes handlers, parsed here)."""

    def __init__(self, tier: Tier, limits: wire.Limits, allowed_models: Iterable[str] = (),
                 next: GrpcTierClient | None = None, stream_idle_s: float | None = STREAM_IDLE_S,
                 require_secret: bool = False, stream_min_bytes_s: float = STREAM_MIN_BYTES_S) -> None:
        self.idle_streams = _IdleStreams(stream_idle_s, stream_min_bytes_s, getattr(tier, "name", ""))
        # a tier with a coordinator token holds no open segment: every load must carry a binding secret
        self.require_secret = require_secret
        self.idle_streams.on_cancel = self.count_refusal
        self.tier = tier
        self.limits = limits
        self.allowed = set(allowed_models)
        self.next = next  # described when this tier is: the coordinator checks who it forwards to
        self.instance = secrets.token_hex(8)
        self.started = time.monotonic()
        self._refused: collections.Counter[str] = collections.Counter()  # status name -> calls refused
        self._refused_lock = threading.Lock()

    def refusals(self) -> str:
        """``"3 call(s) refused (2 INVALID_ARGUMENT, 1 NOT_FOUND)"``, or "" when none was."""
        with self._refused_lock:
            counts = self._refused.most_common()
        if not counts:
            return ""
        return (f"{sum(n for _, n in counts)} call(s) refused ("
                + ", ".join(f"{n} {code}" for code, n in counts) + ")")

    def handler(self) -> grpc.GenericRpcHandler:
        # no (de)serializers: a message that does not parse must give INVALID_ARGUMENT, not INTERNAL
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Step": grpc.unary_unary_rpc_method_handler(self.Step),
            "StepStream": grpc.stream_stream_rpc_method_handler(self.StepStream),
            "Load": grpc.stream_unary_rpc_method_handler(self.Load),
            "Fetch": grpc.unary_stream_rpc_method_handler(self.Fetch),
            "Release": grpc.unary_unary_rpc_method_handler(self.Release),
            "Reduce": grpc.unary_stream_rpc_method_handler(self.Reduce),
            "Describe": grpc.unary_unary_rpc_method_handler(self.Describe),
            "Probe": grpc.unary_unary_rpc_method_handler(self.Probe),
        })

    # ------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _guard(self, context: grpc.ServicerContext, what: str) -> Iterator[None]:
        """Map refusals to their status; pass the caller's deadline on to the next tier."""
        remaining = context.time_remaining()
        token = DEADLINE.set(None if remaining is None else time.monotonic() + remaining)
        try:
            yield
        except grpc.RpcError:
            raise  # the caller went away while we read its stream
        except TierError as e:
            self._refuse(context, status_of(e), str(e))
        except SplitfedError as e:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:  # noqa: BLE001 - a bug must not take the server down
            log.exception("tier %s: %s failed", self.tier.name, what)
            self._refuse(context, grpc.StatusCode.INTERNAL,
                         f"tier {self.tier.name}: internal error in {what}: {type(e).__name__}: {e}")
        finally:
            DEADLINE.reset(token)

    def _refuse(self, context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
        self.count_refusal(code)
        self._abort(context, code, details)

    def count_refusal(self, code: grpc.StatusCode) -> None:
        with self._refused_lock:
            self._refused[code.name] += 1

    @staticmethod
    def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
        context.set_trailing_metadata((SENT_BY_TIER,))  # the tier's word: its caller adds no diagnosis of its own
        context.abort(code, details[:2000])
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------ data path

    def Step(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._guard(context, "step"):
            head, items = wire.read_all([request], wire.F_STEP, self.limits, what="step request")
            assert isinstance(head, pb.StepHeader)
            if head.phase != pb.PHASE_STEP:
                raise InvalidArgument(f"Step carries PHASE_STEP only, got phase {head.phase}: use StepStream")
            self._check(head, items)
            # the reply (the activation's gradient) must fit one message: refuse before anything happens
            act = items[0].tensor
            reply_codec = wire.codec_of(head.reply_codec)
            need = tc.payload_size(act.dtype, tuple(act.shape), reply_codec.for_tensor(act))
            if wire.padded(need) > self.limits.unary_bytes:
                raise ResourceExhausted(f"the reply of this step ({need} bytes) does not fit one message of "
                                        f"{self.limits.unary_bytes}: send it with StepStream")
            frames = list(self._run(head, items, self.limits.unary_bytes, reply_codec))
            if len(frames) != 1:  # pragma: no cover - guarded above
                raise ResourceExhausted("the reply does not fit one message: send the step with StepStream")
        return frames[0]

    def StepStream(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        with self._guard(context, "step"):
            head, items = wire.read_all(self.idle_streams.watch(request_iterator, context,
                                                                "StepStream request stream"),
                                        wire.F_STEP, self.limits, what="step request")
            assert isinstance(head, pb.StepHeader)
            self._check(head, items)
            frames = self._run(head, items)
        # built lazily: each frame's copy overlaps the sending of the last
        yield from self.idle_streams.reply(frames, context, "StepStream reply")

    def _check(self, head: pb.StepHeader, items: Sequence[wire.Received]) -> None:
        check_ids(head.run_id, head.client_id, head.secret)
        names = PHASE_TENSORS.get(head.phase)
        if names is None:
            raise InvalidArgument(f"unknown phase {head.phase}")
        none = head.phase == pb.PHASE_BACKWARD  # or no gradient: none reached the forward's output
        if len(items) != len(names) and not (none and not items):
            also = "; none: no gradient reached the forward's output" if none else ""
            raise InvalidArgument(f"{pb.Phase.Name(head.phase)} carries {'at most ' if none else ''}{len(names)} "
                                  f"tensor(s) ({', '.join(names)}{also}), got {len(items)}")
        if head.round < 0 or head.seq < 0:
            raise InvalidArgument(f"round and seq must be >= 0, got {head.round}, {head.seq}")

    def _run(self, head: pb.StepHeader, items: Sequence[wire.Received], chunk: int = 0,
             reply_codec: tc.Codec | None = None) -> Iterator[bytes]:
        """Call the tier for the phase; the reply's frames (``reply_codec``: the head's, if already read)."""
        if reply_codec is None:
            reply_codec = wire.codec_of(head.reply_codec)
        key = StepKey(head.run_id, head.client_id, int(head.round), int(head.seq), head.secret)
        result = pb.StepResult()
        if head.phase == pb.PHASE_STEP:
            reply = self.tier.step(key, items[0].tensor, items[1].tensor)
            out, result.loss, result.correct = reply.grad, reply.loss, reply.correct
        elif head.phase == pb.PHASE_FORWARD:
            out = self.tier.forward(key, items[0].tensor)
        else:
            out = self.tier.backward(key, items[0].tensor if items else None)
        result.has_tensor = out is not None
        tensors = [] if out is None else [("", tc.encode(out, reply_codec))]
        return wire.iter_frames(result, tensors, chunk or self.limits.chunk_bytes)

    # ------------------------------------------------------------ control

    def Load(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        with self._guard(context, "load"):
            head, items = wire.read_all(self.idle_streams.watch(request_iterator, context, "Load request stream"),
                                        wire.F_LOAD, self.limits, what="load request")
            assert isinstance(head, pb.LoadHeader)
            self.tier.load(self._segment_load(head, items))
        return b""

    def _segment_load(self, h: pb.LoadHeader, items: Sequence[wire.Received]) -> SegmentLoad:
        check_ids(h.run_id, h.client_id, h.secret)
        if self.require_secret and not h.secret:
            raise PermissionDenied(f"tier {self.tier.name} refuses a load without a binding secret: it has a "
                                   "coordinator token, and a segment without a secret would be open to every "
                                   "device (load with the client's secret)")
        check_replica(h.replica, h.base, h.base_secret)
        spec = self._model(h.model)
        try:
            optim = OptimConfig(h.optim.name or "sgd", h.optim.lr, h.optim.momentum, h.optim.weight_decay)
        except (ValueError, ConfigError) as e:
            raise InvalidArgument(f"load: {e}") from None
        names = [it.name for it in items]
        if len(set(names)) != len(names) or "" in names:
            raise InvalidArgument("load: state tensors need distinct, non-empty names")
        if items and not h.has_state:
            raise InvalidArgument("load: tensors sent but has_state is false")
        state = {it.name: it.tensor for it in items} if h.has_state else None
        return SegmentLoad(h.run_id, h.client_id, int(h.round), spec, int(h.start), int(h.stop), h.replica, state,
                           optim, int(h.seed), bool(h.loss_here), h.secret, base=h.base, base_secret=h.base_secret)

    def _model(self, m: pb.ModelSpec, keep: bool = True) -> ModelSpec:
        """The spec if this tier serves and can build it; else the refusal (PERMISSION_DENIED, ...).

        ``keep=False`` (Describe): a zoo model sized by its options is built on the meta device, where it
        allocates nothing and nothing of it is kept; a load builds it for real."""
        if m.name not in ZOO and m.name not in self.allowed:
            raise PermissionDenied(f"tier {self.tier.name} does not serve model {m.name!r} "
                                   "(zoo models only, unless started with --allow-model)")
        spec = wire.model_of(m)
        try:
            from splitfed.engine import template

            if keep or spec.name not in ZOO or template.small(spec):
                template.num_blocks(spec)  # build once here: a model that does not build is the caller's error
            else:
                template.admit(spec)  # sized on meta first: a model too large is refused before it is built
                with torch.device("meta"):
                    model_blocks(spec)
        except SplitfedError:
            raise
        except (TypeError, ValueError, RuntimeError) as e:
            raise InvalidArgument(f"model {spec.name!r} does not build: {type(e).__name__}: {e}") from None
        return spec

    def Fetch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        with self._guard(context, "fetch"):
            ref = _client_ref(request)
            blocks = (int(ref.start), int(ref.stop)) if ref.start or ref.stop else None
            state = self.tier.fetch(ref.run_id, ref.client_id, ref.secret, blocks)
            out = wire.iter_frames(None, [(k, tc.encode(v)) for k, v in sorted(state.items())],
                                   self.limits.chunk_bytes)
        yield from self.idle_streams.reply(out, context, "Fetch reply")

    def Release(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._guard(context, "release"):
            ref = _client_ref(request)
            self.tier.release(ref.run_id, ref.client_id, ref.secret)
        return b""

    def Reduce(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        with self._guard(context, "reduce"):
            req = _parse(pb.ReduceRequest, request)
            items = self._reduce_items(req)
            reduced = self.tier.reduce(req.run_id, items)
            head = pb.ReduceResult(refused=list(reduced.refused), reasons=list(reduced.refused.values()))
            if not wire.head_fits(head, self.limits):  # else gRPC refused to send it: "Sent message larger than max"
                raise ResourceExhausted(f"reduce: the reply would leave out {len(reduced.refused)} of the "
                                        f"{len(items)} client(s), and their ids and reasons ({head.ByteSize()} bytes) "
                                        f"do not fit one message ({self.limits.max_message_bytes} bytes): ask "
                                        "about fewer clients at once")
            out = wire.iter_frames(head, [(k, tc.encode(v)) for k, v in sorted(reduced.means.items())],
                                   self.limits.chunk_bytes)
        yield from self.idle_streams.reply(out, context, "Reduce reply")

    def _reduce_items(self, req: pb.ReduceRequest) -> list[ReduceItem]:
        """The request's items, checked (:func:`~splitfed.engine.link.check_reduce`)."""
        check_reduce(req.run_id, req.items, self.tier.name, int(getattr(self.tier, "max_clients", 0)))
        return [ReduceItem(it.client_id, it.secret, float(it.weight)) for it in req.items]

    def Describe(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._guard(context, "describe"):
            req = _parse(pb.DescribeRequest, request)
            info = self.describe(req.model if req.HasField("model") else None, shallow=req.shallow)
        return info.to_pb().SerializeToString()

    def Probe(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._guard(context, "probe"):
            req = _parse(pb.ProbeRequest, request)
            if req.reply_bytes < 0:
                raise InvalidArgument(f"reply_bytes must be >= 0, got {req.reply_bytes}")
            if req.reply_bytes > self.limits.unary_bytes:
                raise ResourceExhausted(f"reply_bytes must be at most one message, {self.limits.unary_bytes}, "
                                        f"got {req.reply_bytes}")
            reply = pb.ProbeReply(payload=bytes(req.reply_bytes)).SerializeToString()
        return reply

    def describe(self, model: pb.ModelSpec | None = None, shallow: bool = False) -> TierInfo:
        """This tier as ``Describe`` answers: asks the next tier for its instance (unless ``shallow``: one hop
        only, whatever the wiring), and sizes ``model``."""
        model_error = ""
        if model is not None:
            try:
                self._model(model, keep=False)
            except TierError as e:
                model_error = f"{e.code}: {e}"
            except SplitfedError as e:  # a model that does not build: the answer says so, as a Load would
                model_error = f"INVALID_ARGUMENT: {e}"
        next_instance = next_error = ""
        if self.next is not None and not shallow:
            try:
                next_instance = self.next.describe(deadline_s=min(10.0, self.next.deadline_s), shallow=True).instance
            except TierError as e:
                next_error = f"{e.code}: {e}"
        holding = getattr(self.tier, "holding", None)
        segments, runs, steps = holding() if holding is not None else (0, [], 0)
        limits = current_limits()
        return TierInfo(
            protocol=PROTOCOL, version=splitfed.__version__, name=self.tier.name, instance=self.instance,
            next_address=self.next.address if self.next is not None else "", next_instance=next_instance,
            next_error=next_error, idle_release_s=getattr(self.tier, "idle_release_s", None),
            max_clients=int(getattr(self.tier, "max_clients", 0)), max_model_bytes=limits.model_bytes,
            max_sample_bytes=limits.sample_bytes,
            # what it takes: none above what one call's frames carry (and an int64, whatever the limit)
            max_tensor_bytes=min(self.limits.max_tensor_bytes, self.limits.stream_bytes),
            allowed_models=tuple(sorted(self.allowed)), model_error=model_error, segments=segments, runs=len(runs),
            steps_served=steps, uptime_s=time.monotonic() - self.started, threads=torch.get_num_threads(),
            compute=compute.describe(getattr(self.tier, "torch_device", torch.device("cpu"))),
            next_compress=self.next.codec.name if self.next is not None else "", control_token=self.require_secret)


M = TypeVar("M", bound=Message)


def _parse(message: type[M], raw: bytes) -> M:
    """A request message, or INVALID_ARGUMENT naming it."""
    try:
        return message.FromString(raw)
    except Exception as e:  # noqa: BLE001 - DecodeError and friends
        raise InvalidArgument(f"malformed {message.__name__}: {e}") from None


def _client_ref(raw: bytes) -> pb.ClientRef:
    ref = _parse(pb.ClientRef, raw)
    check_ids(ref.run_id, ref.client_id, ref.secret)
    return ref


def parse_listen(listen: str, what: str = "listen address") -> tuple[str, int]:
    """The address to serve on as ``(HOST, PORT)``: :func:`parse_address` with port 0 (any free port) allowed."""
    return parse_address(listen, what, listen=True)


def check_bindable(listen: str) -> None:
    """Refuse, in one line, an address this host cannot serve on (a port another process holds, a host that is
    not this machine's), before gRPC tries: its own refusal comes after a C-core log line on stderr and says
    only "Failed to bind"."""
    host, port = parse_listen(listen)
    if port == 0:
        return
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except OSError as e:
        raise ConfigError(cannot_listen(listen, e.strerror or e)) from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a port in TIME_WAIT is free
        try:
            s.bind(addr)
        except OSError as e:
            raise ConfigError(cannot_listen(listen, e.strerror or e)) from None


@dataclass
class TierServer:
    """A running tier service; ``stop`` it (or use ``with``)."""

    server: grpc.Server
    tier: Tier
    port: int
    address: str
    health: health.HealthServicer
    next_link: GrpcTierClient | None = None
    servicer: TierServicer | None = None
    stopped: bool = field(default=False)
    closing: threading.Event = field(default_factory=threading.Event)  # set: the housekeeper stops

    def housekeep(self, sweep_s: float | None, status_s: float | None) -> None:
        """Until the server stops: release idle segments (:meth:`Tier.sweep`) every ``sweep_s``, and log
        the tier's status (:meth:`Tier.status`) every ``status_s`` when it changed (None: never)."""
        if sweep_s is None and status_s is None:
            return
        every = min(x for x in (sweep_s, status_s) if x is not None)
        last = {"sweep": time.monotonic(), "status": time.monotonic()}
        said = [""]

        def loop() -> None:
            while not self.closing.wait(every):
                now = time.monotonic()
                try:
                    if sweep_s is not None and now - last["sweep"] >= sweep_s * 0.999:
                        last["sweep"] = now
                        self.tier.sweep()
                    if status_s is not None and now - last["status"] >= status_s * 0.999:
                        last["status"] = now
                        refused = self.servicer.refusals() if self.servicer is not None else ""
                        line = self.tier.status() + (f"; {refused}" if refused else "")
                        if line != said[0]:  # an idle tier does not repeat itself
                            said[0] = line
                            log.info("%s", line)
                except Exception:  # noqa: BLE001 - housekeeping must outlive a bad pass; say why
                    log.exception("tier %s: housekeeping failed", self.tier.name)

        threading.Thread(target=loop, name=f"tier-{self.tier.name}-housekeeper", daemon=True).start()

    def stop(self, grace: float | None = 1.0) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.closing.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        if self.next_link is not None:
            self.next_link.close()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops or ``timeout`` passes; whether it stopped, as ``threading.Event.wait``
        says (gRPC's ``wait_for_termination`` says the opposite: whether the timeout passed)."""
        return not self.server.wait_for_termination(timeout)

    def __enter__(self) -> TierServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(0)


def serve_tier(name: str = "edge", listen: str = "127.0.0.1:0", next_address: str | None = None, *,
               tls: TlsConfig | None = None, token: str | None = None, insecure: bool = False,
               max_workers: int = 32, max_concurrent_rpcs: int = 512, limits: wire.Limits | None = None,
               next_compress: str = "none", next_deadline_s: float = 60.0, next_token: str | None = None,
               coordinator_token: str | None = None, allowed_models: Iterable[str] = (), tier: Any = None,
               max_batch: int = 4096,
               idle_release_s: float | None = IDLE_RELEASE_S, status_every_s: float | None = None,
               torch_device: str = "cpu", stream_idle_s: float | None = STREAM_IDLE_S,
               stream_min_bytes_s: float = STREAM_MIN_BYTES_S) -> TierServer:
    """Start a tier service on ``listen`` (port 0: any free port; see ``.port``/``.address``).

    Serving in plaintext needs ``insecure=True``: TLS is the default, not an
    option to forget. ``next_address`` makes this tier forward to the next one
    (with the same TLS config and, unless ``next_token`` is given, the same token: the devices' token, as it
    only steps there). With ``coordinator_token`` the control calls (Load, Fetch, Release, Reduce) need that token,
    ``token`` (the devices') allows the rest only, and a load without a binding secret is refused.
    ``tier`` replaces the :class:`Tier` (tests, benchmarks). Segments unused for
    ``idle_release_s`` (None: never) are released, checked every ``min(60, idle_release_s / 4)`` s;
    every ``status_every_s`` (None: never) the tier logs its status if it changed. ``torch_device`` (``cpu``,
    ``cuda``, ``cuda:N``; checked here) is where the tier computes. A stream that stops making progress is cancelled
    (None: never): a request stream (StepStream, Load) whose caller sends nothing for ``stream_idle_s``, or less
    than ``stream_min_bytes_s`` on average (empty frames), and a reply stream (Fetch, Reduce, StepStream's) whose
    caller does not read it for as long: either would hold one of the ``max_workers`` threads.
    """
    if tls is None and not insecure:
        raise ConfigError("refusing to serve without TLS: give a certificate and key (--tls-cert, --tls-key; "
                          "--tls-ca for mutual TLS), or --insecure to serve in plaintext on purpose")
    host, _ = parse_listen(listen)
    check_bindable(listen)
    if next_address is not None:
        parse_address(next_address, "next tier address")
    dev = compute.torch_device(torch_device)
    limits = limits or wire.Limits()
    next_link: Link | None = None
    client = None
    if next_address is not None:
        client = GrpcTierClient(next_address, tls=tls, token=next_token if next_token is not None else token,
                                deadline_s=next_deadline_s, compress=next_compress, limits=limits, onward_of=name)
        next_link = client
    server: grpc.Server | None = None
    try:  # whatever refuses to start, the next tier's channel (and a bound port) is let go of, not left to the GC
        the_tier = tier if tier is not None else Tier(name, next=next_link, max_batch=max_batch,
                                                      idle_release_s=idle_release_s,
                                                      torch_device=dev)
        servicer = TierServicer(the_tier, limits, allowed_models, next=client, stream_idle_s=stream_idle_s,
                                require_secret=bool(coordinator_token), stream_min_bytes_s=stream_min_bytes_s)
        interceptors = ([TokenInterceptor(token, on_refuse=servicer.count_refusal, coordinator=coordinator_token,
                                          control=[method(m) for m in CONTROL])]
                        if token or coordinator_token else [])
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"tier-{name}"),
                             interceptors=interceptors, options=server_options(limits),
                             maximum_concurrent_rpcs=max_concurrent_rpcs)
        server.add_generic_rpc_handlers((servicer.handler(),))
        hs = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(hs, server)
        try:
            port = (server.add_secure_port(listen, tls.server_credentials()) if tls
                    else server.add_insecure_port(listen))
        except RuntimeError as e:
            raise ConfigError(cannot_listen(listen, e)) from None
        if not port:
            raise ConfigError(cannot_listen(listen))
        server.start()
    except BaseException:
        if server is not None:
            server.stop(None)
        if client is not None:
            client.close()
        raise
    for service in ("", SERVICE):
        hs.set(service, health_pb2.HealthCheckResponse.SERVING)
    served = TierServer(server, the_tier, port, f"{host}:{port}", hs, client, servicer)
    idle = getattr(the_tier, "idle_release_s", None)
    served.housekeep(None if idle is None else min(60.0, idle / 4),
                     status_every_s if hasattr(the_tier, "status") else None)
    return served
