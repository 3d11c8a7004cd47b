"""TLS / mutual TLS credentials and the bearer-token check of the tier service.

One :class:`TlsConfig` serves both ends. As a server: present ``cert``/``key``,
and with ``ca`` require every client to present a certificate signed by it
(mutual TLS). As a client: verify the server against ``ca`` (the system roots
without it) and present ``cert``/``key`` if given. A tier that forwards to a
next tier uses its own config as a client of that tier.

Tokens travel as ``authorization: Bearer <token>`` metadata and are compared in
constant time by :class:`TokenInterceptor`; only the gRPC health service is
exempt, so that orchestrators can probe a tier without the token. A tier may
hold two: the devices' token (steps, and what any caller may ask) and the
coordinator's, which alone allows the control calls (load, fetch, release, reduce), so
that a device, which holds the devices' token, cannot claim or release a segment.
"""

from __future__ import annotations

import datetime as dt
import hmac
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from splitfed.errors import ConfigError

AUTH_HEADER = "authorization"
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    if not data.strip():
        raise ConfigError(f"{what} {path} is empty")
    return data


def _pem_certificates(data: bytes, path: object, what: str) -> list[Any]:
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise ConfigError(f"{what} {path} is not a PEM certificate")
    return certs


def _pem_key(data: bytes, path: object, what: str) -> Any:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(f"{what} {path} is encrypted: give the key without a passphrase") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(f"{what} {path} is not a PEM private key") from None


def _spki(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _when(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def out_of_date(cert: Any, now: dt.datetime | None = None) -> tuple[str, str] | None:
    """Whether a certificate is outside its validity dates now (by this machine's clock), as a phrase for a
    sentence about it (``"expired on DATE"``, ``"is not valid before DATE"``) and what to do about it; None
    when it is within them. OpenSSL refuses such a certificate (verify codes 9 and 10) at
    every handshake, whoever checks it."""
    now = now or dt.datetime.now(dt.UTC)
    if cert.not_valid_after_utc < now:
        return f"expired on {_when(cert.not_valid_after_utc)}", "renew it"
    if cert.not_valid_before_utc > now:
        return f"is not valid before {_when(cert.not_valid_before_utc)}", "check the clocks, or renew it"
    return None


_AUTH = {"server": "serverAuth", "client": "clientAuth"}  # TLS roles, as extendedKeyUsage names them


def refused_role(cert: Any, role: str) -> str | None:
    """Why ``cert`` cannot authenticate a TLS ``role`` ("server" or "client"), as a phrase ("its extended key
    usage allows serverAuth only"); None when it can: it has no extendedKeyUsage (any use), or one that names
    the role or any use. OpenSSL refuses such a peer's certificate at every handshake with "unsupported
    certificate purpose", which its peer sees only as a closed connection."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID as Eku

    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return None
    wanted = Eku.SERVER_AUTH if role == "server" else Eku.CLIENT_AUTH
    if wanted in usage or Eku.ANY_EXTENDED_KEY_USAGE in usage:
        return None
    names = [n if (n := getattr(u, "_name", "")) and n != "Unknown OID" else u.dotted_string for u in usage]
    names = names or ["nothing"]
    return f"its extended key usage allows {', '.join(names)} only, not {_AUTH[role]}"


def _issued_by(cert: Any, issuer: Any) -> bool:
    """Whether ``issuer`` signed ``cert`` (its name and signature; dates and uses are :meth:`TlsConfig.check`'s)."""
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):  # another issuer's name, a signature or key it cannot check
        return False
    return True


def signed_by(chain: Sequence[Any], anchors: Sequence[Any]) -> bool:
    """Whether the leaf of ``chain`` (a certificate file's, leaf first) leads to one of ``anchors`` (a CA file's),
    through the chain's other certificates as a peer that trusts those anchors follows them; a leaf that is
    itself an anchor does too."""
    cert, rest = chain[0], list(chain[1:])
    while True:
        if any(cert == a or _issued_by(cert, a) for a in anchors):
            return True
        up = next((c for c in rest if _issued_by(cert, c)), None)
        if up is None:
            return False
        rest.remove(up)
        cert = up


def certificate_names(cert_pem: bytes) -> list[str]:
    """The subjectAltName entries of the first certificate in ``cert_pem`` (the leaf), as ``DNS:name`` and
    ``IP:address``: what a client verifying it by name or address checks (never the subject's CN)."""
    from cryptography import x509

    leaf = x509.load_pem_x509_certificates(cert_pem)[0]
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return ([f"DNS:{n}" for n in san.get_values_for_type(x509.DNSName)]
            + [f"IP:{a}" for a in san.get_values_for_type(x509.IPAddress)])


@dataclass(frozen=True)
class TlsConfig:
    """PEM files: this party's certificate chain and key, and the CA that signs its peers."""

    cert: str | Path | None = None
    key: str | Path | None = None
    ca: str | Path | None = None
    server_name: str | None = None  # client only: the name to verify instead of the address's host

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")

    def check(self, names: tuple[str, str, str] = ("TLS certificate", "TLS key", "CA certificate"),
              roles: tuple[str, ...] = ()) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The PEM bytes of (cert, key, ca), refused with a ConfigError naming the file (as ``names``: e.g.
        the flags ``--tls-cert``, ``--tls-key``, ``--tls-ca``) unless each parses as what it should be, the
        key is the certificate's, the certificate is within its validity dates and may authenticate each of
        ``roles`` ("server": it is served; "client": it is presented for mutual TLS; :func:`refused_role`).
        gRPC would otherwise fail later and vaguely: a tier "cannot listen", or serves a certificate every
        client refuses; a client's handshake fails and the tier looks down."""
        cert, key, ca = (_read(self.cert, names[0]), _read(self.key, names[1]), _read(self.ca, names[2]))
        leaf = _pem_certificates(cert, self.cert, names[0])[0] if cert is not None else None
        if leaf is not None and (dated := out_of_date(leaf)) is not None:
            said, todo = dated
            raise ConfigError(f"{names[0]} {self.cert} {said}: {todo}")
        for role in roles if leaf is not None else ():
            if (why := refused_role(leaf, role)) is not None:
                who = "every client" if role == "server" else "a tier that asks for it (mutual TLS)"
                raise ConfigError(f"{names[0]} {self.cert} cannot authenticate a TLS {role} ({why}): {who} "
                                  f"refuses it; give a certificate whose extendedKeyUsage includes {_AUTH[role]}")
        if ca is not None:  # a CA file none of whose certificates is within its dates verifies no peer at all
            anchors = _pem_certificates(ca, self.ca, names[2])
            stale = [d for c in anchors if (d := out_of_date(c)) is not None]
            if len(stale) == len(anchors):
                said, todo = stale[0]
                every = " (as is every certificate in it)" if len(stale) > 1 else ""
                raise ConfigError(f"{names[2]} {self.ca} {said}{every}: {todo}; every peer's certificate "
                                  "it signed is refused")
        if key is not None:
            private = _pem_key(key, self.key, names[1])
            if leaf is not None and _spki(private.public_key()) != _spki(leaf.public_key()):
                raise ConfigError(f"{names[1]} {self.key} is not the key of {names[0]} {self.cert}")
        return cert, key, ca

    def doubts(self, names: tuple[str, str, str] = ("TLS certificate", "TLS key", "CA certificate"),
               forwards: bool = False) -> list[str]:
        """What a tier serving this config is warned of at start but not refused for, since it is wrong for some
        peers only (:meth:`check` refuses what every peer would refuse), one line each: a certificate the CA
        file did not sign (a tier may verify its clients by one CA and be signed by another, but a caller
        that trusts only that one refuses it), and with ``forwards`` (it is presented to a next tier too) one
        that cannot authenticate a TLS client (a next tier that asks for mutual TLS refuses it). Files
        :meth:`check` refuses give none."""
        chain, anchors = _file_certificates(self.cert), _file_certificates(self.ca)
        said = []
        if chain and anchors and not signed_by(chain, anchors):
            said.append(f"{names[0]} {self.cert} is not signed by the CA in {names[2]} {self.ca}: a caller that "
                        "trusts only that CA refuses this tier (\"this side does not trust the tier's certificate\"); "
                        f"give such callers the CA that signed {self.cert}, or give this tier a certificate that "
                        "CA signed")
        if chain and forwards and (why := refused_role(chain[0], "client")) is not None:
            said.append(f"{names[0]} {self.cert} cannot authenticate a TLS client ({why}): a next tier that asks "
                        "for mutual TLS (one started with --tls-ca) refuses this tier's calls to it; if yours does, "
                        "give a certificate whose extendedKeyUsage includes clientAuth")
        return said

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None:
            raise ConfigError("a TLS server needs a certificate and key (--tls-cert, --tls-key)")
        cert, key, ca = self.check(roles=("server",))
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        cert, key, ca = self.check()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


_PLAINTEXT = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")
_NAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_DATES = (9, 10)  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED
_KEPT = 1 << 16  # bytes of the tier's first flight kept to read its certificates from


def _sent_certificates(data: bytes) -> list[Any]:
    """The certificates of the Certificate message in a TLS 1.2 server's first flight (``data``: the bytes
    received, records as they came), leaf first; [] when there is none to read. In TLS 1.2 that message
    travels in plaintext, so a certificate this side refused can still be looked at."""
    from cryptography import x509

    handshake, i = bytearray(), 0
    while i + 5 <= len(data):
        kind, length = data[i], int.from_bytes(data[i + 3:i + 5], "big")
        if kind == 20:  # change_cipher_spec: what follows is encrypted
            break
        if kind == 22:
            handshake += data[i + 5:i + 5 + length]
        i += 5 + length
    j = 0
    while j + 4 <= len(handshake):
        kind, length = handshake[j], int.from_bytes(handshake[j + 1:j + 4], "big")
        if kind == 11:  # certificate: a 3-byte length of the list, then a 3-byte length before each DER
            body, k, certs = handshake[j + 4:j + 4 + length], 3, []
            while k + 3 <= len(body):
                n = int.from_bytes(body[k:k + 3], "big")
                try:
                    certs.append(x509.load_der_x509_certificate(bytes(body[k + 3:k + 3 + n])))
                except ValueError:
                    break
                k += 3 + n
            return certs
        j += 4 + length
    return []


def _file_certificates(path: str | Path | None) -> list[Any]:
    """The certificates of a PEM file, [] when it cannot be read as such (the caller's evidence only)."""
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificates(Path(path).read_bytes()) if path is not None else []
    except (OSError, ValueError):
        return []


def _first_out_of_date(certs: Sequence[Any]) -> tuple[int, Any, str, str] | None:
    for i, cert in enumerate(certs):
        if (dated := out_of_date(cert)) is not None:
            return i, cert, *dated
    return None


def _dates_refusal(received: bytes, tls: TlsConfig, e: ssl.SSLCertVerificationError) -> str:
    """Why this side refuses the tier's chain for its dates (verify code 9 or 10): which certificate, its
    date and what to renew; the tier's, one of its chain, or the CA this side trusts it by."""
    why = f"({e.reason}: {e.verify_message})"
    sent = _sent_certificates(received)
    if (found := _first_out_of_date(sent)) is not None:
        i, cert, said, todo = found
        which = ("the tier's certificate" if i == 0 else
                 f"the certificate {cert.subject.rfc4514_string()} of the tier's chain")
        return f"{which} {said} {why}: {todo} (splitfed tier --tls-cert and --tls-key)"
    if (found := _first_out_of_date(_file_certificates(tls.ca))) is not None:
        _, cert, said, todo = found
        return (f"the CA certificate {cert.subject.rfc4514_string()} in {tls.ca} {said} {why}: {todo} and give "
                "this side the new one (--tls-ca / tls-ca)")
    return (f"the tier's certificate chain is outside its validity dates {why}: renew the tier's certificate, "
            "or check this machine's clock")


def tls_refusal(host: str, port: int, tls: TlsConfig, timeout_s: float = 3.0, connect_to: str = "") -> str | None:
    """Why this TLS config's handshake with the tier at ``host:port`` is refused, or None when there is no
    TLS-specific evidence (it succeeds, the tier cannot be reached, or the connection just closes).

    gRPC reports a refused handshake as UNAVAILABLE, as it does a tier that is down, so a device with the
    wrong certificate looked like one whose edge was down. One TLS 1.2 handshake, stepped here, tells them
    apart. In TLS 1.2 the tier checks the client's certificate before its last flight: a tier that sent its
    certificate, was sent this side's, and then closed without a word refuses that certificate (gRPC's
    server sends no alert). A port that closes before the tier's first flight (a proxy with no tier behind
    it), or a handshake that completes, is no verdict. This side refusing the tier's certificate fails
    with OpenSSL's reason (checked only against a CA file given: with the system's CAs gRPC's own roots,
    which this process may not share, decide, and its error says so); one refused for its dates is named
    with the date, read from the tier's first flight (plaintext in TLS 1.2), and a certificate of this side
    outside its dates is named before the tier's CA is blamed. ``timeout_s`` bounds the whole probe.
    ``connect_to``: the address of ``host`` to connect to (one of a name's), the certificate still checked
    for ``host``."""
    end = time.monotonic() + timeout_s
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    try:
        if tls.ca is not None:
            ctx.load_verify_locations(cafile=str(tls.ca))
        else:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if tls.cert is not None:
            ctx.load_cert_chain(str(tls.cert), str(tls.key), password=lambda: b"")  # never a terminal prompt
    except (OSError, ssl.SSLError):  # TlsConfig.check names a bad file; gRPC would refuse it too
        return None
    ctx.set_alpn_protocols(["h2"])
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    name = tls.server_name or host
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    try:
        raw = socket.create_connection((connect_to or host, port), timeout=max(0.01, end - time.monotonic()))
    except OSError:
        return None
    flights, received = 0, bytearray()  # what the tier sent: its certificates, when this side refuses them
    with raw:
        while True:
            try:
                conn.do_handshake()
                return None  # in TLS 1.2 a completed handshake means the tier took this side's certificate
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as e:
                if e.verify_code in _NAME_MISMATCH:
                    how = f"server name {name!r}" if tls.server_name else "the address's host"
                    return (f"the tier's certificate is not for {name} ({e.verify_message}): connect by a name it "
                            f"holds, or give the tier a certificate for {name} ({how})")
                if e.verify_code in _DATES:
                    return _dates_refusal(bytes(received), tls, e)
                return (f"this side does not trust the tier's certificate by the CA in {tls.ca} "
                        f"({e.reason}: {e.verify_message}): give the CA that signed it (--tls-ca / tls-ca)")
            except ssl.SSLError as e:
                if e.reason in _PLAINTEXT:
                    return (f"the tier does not speak TLS ({e.reason}): it serves plaintext (splitfed tier "
                            "--insecure); start it with --tls-cert and --tls-key, or connect without TLS")
                if e.reason and "ALERT" in e.reason:  # the tier said why
                    return f"the tier refused the TLS handshake ({e.reason})"
                return None
            try:
                out = outgoing.read()
                if out:
                    raw.sendall(out)
                    flights += 1
                left = end - time.monotonic()
                if left <= 0:
                    return None
                raw.settimeout(left)
                chunk = raw.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:  # closed: after its flight and this side's certificate, a refusal of that certificate
                if not received or flights < 2:
                    return None
                if tls.cert is None:
                    return ("the tier closed the connection when this side sent no certificate: it requires "
                            "one (mutual TLS): --tls-cert and --tls-key / tls-cert and tls-key")
                if (found := _first_out_of_date(_file_certificates(tls.cert))) is not None:  # before the CA
                    i, cert, said, todo = found
                    which = (f"this side's certificate {tls.cert}" if i == 0 else
                             f"the certificate {cert.subject.rfc4514_string()} in {tls.cert}")
                    return (f"the tier closed the connection when it got this side's certificate: {which} {said}: "
                            f"{todo} (--tls-cert and --tls-key / tls-cert and tls-key)")
                mine = _file_certificates(tls.cert)
                if mine and (why := refused_role(mine[0], "client")) is not None:
                    return (f"the tier closed the connection when it got this side's certificate {tls.cert}: "
                            f"it cannot authenticate a client ({why}): give one whose extendedKeyUsage "
                            "includes clientAuth (--tls-cert and --tls-key / tls-cert and tls-key)")
                return (f"the tier closed the connection when it got this side's certificate {tls.cert}: it "
                        "refuses it (one its CA did not sign?): give a certificate the tier's CA signed, "
                        "--tls-cert and --tls-key / tls-cert and tls-key")
            received += chunk[:max(0, _KEPT - len(received))]  # a first flight is a few KiB
            incoming.write(chunk)


def read_token(path: str | Path) -> str:
    """A bearer token from a file (surrounding whitespace ignored; empty refused)."""
    data = _read(path, "token file")
    assert data is not None
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"token file {path} must hold one token of printable ASCII characters") from None
    if any(c.isspace() for c in token) or not token.isprintable():
        raise ConfigError(f"token file {path} must hold one token without spaces")
    return token


def read_tokens(token_file: str | Path | None, coordinator_token_file: str | Path | None,
                hint: str = "") -> tuple[str | None, str | None]:
    """The devices' and the coordinator's tokens, each named by its flag when refused; the devices' token given
    as the coordinator's is refused too: every device holds it, so it would let any device load, fetch,
    release and sum. ``hint`` ends that refusal (what the caller can do instead)."""
    tokens: list[str | None] = []
    for flag, path in (("--token-file", token_file), ("--coordinator-token-file", coordinator_token_file)):
        try:
            tokens.append(read_token(path) if path else None)
        except ConfigError as e:
            raise ConfigError(f"{flag}: {e}") from None
    token, coordinator = tokens
    if coordinator is not None and coordinator == token:
        raise ConfigError(f"--coordinator-token-file {coordinator_token_file} holds the same token as --token-file "
                          f"{token_file}: every device holds that one; give the coordinator a token of its own{hint}")
    return token, coordinator


def bearer(token: str) -> tuple[str, str]:
    return (AUTH_HEADER, f"Bearer {token}")


def _wrap_abort(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that refuses every call."""

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, details)

    kinds: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses any call without the right bearer token with UNAUTHENTICATED.

    ``token`` is the devices' token; with a ``coordinator`` token the methods in ``control`` (full gRPC
    names: the tier's Load, Fetch, Release, Reduce) need that one, and a caller presenting the devices' token
    there is refused with PERMISSION_DENIED. Every other method takes either token, and none when there is no
    ``token`` (a tier with a coordinator token only: its steps are as open as a tier without tokens)."""

    def __init__(self, token: str | None, on_refuse: Callable[[grpc.StatusCode], None] | None = None, *,
                 coordinator: str | None = None, control: Iterable[str] = ()) -> None:
        if not token and not coordinator:
            raise ConfigError("the bearer token is empty")
        if token and coordinator and hmac.compare_digest(token.encode(), coordinator.encode()):
            raise ConfigError("the coordinator token is the devices' token: every device would hold it")
        self._want = f"Bearer {token}".encode() if token else None
        self._coordinator = f"Bearer {coordinator}".encode() if coordinator else None
        self._control = frozenset(control) if coordinator else frozenset()
        self._on_refuse = on_refuse  # counts refusals where the tier counts its own (its status line)

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(EXEMPT_PREFIXES):
            return handler
        sent = [v.encode() if isinstance(v, str) else bytes(v)
                for k, v in handler_call_details.invocation_metadata or () if k == AUTH_HEADER]
        if len(sent) > 1:  # which one counts would be a proxy's choice, not the caller's
            return self._refused(handler, grpc.StatusCode.UNAUTHENTICATED,
                                 f"{len(sent)} authorization headers: send exactly one bearer token")
        got = sent[0] if sent else None
        # both compared, in constant time, whatever the method
        device = got is not None and self._want is not None and hmac.compare_digest(got, self._want)
        coordinator = got is not None and self._coordinator is not None and hmac.compare_digest(got, self._coordinator)
        if method in self._control:
            if coordinator:
                return handler
            if device:
                name = method.rsplit("/", 1)[-1]
                return self._refused(handler, grpc.StatusCode.PERMISSION_DENIED,
                                     f"{name} needs the coordinator's token (this tier was started with "
                                     "--coordinator-token-file): the devices' token allows steps only")
        elif self._want is None or device or coordinator:
            return handler
        return self._refused(handler, grpc.StatusCode.UNAUTHENTICATED,
                             "missing bearer token (authorization metadata)" if got is None
                             else "invalid bearer token")

    def _refused(self, handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
        if self._on_refuse is not None:
            self._on_refuse(code)
        return _wrap_abort(handler, code, details)
