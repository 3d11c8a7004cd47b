"""A :class:`~splitfed.engine.rounds.Chain` whose tiers are gRPC services (already running)."""

from __future__ import annotations

from typing import Any

from splitfed.engine.rounds import Chain
from splitfed.errors import ConfigError
from splitfed.transport.client import GrpcTierClient


def grpc_chain(addresses: list[str], **client_kwargs: Any) -> Chain:
    """One control client per tier, in chain order; the device's link is the first tier's client.

    Each tier must have been started with the next address as its ``next``
    (``splitfed tier --next``): the device talks to the first tier only, the
    orchestrator loads and fetches every tier directly.
    """
    if not addresses:
        raise ConfigError("a gRPC chain needs at least one tier address")
    clients: list[GrpcTierClient] = []
    try:
        for a in addresses:
            clients.append(GrpcTierClient(a, **client_kwargs))
    except BaseException:  # a bad later address: the channels already open are closed, not left to the collector
        for c in clients:
            c.close()
        raise
    return Chain(list(clients), clients[0])


def close_chain(chain: Chain) -> None:
    """Close the channels of a chain built by :func:`grpc_chain`."""
    for t in chain.tiers:
        close = getattr(t, "close", None)
        if close is not None:
            close()
