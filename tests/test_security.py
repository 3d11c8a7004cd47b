"""TLS, mutual TLS and bearer tokens, with certificates made by the test; plaintext only on purpose."""

from __future__ import annotations

import grpc
import pytest

from splitfed.engine.types import StepKey
from splitfed.errors import ConfigError
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import Unauthenticated
from splitfed.transport.pb import method
from splitfed.transport.security import TlsConfig, read_token
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import Certs, activation, certs, labels, load_client  # noqa: F401

TOKEN = "s3cret-token"


def _ok(c: GrpcTierClient) -> None:
    load_client(c, "a")
    assert c.step(StepKey("run", "a", 0, 0), activation(), labels()).grad is not None


def _refused(c: GrpcTierClient) -> str:
    with pytest.raises(Exception) as e:
        load_client(c, "a")
    return f"{getattr(e.value, 'code', '')}: {e.value}"


def test_plaintext_needs_an_explicit_choice() -> None:
    with pytest.raises(ConfigError, match="refusing to serve without TLS"):
        serve_tier("cloud")


def test_mutual_tls_accepts_a_client_of_the_ca(certs: Certs) -> None:  # noqa: F811
    with serve_tier("cloud", tls=certs.server) as srv, GrpcTierClient(srv.address, tls=certs.client) as c:
        _ok(c)


@pytest.mark.parametrize("who", ["no_cert", "rogue"])
def test_mutual_tls_rejects_no_cert_and_a_cert_of_another_ca(certs: Certs, who: str) -> None:  # noqa: F811
    with serve_tier("cloud", tls=certs.server) as srv, \
            GrpcTierClient(srv.address, tls=getattr(certs, who), retries=0, deadline_s=10) as c:
        msg = _refused(c)
        assert msg.startswith("UNAVAILABLE"), msg
        assert srv.tier.clients() == 0


def test_client_verifies_the_server(certs: Certs, tmp_path) -> None:  # noqa: F811, ANN001
    from tests.transport_fixtures import make_ca

    other_ca = tmp_path / "other.pem"
    from cryptography.hazmat.primitives import serialization

    other_ca.write_bytes(make_ca("not the tier's CA")[1].public_bytes(serialization.Encoding.PEM))
    with serve_tier("cloud", tls=certs.server_tls_only) as srv:
        with GrpcTierClient(srv.address, tls=TlsConfig(ca=certs.ca)) as c:
            _ok(c)  # TLS without client certificates
        with GrpcTierClient(srv.address, tls=TlsConfig(ca=other_ca), retries=0, deadline_s=10) as c:
            assert _refused(c).startswith("UNAVAILABLE")
        with GrpcTierClient(srv.address, retries=0, deadline_s=10) as c:  # plaintext to a TLS port
            msg = _refused(c)
            assert msg.startswith("UNAVAILABLE") and "a tier that serves TLS closes a plaintext connection" in msg


@pytest.mark.parametrize("token,match", [(None, "missing bearer token"), ("wrong", "invalid bearer token"),
                                         (TOKEN + "x", "invalid bearer token")])
def test_token_missing_or_wrong_is_unauthenticated(certs: Certs, token: str | None, match: str) -> None:  # noqa: F811
    with serve_tier("cloud", tls=certs.server, token=TOKEN) as srv:
        with GrpcTierClient(srv.address, tls=certs.client, token=token, retries=0) as c:
            with pytest.raises(Unauthenticated, match=match):
                load_client(c, "a")
            with pytest.raises(Unauthenticated, match=match):
                c.fetch("run", "a")
            assert c.health()  # health probes need no token
        assert srv.tier.clients() == 0
        with GrpcTierClient(srv.address, tls=certs.client, token=TOKEN) as c:
            _ok(c)


def test_token_on_every_rpc_kind(certs: Certs) -> None:  # noqa: F811
    with serve_tier("cloud", insecure=True, token=TOKEN) as srv, grpc.insecure_channel(srv.address) as ch:
        for name, kind in (("Step", "stream_stream"), ("Load", "stream_unary"), ("Fetch", "unary_stream"),
                           ("Release", "unary_unary"), ("Describe", "unary_unary"),
                           ("Probe", "unary_unary")):
            call = getattr(ch, kind)(method(name))
            arg = iter([b""]) if kind.startswith("stream") else b""
            with pytest.raises(grpc.RpcError) as e:
                r = call(arg, timeout=5)
                if kind.endswith("stream"):
                    list(r)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, name


def test_token_file(tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "token"
    f.write_text(f"  {TOKEN}\n")
    assert read_token(f) == TOKEN
    f.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        read_token(f)
    f.write_text("two words")
    with pytest.raises(ConfigError, match="one token"):
        read_token(f)
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(tmp_path / "missing")


def test_tls_config_needs_cert_and_key_together(certs: Certs) -> None:  # noqa: F811
    with pytest.raises(ConfigError, match="both"):
        TlsConfig(cert=certs.ca)


def test_a_chain_of_mutual_tls_tiers_with_tokens_changes_no_number(certs: Certs) -> None:  # noqa: F811
    """device -> edge -> cloud, every hop with mutual TLS and the token (the edge presents both onward)."""
    from splitfed.engine.verify import verify
    from splitfed.models.zoo import resolve_spec
    from splitfed.transport.chain import close_chain, grpc_chain

    with serve_tier("cloud", tls=certs.server, token=TOKEN) as cloud, \
            serve_tier("edge", next_address=cloud.address, tls=certs.server, token=TOKEN) as edge:
        chain = grpc_chain([edge.address, cloud.address], tls=certs.client, token=TOKEN)
        try:
            result = verify(resolve_spec("cnn"), [(2, 5), (3, 6)], mode="sflv1", chain=chain, transport="grpc")
        finally:
            close_chain(chain)
        assert result.ok and result.max_abs_diff == 0.0, result
    with serve_tier("cloud", tls=certs.server, token=TOKEN) as cloud, \
            serve_tier("edge", next_address=cloud.address, tls=certs.server, next_token="wrong") as edge:
        chain = grpc_chain([edge.address, cloud.address], tls=certs.client, token=TOKEN, retries=0)
        try:
            with pytest.raises(Unauthenticated, match="invalid bearer token"):
                verify(resolve_spec("cnn"), [(2, 5)], mode="sflv1", chain=chain, transport="grpc")
        finally:
            close_chain(chain)
