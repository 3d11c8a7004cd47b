"""Signals for the main thread, whichever thread the kernel gave them to.

Python runs a signal's handler in the main thread only, and only when that thread next runs Python code. A
main thread waiting in an untimed C call (``Thread.join``: Flower's engine joins its worker threads so, for the
whole run) is woken only by a signal the kernel delivers to that thread. A process's signal goes to any thread
that does not block it, the main thread first, but not while that thread blocks it or has another pending: then
a Ray or gRPC thread takes it, and the handler ran only when the run had trained to its end (a Ctrl-C at round 1
of 30 was seen after round 30).

Python's wakeup fd (:func:`signal.set_wakeup_fd`) gets a byte per signal, in whichever thread it came. A watcher
thread reads them, has each decided (``decide``), and when the main thread must act on one, sends that thread
the signal again (:func:`signal.pthread_kill`), which wakes it from any wait. The handler the signal then runs
must not take it for a new one: it calls :meth:`SignalRelay.take`, which decides whatever bytes are still in the
pipe (the main thread, when the kernel gave the signal to it, decides its own signal at once, as before) and
passes over the echoes of the relay's own sends. Every byte is decided exactly once, under one lock, by
whichever of the two reads it first.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import weakref
from collections.abc import Callable, Collection

_open: weakref.WeakSet[SignalRelay] = weakref.WeakSet()  # the relays of this process with a pipe


class SignalRelay:
    """``decide(signum)`` says whether the main thread must act on a signal (its handler then runs again there).
    Only ``signums`` count; another handler's signal is passed over."""

    def __init__(self, decide: Callable[[int], bool], signums: Collection[int]) -> None:
        self.decide = decide
        self.signums = frozenset(signums)
        self.lock = threading.RLock()  # reentrant: a handler may run in the main thread while it holds it
        self.echoes = 0  # the relay's own sends whose bytes are still to come
        self._pipe: tuple[int, int] | None = None  # the wakeup fd's pipe: (read, write)
        self._quit: tuple[int, int] | None = None  # the watcher's end: a byte here
        self._previous = -1  # the wakeup fd before this one
        self._watcher: threading.Thread | None = None

    def open(self) -> bool:
        """Watch the signals (again, should something else have put its own wakeup fd in since); ``False``
        where Python lets only the main thread do that and this is not it."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if self._pipe is None:
            self._pipe, self._quit = os.pipe(), os.pipe()
            for fd in self._pipe:
                os.set_blocking(fd, False)
            self._previous = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
            _open.add(self)
            self._watcher = threading.Thread(target=self._watch, name="splitfed-signals", daemon=True)
            self._watcher.start()
        elif (previous := signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)) != self._pipe[1]:
            self._previous = previous
        return True

    def take(self) -> bool:
        """Decide the signals whose bytes are in the pipe; ``False`` if no pipe of this relay gets them (not
        opened, closed, or another wakeup fd put in since): the caller decides its signal itself."""
        with self.lock:
            if self._pipe is None or not self._is_wakeup_fd(self._pipe[1]):
                return False
            self._drain()
            return True

    def close(self) -> None:
        """Stop watching; the wakeup fd is given back. A relay still on its way is handled first (its handler
        runs while the pipe is still this relay's, and passes over its echo)."""
        if self._pipe is None or self._quit is None or self._watcher is None:
            return
        os.write(self._quit[1], b"\0")
        try:
            self._watcher.join()
            _settled()
        finally:
            with self.lock:
                self._drain()
                self._forget()

    def _forget(self) -> None:
        """Give the wakeup fd back (unless another was put in since: that one stays) and close this process's
        ends of the pipes."""
        if self._pipe is not None and self._is_wakeup_fd(self._pipe[1]):
            signal.set_wakeup_fd(self._previous)
        for fd in (*(self._pipe or ()), *(self._quit or ())):
            os.close(fd)
        self._pipe = self._quit = self._watcher = None
        self.echoes = 0
        _open.discard(self)

    def _watch(self) -> None:
        assert self._pipe is not None and self._quit is not None
        main = threading.main_thread().ident
        quit_fd = self._quit[0]
        poll = select.poll()  # not select(): a run's fds may number past 1024
        poll.register(self._pipe[0], select.POLLIN)
        poll.register(quit_fd, select.POLLIN)
        while True:
            if quit_fd in {fd for fd, _ in poll.poll()}:  # (or closed under it: POLLNVAL)
                return
            with self.lock:
                if self._pipe is None:
                    return
                act = self._drain()
                if act is not None and main is not None:
                    self.echoes += 1
                    signal.pthread_kill(main, act)

    def _drain(self) -> int | None:
        """Decide every byte in the pipe (the lock held): the last signal the main thread must act on, if any."""
        assert self._pipe is not None
        act = None
        while True:
            try:
                data = os.read(self._pipe[0], 512)
            except BlockingIOError:
                return act
            if not data:
                return act
            for signum in data:
                if signum not in self.signums:
                    continue
                if self.echoes:
                    self.echoes -= 1
                    continue
                if self.decide(signum):
                    act = signum

    @staticmethod
    def _is_wakeup_fd(fd: int) -> bool:
        previous = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        if previous != fd:
            signal.set_wakeup_fd(previous)
        return previous == fd


def _forked() -> None:
    """In a child forked (not exec'd) while a relay is open: its signals are its own. Its wakeup fd would write
    them into the parent's pipe (a Ctrl-C to the process group reaches the child too: the parent would count
    two, and raise at once), and its handler would drain that pipe; the child has no watcher either."""
    for relay in list(_open):
        relay.lock = threading.RLock()  # held at the fork by the parent's watcher, it would be held for good
        relay._forget()  # closes the child's copies of the pipes: the parent's stay open


os.register_at_fork(after_in_child=_forked)


def _settled() -> None:
    """A call: Python runs the signal handlers pending in the main thread when a function starts."""
