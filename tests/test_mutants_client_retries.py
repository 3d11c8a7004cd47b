"""What the mutation run of splitfed/transport/client.py found no test for (its lines below 240): the retry
loop of a tier client (the exact backoff, doubling with at most half taken off by jitter; no retry whose pause
would reach the deadline; no try once the deadline is reached, even at its exact edge; a caller with exactly
no time left), a zero backoff, the 50 ms of the deadline a failed call must have left before its error is
diagnosed further (the TLS handshake, the other addresses of a host name), that time spent on one diagnosis is
taken from the next, and two promises of the channel options: gRPC's own retries off, and a tier's port shared
with no other server.

The tier is a scripted interceptor (each try: an error of a chosen status, or an answer) and the module's
``time`` and ``random`` are fakes, so every pause and deadline is exact and no test waits on a clock.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitfed.errors import Unavailable
from splitfed.transport import client as client_mod
from splitfed.transport import wire
from splitfed.transport.client import DEADLINE, HOP_MARGIN_S, GrpcTierClient, channel_options
from splitfed.transport.errors import DeadlineExceeded, TlsRefused
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import Certs, DrivenClock, certs, closed_port  # noqa: F401

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
# what gRPC says when a TLS handshake failed on this side's check of the tier's certificate
CERT_REFUSED = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:{port}: Ssl handshake failed: "
                "SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED")
# what gRPC says when the last address of a name it tried refused the connection
REFUSED_AT_V6 = ("failed to connect to all addresses; last error: UNKNOWN: ipv6:%5B::1%5D:{port}: Failed to connect "
                 "to remote host: Connection refused")


class _Failed(grpc.RpcError):
    """A failed call as gRPC raises it (a status gRPC or the network gave: no trailing metadata of the tier)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


class _Answered:
    def result(self) -> bytes:
        return b""


@dataclass
class _Try:
    """One try of the scripted tier: fails with ``code`` (None: answers) after the clock was set to ``at``."""

    code: grpc.StatusCode | None = UNAVAILABLE
    details: str = "the tier went away"
    at: float | None = None


class _Scripted(grpc.UnaryUnaryClientInterceptor):
    """The tier as a script of tries (the last one repeats); the timeout each try was given."""

    def __init__(self, clock: DrivenClock, tries: list[_Try]) -> None:
        self.clock, self.tries, self.timeouts = clock, tries, []  # type: list[float]

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        self.timeouts.append(details.timeout)
        step = self.tries[min(len(self.timeouts), len(self.tries)) - 1]
        if step.at is not None:
            self.clock.now = step.at
        if step.code is None:
            return _Answered()
        raise _Failed(step.code, step.details)


@contextlib.contextmanager
def _scripted(tries: list[_Try], *, r: float = 0.5, start: float = 0.0, address: str = "127.0.0.1:1",
              **kw: Any) -> Iterator[tuple[GrpcTierClient, _Scripted, DrivenClock]]:
    """A client of a scripted tier, its clock at ``start`` and its jitter's ``random.random()`` at ``r``."""
    clock = DrivenClock(start)
    script = _Scripted(clock, tries)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(client_mod, "time", clock)
        mp.setattr(client_mod, "random", SimpleNamespace(random=lambda: r))
        if "tls" not in kw:
            kw["insecure"] = True
        c = GrpcTierClient(address, interceptors=[script], **kw)
        try:
            yield c, script, clock
        finally:
            c.close()



def _pending(ls: socket.socket) -> int:
    """How many connections ``ls`` (listening, never accepting) holds, taken out of its backlog."""
    ls.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = ls.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


# ---------------------------------------------------------------- the retry loop


@settings(deadline=None, max_examples=40)
@given(backoff=st.floats(0.001, 2.0), r=st.floats(0.0, 1.0, exclude_max=True), retries=st.integers(1, 4))
@example(backoff=0.1, r=0.5, retries=4)
def test_each_retry_pauses_twice_the_last_less_at_most_half_and_every_try_keeps_within_the_deadline(
        backoff: float, r: float, retries: int) -> None:
    """Try n (from 0) pauses ``backoff * 2**n * (0.5 + r/2)``: exponential, and jitter takes off up to half,
    never adds. Each try is given the deadline less the pauses so far."""
    deadline = 1e6
    with _scripted([_Try()] * retries + [_Try(None)], r=r, deadline_s=deadline, retries=retries,
                   backoff_s=backoff) as (c, script, clock):
        c.release("run", "a")
    want = [backoff * 2 ** n * (0.5 + r / 2) for n in range(retries)]
    assert clock.sleeps == pytest.approx(want, rel=1e-12)
    assert c.retried == retries
    assert len(script.timeouts) == retries + 1
    assert script.timeouts == pytest.approx([deadline - sum(want[:n]) for n in range(retries + 1)], rel=1e-12)


def test_a_zero_backoff_is_allowed_and_retries_at_once() -> None:
    """``backoff_s=0`` is a valid setting (retry without a pause), not refused as a bad one."""
    with _scripted([_Try(), _Try(), _Try(None)], backoff_s=0.0, retries=2) as (c, script, clock):
        c.release("run", "a")
    assert clock.sleeps == [0.0, 0.0]
    assert c.retried == 2 and len(script.timeouts) == 3


@pytest.mark.parametrize("backoff", [0.5, 1.0], ids=["pause-ends-at-the-deadline", "pause-beyond-the-deadline"])
def test_a_retry_whose_pause_would_reach_the_deadline_is_not_made(backoff: float) -> None:
    """With 0.25 s left, a pause of 0.25 s (or more) would leave no time for the retry: the call fails at once
    with the tier's status, after one attempt, and sleeps not at all."""
    with _scripted([_Try()], r=0.0, deadline_s=0.25, backoff_s=backoff, retries=5) as (c, script, clock):
        with pytest.raises(Unavailable, match=r"release of a: unavailable after 1 attempt\(s\): the tier went away"):
            c.release("run", "a")
    assert clock.sleeps == [] and c.retried == 0 and len(script.timeouts) == 1


def test_a_retry_that_wakes_up_at_the_deadline_makes_no_further_try() -> None:
    """A pause that overslept to the very end of the deadline leaves no time: the call is over (deadline
    exceeded), not tried again with a timeout of zero."""
    with _scripted([_Try()], r=0.0, deadline_s=1.0, backoff_s=0.5, retries=5) as (c, script, clock):
        clock.wake_at = 1.0
        with pytest.raises(DeadlineExceeded, match=r"release of a: deadline of 1s exceeded"):
            c.release("run", "a")
    assert clock.sleeps == [0.25]
    assert script.timeouts == [1.0]


def test_a_call_with_under_a_second_of_deadline_is_tried() -> None:
    """A deadline below one second is still time for a call."""
    with _scripted([_Try(None)], deadline_s=0.5) as (c, script, _):
        c.release("run", "a")
    assert script.timeouts == [0.5]


def test_a_caller_with_exactly_no_time_left_gets_no_try_and_is_told_its_deadline_passed() -> None:
    """A forwarding tier whose caller must answer in exactly the hop margin has nothing left for its next hop:
    it says the caller's deadline passed (not that its own call timed out), and calls nothing."""
    with _scripted([_Try(None)]) as (c, script, clock):
        ctx = contextvars.copy_context()
        ctx.run(DEADLINE.set, clock.now + HOP_MARGIN_S)
        with pytest.raises(DeadlineExceeded, match=r"no time left for release of a \(the caller's deadline passed\)"):
            ctx.run(c.release, "run", "a")
    assert script.timeouts == []


# ---------------------------------------------------------------- diagnosis within the deadline's rest


@pytest.mark.parametrize(("failed_at", "diagnosed"), [(0.07, False), (0.05, False), (0.025, True)],
                         ids=["30ms-left", "exactly-50ms-left", "75ms-left"])
def test_a_tls_failure_is_diagnosed_only_with_more_than_50ms_of_the_deadline_left(
        certs: Certs, failed_at: float, diagnosed: bool) -> None:  # noqa: F811
    """A TLS symptom is looked into (one handshake) only when more than 50 ms of the call's 100 ms are left
    when it fails; else gRPC's error stands, as an unavailable tier."""
    port = closed_port()
    details = CERT_REFUSED.format(port=port)
    with _scripted([_Try(details=details, at=failed_at)], deadline_s=0.1, retries=0, tls=certs.no_cert,
                   address=f"127.0.0.1:{port}") as (c, _, _):
        with pytest.raises(Unavailable) as raised:
            c.release("run", "a")
    if diagnosed:
        assert isinstance(raised.value, TlsRefused)
        assert "this side does not trust the tier's certificate" in str(raised.value)
    else:
        assert not isinstance(raised.value, TlsRefused)
        assert str(raised.value) == f"tier 127.0.0.1:{port}: release of a: unavailable after 1 attempt(s): {details}"


@pytest.mark.parametrize(("failed_at", "diagnosed"), [(0.05, False), (0.025, True)],
                         ids=["exactly-50ms-left", "75ms-left"])
def test_the_other_addresses_of_a_name_are_tried_only_with_more_than_50ms_of_the_deadline_left(
        failed_at: float, diagnosed: bool) -> None:
    """When gRPC says the last address of a name took no connection, the name's other addresses are tried
    (a connection to each) only when more than 50 ms of the call's 100 ms are left."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(16)
        port = int(ls.getsockname()[1])
        with _scripted([_Try(details=REFUSED_AT_V6.format(port=port), at=failed_at)], deadline_s=0.1, retries=0,
                       address=f"localhost:{port}") as (c, _, _):
            with pytest.MonkeyPatch.context() as mp:  # the name resolves at once, to the listening address
                mp.setattr(client_mod, "look_up", lambda name, port, timeout_s: ["127.0.0.1"])
                with pytest.raises(Unavailable, match=r"unavailable after 1 attempt\(s\)"):
                    c.release("run", "a")
        assert (_pending(ls) > 0) is diagnosed


def test_time_spent_on_the_names_other_addresses_is_taken_from_the_tls_diagnosis(certs: Certs) -> None:  # noqa: F811
    """A name whose resolving used up the call's last second leaves no time to look into a TLS symptom too:
    gRPC's error stands rather than a handshake past the deadline."""
    port = closed_port()
    details = REFUSED_AT_V6.format(port=port).replace("Connection refused", "Connection reset (CERTIFICATE_VERIFY_FAILED)")
    with _scripted([_Try(details=details)], deadline_s=1.0, retries=0, tls=certs.no_cert,
                   address=f"localhost:{port}") as (c, _, clock):

        def slow_look_up(name: str, port: int, timeout_s: float) -> list[str]:
            clock.now += timeout_s  # the resolver took all the time it was given
            return ["127.0.0.1"]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(client_mod, "look_up", slow_look_up)
            with pytest.raises(Unavailable) as raised:
                c.release("run", "a")
    assert not isinstance(raised.value, TlsRefused)
    assert str(raised.value) == f"tier localhost:{port}: release of a: unavailable after 1 attempt(s): {details}"


# ---------------------------------------------------------------- the channel's promises


def test_grpcs_own_retries_are_switched_off_on_every_channel() -> None:
    """The module retries UNAVAILABLE itself within the deadline; gRPC's own retry policy (which stops silently
    past 256 KiB sent) is switched off, as the module doc says, not left to its default."""
    assert ("grpc.enable_retries", 0) in channel_options(wire.Limits())


def test_no_other_grpc_server_can_share_a_tiers_port() -> None:
    """A tier binds its port for itself: another gRPC server started on it later (gRPC's default asks the
    system to share a port between the sockets that allow it) is refused, so callers never reach either at
    random."""
    tier = serve_tier("edge", insecure=True, max_workers=2)
    other = grpc.server(futures.ThreadPoolExecutor(1))
    try:
        with pytest.raises(RuntimeError, match="Failed to bind"):
            other.add_insecure_port(f"127.0.0.1:{tier.port}")
    finally:
        other.stop(0)
        tier.stop(0)
