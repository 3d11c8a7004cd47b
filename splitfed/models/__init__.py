"""Models: the zoo, user factories, and cutting a model into blocks and segments."""

from splitfed.models.blocks import to_blocks
from splitfed.models.segment import Blocks, make_segment, segment_bounds, validate_cuts
from splitfed.models.zoo import ModelSpec, build, resolve_spec

__all__ = [
    "Blocks",
    "ModelSpec",
    "build",
    "make_segment",
    "resolve_spec",
    "segment_bounds",
    "to_blocks",
    "validate_cuts",
]
