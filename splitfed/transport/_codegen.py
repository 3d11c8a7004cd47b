"""The code generator behind ``python -m splitfed.transport.protogen`` (apart from it so
that running that module does not import itself twice): protoc via grpcio-tools, a
stamp with the sources' digest, and a file lock for processes that start together."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
OUT_ROOT = PACKAGE_DIR / "proto"  # the Python package splitfed.transport.proto
GEN_DIR = OUT_ROOT / "splitfed"  # generated: mirrors proto/splitfed/
STAMP = GEN_DIR / "STAMP.json"
PROTO_ROOT = PACKAGE_DIR.parents[1] / "proto"  # the repository's proto/ (absent in a wheel)
IMPORT_PREFIX = "splitfed.transport.proto."

_thread_lock = threading.Lock()


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(root.rglob("*.proto"))


def _tools_version() -> str:
    try:
        from importlib.metadata import version

        return version("grpcio-tools")
    except Exception:  # noqa: BLE001 - not installed
        return "missing"


def source_digest(root: Path = PROTO_ROOT) -> str:
    """sha256 over the .proto files (paths and contents) and the generator's version."""
    h = hashlib.sha256(f"grpcio-tools {_tools_version()}\n".encode())
    for f in proto_files(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def stale_reason(root: Path = PROTO_ROOT, out: Path = OUT_ROOT) -> str | None:
    """Why the generated code must be (re)generated, or None when it is current."""
    stamp = out / "splitfed" / "STAMP.json"
    if not root.is_dir():  # an installed package: use the code it was built with
        built = any((out / "splitfed").rglob("*_pb2.py")) if (out / "splitfed").is_dir() else False
        return None if built else f"no generated code and no proto sources at {root}"
    if not stamp.exists():
        return "generated code is missing"
    try:
        recorded = json.loads(stamp.read_text())["digest"]
    except (OSError, ValueError, KeyError):
        return "STAMP.json is unreadable"
    if recorded != source_digest(root):
        return "the .proto sources or grpcio-tools changed since the code was generated"
    return None


@contextlib.contextmanager
def _file_lock(out: Path) -> Iterator[None]:
    """An exclusive lock shared by all processes generating into ``out`` (kept outside the tree)."""
    tag = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"splitfed-protogen-{tag}.lock"
    with _thread_lock, open(path, "a+") as f:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - non-POSIX: the thread lock only
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _fix_imports(path: Path) -> None:
    """protoc writes ``from splitfed.v1 import x``; our package lives under splitfed.transport.proto."""
    text = path.read_text()
    fixed = re.sub(r"^(\s*)(from|import) splitfed\.", rf"\1\2 {IMPORT_PREFIX}splitfed.", text, flags=re.M)
    if fixed != text:
        path.write_text(fixed)


def _run_protoc(root: Path, dest: Path) -> None:
    try:
        from grpc_tools import protoc
    except ImportError:
        raise ImportError(
            "splitfed's gRPC code is missing or stale and grpcio-tools is not installed: "
            "pip install grpcio-tools (or install splitfed with its dev extra)"
        ) from None
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    files = [str(f.relative_to(root)) for f in proto_files(root)]
    if not files:
        raise ImportError(f"no .proto files under {root}")
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{well_known}", f"--python_out={dest}",
            f"--pyi_out={dest}", f"--grpc_python_out={dest}", *files]
    rc = protoc.main(args)
    if rc != 0:
        raise ImportError(f"protoc failed (exit {rc}) on {', '.join(files)}")


def generate(root: Path = PROTO_ROOT, out: Path = OUT_ROOT, force: bool = False) -> bool:
    """Regenerate into ``out/splitfed`` if stale (or ``force``); returns whether it generated."""
    with _file_lock(out):
        if not force and stale_reason(root, out) is None:
            return False
        if not root.is_dir():
            raise ImportError(f"cannot generate: no proto sources at {root}")
        digest = source_digest(root)
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out))
        try:
            _run_protoc(root, tmp)
            gen = tmp / "splitfed"
            for d in [gen, *[p for p in gen.rglob("*") if p.is_dir()]]:
                (d / "__init__.py").touch()
            for f in gen.rglob("*.py*"):
                _fix_imports(f)
            (gen / "STAMP.json").write_text(json.dumps(
                {"digest": digest, "grpcio_tools": _tools_version(),
                 "sources": [f.relative_to(root).as_posix() for f in proto_files(root)]}, indent=1) + "\n")
            final = out / "splitfed"
            old = out / f".old-{os.getpid()}-{threading.get_ident()}"
            if final.exists():
                final.rename(old)
            gen.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True


_checked = False
regenerated_at_import: str | None = None  # why ensure() regenerated the code in this process (None: it did not)


def ensure() -> None:
    """Make sure the generated code exists and matches proto/ (once per process)."""
    global _checked, regenerated_at_import
    if _checked:
        return
    reason = stale_reason()
    if reason is not None and generate():
        regenerated_at_import = reason
    _checked = True
