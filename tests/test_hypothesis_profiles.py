"""CI's property tests draw the same examples every run; `make test-explore` draws new ones.

The profile is chosen when tests/conftest.py is imported (after pytest's own `--hypothesis-profile` is read, so
that option would be overridden): by ``SPLITFED_HYPOTHESIS_PROFILE``, ``splitfed`` when unset.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
SHOW = ("import tests.conftest; from hypothesis import settings\n"
        "for d in (settings.default, settings.get_profile('splitfed'), settings.get_profile('explore')):\n"
        "    print(d.derandomize, d.print_blob, d.database, d.deadline, "
        "sorted(h.name for h in d.suppress_health_check))")
REST = "None None ['function_scoped_fixture', 'too_slow']"  # no database, no deadline (CI's 2 cores are slow)
SPLITFED, EXPLORE = f"True False {REST}", f"False True {REST}"  # explore keeps the rest of CI's profile


def _profile_seen(value: str | None, ci: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPLITFED_HYPOTHESIS_PROFILE", "CI")}
    if value is not None:
        env["SPLITFED_HYPOTHESIS_PROFILE"] = value
    if ci is not None:
        env["CI"] = ci  # Hypothesis loads its own "ci" profile when it sees this
    return subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_this_run_uses_the_profile_the_variable_names() -> None:
    """The suite's own process, not only a fresh import: conftest loaded the profile the variable names."""
    chosen = settings.get_profile(os.environ.get("SPLITFED_HYPOTHESIS_PROFILE", "splitfed"))
    default = settings.default
    assert default is not None and default.derandomize == chosen.derandomize
    assert default.print_blob == chosen.print_blob and default.deadline is None


@pytest.mark.parametrize(("value", "ci", "loaded"), [("splitfed", None, SPLITFED), (None, "true", SPLITFED),
                                                     ("explore", "true", EXPLORE)],
                         ids=["splitfed", "unset-on-ci", "explore-on-ci"])
def test_the_variable_picks_the_profile(value: str | None, ci: str | None, loaded: str) -> None:
    """The same profiles on a user's machine and on CI (whose CI variable makes Hypothesis load one of its own)."""
    p = _profile_seen(value, ci)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines() == [loaded, SPLITFED, EXPLORE]


def test_an_unknown_profile_is_refused_by_name() -> None:
    p = _profile_seen("explorer")
    assert p.returncode != 0 and "explorer" in p.stderr and "not registered" in p.stderr.lower(), p.stderr[-2000:]
