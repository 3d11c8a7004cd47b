"""A stopped run silences the ``flwr`` logger (Flower's engine threads may log on after a second Ctrl-C), but
only until the next run of the process: before, it stayed silent for good, so a notebook or a script that
stopped one run saw no Flower log in any later run, even ``verbose``, and its own ``flwr`` logging was lost."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from splitfed.flower.config import RunSettings
from splitfed.sim import runner
from splitfed.sim.ray_start import RayStartError


@pytest.fixture
def flwr() -> logging.Logger:
    import flwr.simulation  # noqa: F401  (its import sets the logger's level: the caller's choice comes after)

    from clients.app import app  # noqa: F401
    from server.app import build_app  # noqa: F401

    logger = logging.getLogger("flwr")
    logger.setLevel(logging.INFO)  # the caller's own choice (the autouse fixture puts back what was before)
    return logger


def _failing_start(*args: object, **kwargs: object) -> None:
    raise RayStartError("simulated: Ray did not start")


def test_a_stop_silences_flwr_and_the_next_run_gives_the_callers_level_back(flwr, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    signals = runner._Signals(threading.Event())
    with pytest.raises(KeyboardInterrupt):
        signals._handle(signal.SIGINT, None)  # outside the engine: raised at once, as Ctrl-C is
    assert flwr.level > logging.CRITICAL  # silenced: the engine's threads may still log
    seen: list[int] = []

    def start(*args: object, **kwargs: object) -> None:
        seen.append(flwr.level)  # what the next run runs with
        _failing_start()

    monkeypatch.setattr(runner, "start_ray", start)
    with pytest.raises(runner.SimulationError, match="Ray did not start"):
        runner.simulate(RunSettings(clients=1), progress=lambda line: None, verbose=True)
    assert seen == [logging.INFO]  # verbose: the caller's level, not the silence of the run stopped before
    assert flwr.level == logging.INFO  # and as the caller left it once this run ends too


def test_a_run_stopped_by_ctrl_c_silences_flwr_keeping_the_level_it_found(flwr, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Not the level the run set for itself (WARNING, not verbose): the one the caller had set."""
    def interrupted(*args: object, **kwargs: object) -> None:
        assert flwr.level == logging.WARNING  # the run's own, while it runs
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "start_ray", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.simulate(RunSettings(clients=1), progress=lambda line: None)
    assert flwr.level > logging.CRITICAL
    monkeypatch.setattr(runner, "start_ray", _failing_start)
    with pytest.raises(runner.SimulationError):
        runner.simulate(RunSettings(clients=1), progress=lambda line: None)
    assert flwr.level == logging.INFO
