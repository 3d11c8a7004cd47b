"""Ctrl-C and SIGTERM stop a real ``splitfed simulate`` cleanly, leaving a run ``--resume`` continues.

Before: Ctrl-C printed "interrupted" and then hung, because the interpreter waited at exit
on Flower's engine threads blocked on Ray actors that were gone; a second Ctrl-C ended it
with a traceback. SIGTERM (what ``timeout``, ``docker stop``, systemd and Slurm send) hit
Ray's crash handler and aborted the process (exit 134) with a C++ stack dump.

Then: now and then (about 1 stop in 12) a stop ended with Ray's "core worker has already been shutdown
... The process will exit" as the last line and Ray's exit code: the interrupt unwound Flower's engine into
its ``ray.shutdown()`` while an engine thread was still inside a Ray call (``splitfed.sim.runner._Signals``).
:func:`test_a_signal_while_flower_is_inside_ray` holds an engine thread there on purpose, so that case is
met every time, not by chance.

The deadline below only detects a hang; it is not a speed target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from splitfed.sim import ray_start
from tests.ray_fixtures import running, sessions, until
from tests.sigint_ignored import ignoring_sigint

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-real")]

ROOT = Path(__file__).resolve().parent.parent
SPLITFED = Path(sys.executable).parent / "splitfed"  # the console script, as a user runs it
HANG = 180  # seconds: far beyond a clean stop; only a hang gets here


# Rounds of a run stopped part way: enough that the signal, sent at round 1's or 2's line, always finds the run
# training. A round here takes 0.2-1.5 s, and the reader of its lines may lag under load: with 4, a SIGTERM sent
# at round 2's line once came after the last round and the summary (CI on 2 cores), and the run read "finished".
ROUNDS = 30


def _start(out: Path, ray_tmp: Path, sigint_ignored: bool = False, script: str | None = None,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    """The run as a user's script starts it, its output a pipe without ``PYTHONUNBUFFERED``: each progress line
    must reach the pipe as it is printed (before, it came in 8 KiB blocks, here all at the end: the signal
    meant for round 1 came after the last round, or never). ``script``: ``splitfed`` run as ``python -c script``
    (hooked), not as the console script; ``env``: more of its environment."""
    how = [sys.executable, "-c", script] if script else [str(SPLITFED)]
    # seed 12 deals 2 of the iot fleet's devices that keep the links busy, mcu-ble-0 (it sends its inputs up) and
    # pi-sat-0: the main job's rounds record bytes (seed 0 deals two Pis that train the whole model themselves)
    cmd = [*how, "simulate", "--config", "simulations/configs/main.toml", "--clients", "2", "--seed", "12",
           "--rounds", str(ROUNDS), "--out", str(out)]
    base = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.Popen(
        ignoring_sigint(cmd) if sigint_ignored else cmd,
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**base, "RAY_TMPDIR": str(ray_tmp), **(env or {})})


def _signal_at(p: subprocess.Popen, marker: str, send) -> list[str]:  # type: ignore[no-untyped-def]
    """``send`` the run a signal at the first line starting with ``marker``; the lines up to it."""
    assert p.stdout is not None
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith(marker):
            send(p)
            return seen
    pytest.fail(f"the run ended before {marker!r}:\n" + "".join(seen))


def _stop_at(p: subprocess.Popen, marker: str, send) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """``send`` the run its signal at the first line starting with ``marker``; its exit code and output."""
    seen = _signal_at(p, marker, send)
    try:
        rest, _ = p.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the run did not stop after the signal (hang)")
    return p.returncode, "".join(seen) + rest


def _rounds(out: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _ends_stopped(text: str, out: Path, word: str, rounds: int) -> None:
    """The run's last lines: stopped, and (once a round is kept) how to continue it."""
    from splitfed.flower import checkpoint

    kept = checkpoint.load(out).round if (out / checkpoint.FILENAME).is_file() else 0
    want = [f"splitfed simulate: {word}"]
    if 0 < kept < rounds:
        want.append(f"splitfed simulate: round {kept} of {rounds} is kept in {out}; continue with: "
                    f"splitfed simulate --resume {out}")
    elif not kept:
        want.append(f"splitfed simulate: no round was kept in {out}: run the same command again to start over")
    assert text.rstrip().splitlines()[-len(want):] == want, text


@pytest.mark.parametrize(("sig", "code", "word", "by"), [
    (signal.SIGINT, 130, "interrupted", "Ctrl-C (SIGINT)"),
    (signal.SIGTERM, 143, "terminated", "SIGTERM"),
], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_the_run_cleanly_resumably_and_tidily(  # type: ignore[no-untyped-def]
        tmp_path, ray_tmp, monkeypatch, sig, code, word, by):
    """Ctrl-C (to the whole process group, as a terminal sends it) and SIGTERM (to the run alone, as ``timeout``,
    ``docker stop``, systemd and Slurm send it) part way: the run says it stopped and how to continue; its
    folder records the stop (``splitfed report`` reads it stopped, not failed) and keeps every finished round;
    nothing of Ray is left, neither its processes nor its session folder; and ``--resume`` continues the run.
    One real run per signal checks all of it (each costs a Ray start).

    The SIGTERM run is started with SIGINT ignored, as a script's background job is (the user's Ctrl-C is for
    the job in the foreground): a SIGINT after round 1 leaves it training (before, the run put its own handler
    in anyway, and stopped), and the SIGTERM comes at round 2, taken by a thread other than the main one
    (``ANOTHER_THREAD``: as the kernel gives a process's signal to a Ray or gRPC thread now and then; was its own
    run, test_a_signal_a_thread_other_than_the_main_one_takes_stops_the_run_part_way): it stops the run part way
    all the same. A signal the main thread takes itself is the Ctrl-C run's (``_Signals`` decides SIGINT and
    SIGTERM alike; its exit code, last lines and record are asserted here for each).

    The Ctrl-C run also gets the terminal's second Ctrl-C while Ray shuts down (``SECOND_CTRL_C_IN_SHUTDOWN``;
    was its own run, test_a_second_ctrl_c_while_ray_shuts_down_still_leaves_nothing_of_ray: all of its
    assertions are made here). A single Ctrl-C in a real run, its record and what it leaves of Ray, is
    :func:`test_a_signal_while_flower_is_inside_ray`'s. Its ``--resume`` run is the README's first command
    shortened (the main job's config, 2 clients; was test_main_job.py's test_main_job_short, a Ray start of its
    own): the progress, the end-of-run table, where the results are, no noise, the rows, summary and figures;
    and the run it finishes ends bit-identical to the same run never stopped, computed in-process (was
    tests/test_flower_sim.py's test_stopped_run_resumes_bit_identical, a Ray start of its own for a resume of a
    run that had ended; here the resumed run was stopped by a signal part way)."""
    from splitfed.flower import checkpoint
    from splitfed.report.runs import load_run, run_notes

    out = tmp_path / "run"
    ray_procs: list[psutil.Process] = []

    def keep_ray_procs(p: subprocess.Popen) -> None:
        [session] = sessions(ray_tmp)
        ray_procs.extend(q for q in ray_start._session_processes(session) if q.pid != p.pid)

    def ctrl_c(p: subprocess.Popen) -> None:
        keep_ray_procs(p)
        os.killpg(p.pid, sig)

    def sigint_then_keep(p: subprocess.Popen) -> None:
        p.send_signal(signal.SIGINT)  # ignored
        keep_ray_procs(p)

    if sig == signal.SIGINT:
        proc = _start(out, ray_tmp, script=SECOND_CTRL_C_IN_SHUTDOWN)
        returncode, text = _stop_at(proc, f"round 1/{ROUNDS}", ctrl_c)
        assert "HOOK: a second Ctrl-C as Ray shuts down" in text, text  # the run sends the second one itself
    else:
        proc = _start(out, ray_tmp, sigint_ignored=True, script=ANOTHER_THREAD,
                      env={"SPLITFED_TEST_SIGNAL": str(int(sig)), "SPLITFED_TEST_AT": "round 2/"})
        ignored = _signal_at(proc, f"round 1/{ROUNDS}", sigint_then_keep)
        returncode, text = _stop_at(proc, "HOOK:", lambda p: None)  # the run sends the SIGTERM itself
        text = "".join(ignored) + text
        # the SIGINT it ignores: it trained on through it, and said nothing of it
        assert "interrupted" not in text and "Ctrl-C" not in text and _rounds(out)[:2] == [1, 2], text
        assert _rounds(out)[-1] < 10 and "the run had finished" not in text, text  # not trained on to round 30
    assert returncode == code, text
    for noise in NOISE:
        assert noise not in text, (noise, text)
    _ends_stopped(text, out, word, ROUNDS)
    assert "Traceback" not in text and "ERROR" not in text and "SIGTERM received" not in text, text
    assert "core worker" not in text, text  # Flower unwound into ray.shutdown() (test_a_signal_while_flower_is_inside_ray)
    done = _rounds(out)
    assert done and done == list(range(1, len(done) + 1)), (done, text)  # every finished round, none twice
    kept = checkpoint.load(out).round
    assert 1 <= kept and kept >= done[-1] - 1, (kept, done, text)  # what --resume continues from
    assert kept < ROUNDS, (kept, text)  # stopped part way: the signal found it training
    run = load_run(out)
    assert run.status == "stopped" and run.record["signal"] == signal.Signals(sig).name, (run.record, text)
    assert run_notes(run)[0].startswith(f"{out} was stopped by {by} at "), (run_notes(run), text)
    assert ray_procs, text  # Ray's processes of this run: there while it ran...
    assert until(lambda: not running(ray_procs)), ([q.pid for q in running(ray_procs)], text)  # ...and gone
    assert sessions(ray_tmp) == [], (sessions(ray_tmp), text)
    if sig == signal.SIGINT:  # one --resume is enough: it continues what the stop kept, whichever signal
        again = subprocess.run([str(SPLITFED), "simulate", "--resume", str(out), "--rounds", str(kept + 1)],
                               cwd=ROOT, env={**os.environ, "RAY_TMPDIR": str(ray_tmp)}, capture_output=True,
                               text=True, timeout=HANG)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"round {kept + 1}/{kept + 1}" in again.stdout and f"round {kept}/" not in again.stdout, again.stdout
        assert _rounds(out) == list(range(1, kept + 2))
        assert sessions(ray_tmp) == []
        _ends_as_the_main_job(again, out, kept + 1)
        _equals_the_run_never_stopped(out, kept + 1, tmp_path / "whole", monkeypatch)


# what splitfed does on purpose (Flower's in-process simulation, no federated evaluation, Ray's tip about a future
# default), said by Flower and Ray: a warning that shows up means something
NOISE = ("`run_simulation` function is deprecated", "fraction_evaluate is set to 0.0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")


def _ends_as_the_main_job(p: subprocess.CompletedProcess, out: Path, rounds: int) -> None:
    """A finished run of the main job's config: progress per round, the end-of-run table with cuts per device
    class, where the results are; no noise; a row per round with what a round records, the summary, figures."""
    assert f"round {rounds}/{rounds}" in p.stdout and "cuts per device class" in p.stdout, p.stdout
    assert f"run folder: {out}" in p.stdout, p.stdout
    for noise in NOISE:
        assert noise not in p.stdout + p.stderr, noise
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == rounds
    for row in rows:
        for key in ("round", "accuracy", "loss", "wall_s", "sim_round_s", "bytes_up", "bytes_down", "cuts"):
            assert key in row, key
        assert row["bytes_up"] > 0 and row["sim_round_s"] > 0 and len(row["cuts"]) == 2
    assert json.loads((out / "summary.json").read_text())["rounds"] == rounds
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in pngs)


def _equals_the_run_never_stopped(out: Path, rounds: int, whole: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model in ``out`` (a run stopped, then resumed to ``rounds``) is, bit for bit, that of the same run
    trained to ``rounds`` without a stop: computed in-process (the ServerApp's ``run`` over in-process tiers:
    a transport changes no number, so the uninterrupted run needs no second simulation)."""
    import torch

    import clients.app
    import server.app
    from splitfed.engine.verify import max_abs_diff
    from splitfed.flower import checkpoint
    from splitfed.flower.config import RunSettings
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    resumed = checkpoint.load(out)
    assert resumed.round == rounds, resumed.round
    settings = RunSettings(**resumed.settings).with_(rounds=rounds, out=str(whole), resume=False, node_wait_s=5.0)
    with inprocess_tiers(monkeypatch, settings.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, settings.clients), settings, progress=lambda line: None)
    a, b = checkpoint.load(whole).state, resumed.state
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), max_abs_diff(a, b)


# ``splitfed`` as the console script runs it, with hooks in Flower's engine: the first worker thread to fetch a
# client's reply from Ray says so on stdout and then waits there (``ray.get`` not yet called) until the run's stop
# flag is set, so the signal always finds an engine thread inside a Ray call; and ``ray.shutdown()`` says so when
# it is called with such a thread inside. Before the fix it always was: the interrupt unwound Flower into its
# ``ray.shutdown()`` while the thread waited, and the run's stop flag was set only after that.
HOOKED = textwrap.dedent("""
    import sys
    import threading

    import ray
    import server.app
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    stops, inside = [], []
    build_app = server.app.build_app

    def build_app_keeping_stop(*args, stop=None, **kwargs):
        stops.append(stop)
        return build_app(*args, stop=stop, **kwargs)

    server.app.build_app = build_app_keeping_stop
    fetch = BasicActorPool.fetch_result_and_return_actor_to_pool
    first = threading.Lock()

    def held_fetch(self, future):
        inside.append(threading.get_ident())
        try:
            if first.acquire(blocking=False):
                print("HOOK: an engine thread is inside Ray", flush=True)
                stops[0].wait(120)  # the bound only keeps a broken run from hanging the test
            return fetch(self, future)
        finally:
            inside.remove(threading.get_ident())

    BasicActorPool.fetch_result_and_return_actor_to_pool = held_fetch
    shutdown = ray.shutdown

    def checked_shutdown(*args, **kwargs):
        if inside:
            print("HOOK: ray.shutdown() with an engine thread inside Ray", flush=True)
        return shutdown(*args, **kwargs)

    ray.shutdown = checked_shutdown
    from splitfed.cli import entry

    sys.argv = ["splitfed", *sys.argv[1:]]
    entry()
""")


def test_a_signal_while_flower_is_inside_ray(tmp_path, ray_tmp):
    """A Ctrl-C to the whole process group (as a terminal sends it: the tiers get it too) while an engine thread
    is inside Ray. A SIGTERM to the run alone takes the same path in the run (``_Signals._handle``: the first
    signal inside the engine sets the stop events and raises nothing there), so it is not run here again: the
    SIGTERM case of :func:`test_a_signal_stops_the_run_cleanly_resumably_and_tidily` stops a real run inside the
    engine (its exit code, last lines and record), a SIGTERM a thread other than the main one takes.

    This is also the real run a single Ctrl-C stops (the full stop test's Ctrl-C run gets a second one as Ray
    shuts down, after the first has stopped the engine and the run, and asserts the record): nothing of Ray is
    left, neither its processes nor its session folder. (It stops in round 1: no round, so no run folder, is
    kept, and there is no record to read.)"""
    out = tmp_path / "run"
    ray_procs: list[psutil.Process] = []

    def ctrl_c(p: subprocess.Popen) -> None:
        [session] = sessions(ray_tmp)
        ray_procs.extend(q for q in ray_start._session_processes(session) if q.pid != p.pid)
        os.killpg(p.pid, signal.SIGINT)

    p = subprocess.Popen(
        [sys.executable, "-c", HOOKED, "simulate", "--config", "simulations/configs/main.toml", "--clients", "2",
         "--rounds", "2", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp)})
    returncode, text = _stop_at(p, "HOOK:", ctrl_c)
    assert returncode == 130, text
    _ends_stopped(text, out, "interrupted", 2)
    assert "with an engine thread inside Ray" not in text, text
    assert "core worker" not in text and "Traceback" not in text and "WARNING" not in text, text
    assert ray_procs, text  # Ray's processes of this run: there while it ran, and gone
    assert until(lambda: not running(ray_procs)), ([q.pid for q in running(ray_procs)], text)
    assert sessions(ray_tmp) == [], (sessions(ray_tmp), text)


# ``splitfed`` as the console script runs it, the ServerApp's progress hooked: at the first line starting with
# ``$SPLITFED_TEST_AT`` a thread of its own (not the main one) sends itself the signal ``$SPLITFED_TEST_SIGNAL``,
# as the kernel gives a process's signal to a Ray or gRPC thread now and then, and says so. Before the relay
# (``splitfed.sim.signal_relay``) the main thread, waiting in Flower's untimed join, saw it only after the last
# round. The SIGTERM case of test_a_signal_stops_the_run_cleanly_resumably_and_tidily runs it. SIGTERM only: the
# relay decides SIGINT and SIGTERM alike (``SignalRelay(_decide, _STOPPING)``), and a Ctrl-C it relays is covered
# by tests/test_signal_relay.py's ``test_a_signal_another_thread_takes_stops_the_engine_while_the_main_thread_waits``
# (both signals), a Ctrl-C in a real engine by test_a_signal_while_flower_is_inside_ray and the Ctrl-C case of the
# full stop test.
ANOTHER_THREAD = textwrap.dedent("""
    import os
    import signal
    import sys
    import threading

    import server.app

    SIG = int(os.environ["SPLITFED_TEST_SIGNAL"])
    AT = os.environ["SPLITFED_TEST_AT"]
    build_app = server.app.build_app
    sent = []


    def send():
        print(f"HOOK: sent to thread {threading.get_ident()}, not the main one", flush=True)
        signal.pthread_kill(threading.get_ident(), SIG)


    def build_app_sending(settings, progress, *args, **kwargs):
        def said(line):
            progress(line)
            if line.startswith(AT) and not sent:
                sent.append(True)
                threading.Thread(target=send).start()
        return build_app(settings, said, *args, **kwargs)


    server.app.build_app = build_app_sending
    from splitfed.cli import entry

    sys.argv = ["splitfed", *sys.argv[1:]]
    entry()
""")


# ``splitfed`` as the console script runs it, Ray's node hooked: the first time the node's processes are to be
# killed (``ray.shutdown()``, which Flower's engine calls once the first Ctrl-C has stopped its threads), the
# terminal's second Ctrl-C comes, before any of them is killed. Ray has disconnected by then, so
# ``ray.is_initialized()`` is False; before the fix the runner took that for a Ray shut down, and its node's
# processes (log monitor, autoscaler monitor, dashboard) lived on until the run's process ended: the runner
# waited its 30 s for them, then kept Ray's session folder.
# The Ctrl-C case of test_a_signal_stops_the_run_cleanly_resumably_and_tidily runs it: the second Ctrl-C cuts
# Ray's shutdown short; the run still shuts the rest of Ray down, ends as interrupted, resumable, and leaves
# neither Ray's processes nor its session folder.
SECOND_CTRL_C_IN_SHUTDOWN = textwrap.dedent("""
    import os
    import signal
    import sys

    from ray._private.node import Node

    kill_all_processes = Node.kill_all_processes
    calls = []

    def second_ctrl_c_first(self, *args, **kwargs):
        calls.append(True)
        if len(calls) == 1:
            print("HOOK: a second Ctrl-C as Ray shuts down", flush=True)
            os.killpg(os.getpgid(0), signal.SIGINT)
        return kill_all_processes(self, *args, **kwargs)

    Node.kill_all_processes = second_ctrl_c_first
    from splitfed.cli import entry

    sys.argv = ["splitfed", *sys.argv[1:]]
    entry()
""")


def _while_ray_starts(setup: str, inside: str) -> str:
    """``splitfed`` as the console script runs it, its Ray start patched: ``setup`` first, then at the start of
    Ray's node (after ``ray.init`` has put in its own SIGTERM handler, unless splitfed kept it from that)
    the line "HOOK: Ray is starting" is printed and ``inside`` runs."""
    body = "\n".join("    " + line for line in textwrap.dedent(inside).strip().splitlines())
    return textwrap.dedent(setup) + textwrap.dedent("""
        import sys

        import ray._private.node as node

        start = node.Node.__init__


        def held(self, *args, **kwargs):
            print("HOOK: Ray is starting", flush=True)
        {body}
            return start(self, *args, **kwargs)


        node.Node.__init__ = held
        from splitfed.cli import entry

        sys.argv = ["splitfed", *sys.argv[1:]]
        entry()
    """).replace("{body}", body)


def _run_stopped_while_ray_starts(tmp_path: Path, ray_tmp: Path, script: str, send, code: int,  # type: ignore[no-untyped-def]
                                  last: str, env: dict[str, str] | None = None) -> str:
    """Run ``script`` (a ``_while_ray_starts``, Ray under ``ray_tmp``), ``send`` its signal at the hook; it stops
    as asked, with its last lines, having started no tier and left nothing of Ray: no session folder, no process.
    Its output."""
    p = subprocess.Popen(
        [sys.executable, "-c", script, "simulate", "--config", "simulations/configs/main.toml", "--clients", "2",
         "--rounds", "2", "--out", str(tmp_path / "run")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp), **(env or {})})
    returncode, text = _stop_at(p, "HOOK:", send)
    assert returncode == code, text
    _ends_stopped(text, tmp_path / "run", last, 2)
    assert "tiers:" not in text and "Traceback" not in text and "Exception ignored" not in text, text
    assert not list((ray_tmp / "ray").glob("session_2*")), "Ray's session folder is left"
    left = [q for q in psutil.process_iter(["cmdline"]) if str(ray_tmp) in " ".join(q.info["cmdline"] or [])]
    assert not left, left
    return text


# Ray is held in its start until the run's handler has noted the signal sent at the hook's line (its
# ``_Signals.received``; was a fixed 3 s): the signal always comes while Ray starts. A handler that raises (Ray's
# ``sys.exit``, had ``starting`` let it in) ends the wait by its exception; the bound only keeps a broken run
# from hanging the test.
STARTING = _while_ray_starts("""
    import signal
    import time


    def noted():
        handler = signal.getsignal(signal.SIGTERM)
        return getattr(getattr(handler, "__self__", None), "received", None) is not None
""", """
    end = time.monotonic() + 60
    while not noted() and time.monotonic() < end:
        time.sleep(0.01)
""")


def test_a_signal_while_ray_starts_stops_the_run_and_leaves_nothing(tmp_path, ray_tmp):
    """Before: SIGTERM while Ray started met Ray's own handler, and the run exited 15 with no word, keeping
    Ray's session folder; a Ctrl-C raised there could land in the after-fork hook of a process Ray spawned,
    where Python drops it with logging's lock held: the run went on, then hung.

    SIGTERM only: Ray's start puts its own handler in for it (``ray.init``'s ``sys.exit``), which ``starting``
    keeps out, and takes a ``SystemExit(15)`` that still comes for this stop. Past that, a Ctrl-C takes the same
    path (the run's handler notes it while Ray starts; the run raises it once Ray is up), which the in-process
    test of a failed Ray start (a SIGINT while starting) and the fork test below pin; a Ctrl-C's exit code and
    last lines are those of the full stop test (both signals)."""
    _run_stopped_while_ray_starts(tmp_path, ray_tmp, STARTING, lambda p: p.send_signal(signal.SIGTERM), 143,
                                  "terminated")


def test_a_start_of_ray_that_fails_is_not_tried_again_once_stopped_and_a_second_signal_does_not_wait(monkeypatch):
    """A Ray start that times out (a loaded host; it cannot be made to here, so ``ray.init`` fails on purpose)
    while a signal is noted: before, all three attempts ran on (30 s each), and the failed start then ended
    the run as failed, not stopped. A second signal raises at once."""
    import threading

    import ray

    from splitfed.sim import ray_start, runner

    attempts: list[float] = []

    def failing_init(**kwargs):  # type: ignore[no-untyped-def]
        attempts.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs here: noted, not raised
        raise Exception("simulated: the raylet did not register in 30 s")

    monkeypatch.setattr(ray, "init", failing_init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray_start, "_children", lambda: [])
    signals = runner._Signals(threading.Event())
    before = signals.install()
    try:
        with signals.starting():
            ray_start.start_ray({}, stopped=lambda: signals.received is not None)
        assert len(attempts) == 1 and signals.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signals.reraise()
    finally:
        signals.uninstall(before)
    again = runner._Signals(threading.Event())
    before = again.install()
    try:
        with pytest.raises(KeyboardInterrupt), again.starting():
            os.kill(os.getpid(), signal.SIGINT)  # noted
            os.kill(os.getpid(), signal.SIGINT)  # raised
            time.sleep(5)
    finally:
        again.uninstall(before)


# a signal that comes while Ray's start forks one of its processes, handled in the parent's after-fork hooks:
# sent blocked before the fork, unblocked (from C, no Python frame) after it, ahead of logging's own hooks
FORKING = _while_ray_starts("""
    import functools
    import os
    import signal
    import threading

    import _signal

    SIG = int(os.environ["SPLITFED_TEST_SIGNAL"])
    armed, fired = [], []

    def before():
        if armed and not fired:
            fired.append(True)
            signal.pthread_sigmask(signal.SIG_BLOCK, {SIG})
            signal.pthread_kill(threading.main_thread().ident, SIG)

    unblock = functools.partial(_signal.pthread_sigmask, signal.SIG_UNBLOCK, {SIG})
    os.register_at_fork(before=before, after_in_parent=unblock, after_in_child=unblock)
""", "armed.append(True)")


def test_a_signal_in_the_fork_of_a_process_ray_starts_stops_the_run(tmp_path, ray_tmp):
    """Before: handled in the after-fork hook, the interrupt (Ctrl-C) or Ray's ``sys.exit`` (SIGTERM, under the
    handler Ray's start put in) was dropped by Python ("Exception ignored"): the run trained to its end and
    exited 0, or hung on logging's lock.

    SIGTERM only: it meets both causes (Ray's handler, had ``starting`` let it in; and the run's own handler,
    had that raised in the hook, as a Ctrl-C's would: the same handler, only noting the signal while Ray
    starts). A Ctrl-C's exit code and last lines are :func:`test_a_signal_stops_the_run_cleanly_resumably_and_tidily`'s."""
    _run_stopped_while_ray_starts(tmp_path, ray_tmp, FORKING, lambda p: None, 143, "terminated",  # the hook sends it
                                  env={"SPLITFED_TEST_SIGNAL": str(int(signal.SIGTERM))})
