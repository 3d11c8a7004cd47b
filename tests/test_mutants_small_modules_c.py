"""Behaviour of four small modules that a mutation run found unpinned: a child process's PYTHONPATH (this
process's ``sys.path`` with ``''`` as the working directory and a ``Path`` as its text, bytes skipped, then the
environment's PYTHONPATH, each entry once and no empty one); the generator's version that keys the proto
sources' digest (``"missing"`` when grpcio-tools is not installed) and the reason an unreadable STAMP.json
gives; the exact ``splitfed --version`` text, a package not installed included; and which failed calls are the
tier's word (the details of its cancel of an idle stream), an error whose details are None or raise not.

The RpcError cases build small ``grpc.RpcError`` subclasses with ``trailing_metadata()`` and ``details()``:
``grpc.RpcError`` is a plain exception class, and those two methods are all ``sent_by_tier`` asks of a call.
tests/test_transport_carried.py checks a real cancel of a real tier on 127.0.0.1."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import grpc
import pytest

import splitfed
from splitfed.importpath import child_pythonpath
from splitfed.transport import _codegen
from splitfed.transport._codegen import source_digest, stale_reason
from splitfed.transport.errors import IDLE_CANCELLED, SENT_BY_TIER, sent_by_tier
from splitfed.versions import RUNS_ON, version_text

# ---------------------------------------------------------------- a child process's PYTHONPATH


def test_the_child_path_is_sys_path_then_the_environments_each_once_and_none_empty(monkeypatch) -> None:
    """'' stands for the working directory; a Path is its text; bytes are skipped; a repeat (within sys.path,
    within PYTHONPATH, or across the two) is kept at its first place; PYTHONPATH's empty pieces are dropped."""
    cwd = os.getcwd()
    monkeypatch.setattr(sys, "path", ["/a", "", Path("/p"), b"/bytes", "/a", "/b"])
    env = {"PYTHONPATH": os.pathsep.join(["", "/c", "/b", "", "/c", cwd, "/d", ""])}
    assert child_pythonpath(env) == os.pathsep.join(["/a", cwd, "/p", "/b", "/c", "/d"])


def test_an_environment_without_pythonpath_gives_sys_path_alone(monkeypatch) -> None:
    """No PYTHONPATH (its "" split is one empty piece) adds nothing, not an empty entry at the end."""
    monkeypatch.setattr(sys, "path", ["/x", "/y", "/x"])
    assert child_pythonpath({}) == os.pathsep.join(["/x", "/y"])
    assert child_pythonpath({"PYTHONPATH": ""}) == os.pathsep.join(["/x", "/y"])


def test_the_default_environment_is_this_processs(monkeypatch) -> None:
    monkeypatch.setattr(sys, "path", ["/x"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/e", "/x"]))
    assert child_pythonpath() == os.pathsep.join(["/x", "/e"])


# ---------------------------------------------------------------- the generator's version and an unreadable stamp


def test_the_generators_version_is_grpcio_tools_installed_one(tmp_path: Path) -> None:
    """It keys the digest: a newer grpcio-tools makes the generated code stale."""
    assert _codegen._tools_version() == importlib.metadata.version("grpcio-tools")
    want = hashlib.sha256(f"grpcio-tools {importlib.metadata.version('grpcio-tools')}\n".encode()).hexdigest()
    assert source_digest(tmp_path) == want  # no .proto files: the version alone


def test_without_grpcio_tools_the_generators_version_is_missing(monkeypatch, tmp_path: Path) -> None:
    """An installed package without grpcio-tools: "missing", as text in the digest, not None."""

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert _codegen._tools_version() == "missing"
    assert source_digest(tmp_path) == hashlib.sha256(b"grpcio-tools missing\n").hexdigest()


@pytest.mark.parametrize("stamp", ["not json {", '{"grpcio_tools": "1.0"}', None])
def test_an_unreadable_stamp_makes_the_code_stale_saying_so(tmp_path: Path, stamp: str | None) -> None:
    """Not JSON, no digest in it, or not a file (a folder of that name): the code is regenerated, not taken as
    current (None)."""
    root, out = tmp_path / "proto", tmp_path / "out"
    root.mkdir()
    (root / "a.proto").write_text('syntax = "proto3";\n')
    (out / "splitfed").mkdir(parents=True)
    if stamp is None:
        (out / "splitfed" / "STAMP.json").mkdir()
    else:
        (out / "splitfed" / "STAMP.json").write_text(stamp)
    assert stale_reason(root, out) == "STAMP.json is unreadable"


# ---------------------------------------------------------------- splitfed --version


def test_the_version_text_names_each_package_and_one_not_installed(monkeypatch) -> None:
    """What a bug report needs, in RUNS_ON's order; a package not installed says so rather than an empty
    version."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "ray":
            raise importlib.metadata.PackageNotFoundError(name)
        return {"torch": "9.1", "numpy": "3.0"}.get(name) or real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert RUNS_ON == ("torch", "flwr", "ray", "grpcio", "protobuf", "numpy")
    assert version_text() == (
        f"splitfed {splitfed.__version__} (Python {platform.python_version()}; torch 9.1, "
        f"flwr {real('flwr')}, ray not installed, grpcio {real('grpcio')}, protobuf {real('protobuf')}, numpy 3.0)")


# ---------------------------------------------------------------- whose word a failed call's status is


class _Failed(grpc.RpcError):
    """A failed call as a client sees it: its trailing metadata and details (either may raise: not a call)."""

    def __init__(self, details: object = None, metadata: object = (), raises: tuple[str, ...] = ()) -> None:
        super().__init__()
        self._details, self._metadata, self._raises = details, metadata, raises

    def trailing_metadata(self) -> object:
        if "metadata" in self._raises:
            raise AttributeError("no trailing metadata")
        return self._metadata

    def details(self) -> object:
        if "details" in self._raises:
            raise AttributeError("no details")
        return self._details


IDLE = f"{IDLE_CANCELLED}cloud: Load request stream: it moved 0 bytes in 0 frame(s) in 2.2 s"


@pytest.mark.parametrize(("error", "by_tier"), [
    (_Failed(IDLE), True),  # the tier's cancel of an idle stream: no trailing metadata, its details say so
    (_Failed(IDLE, metadata=None), True),
    (_Failed(IDLE, raises=("metadata",)), True),
    (_Failed("x", metadata=(SENT_BY_TIER,)), True),  # its handler's status
    (_Failed(metadata=(SENT_BY_TIER,), raises=("details",)), True),
    (_Failed("Socket closed"), False),  # gRPC's or the network's
    (_Failed(f"tier edge: {IDLE}"), False),  # the words, not at the start
    (_Failed(None), False),  # no details
    (_Failed(raises=("details",)), False),  # details that raise: not the tier's
    (_Failed(raises=("metadata", "details")), False),
])
def test_a_status_is_the_tiers_when_marked_or_when_it_cancelled_an_idle_stream(error: _Failed,
                                                                                by_tier: bool) -> None:
    """A bool either way (the caller keeps it): the tier's word is not retried as this side's connection."""
    assert sent_by_tier(error) is by_tier
