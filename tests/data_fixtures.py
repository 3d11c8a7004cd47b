"""What tests of the data and its cache share: a cache of the test's own, and the IDX files MNIST ships in."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from splitfed import cache


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of the test's own (the run's shared one may already hold every entry)."""
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX: bytes 0, 0, type 0x08 (unsigned byte), the number of dimensions; each dimension a big-endian uint32;
    the data row-major."""
    return (bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
            + array.astype(np.uint8).tobytes())
