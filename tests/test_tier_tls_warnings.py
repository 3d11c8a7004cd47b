"""A tier whose TLS files some peers will refuse says so when it starts, and serves all the same.

A tier started with ``--tls-ca`` and a ``--tls-cert`` that CA did not sign started silently; every caller that
trusts only that CA then refused it ("does not trust the tier's certificate"). It may be meant (a tier verifies its
clients by one CA and is signed by another), so it is not refused: one warning names both files. An edge whose
certificate cannot authenticate a TLS client (its extendedKeyUsage lacks clientAuth) is refused by a next tier that
asks for mutual TLS: warned of too. Certificates are made by the test.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import TlsRefused
from splitfed.transport.process import TierProcess
from splitfed.transport.security import TlsConfig
from tests.transport_fixtures import _write, closed_port, make_leaf, write_ca

FLAGS = ("--tls-cert", "--tls-key", "--tls-ca")


def _cert(cn: str, issuer_key: ec.EllipticCurvePrivateKey, issuer: x509.Name, *, ca: bool = False,
          usages: tuple[x509.ObjectIdentifier, ...] = (ExtendedKeyUsageOID.SERVER_AUTH,),
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate for 127.0.0.1 that ``issuer_key`` (of ``issuer``) signs: an intermediate CA with ``ca``, else
    a leaf whose extendedKeyUsage is ``usages``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
         .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = (b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
             .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False))
    return key, b.sign(issuer_key, hashes.SHA256())


def _folder(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    return d


def _not_signed(cert: object, ca: object) -> str:
    return (f"--tls-cert {cert} is not signed by the CA in --tls-ca {ca}: a caller that trusts only that CA refuses "
            f"this tier (\"this side does not trust the tier's certificate\"); give such callers the CA that signed "
            f"{cert}, or give this tier a certificate that CA signed")


def _no_client_auth(cert: object) -> str:
    return (f"--tls-cert {cert} cannot authenticate a TLS client (its extended key usage allows serverAuth only, not "
            "clientAuth): a next tier that asks for mutual TLS (one started with --tls-ca) refuses this tier's calls "
            "to it; if yours does, give a certificate whose extendedKeyUsage includes clientAuth")


# ---------------------------------------------------------------- what is doubted, and what is not


def test_a_certificate_another_ca_signed_is_doubted_naming_both_files(tmp_path: Path) -> None:
    key_a, ca_a, path_a = write_ca(_folder(tmp_path, "a"), "CA a")
    key_b, ca_b, _ = write_ca(_folder(tmp_path, "b"), "CA b")
    cert, key = _write(tmp_path / "tier", *make_leaf("tier", key_b, ca_b))
    assert TlsConfig(cert, key, path_a).doubts(FLAGS) == [_not_signed(cert, path_a)]
    assert TlsConfig(cert, key, path_a).doubts() == [_not_signed(cert, path_a).replace(
        "--tls-cert", "TLS certificate").replace("--tls-ca", "CA certificate")]
    mine, my_key = _write(tmp_path / "mine", *make_leaf("tier", key_a, ca_a))
    assert TlsConfig(mine, my_key, path_a).doubts(FLAGS) == []
    assert TlsConfig(cert, key).doubts(FLAGS, forwards=True) == []  # no CA file: nothing to be signed by


def test_a_certificate_signed_through_an_intermediate_of_its_chain_is_not_doubted(tmp_path: Path) -> None:
    root_key, root, root_path = write_ca(tmp_path, "root")
    mid_key, mid = _cert("intermediate", root_key, root.subject, ca=True)
    leaf_key, leaf = _cert("tier", mid_key, mid.subject)
    cert, key = _write(tmp_path / "tier", leaf_key, leaf)
    alone = TlsConfig(cert, key, root_path).doubts(FLAGS)
    assert alone == [_not_signed(cert, root_path)]  # a peer is sent the leaf only: root alone does not verify it
    with cert.open("ab") as f:  # the chain it serves: leaf, then intermediate
        f.write(mid.public_bytes(serialization.Encoding.PEM))
    assert TlsConfig(cert, key, root_path).doubts(FLAGS) == []


def test_a_certificate_without_client_auth_is_doubted_only_where_it_forwards(tmp_path: Path) -> None:
    ca_key, ca, ca_path = write_ca(tmp_path, "CA")
    cert, key = _write(tmp_path / "tier", *_cert("tier", ca_key, ca.subject))
    tls = TlsConfig(cert, key, ca_path)
    assert tls.doubts(FLAGS) == []
    assert tls.doubts(FLAGS, forwards=True) == [_no_client_auth(cert)]
    both, both_key = _write(tmp_path / "both", *make_leaf("tier", ca_key, ca))  # serverAuth and clientAuth
    assert TlsConfig(both, both_key, ca_path).doubts(FLAGS, forwards=True) == []


# ---------------------------------------------------------------- a real tier: warned at start, and serving


def _warned(tier: TierProcess, n: int) -> list[str]:
    """The tier's warnings, once ``n`` are read (its stderr is read by a thread of its own, which may lag the
    ``listening on`` line of its stdout; 10 s at most)."""
    end = time.monotonic() + 10
    while True:
        said = [line.split(f" {tier.name} WARNING ", 1)[1] for line in tier.output().splitlines()
                if f" {tier.name} WARNING " in line]
        if len(said) >= n or time.monotonic() > end:
            return said
        time.sleep(0.05)


def test_an_edge_warns_of_both_at_start_and_serves(tmp_path: Path) -> None:
    """Its certificate is signed by CA b, its --tls-ca is CA a (its clients'), and it allows serverAuth only."""
    key_a, ca_a, path_a = write_ca(_folder(tmp_path, "a"), "CA a")
    key_b, ca_b, path_b = write_ca(_folder(tmp_path, "b"), "CA b")
    cert, key = _write(tmp_path / "edge", *_cert("edge", key_b, ca_b.subject))
    device_cert, device_key = _write(tmp_path / "device", *make_leaf("device", key_a, ca_a))
    with TierProcess.start("edge", next_address=f"127.0.0.1:{closed_port()}", tls=TlsConfig(cert, key, path_a),
                           startup_timeout=60) as edge:
        assert _warned(edge, 2) == [_not_signed(cert, path_a), _no_client_auth(cert)], edge.output()
        # a device that trusts the CA that signed it is served
        with GrpcTierClient(edge.address, tls=TlsConfig(device_cert, device_key, path_b), retries=0,
                            deadline_s=10) as device:
            assert device.describe().name == "edge"
        # one that trusts only --tls-ca's CA refuses it, as the warning says
        with GrpcTierClient(edge.address, tls=TlsConfig(device_cert, device_key, path_a), retries=0,
                            deadline_s=10) as device, pytest.raises(TlsRefused) as e:
            device.describe()
        assert "this side does not trust the tier's certificate" in str(e.value), e.value
