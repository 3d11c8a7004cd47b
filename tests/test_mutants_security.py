"""What the mutation run of splitfed/transport/security.py found no test for: the inclusive edges of a
certificate's validity dates, the words of a refused certificate or file, the reading of a tier's first TLS
flight (records and messages split anywhere, big and truncated chains), the verdicts of the TLS probe (by IP
address, by a bracketed IPv6 host, a peer that stops mid-record, a port that never accepts)
and the token check on every kind of gRPC method, over real TLS with certificates made here."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from splitfed.errors import ConfigError
from splitfed.transport import security
from splitfed.transport.security import (
    TlsConfig,
    TokenInterceptor,
    out_of_date,
    read_tokens,
    tls_refusal,
)
from tests.transport_fixtures import _write, make_leaf, tcp_server, write_ca

US = dt.timedelta(microseconds=1)
DAY = dt.timedelta(days=1)
FLAGS = ("--tls-cert", "--tls-key", "--tls-ca")


def _signed(cn: str, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, *,
            names: list[x509.GeneralName] | None = None, usages: list[x509.ObjectIdentifier] | None = None,
            not_before: dt.datetime | None = None, not_after: dt.datetime | None = None, is_ca: bool = False
            ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate signed by ``ca_key`` (``ca``'s key) with the subjectAltName entries, extendedKeyUsage and
    dates given (none: no such extension)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, cn)]))
         .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(not_before or now - dt.timedelta(minutes=5)).not_valid_after(not_after or now + DAY)
         .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if names:
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if usages:
        b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


def _self_signed_ca(cn: str, not_before: dt.datetime, not_after: dt.datetime) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, cn)])
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))


@dataclasses.dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    good: TlsConfig  # for localhost and 127.0.0.1, serverAuth and clientAuth
    other_host: TlsConfig  # for other.example only
    ders: tuple[bytes, ...]  # three distinct certificates, DER


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca, ca_path = write_ca(d, "mutants test CA")
    good = _write(d / "good", *make_leaf("tier", ca_key, ca))
    other = _write(d / "other", *_signed("tier", ca_key, ca, names=[x509.DNSName("other.example")]))
    ders = tuple(make_leaf(f"tier {i}", ca_key, ca)[1].public_bytes(serialization.Encoding.DER) for i in range(3))
    return Pki(d, ca_path, ca_key, ca, TlsConfig(*good, ca_path), TlsConfig(*other, ca_path), ders)


# ---------------------------------------------------------------- validity dates: both ends inclusive


def test_a_certificate_is_within_its_dates_at_both_of_them_and_outside_a_microsecond_beyond() -> None:
    """RFC 5280: valid from notBefore through notAfter, inclusive."""
    start = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    cert = _self_signed_ca("dated", start, start + DAY)
    assert out_of_date(cert, start) is None
    assert out_of_date(cert, start + DAY) is None
    assert out_of_date(cert, start + DAY + US) == ("expired on 2030-01-03 03:04:05 UTC", "renew it")
    assert out_of_date(cert, start - US) == ("is not valid before 2030-01-02 03:04:05 UTC",
                                             "check the clocks, or renew it")


# ---------------------------------------------------------------- TlsConfig.check: its refusals' words


def test_an_extended_key_usage_of_an_oid_without_a_name_is_named_by_its_dotted_string(pki: Pki) -> None:
    oid = x509.ObjectIdentifier("1.3.6.1.4.1.55555.7")
    cert, key = _write(pki.dir / "odd-usage", *_signed("tier", pki.ca_key, pki.ca_cert,
                                                        usages=[oid, ExtendedKeyUsageOID.CODE_SIGNING]))
    with pytest.raises(ConfigError) as e:
        TlsConfig(cert, key, pki.ca).check(FLAGS, roles=("server",))
    assert str(e.value) == (f"--tls-cert {cert} cannot authenticate a TLS server (its extended key usage allows "
                            "1.3.6.1.4.1.55555.7, codeSigning only, not serverAuth): every client refuses it; "
                            "give a certificate whose extendedKeyUsage includes serverAuth")


def test_a_file_that_cannot_be_read_or_is_empty_is_named_by_its_own_flag(pki: Pki, tmp_path: Path) -> None:
    missing, empty = tmp_path / "missing.pem", tmp_path / "empty.pem"
    empty.write_text("  \n")
    good_cert, good_key = pki.good.cert, pki.good.key
    with pytest.raises(ConfigError, match=rf"^cannot read --tls-cert {missing}: "):
        TlsConfig(missing, good_key, pki.ca).check(FLAGS)
    with pytest.raises(ConfigError, match=rf"^cannot read --tls-key {missing}: "):
        TlsConfig(good_cert, missing, pki.ca).check(FLAGS)
    with pytest.raises(ConfigError, match=rf"^cannot read --tls-ca {missing}: "):
        TlsConfig(good_cert, good_key, missing).check(FLAGS)
    with pytest.raises(ConfigError, match=rf"^--tls-key {empty} is empty$"):
        TlsConfig(good_cert, empty, pki.ca).check(FLAGS)
    assert TlsConfig(good_cert, good_key, pki.ca).check(FLAGS)[2] == pki.ca.read_bytes()


@pytest.mark.parametrize("stale", [1, 2])
def test_a_ca_file_whose_every_certificate_is_out_of_date_says_whether_there_were_more(tmp_path: Path,
                                                                                      stale: int) -> None:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    olds = [_self_signed_ca(f"old CA {i}", now - 3 * DAY, now - DAY - i * DAY) for i in range(stale)]
    ca = tmp_path / "old-cas.pem"
    ca.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in olds))
    every = " (as is every certificate in it)" if stale > 1 else ""
    when = (now - DAY).strftime("%Y-%m-%d %H:%M:%S UTC")
    with pytest.raises(ConfigError) as e:
        TlsConfig(ca=ca).check(FLAGS)
    assert str(e.value) == (f"--tls-ca {ca} expired on {when}{every}: renew it; every peer's certificate it "
                            "signed is refused")


def test_a_tls_config_cannot_be_changed_once_made_and_equal_ones_hash_alike(pki: Pki) -> None:
    """It is checked once, at start, and then used: what was checked is what is used."""
    tls = pki.good
    with pytest.raises(dataclasses.FrozenInstanceError):
        tls.cert = pki.other_host.cert  # type: ignore[misc]
    assert tls.cert != pki.other_host.cert
    assert {tls: 1}[TlsConfig(tls.cert, tls.key, tls.ca)] == 1


# ---------------------------------------------------------------- a tier's first flight, as bytes


def _records(data: bytes, size: int, kind: int = 22) -> bytes:
    """``data`` cut into TLS records of ``size`` bytes of body (the last one shorter)."""
    return b"".join(bytes([kind, 3, 3]) + len(c).to_bytes(2, "big") + c
                    for c in (data[k:k + size] for k in range(0, len(data), size)))


def _handshake(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + len(body).to_bytes(3, "big") + body


def _certificate_message(ders: list[bytes]) -> bytes:
    entries = b"".join(len(d).to_bytes(3, "big") + d for d in ders)
    return _handshake(11, len(entries).to_bytes(3, "big") + entries)


def _read(flight: bytes) -> list[bytes]:
    return [c.public_bytes(serialization.Encoding.DER) for c in security._sent_certificates(flight)]


HELLO = _handshake(2, bytes([3, 3]) + bytes(32) + b"\x00\x00\x2f\x00")  # a ServerHello (no extensions)


@pytest.mark.parametrize("size", [16384, 7, 4, 3, 1])
def test_every_certificate_of_a_flight_is_read_in_order_wherever_its_records_split_it(pki: Pki, size: int) -> None:
    """Records of 1, 3, 4 or 7 bytes cut the handshake headers and the 3-byte lengths in the middle."""
    ders = list(pki.ders)
    flight = _records(HELLO + _certificate_message(ders) + _handshake(14, b""), size)
    assert _read(flight) == ders
    assert _read(flight + _records(b"\x01", 1, kind=20) + _records(b"encrypted", 9)) == ders


def test_a_certificate_list_longer_than_64_kib_is_read_whole(pki: Pki) -> None:
    """A Certificate message's length takes its three bytes: one over 65535 bytes is read to its end."""
    ders = [pki.ders[i % 3] for i in range(70_000 // len(pki.ders[0]) + 2)]
    message = _certificate_message(ders)
    assert len(message) > 70_000
    assert _read(_records(HELLO + message, 16384)) == ders


def test_a_flight_cut_short_gives_the_certificates_read_whole_before_the_cut(pki: Pki) -> None:
    a, b, c = pki.ders
    hello = _records(HELLO, 16384)
    flight = hello + _records(_certificate_message([a, b, c]), 16384)
    assert _read(flight) == [a, b, c]
    second_ends = len(hello) + 5 + 4 + 3 + (3 + len(a)) + (3 + len(b))
    assert _read(flight[:second_ends - 1]) == [a]  # the second one lacks its last byte
    assert _read(flight[:second_ends + 2]) == [a, b]  # the third one's length is not all there
    assert _read(flight[:len(hello) + 3]) == []  # the second record's header cut: no certificate at all


# ---------------------------------------------------------------- the TLS probe against real servers


@contextlib.contextmanager
def _tls_tier(tls: TlsConfig, host: str = "127.0.0.1", client_ca: Path | None = None) -> Iterator[int]:
    """A TLS server (Python's ssl, OpenSSL's handshake) on ``host`` serving ``tls``'s certificate; with
    ``client_ca``, requiring a client certificate signed by it; its port."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(tls.cert), str(tls.key))
    if client_ca is not None:
        ctx.load_verify_locations(cafile=str(client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED

    def one(conn: socket.socket) -> None:
        conn.settimeout(5)
        with contextlib.suppress(OSError), ctx.wrap_socket(conn, server_side=True) as s:
            s.recv(1)

    address, stop = tcp_server(one, host)
    try:
        yield int(address.rsplit(":", 1)[1])
    finally:
        stop()


def test_a_tier_certificate_not_for_the_ip_address_connected_to_is_named_as_such(pki: Pki) -> None:
    """OpenSSL reports an IP address mismatch (verify code 64), not a host name mismatch (62)."""
    with _tls_tier(pki.other_host) as port:
        said = tls_refusal("127.0.0.1", port, TlsConfig(ca=pki.ca), timeout_s=5.0)
    assert said is not None and said.startswith("the tier's certificate is not for 127.0.0.1 (IP address mismatch")
    assert said.endswith("give the tier a certificate for 127.0.0.1 (the address's host)")


def test_a_bracketed_ipv6_host_is_checked_as_the_address_inside_the_brackets(pki: Pki) -> None:
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with _tls_tier(pki.good, "::1") as port:  # a certificate for localhost and 127.0.0.1
        said = tls_refusal("[::1]", port, TlsConfig(ca=pki.ca), timeout_s=5.0)
    assert said is not None and said.startswith("the tier's certificate is not for ::1 (IP address mismatch")


def test_a_peer_that_closes_in_the_middle_of_its_first_record_is_no_verdict(pki: Pki) -> None:
    """It sent something but no whole first flight: this side sent only its ClientHello, so the close says
    nothing about a certificate (a proxy with no tier behind it, a server of something else)."""

    def half(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            got = b""
            while len(got) < 5 or len(got) < 5 + int.from_bytes(got[3:5], "big"):
                chunk = conn.recv(4096)
                if not chunk:
                    return
                got += chunk
            conn.sendall(b"\x16\x03\x03")  # the start of a handshake record, no more

    address, stop = tcp_server(half)
    try:
        port = int(address.rsplit(":", 1)[1])
        for tls in (TlsConfig(ca=pki.ca), pki.good):
            assert tls_refusal("127.0.0.1", port, tls, timeout_s=5.0) is None
    finally:
        stop()


def test_a_port_that_never_accepts_the_connection_is_given_up_within_the_time_given() -> None:
    """A listener whose queue is full drops the SYN: connecting would wait for minutes."""
    with socket.socket() as ls, socket.socket() as filler:
        ls.bind(("127.0.0.1", 0))
        ls.listen(0)
        filler.connect(ls.getsockname())  # fills the accept queue; no one accepts
        said: list[str | None] = []
        t = threading.Thread(target=lambda: said.append(tls_refusal("127.0.0.1", ls.getsockname()[1], TlsConfig(),
                                                                    timeout_s=0.5)), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive() and said == [None]


# ---------------------------------------------------------------- tokens


def test_read_tokens_gives_both_tokens(tmp_path: Path) -> None:
    (tmp_path / "d").write_text(" device-token\n")
    (tmp_path / "c").write_text("coordinator-token")
    assert read_tokens(tmp_path / "d", tmp_path / "c") == ("device-token", "coordinator-token")
    assert read_tokens(tmp_path / "d", None) == ("device-token", None)


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def _echo_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield request


def _join(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    return b"".join(requests)


def _join_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    yield b"".join(requests)


def test_every_kind_of_method_is_refused_without_the_token_and_answered_with_it(pki: Pki) -> None:
    handlers = {"UU": grpc.unary_unary_rpc_method_handler(_echo),
                "US": grpc.unary_stream_rpc_method_handler(_echo_stream),
                "SU": grpc.stream_unary_rpc_method_handler(_join),
                "SS": grpc.stream_stream_rpc_method_handler(_join_stream)}
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[TokenInterceptor("s3cret")])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Kinds", handlers),))
    port = server.add_secure_port("127.0.0.1:0", pki.good.server_credentials())
    server.start()
    try:
        with grpc.secure_channel(f"127.0.0.1:{port}", pki.good.channel_credentials()) as channel:
            calls = {"UU": lambda md: channel.unary_unary("/t.Kinds/UU")(b"x", metadata=md, timeout=10),
                     "US": lambda md: b"".join(channel.unary_stream("/t.Kinds/US")(b"x", metadata=md, timeout=10)),
                     "SU": lambda md: channel.stream_unary("/t.Kinds/SU")(iter([b"x"]), metadata=md, timeout=10),
                     "SS": lambda md: b"".join(channel.stream_stream("/t.Kinds/SS")(iter([b"x"]), metadata=md,
                                                                                    timeout=10))}
            for kind, call in calls.items():
                with pytest.raises(grpc.RpcError) as e:
                    call(())
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, kind
                assert e.value.details() == "missing bearer token (authorization metadata)", kind
                assert call((security.bearer("s3cret"),)) == b"x", kind
    finally:
        server.stop(0)


def test_the_certificates_of_a_real_tls_1_2_first_flight_are_read_leaf_first(pki: Pki) -> None:
    """What an OpenSSL server sends (its chain: leaf, then the CA) is what the parser reads back."""
    chain = pki.dir / "chain.pem"
    chain.write_bytes(Path(str(pki.good.cert)).read_bytes() + pki.ca.read_bytes())
    want = [x509.load_pem_x509_certificate(Path(str(pki.good.cert)).read_bytes()), pki.ca_cert]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    flight = b""
    with _tls_tier(TlsConfig(chain, pki.good.key)) as port, socket.create_connection(("127.0.0.1", port), 5) as raw:
        raw.sendall(outgoing.read())
        while not flight.endswith(b"\x0e\x00\x00\x00"):  # up to its ServerHelloDone, the last of it
            chunk = raw.recv(65536)
            assert chunk, flight
            flight += chunk
    assert _read(flight) == [c.public_bytes(serialization.Encoding.DER) for c in want]
