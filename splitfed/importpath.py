"""What a child process needs on its PYTHONPATH to import what this process can.

A user may make their model's module importable by changing ``sys.path`` at run
time (a notebook, a script that inserts its folder); the processes splitfed
starts (tier servers, Ray's workers) start from the environment, not from this
process's ``sys.path``, so they are given it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def child_pythonpath(env: Mapping[str, str] | None = None) -> str:
    """This process's import path (``''`` as the working directory it stands for; a ``Path`` as its text; an
    entry import skips, such as bytes, skipped), then the environment's own PYTHONPATH (``env``, default
    ``os.environ``), without repeats."""
    env = os.environ if env is None else env
    seen: list[str] = []
    here = [os.fspath(p) or os.getcwd() for p in sys.path if isinstance(p, str | os.PathLike)]
    for p in [*here, *env.get("PYTHONPATH", "").split(os.pathsep)]:
        if p and p not in seen:
            seen.append(p)
    return os.pathsep.join(seen)
