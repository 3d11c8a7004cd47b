"""gRPC status codes <-> splitfed's :class:`~splitfed.errors.TierError` classes.

The tier raises ``TierError`` subclasses whose ``code`` names a gRPC status;
the server sends that status with the error's message, and the client raises
the matching class again, so an error keeps its kind across any number of hops.
A status the tier sends itself carries :data:`SENT_BY_TIER` in its trailing
metadata: the client then knows it is the tier's word (its own refusal, or one
its next tier gave it), not what gRPC says of this side's connection.
"""

from __future__ import annotations

import grpc

from splitfed.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TierError,
    Unavailable,
)

SENT_BY_TIER = ("splitfed-sent-by-tier", "1")
"""Trailing metadata of every status a tier's handler sends (not gRPC's own, nor the token check's)."""

IDLE_CANCELLED = "idle stream cancelled by tier "
"""How the details of a stream a tier cancelled for making no progress begin (RESOURCE_EXHAUSTED): its mark of
the tier's word, since gRPC's cancel of a call carries a status and details only, no trailing metadata."""


def sent_by_tier(e: grpc.RpcError) -> bool:
    """Whether a failed call's status came from the tier, not from gRPC or the network: its handler's (marked
    :data:`SENT_BY_TIER`) or its cancel of an idle stream (details from :data:`IDLE_CANCELLED`)."""
    try:
        if SENT_BY_TIER in tuple(e.trailing_metadata() or ()):
            return True
    except Exception:  # noqa: BLE001 - an error without trailing metadata: not the handler's
        pass
    try:
        return str(e.details() or "").startswith(IDLE_CANCELLED)
    except Exception:  # noqa: BLE001 - an error without details: not the tier's
        return False


class TlsRefused(Unavailable):
    """UNAVAILABLE because the TLS handshake was refused (not the network): a configuration to fix, not
    a tier to wait for."""


class DeadlineExceeded(TierError):
    code = "DEADLINE_EXCEEDED"


class Unauthenticated(TierError):
    code = "UNAUTHENTICATED"


class RpcFailed(TierError):
    """Any other status (INTERNAL, UNIMPLEMENTED, CANCELLED, ...): ``code`` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


ERRORS: dict[str, type[TierError]] = {
    c.code: c
    for c in (NotFound, InvalidArgument, FailedPrecondition, ResourceExhausted, Unavailable,
              DeadlineExceeded, Unauthenticated, PermissionDenied)
}


def status_of(e: TierError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, e.code, grpc.StatusCode.INTERNAL)


def error_of(code: grpc.StatusCode, message: str) -> TierError:
    """The exception a client raises for a status."""
    name = code.name
    cls = ERRORS.get(name)
    return cls(message) if cls is not None else RpcFailed(name, message)
