"""``splitfed simulate``: a fleet of virtual clients in Flower's simulation engine.

The runner starts the tier servers (edge and cloud processes on 127.0.0.1, random
free ports), then Flower's simulation engine with ``clients`` virtual nodes
(Ray actors, 1 CPU each, at most one per core) running the ClientApp, and the
ServerApp in this process. Ray is started first, by the runner, so a start that
times out is retried before anything else exists (``splitfed.sim.ray_start``).
Every process it started is stopped on the way out:
normal end, error or Ctrl-C (the ServerApp polls a stop flag, Ray is shut down,
the tier processes are stopped by their context manager).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from splitfed.errors import SplitfedError, Terminated
from splitfed.flower.config import RunSettings
from splitfed.sim.ray_start import RayStartError, start_ray
from splitfed.sim.tiers import start_tiers


class SimulationError(SplitfedError):
    """Flower's simulation engine (Ray) failed; the message names the root cause."""

    exit_code = 1


def simulate(settings: RunSettings, progress: Callable[[str], None] = print, verbose: bool = False,
             cpus: int | None = None) -> dict[str, Any]:
    """Run the simulation; returns the run's summary (also in ``out/summary.json``)."""
    import ray
    from flwr.simulation import run_simulation

    from clients.app import app as client_app
    from server.app import build_app

    cpus = cpus or max(1, min(len(os.sched_getaffinity(0)), settings.clients))
    quiet = ExpectedWarnings()
    flwr_level = logging.getLogger("flwr").level
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
        logging.getLogger("flwr").addFilter(quiet)
    stop = threading.Event()
    summary: dict[str, Any] = {}
    before: dict[int, Any] = {}
    interrupted = False
    progress(f"starting the simulation engine (Ray, {cpus} CPU(s)) and {settings.tiers - 1} tier process(es)...")
    try:
        try:
            start_ray({"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False,
                       "logging_level": "INFO" if verbose else "ERROR", "log_to_driver": verbose}, log=progress)
        except RayStartError as e:
            raise SimulationError(f"the simulation engine failed: {e}") from e
        before = _stop_on_signals()  # after Ray's start: its SIGTERM handler would abort the process instead
        with start_tiers(settings) as chain:
            run_settings = settings.with_(tier_addresses=",".join(chain.addresses))
            progress(f"tiers: {', '.join(chain.addresses)}; {settings.clients} virtual clients on {cpus} CPU(s)")
            server_app = build_app(run_settings, progress, stop=stop, on_summary=summary.update)
            backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}  # Ray is already up
            try:
                run_simulation(server_app, client_app, num_supernodes=settings.clients, backend_config=backend,
                               verbose_logging=verbose)
            except RuntimeError as e:  # Flower wraps runtime failures (e.g. Ray not starting) in this
                root = e
                while root.__cause__ is not None:
                    root = root.__cause__
                raise SimulationError(f"the simulation engine failed: {type(root).__name__}: {root}") from e
            finally:
                stop.set()
    except KeyboardInterrupt:
        # Flower's engine threads are left behind and may still log after this returns (see _stop_on_signals)
        interrupted = True
        logging.getLogger("flwr").setLevel(logging.CRITICAL + 1)
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for sig, handler in before.items():
            signal.signal(sig, handler)
        logging.getLogger("flwr").removeFilter(quiet)
        if not interrupted:
            logging.getLogger("flwr").setLevel(flwr_level)  # a caller's own Flower logging is as it was
    return summary


def _stop_on_signals() -> dict[int, Any]:
    """Ctrl-C and SIGTERM stop the run the same way: Flower's logger is silenced first (Ray then goes down
    under Flower's engine threads, and what they log about it is this stop's echo, not news), then
    :class:`KeyboardInterrupt` (:class:`Terminated` for SIGTERM) unwinds the main thread: every process
    stopped, the last checkpoint kept. Returns the handlers it replaced ({}: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: Any) -> None:
        logging.getLogger("flwr").setLevel(logging.CRITICAL + 1)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    return {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}


class ExpectedWarnings(logging.Filter):
    """Drops Flower's warnings about what splitfed does on purpose, so that the ones left mean something.

    ``run_simulation`` is how a one-command simulation runs in-process (deployments
    use ``flwr run``); federated evaluation is off because the ServerApp evaluates
    the global model itself each round.
    """

    EXPECTED = ("The `run_simulation` function is deprecated", "fraction_evaluate is set to 0.0")

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(e in text for e in self.EXPECTED)


def validate(settings: RunSettings) -> None:
    """Refuse bad settings before any process starts (one clear error, nothing started)."""
    from splitfed.cost.model import cut_options
    from splitfed.data import parse_partition
    from splitfed.engine import template
    from splitfed.flower import runfolder
    from splitfed.flower.adaptive import AdaptivePolicy, GreedyPolicy
    from splitfed.flower.policy import StaticPolicy, make_policy
    from splitfed.flower.workload import client_data, test_data
    from splitfed.models.blocks import validate_cuts
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.inprocess import sim_clients

    if settings.out:  # a folder in use, or holding a run this one neither resumes nor replaces
        runfolder.check(settings.out, settings.resume, settings.overwrite)
    spec = settings.spec
    parse_partition(settings.partition)
    test_data(spec, settings.dataset, settings.seed)  # unknown dataset or shape mismatch
    client_data(spec, settings.dataset, settings.partition, settings.clients, 0, settings.seed)  # too few samples
    policy = make_policy(settings)
    n = template.num_blocks(spec)
    if isinstance(policy, StaticPolicy):
        for cuts in policy.options:
            validate_cuts(cuts, n, settings.tiers, settings.u_shape, model=spec.name)
    cut_options(n, settings.tiers, settings.u_shape, settings.min_device_blocks)  # some cut keeps them
    fleet = fleet_for(settings)
    if isinstance(policy, AdaptivePolicy | GreedyPolicy):
        policy.assign(1, sim_clients(settings, fleet))  # the optimizer's plan: a device nothing fits is named now
    if settings.addresses:  # tiers already running elsewhere: a chain they cannot form is named now, too
        from splitfed.sim.tiers import tier_chain

        with tier_chain(settings):
            pass
