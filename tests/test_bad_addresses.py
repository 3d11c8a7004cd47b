"""Bad addresses, TLS files and values are refused as bad input (exit 2, one line), never taken for a tier
that is down, and a refused ``tier`` never starts serving."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.transport.address import parse_address
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.security import TlsConfig, read_token
from splitfed.transport.server import parse_listen
from tests.transport_fixtures import Certs, certs  # noqa: F401

BAD = ["127.0.0.1:99999", ":-5", "localhost", "127.0.0.1:abc", ":", "", "http://host:7000", "host:",
       "127.0.0.1:0", "::1:7000", "[nope]:7000", "a b:7000", "999.1.1.1:7000", "dns:///host:7000"]


@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier that gets as far as serving fails the test instead of blocking it."""
    import splitfed.transport.server as server

    def serve(*a: object, **k: object) -> None:
        raise AssertionError("the tier started serving")

    monkeypatch.setattr(server, "serve_tier", serve)


@pytest.fixture
def junk(tmp_path: Path) -> str:
    p = tmp_path / "junk.pem"
    p.write_text("this is not PEM\n")
    return str(p)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *want: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in want:
        assert w in err, err
    return err


# ------------------------------------------------------------------ the parser

hosts = st.one_of(
    # a DNS name is at most 253 characters (the regex alone drew longer ones: `make test-explore` found one of
    # more than 253, which parse_address rightly refuses)
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z][a-z0-9-]{0,10}[a-z0-9])*", fullmatch=True)
    .filter(lambda h: len(h) <= 253),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)


@settings(max_examples=200, deadline=None)
@given(hosts, st.integers(1, 65535))
def test_valid_addresses_round_trip(host: str, port: int) -> None:
    assert parse_address(f"{host}:{port}") == (host, port)
    assert parse_listen(f"{host}:{port}") == (host, port)


@settings(max_examples=200, deadline=None)
@given(hosts, st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_ports_outside_1_to_65535_are_refused(host: str, port: int) -> None:
    with pytest.raises(ConfigError, match=r"want HOST:PORT with a port in 1\.\.65535"):
        parse_address(f"{host}:{port}")


@settings(max_examples=100, deadline=None)
@given(hosts, st.integers(1, 65535), st.sampled_from(["http://", "https://", "grpc://", "dns:///", "unix:"]))
def test_schemes_missing_ports_and_empty_hosts_are_refused(host: str, port: int, scheme: str) -> None:
    for bad in (f"{scheme}{host}:{port}", host if not host.startswith("[") else host[1:-1], f":{port}",
                f"{host}:"):
        with pytest.raises(ConfigError, match="bad address"):
            parse_address(bad)


@pytest.mark.parametrize("address", BAD)
def test_bad_addresses_are_refused(address: str) -> None:
    with pytest.raises(ConfigError, match="bad address"):
        parse_address(address)


def test_listen_allows_port_0_and_ipv6() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::]:7000") == ("[::]", 7000)
    assert parse_address("edge.local:7000") == ("edge.local", 7000)
    assert ipaddress.ip_address(parse_address("[::1]:7000")[0][1:-1]).version == 6
    with pytest.raises(ConfigError, match="bad listen address '0.0.0.0:65536'"):
        parse_listen("0.0.0.0:65536")


def test_a_client_refuses_a_bad_address_before_connecting() -> None:
    with pytest.raises(ConfigError, match="bad tier address '127.0.0.1:99999'"):
        GrpcTierClient("127.0.0.1:99999")
    from splitfed.flower.transport import connect

    with pytest.raises(ConfigError, match="bad tier address 'localhost'"):
        connect("localhost")


# ------------------------------------------------------------------ defect 1: addresses on the command line

@pytest.mark.parametrize("address", ["127.0.0.1:99999", ":-5", "localhost", "127.0.0.1:abc", ":",
                                     "http://host:7000", ""])
def test_ping_refuses_a_malformed_address_as_bad_input(capsys: pytest.CaptureFixture[str], address: str) -> None:
    err = _refused(capsys, ["ping", address, "--timeout", "1"], f"bad address {address!r}",
                   "want HOST:PORT with a port in 1..65535")
    assert "no answer" not in err and "tier-addresses" not in err


@pytest.mark.parametrize("nxt", ["nope", "127.0.0.1:99999"])
def test_tier_refuses_a_malformed_next_before_serving(capsys: pytest.CaptureFixture[str], no_serving: None,
                                                      nxt: str) -> None:
    _refused(capsys, ["tier", "--insecure", "--listen", "127.0.0.1:0", "--next", nxt], f"bad --next address {nxt!r}")


# ------------------------------------------------------------------ defect 2: TLS and token files

def test_tier_refuses_a_certificate_that_is_not_pem(capsys: pytest.CaptureFixture[str], no_serving: None,
                                                    junk: str) -> None:
    _refused(capsys, ["tier", "--listen", "127.0.0.1:0", "--tls-cert", junk, "--tls-key", junk],
             f"--tls-cert {junk} is not a PEM certificate")


def test_tier_refuses_a_key_that_is_not_pem_or_not_the_certificates(
        capsys: pytest.CaptureFixture[str], no_serving: None, junk: str, certs: Certs) -> None:  # noqa: F811
    cert, key, other_key = str(certs.server.cert), str(certs.server.key), str(certs.client.key)
    _refused(capsys, ["tier", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", junk],
             f"--tls-key {junk} is not a PEM private key")
    _refused(capsys, ["tier", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", other_key],
             f"--tls-key {other_key} is not the key of --tls-cert {cert}")
    _refused(capsys, ["tier", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--tls-ca", junk],
             f"--tls-ca {junk} is not a PEM certificate")
    assert certs.server.check()[0] is not None  # the real files pass


def test_ping_refuses_a_ca_that_is_not_pem(capsys: pytest.CaptureFixture[str], junk: str) -> None:
    err = _refused(capsys, ["ping", "127.0.0.1:1", "--tls-ca", junk, "--timeout", "1"],
                   f"--tls-ca {junk} is not a PEM certificate")
    assert "no answer" not in err


def test_a_client_refuses_junk_tls_files(junk: str, certs: Certs) -> None:  # noqa: F811
    with pytest.raises(ConfigError, match="CA certificate .* is not a PEM certificate"):
        GrpcTierClient("127.0.0.1:1", tls=TlsConfig(ca=junk))
    with pytest.raises(ConfigError, match="is not the key of"):
        TlsConfig(certs.client.cert, certs.server.key, certs.ca).channel_credentials()


def test_a_token_file_that_is_not_text_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "token"
    p.write_bytes(b"\xff\xfe\x00token")
    with pytest.raises(ConfigError, match="printable ASCII"):
        read_token(p)


# ------------------------------------------------------------------ defect 3: values checked always

@pytest.mark.parametrize("extra, want", [
    (["--compress", "zip"], "--compress: unknown codec 'zip'"),
    (["--deadline", "-1"], "--deadline must be a positive, finite number of seconds, got -1.0"),
    (["--deadline", "inf"], "--deadline must be a positive, finite number of seconds, got inf"),
    (["--role", "edge"], "an edge tier forwards to the next tier: give --next HOST:PORT"),
])
def test_cloud_tier_checks_its_values(capsys: pytest.CaptureFixture[str], no_serving: None, extra: list[str],
                                      want: str) -> None:
    _refused(capsys, ["tier", "--insecure", "--listen", "127.0.0.1:0", *extra], want)


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_ping_refuses_a_timeout_that_is_not_positive_and_finite(capsys: pytest.CaptureFixture[str],
                                                                value: str) -> None:
    _refused(capsys, ["ping", "127.0.0.1:1", "--timeout", value], "--timeout must be a positive, finite number")


# ------------------------------------------------------------------ a host name that does not resolve

def test_ping_says_a_host_that_does_not_resolve_is_not_found(capsys: pytest.CaptureFixture[str]) -> None:
    # before: retried for seconds, then "no answer: UNAVAILABLE: ... errors resolving ..."
    assert main(["ping", "nosuchhost.invalid:5000", "--timeout", "2"]) == 1  # 1: a tier did not answer
    out, err = capsys.readouterr()
    assert out.startswith("nosuchhost.invalid:5000: cannot resolve host 'nosuchhost.invalid' (") and out.endswith(
        "): check the name, or give the tier's IP address\n") and out.count("\n") == 1, out
    assert "no answer" not in out and err == ""


def test_only_names_are_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from splitfed.transport.address import unresolvable

    assert unresolvable("localhost:7000") is None
    assert unresolvable("nosuchhost.invalid:7000").startswith("cannot resolve host 'nosuchhost.invalid' (")

    def lookup(*a: object, **k: object) -> None:
        raise AssertionError("an IP address was looked up")

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert unresolvable("127.0.0.1:7000") is None and unresolvable("[::1]:7000") is None
