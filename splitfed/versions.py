"""Installed versions, read from the packages' metadata (nothing imported): what keys a cache entry
(:mod:`splitfed.cache`), and what ``splitfed --version`` shows for a bug report."""

from __future__ import annotations

import platform
from importlib import metadata

import splitfed

RUNS_ON = ("torch", "flwr", "ray", "grpcio", "protobuf", "numpy")  # what a run's behaviour depends on


def versions(*dists: str) -> dict[str, str]:
    """Installed versions of ``dists``; "" for one not installed."""
    out = {}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = ""
    return out


def version_text() -> str:
    """``splitfed --version``: its own version and those of what it runs on, as a bug report needs them."""
    deps = ", ".join(f"{d} {v or 'not installed'}" for d, v in versions(*RUNS_ON).items())
    return f"splitfed {splitfed.__version__} (Python {platform.python_version()}; {deps})"
