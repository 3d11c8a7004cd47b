"""Behaviour of two small modules that a mutation run found unpinned: a cache entry holding a pickled (object)
array is refused and computed again, never unpickled (a cache folder may be shared or written by someone else,
and unpickling runs code); and the proto generator's lock file name (the out folder's sha256, 16 hex digits),
``generate`` saying exactly whether it generated (``False`` when current, ``True`` after generating into a
nested out folder not made yet), the error of a failed protoc not hidden by the clean-up of its scratch folder,
and ``ensure`` generating only stale code, and checking once per process.

The generator tests use copies of proto/ and out folders under ``tmp_path``, never the real generated tree; one
runs grpc_tools.protoc (a couple of seconds), the others stand protoc in. ``ensure`` is run with the module's
``stale_reason`` and ``generate`` stood in, and its ``_checked`` restored by ``monkeypatch``."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from splitfed import cache
from splitfed.transport import _codegen
from splitfed.transport._codegen import PROTO_ROOT, generate, stale_reason
from tests.data_fixtures import own_cache  # noqa: F401 (a fixture: a splitfed cache of the test's own)

# ---------------------------------------------------------------- a pickled cache entry is never unpickled


def _leave_trace(marker: str) -> str:
    """What unpickling a :class:`_Payload` runs: it writes ``marker``, so a test sees whether it ran."""
    Path(marker).write_text("unpickled")
    return "ran"


class _Payload:
    """An object whose unpickling runs :func:`_leave_trace` (as a hostile entry's would run anything)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _leave_trace, (str(self.marker),)


def test_a_cache_entry_holding_a_pickled_array_is_refused_never_unpickled(own_cache: Path,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    """A real .npz with an object array where the entry would be: ``load`` refuses it (None) without running
    the pickle, and ``kept`` computes the value again and replaces the entry with plain arrays."""
    marker = tmp_path / "unpickled.txt"
    entry = own_cache / "k" / "e1.npz"
    entry.parent.mkdir(parents=True)
    np.savez(entry, x=np.array([_Payload(marker)], dtype=object))  # numpy pickles an object array
    assert entry.exists()
    assert cache.load("k", "e1", lambda arrays: True) is None
    assert not marker.exists()  # the pickle never ran
    got = cache.kept("k", "e1", lambda arrays: True, lambda: {"x": np.arange(3)})
    assert not marker.exists()
    assert np.array_equal(got["x"], np.arange(3))
    again = cache.load("k", "e1", lambda arrays: True)  # replaced: the computed arrays, read without pickle
    assert again is not None and np.array_equal(again["x"], np.arange(3))


# ---------------------------------------------------------------- the generator


def _built(out: Path) -> Path:
    """``out`` with generated code in it (a ``*_pb2.py``): what an installed package without proto/ uses."""
    (out / "splitfed" / "v1").mkdir(parents=True)
    (out / "splitfed" / "v1" / "tier_pb2.py").write_text("# built\n")
    return out


def test_the_lock_file_is_named_by_16_hex_digits_of_the_out_folders_sha256(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process generating into one out folder takes the same lock file in the temporary folder, its name
    the first 16 hex digits of the sha256 of the folder's resolved path; current code is not generated again,
    and ``generate`` says so with ``False`` (not None)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmpdir"))
    (tmp_path / "tmpdir").mkdir()
    out = _built(tmp_path / "out")
    assert generate(tmp_path / "no-proto", out) is False  # no sources, built code: current
    tag = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]
    assert sorted(p.name for p in (tmp_path / "tmpdir").iterdir()) == [f"splitfed-protogen-{tag}.lock"]
    assert len(tag) == 16


def test_generating_into_a_nested_out_folder_not_made_yet_makes_it_and_says_true(tmp_path: Path) -> None:
    """``generate`` makes the out folder with its parents, and returns True after generating (then False:
    current)."""
    root, out = tmp_path / "proto", tmp_path / "a" / "b" / "out"
    shutil.copytree(PROTO_ROOT, root)
    assert generate(root, out) is True
    assert (out / "splitfed" / "v1" / "tier_pb2.py").is_file()
    assert stale_reason(root, out) is None
    assert generate(root, out) is False
    assert [p.name for p in out.iterdir()] == ["splitfed"]  # no scratch folder left


def test_a_failed_protoc_is_the_error_not_the_clean_up_of_its_scratch_folder(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The scratch folder is removed whatever happened, and its clean-up failing (here: it is gone already)
    never replaces protoc's own error with a FileNotFoundError."""
    root, out = tmp_path / "proto", tmp_path / "out"
    shutil.copytree(PROTO_ROOT, root)

    def failing_protoc(root: Path, dest: Path) -> None:
        shutil.rmtree(dest)
        raise ImportError("protoc failed (exit 1) on splitfed/v1/tier.proto")

    monkeypatch.setattr(_codegen, "_run_protoc", failing_protoc)
    with pytest.raises(ImportError, match=r"^protoc failed \(exit 1\) on splitfed/v1/tier.proto$"):
        generate(root, out)
    assert list(out.iterdir()) == []


@pytest.fixture
def fresh_ensure(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``ensure`` as at a process's first import, with ``stale_reason``/``generate`` stood in; the calls made."""
    calls: list[str] = []
    monkeypatch.setattr(_codegen, "_checked", False)
    monkeypatch.setattr(_codegen, "regenerated_at_import", None)
    return calls


def test_ensure_does_not_generate_current_code(fresh_ensure: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Current code (no reason): ``generate`` (its lock, the digest again) is not even called."""

    def stale() -> None:
        fresh_ensure.append("stale_reason")

    def gen() -> bool:
        fresh_ensure.append("generate")
        return False

    monkeypatch.setattr(_codegen, "stale_reason", stale)
    monkeypatch.setattr(_codegen, "generate", gen)
    _codegen.ensure()
    assert fresh_ensure == ["stale_reason"]
    assert _codegen.regenerated_at_import is None


def test_ensure_checks_once_per_process(fresh_ensure: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Stale code is generated at the first call and the reason kept; later calls check nothing again."""

    def stale() -> str:
        fresh_ensure.append("stale_reason")
        return "generated code is missing"

    def gen() -> bool:
        fresh_ensure.append("generate")
        return True

    monkeypatch.setattr(_codegen, "stale_reason", stale)
    monkeypatch.setattr(_codegen, "generate", gen)
    for _ in range(3):
        _codegen.ensure()
    assert fresh_ensure == ["stale_reason", "generate"]
    assert _codegen.regenerated_at_import == "generated code is missing"
