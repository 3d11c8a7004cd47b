"""gRPC status codes <-> splitfed's :class:`~splitfed.errors.TierError` classes.

The tier raises ``TierError`` subclasses whose ``code`` names a gRPC status;
the server sends that status with the error's message, and the client raises
the matching class again, so an error keeps its kind across any number of hops.
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
