"""A wheel or an sdist built from a clean checkout is a working install: the gRPC code is build output (git
ignores it), so a wheel built from a fresh clone carried neither it nor ``proto/``, and importing
:mod:`splitfed.transport` from that install failed ("cannot generate: no proto sources"). The builds here run
without build isolation (no index needed: this environment's setuptools and grpcio-tools build them)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ("tier_pb2.py", "tier_pb2_grpc.py", "STAMP.json")


def _clean_checkout(dest: Path) -> Path:
    """The files git tracks or would (not those it ignores): as a fresh clone has them, without generated code."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes((ROOT / name).read_bytes())
    assert not (dest / "splitfed" / "transport" / "proto" / "splitfed").exists()
    return dest


def _wheel(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def _generated_in(names: list[str]) -> set[str]:
    return {n.rpartition("/")[2] for n in names if n.startswith("splitfed/transport/proto/splitfed/")}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A clean checkout and the wheel built from it."""
    base = tmp_path_factory.mktemp("packaging")
    src = _clean_checkout(base / "src")
    done = _wheel(src, base / "wheel")
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (base / "wheel").glob("splitfed-*.whl")
    return src, wheel


def test_a_wheel_from_a_clean_checkout_carries_the_generated_code_and_imports_it(built, tmp_path: Path) -> None:
    src, wheel = built
    assert set(GENERATED) <= _generated_in(_names(wheel))
    assert not (src / "splitfed" / "transport" / "proto" / "splitfed").exists()  # generated into the build only
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = ("import splitfed, splitfed.transport\n"
             "from splitfed.transport.pb import SERVICE, pb\n"
             "from splitfed.transport.proto.splitfed.v1 import tier_pb2_grpc\n"
             "print(splitfed.__file__); print(tier_pb2_grpc.__file__); print(SERVICE)\n")
    # from a folder outside the checkout, the installed copy first on the path (as site-packages would be)
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(target)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    where = ran.stdout.splitlines()
    assert all(line.startswith(str(target)) for line in where[:2]), where
    check = subprocess.run([sys.executable, "-m", "splitfed.transport.protogen", "--check"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(target)})
    assert check.returncode == 0 and "current" in check.stdout, check.stdout + check.stderr


def test_an_sdist_carries_the_proto_sources_and_its_wheel_the_generated_code(built, tmp_path: Path) -> None:
    src, _ = built
    made = subprocess.run([sys.executable, "-c", "import sys, setuptools.build_meta as b; "
                           "print(b.build_sdist(sys.argv[1]))", str(tmp_path / "sdist")],
                          cwd=src, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(src)})
    assert made.returncode == 0, made.stderr[-3000:]
    (sdist,) = (tmp_path / "sdist").glob("splitfed-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = t.getnames()
        t.extractall(tmp_path / "unpacked", filter="data")
    assert "splitfed-0.1.0/proto/splitfed/v1/tier.proto" in names
    done = _wheel(tmp_path / "unpacked" / "splitfed-0.1.0", tmp_path / "wheel")
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("splitfed-*.whl")
    assert set(GENERATED) <= _generated_in(_names(wheel))


def test_a_wheel_build_without_proto_sources_fails_naming_the_folder(built, tmp_path: Path) -> None:
    src, _ = built
    bare = _clean_checkout(tmp_path / "src")
    for f in sorted((bare / "proto").rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    (bare / "proto").rmdir()
    done = _wheel(bare, tmp_path / "wheel")
    assert done.returncode != 0 and f"no proto sources at {bare / 'proto'}" in done.stderr, done.stderr[-3000:]
    assert not list((tmp_path / "wheel").glob("*.whl"))

