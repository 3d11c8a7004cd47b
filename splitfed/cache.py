"""Where splitfed keeps what it can compute again: measured profiles, the digits split, Dirichlet partitions.

Why: the digits split needs scikit-learn and a Dirichlet partition flwr-datasets (with HF ``datasets``, pyarrow
and pandas behind it); importing them costs seconds in every process that loads a client's data: each Ray
actor of a simulation, and in a deployment each ClientApp process, that is every round on every node. Their
results depend only on their inputs, the libraries' versions and splitfed's code that calls them, so a kept
result is bit for bit what computing it again gives, without those imports.

One folder: ``SPLITFED_CACHE_DIR`` (``~`` and a relative one named from where a run starts: :func:`pin`), else
``$XDG_CACHE_HOME/splitfed``, else ``~/.cache/splitfed`` (``SPLITFED_CACHE_DIR=off``: none), a subfolder per
kind. An entry is named by the digest of everything its value depends on (:func:`entry_key`), replaced
atomically, and checked when read: one missing, damaged or failing its kind's check is computed again and
replaced. A folder that cannot be written is skipped (logged at
debug level): a cache changes what a result costs, never the result.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

import numpy as np

from splitfed.jsonio import write_atomic
from splitfed.versions import versions as versions  # an entry's key names them

log = logging.getLogger(__name__)

ENV = "SPLITFED_CACHE_DIR"
OFF = "off"
Arrays = dict[str, np.ndarray]


def root() -> Path | None:
    """The cache folder (see the module doc); None: no cache (``off``, or no home folder to put it in)."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return None if env.lower() == OFF else folder(env)
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not base or not Path(base).is_absolute():  # the XDG spec: a relative one is to be ignored
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no HOME and no password entry (a bare container user)
            return None
    return Path(base) / "splitfed"


PROFILE_ENV = "SPLITFED_PROFILE_CACHE"  # measured profiles' own folder, if set (:mod:`splitfed.profile.profiler`)


def pin() -> None:
    """Spell a relative or ``~`` cache folder (``SPLITFED_CACHE_DIR``, ``SPLITFED_PROFILE_CACHE``) as the folder
    it names here, in this process's environment: the processes a run starts inherit it (Ray actors, tier
    processes) and may work in another folder, where the same words would name another cache."""
    for name in (ENV, PROFILE_ENV):
        env = os.environ.get(name, "").strip()
        if env and env.lower() != OFF:
            os.environ[name] = str(folder(env))


def folder(text: str) -> Path:
    """``text`` as an absolute folder: ``~`` expanded, a relative one taken from the working folder."""
    try:
        return Path(text).expanduser().absolute()
    except RuntimeError:  # ``~`` with no home to expand it to: taken as the name it is
        return Path(text).absolute()


def source_digest(*modules: ModuleType) -> str:
    """sha256 of the modules' source files: an edit to the code that computes an entry makes a new key."""
    h = hashlib.sha256()
    for m in modules:
        h.update(Path(m.__file__ or "").read_bytes())
    return h.hexdigest()


def entry_key(**parts: object) -> str:
    """The name of the entry that ``parts`` (JSON values: inputs, versions, digests) fully determine."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def load(kind: str, key: str, check: Callable[[Arrays], bool]) -> Arrays | None:
    """The arrays kept under ``key``, or None (absent, unreadable, or refused by ``check``: computed again)."""
    path = _path(kind, key)
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
        log.debug("cache entry %s is unreadable (%s: %s); computing it again", path, type(e).__name__, e)
        return None
    try:
        ok = check(arrays)
    except (ValueError, TypeError, IndexError) as e:  # a check that cannot even look: as failed
        log.debug("cache entry %s fails its check (%s: %s)", path, type(e).__name__, e)
        ok = False
    if not ok:
        log.debug("cache entry %s fails its check; computing it again", path)
        return None
    return arrays


def store(kind: str, key: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Keep ``arrays`` under ``key``, replacing any entry there; a cache that cannot be written is skipped."""
    path = _path(kind, key)
    if path is None:
        return
    buf = io.BytesIO()
    np.savez_compressed(buf, **dict(arrays))  # type: ignore[arg-type]  # (numpy's stub: a name could be a flag)
    try:
        write_atomic(path, buf.getvalue())
    except OSError as e:
        log.debug("cache %s cannot be written (%s: %s); not kept", path.parent, type(e).__name__, e)


def kept(kind: str, key: str, check: Callable[[Arrays], bool], compute: Callable[[], Mapping[str, np.ndarray]]
         ) -> Arrays:
    """The arrays kept under ``key`` (:func:`load`), else ``compute()``'s, kept (:func:`store`) and returned."""
    arrays = load(kind, key, check)
    if arrays is None:
        arrays = dict(compute())
        store(kind, key, arrays)
    return arrays


def _path(kind: str, key: str) -> Path | None:
    base = root()
    return None if base is None else base / kind / f"{key}.npz"
