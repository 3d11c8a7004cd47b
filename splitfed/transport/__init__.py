"""The gRPC transport: tier servers, the gRPC link, the tensor codec, link compression, security.

Importing this package generates the protobuf code from ``proto/`` when it is
missing or stale (see :mod:`splitfed.transport.protogen`).
"""

from splitfed.transport import _codegen

_codegen.ensure()
