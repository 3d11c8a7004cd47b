"""One way for the apps to reach a tier server: the gRPC client with the run's TLS and token.

The ServerApp uses it for the control path (load, fetch, release, sum on every
tier), the ClientApp as its device link to the edge. Both pass file paths, so
keys and tokens never travel in Flower messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitfed.errors import ConfigError

if TYPE_CHECKING:
    from splitfed.transport.client import GrpcTierClient


def connect(address: str, *, tls_ca: str = "", tls_cert: str = "", tls_key: str = "", token_file: str = "",
            compress: str = "none", deadline_s: float = 60.0) -> GrpcTierClient:
    """A gRPC tier client; TLS when a CA or certificate is given (mutual with both).

    ``address`` must be HOST:PORT (:func:`~splitfed.transport.client.parse_address`), the TLS files PEM
    of the right kind: bad ones are a ConfigError here, before anything connects.
    """
    from splitfed.transport.address import parse_address
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.security import TlsConfig, read_token

    if not address:
        raise ConfigError("no edge address: the run config (tier-addresses) or the node config "
                          "(edge-address) must name the edge tier")
    parse_address(address, "tier address")
    tls = (TlsConfig(cert=tls_cert or None, key=tls_key or None, ca=tls_ca or None)
           if (tls_ca or tls_cert or tls_key) else None)
    token = read_token(token_file) if token_file else None
    return GrpcTierClient(address, tls=tls, token=token, deadline_s=deadline_s, compress=compress)
