"""Every results writer writes strict JSON: NaN and infinity become null, nothing else changes,
and a file is replaced whole or not at all."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitfed.jsonio import draft_of, drafted_for, dumps, write_atomic, write_json

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.text("abc xyz\"\\é", max_size=5),
                    st.floats(allow_nan=True, allow_infinity=True))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.tuples(inner, inner),
                                                       st.dictionaries(st.text("abcz", max_size=4), inner, max_size=4)),
                      max_leaves=20)


def strict_loads(text: str):  # type: ignore[no-untyped-def]
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


@given(values)
def test_strict_json_keeps_every_finite_value_and_nulls_the_rest(obj) -> None:  # type: ignore[no-untyped-def]
    """Exactly Python's own JSON with its three non-standard tokens written as null (strings here hold
    no capital letters, so no token can hide in one), and a strict reader takes it."""
    text = dumps(obj)
    loose = json.dumps(obj).replace("-Infinity", "null").replace("Infinity", "null").replace("NaN", "null")
    assert text == loose
    strict_loads(text)


def test_a_default_converts_first_and_its_non_finite_results_are_nulled_too() -> None:
    obj = {"a": np.float32("nan"), "b": np.float64(1.5), "c": [np.float64("inf"), np.int64(3)]}
    assert strict_loads(dumps(obj, default=lambda v: v.item())) == {"a": None, "b": 1.5, "c": [None, 3]}


def test_files_are_replaced_whole_and_leave_no_temporary_behind(tmp_path, monkeypatch) -> None:
    path = tmp_path / "deep" / "out.json"
    write_json(path, {"ratio": float("inf"), "n": 1})
    assert strict_loads(path.read_text()) == {"ratio": None, "n": 1}

    def crash(src, dst):  # type: ignore[no-untyped-def]
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(path, "half")
    assert strict_loads(path.read_text()) == {"ratio": None, "n": 1}  # the old file, whole
    assert [f.name for f in path.parent.iterdir()] == ["out.json"]


@given(st.one_of(st.text(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                 st.floats(allow_nan=False)))
def test_a_toml_literal_reads_back_as_its_value(v) -> None:  # type: ignore[no-untyped-def]
    """What splitfed writes into Flower's run and node configs and fleet entries: any string, number or bool."""
    import tomllib

    from splitfed.tomlio import value

    assert tomllib.loads(f"x = {value(v)}")["x"] == v


def test_a_file_written_atomically_is_named_durably(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's bytes are fsynced before it replaces the old one, and the folder after: an fsynced file the
    folder does not yet name on disk may be the old one after a power loss (results.json, the run's lock
    record, experiment results)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:  # type: ignore[no-untyped-def]
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = write_json(tmp_path / "results.json", {"a": 1})
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[1][1] == str(path) and events[2][1] == str(tmp_path)


def test_a_folder_that_cannot_be_synced_leaves_the_file_written(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some FUSE and network file systems refuse to fsync a folder (EINVAL): the file is in place, and its
    writer goes on; a real failure of the disk (EIO) is still raised."""
    import errno

    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code = errno.EINVAL
    assert json.loads(write_json(tmp_path / "a.json", {"a": 1}).read_text()) == {"a": 1}
    code = errno.EIO
    with pytest.raises(OSError, match="Input/output error"):
        write_json(tmp_path / "b.json", {"b": 2})


def test_threads_writing_one_file_at_once_each_replace_it_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two threads of one process (a cache entry two of a run's threads compute at once) each write their own
    draft: before, they shared the process's one, so a replace found it gone or another thread's half in it."""
    import threading

    path = tmp_path / "entry"
    texts = [str(i) * 200_000 for i in range(6)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(texts))

    def write(text: str) -> None:
        start.wait()
        try:
            for _ in range(20):
                write_atomic(path, text)
        except BaseException as e:  # noqa: BLE001 (shown below, whatever it is)
            errors.append(e)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_text() in texts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]  # no draft left behind


names = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1,
                max_size=30).filter(lambda n: n not in (".", ".."))


@given(names)
def test_a_draft_is_named_as_the_file_it_is_for(name: str) -> None:
    """Errors raised while a draft is written name it; the report says the file the user knows instead."""
    assert drafted_for(draft_of(f"/some/folder/{name}").name) == name


@given(names)
def test_a_name_that_is_no_draft_of_this_process_is_kept(name: str) -> None:
    assert drafted_for(name) == name or name.endswith(".tmp")
    shown = name.lstrip(".") or "x"
    for other in (f".{name}.{os.getpid() + 1}-7.tmp", f".{name}.{os.getpid()}.tmp", f".{name}.{os.getpid()}-x.tmp",
                  f"{shown}.{os.getpid()}-7.tmp", f".{os.getpid()}-7.tmp"):
        assert drafted_for(other) == other  # another process's, the old pid-only suffix, not hidden, no name
