"""The generated message and service modules of ``proto/splitfed/v1/tier.proto``."""

from splitfed.transport import _codegen

_codegen.ensure()

from splitfed.transport.proto.splitfed.v1 import tier_pb2 as pb  # noqa: E402
from splitfed.transport.proto.splitfed.v1 import tier_pb2_grpc as pb_grpc  # noqa: E402

SERVICE = pb.DESCRIPTOR.services_by_name["Tier"].full_name  # "splitfed.v1.Tier"
HEALTH_SERVICE = SERVICE


def method(name: str) -> str:
    """The full path of an RPC, e.g. ``/splitfed.v1.Tier/Step``."""
    return f"/{SERVICE}/{name}"


__all__ = ["pb", "pb_grpc", "SERVICE", "HEALTH_SERVICE", "method"]
