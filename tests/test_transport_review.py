"""Transport review: defects found by reading the transport against its contract, each test failing before its fix.

- a status a forwarding tier relays from its next tier was diagnosed again as if it were about the caller's own
  link (a TLS refusal between edge and cloud told the device to fix its CA, a wrong edge token told it to check
  its token file);
- a CA file every certificate of which is outside its dates was taken, and a tier then refused every peer;
- measuring a link's bandwidth with a ``unary_bytes`` under 64 KiB asked for a negative payload.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.types import StepKey
from splitfed.errors import ConfigError
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import TlsRefused, Unauthenticated, Unavailable
from splitfed.transport.probe import bandwidth_mbps
from splitfed.transport.security import TlsConfig
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import SPEC, Certs, certs, labels  # noqa: F401

HINT = "the tier holds another token than this connection's"


def _edge_and_cloud_loaded(edge: TierServer, cloud: TierServer) -> torch.Tensor:
    """Client "a" bound on both tiers (blocks [1, 3) on the edge, [3, 7) on the cloud); the edge's input."""
    edge_load, cloud_load = tier_loads(RoundConfig("run", 0, SPEC), "a", (1, 3), initial_state(SPEC, 0))
    edge.tier.load(edge_load)
    cloud.tier.load(cloud_load)
    shape, dtype = template.boundary(SPEC, 1)
    return torch.randn(4, *shape, generator=torch.Generator().manual_seed(0)).to(dtype)


# ---------------------------------------------------------------- 1. a relayed status is the next tier's word


def test_a_tls_refusal_between_edge_and_cloud_is_not_blamed_on_the_devices_link(certs: Certs) -> None:  # noqa: F811
    """The edge does not trust the cloud's certificate: the device's own TLS to the edge is fine. Before, the
    device ran its TLS diagnosis on the edge's words and raised TlsRefused, "this side does not trust the tier's
    certificate ...: give the CA that signed it", about its own, working link."""
    cloud_tls = TlsConfig(certs.rogue.cert, certs.rogue.key)  # signed by a CA the edge does not know
    with serve_tier("cloud", tls=cloud_tls) as cloud, \
            serve_tier("edge", next_address=cloud.address, tls=certs.server, next_deadline_s=20) as edge:
        assert edge.next_link is not None
        edge.next_link.retries = 0
        x = _edge_and_cloud_loaded(edge, cloud)
        with GrpcTierClient(edge.address, tls=certs.client, retries=0, deadline_s=30) as device:
            with pytest.raises(Unavailable) as e:
                device.step(StepKey("run", "a", 0, 0), x, labels())
    assert not isinstance(e.value, TlsRefused), e.value
    said = str(e.value)
    assert said.startswith(f"tier {edge.address}: step 0 of a: unavailable after 1 attempt(s): "
                           f"tier {cloud.address}: step 0 of a: TLS refused: this side does not trust the tier's "
                           f"certificate by the CA in {certs.ca}"), said
    assert said.count("TLS refused") == 1, said


@pytest.mark.parametrize("chunk", [1 << 20, 256], ids=["Step", "StepStream"])
def test_a_wrong_token_of_the_edge_is_not_blamed_on_the_devices_token(chunk: int) -> None:
    """The edge presents a wrong token to the cloud; the device's token is the right one. Before, the device
    added its own "check --token-file" hint to the cloud's (the same hint twice, the first about the device); then
    the one hint was the device's connection's words ("check --token-file / token-file ..."): now the edge's."""
    with serve_tier("cloud", insecure=True, token="good") as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True, token="good", next_token="wrong") as edge:
        x = _edge_and_cloud_loaded(edge, cloud)
        with GrpcTierClient(edge.address, token="good", retries=0, deadline_s=30,
                            limits=wire.Limits(chunk_bytes=chunk, unary_bytes=chunk)) as device:
            with pytest.raises(Unauthenticated) as e:
                device.step(StepKey("run", "a", 0, 0), x, labels())
        said = str(e.value)  # the hint names the edge's file: the device's user has nothing to check
        assert said.startswith(f"tier {edge.address}: step 0 of a: tier {cloud.address}: step 0 of a: invalid "
                               "bearer token (its next tier holds another token than tier edge's --token-file: a "
                               "tier presents its own token to its --next, so the two must hold the same one)"), said
        assert HINT not in said, said
        # the tier's own refusal of this side's token still says which file to check
        with GrpcTierClient(edge.address, token="bad", retries=0, deadline_s=30) as stranger:
            with pytest.raises(Unauthenticated, match=f"invalid bearer token \\({HINT}"):
                stranger.describe()


# ---------------------------------------------------------------- 2. a CA file outside its dates


def _expired_ca(d: Path) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "an expired CA")])
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=3))
            .not_valid_after(now - dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path = d / "expired-ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert


def test_a_ca_file_outside_its_dates_is_refused_naming_it(certs: Certs, tmp_path: Path) -> None:  # noqa: F811
    """Before, a tier started with an expired --tls-ca and then refused every device (which was told "one its
    CA did not sign?"); a client's expired CA was only found after its retries, at its first handshake."""
    old, key, cert = _expired_ca(tmp_path)
    expired_on = cert.not_valid_after_utc.strftime("%Y-%m-%d %H:%M:%S UTC")
    server = TlsConfig(certs.server.cert, certs.server.key, old)
    with pytest.raises(ConfigError, match=f"^CA certificate {old} expired on {expired_on}: renew it"):
        serve_tier("cloud", tls=server)
    with pytest.raises(ConfigError, match=f"^--tls-ca {old} expired on {expired_on}: renew it"):
        server.check(("--tls-cert", "--tls-key", "--tls-ca"))
    with pytest.raises(ConfigError, match=f"^CA certificate {old} expired on {expired_on}"):
        GrpcTierClient("127.0.0.1:1", tls=TlsConfig(ca=old), retries=0, deadline_s=5)
    # a bundle with one good CA in it still verifies the peers that one signed: taken
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(old.read_bytes() + Path(certs.ca).read_bytes())
    TlsConfig(certs.server.cert, certs.server.key, bundle).check()


# ---------------------------------------------------------------- 3. bandwidth with small messages


def test_bandwidth_is_measured_with_messages_under_64_kib() -> None:
    """``Limits(unary_bytes=32 KiB)`` is valid; before, the probe's largest payload was 32 KiB - 64 KiB."""
    small = wire.Limits(chunk_bytes=32 << 10, unary_bytes=32 << 10)
    with serve_tier("edge", insecure=True, limits=small) as srv, GrpcTierClient(srv.address, limits=small) as c:
        for up in (True, False):
            mbps = bandwidth_mbps(c, up=up, count=1, target_s=0.0)
            assert math.isfinite(mbps) and mbps > 0


# ---------------------------------------------------------------- 4. nothing left open when a start is refused


class _Recorded(GrpcTierClient):
    """A client that says whether it was closed."""

    made: list[_Recorded] = []

    def __init__(self, *a: object, **k: object) -> None:
        super().__init__(*a, **k)  # type: ignore[arg-type]
        self.closed = False
        _Recorded.made.append(self)

    def close(self) -> None:
        self.closed = True
        super().close()


@pytest.mark.parametrize("bad", ["tls without a certificate", "idle_release_s", "max_workers"])
def test_a_tier_that_refuses_to_start_closes_its_next_tiers_channel(certs: Certs, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                                                   bad: str) -> None:
    import splitfed.transport.server as server

    monkeypatch.setattr(server, "GrpcTierClient", _Recorded)
    _Recorded.made = []
    how: dict[str, object] = {"tls without a certificate": {"tls": TlsConfig(ca=certs.ca)},
                              "idle_release_s": {"insecure": True, "idle_release_s": -1.0},
                              "max_workers": {"insecure": True, "max_workers": 0}}[bad]  # type: ignore[assignment]
    with pytest.raises((ConfigError, ValueError)):
        serve_tier("edge", next_address="127.0.0.1:1", **how)  # type: ignore[arg-type]
    assert len(_Recorded.made) == 1 and _Recorded.made[0].closed


def test_a_chain_with_a_bad_later_address_closes_the_clients_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    import splitfed.transport.chain as chain

    monkeypatch.setattr(chain, "GrpcTierClient", _Recorded)
    _Recorded.made = []
    with pytest.raises(ConfigError, match="bad tier address 'cloud'"):
        chain.grpc_chain(["127.0.0.1:1", "cloud"], insecure=True)
    assert len(_Recorded.made) == 1 and _Recorded.made[0].closed


def test_a_tier_process_that_cannot_start_leaves_no_token_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token is handed over in a private file the reaper removes; a child that never started has no reaper."""
    import tempfile

    from splitfed.transport.process import TierProcess

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ValueError, match="embedded null byte"):
        TierProcess.start(token="s3cret", insecure=True, env={"BROKEN": "a\0b"})
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 5. retry settings


@pytest.mark.parametrize("kw, words", [({"backoff_s": -1.0}, "backoff_s"), ({"backoff_s": math.nan}, "backoff_s"),
                                       ({"retries": -1}, "retries"), ({"retries": 1.5}, "retries")])
def test_retry_settings_that_would_fail_the_first_retry_are_refused(kw: dict[str, float], words: str) -> None:
    """Before, a negative backoff was taken, and the first UNAVAILABLE became ``ValueError: sleep length must
    be non-negative``, the tier's status lost."""
    with pytest.raises(ConfigError, match=words):
        GrpcTierClient("127.0.0.1:1", **kw)  # type: ignore[arg-type]
