"""What keeps a local deployment's processes from outliving it, however deploy ends.

Two parts: the *guard*, a small process that takes every process deploy started down when deploy's end of its
stdin closes (deploy stopping, or dead, even by SIGKILL); and deploy's own handling of SIGINT and SIGTERM
(:class:`Signals`), held back while a child is started and handed to the guard, so that none runs unguarded.
The helpers below signal, and look for, the processes under a process (psutil checks that each is still the
process it was).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import psutil

from splitfed.errors import Terminated

# The guard: a small process (``python -c GUARD GRACE SPARED_PGID``, in a session of its own) that takes
# the deployment down however deploy ends, SIGKILL included. Deploy writes ``add PGID`` for each process
# it starts (each leads its own session and process group) and holds the write end of the guard's stdin;
# the guard also adopts the group of every process found under those groups' members (twice a second),
# since Flower starts some in sessions of their own: a SuperLink's SuperExec and the flwr-serverapp it
# runs, which outlive a dead SuperLink. ``kill PGID`` SIGKILLs a group and all found under it, then
# answers ``killed PGID``. ``signal N``: the signal its last stop sends (SIGTERM unless told: deploy's Ctrl-C
# is passed on as SIGINT). At EOF (deploy stopping or dead) it sends that signal to every group with a live
# process, SIGKILLs what is left after GRACE seconds, and exits. A group is forgotten once it has no live process,
# so a process group number is never signalled after the kernel could have given it to another process.
GUARD = r"""
import os, select, signal, sys, time
import psutil

for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)  # it stops the others; it ends at EOF or by SIGKILL
GRACE = float(sys.argv[1])
SPARED = {os.getpgid(0), *(int(a) for a in sys.argv[2:])}
root_of = {}  # process group -> the group deploy started that it was found under
final = signal.SIGTERM  # what the stop at EOF sends first

def scan():
    table = {}
    for p in psutil.process_iter(["ppid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE:
                table[p.pid] = (p.info["ppid"], os.getpgid(p.pid))
        except (OSError, psutil.Error):
            pass
    kids = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    todo = [pid for pid, (_, g) in table.items() if g in root_of]
    seen = set(todo)
    while todo:
        pid = todo.pop()
        for kid in kids.get(pid, ()):
            g = table[kid][1]
            if kid not in seen and g not in SPARED:
                seen.add(kid)
                todo.append(kid)
                root_of.setdefault(g, root_of[table[pid][1]])
    live = {table[pid][1] for pid in seen}
    for g in [g for g in root_of if g not in live]:
        del root_of[g]
    return live

def stop(root=None, sig=signal.SIGTERM, grace=GRACE):
    sent = set()
    end = time.monotonic() + grace
    while True:
        live = {g for g in scan() if root is None or root_of.get(g) == root}
        late = time.monotonic() >= end
        if not live or time.monotonic() >= end + 5:
            return
        for g in live:
            if late or g not in sent:
                try:
                    os.killpg(g, signal.SIGKILL if late else sig)
                except OSError:
                    pass
                sent.add(g)
        time.sleep(0.1)

buf = b""
scanned = 0.0
while True:
    if select.select([0], [], [], 0.5)[0]:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            word, _, arg = line.decode().partition(" ")
            if word == "add":
                root_of[int(arg)] = int(arg)
            elif word == "signal":
                final = int(arg)
            elif word == "kill":
                stop(int(arg), signal.SIGKILL, 0.0)
                try:
                    os.write(1, f"killed {arg}\n".encode())
                except OSError:
                    pass
    if time.monotonic() - scanned >= 0.5:
        scan()
        scanned = time.monotonic()
stop(sig=final)
"""


class Signals:
    """SIGINT and SIGTERM as :class:`KeyboardInterrupt` and :class:`Terminated` in the main thread (what
    :func:`server.deploy.main` installs), held back while a child is started and handed to the guard, so that
    none runs unguarded. After the first, both are ignored: the stop that follows is not cut short (a SIGKILL
    still ends deploy at once, and the guard then stops the rest)."""

    def __init__(self) -> None:
        self.holding = 0
        self.pending: int | None = None

    def handle(self, signum: int, frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        if self.holding:
            self.pending = signum
            return
        raise self.interrupt(signum)

    @staticmethod
    def interrupt(signum: int) -> KeyboardInterrupt:
        return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    @contextmanager
    def held(self) -> Iterator[None]:
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding and self.pending is not None:
                signum, self.pending = self.pending, None
                raise self.interrupt(signum)

    @contextmanager
    def installed(self) -> Iterator[None]:
        old = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)
               if signal.getsignal(sig) is not signal.SIG_IGN}  # a background job's SIGINT: Ctrl-C is not for it
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self.pending = None


SIGNALS = Signals()


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one under it listens on TCP ``port``."""
    for p in tree(pid):
        with contextlib.suppress(psutil.Error):
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in p.net_connections(kind="tcp")):
                return True
    return False


def wait(proc: subprocess.Popen, timeout: float | None, check: Callable[[], None] | None = None) -> None:
    """``proc.wait(timeout)`` in short slices: the kernel may hand SIGINT or SIGTERM to another thread (the
    output pump), and Python runs its handler only when the main thread wakes; a bare ``waitpid`` would
    keep deploy deaf to it until ``flwr run`` ended. ``check`` runs between slices (it may raise)."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 0.25 if end is None else min(0.25, end - time.monotonic())
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
        try:
            proc.wait(left)
            return
        except subprocess.TimeoutExpired:
            if check is not None:
                check()


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def send_signal(leaders: Sequence[subprocess.Popen], procs: Sequence[psutil.Process], sig: int) -> None:
    """``sig`` to the process group of each leader not yet waited for (while it is unwaited, its pid, and so
    its group's number, cannot be another process's) and to each of ``procs`` (psutil checks that each is
    still the process it was)."""
    for leader in leaders:
        if leader.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(leader.pid, sig)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)
