"""Pins what ``splitfed.sim.runner`` (its first half: ``simulate``, ``one_sample_batches``, ``static_fits``) does,
without Ray: Ray's start, its session folder, the tiers, the ServerApp's build and Flower's engine are stand-ins
that record what the runner hands them (what Ray is started with, the engine's backend, the session watcher, the
cause a failed engine leaves in the run folder), so each is checked in-process in a fraction of a second. The
flwr logger's level given back to a caller, and the refusals of a last batch of one sample and of static cuts a
device cannot hold, with the counts their messages name."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from splitfed.errors import ConfigError
from splitfed.flower import runfolder
from splitfed.flower.config import RunSettings
from splitfed.sim import runner
from splitfed.sim.tiers import TierChain

SMALL = RunSettings(rounds=1, clients=1, tiers=3, cuts="static:1,3", batch_size=32)


class _Watch:
    """Stands for :class:`~splitfed.sim.ray_start.SessionWatch` (a watcher process): records what it is told."""

    made: list[_Watch]

    def __init__(self, session: Path) -> None:
        self.session = session
        self.removed: list[Path] = []
        self.released = False
        _Watch.made.append(self)

    def also_remove(self, path: Path) -> None:
        self.removed.append(path)

    def release(self) -> None:
        self.released = True


class _Run(SimpleNamespace):
    ray_args: list[dict[str, Any]]
    stopped: list[bool]
    built: list[dict[str, Any]]
    engine: list[dict[str, Any]]
    shutdowns: list[bool]
    failures: list[tuple[str, str]]
    lines: list[str]
    session: Path | None


def _fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, session: bool = True, token: str = "/tmp/tok",
          engine: Callable[[], None] | None = None, ray_up: bool = False) -> _Run:
    """``simulate`` with every process it would start replaced; ``engine``: what Flower's engine does (default:
    the ServerApp's summary, ``{"rounds": 1}``)."""
    import flwr.simulation
    import ray

    import server.app

    run = _Run(ray_args=[], stopped=[], built=[], engine=[], shutdowns=[], failures=[], lines=[], session=None)
    if session:
        run.session = tmp_path / "ray" / "session_2026-01-01_00-00-00_000000_1"
        (run.session / "logs").mkdir(parents=True)

    def start_ray(init_args: dict[str, Any], log: Any = None, stopped: Callable[[], bool] = lambda: False) -> None:
        run.ray_args.append(init_args)
        run.stopped.append(stopped())

    @contextmanager
    def start_tiers(settings: RunSettings) -> Iterator[TierChain]:
        yield TierChain(["127.0.0.1:7001", "127.0.0.1:7002"], coordinator_token_file=token)

    def build_app(settings: RunSettings, progress: Any, **kwargs: Any) -> object:
        run.built.append({"settings": settings, **kwargs})
        return object()

    def run_simulation(server_app: Any, client_app: Any, **kwargs: Any) -> None:
        run.engine.append(kwargs)
        if engine is not None:
            engine()
        else:
            run.built[-1]["on_summary"]({"rounds": 1})

    _Watch.made = []
    monkeypatch.setattr(runner, "start_ray", start_ray)
    monkeypatch.setattr(runner, "session_dir", lambda: run.session)
    monkeypatch.setattr(runner, "SessionWatch", _Watch)
    monkeypatch.setattr(runner, "own_sessions", lambda since: [])
    monkeypatch.setattr(runner, "start_tiers", start_tiers)
    monkeypatch.setattr(runner, "_level_before_silence", None)
    monkeypatch.setattr(server.app, "build_app", build_app)
    monkeypatch.setattr(flwr.simulation, "run_simulation", run_simulation)
    monkeypatch.setattr(ray, "is_initialized", lambda: ray_up)
    monkeypatch.setattr(ray, "shutdown", lambda: run.shutdowns.append(True))
    monkeypatch.setattr(runfolder, "failed_elsewhere", lambda folder, why: run.failures.append((folder, why)))
    return run


def test_the_summary_is_returned_with_and_without_a_run_folder(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A run with ``out`` holds its folder from before Ray starts and hands that hold to the ServerApp; one
    without holds nothing. Either way ``simulate`` returns the ServerApp's summary."""
    run = _fake(monkeypatch, tmp_path)
    assert runner.simulate(SMALL, progress=run.lines.append) == {"rounds": 1}
    assert run.built[-1]["reservation"] is None
    out = tmp_path / "run"
    assert runner.simulate(SMALL.with_(out=str(out)), progress=run.lines.append) == {"rounds": 1}
    assert isinstance(run.built[-1]["reservation"], runfolder.Reservation)


def test_ray_is_started_with_the_cpus_asked_else_one_per_client_within_this_process_s_cores(  # type: ignore[no-untyped-def]
        monkeypatch, tmp_path) -> None:
    """A Ray of its own, no GPU, no dashboard, Ray's logs only when verbose; not stopped when nothing was
    signalled."""
    run = _fake(monkeypatch, tmp_path)
    runner.simulate(SMALL, progress=run.lines.append, cpus=3)
    assert run.ray_args[-1] == {"address": "local", "num_cpus": 3, "num_gpus": 0, "include_dashboard": False,
                                "logging_level": "ERROR", "log_to_driver": False}  # its own Ray, whatever RAY_ADDRESS
    assert run.stopped == [False]
    assert run.lines[0] == "starting the simulation engine (Ray, 3 CPU(s)) and 2 tier process(es)..."
    runner.simulate(SMALL, progress=run.lines.append)  # one client: one CPU
    assert run.ray_args[-1]["num_cpus"] == 1
    # this process's cores (pid 0), not another process's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0} if pid == 0 else {0, 1, 2, 3})
    runner.simulate(SMALL.with_(clients=4), progress=run.lines.append)
    assert run.ray_args[-1]["num_cpus"] == 1


def test_the_engine_gets_one_cpu_and_no_gpu_per_virtual_client(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ray is already up (the runner started it): the engine only sizes each ClientApp actor."""
    run = _fake(monkeypatch, tmp_path)
    runner.simulate(SMALL.with_(clients=2), progress=run.lines.append)
    assert run.engine[-1]["backend_config"] == {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    assert run.engine[-1]["num_supernodes"] == 2


def test_the_session_watcher_is_told_of_the_run_s_own_coordinator_token_only(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The token the tiers made for the run is a secret removed even if the runner is killed; a token file the
    user gave is theirs, never removed."""
    run = _fake(monkeypatch, tmp_path, token="/tmp/splitfed-coordinator-token-x")
    runner.simulate(SMALL, progress=run.lines.append)
    (watch,) = _Watch.made
    assert watch.session == run.session and watch.released
    assert watch.removed == [Path("/tmp/splitfed-coordinator-token-x")]
    mine = tmp_path / "mine.token"
    run = _fake(monkeypatch, tmp_path / "2", token=str(mine))
    runner.simulate(SMALL.with_(coordinator_token_file=str(mine)), progress=run.lines.append)
    (watch,) = _Watch.made
    assert watch.removed == [] and watch.released


def test_no_session_folder_no_watcher(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Ray whose session folder is not found: nothing to watch, and the run still returns its summary."""
    run = _fake(monkeypatch, tmp_path, session=False)
    assert runner.simulate(SMALL, progress=run.lines.append) == {"rounds": 1}
    assert _Watch.made == []


def test_a_run_that_ends_or_is_stopped_removes_its_ray_session(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Only a failed run keeps Ray's logs: a Ctrl-C is a stop, as asked."""
    run = _fake(monkeypatch, tmp_path)
    runner.simulate(SMALL, progress=run.lines.append)
    assert run.session is not None and not run.session.exists()

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    run = _fake(monkeypatch, tmp_path / "2", engine=ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        runner.simulate(SMALL, progress=run.lines.append)
    assert run.session is not None and not run.session.exists()


def test_an_engine_failure_is_recorded_in_the_run_folder_and_said_once(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The folder's record names the engine's failure (not the ServerApp's stop that follows); the error names
    Ray's logs itself, so no second "the run failed" line is printed. No folder, nothing recorded."""
    def crash() -> None:
        raise RuntimeError("Simulation engine crashed") from OSError("the raylet died")

    run = _fake(monkeypatch, tmp_path, engine=crash)
    out = tmp_path / "run"
    with pytest.raises(runner.SimulationError, match="OSError: the raylet died"):
        runner.simulate(SMALL.with_(out=str(out)), progress=run.lines.append)
    assert run.failures == [(str(out), "the simulation engine failed: OSError: the raylet died")]
    assert not any("the run failed" in line for line in run.lines)
    assert run.session is not None and run.session.is_dir()  # kept: the error names its logs
    run = _fake(monkeypatch, tmp_path / "2", engine=crash)
    with pytest.raises(runner.SimulationError):
        runner.simulate(SMALL, progress=run.lines.append)
    assert run.failures == []


def test_a_ray_still_up_at_the_end_is_shut_down(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Flower's engine shuts Ray down itself; one it left up is shut down by the runner, once."""
    run = _fake(monkeypatch, tmp_path, ray_up=True)
    runner.simulate(SMALL, progress=run.lines.append)
    assert run.shutdowns == [True]
    run = _fake(monkeypatch, tmp_path / "2", ray_up=False)
    runner.simulate(SMALL, progress=run.lines.append)
    assert run.shutdowns == []


def test_a_flwr_level_the_caller_set_after_a_stop_is_kept(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A stop silenced Flower's logger; a caller that set its own level since is not overridden by the level
    from before the stop."""
    monkeypatch.setattr(runner, "_level_before_silence", None)
    flwr = logging.getLogger("flwr")
    flwr.setLevel(logging.INFO)
    runner._silence_flwr()
    flwr.setLevel(logging.DEBUG)
    assert runner._flwr_as_the_caller_left_it() == logging.DEBUG
    assert flwr.level == logging.DEBUG


_BATCHNORM = RunSettings(model="tests.own_models:digits_batchnorm", clients=2, rounds=1, cuts="static:1,3",
                         batch_size=718)


def _clients(*samples: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(client_id=f"client{i}", samples=n) for i, n in enumerate(samples)]


def test_batch_size_one_makes_every_batch_one_sample() -> None:
    """Batch size 1 is refused for a BatchNorm model whatever the client's samples; batch size 2 on an even
    count leaves no batch of one."""
    with pytest.raises(ConfigError, match=r"^client0 has 4 sample\(s\): with batch size 1 its last batch holds one"):
        runner.one_sample_batches(_BATCHNORM.with_(batch_size=1), _clients(4))
    runner.one_sample_batches(_BATCHNORM.with_(batch_size=2), _clients(4, 6))


def test_a_one_sample_refusal_counts_the_other_clients_alike() -> None:
    """The first client is named, the others counted; a client alone is named with no count."""
    with pytest.raises(ConfigError, match=r"holds one sample \(and 2 more client\(s\)\), and model "):
        runner.one_sample_batches(_BATCHNORM.with_(batch_size=4), _clients(5, 9, 8, 13))
    with pytest.raises(ConfigError, match=r"holds one sample \(and 1 more client\(s\)\), and model "):
        runner.one_sample_batches(_BATCHNORM.with_(batch_size=4), _clients(5, 9))
    with pytest.raises(ConfigError) as e:
        runner.one_sample_batches(_BATCHNORM.with_(batch_size=4), _clients(5, 8))
    assert "more client" not in str(e.value)


_TWO_MCU_FLEET = """
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "mcu"
flops = 2e7
memory_mb = 0.25
up_mbps = 0.7
down_mbps = 0.7
rtt_ms = 50
[[device]]
name = "mcu2"
flops = 2e7
memory_mb = 0.2
up_mbps = 0.7
down_mbps = 0.7
rtt_ms = 50
"""


def _static_refusal(tmp_path: Path, fleet_text: str, cuts: str) -> str:
    from splitfed.flower.policy import make_policy
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.inprocess import sim_clients

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_text)
    settings = RunSettings(fleet=str(fleet), clients=2, rounds=1, cuts=cuts)
    with pytest.raises(ConfigError) as e:
        runner.static_fits(settings, make_policy(settings), sim_clients(settings, fleet_for(settings)))
    return str(e.value)


def test_a_static_refusal_counts_the_other_devices_that_cannot_hold_their_cuts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two fleet entries too small: the first is named, the other counted; one alone is named with no count."""
    err = _static_refusal(tmp_path, _TWO_MCU_FLEET, "static:7,7")
    assert "; 1 more device(s) or cuts alike; give it cuts" in err, err
    one = _TWO_MCU_FLEET.replace('name = "mcu2"', 'name = "pi"\nprofile = "rpi4"').replace(
        "memory_mb = 0.2\n", "")
    err = _static_refusal(tmp_path, one, "static:7,7")
    assert "more device(s)" not in err and "do not fit fleet device 'mcu'" in err, err
