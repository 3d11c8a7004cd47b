"""The gRPC link: a device's (or a tier's) client of the next tier, as ``Link`` and ``TierControl``.

Every call has a deadline (``deadline_s``, shortened to what the caller of a
forwarding tier has left). Calls that fail with UNAVAILABLE are retried here,
with backoff, within that deadline: gRPC's own retry policy stops silently
once a call has sent more than ``grpc.per_rpc_retry_buffer_size`` (256 KiB),
which every real activation does, so it is switched off rather than relied
on. Retrying is safe because every call is idempotent at the tier: a step
with the same sequence number returns its cached reply and is applied once.
So is gRPC's own RESOURCE_EXHAUSTED of a server at its ``maximum_concurrent_rpcs``
(the tier is busy; none of the call ran), with the same backoff and budget; a
RESOURCE_EXHAUSTED the tier sends itself (a memory or size refusal) is its
answer, and is not.
"""

from __future__ import annotations

import math
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, TypeVar

import grpc
import torch
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitfed.aggregate import wire_dtype
from splitfed.engine.link import check_blocks
from splitfed.engine.types import Reduced, ReduceItem, SegmentLoad, State, StepKey, StepReply
from splitfed.errors import ConfigError, InvalidArgument, NotFound, ResourceExhausted, TierError
from splitfed.models.zoo import ModelSpec
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.address import host_name, is_ip, look_up, parse_address
from splitfed.transport.describe import PROTOCOL, TierInfo, this_version
from splitfed.transport.errors import (
    DeadlineExceeded,
    RpcFailed,
    TlsRefused,
    error_of,
    sent_by_tier,
)
from splitfed.transport.pb import SERVICE, method, pb
from splitfed.transport.security import TlsConfig, bearer, tls_refusal

T = TypeVar("T")

# what gRPC says when a TLS handshake was refused (and when a connection just went away): only then is
# one handshake tried to tell which (a refused connection, a DNS failure or a timeout is no TLS question)
_TLS_SYMPTOMS = ("handshake", "ssl", "tls", "closed", "reset", "eof", "certificate", "verification")

# what gRPC says of an address that took no connection. Of a host name that resolves to several addresses
# (localhost: ::1 and 127.0.0.1) gRPC tries each and reports only the last one's error: a refused ::1 hid
# the TLS refusal of the 127.0.0.1 a tier listens on. Only then are the name's addresses tried one by one.
_NO_CONNECTION = ("failed to connect to remote host", "connection refused", "network is unreachable",
                  "no route to host", "cannot assign requested address", "address not available")

# gRPC's own refusal of a call beyond a server's maximum_concurrent_rpcs (grpc/_server.py: "Concurrent RPC limit
# exceeded!"): a busy tier, and nothing of the call ran. gRPC's other RESOURCE_EXHAUSTED (a message above the size
# limit) and the tier's own (marked sent-by-tier) would come back the same if retried.
_OVERLOADED = "concurrent rpc limit exceeded"

# the hints of a refusal that ping's or a run's connection fixes with its flags or run-config keys
PLAINTEXT_CLOSED_HINT = ("a tier that serves TLS closes a plaintext connection this way: connect with the CA that "
                         "signed its certificate, e.g. --tls-ca / tls-ca")
NO_TOKEN_HINT = "this connection sent no token: give --token-file / token-file, a file holding the tier's token"


# a token the tier refused: which file to fix, for ping's or a run's connection
WRONG_TOKEN_HINT = ("the tier holds another token than this connection's: check --token-file / token-file, and for a "
                    "run's coordinator coordinator-token-file, which the tier must hold too: splitfed tier "
                    "--coordinator-token-file")


def onward_hints(tier: str) -> tuple[str, str, str]:
    """The same three hints (plaintext closed, no token, another token) for the connection tier ``tier`` opens to
    its ``--next``: it
    is fixed with that tier's own flags (``splitfed tier`` takes no ``--tls-ca`` without ``--tls-cert``, and
    presents its own ``--token-file``), and its error reaches ping (as the tier's ``next_error``) and a run (as the
    relayed error of a step) alike."""
    return (f"its next tier serves TLS, and closes a plaintext connection this way: start tier {tier} with "
            "--tls-cert, --tls-key and, as --tls-ca, the CA that signed its next tier's certificate; or serve its "
            "next tier --insecure too, on a trusted loopback only",
            f"tier {tier} sent no token: start it with --token-file, a file holding its next tier's token",
            f"its next tier holds another token than tier {tier}'s --token-file: a tier presents its own token to "
            "its --next, so the two must hold the same one")

# what gRPC says when the server at the address speaks HTTP but not gRPC: an HTTP/1 server (a web server, or
# Flower 1.42's SuperLink port, whose Fleet and Control APIs are HTTP) or an HTTP/2 one that answers with an HTTP
# status (a web server, a proxy with no route there). The address is wrong, not the tier busy: said so, and not
# retried. But 502, 503 and 504 are a gRPC proxy's word for a tier behind it that is away (restarting): retried.
_HTTP1 = ("failed parsing http/2", "http1.x server")
_HTTP_STATUS = re.compile(r"received http2 header with status: (\d+)")
_PROXY_UNAVAILABLE = (502, 503, 504)

DEADLINE: ContextVar[float | None] = ContextVar("splitfed_deadline", default=None)
"""Monotonic time by which the call being served must answer (set by the server for its next hop)."""

HOP_MARGIN_S = 0.05  # a forwarding tier gives up on its next hop this much before its caller does

# the longest deadline a call takes (and so any setting that becomes one: round-timeout-s, call-timeout-s).
# gRPC keeps a deadline as an int64 of nanoseconds since the epoch (up to the year 2262): a later one overflows
# into the past, and every call failed at once with "Deadline Exceeded" (from 7.45e9 s on, in 2026). 1e9 s,
# about 32 years, is as good as no limit.
MAX_DEADLINE_S = 1e9


def deadline_bound(what: str, seconds: float) -> str:
    """The refusal of ``what`` = ``seconds`` beyond :data:`MAX_DEADLINE_S` (the same words wherever it is
    checked)."""
    years = MAX_DEADLINE_S / (365.25 * 86400)
    return (f"{what} must be at most {MAX_DEADLINE_S:,.0f} s (about {years:.0f} years, as good as no limit; a gRPC "
            f"deadline beyond it overflows), got {seconds:g}")

_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


def channel_options(limits: wire.Limits) -> list[tuple[str, int | str]]:
    return [
        *limits.grpc_options(),
        ("grpc.enable_retries", 0),  # explicit retries instead (see module doc)
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        *_KEEPALIVE,
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def server_options(limits: wire.Limits) -> list[tuple[str, int | str]]:
    return [
        *limits.grpc_options(),
        ("grpc.so_reuseport", 0),  # two tiers never share a port by accident
        *_KEEPALIVE,
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


class GrpcTierClient:
    """A tier at ``address`` as a ``Link`` (data path) and a ``TierControl`` (load/fetch/release/reduce).

    Without ``tls`` the channel is plaintext (``insecure=True`` says so
    explicitly). ``compress`` names the codec of the tensors sent (activations,
    gradients up) and asked for in replies (gradients, outputs down).
    ``bytes_up`` / ``bytes_down`` count tensor payload bytes exactly as
    ``InProcessLink`` does. A step whose request and reply each fit one message
    goes as a unary ``Step`` call (one message each way, the cheapest gRPC
    call); anything larger, and the U-shape halves, as ``StepStream``.
    ``onward_of`` names the tier whose ``--next`` this client is: a refused connection's hints then name that
    tier's flags (:func:`onward_hints`), not ping's or a run's (None: a device's, ping's or a run's client).
    Thread-safe: many devices or a tier's many clients may share one client.
    """

    def __init__(self, address: str, *, tls: TlsConfig | None = None, token: str | None = None,
                 insecure: bool = False, deadline_s: float = 60.0, compress: str = "none", retries: int = 5,
                 backoff_s: float = 0.1, limits: wire.Limits | None = None, onward_of: str | None = None,
                 interceptors: Sequence[grpc.UnaryUnaryClientInterceptor | grpc.StreamStreamClientInterceptor
                                        | grpc.StreamUnaryClientInterceptor | grpc.UnaryStreamClientInterceptor]
                 = ()) -> None:
        if not (math.isfinite(deadline_s) and deadline_s > 0):
            raise ConfigError(f"deadline_s must be a positive number of seconds, got {deadline_s}")
        if deadline_s > MAX_DEADLINE_S:
            raise ConfigError(deadline_bound("deadline_s", deadline_s))
        if insecure and tls is not None:
            raise ConfigError("insecure=True contradicts a TLS config: choose one")
        if not (isinstance(retries, int) and retries >= 0):
            raise ConfigError(f"retries must be a whole number >= 0, got {retries!r}")
        if not (math.isfinite(backoff_s) and backoff_s >= 0):  # else the first retry's sleep raises ValueError
            raise ConfigError(f"backoff_s must be a number of seconds >= 0, got {backoff_s}")
        parse_address(address, "tier address")
        self.address = address
        self.deadline_s = float(deadline_s)
        self.codec = tc.Codec.parse(compress)
        self._reply_codec = wire.codec_pb(self.codec)  # copied into each call's header
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.limits = limits or wire.Limits()
        channel = _channel(address, tls, self.limits)
        self._raw_channel = channel
        self._tls = tls
        self._plaintext_hint, self._no_token_hint, self._wrong_token_hint = (
            onward_hints(onward_of) if onward_of is not None
            else (PLAINTEXT_CLOSED_HINT, NO_TOKEN_HINT, WRONG_TOKEN_HINT))
        self._health_failed: tuple[grpc.StatusCode, str, float] | None = None
        if interceptors:
            channel = grpc.intercept_channel(channel, *interceptors)
        self._metadata = (bearer(token),) if token else ()
        self._step = channel.unary_unary(method("Step"))
        self._step_stream = channel.stream_stream(method("StepStream"))
        self._load = channel.stream_unary(method("Load"))
        self._fetch = channel.unary_stream(method("Fetch"))
        self._release = channel.unary_unary(method("Release"))
        self._reduce = channel.unary_stream(method("Reduce"))
        self._describe = channel.unary_unary(method("Describe"))
        self._probe = channel.unary_unary(method("Probe"))
        self._health = health_pb2_grpc.HealthStub(channel)
        self._lock = threading.Lock()
        self.bytes_up = 0
        self.bytes_down = 0
        self.retried = 0  # attempts repeated after UNAVAILABLE or an overloaded tier (for tests and logs)
        self._sent_most = (0, 0)  # the largest tensor and call (bytes) sent so far: see _read_limits
        self._means_most = self._sent_most  # the same, of those tensors' means as a Reduce sends them back

    # ------------------------------------------------------------ calls

    def _budget(self, cap: float | None = None) -> float:
        """Seconds this call may take: our deadline (or ``cap``), or less if our caller must answer sooner."""
        budget = self.deadline_s if cap is None else min(cap, self.deadline_s)
        outer = DEADLINE.get()
        if outer is not None:
            budget = min(budget, outer - time.monotonic() - HOP_MARGIN_S)
        return budget

    def _call(self, what: str, attempt: Callable[[float], T], cap: float | None = None) -> T:
        budget = self._budget(cap)
        if budget <= 0:
            raise DeadlineExceeded(f"tier {self.address}: no time left for {what} (the caller's deadline passed)")
        end = time.monotonic() + budget
        tries = 0
        while True:
            left = end - time.monotonic()
            try:
                if left <= 0:
                    raise DeadlineExceeded(f"tier {self.address}: {what}: deadline of {budget:.3g}s exceeded")
                return attempt(left)
            except grpc.RpcError as e:
                code, details = _status(e)
                by_tier = sent_by_tier(e)
                if _retryable(code, details, by_tier) and tries < self.retries:
                    pause = self.backoff_s * (2 ** tries) * (0.5 + random.random() / 2)
                    if time.monotonic() + pause < end:
                        tries += 1
                        with self._lock:
                            self.retried += 1
                        time.sleep(pause)
                        continue
                raise self._error(code, details, what, tries, budget, end - time.monotonic(),
                                  by_tier=by_tier) from None

    def _error(self, code: grpc.StatusCode, details: str, what: str, tries: int, budget: float,
               left: float = 0.0, by_tier: bool = False) -> TierError:
        """The error of a failed call; ``left``: seconds of the call's deadline still left, the most a TLS
        diagnosis (:func:`~splitfed.transport.security.tls_refusal`) may take. ``by_tier``: the tier sent the
        status itself (:func:`~splitfed.transport.errors.sent_by_tier`), so it says nothing of this side's
        connection, TLS, token or deadline: a forwarding tier relays what its next tier said, already
        diagnosed there, and a hint about this link would send the user to fix one that works."""
        where = f"tier {self.address}: {what}"
        if by_tier:
            if code == grpc.StatusCode.UNAVAILABLE:
                return error_of(code, f"{where}: unavailable after {tries + 1} attempt(s): {details}")
            if code == grpc.StatusCode.NOT_FOUND and tries:
                return NotFound(f"{where}: {details} (the tier was unreachable before: it may have restarted and "
                                "lost this client's segment; load it again)")
            return error_of(code, f"{where}: {details}")
        if _not_grpc(details):
            return error_of(code, f"{where}: no gRPC server at {self.address}: an HTTP server answered ({details}); "
                                  "check the address and port: a splitfed tier's, not a web server's or Flower's "
                                  "SuperLink's")
        host, port = parse_address(self.address, "tier address")
        at, connect_to = "", ""
        if code == grpc.StatusCode.UNAVAILABLE and left > 0.05 and _took_no_connection(details):
            # a host name: gRPC's error is its last address's; another may have answered, and said more
            t0 = time.monotonic()
            answer = self._answer_of_another_address(host, port, min(3.0, left))
            left -= time.monotonic() - t0
            if answer is not None:
                target, ip, code, new_details = answer
                last = details.rpartition("last error: ")[2] or details
                at = (f" (said by {target}, an address of {host_name(host)}; gRPC reported only the last address "
                      f"it tried: {last})")
                details = new_details
                connect_to = ip  # the certificate is still checked for the name, not the address
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(f"{where}: no answer within the deadline of {budget:.3g}s ({details}){at}")
        if code == grpc.StatusCode.UNAVAILABLE:
            hint = ""
            tls = self._tls
            if tls is not None and left > 0.05 and any(w in details.lower() for w in _TLS_SYMPTOMS):
                # a refused handshake looks like this, and so does a tier going away: one handshake tells
                refusal = tls_refusal(host, port, tls, timeout_s=min(3.0, left), connect_to=connect_to)
                if refusal is None and "certificate_verify_failed" in details.lower():  # by gRPC's own roots
                    refusal = (f"this side does not trust the tier's certificate ({details}): give the CA that "
                               "signed it (--tls-ca / tls-ca)")
                if refusal:
                    return TlsRefused(f"{where}: TLS refused: {refusal}{at}")
            elif "socket closed" in details.lower():
                hint = f" ({self._plaintext_hint})"
            return error_of(code, f"{where}: unavailable after {tries + 1} attempt(s): {details}{hint}{at}")
        if code == grpc.StatusCode.UNAUTHENTICATED and not self._metadata:  # none sent: no other token to check
            return error_of(code, f"{where}: {details} ({self._no_token_hint}){at}")
        if code == grpc.StatusCode.UNAUTHENTICATED:  # an operator rotating tokens needs to know which file to fix
            return error_of(code, f"{where}: {details} ({self._wrong_token_hint}){at}")
        if code == grpc.StatusCode.NOT_FOUND and tries:
            return NotFound(f"{where}: {details} (the tier was unreachable before: it may have restarted and "
                            f"lost this client's segment; load it again){at}")
        if _retryable(code, details, by_tier):  # gRPC's overload refusal, every attempt
            return error_of(code, f"{where}: busy after {tries + 1} attempt(s): {details} (the tier takes only so "
                                  f"many calls at once, and it stayed at that limit){at}")
        return error_of(code, f"{where}: {details}{at}")

    def _answer_of_another_address(self, host: str, port: int, timeout_s: float
                                   ) -> tuple[str, str, grpc.StatusCode, str] | None:
        """When ``host`` is a name: the first of its addresses that takes a TCP connection on ``port`` and then
        fails a health check with this client's credentials, as (``IP:PORT``, IP, the check's status, its
        details); None when none does (each refuses, as gRPC said, or is silent, or one answers: nothing more to
        tell), or ``host`` is an IP address (gRPC's error is that address's). ``timeout_s`` bounds it all."""
        name = host_name(host)
        if is_ip(name):
            return None
        end = time.monotonic() + timeout_s
        found = look_up(name, port, timeout_s)
        for ip in found if isinstance(found, list) else []:
            target = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            left = end - time.monotonic()
            if left <= 0.01:
                return None
            try:  # an address that refuses, as gRPC's last one did, says no more than it
                socket.create_connection((ip, port), timeout=min(1.0, left)).close()
            except OSError:
                continue
            if end - time.monotonic() <= 0.01:  # no time to ask it: gRPC's error stands
                return None
            failed = self._health_of(target, name, end - time.monotonic())
            if failed is None:  # it answers: nothing more to tell than gRPC's error
                return None
            if failed[0] != grpc.StatusCode.DEADLINE_EXCEEDED:  # else a silent port: no verdict, the next
                return target, ip, *failed
        return None

    def _health_of(self, target: str, name: str, timeout_s: float) -> tuple[grpc.StatusCode, str] | None:
        """A health check of the tier at ``target`` (an IP address of ``name``) with this client's TLS: its
        status and details if it fails, else None."""
        tls = replace(self._tls, server_name=self._tls.server_name or name) if self._tls is not None else None
        channel = _channel(target, tls, self.limits)
        try:
            return _unhealthy(health_pb2_grpc.HealthStub(channel), timeout_s, metadata=self._metadata)
        finally:
            channel.close()

    def _exchange(self, head: pb.StepHeader, enc: list[tuple[str, tc.Encoded]], what: str,
                  unary: bool) -> tuple[pb.StepResult, wire.Received | None]:
        chunk = self.limits.chunk_bytes
        first = wire.frames(head, enc, self.limits.unary_bytes) if unary else []
        unary = len(first) == 1

        def attempt(timeout: float) -> tuple[pb.StepResult, wire.Received | None]:
            if unary:
                replies: Iterable[bytes] = [self._step(first[0], timeout=timeout, metadata=self._metadata)]
            else:
                replies = self._step_stream(wire.iter_frames(head, enc, chunk), timeout=timeout,
                                            metadata=self._metadata)
            result, items = self._read(replies, wire.F_RESULT, self._read_limits(), what, writable=False)
            assert isinstance(result, pb.StepResult)
            if len(items) != int(result.has_tensor):
                raise TierError(f"tier {self.address}: {what}: reply carries {len(items)} tensors")
            return result, (items[0] if items else None)

        return self._call(what, attempt)

    def _data(self, key: StepKey, phase: pb.Phase, tensors: Iterable[tuple[torch.Tensor, tc.Codec]],
              what: str) -> tuple[pb.StepResult, wire.Received | None, int]:
        head = pb.StepHeader(run_id=key.run_id, client_id=key.client_id, round=key.round, seq=key.seq, phase=phase,
                             reply_codec=self._reply_codec, secret=key.secret)
        enc = [("", tc.encode(t, c)) for t, c in tensors]
        self._sending(enc)
        # one message up and (the activation's gradient) one message down: a unary call
        act = enc[0][1] if enc else None  # a backward with no gradient carries none
        unary = (phase == pb.PHASE_STEP and act is not None and wire.single_frame(enc, self.limits.unary_bytes)
                 and wire.padded(tc.payload_size(act.dtype, act.shape, self.codec.for_dtype(act.dtype)))
                 <= self.limits.unary_bytes)
        result, out = self._exchange(head, enc, what, unary)
        return result, out, sum(e.nbytes for _, e in enc)

    def _sending(self, tensors: Sequence[tuple[str, tc.Encoded]]) -> None:
        """Note the largest tensor and call sent (bytes as declared, decoded or as sent): see :meth:`_read_limits`."""
        sizes = [max(e.nbytes, tc.payload_size(e.dtype, e.shape, tc.NONE)) for _, e in tensors]
        means = [tc.payload_size(wire_dtype(e.dtype), e.shape, tc.NONE) for _, e in tensors]
        with self._lock:
            tensor, call = self._sent_most
            self._sent_most = (max(tensor, max(sizes, default=0)), max(call, sum(sizes)))
            tensor, call = self._means_most
            self._means_most = (max(tensor, max(means, default=0)), max(call, sum(means)))

    def _read_limits(self, factor: int = 1, means: bool = False) -> wire.Limits:
        """The limits a reply is read with: this client's, times ``factor``, raised to take back the largest
        tensor and call it has sent. A tier hands back what it took (a fetch, a step's gradient), and whether it
        takes a tensor is its own limit's call: a tier started with ``--max-tensor-mb`` above 512 took tensors
        whose fetch the coordinator's default client then refused, at the round's end, after the training. A
        tier still cannot make this side take more than it sent. ``means``: raised to take back the means of
        what it sent too, as a Reduce sends them (:func:`~splitfed.aggregate.wire_dtype`: a uint8 buffer's
        mean is float64, 8 times its bytes; its reduce was refused after the training)."""
        with self._lock:
            tensor, call = self._sent_most
            mean_tensor, mean_call = self._means_most if means else (0, 0)
        own = self.limits
        most = (max(factor * max(own.max_tensor_bytes, tensor), mean_tensor),
                max(factor * max(own.max_call_bytes, call), mean_call))
        if most == (own.max_tensor_bytes, own.max_call_bytes):
            return own
        return replace(own, max_tensor_bytes=most[0], max_call_bytes=most[1])

    def _read(self, replies: Iterable[bytes], head: int | None, limits: wire.Limits, what: str, *,
              writable: bool = True) -> tuple[Message | None, list[wire.Received]]:
        """A call's reply, read to its end (:func:`wire.read_all`); one that is malformed or too large is refused
        naming this tier and the call, as every other error of a call is."""
        try:
            return wire.read_all(replies, head, limits, writable=writable, what="reply")
        except (InvalidArgument, ResourceExhausted) as e:
            raise type(e)(f"tier {self.address}: {what}: {e}") from None

    def _count(self, up: int, down: wire.Received | None) -> None:
        with self._lock:
            self.bytes_up += up
            self.bytes_down += 0 if down is None else down.nbytes

    # ------------------------------------------------------------ Link

    def step(self, key: StepKey, activation: torch.Tensor, labels: torch.Tensor) -> StepReply:
        result, out, up = self._data(key, pb.PHASE_STEP, [(activation, self.codec), (labels, tc.NONE)],
                                     f"step {key.seq} of {key.client_id}")
        self._count(up, out)
        return StepReply(None if out is None else out.tensor, float(result.loss), int(result.correct))

    def forward(self, key: StepKey, activation: torch.Tensor) -> torch.Tensor:
        _, out, up = self._data(key, pb.PHASE_FORWARD, [(activation, self.codec)],
                                f"forward {key.seq} of {key.client_id}")
        if out is None:
            raise TierError(f"tier {self.address}: forward {key.seq} returned no tensor")
        self._count(up, out)
        return out.tensor

    def backward(self, key: StepKey, grad: torch.Tensor | None) -> torch.Tensor | None:
        _, out, up = self._data(key, pb.PHASE_BACKWARD, [] if grad is None else [(grad, self.codec)],
                                f"backward {key.seq} of {key.client_id}")
        self._count(up, out)
        return None if out is None else out.tensor

    # ------------------------------------------------------------ TierControl

    def load(self, spec: SegmentLoad) -> None:
        head = pb.LoadHeader(
            run_id=spec.run_id, client_id=spec.client_id, round=spec.round, model=wire.model_pb(spec.model),
            start=spec.start, stop=spec.stop, replica=spec.replica,
            optim=pb.OptimConfig(name=spec.optim.name, lr=spec.optim.lr, momentum=spec.optim.momentum,
                                 weight_decay=spec.optim.weight_decay),
            seed=spec.seed, loss_here=spec.loss_here, has_state=spec.state is not None, secret=spec.secret,
            base=spec.base, base_secret=spec.base_secret)
        tensors = [(k, tc.encode(v)) for k, v in sorted((spec.state or {}).items())]
        self._sending(tensors)
        chunk = self.limits.chunk_bytes
        self._call(f"load of {spec.client_id}",
                   lambda t: self._load(wire.iter_frames(head, tensors, chunk), timeout=t, metadata=self._metadata))

    def fetch(self, run_id: str, client_id: str, secret: str = "", blocks: tuple[int, int] | None = None) -> State:
        check_blocks(client_id, blocks)
        a, z = blocks if blocks is not None else (0, 0)
        req = pb.ClientRef(run_id=run_id, client_id=client_id, secret=secret, start=a, stop=z).SerializeToString()
        what = f"fetch of {client_id}"

        def attempt(timeout: float) -> State:
            stream = self._fetch(req, timeout=timeout, metadata=self._metadata)
            _, items = self._read(stream, None, self._read_limits(), what)
            return {it.name: it.tensor for it in items}

        return self._call(what, attempt)

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        req = pb.ClientRef(run_id=run_id, client_id=client_id, secret=secret).SerializeToString()
        self._call(f"release of {client_id}", lambda t: self._release(req, timeout=t, metadata=self._metadata))

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced:
        """The sample-weighted mean of the listed clients' trained segments, computed on the tier (``Reduce``):
        float32 or float64 per key (the coordinator checks which each key must be), and the clients it left out
        with why. Read-only at the tier: retried as a fetch is."""
        req = pb.ReduceRequest(run_id=run_id, items=[pb.ReduceItem(client_id=it.client_id, secret=it.secret,
                                                                   weight=it.weight) for it in items])
        raw = req.SerializeToString()
        what = f"reduce of {len(items)} client(s)"
        where = f"tier {self.address}: {what}"
        listed = {it.client_id for it in items}

        # float32 means of float16 weights, float64 means of int32 buffers: twice the bytes a fetch of them may
        # hold (a float32 model's means: the bytes of a fetch); float64 means of byte buffers: those of what it sent
        limits = self._read_limits(factor=2, means=True)

        def attempt(timeout: float) -> Reduced:
            stream = self._reduce(raw, timeout=timeout, metadata=self._metadata)
            head, got = self._read(stream, wire.F_REDUCE, limits, what)
            if not isinstance(head, pb.ReduceResult):  # pragma: no cover - read_all insists on the head
                raise TierError(f"{where}: the reply carries no ReduceResult")
            if len(head.refused) != len(head.reasons):
                raise TierError(f"{where}: malformed reply: {len(head.refused)} refused client(s) but "
                                f"{len(head.reasons)} reason(s)")
            refused = dict(zip(head.refused, head.reasons, strict=True))
            if len(refused) != len(head.refused):
                raise TierError(f"{where}: malformed reply: a refused client is named twice")
            stranger = next((c for c in refused if c not in listed), None)
            if stranger is not None:
                raise TierError(f"{where}: malformed reply: it refuses client {stranger[:256]!r}, which was not "
                                "listed")
            names = [r.name for r in got]
            if "" in names or len(set(names)) != len(names):
                raise TierError(f"{where}: malformed reply: the means need distinct, non-empty names")
            wrong = next((r for r in got if r.tensor.dtype not in (torch.float32, torch.float64)), None)
            if wrong is not None:
                raise TierError(f"{where}: malformed reply: mean {wrong.name!r} is {wrong.tensor.dtype}, "
                                "not float32 or float64")
            return Reduced({r.name: r.tensor for r in got}, refused)

        return self._call(what, attempt)

    def describe(self, model: ModelSpec | None = None, *, deadline_s: float | None = None,
                 shallow: bool = False) -> TierInfo:
        """What the tier is (``Describe``); with ``model``, also whether it would build it.

        A tier that does not know the call (UNIMPLEMENTED) runs a splitfed older than protocol 1, or is not a
        splitfed tier at all (gRPC's "Method not found!" does not tell which): that is said in so many words.
        """
        req = pb.DescribeRequest(shallow=shallow)
        if model is not None:
            req.model.CopyFrom(wire.model_pb(model))
        raw = req.SerializeToString()
        try:
            reply = self._call("describe", lambda t: self._describe(raw, timeout=t, metadata=self._metadata),
                               cap=deadline_s)
        except RpcFailed as e:
            if e.code != "UNIMPLEMENTED" or _not_grpc(str(e)):
                raise
            raise RpcFailed(e.code, f"tier {self.address} does not answer Describe: it runs a splitfed older than "
                            f"protocol {PROTOCOL} (this is {this_version()}), or it is another gRPC service, not a "
                            "splitfed tier; run one splitfed version on every machine, and check the address") \
                from None
        try:
            return TierInfo.from_pb(pb.TierInfo.FromString(reply))
        except Exception as e:  # noqa: BLE001 - DecodeError and friends
            raise TierError(f"tier {self.address}: describe: malformed reply: {e}") from None

    def probe(self, up_bytes: int, down_bytes: int) -> float:
        """Seconds for one call that sends ``up_bytes`` and receives ``down_bytes`` (no retry: a timing)."""
        raw = pb.ProbeRequest(payload=bytes(up_bytes), reply_bytes=down_bytes).SerializeToString()
        t0 = time.perf_counter()
        try:
            self._probe(raw, timeout=self._budget(), metadata=self._metadata)
        except grpc.RpcError as e:
            code, details = _status(e)
            raise self._error(code, details, "probe", 0, self._budget(), by_tier=sent_by_tier(e)) from None
        return time.perf_counter() - t0

    # ------------------------------------------------------------ other

    def health(self, timeout: float = 5.0, *, wait: bool = False) -> bool:
        """Whether the tier reports SERVING (``wait``: wait for the connection up to ``timeout``)."""
        failed = _unhealthy(self._health, timeout, wait_for_ready=wait)
        with self._lock:
            self._health_failed = None if failed is None else (*failed, timeout)
        return failed is None

    def health_failure(self) -> TierError | None:
        """Why the last :meth:`health` check failed, as a call's error (a refused TLS handshake is
        :class:`TlsRefused`); None if it did not. Worked out on demand: polling a starting tier stays cheap."""
        with self._lock:
            failed = self._health_failed
        if failed is None:
            return None
        code, details, timeout = failed
        return self._error(code, details, "health check", 0, timeout, left=timeout)

    def close(self) -> None:
        self._raw_channel.close()

    def __enter__(self) -> GrpcTierClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _status(e: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return code, details or code.name




def _retryable(code: grpc.StatusCode, details: str, by_tier: bool) -> bool:
    """Whether a failed call may be tried again: UNAVAILABLE (but not from a server that does not speak gRPC), or
    gRPC's own refusal of a busy server."""
    return (code == grpc.StatusCode.UNAVAILABLE and not _not_grpc(details)) or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED and not by_tier and _OVERLOADED in details.lower())


def _not_grpc(details: str) -> bool:
    """Whether gRPC's error says an HTTP server that is not a gRPC one answered (see ``_HTTP1``)."""
    lowered = details.lower()
    status = _HTTP_STATUS.search(lowered)
    return any(w in lowered for w in _HTTP1) or (status is not None and int(status[1]) not in _PROXY_UNAVAILABLE)


def _took_no_connection(details: str) -> bool:
    """Whether gRPC's error says its (last) address took no connection at all."""
    last = details.lower().rpartition("last error:")[2]
    return any(w in last for w in _NO_CONNECTION)


def _channel(target: str, tls: TlsConfig | None, limits: wire.Limits) -> grpc.Channel:
    """A channel to ``target``: with TLS when ``tls`` is given, else in plaintext."""
    opts = channel_options(limits) + (tls.channel_options() if tls else [])
    return (grpc.secure_channel(target, tls.channel_credentials(), options=opts) if tls
            else grpc.insecure_channel(target, options=opts))


def _unhealthy(stub: health_pb2_grpc.HealthStub, timeout: float, **call: Any) -> tuple[grpc.StatusCode, str] | None:
    """What a health check of the tier says when it does not report SERVING (its status and details); None if it
    does."""
    try:
        r = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout, **call)
    except grpc.RpcError as e:
        return _status(e)
    if r.status != health_pb2.HealthCheckResponse.SERVING:
        return grpc.StatusCode.UNAVAILABLE, f"serving status {r.status}"
    return None
