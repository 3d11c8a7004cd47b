"""Figures as ``splitfed.report.plots`` draws them, for tests that read what a figure shows.

A PNG cannot be asked what it shows; the ``Figure`` can. ``plots._save`` is where every figure goes to its file:
wrapped, it keeps each figure and still writes it, so the file is made as in a real report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitfed.report import plots


def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure drawn from here on (until the test ends), in the order they were saved."""
    figs: list[Any] = []
    real = plots._save

    def keep(fig: Any, path: str | Path) -> Path:
        figs.append(fig)
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figs
