"""Behaviour of the signal relay that a mutation run found unpinned: its count of its own sends (each echo passed
over exactly once, so that the next real signal is decided, once), and a wakeup pipe filled up in a flood of
signals staying quiet (no "Exception ignored" report per lost byte).

As in ``test_signal_relay.py``, each case runs in a process of its own (a script below): it installs signal
handlers and a wakeup fd, which must not touch pytest's. The bounds (10 to 30 s) only keep a broken build from
hanging the test; nothing here is timed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.test_signal_relay import ROOT

# only the relay imported (not the runner): each script starts in a few hundredths of a second
SETUP = textwrap.dedent("""
    import os
    import signal
    import sys
    import threading
    import time

    from splitfed.sim.signal_relay import SignalRelay

    MAIN = threading.main_thread().ident


    def main_joins():
        frame = sys._current_frames().get(MAIN)
        return frame is not None and frame.f_code.co_name == "_wait_for_tstate_lock"


    def report(**facts):
        print(" ".join(f"{k}={v}" for k, v in facts.items()), flush=True)


    def send_usr1_once_main_joins(bound=30):
        # from the calling thread, not the main one: the relay must wake the main thread out of its join
        deadline = time.monotonic() + bound
        while not main_joins() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
""")


def _run(body: str, timeout: float = 120) -> tuple[str, str]:
    script = SETUP + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return done.stdout.strip(), done.stderr


def test_each_signal_another_thread_takes_is_decided_once_and_acted_on_once_round_after_round() -> None:
    """Three signals, one at a time, each taken by a thread other than the main one while the main thread waits
    in an untimed join: each is decided exactly once (its echo, the relay's own send to the main thread, is
    passed over, not decided again) and its handler runs in the main thread exactly once, which ends the join.
    A count of echoes that goes wrong at the first (one too many, or never brought back to 0) passes over the
    second real signal instead: never decided, and the main thread not woken."""
    out, _ = _run("""
        decided, acted = [], []
        handled = threading.Event()

        def decide(signum):
            decided.append((signum, threading.current_thread() is threading.main_thread()))
            return True

        relay = SignalRelay(decide, {signal.SIGUSR1})

        def on_usr1(signum, frame):
            acted.append(threading.current_thread() is threading.main_thread())
            relay.take()
            handled.set()

        signal.signal(signal.SIGUSR1, on_usr1)
        relay.open()

        for round in (1, 2, 3):
            handled.clear()
            waiter = threading.Thread(target=lambda: handled.wait(10))
            sender = threading.Thread(target=send_usr1_once_main_joins)
            waiter.start()
            sender.start()
            waiter.join()  # ended by the handler, run in this thread once the relay has woken it
            sender.join()
            woken = handled.is_set()
            report(round=round, woken=woken, decided=len(decided), acted=len(acted))
            if not woken:
                break
        relay.close()
        report(all_usr1=all(s == signal.SIGUSR1 for s, _ in decided),
               acted_in_main=all(acted), echoes=relay.echoes)
    """)
    assert out.splitlines() == [
        "round=1 woken=True decided=1 acted=1",
        "round=2 woken=True decided=2 acted=2",
        "round=3 woken=True decided=3 acted=3",
        "all_usr1=True acted_in_main=True echoes=0",
    ]


@pytest.mark.parametrize(("opens", "take_first"), [(1, False), (2, False), (1, True)])
def test_a_wakeup_pipe_filled_by_a_flood_of_signals_reports_nothing(opens, take_first) -> None:
    """More signals than the pipe holds, while the relay's lock is held (so nothing reads the pipe): the bytes
    that do not fit are lost quietly, after the first ``open``, after ``open`` again, and after a ``take`` (which
    the handler calls at every signal the main thread gets: it checks the wakeup fd is still the relay's by
    putting it in again) alike. With the warning on, Python prints "Exception ignored when trying to write to
    the signal wakeup fd" for every lost byte."""
    out, err = _run(f"""
        decided = []
        signal.signal(signal.SIGUSR1, lambda s, f: None)
        relay = SignalRelay(lambda s: decided.append(s) or False, {{signal.SIGUSR1}})
        for _ in range({opens}):
            relay.open()
        took = relay.take() if {take_first} else True
        held, release = threading.Event(), threading.Event()

        def hold():
            with relay.lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(30)
        sent = 70_000  # past a Linux pipe's 64 KiB

        def flood():  # to itself, not to the main thread: Python reports a lost byte by a call it queues under a
            for _ in range(sent):  # lock that the main thread, interrupted while it held it, would wait on for good
                signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

        flooder = threading.Thread(target=flood)
        flooder.start()
        flooder.join()
        release.set()
        holder.join()
        relay.take()
        relay.close()
        report(took=took, pipe_filled=0 < len(decided) < sent)
    """)
    assert out == "took=True pipe_filled=True"
    assert "wakeup fd" not in err, err[:2000]
