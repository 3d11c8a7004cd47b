"""``python -m server.deploy`` given a ``--tls-cert`` that ``--tls-ca`` did not sign.

Before, deploy started every process: each verifies the others (which all present that one certificate) against
that CA, so the SuperNodes failed their handshake with the SuperLink, and deploy said only that every SuperNode
exited (CERTIFICATE_VERIFY_FAILED was in supernodeN.log alone). It is now refused before anything starts, by the
same chain check the tiers warn with (:func:`splitfed.transport.security.signed_by`).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

import server.deploy as deploy
from splitfed.errors import ConfigError
from tests.transport_fixtures import Certs, _name, _write, certs, make_ca, make_leaf  # noqa: F401 - certs: a fixture


def _not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(self: deploy.Deployment) -> deploy.Deployment:
        raise AssertionError("the deployment started")

    monkeypatch.setattr(deploy.Deployment, "start", start)


def _intermediate(root_key: ec.EllipticCurvePrivateKey, root: x509.Certificate
                  ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A CA that ``root`` signed."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("intermediate CA")).issuer_name(root.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(root_key, hashes.SHA256()))
    return key, cert


def test_a_certificate_the_ca_did_not_sign_is_refused_before_anything_starts(
        certs: Certs, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    _not_started(monkeypatch)
    rogue = certs.rogue  # for 127.0.0.1, serverAuth and clientAuth, within its dates: another CA signed it
    code = deploy.main(["--tls-ca", str(certs.ca), "--tls-cert", str(rogue.cert), "--tls-key", str(rogue.key),
                        "--out", str(tmp_path / "run"), "--workdir", str(tmp_path / "work")])
    assert code == 2
    assert capsys.readouterr().err == (
        f"deploy: error: --tls-cert {rogue.cert} is not signed by the CA in --tls-ca {certs.ca}: every process of "
        "the deployment verifies the others against that CA and refuses it; give a certificate that CA signed, "
        "or the CA that signed it\n")
    assert not (tmp_path / "work").exists() and not (tmp_path / "run").exists()  # nothing was started


def test_a_deployment_built_with_such_a_certificate_is_refused_too(certs: Certs, tmp_path: Path) -> None:  # noqa: F811
    with pytest.raises(ConfigError, match=r"rogue\.pem is not signed by the CA in --tls-ca "):
        deploy.Deployment(1, tmp_path / "work", tls_ca=str(certs.ca), tls_cert=str(certs.rogue.cert),
                          tls_key=str(certs.rogue.key), log=False)
    assert not (tmp_path / "work").exists()


def test_a_certificate_the_ca_signed_through_an_intermediate_or_among_others_is_taken(tmp_path: Path) -> None:
    """The chain in the certificate file leads to the CA file; a CA file may hold several CAs."""
    root_key, root = make_ca("root CA")
    _, other = make_ca("another CA")
    mid_key, mid = _intermediate(root_key, root)
    leaf_key, leaf = make_leaf("deploy", mid_key, mid)
    chain = tmp_path / "chain.pem"
    key = _write(tmp_path / "leaf", leaf_key, leaf)[1]
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + mid.public_bytes(serialization.Encoding.PEM))
    cas = tmp_path / "cas.pem"
    cas.write_bytes(other.public_bytes(serialization.Encoding.PEM) + root.public_bytes(serialization.Encoding.PEM))
    deploy.check_tls(str(cas), str(chain), str(key))
    only_other = tmp_path / "other.pem"
    only_other.write_bytes(other.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ConfigError, match=r"chain\.pem is not signed by the CA in --tls-ca .*other\.pem"):
        deploy.check_tls(str(only_other), str(chain), str(key))
