"""A fixture for tests that build users' models from files they write: a tag unique to the test for its module
names, the test's folder importable, and the profile caches and those modules gone after."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitfed.profile import profiler


@pytest.fixture
def tag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    t = uuid.uuid4().hex[:8]
    monkeypatch.syspath_prepend(str(tmp_path))
    profiler.clear_cache()
    yield t
    for name in [n for n in sys.modules if t in n]:
        sys.modules.pop(name, None)
    profiler.clear_cache()
