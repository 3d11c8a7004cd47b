"""A signal the kernel gives to a thread other than the main one still stops a run at once.

Before: a Ctrl-C at round 1 of 30 was seen only after round 30 (``test_signals.py`` met it about once in 30
runs). Flower's main thread waits in an untimed ``Thread.join`` for the whole run, and Python runs a handler only
in the main thread, when it next runs Python code; a signal delivered to a Ray or gRPC thread did not wake it.

Each case runs in a process of its own (a script below): it installs signal handlers and a wakeup fd, which
must not touch pytest's. The processes are forked, one per case, from one that imported ``splitfed.sim.runner``
(and torch with it) once for the module, and that has installed no handler nor wakeup fd of its own: each case
starts as a fresh ``python -c`` would, without its 3 s import, and ends by the interpreter's own exit. The
signal is sent with :func:`signal.pthread_kill` to one thread chosen on purpose, and only once the main thread
waits in its ``join`` (its frame says so), so each case meets the same order of events every time; the bounds
(30 s) only keep a broken build from hanging the test.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# a thread that sends ``sig`` to itself (not the main thread) ``times`` times, once the main thread waits in join
SETUP = textwrap.dedent("""
    import os
    import signal
    import sys
    import threading
    import time

    from splitfed.sim import runner

    MAIN = threading.main_thread().ident


    def main_joins():
        frame = sys._current_frames().get(MAIN)
        return frame is not None and frame.f_code.co_name == "_wait_for_tstate_lock"


    def send_from_another_thread(sig, times=1, to_process=False):
        def send():
            deadline = time.monotonic() + 30
            while not main_joins() and time.monotonic() < deadline:
                time.sleep(0.01)
            for _ in range(times):
                if to_process:
                    os.kill(os.getpid(), sig)
                else:
                    signal.pthread_kill(threading.get_ident(), sig)
        threading.Thread(target=send, daemon=True).start()


    def report(**facts):
        print(" ".join(f"{k}={v}" for k, v in facts.items()), flush=True)


    def take_until(relay, done):
        # the relay's pipe read here too, until ``done()`` (30 s at most: a broken build does not hang)
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            relay.take()
            time.sleep(0.01)


    def fork_a_child_that_takes_its_own_ctrl_c():
        # the child exits 0 once its handler raised its own SIGINT, 3 if that never came
        pid = os.fork()
        if pid == 0:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
                os._exit(3)
            except KeyboardInterrupt:
                os._exit(0)
        return pid


    def stop_inside_the_engine(signals, stop, before, sig=signal.SIGINT, **send):
        # the main thread in an untimed join inside the engine, the signal sent as ``send`` says: reports whether
        # the stop came while it waited, then the interrupt raised once the engine is left; gives the handlers back
        seen = []
        try:
            with signals.engine():
                engine = threading.Thread(target=lambda: seen.append(stop.wait(30)))
                engine.start()
                send_from_another_thread(sig, **send)
                engine.join()
            report(stopped_while_joined=seen[0], received=signals.received == sig)
            signals.reraise()
        except KeyboardInterrupt as e:
            report(interrupt=type(e).__name__)
        finally:
            signals.uninstall(before)
""")


# forks a process per case, from this one (runner, and torch, imported once): one line in, a JSON request
# {script, out, err, timeout}; one line out, the case's exit code. A case ends by the interpreter's own exit
# (``sys.exit`` out of the loop below: its non-daemon threads joined), or killed by its alarm if it hangs.
FORKER = textwrap.dedent("""
    import json
    import os
    import signal
    import sys

    from splitfed.sim import runner  # noqa: F401 - the import every case makes, made once

    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for fd, path in ((1, req["out"]), (2, req["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            signal.alarm(int(req["timeout"]))  # a broken build's hang ends here (SIGALRM's default: exit)
            exec(compile(req["script"], "<case>", "exec"), {"__name__": "__main__"})
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
""")


class _Forker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FORKER], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, script: str, out: Path, err: Path, timeout: float) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"script": script, "out": str(out), "err": str(err),
                                          "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout + 30)
        assert ready, f"no case ended within {timeout + 30} s"
        line = self.proc.stdout.readline()
        assert line, f"the forking process ended: rc {self.proc.wait()}"
        return int(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_forker: _Forker | None = None


@pytest.fixture(scope="module", autouse=True)
def _forker_for_the_module() -> Iterator[None]:
    global _forker
    yield
    if _forker is not None:
        _forker.close()
        _forker = None


def _run(body: str, timeout: float = 120) -> str:
    global _forker
    script = SETUP + textwrap.dedent(body)
    if _forker is None:
        _forker = _Forker()
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        code = _forker.run(script, out, err, timeout)
        stdout, stderr = out.read_text(), err.read_text()
    assert code == 0 and "Traceback" not in stderr, f"rc {code}\n" + stdout + stderr
    return stdout.strip()


@pytest.mark.parametrize(("sig", "interrupt"), [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
def test_a_signal_another_thread_takes_stops_the_engine_while_the_main_thread_waits(sig, interrupt) -> None:
    """Inside the engine: the stop is set while the main thread still waits in its untimed join (the thread it
    joins returns because of it, not at its 30 s bound), nothing is raised there, and the interrupt comes once
    the engine has returned. Before, the stop came only when the join ended (False here)."""
    out = _run(f"""
        stop = threading.Event()
        signals = runner._Signals(stop)
        before = signals.install()
        stop_inside_the_engine(signals, stop, before, signal.{sig})
        report(handler_back=signal.getsignal(signal.{sig}) is before[signal.{sig}],
               wakeup_back=signal.set_wakeup_fd(-1) == -1)
    """)
    assert out.splitlines() == [
        "stopped_while_joined=True received=True",
        f"interrupt={interrupt}",
        "handler_back=True wakeup_back=True",
    ]


def test_a_second_signal_another_thread_takes_does_not_wait() -> None:
    """The second signal raises in the main thread at once, out of a join whose thread still runs."""
    out = _run("""
        stop, never = threading.Event(), threading.Event()
        signals = runner._Signals(stop)
        before = signals.install()
        ended = []  # not is_alive(): an interrupted join marks its thread stopped (CPython's bpo-45274 fix)
        engine = threading.Thread(target=lambda: ended.append(never.wait(30)), daemon=True)
        try:
            with signals.engine():
                engine.start()
                send_from_another_thread(signal.SIGINT, times=2)
                engine.join()
            report(raised=False)
        except KeyboardInterrupt as e:
            report(raised=type(e).__name__, stop=stop.is_set(), joined_thread_ended=bool(ended))
        finally:
            signals.uninstall(before)
    """)
    assert out == "raised=KeyboardInterrupt stop=True joined_thread_ended=False"


def test_a_signal_another_thread_takes_outside_the_engine_is_raised_at_once() -> None:
    """Outside the engine the interrupt is raised in the main thread at once, there too out of an untimed join."""
    out = _run("""
        signals = runner._Signals(threading.Event())
        before = signals.install()
        ended = []
        other = threading.Thread(target=lambda: ended.append(threading.Event().wait(30)), daemon=True)
        try:
            other.start()
            send_from_another_thread(signal.SIGTERM)
            other.join()
            report(raised=False)
        except KeyboardInterrupt as e:
            report(raised=type(e).__name__, joined_thread_ended=bool(ended))
        finally:
            signals.uninstall(before)
    """)
    assert out == "raised=Terminated joined_thread_ended=False"


def test_a_signal_the_main_thread_takes_is_acted_on_once() -> None:
    """A signal the kernel gives to the main thread (the usual case) is decided there, by its handler; the relay
    neither decides it again nor sends it again: one Ctrl-C inside the engine stops the run and raises nothing
    there (a second decision would have raised, as a second Ctrl-C does). 20 times, for both orders in which
    the relay's thread and the handler may come to its byte."""
    out = _run("""
        raised = 0
        for _ in range(20):
            stop = threading.Event()
            signals = runner._Signals(stop)
            before = signals.install()
            seen = []
            try:
                with signals.engine():
                    engine = threading.Thread(target=lambda: seen.append(stop.wait(30)))
                    engine.start()
                    send_from_another_thread(signal.SIGINT, to_process=True)
                    engine.join()
                assert seen == [True] and signals.received == signal.SIGINT
                time.sleep(0.05)  # a relay's send, were one made, would be handled here, and raise
            except KeyboardInterrupt:
                raised += 1
            finally:
                signals.uninstall(before)
        report(raised=raised)
    """)
    assert out == "raised=0"


def test_a_signal_is_still_seen_when_something_else_puts_in_its_own_wakeup_fd() -> None:
    """Another library's wakeup fd (an event loop's) put in during the run: the handler decides its signal
    itself, as it did before the relay (a signal the main thread takes)."""
    out = _run("""
        stop = threading.Event()
        signals = runner._Signals(stop)
        before = signals.install()
        r, w = os.pipe()
        os.set_blocking(w, False)
        theirs = signal.set_wakeup_fd(w)
        stop_inside_the_engine(signals, stop, before, to_process=True)
        report(theirs_kept=signal.set_wakeup_fd(-1) == w)
    """)
    assert out.splitlines() == ["stopped_while_joined=True received=True", "interrupt=KeyboardInterrupt",
                                "theirs_kept=True"]


def test_a_signal_while_the_handlers_are_given_back_is_raised_once_they_are() -> None:
    """A signal that comes while ``uninstall`` gives the handlers back (here: held there, the relay's lock taken,
    then sent to the main thread) is raised only once the handlers and the wakeup fd are back. Raised inside,
    it left the run's own handler in, and the wakeup fd pointing at a pipe that was about to close."""
    out = _run("""
        signals = runner._Signals(threading.Event())
        before = signals.install()
        held = threading.Event()

        def signal_inside_uninstall():
            with signals.relay.lock:
                held.set()
                deadline = time.monotonic() + 30
                while (sys._current_frames()[MAIN].f_code.co_name != "close") and time.monotonic() < deadline:
                    time.sleep(0.01)
                signal.pthread_kill(MAIN, signal.SIGINT)

        t = threading.Thread(target=signal_inside_uninstall)
        t.start()
        held.wait()
        try:
            signals.uninstall(before)
            report(raised=False)
        except KeyboardInterrupt:
            report(raised=True, handler_back=signal.getsignal(signal.SIGINT) is before[signal.SIGINT],
                   wakeup_back=signal.set_wakeup_fd(-1) == -1)
        t.join()
    """)
    assert out == "raised=True handler_back=True wakeup_back=True"


def test_the_relay_passes_over_other_signals_and_gives_the_wakeup_fd_back() -> None:
    """A signal of another handler (SIGUSR1) is not decided; the wakeup fd found at open is given back at close;
    a relay not opened (or opened outside the main thread) takes nothing."""
    out = _run("""
        from splitfed.sim.signal_relay import SignalRelay

        decided = []
        got_usr1 = []
        signal.signal(signal.SIGUSR1, lambda s, f: got_usr1.append(s))
        signal.signal(signal.SIGINT, lambda s, f: None)
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        relay = SignalRelay(lambda s: decided.append(s) or False, {signal.SIGINT})
        report(took_before_open=relay.take())
        in_thread = []
        t = threading.Thread(target=lambda: in_thread.append(relay.open()))
        t.start()
        t.join()
        report(opened_in_thread=in_thread[0], opened=relay.open())
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGINT)
        take_until(relay, lambda: decided)
        relay.close()
        report(decided=decided == [signal.SIGINT], usr1_handled=got_usr1 == [signal.SIGUSR1],
               previous_back=signal.set_wakeup_fd(-1) == w, took_after_close=relay.take())
    """)
    assert out.splitlines() == ["took_before_open=False", "opened_in_thread=False opened=True",
                                "decided=True usr1_handled=True previous_back=True took_after_close=False"]


def test_installed_twice_as_a_run_installs_them_the_relay_still_relays_and_gives_the_wakeup_fd_back() -> None:
    """A run installs its handlers again once Ray is up: the relay keeps its pipe, still relays, and at the end
    gives back the wakeup fd that was there before the first install, not its own."""
    out = _run("""
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        stop = threading.Event()
        signals = runner._Signals(stop)
        before = signals.install()
        signals.install()
        stop_inside_the_engine(signals, stop, before)
        report(previous_back=signal.set_wakeup_fd(-1) == w)
    """)
    assert out.splitlines() == ["stopped_while_joined=True received=True", "interrupt=KeyboardInterrupt",
                                "previous_back=True"]


def test_a_process_whose_relay_is_never_closed_still_exits() -> None:
    """The relay's thread does not keep a process alive (a caller that never reaches ``uninstall``: ``os._exit``
    aside, an embedding program that ends while a run's handlers are in)."""
    out = _run("""
        signals = runner._Signals(threading.Event())
        signals.install()
        report(installed=True)
    """, timeout=60)
    assert out == "installed=True"


def test_a_relay_opened_again_after_close_decides_the_next_signal() -> None:
    """Closed and opened again (a notebook's next run, were a relay kept): no echo of before is waited for, so
    the next signal is decided, not passed over."""
    out = _run("""
        from splitfed.sim.signal_relay import SignalRelay

        decided = []
        signal.signal(signal.SIGINT, lambda s, f: None)
        relay = SignalRelay(lambda s: decided.append(s) or False, {signal.SIGINT})
        relay.open()
        relay.close()
        relay.open()
        os.kill(os.getpid(), signal.SIGINT)
        take_until(relay, lambda: decided)
        relay.close()
        report(decided=decided == [signal.SIGINT])
    """)
    assert out == "decided=True"


def test_a_child_forked_during_a_run_does_not_send_its_signals_to_the_run() -> None:
    """A child forked (not exec'd) while a run's relay is open takes its own Ctrl-C (the terminal sends it to the
    whole process group): before, its wakeup fd wrote it into the run's pipe, and the run counted it as its own
    (with its own, two: it would raise at once)."""
    out = _run("""
        signals = runner._Signals(threading.Event())
        before = signals.install()
        try:
            pid = fork_a_child_that_takes_its_own_ctrl_c()  # its handler raises (not in the engine)
            _, status = os.waitpid(pid, 0)
            signals.relay.take()  # whatever the pipe holds is decided now
            report(child_stopped_by_its_own=os.waitstatus_to_exitcode(status) == 0, run_received=signals.received)
        except KeyboardInterrupt:
            report(run_raised=True)
        finally:
            signals.uninstall(before)
    """)
    assert out == "child_stopped_by_its_own=True run_received=None"


def test_a_child_forked_while_the_relays_lock_is_held_can_still_take_its_signals() -> None:
    """Forked while another thread of the run holds the relay's lock (its watcher, deciding): the child has no
    such thread, and a lock held for good would hang the child's first signal."""
    out = _run("""
        signals = runner._Signals(threading.Event())
        before = signals.install()
        held, release = threading.Event(), threading.Event()

        def hold():
            with signals.relay.lock:
                held.set()
                release.wait(30)

        threading.Thread(target=hold).start()
        held.wait()
        try:
            pid = fork_a_child_that_takes_its_own_ctrl_c()
            release.set()
            deadline = time.monotonic() + 30
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            if done[0] == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                report(child="hung")
            else:
                report(child=os.waitstatus_to_exitcode(done[1]))
        finally:
            signals.uninstall(before)
    """)
    assert out == "child=0"
