"""What ``splitfed.sim.runner`` promises (from its static-cut check on) that its mutation run found unpinned.

A static cut whose server segments need exactly the memory the fleet gives its server fits (only more is
refused). ``validate`` refuses a tier torch device this machine cannot compute on when the run starts its own
tiers, and takes a one-client run.

The stop on Ctrl-C/SIGTERM (``_Signals``): outside any phase a signal raises at once; while Ray starts it is only
noted (raised after, by ``reraise``); inside Flower's engine the first one sets the ServerApp's stop and Flower's
own (``f_stop``) and kills the actor pool's actors (for good: ``no_restart``), unless Flower has set its stop
already, and a second one raises at once. The engine's backend and stop are kept when Flower passes them by
position. A signal while the handlers are given back is acted on once they are back. Progress lines end when the
interrupt is raised.

Signals are handed to ``_handle`` directly (as Python would call it in the main thread), and Flower's
``run_api`` is a stand-in that does what the engine does at that moment: no Ray, no Flower run.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from splitfed.errors import ConfigError, Terminated
from splitfed.flower.config import RunSettings
from splitfed.sim import runner

_EDGE_FLEET = ('[edge]\nprofile = "edge-server"\nmemory_mb = {mib}\n[cloud]\nprofile = "cloud-gpu"\n'
               '[[device]]\nname = "pi"\nprofile = "rpi4"\ncount = 2\n')


# ---------------------------------------------------------------- validate


def test_static_cuts_whose_server_segments_need_exactly_its_memory_fit(tmp_path: Path) -> None:
    """Cuts 0,7 of 2 cnn clients need 1216256 bytes (1.159912109375 MiB, exact in binary) on the edge: a
    fleet giving it exactly that is let through, a byte less is refused."""
    fleet = tmp_path / "edge.toml"
    fleet.write_text(_EDGE_FLEET.format(mib=1216256 / 2**20))
    settings = RunSettings(fleet=str(fleet), clients=2, rounds=1, cuts="static:0,7")
    runner.validate(settings)
    fleet.write_text(_EDGE_FLEET.format(mib=1216255 / 2**20))
    with pytest.raises(ConfigError, match=r"cuts 0,7 overflow the fleet's edge: its segments of the 2 clients need "
                                          r"1\.159912 MiB of its 1\.159911 MiB"):
        runner.validate(settings)


def test_a_tier_torch_device_this_machine_lacks_is_refused_when_the_run_starts_its_tiers() -> None:
    """The settings check only its form (the tiers may run elsewhere); with no --addresses the tiers run here."""
    settings = RunSettings(clients=2, rounds=1, model="mlp", tier_torch_device="cuda:63")
    with pytest.raises(ConfigError, match=r"tier-torch-device cuda:63: this machine has"):
        runner.validate(settings)


def test_a_one_client_run_is_valid() -> None:
    """The samples checked are client 0's, which every run has."""
    runner.validate(RunSettings(clients=1, rounds=1, model="mlp", cuts="static:1,3"))


# ---------------------------------------------------------------- signals


def _noted(signals: runner._Signals, signum: int) -> None:
    """A signal that must not raise (a stray interrupt would end the whole pytest session, not fail the test)."""
    try:
        signals._handle(signum, None)
    except KeyboardInterrupt:
        pytest.fail(f"signal {signum} raised at once")


def test_outside_any_phase_a_signal_raises_at_once_also_after_the_engine_and_ray_start() -> None:
    """Before Ray starts, and after Flower's engine returned (nothing left to stop), Ctrl-C is an interrupt."""
    with pytest.raises(KeyboardInterrupt):
        runner._Signals(threading.Event())._handle(signal.SIGINT, None)
    after_engine = runner._Signals(threading.Event())
    with after_engine.engine():
        pass
    with pytest.raises(KeyboardInterrupt):
        after_engine._handle(signal.SIGINT, None)
    after_start = runner._Signals(threading.Event())
    with after_start.starting():
        pass
    with pytest.raises(Terminated):
        after_start._handle(signal.SIGTERM, None)


def test_a_signal_while_ray_starts_is_noted_and_raised_after() -> None:
    """Raised inside Ray's start it could land in an after-fork hook, where Python drops it."""
    signals = runner._Signals(threading.Event())
    with signals.starting():
        _noted(signals, signal.SIGINT)
        assert signals.received == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        signals.reraise()


def _stand_in(monkeypatch: pytest.MonkeyPatch, body: Any) -> Any:
    """Flower's ``run_api`` replaced by ``body(backend_fn, f_stop)``; returns ``vce_api`` (what start_vce calls)."""
    from flwr.server.superlink.fleet.vce import vce_api

    def run_api(backend_fn, f_stop=None):  # type: ignore[no-untyped-def]
        return body(backend_fn, f_stop)

    monkeypatch.setattr(vce_api, "run_api", run_api)
    return vce_api


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, bool]]:
    import ray

    seen: list[tuple[Any, bool]] = []
    monkeypatch.setattr(ray, "kill", lambda actor, no_restart=True: seen.append((actor, no_restart)))
    return seen


def test_the_engines_backend_and_stop_passed_by_position_are_kept(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Flower 1.42 passes them positionally: the pool whose actors a stop kills is the one Flower built."""
    pool, f_stop = object(), threading.Event()
    vce_api = _stand_in(monkeypatch, lambda backend_fn, f: backend_fn())
    signals = runner._Signals(threading.Event())
    with signals.engine():
        assert vce_api.run_api(lambda: pool, f_stop) is pool
    assert signals.backend is pool and signals.flower_stop is f_stop


def test_the_first_signal_in_the_engine_stops_flower_and_kills_its_actors(monkeypatch, kills) -> None:  # type: ignore[no-untyped-def]
    """Not raised (it would unwind Flower's run_api while its threads are inside Ray): both stops set, every actor,
    idle or busy, killed for good, so that a thread waiting on one is answered now; the interrupt comes after."""
    stop, f_stop = threading.Event(), threading.Event()
    signals = runner._Signals(stop)
    backend = SimpleNamespace(pool=SimpleNamespace(num_actors=2, pool=["idle"], _future_to_actor={"f": "busy"}))

    def engine(backend_fn, f):  # type: ignore[no-untyped-def]
        backend_fn()
        _noted(signals, signal.SIGINT)
        return "wound down"

    vce_api = _stand_in(monkeypatch, engine)
    with signals.engine():
        assert vce_api.run_api(lambda: backend, f_stop) == "wound down"
    assert stop.is_set() and f_stop.is_set()
    assert kills == [("idle", True), ("busy", True)]
    with pytest.raises(KeyboardInterrupt):
        signals.reraise()


@pytest.mark.parametrize("case", ["flower stopping", "no f_stop", "no pool", "pool empty", "pool of another kind"])
def test_the_first_signal_in_the_engine_kills_no_actor_when_there_is_none_to_kill(monkeypatch, kills, case) -> None:  # type: ignore[no-untyped-def]
    """Flower's stop already set (it is shutting Ray down), a Flower without f_stop, no pool yet, one still being
    filled (num_actors 0), or one without ``num_actors``: the ServerApp's stop alone, no actor killed."""
    stop = threading.Event()
    signals = runner._Signals(stop)
    f_stop: threading.Event | None = threading.Event()
    pool: Any = SimpleNamespace(num_actors=2, pool=["idle"], _future_to_actor={})
    if case == "flower stopping":
        assert f_stop is not None
        f_stop.set()
    elif case == "no f_stop":
        f_stop = None
    elif case == "no pool":
        pool = None
    elif case == "pool empty":
        pool.num_actors = 0
    else:
        del pool.num_actors

    def engine(backend_fn, f):  # type: ignore[no-untyped-def]
        backend_fn()
        _noted(signals, signal.SIGINT)

    vce_api = _stand_in(monkeypatch, engine)
    with signals.engine():
        vce_api.run_api(lambda: SimpleNamespace(pool=pool), f_stop)
    assert stop.is_set() and kills == []


def test_a_second_signal_in_the_engine_does_not_wait(monkeypatch, kills) -> None:  # type: ignore[no-untyped-def]
    stop = threading.Event()
    signals = runner._Signals(stop)
    firsts: list[bool] = []

    def engine(backend_fn, f):  # type: ignore[no-untyped-def]
        _noted(signals, signal.SIGINT)
        firsts.append(stop.is_set())
        signals._handle(signal.SIGTERM, None)
        firsts.append(False)  # not reached

    vce_api = _stand_in(monkeypatch, engine)
    with pytest.raises(Terminated), signals.engine():
        vce_api.run_api(lambda: None, threading.Event())
    assert firsts == [True] and signals.received == signal.SIGINT


def test_a_signal_while_the_handlers_are_given_back_is_acted_on_once_they_are_back() -> None:
    """Raised halfway, it would leave this process's handlers half given back."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signals = runner._Signals(threading.Event())
    replaced = signals.install()
    try:
        assert set(replaced) == {signal.SIGINT, signal.SIGTERM}
        close = signals.relay.close

        def closing() -> None:
            close()
            signals._handle(signal.SIGINT, None)  # Ctrl-C arrives while uninstall gives the handlers back

        signals.relay.close = closing  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            signals.uninstall(replaced)
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def test_progress_lines_end_when_the_interrupt_is_raised() -> None:
    """A thread still winding down cannot print after the command's last line."""
    lines: list[str] = []
    signals = runner._Signals(threading.Event())
    said = signals.progress(lines.append)
    said("round 1/3")
    with pytest.raises(KeyboardInterrupt):
        signals._handle(signal.SIGINT, None)
    said("round 2/3")
    assert lines == ["round 1/3"]
