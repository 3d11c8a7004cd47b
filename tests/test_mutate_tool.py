"""The mutation tool (``.ci/mutate.py``) makes one small, compiling change per mutant, and only where a change
means something: a docstring, an annotation or an f-string is never changed."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SOURCE = '''"""Doc 1 + 2."""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    LIMIT = 3


def f(x: int = 1, y: "int" = 2) -> int:
    """Also a doc: 5 < 6."""
    if x > 0 and y != 2:
        return x - y * 3
    while not x:
        x += 1
    return f"{x + 1}"  # an f-string: left alone
'''


def _tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / ".ci" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate_tool"] = module
    spec.loader.exec_module(module)
    return module


def test_each_mutant_is_one_compiling_change_outside_docstrings_annotations_and_f_strings() -> None:
    tool = _tool()
    found = tool.mutants(SOURCE)
    changed = {(m.old, m.new) for m in found}
    assert ("x > 0", "(x >= 0)") in changed and ("y != 2", "(y == 2)") in changed
    assert ("x - y * 3", "(x + y * 3)") in changed and ("y * 3", "(y / 3)") in changed
    assert ("x += 1", "x -= 1") in changed
    assert ("return x - y * 3", "return None") in changed
    assert ("not x", "x") in changed and ("x > 0 and y != 2", "(x > 0 or y != 2)") in changed
    assert ("1", "2") in changed and ("1", "0") in changed and ("0", "1") in changed
    for m in found:
        assert m.line >= 8, m  # nothing in the module docstring or the TYPE_CHECKING block
        assert m.old not in ("5", "6", "int", '"int"'), m  # nor the function's docstring or annotations
        assert "{x" not in m.old or m.desc == "return None", m
        text = tool.mutated_source(SOURCE, m)
        compile(text, "<mutant>", "exec")
        assert text != SOURCE and text.splitlines()[:m.line - 1] == SOURCE.splitlines()[:m.line - 1]
    assert [m.idx for m in found] == list(range(len(found)))


def test_a_mutant_is_run_against_tests_whose_ids_hold_a_space(tmp_path: Path) -> None:
    """A parametrised id may hold a space ("[triples0-is not]"); passed in an @file, pytest split it there and
    refused the whole run (exit 4), so every mutant of a module with such a test read "error-4"."""
    tool = _tool()
    source = "def f():\n    return 1\n"
    (tmp_path / "mod.py").write_text(source)
    (tmp_path / "test_mod.py").write_text(
        "import pytest\n\nfrom mod import f\n\n\n@pytest.mark.parametrize('x', ['a b'])\n"
        "def test_f(x):\n    assert f() == 1\n")
    [one] = [m for m in tool.mutants(source) if m.new == "0"]
    assert tool.run_one(tmp_path, "mod.py", source, one, ["test_mod.py::test_f[a b]"], 120) == "killed"
    assert (tmp_path / "mod.py").read_text() == source  # put back
    unchanged = tool.Mutant(**{**vars(one), "new": one.old})
    assert tool.run_one(tmp_path, "mod.py", source, unchanged, ["test_mod.py::test_f[a b]"], 120) == "survived"


def test_a_mutant_that_breaks_an_import_of_the_tests_is_noticed(tmp_path: Path) -> None:
    """A mutant that makes a test module fail to import (a module-level value it checks) fails its collection:
    pytest exits 2 or 4, not 1. That is noticed, not an error of the tool (it was "error-4"). That a mutant the
    tests pass survives (pytest's 0) is test_a_mutant_is_run_against_tests_whose_ids_hold_a_space's."""
    tool = _tool()
    source = "LIMIT = 1\nif LIMIT != 1:\n    raise ValueError('LIMIT')\n"
    (tmp_path / "mod.py").write_text(source)
    (tmp_path / "test_mod.py").write_text("from mod import LIMIT\n\n\ndef test_limit():\n    assert LIMIT\n")
    [one] = [m for m in tool.mutants(source) if m.line == 1 and m.new == "2"]
    assert tool.run_one(tmp_path, "mod.py", source, one, ["test_mod.py::test_limit"], 120) == "killed"
    assert (tmp_path / "mod.py").read_text() == source  # put back


def test_a_scratch_copy_links_the_venv_and_leaves_git_and_caches_out(tmp_path: Path) -> None:
    """A check copies the checkout once per call: the venv (gigabytes of torch) is linked, never copied."""
    tool = _tool()
    root = tmp_path / "checkout"
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "big.so").write_bytes(b"x")
    (root / ".git").mkdir()
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    work = tool._worker_copy(root, 0)
    try:
        assert (work / "pkg" / "mod.py").read_text() == "X = 1\n"
        assert (work / ".venv").is_symlink() and (work / ".venv").resolve() == (root / ".venv").resolve()
        assert (work / ".venv" / "lib" / "big.so").read_bytes() == b"x"
        assert not (work / ".git").exists() and not (work / "pkg" / "__pycache__").exists()
    finally:
        shutil.rmtree(work)
    assert (root / ".venv" / "lib" / "big.so").exists()  # removing the copy leaves the linked venv whole


def test_a_budget_picks_the_fastest_tests_and_counts_each_at_least_its_floor() -> None:
    """Tests junit timed at 0.0 s still cost their set-up: a 6 s budget over 10,000 of them picks 300 (a
    module every test touches once picked all 10,000, past the command line's limit), fastest first."""
    tool = _tool()
    m = tool.mutants(SOURCE)[0]
    zero = {f"tests/test_x.py::test_{i:05d}": 0.0 for i in range(10_000)}
    by_line = {m.line: {*zero, "tests/test_x.py::test_slow"}}
    picked = tool.chosen(m, by_line, {**zero, "tests/test_x.py::test_slow": 3.0}, 6.0)
    assert len(picked) == round(6.0 / tool.MIN_TEST_S) == 300
    assert picked == sorted(zero)[:300]
    slow_first = tool.chosen(m, {m.line: {"tests/test_x.py::test_slow"}}, {"tests/test_x.py::test_slow": 9.0}, 6.0)
    assert slow_first == ["tests/test_x.py::test_slow"]  # one test is always run, however slow


def test_a_test_whose_id_no_command_line_can_hold_is_left_out() -> None:
    """A parametrized id that spells out a 400 KB value cannot be one argument (Linux: 128 KiB): the run of a
    module it covered died on it. It is left out; the others are picked."""
    tool = _tool()
    m = tool.mutants(SOURCE)[0]
    huge = "tests/test_x.py::test_big[" + "[" * 200_000 + "]"
    edge = "tests/test_x.py::test_e[" + "x" * (tool.MAX_ID_CHARS - 25) + "]"
    assert len(edge) == tool.MAX_ID_CHARS
    by_line = {m.line: {huge, edge, "tests/test_x.py::test_small"}}
    picked = tool.chosen(m, by_line, {huge: 0.0, edge: 0.1, "tests/test_x.py::test_small": 0.2}, 6.0)
    assert picked == [edge, "tests/test_x.py::test_small"]
