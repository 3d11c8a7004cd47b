"""Behaviour of four small modules that a mutation run found unpinned: ``mib_text``'s exact text at each of its
boundaries (non-finite values, 100 bytes, 1 KiB, 999.5 MiB, negative values); strict JSON even from a caller's
own encoder, the draft file ``write_draft`` hands back, a failure before any draft existed raised as itself,
``write_json``'s two-space indent, and ``drafted_for`` keeping a name with no file name in it; and the model
kwargs' canonical JSON sorted by key.

Not pinned, because no input can tell them apart: ``mib_text`` from 100 up to 101 bytes formats the same with
``.0f`` and ``.3g`` (both give a whole number there), and ``unknown_key`` asks difflib for its one closest
match: asking for two returns that same match first, and only the first is shown."""

from __future__ import annotations

import errno
import json
import os

import pytest

from splitfed import jsonio
from splitfed.jsonio import draft_of, drafted_for, dumps, write_atomic, write_draft, write_json
from splitfed.options import kwargs_json, kwargs_of
from splitfed.units import MIB, mib_text


@pytest.mark.parametrize(("nbytes", "text"), [
    (float("inf"), "inf bytes"),
    (float("-inf"), "-inf bytes"),
    (float("nan"), "nan bytes"),
    (0, "0 bytes"),
    (0.005, "0.005 bytes"),
    (99, "99 bytes"),
    (99.5, "99.5 bytes"),
    (100, "100 bytes"),
    (1000, "1000 bytes"),
    (1023, "1023 bytes"),
    (-1023, "-1023 bytes"),
    (1024, "0.000977 MiB"),
    (-1024, "-0.000977 MiB"),
    (1.5 * MIB, "1.5 MiB"),
    (999.4 * MIB, "999 MiB"),
    (999.5 * MIB, "1,000 MiB"),
    (-999.5 * MIB, "-1,000 MiB"),
    (1500 * MIB, "1,500 MiB"),
    (1998.9 * MIB, "1,999 MiB"),
    (123456.7 * MIB, "123,457 MiB"),
])
def test_mib_text_at_every_boundary(nbytes: float, text: str) -> None:
    """Under a KiB in bytes (whole from 100 up, so 1000 is no "1e+03"), from a KiB in MiB to 3 significant
    figures, from 999.5 MiB whole MiB with thousands separators (no "1e+03 MiB"); inf and nan said as such."""
    assert mib_text(nbytes) == text


def test_dumps_never_writes_nan_even_from_a_callers_encoder() -> None:
    """A ``cls`` whose ``default`` makes a NaN gets past ``strict`` (which runs before it): the dump refuses
    rather than writing the NaN no strict reader takes."""

    class NanEncoder(json.JSONEncoder):
        def default(self, o: object) -> object:
            return float("nan")

    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        dumps({"a": object()}, cls=NanEncoder)


def test_write_draft_hands_back_the_draft_and_leaves_the_file_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What a caller (the report) renames into place later: this thread's draft, written whole."""
    path = tmp_path / "out.json"
    got = write_draft(path, "text")
    assert got == draft_of(path)
    assert got.read_text() == "text"
    assert not path.exists()
    assert write_draft(path, b"\x00\x01") == draft_of(path) and draft_of(path).read_bytes() == b"\x00\x01"


def test_a_failure_before_the_draft_exists_is_raised_as_itself(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A draft that could not even be made (a full disk) leaves none to remove: the user is told of the full
    disk, not of a missing draft."""

    def full(path, text):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(jsonio, "write_draft", full)
    with pytest.raises(OSError) as e:
        write_atomic(tmp_path / "out.json", "x")
    assert e.value.errno == errno.ENOSPC and type(e.value) is OSError
    assert list(tmp_path.iterdir()) == []


def test_write_json_indents_by_two_unless_told(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = write_json(tmp_path / "r.json", {"a": [1, {"b": None}]})
    assert path.read_text() == '{\n  "a": [\n    1,\n    {\n      "b": null\n    }\n  ]\n}\n'
    assert write_json(tmp_path / "s.json", {"a": [1]}, indent=None).read_text() == '{"a": [1]}\n'


def test_a_draft_suffix_after_a_lone_dot_is_no_draft() -> None:
    """``draft_of`` makes ``.NAME.PID-THREAD.tmp`` of a file NAME; "." before the suffix leaves NAME empty,
    and no file has an empty name: the name is kept, not shown as ""."""
    name = f"..{os.getpid()}-7.tmp"
    assert drafted_for(name) == name
    assert drafted_for(f".x.{os.getpid()}-7.tmp") == "x"  # the shortest real one


def test_model_kwargs_are_canonical_whatever_their_order() -> None:
    """A resume compares its settings' kwargs with its checkpoint's as one text: key order must not count."""
    assert kwargs_json('{"width": 32, "depth": 2}') == '{"depth": 2, "width": 32}'
    assert kwargs_json('{"b": {"z": 1, "y": 2}, "a": 1}') == '{"a": 1, "b": {"y": 2, "z": 1}}'
    assert kwargs_of(kwargs_json('{"width": 32, "depth": 2}')) == {"depth": 2, "width": 32}
