"""A host name that resolves to several addresses: the diagnosis is the one of the address that answered.

gRPC tries each address a name resolves to (``localhost``: ::1 and 127.0.0.1, whatever /etc/hosts says) and
reports only the last one's error. Against a TLS tier on 127.0.0.1, ``splitfed ping localhost:PORT`` with the
wrong credentials said ``ipv6:[::1]:PORT: ... Connection refused`` where ``ping 127.0.0.1:PORT`` said the tier
serves TLS, or requires a client certificate. Certificates are made by the test (tests.transport_fixtures).
"""

from __future__ import annotations

import socket

import grpc
import pytest

from splitfed.cli import main
from splitfed.errors import Unavailable
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import TlsRefused
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import Certs, certs, closed_port  # noqa: F401

SOCKET_CLOSED = ("Socket closed (a tier that serves TLS closes a plaintext connection this way: connect with the CA "
                 "that signed its certificate, e.g. --tls-ca / tls-ca)")
NO_CERT = ("TLS refused: the tier closed the connection when this side sent no certificate: it requires one "
           "(mutual TLS): --tls-cert and --tls-key")


def _refused_at(ip: str, port: int) -> str:
    """What gRPC says when the last address of a name it tried refused the connection."""
    where = f"ipv6:%5B{ip}%5D:{port}" if ":" in ip else f"ipv4:{ip}:{port}"
    return (f"failed to connect to all addresses; last error: UNKNOWN: {where}: Failed to connect to remote host: "
            "Connection refused")


def _localhost_is_loopback() -> None:
    try:
        found = {info[4][0] for info in socket.getaddrinfo("localhost", 1, type=socket.SOCK_STREAM)}
    except OSError as e:
        pytest.skip(f"localhost does not resolve here ({e})")
    if "127.0.0.1" not in found:
        pytest.skip(f"localhost resolves to {sorted(found)} here, not 127.0.0.1")



@pytest.fixture
def both_loopbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``localhost`` resolves to ::1 first, then 127.0.0.1 (as gRPC resolves it, and many hosts do)."""
    real = socket.getaddrinfo

    def resolve(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host != "localhost":
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


# ---------------------------------------------------------------- splitfed ping, end to end

@pytest.mark.parametrize("ca,want", [(False, SOCKET_CLOSED), (True, NO_CERT)], ids=["no_tls", "no_cert"])
def test_ping_by_name_says_what_the_tier_on_127_0_0_1_said(
        certs: Certs, capsys: pytest.CaptureFixture[str], ca: bool, want: str) -> None:  # noqa: F811
    _localhost_is_loopback()
    args = ["--tls-ca", str(certs.ca)] if ca else []  # plaintext, or TLS without a client certificate
    with serve_tier("cloud", tls=certs.server) as srv:  # mutual TLS, on 127.0.0.1 only
        port = srv.port
        for _ in range(2):  # which address gRPC reports last varies from call to call
            assert main(["ping", f"localhost:{port}", *args, "--timeout", "10", "--count", "1"]) == 1
            out, _ = capsys.readouterr()
            assert out.startswith(f"localhost:{port}: no answer: UNAVAILABLE: tier localhost:{port}: "), out
            assert want in out, out
            if "Connection refused" in out:  # gRPC's own error is kept, after the diagnosis, and said to be so
                assert f"(said by 127.0.0.1:{port}, an address of localhost; gRPC reported only the last " in out
                assert out.index(want) < out.index("Connection refused"), out
        assert srv.tier.clients() == 0
        # the address itself: as before
        assert main(["ping", f"127.0.0.1:{port}", *args, "--timeout", "10", "--count", "1"]) == 1
        out, _ = capsys.readouterr()
        assert want in out and "said by" not in out, out


# ---------------------------------------------------------------- the client's error, given gRPC's refusal

@pytest.mark.parametrize("resolved", ["here", "both"])
def test_a_name_whose_last_address_refused_is_diagnosed_at_the_one_that_answered(
        certs: Certs, request: pytest.FixtureRequest, resolved: str) -> None:  # noqa: F811
    """Deterministic: gRPC's refusal on ::1 is given; the client tries the name's addresses itself (as this host
    resolves localhost, and as ::1 first then 127.0.0.1) and reports the one that took the connection."""
    _localhost_is_loopback()
    if resolved == "both":
        request.getfixturevalue("both_loopbacks")
    with serve_tier("cloud", tls=certs.server) as srv:
        port = srv.port
        refused = _refused_at("::1", port)
        with GrpcTierClient(f"localhost:{port}", tls=certs.no_cert, retries=0, deadline_s=10) as c:
            err = c._error(grpc.StatusCode.UNAVAILABLE, refused, "describe", 5, 10.0, left=10.0)
        assert isinstance(err, TlsRefused), err
        assert str(err).startswith(f"tier localhost:{port}: describe: {NO_CERT}"), err
        assert str(err).endswith(f" (said by 127.0.0.1:{port}, an address of localhost; gRPC reported only the last "
                                 f"address it tried: UNKNOWN: ipv6:%5B::1%5D:{port}: Failed to connect to remote "
                                 "host: Connection refused)"), err
        with GrpcTierClient(f"localhost:{port}", insecure=True, retries=0, deadline_s=10) as c:
            err = c._error(grpc.StatusCode.UNAVAILABLE, refused, "describe", 5, 10.0, left=10.0)
        assert isinstance(err, Unavailable) and not isinstance(err, TlsRefused), err
        assert str(err).startswith(f"tier localhost:{port}: describe: unavailable after 6 attempt(s): "), err
        assert SOCKET_CLOSED in str(err) and f"said by 127.0.0.1:{port}" in str(err), err
        # the health check's failure (what ping's round trip reports) goes the same way
        with GrpcTierClient(f"localhost:{port}", tls=certs.no_cert, retries=0, deadline_s=10) as c:
            c._health_failed = (grpc.StatusCode.UNAVAILABLE, refused, 5.0)
            why = c.health_failure()
        assert isinstance(why, TlsRefused) and NO_CERT in str(why), why


def test_with_the_right_credentials_a_name_answers(certs: Certs) -> None:  # noqa: F811
    _localhost_is_loopback()
    with serve_tier("cloud", tls=certs.server) as srv, \
            GrpcTierClient(f"localhost:{srv.port}", tls=certs.client, retries=0, deadline_s=10) as c:
        assert c.describe().name == "cloud"


def test_an_ip_address_and_a_name_that_nothing_answers_keep_grpcs_error(certs: Certs,  # noqa: F811
                                                                       both_loopbacks: None) -> None:
    """An IP address is not looked up or tried again (gRPC's error is its own); a name none of whose
    addresses takes a connection (a tier that is down) keeps gRPC's refusal, and is no TLS question."""
    _localhost_is_loopback()
    with serve_tier("cloud", tls=certs.server) as srv:
        port = srv.port
        with GrpcTierClient(f"127.0.0.1:{port}", tls=certs.no_cert, retries=0, deadline_s=10) as c:
            refused = _refused_at("127.0.0.1", port)
            err = c._error(grpc.StatusCode.UNAVAILABLE, refused, "describe", 0, 10.0, left=10.0)
        assert not isinstance(err, TlsRefused) and str(err) == (
            f"tier 127.0.0.1:{port}: describe: unavailable after 1 attempt(s): {refused}"), err
    port = closed_port()
    with GrpcTierClient(f"localhost:{port}", tls=certs.no_cert, retries=1, deadline_s=10) as c:
        with pytest.raises(Unavailable) as e:
            c.describe()
    assert not isinstance(e.value, TlsRefused) and "said by" not in str(e.value), e.value
    assert "Connection refused" in str(e.value) or "failed to connect" in str(e.value).lower(), e.value


def test_a_certificate_not_for_the_name_is_said_of_the_name_not_of_a_server_name_never_given(
        tmp_path, both_loopbacks: None) -> None:  # type: ignore[no-untyped-def]
    """The tier's certificate holds 127.0.0.1 only; the client connects to localhost and names no server. The
    handshake is tried at 127.0.0.1 and checked for localhost, and the advice is about the address's host: before,
    it said "server name 'localhost'", a setting the user never gave."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from splitfed.transport.security import TlsConfig
    from tests.transport_fixtures import _name, _write, make_ca

    _localhost_is_loopback()
    ca_key, ca = make_ca("ca")
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    key, now = ec.generate_private_key(ec.SECP256R1()), dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("tier")).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    s_cert, s_key = _write(tmp_path / "server", key, cert)
    with serve_tier("cloud", tls=TlsConfig(s_cert, s_key, None)) as srv:
        port = srv.port
        with GrpcTierClient(f"localhost:{port}", tls=TlsConfig(ca=tmp_path / "ca.pem"), retries=0,
                            deadline_s=10) as c:
            err = c._error(grpc.StatusCode.UNAVAILABLE, _refused_at("::1", port), "describe", 0, 10.0, left=10.0)
    assert isinstance(err, TlsRefused), err
    assert "the tier's certificate is not for localhost" in str(err) and "(the address's host)" in str(err), err
    assert "server name" not in str(err) and f"said by 127.0.0.1:{port}" in str(err), err
