"""A benchmark script (``benchmarks/NAME.py``) as a module, to call its ``main`` or its parts in the test
process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, as_name: str = "") -> ModuleType:
    """A fresh module of ``benchmarks/NAME.py`` on each call, under a name of its own (``_benchmark_NAME``, or
    ``as_name``): "engine", "optimizer" and "simulation" are also names of splitfed's packages."""
    spec = importlib.util.spec_from_file_location(as_name or f"_benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
