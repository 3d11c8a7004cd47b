"""More behaviour of the signal relay that a mutation run found unpinned: its watcher wakes the main thread out of
an untimed join at once (``test_mutants_signal_relay.py``'s rounds pass without it, 10 s late, once their waits
end), and ``close`` closes every fd ``open`` made (a notebook that runs again and again would leak four a run).

As in ``test_signal_relay.py``, each case runs in a process of its own (a script below): it installs signal
handlers and a wakeup fd, which must not touch pytest's. The bounds only keep a broken build from hanging the
test; nothing here is timed.
"""

from __future__ import annotations

from tests.test_mutants_signal_relay import _run


def test_the_main_thread_is_woken_out_of_its_join_while_the_thread_it_joins_still_waits() -> None:
    """A signal another thread takes, the main thread waiting in an untimed join: the handler runs in the main
    thread while the joined thread still waits (its wait ends because of it, not at its 20 s bound), the signal
    decided once; then ``close`` returns and no echo is left to pass over."""
    out, _ = _run("""
        decided, acted = [], []
        handled = threading.Event()
        relay = SignalRelay(lambda s: decided.append(s) or True, {signal.SIGUSR1})

        def on_usr1(signum, frame):
            acted.append(threading.current_thread() is threading.main_thread())
            relay.take()
            handled.set()

        signal.signal(signal.SIGUSR1, on_usr1)
        relay.open()
        seen = []
        waiter = threading.Thread(target=lambda: seen.append(handled.wait(20)))

        sender = threading.Thread(target=send_usr1_once_main_joins, args=(20,))
        waiter.start()
        sender.start()
        waiter.join()
        sender.join()
        relay.close()
        report(woken_while_joined=seen[0], decided=decided == [signal.SIGUSR1], acted=acted == [True],
               echoes=relay.echoes)
    """, timeout=60)
    assert out == "woken_while_joined=True decided=True acted=True echoes=0"


def test_close_closes_every_fd_that_open_made() -> None:
    """Opened and closed three times: the process holds the same fds as before (the wakeup pipe's two ends and
    the watcher's two are closed, each time)."""
    out, _ = _run("""
        signal.signal(signal.SIGINT, lambda s, f: None)
        relay = SignalRelay(lambda s: False, {signal.SIGINT})
        before = sorted(os.listdir("/proc/self/fd"))
        for _ in range(3):
            relay.open()
            opened = len(os.listdir("/proc/self/fd")) - len(before)
            relay.close()
        report(opened=opened, same_fds=sorted(os.listdir("/proc/self/fd")) == before)
    """)
    assert out == "opened=4 same_fds=True"
