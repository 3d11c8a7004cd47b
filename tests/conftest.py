"""Shared test set-up: one torch thread (CI has 2 cores), hypothesis without deadlines, one cache for the run.

Engineers append fixtures for their area below (or import them from a tests/*_fixtures.py module).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, settings

from tests.data_fixtures import own_cache  # noqa: F401 (a fixture: a splitfed cache of the test's own)
from tests.flower_fixtures import strategy_clock  # noqa: F401 (a fixture: server.strategy's clock, moved by sleep)
from tests.optimizer_fixtures import vgg11  # noqa: F401 (a fixture: the vgg11 profile the optimizer's tests price)
from tests.profile_fixtures import tag  # noqa: F401 (a fixture: a user model's module names, unique to the test)
from tests.ray_fixtures import ray_tmp  # noqa: F401 (a fixture: a Ray of the test's own)

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # started in the background by a shell without job control (`cmd &` in a script), which ignores Ctrl-C: the
    # tests of how a Ctrl-C stops a command would see none arrive. A handler here is reset to the default in the
    # processes they start; an ignored signal would stay ignored there.
    signal.signal(signal.SIGINT, signal.default_int_handler)

# the parent is Hypothesis' own default, not whatever it loaded: with CI set in the environment it loads its "ci"
# profile (print_blob on), and a profile registered on top would differ between CI and a user's machine
settings.register_profile(
    "splitfed",
    parent=settings.get_profile("default"),
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
# CI draws the same examples every run (a red build is the change's, not the dice's); `make test-explore` draws
# new ones each run, so that run after run the property tests look where CI never does (a failure prints the
# @reproduce_failure blob to replay it)
settings.register_profile("explore", parent=settings.get_profile("splitfed"), derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("SPLITFED_HYPOTHESIS_PROFILE", "splitfed"))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


_CACHE = "SPLITFED_CACHE_DIR"


def _one_cache_for_the_run(config: pytest.Config) -> None:
    """Every test and every process it starts (workers inherit the controller's environment) shares one splitfed
    cache (:mod:`splitfed.cache`) made for this run, not the user's: the digits split, each Dirichlet partition
    and each profile are computed once per run, as on a user's machine, and nothing is left in their home.
    Tests of the cache itself set their own."""
    if hasattr(config, "workerinput") or os.environ.get(_CACHE):
        return
    folder = tempfile.mkdtemp(prefix="splitfed-test-cache-")
    os.environ[_CACHE] = folder
    config.add_cleanup(lambda: (os.environ.pop(_CACHE, None), shutil.rmtree(folder, ignore_errors=True)))


def pytest_configure(config: pytest.Config) -> None:
    _one_cache_for_the_run(config)
    _refuse_ungrouped_loadgroup(config)


def _refuse_ungrouped_loadgroup(config: pytest.Config) -> None:
    """``make test`` runs ``--dist loadgroup``: group "flower-real" keeps the real Ray and Flower runs on one
    worker, one after another. pytest 9.2 keeps a test's id where pytest-xdist 3.8 cannot add the group to it,
    so xdist grouped nothing: those runs went side by side and each worker set up the module fixtures again.
    Refused by name rather than run so."""
    if getattr(config.option, "dist", None) != "loadgroup" or hasattr(config, "workerinput"):
        return
    import xdist

    if _version(pytest.__version__) >= (9, 2) and _version(xdist.__version__) <= (3, 8):
        raise pytest.UsageError(f"--dist loadgroup groups nothing with pytest {pytest.__version__} and "
                                f"pytest-xdist {xdist.__version__}: install the versions pyproject.toml allows "
                                f"(pip install -e '.[dev]')")


@pytest.fixture(autouse=True)
def _flwr_logger_as_it_was() -> Iterator[None]:
    """A stopped run silences the ``flwr`` logger for the rest of its process (Flower's engine threads may
    log on after a second Ctrl-C); a test that stops one in this process must not leave it so for the tests
    after it on the worker: five read Flower's log through caplog and saw nothing once the order changed."""
    flwr = logging.getLogger("flwr")
    level, propagate, filters = flwr.level, flwr.propagate, list(flwr.filters)
    yield
    flwr.setLevel(level)
    flwr.propagate = propagate
    flwr.filters[:] = filters


_SPENT: dict[str, float] = {}  # worker seconds per test file (setup, call and teardown), and per xdist group


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Counted where the reports meet (the controller under xdist): what each file and group costs CI."""
    path, _, rest = report.nodeid.partition("::")
    group = rest.rpartition("@")[2] if "@" in rest else ""
    for key in (path, f"group {group}" if group else "ungrouped"):
        _SPENT[key] = _SPENT.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """With ``--durations`` (``make test`` sets it): worker time by xdist group and the costliest files. A group
    runs on one worker, one test after another: a group near half the total sets the suite's wall time."""
    if config.option.durations is None or not _SPENT or hasattr(config, "workerinput"):
        return
    groups = {k: v for k, v in _SPENT.items() if k.startswith("group ") or k == "ungrouped"}
    files = sorted(((v, k) for k, v in _SPENT.items() if k not in groups), reverse=True)
    terminalreporter.write_sep("=", f"worker time: {sum(groups.values()):.0f} s in all")
    terminalreporter.write_line("  " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(groups.items())))
    for v, k in files[:20]:
        terminalreporter.write_line(f"{v:8.1f}s {k}")
