"""Bytes as people read them: one spelling for every message, table and status line."""

from __future__ import annotations

import math

MIB = 2**20  # the unit of memory_mb in fleet files and of the tiers' --max-*-mb


def mib_text(nbytes: float) -> str:
    """Bytes for a message, in the fleet file's unit (MiB) to 3 significant figures, so a refusal reads
    against ``memory_mb`` (``.1f`` showed 0.005 MiB as "0.0 MiB" and 0.25 MiB as "0.2 MiB"); under a KiB,
    in bytes."""
    if not math.isfinite(nbytes):
        return f"{nbytes} bytes"
    if abs(nbytes) < 1024:  # from 100 up, whole bytes: .3g made "1e+03 bytes" of 1000
        return f"{nbytes:.0f} bytes" if abs(nbytes) >= 100 else f"{nbytes:.3g} bytes"
    v = nbytes / MIB
    return f"{v:,.0f} MiB" if abs(v) >= 999.5 else f"{v:.3g} MiB"
