"""A tier as a real OS process (``python -m splitfed.cli tier ...``), for tests and local chains.

The child holds a pipe on its stdin and exits when it closes, so a tier never
outlives the process that started it, however that process ends; a normal
exit or garbage collection also kills it.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypedDict, Unpack

from splitfed.importpath import child_pythonpath
from splitfed.ports import PORT_TRIES, READY, cannot_listen, free_ports
from splitfed.transport.security import TlsConfig


def _reap(proc: subprocess.Popen, token_file: str | None) -> None:
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
    if token_file:
        Path(token_file).unlink(missing_ok=True)


class TierStartError(RuntimeError):
    """A tier exited before it served; ``port_taken``: because the port chosen for it was taken meanwhile."""

    def __init__(self, message: str, port_taken: bool = False) -> None:
        super().__init__(message)
        self.port_taken = port_taken


class TierOptions(TypedDict, total=False):
    """How :meth:`TierProcess.spawn` starts a tier, each a ``splitfed tier`` flag; one typed list, so that a
    misspelt option is a type error wherever a tier is started (``start``, ``spawn``, ``local_chain``)."""

    role: str | None  # edge or cloud (default: edge when it has a next tier)
    tls: TlsConfig | None  # its server's certificate, key and client CA
    token: str | None  # the tier token, handed over in a private temporary file (never on the command line)
    token_file: str | Path | None
    coordinator_token_file: str | Path | None  # the token that alone allows load, fetch, release and sum
    insecure: bool  # plaintext, which the tier (as its command line) refuses unless asked (default False)
    threads: int | None  # torch threads (default 1; None: torch's choice)
    # module:factory models it serves besides the zoo (--allow-model); the child runs in this process's working
    # directory and gets its sys.path, so it imports what this process can (a module made importable at run time)
    allow_models: Sequence[str]
    extra_args: Sequence[str]  # further flags, as given
    env: dict[str, str] | None  # its environment (default: this process's)
    client_tls: TlsConfig | None  # credentials for the health check of a mutual-TLS tier
    startup_timeout: float  # seconds from the spawn until it serves (default 120)


class TierProcess:
    """A running ``splitfed tier`` child: ``.address``, ``.pid``, ``.stop()``, ``.kill()``."""

    def __init__(self, proc: subprocess.Popen, name: str, log: collections.deque[str],
                 token_file: str | None) -> None:
        self.proc = proc
        self.name = name
        self.address = ""
        self._log = log
        self._lines: queue.Queue[str | None] = queue.Queue()  # the child's stdout lines, then None at its end
        self._listen = ""
        self._tls: TlsConfig | None = None
        self._client_tls: TlsConfig | None = None
        self._timeout = self._deadline = 0.0
        self._finalizer = weakref.finalize(self, _reap, proc, token_file)

    @classmethod
    def start(cls, name: str = "edge", listen: str = "127.0.0.1:0", next_address: str | None = None,
              compress: str = "none", **options: Unpack[TierOptions]) -> TierProcess:
        """Start the child and wait until it serves (its ``listening on`` line, then a health check)."""
        tp = cls.spawn(name, listen, next_address, compress, **options)
        tp.wait_ready()
        return tp

    @classmethod
    def spawn(cls, name: str = "edge", listen: str = "127.0.0.1:0", next_address: str | None = None,
              compress: str = "none", **options: Unpack[TierOptions]) -> TierProcess:
        """Start the child, without waiting for it to serve (:meth:`wait_ready`): the tiers of a chain start
        at once. ``compress``: the codec it sends to ``next_address`` with; the options: :class:`TierOptions`.
        """
        role, tls, token = options.get("role"), options.get("tls"), options.get("token")
        token_file, coordinator_token_file = options.get("token_file"), options.get("coordinator_token_file")
        threads, env, client_tls = options.get("threads", 1), options.get("env"), options.get("client_tls")
        startup_timeout = options.get("startup_timeout", 120.0)
        role = role or ("edge" if next_address else "cloud")
        cmd = [sys.executable, "-m", "splitfed.cli", "tier", "--role", role, "--name", name, "--listen", listen,
               "--exit-with-stdin", "--compress", compress]
        if next_address:
            cmd += ["--next", next_address]
        if tls is not None:
            for flag, v in (("--tls-cert", tls.cert), ("--tls-key", tls.key), ("--tls-ca", tls.ca)):
                if v is not None:
                    cmd += [flag, str(v)]
        tmp_token = None
        if token is not None:
            fd, tmp_token = tempfile.mkstemp(prefix="splitfed-token-")
            with os.fdopen(fd, "w") as f:
                f.write(token)
            token_file = tmp_token
        if token_file is not None:
            cmd += ["--token-file", str(token_file)]
        if coordinator_token_file is not None:
            cmd += ["--coordinator-token-file", str(coordinator_token_file)]
        if options.get("insecure", False):
            cmd.append("--insecure")
        if threads:
            cmd += ["--threads", str(threads)]
        for m in options.get("allow_models", ()):
            cmd += ["--allow-model", m]
        cmd += list(options.get("extra_args", ()))
        child_env = dict(os.environ if env is None else env)
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env["PYTHONPATH"] = child_pythonpath(child_env)  # a model's module this process imports, it can
        if threads:
            child_env["OMP_NUM_THREADS"] = str(threads)
        # a session of its own: a terminal's Ctrl-C goes to our process group, and a tier killed by it would leave
        # our stopping run retrying its releases against a dead tier; we stop it ourselves, and its stdin ties it to us
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=child_env, text=True, bufsize=1, start_new_session=True)
        except BaseException:  # no child to reap it: the token's file must not outlive this call
            if tmp_token:
                Path(tmp_token).unlink(missing_ok=True)
            raise
        log: collections.deque[str] = collections.deque(maxlen=200)
        tp = cls(proc, name, log, tmp_token)
        lines = tp._lines
        tp._listen, tp._tls, tp._client_tls = listen, tls, client_tls  # what wait_ready needs
        tp._timeout, tp._deadline = startup_timeout, time.monotonic() + startup_timeout

        def drain(stream, ready: bool) -> None:  # type: ignore[no-untyped-def]
            for line in stream:
                log.append(line.rstrip("\n"))
                if ready:
                    lines.put(line)
            if ready:
                lines.put(None)

        assert proc.stdout is not None and proc.stderr is not None
        threading.Thread(target=drain, args=(proc.stdout, True), daemon=True).start()
        threading.Thread(target=drain, args=(proc.stderr, False), daemon=True).start()
        return tp

    def wait_ready(self) -> None:
        """Wait until the child serves; :meth:`spawn`'s ``startup_timeout`` counts from the spawn. A child that
        exits first raises :class:`TierStartError`, one that does not serve in time TimeoutError (killed)."""
        while not self.address:
            try:
                line = self._lines.get(timeout=max(0.01, self._deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise TimeoutError(f"tier {self.name} did not start within {self._timeout:.0f}s:\n{self.output()}") \
                    from None
            if line is None:
                self.proc.wait(10)
                self.kill()
                taken = not self._listen.endswith(":0") and cannot_listen(self._listen) in self.output()
                raise TierStartError(f"tier {self.name} exited with code {self.proc.returncode} before serving:\n"
                                     f"{self.output()}", port_taken=taken)
            if line.startswith(READY):
                self.address = line[len(READY):].split()[0]  # "listening on HOST:PORT (computing on DEV)"
        self._check_health(self._tls, self._client_tls, max(1.0, self._deadline - time.monotonic()))

    def _check_health(self, tls: TlsConfig | None, client_tls: TlsConfig | None, timeout: float) -> None:
        if tls is not None and client_tls is None:
            return  # the child prints its address only once its server started; no credentials to probe with
        from splitfed.transport.client import GrpcTierClient

        with GrpcTierClient(self.address, tls=client_tls if tls is not None else None) as c:
            if not c.health(timeout, wait=True):
                self.kill()
                raise RuntimeError(f"tier {self.name} at {self.address} does not report SERVING:\n{self.output()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """The last lines the child wrote (stdout and stderr)."""
        return "\n".join(self._log)

    def kill(self) -> None:
        """SIGKILL: the tier vanishes without a word, as in a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._finalizer()

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace`` + 5 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace + 5.0)
            except subprocess.TimeoutExpired:
                pass
        self._finalizer()

    def __enter__(self) -> TierProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def local_chain(names: Sequence[str], compress: Sequence[str] = (), *, tries: int = PORT_TRIES,
                **options: Unpack[TierOptions]) -> Iterator[list[TierProcess]]:
    """A chain of tier processes on 127.0.0.1 (``names`` in chain order, the edge first), each forwarding to the
    next, all started at once and stopped when the block ends, however it ends. The port of every tier but the
    edge is chosen here (:func:`~splitfed.ports.free_ports`), so that each tier is told its next one's address
    before that one listens: one start's time, not one per tier. ``compress``: the codec of each link between
    two tiers, in chain order (default none); ``options``: :class:`TierOptions`, the same for every tier."""
    codecs = list(compress) or ["none"] * (len(names) - 1)
    if not names or len(codecs) != len(names) - 1:
        raise ValueError(f"a chain of {len(names)} tier(s) has {max(0, len(names) - 1)} link(s) between them, "
                         f"not {len(codecs)} codec(s)")
    if tries < 1:
        raise ValueError(f"tries must be at least 1 (one start of the chain), not {tries}")
    for attempt in range(1, tries + 1):
        with ExitStack() as stack:
            listen = ["127.0.0.1:0", *(f"127.0.0.1:{p}" for p in free_ports(len(names) - 1))]
            procs: list[TierProcess] = []
            for i in reversed(range(len(names))):  # the cloud first: it gets the head start
                nxt = listen[i + 1] if i + 1 < len(names) else None
                proc = TierProcess.spawn(names[i], listen[i], nxt, codecs[i] if nxt else "none", **options)
                stack.callback(proc.stop)
                procs.insert(0, proc)
            try:
                for proc in reversed(procs):
                    proc.wait_ready()
            except TierStartError as e:
                if e.port_taken and attempt < tries:
                    continue
                raise
            yield procs
            return
