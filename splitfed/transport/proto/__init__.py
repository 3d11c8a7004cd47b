"""Generated protobuf/gRPC code lives below (built from proto/ by splitfed.transport.protogen; never committed)."""
