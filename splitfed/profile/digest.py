"""Which code a user's model is: the digest a cached profile is keyed by, beside the model's name.

A profile cached by name alone outlived edits to the model (a wider layer, another block, a forward that does
more) and priced the old one. :func:`code_digest` reads the model it builds (on the meta device) and the source
files of the user's code it runs, found by walking the modules it reaches; zoo models are splitfed's own code
and have none.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import inspect
import json
import os
import sys
import types
from functools import lru_cache
from pathlib import Path

import torch

from splitfed.models.zoo import ModelSpec


def code_digest(spec: ModelSpec) -> str:
    """What a user's model is now, beyond its name (empty for a zoo model, which is splitfed's code). A profile
    cached by name alone outlived edits to the model (a wider layer, another block, a forward that does more)
    and priced the old one. The digest holds:

    - the model it builds: its modules and their sizes (built on the meta device: no memory, no draws);
    - the source files of the user's code it runs (:func:`_user_files`): the factory's module, the modules that
      define the classes of its modules, and every module those reach through their globals, transitively (a
      module imported by name, ``import helpers``; or a function or class imported from one, ``from helpers
      import body``), which is where a forward's helper functions live; and every module their files import,
      anywhere in them (an ``import helpers`` inside ``forward`` runs only when the model does, so such a module
      is found by reading the file, imported or not). The walk stops at modules of Python's
      installation (the standard library, site-packages or dist-packages), splitfed's and torch's (their
      versions are not the user's edits; torch's is in the key), so the files are the same whatever else a
      process has imported: a key is stable across processes, and an unrelated module beside the model does
      not change it. Code reached only through an object's attributes, or imported by a name computed at run
      time (``importlib.import_module(name)``), is not reached. A traced model's graph is made of the same
      functions' code, so these files cover it too.

    The files are read on each call (a profile asked for again after an edit in the same process, such as a
    reload, gets a new key); the model is built once per version of them.
    """
    from splitfed.models.zoo import ZOO, _import_factory, build

    if spec.name in ZOO:
        return ""
    factory = _import_factory(spec.name)
    roots = {spec.name.partition(":")[0]}
    if isinstance(getattr(factory, "__module__", None), str):
        roots.add(factory.__module__)
    files = _user_files(roots)
    seen = (json.dumps(spec.to_dict(), sort_keys=True, default=str), id(factory), _file_digest(factory),
            tuple((f, _file_digest(f)) for f in files))
    if seen not in _CODE:  # profile_model asks per call: the build on meta is done once per factory and sources
        with torch.device("meta"):
            model = build(spec)
        h = hashlib.sha1(seen[2].encode())
        h.update(repr(model).encode())
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{t.requires_grad}".encode())
        own = [type(m) for m in model.modules() if _own_source(type(m))]
        _CODE[seen] = (h.hexdigest(), frozenset(c.__module__ for c in own), frozenset(_own_source(c) for c in own))
    structure, modules, class_files = _CODE[seen]
    h = hashlib.sha1(structure.encode())
    for path in sorted({*_user_files(roots | modules), *class_files}):
        h.update(path.encode() + _file_digest(path).encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def _installed_dirs() -> tuple[str, ...]:
    """The folders of Python's installation that hold no user's model code: the standard library and the
    package folders (site-packages, dist-packages), and splitfed's own."""
    import site
    import sysconfig

    dirs = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {sysconfig.get_path(k, vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                         "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix})
             for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs |= {*site.getsitepackages(), site.getusersitepackages()}
    except AttributeError:  # an old virtualenv's site module
        pass
    dirs.add(str(Path(__file__).resolve().parents[1]))  # splitfed
    return tuple(sorted(os.path.realpath(d) + os.sep for d in dirs if d))


_NOT_USERS = {"torch", "splitfed", "builtins"}  # by name: a source checkout of torch is not walked either


def _is_users_file(path: str) -> bool:
    real = os.path.realpath(path)
    parts = Path(real).parts
    return ("site-packages" not in parts and "dist-packages" not in parts
            and not real.startswith(_installed_dirs()))


def _user_files(roots: set[str]) -> list[str]:
    """The source files of the user's modules ``roots`` and of every user's module they reach through their
    globals (a module object, or a function or class by its ``__module__``) or import anywhere in their files,
    sorted: see :func:`code_digest`. A root without a file (a notebook's module) is walked; another module
    without one (built in) is not."""
    todo = [(n, True) for n in sorted(roots)]
    walked: set[str] = set()
    files: set[str] = set()
    while todo:
        name, root = todo.pop()
        if name in walked or name.partition(".")[0] in _NOT_USERS:
            continue
        walked.add(name)
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None) if mod is not None else _locate(name)
        if isinstance(path, str) and path:
            if not _is_users_file(path):
                continue
            files.add(path)
            package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
            todo.extend((n, False) for n in _imports(path, package))
        elif not root:
            continue
        if mod is None:  # found by its file alone: its imports are all there is to follow
            continue
        try:
            values = list(vars(mod).values())
        except TypeError:  # an object in sys.modules without a __dict__
            continue
        for value in values:
            if isinstance(value, types.ModuleType):
                todo.append((value.__name__, False))
            elif isinstance(value, type | types.FunctionType) and isinstance(value.__module__, str):
                todo.append((value.__module__, False))
    return sorted(files)


def _locate(name: str) -> str | None:
    """The source file of module ``name`` as an import would find it, without importing it (nor its
    packages: their code runs nothing here); None if there is none."""
    parts = name.split(".")
    search: list[str] | None = None
    origin: object = None
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        mod = sys.modules.get(full)
        if mod is not None:
            origin = getattr(mod, "__file__", None)
            search = list(getattr(mod, "__path__", None) or [])
        else:
            try:
                spec = importlib.machinery.PathFinder.find_spec(full, search)
            except (ImportError, ValueError, OSError):
                return None
            if spec is None:
                return None
            origin, search = spec.origin, list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not search:  # ``a.b`` where ``a`` is no package: b is a name, not a module
            return None
    return origin if isinstance(origin, str) and origin.endswith(".py") else None


def _imports(path: str, package: str) -> list[str]:
    """The modules the file at ``path`` (of ``package``) imports anywhere in it, by absolute name: for ``from
    a import b``, ``a`` and ``a.b`` (b may be a module); read once per version of the file."""
    key = (path, package, _file_digest(path))
    if key not in _IMPORTS:
        names: list[str] = []
        try:
            tree = ast.parse(Path(path).read_bytes(), path)
        except (OSError, SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    names += [".".join(parts[: i + 1]) for i in range(len(parts))]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".") if package else []
                    if node.level > len(up):  # beyond the top-level package: Python refuses it, nothing to follow
                        continue
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                if base:
                    names.append(base)
                    names += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        _IMPORTS[key] = sorted(set(names))
    return _IMPORTS[key]


_IMPORTS: dict[tuple[str, str, str], list[str]] = {}


def _file_digest(obj: object) -> str:
    """sha1 of the source file that defines ``obj`` (or of the file at the path ``obj``); "" without one (a
    notebook cell, a zip): then the model's structure, and the factory object itself, tell versions apart."""
    try:
        path = obj if isinstance(obj, str) else inspect.getsourcefile(obj)  # type: ignore[arg-type]
        return hashlib.sha1(Path(path or "").read_bytes()).hexdigest() if path else ""
    except (OSError, TypeError):
        return ""


def _own_source(cls: type) -> str:
    """The file of a module class of the user's own (not torch's, whose version is in the key)."""
    if cls.__module__.split(".")[0] == "torch":
        return ""
    try:
        return inspect.getsourcefile(cls) or ""
    except (TypeError, OSError):  # built in, or __main__ without a file (python -c, a REPL, a notebook)
        return ""


# (spec, factory, its file's digest, the user's files and digests) -> (structure digest, the modules and the files
# of the model's own classes)
_CODE: dict[tuple[str, int, str, tuple[tuple[str, str], ...]], tuple[str, frozenset[str], frozenset[str]]] = {}

