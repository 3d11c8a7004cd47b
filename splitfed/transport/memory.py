"""Keep freed buffers mapped in processes that move large tensors every step.

By default glibc gives freed memory back to the OS (trimming the heap, and
serving every allocation above a moving threshold with a fresh ``mmap``), so
each step's new message and tensor buffers fault their pages in again; on VMs
that costs more than copying the bytes. Serving large allocations from the
heap and not trimming it lets a tier reuse the same memory step after step:
resident memory stays at its peak instead of shrinking between steps. Tier processes do this unless told not to
(``splitfed tier --no-malloc-tuning``); a device process may call it too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
MAX_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit


def keep_freed_memory(mmap_threshold: int = MAX_MMAP_THRESHOLD, trim_threshold: int = 1 << 30,
                      heap_only: bool = True) -> bool:
    """Tune glibc's malloc (no-op elsewhere); returns whether it applied.

    ``heap_only``: no ``mmap`` for single allocations at all (tensors of 32 MiB
    and more would otherwise still get fresh pages every step).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, min(mmap_threshold, MAX_MMAP_THRESHOLD))
    ok &= mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    if heap_only:
        ok &= mallopt(_M_MMAP_MAX, 0)
    return bool(ok)
