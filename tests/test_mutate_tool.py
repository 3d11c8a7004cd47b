"""The mutation tool (``.ci/mutate.py``) makes one small, compiling change per mutant, and only where a change
means something: a docstring, an annotation or an f-string is never changed."""

from __future__ import annotations

import importlib.util
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
