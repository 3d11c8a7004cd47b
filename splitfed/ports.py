"""Local ports chosen before the processes that will listen on them start.

A chain of local processes starts at once when each one's address is known in advance (the edge must be told
where its next tier listens); the price is a short window in which another process may take a chosen port,
which the caller must answer by choosing again (:func:`splitfed.transport.process.local_chain` does).
"""

from __future__ import annotations

import contextlib
import socket

READY = "listening on "  # how a tier says it serves: ``listening on HOST:PORT (computing on DEVICE)``
PORT_TRIES = 3  # starts of a chain whose chosen port another process took meanwhile


def cannot_listen(listen: str, why: object = "") -> str:
    """How a tier refuses an address it cannot serve on; the process that started it there reads it (a port
    chosen for it and taken meanwhile: :func:`splitfed.transport.process.local_chain`)."""
    return f"cannot listen on {listen}" + (f": {why}" if why else "")


def free_ports(n: int) -> list[int]:
    """``n`` ports of 127.0.0.1 free now, all different: bound at once, then let go (one at a time, the system
    could hand the same port out twice before a process binds it: a SuperNode once got the SuperLink's)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
