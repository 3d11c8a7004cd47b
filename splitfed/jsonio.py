"""Strict JSON from every writer of results: what jq, browsers and pandas read.

Python's ``json`` writes NaN and Infinity, which are not JSON: one diverged loss
or a ratio over a zero time made a whole results file unreadable to them. Here
every non-finite number becomes ``null``, and files are replaced atomically, so a
reader never sees half of one.
"""

from __future__ import annotations

import errno
import json
import math
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def strict(x: Any) -> Any:
    """``x`` with every NaN or infinite float (nested in dicts, lists, tuples) replaced by None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict(v) for v in x]
    return x


def dumps(obj: Any, *, default: Callable[[Any], Any] | None = None, **kw: Any) -> str:
    """``json.dumps`` that never writes NaN or Infinity (``default`` may make numpy scalars floats first)."""
    if default is not None:
        obj = json.loads(json.dumps(obj, default=default))  # e.g. dataclasses and numpy scalars to plain values
    return json.dumps(strict(obj), allow_nan=False, **kw)


def sync_folder(folder: str | Path) -> None:
    """Make what ``folder`` names durable (files made, replaced or removed there): fsync the folder itself.
    A file's own fsync covers its bytes, not its name: after a power loss the folder may name the old file."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a file system that cannot sync a folder (some FUSE and network mounts): done as it may
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def draft_of(path: str | Path) -> Path:
    """Where ``path``'s next version is written before it replaces it: beside it, hidden, this thread's (two
    threads of one process writing one path at once each write their own, and the last replace wins whole)."""
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}-{threading.get_ident()}.tmp")


def drafted_for(name: str) -> str:
    """The file name a draft of this process (:func:`draft_of`) is for; any other name as it is. An error
    raised while writing a draft names the draft: a user is told of the file they know."""
    stem, dot, tail = name.rpartition(f".{os.getpid()}-")
    thread = tail.removesuffix(".tmp")
    if dot and stem.startswith(".") and len(stem) > 1 and tail.endswith(".tmp") and thread.isdigit():
        return stem[1:]
    return name


def is_draft(name: str) -> bool:
    """Whether ``name`` is a draft's (:func:`draft_of`) of any process: one being written, or one a killed
    writer left, which is no one's file."""
    stem, _, tail = name.rpartition(".")
    head, dot, ids = stem.rpartition(".")
    pid, dash, thread = ids.partition("-")
    return (tail == "tmp" and bool(dot) and head.startswith(".") and len(head) > 1 and bool(dash)
            and pid.isdigit() and thread.isdigit())


def write_draft(path: str | Path, text: str | bytes) -> Path:
    """``text`` (or bytes) written and fsynced to ``path``'s draft (:func:`draft_of`), not yet in its place."""
    tmp = draft_of(path)
    with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def write_atomic(path: str | Path, text: str | bytes) -> Path:
    """Replace ``path`` with ``text`` (or bytes) in one step (a crash leaves the old file or the new, never half), and
    durably (the file's bytes and its name in the folder are fsynced)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = draft_of(p)
    try:
        write_draft(p, text)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(p.parent)
    return p


def write_json(path: str | Path, obj: Any, **kw: Any) -> Path:
    """``obj`` as strict JSON (indented by 2 unless told otherwise), atomically."""
    kw.setdefault("indent", 2)
    return write_atomic(path, dumps(obj, **kw) + "\n")
