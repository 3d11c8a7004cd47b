"""The profile key of a user's model follows a module its code imports inside a function (``import helpers``
in ``forward``): no global refers to such a module, and in a fresh process it is not even imported when the
key is made, so it is found by reading the user's files. An edit to it made a cached profile stale."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitfed.models.zoo import resolve_spec
from splitfed.profile import profiler
from splitfed.profile.digest import code_digest

NET = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 32)
        self.d = nn.Linear(32, 10)

    def forward(self, x):
        {import_line}
        import numpy  # installed: never part of the key
        h = self.a(x).relu()
        h = {call}(h, self.b)
        return self.d(h)


def make():
    return Net()
"""
ONCE = "def body(x, lin):\n    return lin(x)\n"
THRICE = "def body(x, lin):\n    return lin(lin(lin(x)))\n"


@pytest.fixture
def names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:8]
    pkg, helpers = f"localimp_{tag}", f"localhelp_{tag}"
    monkeypatch.syspath_prepend(str(tmp_path))
    profiler.clear_cache()
    yield pkg, helpers
    for name in [n for n in sys.modules if tag in n]:
        sys.modules.pop(name, None)
    profiler.clear_cache()


@pytest.mark.parametrize("style", ["import module", "from module import function", "relative"])
def test_the_key_follows_a_module_imported_inside_forward_before_and_after_it_runs(
        style: str, names: tuple[str, str], tmp_path: Path) -> None:
    pkg, helpers = names
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    where = tmp_path / pkg / "helpers.py" if style == "relative" else tmp_path / f"{helpers}.py"
    import_line, call = {"import module": (f"import {helpers}", f"{helpers}.body"),
                         "from module import function": (f"from {helpers} import body", "body"),
                         "relative": ("from .helpers import body", "body")}[style]
    where.write_text(ONCE)
    (tmp_path / pkg / "net.py").write_text(NET.format(import_line=import_line, call=call))
    spec = resolve_spec(f"{pkg}.net:make", input_shape=(8,), num_classes=10)

    first = code_digest(spec)  # the forward has not run: the helper is not imported yet
    assert not any(n.endswith(("helpers", helpers)) for n in sys.modules if pkg in n or helpers in n)
    where.write_text(THRICE)
    second = code_digest(spec)
    assert second != first
    assert code_digest(spec) == second  # stable while nothing changes

    prof = profiler.profile_model(spec, batch=2, reps=1)  # the forward runs: now it is imported
    assert prof.fwd_flops[prof.names.index("b")] == 3 * 2 * 32 * 32
    assert code_digest(spec) == second


def test_a_fresh_profile_process_measures_again_after_the_helper_changes(tmp_path: Path) -> None:
    """The user's repro: ``splitfed profile`` in its own process, the helper (imported in ``forward``)
    edited between two runs: the second prints the new FLOPs, not the cached profile's. Also the reviewer's repro
    of test_profile_review (which ran the same two processes and is left to this test)."""
    (tmp_path / "net.py").write_text(NET.format(import_line="import helpers", call="helpers.body"))
    env = {**os.environ, "SPLITFED_PROFILE_CACHE": str(tmp_path / "pc"), "PYTHONPATH": str(tmp_path)}

    def block_b_flops(helper: str) -> float:
        import json

        (tmp_path / "helpers.py").write_text(helper)
        p = subprocess.run([sys.executable, "-m", "splitfed.cli", "profile", "--model", "net:make",
                            "--input-shape", "8", "--num-classes", "10", "--batch", "2", "--reps", "1", "--json"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert p.returncode == 0, p.stderr
        d = json.loads(p.stdout)
        return float(d["fwd_flops"][d["names"].index("b")])

    assert block_b_flops(ONCE) == 2 * 32 * 32
    assert block_b_flops(ONCE) == 2 * 32 * 32
    assert len(list((tmp_path / "pc").iterdir())) == 1  # one key across processes while nothing changes
    assert block_b_flops(THRICE) == 3 * 2 * 32 * 32
    assert len(list((tmp_path / "pc").iterdir())) == 2
