"""TLS, mutual TLS and bearer tokens, with certificates made by the test; plaintext only on purpose."""

from __future__ import annotations

import grpc
import pytest

from splitfed.engine.types import StepKey
from splitfed.errors import ConfigError
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import DeadlineExceeded, TlsRefused, Unauthenticated, Unavailable
from splitfed.transport.pb import method
from splitfed.transport.security import TlsConfig, read_token
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import Certs, activation, certs, labels, load_client, tcp_server  # noqa: F401

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
        # told apart from a tier that is down: one handshake says which side refuses what
        with pytest.raises(TlsRefused) as e:
            c.describe()
        want = {"no_cert": "TLS refused: the tier closed the connection when this side sent no certificate: it "
                           "requires one (mutual TLS): --tls-cert and --tls-key",
                "rogue": f"TLS refused: the tier closed the connection when it got this side's certificate "
                         f"{certs.rogue.cert}: it refuses it (one its CA did not sign?)"}[who]
        assert want in str(e.value)


def test_client_verifies_the_server(certs: Certs, tmp_path) -> None:  # noqa: F811, ANN001
    from tests.transport_fixtures import make_ca

    other_ca = tmp_path / "other.pem"
    from cryptography.hazmat.primitives import serialization

    other_ca.write_bytes(make_ca("not the tier's CA")[1].public_bytes(serialization.Encoding.PEM))
    with serve_tier("cloud", tls=certs.server_tls_only) as srv:
        with GrpcTierClient(srv.address, tls=TlsConfig(ca=certs.ca)) as c:
            _ok(c)  # TLS without client certificates
        with GrpcTierClient(srv.address, tls=TlsConfig(ca=other_ca), retries=0, deadline_s=10) as c:
            msg = _refused(c)
            assert msg.startswith("UNAVAILABLE") and (
                f"TLS refused: this side does not trust the tier's certificate by the CA in {other_ca} "
                "(CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate): give the CA that signed it "
                "(--tls-ca / tls-ca)") in msg
        # a certificate for other names than the one asked for: the name is what is wrong, not the CA
        with GrpcTierClient(srv.address, tls=TlsConfig(ca=certs.ca, server_name="elsewhere.example"), retries=0,
                            deadline_s=10) as c:
            assert ("TLS refused: the tier's certificate is not for elsewhere.example (Hostname mismatch, "
                    "certificate is not valid for 'elsewhere.example'.): connect by a name it holds") in _refused(c)
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
                           ("Release", "unary_unary"), ("Reduce", "unary_stream"), ("Describe", "unary_unary"),
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


def test_a_tls_client_of_a_plaintext_tier_and_a_tier_that_is_down(certs: Certs) -> None:  # noqa: F811
    """TLS to a tier serving plaintext is a configuration to fix, said as such; a tier that is not there is
    plain UNAVAILABLE (a network matter: retried, and no TLS verdict)."""
    with serve_tier("cloud", insecure=True) as srv, \
            GrpcTierClient(srv.address, tls=certs.client, retries=0, deadline_s=10) as c:
        with pytest.raises(TlsRefused, match=r"the tier does not speak TLS \(WRONG_VERSION_NUMBER\): it serves "
                                             r"plaintext"):
            c.describe()
        address = srv.address
    with GrpcTierClient(address, tls=certs.client, retries=1, deadline_s=10) as c:
        with pytest.raises(Unavailable) as e:
            c.describe()
        assert not isinstance(e.value, TlsRefused) and "TLS" not in str(e.value)


def test_a_node_whose_certificate_the_edge_refuses_is_left_out_at_registration(certs: Certs) -> None:  # noqa: F811
    """Before, a refused handshake read as a link that could not be measured: the node registered and then
    failed every round it sent an activation to the edge. Now its query fails naming its TLS, and the
    coordinator leaves it out as it does a bad node config; a good certificate measures its link."""
    from flwr.app import ConfigRecord

    from clients.app import _measure_link
    from splitfed.flower.node import NodeConfig

    ask = ConfigRecord({"edge-address": "", "tls-ca": "", "tls-cert": "", "tls-key": "", "token-file": ""})
    with serve_tier("edge", tls=certs.server) as edge:
        def node(tls: TlsConfig) -> NodeConfig:
            return NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "edge-address": edge.address,
                                     "tls-ca": str(tls.ca), "tls-cert": str(tls.cert), "tls-key": str(tls.key)})

        with pytest.raises(ConfigError, match=f"the edge refuses this node's TLS .*{certs.rogue.cert}"):
            _measure_link(node(certs.rogue), ask)
        link, why = _measure_link(node(certs.client), ask)
        assert link is not None and link.rtt_ms > 0 and why == ""


@pytest.mark.parametrize("how", ["closes-at-once", "tls-proxy-closes"])
def test_a_port_that_just_closes_is_no_tls_verdict_and_the_node_registers(certs: Certs, how: str) -> None:  # noqa: F811
    """A proxy in front of a tier that is down (docker's, kubectl port-forward, a load balancer) accepts and
    closes; a TLS-terminating one takes the certificate first. Neither is a TLS refusal: plain UNAVAILABLE,
    and a node behind it registers unmeasured (a refusal would leave a rightly configured node out)."""
    import ssl

    from flwr.app import ConfigRecord

    from clients.app import _measure_link
    from splitfed.flower.node import NodeConfig

    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(str(certs.server.cert), str(certs.server.key))
    server_side.load_verify_locations(cafile=str(certs.ca))
    server_side.verify_mode = ssl.CERT_REQUIRED
    server_side.set_alpn_protocols(["h2"])

    def handle(conn) -> None:  # type: ignore[no-untyped-def]
        with conn:
            if how == "tls-proxy-closes":
                try:
                    server_side.wrap_socket(conn, server_side=True).close()
                except (ssl.SSLError, OSError):
                    pass

    address, stop = tcp_server(handle)
    try:
        with GrpcTierClient(address, tls=certs.client, retries=1, deadline_s=10) as c:
            with pytest.raises(Unavailable) as e:
                c.describe()
            assert not isinstance(e.value, TlsRefused), e.value
        node = NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "edge-address": address,
                                 "tls-ca": str(certs.ca), "tls-cert": str(certs.client.cert),
                                 "tls-key": str(certs.client.key)})
        ask = ConfigRecord({"edge-address": "", "tls-ca": "", "tls-cert": "", "tls-key": "", "token-file": ""})
        link, why = _measure_link(node, ask)
        assert link is None and "its health check failed" in why
    finally:
        stop()


def test_the_tls_diagnosis_keeps_within_the_calls_deadline(certs: Certs, monkeypatch) -> None:  # noqa: F811, ANN001
    """A port that takes the connection and then says nothing: the handshake tried after gRPC's UNAVAILABLE
    gets what is left of the call's deadline (it took 3 s more, and a forwarding tier's caller then saw a
    bare DEADLINE_EXCEEDED), and none once the deadline is spent."""
    import splitfed.transport.client as client_module

    asked: list[float] = []
    real = client_module.tls_refusal

    def recorded(host, port, tls, timeout_s=3.0, connect_to=""):  # type: ignore[no-untyped-def]
        asked.append(timeout_s)
        return real(host, port, tls, timeout_s, connect_to)

    monkeypatch.setattr(client_module, "tls_refusal", recorded)
    held = []
    address, stop = tcp_server(held.append)  # kept open, silent
    try:
        with GrpcTierClient(address, tls=certs.client, retries=5, deadline_s=1.5) as c:
            with pytest.raises((Unavailable, DeadlineExceeded)):
                c.describe()
        assert all(0 < t < 1.5 for t in asked), asked  # what was left: not the whole budget
        with GrpcTierClient(address, tls=certs.client, retries=0, deadline_s=10) as c:
            err = c._error(grpc.StatusCode.UNAVAILABLE, "Handshake read failed (Socket closed)", "describe", 0,
                           10.0, left=0.0)
        assert isinstance(err, Unavailable) and not isinstance(err, TlsRefused) and len(asked) <= 1
    finally:
        stop()
        for conn in held:
            conn.close()
