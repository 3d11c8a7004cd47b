"""``splitfed simulate``: a fleet of virtual clients in Flower's simulation engine.

The runner starts the tier servers (edge and cloud processes on 127.0.0.1, random
free ports), then Flower's simulation engine with ``clients`` virtual nodes
(Ray actors, 1 CPU each, at most one per core) running the ClientApp, and the
ServerApp in this process. Ray is started first, by the runner, so a start that
times out is retried before anything else exists (``splitfed.sim.ray_start``).
Every process it started is stopped on the way out:
normal end, error or Ctrl-C (the ServerApp polls a stop flag, Flower's engine
winds down and shuts Ray down, the tier processes are stopped by their context
manager). Ray's session folder (``/tmp/ray/session_...``) is removed once Ray is
down, unless the run failed: then it is kept, and the failure names its logs. A runner killed outright
(SIGKILL) cannot do any of that: a watcher process (``SessionWatch``) then stops what is left of its Ray
(its agents outlive it otherwise) and removes the session folder; the tier processes stop themselves.
A closed stdout (``| head``) ends the run as a Unix tool ends (exit 141), not as a failure.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitfed import cache
from splitfed.cli import output_gone
from splitfed.errors import ConfigError, CutError, SplitfedError, Terminated
from splitfed.flower import runfolder
from splitfed.flower.config import RunSettings
from splitfed.sim.ray_start import (
    RayStartError,
    SessionWatch,
    check_socket_room,
    own_sessions,
    remove_session,
    session_dir,
    shutdown_ray,
    start_ray,
)
from splitfed.sim.signal_relay import SignalRelay
from splitfed.sim.tiers import start_tiers
from splitfed.units import mib_pair

if TYPE_CHECKING:
    from flwr.app import ConfigRecordValues

    from splitfed.flower.checkpoint import Checkpoint
    from splitfed.profile.fleet import Fleet


_SILENT = logging.CRITICAL + 1
_level_before_silence: int | None = None  # the ``flwr`` logger's level before a stopped run silenced it


def _silence_flwr(caller_level: int | None = None) -> None:
    """Silence the ``flwr`` logger: after a second Ctrl-C, Flower's engine threads may log on after the run
    has returned. Until the next run of this process (:func:`_flwr_as_the_caller_left_it`), not for good: a
    notebook that stopped one run saw no Flower log in any later one. ``caller_level``: the level to give back
    (the one the run found), else the level now."""
    global _level_before_silence
    flwr = logging.getLogger("flwr")
    if caller_level is not None:
        _level_before_silence = caller_level
    elif flwr.level != _SILENT:
        _level_before_silence = flwr.level
    flwr.setLevel(_SILENT)


def _flwr_as_the_caller_left_it() -> int:
    """The ``flwr`` logger's level as the caller set it, given back if a stopped run silenced it since."""
    global _level_before_silence
    flwr = logging.getLogger("flwr")
    if _level_before_silence is not None and flwr.level == _SILENT:
        flwr.setLevel(_level_before_silence)
    _level_before_silence = None
    return flwr.level


class SimulationError(SplitfedError):
    """Flower's simulation engine (Ray) failed; the message names the root cause."""

    exit_code = 1


def simulate(settings: RunSettings, progress: Callable[[str], None] = print, verbose: bool = False,
             cpus: int | None = None, resumed: Checkpoint | None = None) -> dict[str, Any]:
    """Run the simulation; returns the run's summary (also in ``out/summary.json``). ``resumed``: the
    checkpoint a resume read already, handed to the ServerApp (read again only if the file changed since).
    The run folder is held from now (:func:`runfolder.reserve`): a second run into it is refused before this
    one's Ray starts, not once its own has."""
    if not settings.out:
        return _simulate(settings, progress, verbose, cpus, resumed)
    with runfolder.reserve(settings.out, settings.resume, settings.overwrite) as held:
        return _simulate(settings, progress, verbose, cpus, resumed, held)


def _simulate(settings: RunSettings, progress: Callable[[str], None], verbose: bool, cpus: int | None,
              resumed: Checkpoint | None, held: runfolder.Reservation | None = None) -> dict[str, Any]:
    check_socket_room()  # a folder Ray cannot start in: refused before anything is said, imported or started
    cpus = cpus or max(1, min(len(os.sched_getaffinity(0)), settings.clients))
    tiers = (f"using the tiers at {', '.join(settings.addresses)}" if settings.addresses
             else f"and {settings.tiers - 1} tier process(es)"
             + (f" on {settings.tier_torch_device}" if settings.tier_torch_device != "cpu" else ""))
    progress(f"starting the simulation engine (Ray, {cpus} CPU(s)) {tiers}...")  # before its imports: seconds
    from flwr.simulation import run_simulation

    from clients.app import app as client_app
    from server.app import build_app

    progress(draw_note(settings))
    if note := late_drift_note(settings):
        progress(note)
    quiet = ExpectedWarnings()
    flwr_level = _flwr_as_the_caller_left_it()
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
        logging.getLogger("flwr").addFilter(quiet)
    stop = threading.Event()
    signals = _Signals(stop)
    summary: dict[str, Any] = {}
    before: dict[int, Any] = {}
    interrupted = False
    session = None  # Ray's session folder, once Ray is up
    watch: SessionWatch | None = None  # tidies up after this process if it is killed outright
    failed = True
    cache.pin()  # before Ray and the tiers start: every process of the run then keeps to one cache
    began = time.time()
    try:
        before = signals.install()
        try:
            with signals.starting():
                # a Ray of the run's own, even where RAY_ADDRESS names a running one (a Ray cluster's node sets
                # it): the run's clients reach its tiers on 127.0.0.1, and its CPU count is the run's to choose
                start_ray({"address": "local", "num_cpus": cpus, "num_gpus": 0, "include_dashboard": False,
                           "logging_level": "INFO" if verbose else "ERROR", "log_to_driver": verbose}, log=progress,
                          stopped=lambda: signals.received is not None)
        except RayStartError as e:
            signals.reraise()  # stopped while Ray failed to start: the run was stopped, as asked
            raise SimulationError(f"the simulation engine failed: {e}") from e
        session = session_dir()
        watch = SessionWatch(session) if session is not None else None
        signals.install()  # again, should a Ray that ``starting`` cannot keep from it have put its own in
        signals.reraise()  # a signal while Ray started: the run stops now, before anything else starts
        if not settings.addresses:  # Ray's start and the tiers' each take seconds (20 s together on a busy machine)
            progress(f"Ray is up; starting {settings.tiers - 1} tier process(es)...")
        with start_tiers(settings) as chain:
            if watch is not None and chain.coordinator_token_file and not settings.coordinator_token_file:
                watch.also_remove(Path(chain.coordinator_token_file))  # the run's own secret: never left behind
            run_settings = settings.with_(tier_addresses=",".join(chain.addresses),
                                          coordinator_token_file=chain.coordinator_token_file)
            progress(f"tiers: {', '.join(chain.addresses)}; {settings.clients} virtual clients on {cpus} CPU(s)")
            said = signals.progress(progress)

            def finished(result: dict[str, Any]) -> None:  # the ServerApp's last word: what follows takes seconds
                summary.update(result)
                said(_stopping_line(settings))

            server_app = build_app(run_settings, said, stop=stop, on_summary=finished,
                                   recorded_as=settings, resumed=resumed, reservation=held)
            backend: dict[str, dict[str, ConfigRecordValues]] = {  # Ray is already up
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
            try:
                with signals.engine():
                    run_simulation(server_app, client_app, num_supernodes=settings.clients, backend_config=backend,
                                   verbose_logging=verbose)
            except Exception as e:
                signals.reraise()  # the run ended because of a signal: what it raised is that stop's echo
                if not isinstance(e, RuntimeError):
                    raise
                root: BaseException = e  # Flower wraps runtime failures (e.g. Ray not starting) in this
                while root.__cause__ is not None:
                    root = root.__cause__
                why = f"the simulation engine failed: {type(root).__name__}: {root}"
                if settings.out:  # the ServerApp is stopped below for it: its folder records this, not the stop
                    runfolder.failed_elsewhere(settings.out, why)
                raise SimulationError(f"{why}{_logs_at(session)}") from e
            finally:
                stop.set()
            signals.reraise()  # a signal that came as the engine finished: the run still ends as stopped
        failed = False
    except KeyboardInterrupt:
        # a second Ctrl-C may leave Flower's engine threads behind, still logging after this returns
        interrupted = True
        failed = False  # stopped, as asked: Ray's logs hold nothing the user needs
        _silence_flwr(flwr_level)
        raise
    except ConfigError:  # a refusal (the folder in use, say): Ray's logs hold nothing about it
        failed = False
        raise
    except Exception as e:
        if output_gone(e):  # its reader went (``| head``): the run ends as a Unix tool does, not as a failure
            failed = False
            raise
        if session is not None and not isinstance(e, SimulationError):  # a SimulationError names them itself
            progress(f"the run failed; Ray's logs are kept in {session / 'logs'}")
        raise
    finally:
        try:
            shutdown_ray()  # Flower's engine shut Ray down itself, unless a second signal cut that short
            logging.getLogger("flwr").removeFilter(quiet)
            if not interrupted:
                logging.getLogger("flwr").setLevel(flwr_level)  # a caller's own Flower logging is as it was
            if not failed:  # its own session only, once none of its processes is left
                for s in [session] if session is not None else own_sessions(began):  # (Ctrl-C while Ray started)
                    remove_session(s)
            if watch is not None:
                watch.release()
        finally:  # last: a signal it holds back is raised once all else is done (a second one cut that short)
            try:
                # stopped by one signal: the engine wound down, so the metrics are whole. Not after a second
                # signal (threads may still write) or a failure; a signal while drawing stops it (drafts removed)
                if interrupted and not signals.repeated and settings.out:
                    stopped_figures(settings.out, progress)
            finally:
                signals.uninstall(before)
    return summary


def _stopping_line(settings: RunSettings) -> str:
    """Said once the ServerApp has its summary: Flower's engine then shuts Ray down, the tier processes the run
    started stop and Ray's session folder is removed once its processes are gone (2-6 s, without a word
    before)."""
    tiers = "" if settings.addresses else f" and {settings.tiers - 1} tier process(es)"
    return f"shutting down the simulation engine (Ray){tiers}..."


def late_drift_note(settings: RunSettings) -> str:
    """A line naming the drawn devices whose fleet drift comes after the run's last round ("" when none): it is
    never applied. Said, not refused: a fleet serves runs of any length (the shipped ``small`` drifts at round 5,
    and a run's default is 3 rounds). Every backend says it (simulate, in-process, ``flwr run``'s ServerApp), so
    it names no one spelling of the rounds (``--rounds``, ``num-server-rounds``)."""
    from splitfed.sim.clock import fleet_for

    late = fleet_for(settings).drifts_after(settings.rounds)
    if not late:
        return ""
    last = (f"the run's last round ({settings.rounds}): never applied (a run of {max(late.values())} or more rounds "
            "would apply")
    if len(late) == 1:
        [(kind, r)] = late.items()
        return f"note: fleet {settings.fleet!r}: device {kind!r} drifts at round {r}, after {last} it)"
    which = ", ".join(f"{kind!r} (round {r})" for kind, r in late.items())
    return f"note: fleet {settings.fleet!r}: devices {which} drift after {last} them)"


_DRAWN_SHOWN = 8  # device classes the draw's line names: one line, however large the fleet


def draw_note(settings: RunSettings, drawn: Fleet | None = None) -> str:
    """The line that names the run's clients: dealt from the fleet's devices
    (:meth:`~splitfed.profile.fleet.Fleet.sample`), so ``--clients`` equal to the fleet's size trains the fleet as
    listed, fewer a subset drawn by the seed, more each device as often as it goes in and a subset for the rest.
    Every backend says it, as :func:`late_drift_note`. ``drawn``: the draw, if made already."""
    from splitfed.profile.fleet import load_fleet
    from splitfed.sim.clock import fleet_for

    drawn = drawn if drawn is not None else fleet_for(settings)
    kinds = sorted(drawn.kinds.items(), key=lambda kn: -kn[1])  # most first; a tie in the fleet file's order
    shown = ", ".join(f"{n} {kind}" for kind, n in kinds[:_DRAWN_SHOWN])
    if len(kinds) > _DRAWN_SHOWN:
        shown += f", and {len(kinds) - _DRAWN_SHOWN} more"
    n, size = len(drawn.clients), len(load_fleet(settings.fleet).clients)
    whole, part = divmod(n, size)
    times = {1: "once", 2: "twice"}.get(whole, f"{whole} times")
    if size == 1:  # one device: each client is it
        how = (f"the device of fleet {settings.fleet!r}" if n == 1
               else f"{n} from fleet {settings.fleet!r}: its one device {times}")
    elif whole == 1 and not part:
        how = f"the {size} devices of fleet {settings.fleet!r}"
    elif not whole:
        how = f"{n} of the {size} devices of fleet {settings.fleet!r}, drawn by seed {settings.seed}"
    else:
        how = (f"{n} from fleet {settings.fleet!r}: each of its {size} devices {times}"
               + (f", and {part} more drawn by seed {settings.seed}" if part else ""))
    return f"clients: {how}: {shown}"


def stopped_figures(out: str, progress: Callable[[str], None]) -> int:
    """Draw in ``out`` the standard figures of the rounds a stopped run did, as ``splitfed simulate`` draws a
    finished run's; how many. One that cannot be drawn is said, not raised: the stop is the run's outcome, and
    ``splitfed report`` can draw them later."""
    from splitfed.flower.metrics import METRICS
    from splitfed.report.plots import standard_plots
    from splitfed.report.runs import load_run

    metrics = Path(out) / METRICS
    try:
        if not metrics.is_file() or not metrics.stat().st_size:  # stopped before its first round was written
            return 0
        run = load_run(Path(out), label="run")
        drawn = len(standard_plots([run], out))
    except Exception as e:  # noqa: BLE001 - any failure to draw: the folder is as it was (standard_plots)
        progress(f"the figures of the rounds done were not drawn ({e}); draw them with: splitfed report "
                 f"{shlex.quote(out)}")
        return 0
    if drawn:
        progress(f"stopped: {drawn} figure(s) of the {len(run.rounds)} round(s) done are in {out}")
    return drawn


def _logs_at(session: Path | None) -> str:
    return f" (Ray's logs are kept in {session / 'logs'})" if session is not None else ""


def one_sample_batches(settings: RunSettings, clients: Sequence[Any]) -> None:
    """A client whose last batch would hold one sample, of a model that cannot train on one (BatchNorm), is
    refused now: it would fail every round, each time dropped from it."""
    from splitfed.engine import template

    b = settings.batch_size
    short = [c for c in clients if c.samples % b == 1 or (b == 1 and c.samples)]  # batch size 1: every batch
    if not short or not (why := template.one_sample_error(settings.spec)):
        return
    c = short[0]
    more = f" (and {len(short) - 1} more client(s))" if len(short) > 1 else ""
    raise ConfigError(f"{c.client_id} has {c.samples} sample(s): with batch size {b} its last batch holds one "
                      f"sample{more}, and model {settings.spec.name} cannot train on one ({why}); choose another "
                      "batch size or number of clients")


def static_fits(settings: RunSettings, policy: Any, clients: Sequence[Any]) -> None:
    """Static cuts that a device's or a server tier's memory cannot hold are refused, as ``splitfed optimize
    --static`` refuses them: the simulated clock would price a round no such tier could train (adaptive plans within every
    tier's memory; greedy within each device's, and each server's as if the server were the device's alone)."""
    from splitfed.cost import evaluate
    from splitfed.flower.adaptive import scenario

    sc = scenario(settings, clients)
    cost = evaluate(sc, policy.assign(1, clients))
    short: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    need: dict[tuple[str, tuple[int, ...]], tuple[float, float]] = {}
    for info, client, cc in zip(clients, sc.clients, cost.clients, strict=True):
        if not cc.fits_device:
            key = (client.kind, tuple(cc.cuts))  # the fleet entry the user wrote
            short.setdefault(key, []).append(info.client_id)
            need[key] = (cc.memory[0], client.device.memory)
    if short:
        key, who = next(iter(short.items()))
        more = f"; {len(short) - 1} more device(s) or cuts alike" if len(short) > 1 else ""
        needs, has = mib_pair(*need[key])
        raise ConfigError(f"cuts {','.join(map(str, key[1]))} do not fit fleet device {key[0]!r} "
                          f"({', '.join(who[:3])}{', ...' if len(who) > 3 else ''}): they need {needs} "
                          f"of its {has}{more}; give it cuts that keep fewer blocks on the "
                          "device (static:K1,K2/K1,K2 deals cut vectors out by client) or use --cuts adaptive")
    for name, cap in zip(sc.tier_names[1:], sc.memory_caps, strict=True):  # nor one its servers cannot hold
        if cost.shared_memory[name] > cap:
            needs, has = mib_pair(cost.shared_memory[name], cap)
            raise ConfigError(f"cuts {settings.cuts.removeprefix('static:')} overflow the fleet's {name}: its "
                              f"segments of the {len(clients)} clients need {needs} of "
                              f"its {has}; give it cuts that keep more blocks on the devices, more memory "
                              "in the fleet file, or use --cuts adaptive")


_STOPPING = (signal.SIGINT, signal.SIGTERM)


class _Signals:
    """Ctrl-C and SIGTERM stop the run the same way, every process stopped and the last checkpoint kept:
    :class:`KeyboardInterrupt` (:class:`Terminated` for SIGTERM) leaves :func:`simulate`.

    Outside Flower's engine the handler raises it at once. Inside (:meth:`engine`) it must not: raised in
    the main thread, it would unwind Flower's ``run_api`` (flwr/server/superlink/fleet/vce/vce_api.py)
    out of the ``with ThreadPoolExecutor()`` that joins its worker threads, into its ``finally``, where
    ``backend.terminate()`` calls ``ray.shutdown()`` (vce/backend/raybackend.py) while those threads may
    be inside ``ray.get`` or ``.remote()`` still. The next one to touch Ray then either finds its core
    worker gone, and Ray's C++ side ends the process ("core worker has already been shutdown ... The
    process will exit") with Ray's exit code and last line, or starts a new Ray of its own.

    So the first signal only sets the stop events, the ServerApp's (``stop``, which it polls) and Flower's
    own (``f_stop``), and kills the ClientApp actors, so that a worker thread waiting on one (a client's
    turn, an actor still starting) is answered now, not when that work is done. Flower's worker threads
    end, are joined, and only then does Flower shut Ray down; ``run_simulation`` returns or raises, and
    :meth:`reraise` turns that into the interrupt. ``f_stop`` and the actors are Flower's internals, kept
    as ``run_api`` is called; where a Flower version lacks them, the ServerApp's end sets ``f_stop`` and
    the threads finish the message in hand: slower, as sound. A second signal does not wait (and may
    meet the race above).

    Flower's main thread waits in an untimed ``join`` for the whole run; a signal the kernel gives to
    another thread (a Ray or gRPC one) does not wake it, so its handler ran only once the run had trained
    to its end. A :class:`~splitfed.sim.signal_relay.SignalRelay` sees such a signal, decides it
    (:meth:`_decide`), and sends it to the main thread again, whose handler acts on it (:meth:`_act`).

    Flower's logger is silenced at the first signal: what its threads log as the run winds down (the
    actors killed, the ServerApp's stop) is this stop's echo, not news. The ServerApp's progress lines
    (:meth:`progress`) end when the interrupt is raised: a thread still winding down cannot print after
    the command's last line.
    """

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.flower_stop: threading.Event | None = None  # Flower's engine's f_stop, once run_api has it
        self.backend: Any = None  # Flower's RayBackend (its actor pool), once built
        self.received: int | None = None  # the first signal's number
        self.repeated = False  # a second signal came: the run did not wind down as the first asks
        self.waiting = False  # inside the engine: the first signal stops the run instead of raising
        self.deferring = False  # while Ray starts: signals are noted, raised after (starting)
        self.ended = False  # the interrupt is raised: no more progress lines
        self.lock = threading.RLock()  # reentrant: the handler may run while the main thread holds it
        self.ignored: set[int] | None = None  # the signals this process was started ignoring, at install
        self.relay = SignalRelay(self._decide, _STOPPING)  # a signal a thread other than the main one took
        self.todo: list[tuple[int, bool]] = []  # for the main thread: (signal, whether the first)
        self.holding = False  # while the handlers are given back: what a signal asks waits until done

    def install(self) -> dict[int, Any]:
        """Handle SIGINT and SIGTERM, but not one this process was started ignoring (a background job's
        SIGINT: the user's Ctrl-C is meant for the job in the foreground); returns the handlers replaced ({}:
        not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        if self.ignored is None:  # as started, not as Ray's start may have left them
            self.ignored = {sig for sig in _STOPPING if signal.getsignal(sig) is signal.SIG_IGN}
        replaced: dict[int, Any] = {sig: signal.signal(sig, self._handle) for sig in _STOPPING if sig not in self.ignored}
        if replaced:
            self.relay.open()
        return replaced

    def uninstall(self, replaced: dict[int, Any]) -> None:
        """Give back the handlers :meth:`install` replaced. A signal meanwhile is acted on once they are back:
        raised halfway, it would leave this process's signals half given back."""
        self.holding = True
        try:
            self.relay.close()
            for sig, handler in replaced.items():
                signal.signal(sig, handler)
        finally:
            self.holding = False
        self._act()

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Around Ray's start: a signal is only noted (:meth:`reraise` raises it after). Raised at once it
        may land in the after-fork hook of a process Ray spawns (``logging._releaseLock``), where Python drops
        it ("Exception ignored"), leaving logging's lock held: the run went on, then hung. So Ray's start may
        not put in its own SIGTERM handlers either (``ray.init``'s and its node's ``sys.exit``, met in the same
        hooks: the run went on, or exited 15 keeping Ray's session folder); a ``SystemExit(15)`` that still
        comes (a Ray that installs them otherwise) is this stop too. A start that fails is not tried again
        once stopped; a second signal does not wait (as in the engine)."""
        self.deferring = True
        ray_utils: Any = None
        installs: Any = None
        try:
            import ray._private.utils

            ray_utils = ray._private.utils
            installs = ray_utils.set_sigterm_handler
            ray_utils.set_sigterm_handler = lambda handler: None
        except (ImportError, AttributeError):  # another Ray: SystemExit(15) below, and install() after
            ray_utils = None
        try:
            yield
        except SystemExit as e:
            if e.code != signal.SIGTERM:
                raise
            self._note(signal.SIGTERM)
        finally:
            if ray_utils is not None:
                ray_utils.set_sigterm_handler = installs
            self.deferring = False

    def progress(self, say: Callable[[str], None]) -> Callable[[str], None]:
        def said(line: str) -> None:
            with self.lock:
                if not self.ended:
                    say(line)
        return said

    @contextmanager
    def engine(self) -> Iterator[None]:
        """Around ``run_simulation``: signals stop it (see the class doc)."""
        import inspect

        from flwr.server.superlink.fleet.vce import vce_api

        run_api = vce_api.run_api  # what start_vce calls, with Flower's f_stop and backend factory
        params = inspect.signature(run_api).parameters

        def keeping_engine(*args: Any, **kwargs: Any) -> Any:
            given = dict(zip(params, args, strict=False)) | kwargs
            self.flower_stop = given.get("f_stop")
            backend_fn = given.get("backend_fn")
            if callable(backend_fn) and "backend_fn" in kwargs:
                kwargs["backend_fn"] = self._keeping(backend_fn)
            elif callable(backend_fn):
                args = tuple(self._keeping(a) if a is backend_fn else a for a in args)
            return run_api(*args, **kwargs)

        vce_api.run_api = keeping_engine
        self.waiting = True
        try:
            yield
        finally:
            self.waiting = False
            vce_api.run_api = run_api

    def _keeping(self, backend_fn: Callable[[], Any]) -> Callable[[], Any]:
        def built() -> Any:
            self.backend = backend_fn()
            return self.backend
        return built

    def reraise(self) -> None:
        """The interrupt for the signal received, if one was."""
        if self.received is not None:
            raise self._interrupt(self.received) from None

    def _handle(self, signum: int, frame: Any) -> None:
        """Python's handler (the main thread): what this signal asks, unless the relay decided it (it was given
        to another thread; the relay then sent it here again), and what any signal decided before asks."""
        if not self.relay.take():
            self._decide(signum)
        self._act()

    def _decide(self, signum: int) -> bool:
        """What a signal asks of the main thread, in any thread; whether it asks anything."""
        _silence_flwr()
        first = self._note(signum)
        if self.deferring and first:
            return False
        self.todo.append((signum, first))
        return True

    def _act(self) -> None:
        """In the main thread: stop the engine, or raise the interrupt, as the signals decided ask."""
        if self.holding:
            return
        with self.relay.lock:  # the relay's thread decides under it
            todo, self.todo = self.todo, []
        for signum, first in todo:
            if not (first and self.waiting):  # (waiting as now, not as when decided: the engine may have begun)
                raise self._interrupt(signum)
            self.stop.set()
            if self.flower_stop is not None and not self.flower_stop.is_set():
                # not set yet: Flower's main thread is not in run_api's ``finally`` (where it sets f_stop, then
                # shuts Ray down), so Ray is up, and stays up while this handler runs (in that thread)
                self.flower_stop.set()
                self._kill_actors()

    def _note(self, signum: int) -> bool:
        """Note a signal; whether it is the first (the one the run stops for)."""
        if self.received is not None:
            self.repeated = True
            return False
        self.received = signum
        runfolder.stop_requested(signum)  # the run's folder records it stopped, whatever its end raises
        return True

    def _kill_actors(self) -> None:
        import ray

        pool = getattr(self.backend, "pool", None)
        if pool is None or not getattr(pool, "num_actors", 0):
            return  # no pool yet, or one still being filled (this thread may be inside Ray, creating actors)
        for actor in [*getattr(pool, "pool", []), *getattr(pool, "_future_to_actor", {}).values()]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone; the run is stopping anyway
                pass

    def _interrupt(self, signum: int) -> KeyboardInterrupt:
        with self.lock:
            self.ended = True
        return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


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


def validate(settings: RunSettings, resumed: Checkpoint | None = None) -> None:
    """Refuse bad settings before any process starts (one clear error, nothing started). ``resumed``: the
    checkpoint a resume read already (not read again unless the file changed since)."""
    from splitfed.cost.model import cut_options
    from splitfed.data import parse_partition
    from splitfed.engine import template
    from splitfed.flower.adaptive import AdaptivePolicy, GreedyPolicy
    from splitfed.flower.config import default_cuts
    from splitfed.flower.policy import StaticPolicy, make_policy
    from splitfed.flower.workload import client_data, test_data
    from splitfed.models.segment import validate_cuts
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.inprocess import sim_clients

    if settings.out:  # a folder in use, or holding a run this one neither resumes nor replaces
        runfolder.check(settings.out, settings.resume, settings.overwrite)
    if not settings.addresses:  # the tiers it starts compute where this machine can
        from splitfed.engine.compute import torch_device

        torch_device(settings.tier_torch_device, "tier-torch-device")
    if settings.resume:  # a checkpoint of other math or other data
        from server.app import check_resume

        check_resume(settings, resumed)
    spec = settings.spec
    parse_partition(settings.partition)
    test_data(spec, settings.dataset, settings.seed)  # unknown dataset or shape mismatch
    client_data(spec, settings.dataset, settings.partition, settings.clients, 0, settings.seed)  # too few samples
    policy = make_policy(settings)
    n = template.num_blocks(spec)
    if isinstance(policy, StaticPolicy):
        default = default_cuts(settings.tiers, settings.u_shape)
        for cuts in policy.options:
            try:
                validate_cuts(cuts, n, settings.tiers, settings.u_shape, model=spec.name)
            except CutError as e:  # say which setting holds them: the default's cuts are not the user's own
                # the default's, past a model of fewer blocks than cnn's 7: RunSettings cannot tell whether the
                # user gave them, so the words are true either way
                hint = (f" ({default} is the default when no cuts are given): give --cuts (a config file's cuts) "
                        f"within 0..{n}, or adaptive" if settings.cuts.strip() == default and max(cuts) > n else "")
                raise CutError(f"cuts {settings.cuts!r}: {e}{hint}") from None
    cut_options(n, settings.tiers, settings.u_shape, settings.min_device_blocks)  # some cut keeps them
    fleet = fleet_for(settings)
    if isinstance(policy, AdaptivePolicy | GreedyPolicy):
        policy.assign(1, sim_clients(settings, fleet))  # the optimizer's plan: a device nothing fits is named now
    if isinstance(policy, StaticPolicy):
        static_fits(settings, policy, sim_clients(settings, fleet))
    one_sample_batches(settings, sim_clients(settings, fleet))
    if settings.addresses:  # tiers already running elsewhere: a chain they cannot form is named now, too
        from splitfed.sim.tiers import tier_chain

        with tier_chain(settings):
            pass
