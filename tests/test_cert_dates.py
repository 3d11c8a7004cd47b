"""Certificates out of their validity dates, and a deployment's certificate not for 127.0.0.1.

Before, an expired certificate was not looked at until a handshake failed: a tier served one silently, a
client refusing it was told to "give the CA that signed it", and a tier refusing this side's expired one was
blamed on its CA. ``python -m server.deploy`` with a certificate not for 127.0.0.1 started everything and
then said only that the SuperLink was unavailable (the cause was in superlink.log).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from splitfed.errors import ConfigError
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import TlsRefused
from splitfed.transport.security import TlsConfig, tls_refusal
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import _write, make_ca, make_leaf, write_ca

DAY = dt.timedelta(days=1)


def _when(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def _reissued(key_cert: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], ca_key: ec.EllipticCurvePrivateKey,
              *, not_before: dt.datetime | None = None, not_after: dt.datetime | None = None,
              names: list[x509.GeneralName] | None = None, usages: list[x509.ObjectIdentifier] | None = None
              ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """``make_leaf``'s (or ``make_ca``'s) certificate signed again by ``ca_key`` with other dates, other
    subjectAltName entries (``[]``: none) or another extendedKeyUsage (``[]``: none); the same key."""
    key, cert = key_cert
    b = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer).public_key(cert.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(not_before or cert.not_valid_before_utc)
         .not_valid_after(not_after or cert.not_valid_after_utc))
    for ext in cert.extensions:
        if not (names is not None and isinstance(ext.value, x509.SubjectAlternativeName)
                or usages is not None and isinstance(ext.value, x509.ExtendedKeyUsage)):
            b = b.add_extension(ext.value, ext.critical)
    if names:
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if usages:
        b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


@dataclass(frozen=True)
class Pki:
    ca: Path
    good: TlsConfig  # within its dates, for localhost and 127.0.0.1
    expired: TlsConfig  # signed by the same CA, expired yesterday
    early: TlsConfig  # signed by the same CA, valid from tomorrow
    expired_on: str
    valid_from: str
    old_ca: Path  # an expired CA
    of_old_ca: TlsConfig  # a certificate within its dates signed by that CA
    old_ca_expired_on: str
    other_host: TlsConfig  # within its dates, for other.example only
    no_names: TlsConfig  # within its dates, without subjectAltName
    server_only: TlsConfig  # extendedKeyUsage serverAuth alone
    client_only: TlsConfig  # extendedKeyUsage clientAuth alone
    any_use: TlsConfig  # no extendedKeyUsage: any use


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    ca_key, ca, ca_path = write_ca(d, "dates test CA")
    leaf = make_leaf("tier", ca_key, ca)

    def tls(name: str, key_cert: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], ca_file: Path = ca_path
            ) -> TlsConfig:
        cert, key = _write(d / name, *key_cert)
        return TlsConfig(cert, key, ca_file)

    old = make_ca("an old CA")
    old_ca_key, old_ca = _reissued(old, old[0], not_before=now - 3 * DAY, not_after=now - DAY)  # self-signed
    old_ca_path = d / "old-ca.pem"
    old_ca_path.write_bytes(old_ca.public_bytes(serialization.Encoding.PEM))
    return Pki(
        ca=ca_path,
        good=tls("good", leaf),
        expired=tls("expired", _reissued(leaf, ca_key, not_before=now - 3 * DAY, not_after=now - DAY)),
        early=tls("early", _reissued(leaf, ca_key, not_before=now + DAY, not_after=now + 3 * DAY)),
        expired_on=_when(now - DAY),
        valid_from=_when(now + DAY),
        old_ca=old_ca_path,
        of_old_ca=tls("of-old-ca", make_leaf("tier", old_ca_key, old_ca), old_ca_path),
        old_ca_expired_on=_when(now - DAY),
        other_host=tls("wronghost", _reissued(leaf, ca_key, names=[x509.DNSName("other.example")])),
        no_names=tls("nonames", _reissued(leaf, ca_key, names=[])),
        server_only=tls("serveronly", _reissued(leaf, ca_key, usages=[ExtendedKeyUsageOID.SERVER_AUTH])),
        client_only=tls("clientonly", _reissued(leaf, ca_key, usages=[ExtendedKeyUsageOID.CLIENT_AUTH,
                                                                      ExtendedKeyUsageOID.CODE_SIGNING])),
        any_use=tls("anyuse", _reissued(leaf, ca_key, usages=[])),
    )


# ------------------------------------------------------------------ this side's own files, at start


@pytest.mark.parametrize("which", ["expired", "early"])
def test_the_startup_check_refuses_a_certificate_outside_its_dates_naming_file_and_date(pki: Pki,
                                                                                        which: str) -> None:
    tls = getattr(pki, which)
    said = {"expired": f"expired on {pki.expired_on}: renew it",
            "early": f"is not valid before {pki.valid_from}: check the clocks, or renew it"}[which]
    with pytest.raises(ConfigError) as e:
        tls.check(("--tls-cert", "--tls-key", "--tls-ca"))
    assert str(e.value) == f"--tls-cert {tls.cert} {said}"
    pki.good.check()  # within its dates: taken


def test_a_tier_is_not_started_with_an_expired_certificate(pki: Pki, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=f"TLS certificate {pki.expired.cert} expired on {pki.expired_on}"):
        serve_tier("cloud", tls=pki.expired)

    import splitfed.transport.server as server
    from splitfed.cli import main

    def serving(*a: object, **k: object) -> None:
        raise AssertionError("the tier started serving")

    monkeypatch.setattr(server, "serve_tier", serving)
    t = pki.expired
    assert main(["tier", "--role", "cloud", "--listen", "127.0.0.1:0", "--tls-cert", str(t.cert), "--tls-key",
                 str(t.key), "--tls-ca", str(t.ca)]) == 2
    err = capsys.readouterr().err
    assert err == f"splitfed tier: error: --tls-cert {t.cert} expired on {pki.expired_on}: renew it\n"


def test_a_client_with_an_expired_certificate_is_told_before_connecting(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=f"TLS certificate {pki.expired.cert} expired on {pki.expired_on}"):
        GrpcTierClient("127.0.0.1:1", tls=pki.expired, retries=0, deadline_s=5)


# ------------------------------------------------------------------ a handshake refused for dates


@pytest.fixture
def raw_tier() -> Iterator[Callable[[TlsConfig], int]]:
    """A TLS server built from its files as given, dates unchecked (as a tier running when its certificate
    expired): ``start(tls)`` returns its port."""
    servers: list[grpc.Server] = []

    def start(tls: TlsConfig) -> int:
        assert tls.cert is not None and tls.key is not None
        creds = grpc.ssl_server_credentials([(Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())])
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        port = srv.add_secure_port("127.0.0.1:0", creds)
        srv.start()
        servers.append(srv)
        return port

    yield start
    for srv in servers:
        srv.stop(0)


@pytest.mark.parametrize("which", ["expired", "early"])
def test_a_tier_certificate_outside_its_dates_is_named_with_its_date(pki: Pki, raw_tier: Callable[[TlsConfig], int],
                                                                     which: str) -> None:
    port = raw_tier(getattr(pki, which))
    said = {"expired": f"the tier's certificate expired on {pki.expired_on} (CERTIFICATE_VERIFY_FAILED: "
                       "certificate has expired): renew it (splitfed tier --tls-cert and --tls-key)",
            "early": f"the tier's certificate is not valid before {pki.valid_from} (CERTIFICATE_VERIFY_FAILED: "
                     "certificate is not yet valid): check the clocks, or renew it (splitfed tier --tls-cert and "
                     "--tls-key)"}[which]
    assert tls_refusal("127.0.0.1", port, pki.good) == said
    with GrpcTierClient(f"127.0.0.1:{port}", tls=pki.good, retries=0, deadline_s=10) as c:
        with pytest.raises(TlsRefused) as e:  # what ping and a node say
            c.describe()
    assert f"TLS refused: {said}" in str(e.value) and "give the CA that signed it" not in str(e.value)


def test_an_expired_ca_this_side_trusts_is_named(pki: Pki, raw_tier: Callable[[TlsConfig], int]) -> None:
    port = raw_tier(pki.of_old_ca)
    assert tls_refusal("127.0.0.1", port, pki.of_old_ca) == (
        f"the CA certificate CN=an old CA in {pki.old_ca} expired on {pki.old_ca_expired_on} "
        "(CERTIFICATE_VERIFY_FAILED: certificate has expired): renew it and give this side the new one "
        "(--tls-ca / tls-ca)")


def test_this_sides_expired_certificate_is_named_before_the_tiers_ca_is_blamed(pki: Pki) -> None:
    with serve_tier("cloud", tls=pki.good) as srv:  # mutual TLS: it requires a certificate its CA signed
        port = srv.port
        assert tls_refusal("127.0.0.1", port, pki.expired) == (
            f"the tier closed the connection when it got this side's certificate: this side's certificate "
            f"{pki.expired.cert} expired on {pki.expired_on}: renew it (--tls-cert and --tls-key / tls-cert and "
            "tls-key)")
        assert tls_refusal("127.0.0.1", port, pki.good) is None


# ------------------------------------------------------------------ server.deploy


@pytest.mark.parametrize("which", ["other_host", "no_names", "expired", "server_only", "client_only"])
def test_deploy_refuses_a_certificate_it_cannot_run_with_before_anything_starts(
        pki: Pki, which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import server.deploy as deploy

    def start(self: deploy.Deployment) -> deploy.Deployment:
        raise AssertionError("the deployment started")

    monkeypatch.setattr(deploy.Deployment, "start", start)
    t = getattr(pki, which)
    code = deploy.main(["--tls-ca", str(t.ca), "--tls-cert", str(t.cert), "--tls-key", str(t.key),
                        "--out", str(tmp_path / "run"), "--workdir", str(tmp_path / "work")])
    err = capsys.readouterr().err
    said = {"other_host": "is not valid for 127.0.0.1 (it names DNS:other.example): every process of the "
                         "deployment is reached there; give a certificate with subjectAltName IP:127.0.0.1",
            "no_names": "is not valid for 127.0.0.1 (it has no subjectAltName)",
            "expired": f"expired on {pki.expired_on}: renew it",
            "server_only": "cannot authenticate a TLS client (its extended key usage allows serverAuth only, not "
                           "clientAuth): a tier that asks for it (mutual TLS) refuses it; give a certificate "
                           "whose extendedKeyUsage includes clientAuth",
            "client_only": "cannot authenticate a TLS server (its extended key usage allows clientAuth, "
                           "codeSigning only, not serverAuth)"}[which]
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"deploy: error: --tls-cert {t.cert} {said}"), err
    assert not (tmp_path / "work").exists() and not (tmp_path / "run").exists()  # nothing was started
    deploy.check_tls(str(pki.ca), str(pki.good.cert), str(pki.good.key))  # one for 127.0.0.1: taken


# ------------------------------------------------------------------ what a certificate may authenticate


def test_a_certificate_is_checked_for_the_roles_it_plays(pki: Pki) -> None:
    """Served, a certificate must allow serverAuth; presented for mutual TLS, clientAuth (OpenSSL refuses it
    at every handshake otherwise: "unsupported certificate purpose"). One without extendedKeyUsage allows both."""
    with pytest.raises(ConfigError, match=r"serveronly.pem cannot authenticate a TLS client \(its extended key "
                                          r"usage allows serverAuth only, not clientAuth\)"):
        pki.server_only.check(roles=("client",))
    with pytest.raises(ConfigError, match="clientonly.pem cannot authenticate a TLS server"):
        serve_tier("cloud", tls=pki.client_only)  # before it listens
    pki.server_only.check(roles=("server",))
    pki.client_only.check(roles=("client",))
    pki.any_use.check(roles=("server", "client"))
    with serve_tier("cloud", tls=pki.any_use) as srv:  # no extendedKeyUsage: served, and taken as a client's
        assert tls_refusal("127.0.0.1", srv.port, pki.any_use) is None


def test_a_tier_refusing_this_sides_certificate_for_its_purpose_is_told_apart_from_another_ca(pki: Pki) -> None:
    """The tier closes the connection on a client certificate without clientAuth as it does on one another CA
    signed; the diagnosis used to guess the CA. It now reads this side's own certificate and names its use."""
    with serve_tier("cloud", tls=pki.good) as srv:
        said = tls_refusal("127.0.0.1", srv.port, pki.server_only)
        assert said == (f"the tier closed the connection when it got this side's certificate {pki.server_only.cert}: "
                        "it cannot authenticate a client (its extended key usage allows serverAuth only, not "
                        "clientAuth): give one whose extendedKeyUsage includes clientAuth (--tls-cert and --tls-key / "
                        "tls-cert and tls-key)")
        with pytest.raises(TlsRefused, match="cannot authenticate a client"):
            GrpcTierClient(srv.address, tls=pki.server_only).describe(deadline_s=5)


def test_ping_refuses_a_certificate_that_cannot_authenticate_a_client_before_any_call(
        pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    from splitfed.cli import main

    code = main(["ping", "127.0.0.1:9", "--tls-ca", str(pki.ca), "--tls-cert", str(pki.server_only.cert),
                 "--tls-key", str(pki.server_only.key)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot authenticate a TLS client" in err, err
    assert "unavailable" not in err.lower()  # refused before any tier was asked
