"""Helpers for tests of a tier's loads that race each other."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from splitfed.engine.tier import Tier


@contextlib.contextmanager
def paused_bind(monkeypatch: pytest.MonkeyPatch, replica: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """``(inside, go_on)``: a load into ``replica`` sets ``inside`` once it is checked, its bytes set aside and
    its blocks built, before it writes anything, and waits there for ``go_on`` (set on leaving, at the latest,
    so no load is left waiting)."""
    inside, go_on = threading.Event(), threading.Event()
    real = Tier._check_state

    def paused(segment, state, missing, name):  # type: ignore[no-untyped-def]
        if name == replica:
            inside.set()
            assert go_on.wait(10)
        return real(segment, state, missing, name)

    monkeypatch.setattr(Tier, "_check_state", staticmethod(paused))
    try:
        yield inside, go_on
    finally:
        go_on.set()


class Clock:
    """A tier's clock (``Tier(clock=...)``) that moves only when a test moves ``now``: idle releases without
    sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
