"""Lossy link compression, as ``Compress`` callables for any link.

``get(name)`` gives the (up, down) pair for ``none`` | ``fp16`` | ``int8`` |
``topk:FRACTION``: ``InProcessLink(tier, *get("int8"))`` simulates exactly what
``GrpcTierClient(addr, compress="int8")`` sends, because both run the same
encoder and decoder of :mod:`splitfed.transport.codec`. Compression is off by
default and never applies to integer tensors (labels, token ids).
"""

from __future__ import annotations

from functools import partial

import torch

from splitfed.engine.link import Compress
from splitfed.transport.codec import Codec, roundtrip

NAMES = ("none", "fp16", "int8", "topk:FRACTION")


def _apply(codec: Codec, t: torch.Tensor) -> tuple[torch.Tensor, int]:
    return roundtrip(t, codec)


def compressor(name: str | Codec) -> Compress | None:
    """One direction's ``Compress`` (None for ``none``)."""
    codec = Codec.parse(name)
    return None if not codec.lossy else partial(_apply, codec)


def get(name: str | Codec) -> tuple[Compress | None, Compress | None]:
    """(activations up, gradients down) for a codec name; both directions use the same codec."""
    c = compressor(name)
    return c, c
