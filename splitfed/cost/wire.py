"""What one message of a boundary tensor costs on the wire, for each codec: exactly the bytes the transport
sends (:func:`splitfed.transport.codec.payload_size`, whose rules are read off it, not written again here).

A run's ``compress`` names one codec for every link or one per link (:func:`link_codecs`); the cost model
prices each link's messages with its codec (:func:`wire_bytes`).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from splitfed.errors import ConfigError

WireCodec = tuple[str, float]  # (kind, top-k fraction)


def parse_codec(name: object) -> WireCodec:
    """``none`` | ``fp16`` | ``int8`` | ``topk:F`` -> (kind, fraction), validated by the transport's own parser."""
    if name is None or (isinstance(name, str) and name.strip().lower() in ("", "none")):
        return ("none", 1.0)
    from splitfed.transport.codec import (
        Codec,  # lazy: the transport package generates protobuf code on import
    )

    c = Codec.parse(name)  # type: ignore[arg-type]
    return (c.kind, c.fraction)


def link_codecs(compress: object, links: int, what: str = "compress") -> tuple[str, ...]:
    """A run's ``compress``, one codec per link in chain order (device -> edge first): ``CODEC`` for every
    link, or ``C1,C2,...`` one per link (compress only the WAN link: ``none,int8``); names normalised.
    ``what`` names the setting or flag in a refusal."""
    parts = ([p.strip() for p in compress.split(",")] if isinstance(compress, str)
             else ["none"] if compress is None else [str(p).strip() for p in compress])  # type: ignore[attr-defined]
    shown = ",".join(parts)
    if len(parts) > 1 and not all(parts):  # "int8," would leave a link uncompressed that was meant not to be
        raise ConfigError(f"{what} {shown!r}: codec {parts.index('') + 1} of {len(parts)} is empty")
    if len(parts) == 1:
        parts *= links
    if len(parts) != links:
        give = "one codec" if links == 1 else f"one codec for every link, or {links}, one per link (the device's first)"
        raise ConfigError(f"{what} {shown!r}: {links + 1} tiers have {links} link(s): give {give}")
    try:
        return tuple(codec_name(parse_codec(p)) for p in parts)
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from None


def codec_name(c: WireCodec) -> str:
    """The transport's own spelling (``:g`` rounded ``topk:0.1000004`` to the 0.1 the cost model then priced)."""
    if c[0] != "topk":
        return c[0]
    from splitfed.transport.codec import Codec

    return Codec("topk", c[1]).name


def wire_bytes(codec: WireCodec | str, per_sample: np.ndarray | float, samples: int,
               floating: np.ndarray | bool = True, itemsize: np.ndarray | float = 4.0) -> np.ndarray:
    """Bytes one message carries for a boundary tensor of ``samples`` x ``per_sample`` bytes whose values
    are ``itemsize`` bytes each (its dtype's; 0 or ``floating`` False: not floating, e.g. token ids, which
    every codec sends as they are): exactly :func:`splitfed.transport.codec.payload_size`, whose rules
    :func:`codec_rules` reads off. Arrays broadcast (one entry per boundary); the default is float32."""
    kind, f = parse_codec(codec) if isinstance(codec, str) else codec
    if samples == 0 or kind == "none":
        return np.asarray(per_sample, dtype=float) * samples
    head_of, value_of, known = _codec_tables(kind)
    if isinstance(per_sample, float | int) and isinstance(itemsize, float | int) and isinstance(floating, bool):
        one = float(per_sample) * samples  # one message: plain floats (the option tables pass arrays)
        width = int(itemsize)
        if not floating or width == 0:
            return np.asarray(one)
        if width != itemsize or not 0 < width < len(known) or not known[width]:
            raise ConfigError(f"codec {kind}: no floating dtype the wire carries has values of {itemsize:g} bytes")
        values = one / width
        if kind == "topk":  # codec.topk_count
            from splitfed.transport.codec import topk_counts  # lazy, as in parse_codec

            values = float(topk_counts(values, f))
        return np.asarray(float(head_of[width]) + values * float(value_of[width]))
    raw = np.asarray(per_sample, dtype=float) * samples
    size = np.asarray(itemsize, dtype=float)
    whole = size.astype(np.int64)
    fl = np.asarray(floating, dtype=bool) & (whole > 0)
    ok = (whole == size) & (whole >= 0) & (whole < len(known))
    if not np.all(~fl | (ok & known[np.where(ok, whole, 0)])):
        bad = sorted({float(v) for v in np.broadcast_to(size, np.broadcast(size, fl).shape)[
            np.broadcast_to(fl, np.broadcast(size, fl).shape)]} - {float(i) for i in np.flatnonzero(known)})
        raise ConfigError(f"codec {kind}: no floating dtype the wire carries has values of "
                          f"{', '.join(f'{b:g}' for b in bad)} bytes")
    idx = np.where(fl & ok, whole, 0)
    n = raw / np.where(fl, size, 1.0)
    if kind == "topk":  # codec.topk_count, on arrays
        from splitfed.transport.codec import topk_counts

        n = topk_counts(n, f)
    return np.where(fl, head_of[idx] + n * value_of[idx], raw)


@cache
def _codec_tables(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`codec_rules` as lookup tables by element size (header, bytes per value, known) for
    :func:`wire_bytes`, which prices every option of every client."""
    rules = codec_rules(kind)
    top = int(max(rules)) + 1
    head, value, known = np.zeros(top), np.zeros(top), np.zeros(top, dtype=bool)
    for size, (h, v) in rules.items():
        head[int(size)], value[int(size)], known[int(size)] = h, v, True
    return head, value, known


@cache
def codec_rules(kind: str) -> dict[float, tuple[float, float]]:
    """For codec ``kind``, per element size of the floating dtypes the wire carries: (header bytes, bytes per
    value sent) of a message, read off :func:`splitfed.transport.codec.payload_size` (top-k sends the values
    it keeps, :func:`~splitfed.transport.codec.topk_count`); a message of n values is header + n x per value.
    Dtypes of one size must agree (float16 and bfloat16), or pricing by size would be wrong: an error."""
    from splitfed.transport.codec import DTYPES, Codec, payload_size

    c = Codec(kind)  # top-k at fraction 1 keeps every value: payload_size's n values are n values sent
    rules: dict[float, tuple[float, float]] = {}
    for d in DTYPES.values():
        if not d.is_floating_point:
            continue
        head = payload_size(d, (0,), c)
        rule = (float(head), float(payload_size(d, (1,), c) - head))
        if payload_size(d, (3,), c) != head + 3 * rule[1] or rules.setdefault(float(d.itemsize), rule) != rule:
            raise AssertionError(f"codec {kind}: payload_size is not header + n x per value by element size")
    return rules
