"""An address where no splitfed tier listens, but some other server does, is named for what it is, at once.

Before: a web server, or Flower 1.42's SuperLink port (its APIs are HTTP/1), took gRPC's "Failed parsing HTTP/2"
six times (3.5 s of retries) and was reported as "unavailable after 6 attempt(s)"; an HTTP/2 proxy's 404 and any
other gRPC service were both reported as "a splitfed older than protocol 5".
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import struct
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from splitfed.transport.client import GrpcTierClient
from splitfed.transport.describe import PROTOCOL
from splitfed.transport.errors import RpcFailed, Unavailable
from tests.transport_fixtures import tcp_server

HINT = "check the address and port: a splitfed tier's, not a web server's or Flower's SuperLink's"


@contextlib.contextmanager
def _http1_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP/1 server (Python's own); the request lines it was sent."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            seen.append(self.requestline)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_http1_server_is_named_as_such_and_asked_once() -> None:
    with _http1_server() as (address, seen), GrpcTierClient(address) as c, pytest.raises(Unavailable) as e:
        c.describe()
    text = str(e.value)
    assert text.startswith(f"tier {address}: describe: no gRPC server at {address}: an HTTP server answered (")
    assert "Failed parsing HTTP/2" in text and text.endswith(f"); {HINT}")
    assert "attempt" not in text
    # one call, not retried: gRPC's own connecting may open a second connection within it (six calls opened 12)
    assert seen in (["PRI * HTTP/2.0"], ["PRI * HTTP/2.0"] * 2), seen


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


# a response's HEADERS block (HPACK, RFC 7541): entry 13 of the static table is ":status: 404"; 503 has no entry, so
# it is a literal whose name is entry 8 (":status"), not indexed
STATUS_404 = b"\x8d"
STATUS_503 = b"\x08\x03503"


@contextlib.contextmanager
def _http2_server(status: bytes, requests: list[int] | None = None) -> Iterator[str]:
    """An HTTP/2 server (cleartext) that answers every request with ``status``, as a web server or a proxy does
    (a gRPC proxy says 503 while the tier behind it is away): a stand-in written with the frames themselves (RFC
    9113), since no HTTP/2 server library is installed here. ``requests``: a stream id per request it answered."""

    def serve(conn: socket.socket) -> None:
        with conn:
            buf = b""
            preface = False
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                if not preface:
                    if len(buf) < 24:
                        continue
                    buf, preface = buf[24:], True
                    conn.sendall(_frame(0x4, 0, 0))  # our SETTINGS
                while len(buf) >= 9:
                    size = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + size:
                        break
                    kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    buf = buf[9 + size:]
                    if kind == 0x4 and not flags & 0x1:  # their SETTINGS: acknowledged
                        conn.sendall(_frame(0x4, 0x1, 0))
                    elif kind == 0x1:  # a request's HEADERS: the status, END_STREAM | END_HEADERS
                        if requests is not None:
                            requests.append(stream)
                        conn.sendall(_frame(0x1, 0x5, stream, status))

    address, stop = tcp_server(serve)
    try:
        yield address
    finally:
        stop()


def test_an_http2_server_that_answers_404_is_named_as_such_and_asked_once() -> None:
    requests: list[int] = []
    with _http2_server(STATUS_404, requests) as address, GrpcTierClient(address) as c, \
            pytest.raises(RpcFailed) as e:
        c.describe()
    assert e.value.code == "UNIMPLEMENTED"
    assert str(e.value) == (f"tier {address}: describe: no gRPC server at {address}: an HTTP server answered "
                            f"(Received http2 header with status: 404); {HINT}")
    assert len(requests) == 1


def test_a_proxy_whose_tier_is_away_is_asked_again() -> None:
    """503 (as 502 and 504) is a gRPC proxy's word for a tier behind it that is away, restarting: UNAVAILABLE,
    retried as any other, and not named a wrong address."""
    requests: list[int] = []
    with _http2_server(STATUS_503, requests) as address, GrpcTierClient(address, retries=2) as c, \
            pytest.raises(Unavailable) as e:
        c.describe()
    assert str(e.value).startswith(f"tier {address}: describe: unavailable after 3 attempt(s): ")
    assert "Received http2 header with status: 503" in str(e.value) and "no gRPC server" not in str(e.value)
    assert len(requests) == 3


def test_another_grpc_service_is_named_as_one_or_an_older_splitfed() -> None:
    """A gRPC server without splitfed's service says "Method not found!", as a splitfed older than Describe does:
    both are named."""
    srv = grpc.server(futures.ThreadPoolExecutor(2))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    address = f"127.0.0.1:{port}"
    try:
        with GrpcTierClient(address) as c, pytest.raises(RpcFailed) as e:
            c.describe()
    finally:
        srv.stop(0)
    assert e.value.code == "UNIMPLEMENTED"
    assert str(e.value).startswith(f"tier {address} does not answer Describe: it runs a splitfed older than "
                                   f"protocol {PROTOCOL} (this is splitfed ")
    assert str(e.value).endswith("), or it is another gRPC service, not a splitfed tier; run one splitfed version "
                                 "on every machine, and check the address")
