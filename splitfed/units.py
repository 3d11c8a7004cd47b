"""Bytes as people read them: one spelling for every message, table and status line."""

from __future__ import annotations

import math

MIB = 2**20  # the unit of memory_mb in fleet files and of the tiers' --max-*-mb


def _text(nbytes: float, extra: int) -> str:
    """``mib_text`` with ``extra`` more digits (decimals where it prints whole units)."""
    if not math.isfinite(nbytes):
        return f"{nbytes} bytes"
    if abs(nbytes) < 1024:  # from 100 up, whole bytes: .3g made "1e+03 bytes" of 1000
        return f"{nbytes:.{extra}f} bytes" if abs(nbytes) >= 100 else f"{nbytes:.{3 + extra}g} bytes"
    v = nbytes / MIB
    return f"{v:,.{extra}f} MiB" if abs(v) >= 999.5 else f"{v:.{3 + extra}g} MiB"


def mib_text(nbytes: float) -> str:
    """Bytes for a message, in the fleet file's unit (MiB) to 3 significant figures, so a refusal reads
    against ``memory_mb`` (``.1f`` showed 0.005 MiB as "0.0 MiB" and 0.25 MiB as "0.2 MiB"); under a KiB,
    in bytes."""
    return _text(nbytes, 0)


def mib_pair(need: float, have: float) -> tuple[str, str]:
    """A need and a capacity printed side by side, as ``mib_text`` but with as many more digits as it takes
    for two amounts that differ to read apart (3 figures made "they need 0.26 MiB of its 0.26 MiB")."""
    for extra in range(18):  # 17 significant figures tell any two doubles apart
        texts = _text(need, extra), _text(have, extra)
        if texts[0] != texts[1] or need == have:
            return texts
    return f"{need!r} bytes", f"{have!r} bytes"
