"""Fixtures of the transport tests: certificates made here (``cryptography``), servers, helpers."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.types import State
from splitfed.models.zoo import resolve_spec
from splitfed.transport.pb import SERVICE
from splitfed.transport.security import TlsConfig

SPEC = resolve_spec("cnn")  # 1x8x8 digits CNN: 7 blocks, boundary after block 2 is 16x4x4


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    kp, cp = path.with_suffix(".key"), path.with_suffix(".pem")
    kp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cp, kp


def make_ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(cn: str, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
              ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate good for both ends (serverAuth and clientAuth) on localhost / 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def write_ca(folder: Path, cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    """A CA made by :func:`make_ca`, its certificate written to ``folder/ca.pem``: its key, certificate and file."""
    key, cert = make_ca(cn)
    path = folder / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: TlsConfig  # the tier: its cert and key, requiring clients signed by ca
    client: TlsConfig  # a device with a cert from the same CA
    no_cert: TlsConfig  # a device that verifies the server but presents no certificate
    rogue: TlsConfig  # a device with a cert from another CA
    server_tls_only: TlsConfig  # a tier with TLS but no client certificates required


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca, ca_path = write_ca(d, "splitfed test CA")
    s_cert, s_key = _write(d / "server", *make_leaf("tier", ca_key, ca))
    c_cert, c_key = _write(d / "client", *make_leaf("device", ca_key, ca))
    r_ca_key, r_ca = make_ca("some other CA")
    r_cert, r_key = _write(d / "rogue", *make_leaf("device", r_ca_key, r_ca))
    return Certs(
        ca=ca_path,
        server=TlsConfig(s_cert, s_key, ca_path),
        client=TlsConfig(c_cert, c_key, ca_path),
        no_cert=TlsConfig(ca=ca_path),
        rogue=TlsConfig(r_cert, r_key, ca_path),
        server_tls_only=TlsConfig(s_cert, s_key, None),
    )


# ---------------------------------------------------------------- one cloud tier in this process

CUT = 2  # device holds blocks [0, 2); the tier holds [2, 7) and computes the loss


def load_client(tier, client_id: str, run_id: str = "run", round_: int = 0, cut: int = CUT) -> None:  # type: ignore[no-untyped-def]
    cfg = RoundConfig(run_id, round_, SPEC)
    (load,) = tier_loads(cfg, client_id, (cut,), initial_state(SPEC, 0))
    tier.load(load)


def activation(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 16, 4, 4, generator=torch.Generator().manual_seed(seed))


def labels(batch: int = 4) -> torch.Tensor:
    return torch.arange(batch) % 10


def same(a: State, b: State) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def plain_server() -> Iterator:  # type: ignore[type-arg]
    from splitfed.transport.server import serve_tier

    srv = serve_tier("cloud", insecure=True, max_workers=8)
    try:
        yield srv
    finally:
        srv.stop(0)


def at_once(call: Callable[[str], object], clients: Iterable[str], timeout_s: float = 30.0) -> list[BaseException]:
    """``call(client)`` for each client, each in its own thread, all at once; what they raised."""
    raised: list[BaseException] = []

    def one(cid: str) -> None:
        try:
            call(cid)
        except BaseException as e:  # noqa: BLE001 - the caller asserts on them
            raised.append(e)

    threads = [threading.Thread(target=one, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return raised


@contextlib.contextmanager
def fake_tier(handlers: Mapping[str, grpc.RpcMethodHandler], workers: int = 2) -> Iterator[str]:
    """A gRPC service on 127.0.0.1 answering the named methods of splitfed's Tier service as ``handlers`` say
    (any other: UNIMPLEMENTED), as a misbehaving or older tier would; its address."""
    server = grpc.server(futures.ThreadPoolExecutor(workers))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, dict(handlers)),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def tcp_server(handle: Callable[[socket.socket], object], host: str = "127.0.0.1") -> tuple[str, Callable[[], None]]:
    """A port on ``host`` (127.0.0.1, or an IPv6 address such as ::1) whose every connection ``handle`` gets (in
    a thread of its own): a proxy, a TLS terminator, a peer that answers wrongly; its address and the function
    that stops it."""
    ipv6 = ":" in host
    ls = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET)
    ls.bind((host, 0))
    ls.listen(16)
    ls.settimeout(0.2)  # accept wakes up to see ``done``
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = ls.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()

    def stop() -> None:
        done.set()
        ls.close()

    return f"[{host}]:{ls.getsockname()[1]}" if ipv6 else f"{host}:{ls.getsockname()[1]}", stop


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (as a rule: it was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DrivenClock:
    """A module's ``time`` that a test drives: ``monotonic`` (and ``perf_counter``) stand still but where a test
    moves ``now``; ``sleep`` moves it on by what was asked (or to ``wake_at``, a sleep that overslept) and keeps
    what was asked."""

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)
    wake_at: float | None = None

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now = self.wake_at if self.wake_at is not None else self.now + s
