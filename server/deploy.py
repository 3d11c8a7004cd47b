"""A whole deployment on one machine: SuperLink, N SuperNodes, edge and cloud tiers, ``flwr run``.

    python -m server.deploy --clients 2 --rounds 1 --out runs/deploy
    python -m server.deploy --resume runs/deploy --rounds 3      # or --overwrite: replace that run
    python -m server.deploy --clients 3 --tls-ca ca.pem --tls-cert cert.pem --tls-key key.pem \\
        --token-file token --profile rpi4 --profile laptop --profile phone-mid

What it starts (every process in its own session, all stopped on exit, error,
Ctrl-C or SIGTERM, children included, with SIGINT after a Ctrl-C, so the run
folder records the stop as the user's, else SIGTERM; a guard process takes them
all down if deploy itself dies, even by SIGKILL):

1. the cloud and edge tier servers (``splitfed tier``), edge -> cloud (the edge with the run's
   codec for that link as its ``--compress``: one codec for every link, or one per link);
2. ``flower-superlink`` (Fleet, Control and Runtime APIs on one HTTP port);
3. ``flower-supernode`` i = 0..N-1 with ``--node-config 'partition-id=i
   num-partitions=N device-profile="..." edge-address="..."'`` (and the TLS
   files the ClientApp uses towards the edge);
4. ``flwr run APP CONNECTION --run-config ... --stream`` where APP is a copy of
   ``server/`` and ``clients/`` with a generated ``pyproject.toml`` (every
   setting of :class:`~splitfed.flower.config.RunSettings` is listed under
   ``[tool.flwr.app.config]`` so any of them can be overridden with ``--set``,
   but those deploy sets itself: clients, tiers, TLS, tokens...) and CONNECTION
   is written to a private ``FLWR_HOME/config.toml``. (Flower 1.42 keeps
   SuperLink connections there; run against the repository itself, ``flwr run``
   would move ``[tool.flwr.federations]`` out of its pyproject.toml.) Its output
   (the ServerApp's log) is shown as it comes and kept in ``WORKDIR/flwr-run.log``.

Exit code: 0 once the run folder records the run finished (its own record of
the run's end, :func:`splitfed.flower.runstatus.status`) with every requested
round kept, whatever ``flwr run`` exits with (0 after a failed ServerApp, and
not always 0 after a finished one); 1 if not (the line printed says where it
stopped, why, and how to continue it with ``--resume``); 2 for settings refused
before anything started;
130 after Ctrl-C, 143 after SIGTERM (everything stopped; the finished rounds
stay in the run folder for ``--resume``).

TLS: with ``--tls-ca/--tls-cert/--tls-key`` every hop is encrypted: SuperLink
(``--ssl-*``), SuperNodes and ``flwr`` (verify it against the CA), and the
tier servers (mutual TLS: the ServerApp and every ClientApp present the given
certificate). The certificate must name 127.0.0.1 (every process here is reached
there: its subjectAltName needs ``IP:127.0.0.1``), be within its validity dates,
and allow both server and client authentication; one that does not name 127.0.0.1,
or is out of its dates, is refused before anything starts. Without certificates
everything runs with ``--insecure``, which is only sensible on loopback.

Tokens: the tiers get ``--token-file`` (the devices' token, which the SuperNodes
get in their node config) and a coordinator token of their own
(``--coordinator-token-file``, or ``WORKDIR/coordinator-token`` made for the
deployment), which alone allows load, fetch, release and sum; only the ServerApp
gets it (``coordinator-token-file`` in the run config), so no device can claim
or release a client's segment.

Workdir (``--workdir``): deploy writes there its logs (``NAME.log``), the app copy (``app/``), ``flwr-home/``
and the coordinator token it makes, replacing those of an earlier deployment, and names them in
``.splitfed-deploy.json``; a folder holding any of those names that record does not list (the user's files) is
refused before anything starts. The run folder (``--out``) may be the workdir too.

On real machines run the same pieces by hand: ``splitfed tier --role cloud``
on the cloud, ``splitfed tier --role edge --next CLOUD`` on the edge,
``flower-superlink`` on the coordinator, one ``flower-supernode`` per device
with its ``--node-config``, then ``flwr run`` with ``tier-addresses`` pointing
at the edge and cloud. The simulated clock is off (``sim-clock=false``): the
metrics report measured times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from server import processes
from splitfed import tomlio
from splitfed.cli import line_buffered
from splitfed.errors import ConfigError, SplitfedError, Terminated
from splitfed.flower import checkpoint, runfolder, runstatus
from splitfed.flower.config import ALIASES, RunSettings, app_config
from splitfed.jsonio import write_json
from splitfed.ports import PORT_TRIES, READY, cannot_listen, free_ports

BIN = Path(sys.executable).parent
CONNECTION = "splitfed-local"
GRACE_S = 5.0  # from SIGTERM to SIGKILL when the deployment stops
PORT_IN_USE = "address already in use"  # EADDRINUSE's words: how a SuperLink's log says its port was taken
KEPT_LINES = 10_000  # of flwr run's output, in the result; flwr-run.log has all of it
WORKDIR_RECORD = ".splitfed-deploy.json"  # in a workdir: the entries deploy made there (Deployment.claim_workdir)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # Flower's colours: kept for a terminal only

class NodesGone(SplitfedError):
    """Every SuperNode of the deployment exited while its run went on: no node can register or train."""


class StartFailed(SplitfedError):
    """A process of the deployment exited, or did not listen, as it started (a tier refusing its files): said
    as deploy's error with that process's log, not as a traceback. ``port_taken``: a tier could not listen on
    the port chosen for it (another process took it first)."""

    exit_code = 1

    def __init__(self, message: str, *, port_taken: bool = False) -> None:
        super().__init__(message)
        self.port_taken = port_taken


def free_port() -> int:
    return free_ports(1)[0]


def check_tls(tls_ca: str, tls_cert: str, tls_key: str) -> None:
    """Refuse (ConfigError, before anything starts) TLS files the deployment cannot run with: not all three,
    files that do not parse, a key not the certificate's, a certificate out of its validity dates
    (:meth:`TlsConfig.check`), one whose extendedKeyUsage lacks serverAuth or clientAuth (every process serves
    it and presents it to the tiers), or one whose subjectAltName does not cover 127.0.0.1, where every process is
    reached (the SuperLink then refused its SuperNodes and ``flwr``, and deploy said only that the SuperLink
    was unavailable), or one the CA did not sign: every process verifies the others' (the same certificate)
    against that CA, so each refused each (deploy said only that every SuperNode exited)."""
    if not (tls_ca or tls_cert or tls_key):
        return
    if not (tls_ca and tls_cert and tls_key):
        raise ConfigError("TLS needs --tls-ca, --tls-cert and --tls-key together")
    from cryptography import x509

    from splitfed.transport.security import TlsConfig, certificate_names, signed_by

    cert, _, ca = TlsConfig(tls_cert, tls_key, tls_ca).check(("--tls-cert", "--tls-key", "--tls-ca"),
                                                           roles=("server", "client"))
    assert cert is not None and ca is not None
    if not signed_by(x509.load_pem_x509_certificates(cert), x509.load_pem_x509_certificates(ca)):
        raise ConfigError(f"--tls-cert {tls_cert} is not signed by the CA in --tls-ca {tls_ca}: every process of "
                          "the deployment verifies the others against that CA and refuses it; give a certificate "
                          "that CA signed, or the CA that signed it")
    names = certificate_names(cert)
    if "IP:127.0.0.1" not in names:  # where every process of the deployment listens and is reached
        held = f"it names {', '.join(names)}" if names else "it has no subjectAltName"
        raise ConfigError(f"--tls-cert {tls_cert} is not valid for 127.0.0.1 ({held}): every process of the "
                          "deployment is reached there; give a certificate with subjectAltName IP:127.0.0.1")


def _made_by_deploy(record: Path) -> set[str] | None:
    """The workdir entries ``record`` (:data:`WORKDIR_RECORD`) says deploy made: none without one, ``None``
    when what is there is not deploy's record (it would be replaced)."""
    if not os.path.lexists(record):
        return set()
    try:
        data = json.loads(record.read_text(encoding="utf-8")) if not record.is_symlink() else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("written by") != "splitfed deploy":
        return None
    entries = data.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        return None
    return set(entries)


def _kv(values: Mapping[str, Any]) -> str:
    """Flower's ``key=value key2="text"`` form (values in TOML syntax)."""
    return " ".join(f"{k}={tomlio.value(v)}" for k, v in values.items())


@dataclass
class Deployment:
    """The processes of a local deployment; a context manager that always stops them."""

    clients: int
    workdir: Path
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    token_file: str = ""
    profiles: Sequence[str] = ()
    coordinator_token_file: str = ""  # the ServerApp's own token for the tiers ("": one is made in the workdir)
    tiers: int = 3
    log: bool = True
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    tier_addresses: list[str] = field(default_factory=list)
    superlink: str = ""
    grace: float = GRACE_S  # seconds from SIGTERM to SIGKILL when stopping
    torch_device: str = "cpu"  # where the tiers it starts compute (cpu, cuda, cuda:N)
    compress: str = "none"  # the run's codec(s): each tier it starts that forwards sends with its link's (--compress)
    _guard: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _flwr: subprocess.Popen | None = field(default=None, init=False, repr=False)  # the ``flwr run`` going on

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ConfigError(f"clients must be >= 1, got {self.clients}")
        check_tls(self.tls_ca, self.tls_cert, self.tls_key)
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.claim_workdir()  # before anything is written there
        self.home = self.workdir / "flwr-home"
        self.home.mkdir(exist_ok=True)
        if not self.coordinator_token_file:  # the ServerApp's alone: the nodes never see it
            path = self.workdir / "coordinator-token"
            path.unlink(missing_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
            self.coordinator_token_file = str(path)
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": "1"}

    @property
    def secure(self) -> bool:
        return bool(self.tls_ca)

    @property
    def tier_names(self) -> list[str]:
        return ["edge", "cloud"][: self.tiers - 1]

    def workdir_entries(self) -> set[str]:
        """The names this deployment writes in its workdir, replacing what is there: FLWR_HOME, the app copy,
        the coordinator token it makes, and each process's log."""
        logs = ["superlink", "guard", "flwr-run", *self.tier_names, *(f"supernode{i}" for i in range(self.clients))]
        made = [] if self.coordinator_token_file else ["coordinator-token"]
        return {"flwr-home", "app", *made, *(f"{name}.log" for name in logs)}

    def claim_workdir(self) -> None:
        """Refuse (ConfigError, before anything is written) a workdir holding one of :meth:`workdir_entries` that
        deploy did not make there, then record them as deploy's (:data:`WORKDIR_RECORD`, itself refused when it
        is not deploy's record). Before, deploy deleted a user's ``app/`` and replaced their files of those names.
        Names, not sha256s: the logs and FLWR_HOME change as the processes run, after deploy last wrote them."""
        record = self.workdir / WORKDIR_RECORD
        made = _made_by_deploy(record)
        wanted = self.workdir_entries()
        refused = [record] if made is None else [
            self.workdir / name for name in sorted(wanted) if os.path.lexists(self.workdir / name)
            and (name not in made or (self.workdir / name).is_symlink())]  # deploy makes no link
        if refused:
            raise ConfigError(f"--workdir {self.workdir}: deploy would replace {refused[0]}, which it did not write; "
                              "give an empty folder or a workdir deploy made")
        kept = {name for name in made or () if os.path.lexists(self.workdir / name)}
        write_json(record, {"written by": "splitfed deploy", "entries": sorted(kept | wanted)})

    # ------------------------------------------------------------ processes

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "w") as out, processes.SIGNALS.held():
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, cwd=self.workdir, start_new_session=True)
            self.procs[name] = proc
            self._guarded(proc)
        return proc

    def _guarded(self, proc: subprocess.Popen) -> None:
        """Hand ``proc``'s process group (it leads its own session) to the guard, started on first use."""
        if self._guard is None:
            with open(self.workdir / "guard.log", "ab") as err:
                self._guard = subprocess.Popen(
                    [sys.executable, "-c", processes.GUARD, str(self.grace), str(os.getpgid(0))], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=err, env=self.env, start_new_session=True)
        self._tell(f"add {proc.pid}")

    def _tell(self, line: str) -> bool:
        guard = self._guard
        if guard is None or guard.stdin is None or guard.stdin.closed:
            return False
        try:
            guard.stdin.write(f"{line}\n".encode())
            guard.stdin.flush()
            return True
        except OSError:  # the guard is gone: stop() still stops what it can see itself
            return False

    def start(self) -> Deployment:
        """Start tiers, SuperLink and SuperNodes (all at once: they find each other by address). A SuperLink port
        another process took between its choice and the SuperLink's bind is chosen again, as a tier's is; the
        SuperNodes, already pointed at it, start again with it. A SuperNode's own port taken so is chosen again
        for that node alone."""
        self._start_tiers()
        tls = (["--ssl-certfile", self.tls_cert, "--ssl-keyfile", self.tls_key, "--ssl-ca-certfile", self.tls_ca]
               if self.secure else ["--insecure"])
        for attempt in range(1, PORT_TRIES + 1):
            port, *node_ports = free_ports(1 + self.clients)
            self.superlink = f"127.0.0.1:{port}"
            self._spawn("superlink", [str(BIN / "flower-superlink"), *tls, "--host", "127.0.0.1", "--port",
                                      str(port), "--disable-runtime-dependency-installation"])
            for i in range(self.clients):
                self.start_supernode(i, node_ports[i])
            try:
                self._wait_port(port, "superlink")
            except StartFailed as e:
                if not e.port_taken or attempt == PORT_TRIES:
                    raise
                for name in ["superlink", *(f"supernode{i}" for i in range(self.clients))]:
                    self.kill(name)
                continue
            self._wait_nodes(node_ports)
            return self
        raise AssertionError("unreachable: the last try returns or raises")

    def _wait_nodes(self, ports: Sequence[int]) -> None:
        """Until each SuperNode listens on its port (its Runtime HTTP API, bound before it dials the SuperLink;
        they start at once, so waiting in turn costs nothing). One that exited because another process took that
        port starts again on another (``PORT_TRIES`` in all, then :class:`StartFailed`); one that exited for
        another reason is left to the run, which names it (:class:`NodesGone` once all have): a deployment
        survives a lost node."""
        for i, port in enumerate(ports):
            name = f"supernode{i}"
            for attempt in range(1, PORT_TRIES + 1):
                try:
                    self._wait_port(port, name)
                    break
                except StartFailed as e:
                    if self.procs[name].poll() is None or (e.port_taken and attempt == PORT_TRIES):
                        raise  # silent too long, or its port taken at every try
                    if not e.port_taken:
                        break
                    self.kill(name)
                    port = free_ports(1)[0]
                    self.start_supernode(i, port)

    def start_supernode(self, i: int, port: int = 0) -> subprocess.Popen:
        cfg: dict[str, Any] = {"partition-id": i, "num-partitions": self.clients,
                               "edge-address": self.tier_addresses[0]}
        if self.profiles:
            cfg["device-profile"] = self.profiles[i % len(self.profiles)]
        if self.secure:
            cfg.update({"tls-ca": self.tls_ca, "tls-cert": self.tls_cert, "tls-key": self.tls_key})
        if self.token_file:
            cfg["token-file"] = self.token_file
        tls = ["--root-certificates", self.tls_ca] if self.secure else ["--insecure"]
        return self._spawn(f"supernode{i}", [
            str(BIN / "flower-supernode"), *tls, "--superlink", self.superlink, "--node-config", _kv(cfg),
            "--host", "127.0.0.1", "--port", str(port or free_port())])

    def _start_tiers(self) -> None:
        """Every tier at once, each told its next one's address (ports chosen here); each is awaited by its own
        ``listening on`` line, not by a port that answers (another process may hold it): a port taken between
        its choice and the tier's bind is chosen again, as :func:`~splitfed.transport.process.local_chain` does."""
        if self.tiers not in (2, 3):
            raise ConfigError("the local deployment starts 2 or 3 tiers")
        names = self.tier_names
        security = (["--tls-cert", self.tls_cert, "--tls-key", self.tls_key, "--tls-ca", self.tls_ca]
                    if self.secure else ["--insecure"])
        if self.token_file:
            security += ["--token-file", self.token_file]
        security += ["--coordinator-token-file", self.coordinator_token_file]
        from splitfed.cost.wire import link_codecs

        codecs = link_codecs(self.compress, len(names))  # link idx + 1 joins tier idx to the next
        for attempt in range(1, PORT_TRIES + 1):
            self.tier_addresses = [f"127.0.0.1:{p}" for p in free_ports(len(names))]
            for idx in reversed(range(len(names))):  # the cloud first: it gets the head start
                role = "edge" if idx + 1 < len(names) else "cloud"
                nxt = (["--next", self.tier_addresses[idx + 1], "--compress", codecs[idx + 1]]
                       if idx + 1 < len(names) else [])
                self._spawn(names[idx], [str(BIN / "splitfed"), "tier", "--role", role, "--name", names[idx],
                                         "--listen", self.tier_addresses[idx], *nxt, *security,
                                         "--torch-device", self.torch_device])
            try:
                for name, address in zip(names, self.tier_addresses, strict=True):
                    self._wait_served(name, address)
                return
            except StartFailed as e:
                if not e.port_taken or attempt == PORT_TRIES:
                    raise
                for name in names:
                    self.kill(name)

    def _wait_served(self, name: str, address: str, timeout: float = 180.0) -> None:
        """Until tier ``name`` says it serves on ``address``; :class:`StartFailed` with its log if it exits first
        (``port_taken``: it could not listen there) or says nothing in time."""
        log, end = self.workdir / f"{name}.log", time.monotonic() + timeout
        while True:
            proc = self.procs[name]
            ended = proc.poll() is not None  # before the log is read: a line written before the exit is seen
            text = log.read_text(errors="replace") if log.is_file() else ""
            if any(line.startswith(f"{READY}{address} ") for line in text.splitlines()):
                return
            if ended:
                raise StartFailed(f"{name} exited with code {proc.returncode}:\n{self.tail(name)}",
                                  port_taken=cannot_listen(address) in text)
            if time.monotonic() >= end:
                raise StartFailed(f"{name} did not say it serves on {address} within {timeout:.0f}s:\n"
                                  f"{self.tail(name)}")
            time.sleep(0.2)

    def _wait_port(self, port: int, name: str, timeout: float = 180.0) -> None:
        """Until ``name`` (or a process under it) listens on ``port``: not merely until the port answers, which
        another process holding it would do while ``name`` fails to bind it."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                log = self.tail(name, lines=10_000)
                raise StartFailed(f"{name} exited with code {proc.returncode}:\n{self.tail(name)}",
                                  port_taken=PORT_IN_USE in log.lower())
            if proc is not None and processes.listens(proc.pid, port):
                return
            time.sleep(0.2)
        raise StartFailed(f"{name} did not listen on port {port} within {timeout:.0f}s:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""

    def kill(self, name: str) -> None:
        """SIGKILL a process, its process group and everything it started (a machine that dies)."""
        proc = self.procs[name]  # reaped, its pid may be another process's by now: no tree is looked up under it
        processes.send_signal([proc], processes.tree(proc.pid) if proc.returncode is None else [], signal.SIGKILL)
        if self._tell(f"kill {proc.pid}") and self._guard is not None and self._guard.stdout is not None:
            self._guard.stdout.readline()  # "killed PGID": the groups found under it are gone too
        proc.wait(10)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """``sig`` (SIGTERM; SIGINT passes a Ctrl-C on, so the run folder records it) to every process the
        deployment started: each one's process group (each leads its own session), every process of their
        trees, and through the guard the groups those made (a SuperLink's SuperExec and flwr-serverapp, which
        outlive a dead SuperLink and hold the run folder); SIGKILL what is left after ``grace`` seconds."""
        with processes.SIGNALS.held():  # a signal now is acted on once this stop is done
            self._stop(sig)

    def _stop(self, sig: int) -> None:
        procs = [*self.procs.values(), *([self._flwr] if self._flwr is not None else [])]
        tree = [q for p in procs if p.returncode is None for q in processes.tree(p.pid)]
        processes.send_signal(procs, tree, sig)
        self._tell(f"signal {int(sig)}")  # the groups only the guard knows get the same
        guard, self._guard = self._guard, None
        if guard is not None and guard.stdin is not None:
            with contextlib.suppress(OSError):
                guard.stdin.close()  # EOF: the guard stops every group it knows the same way
        end = time.monotonic() + self.grace
        while time.monotonic() < end and (any(p.poll() is None for p in procs) or any(processes.alive(q) for q in tree)):
            time.sleep(0.1)
        processes.send_signal(procs, [q for q in tree if processes.alive(q)], signal.SIGKILL)
        if guard is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                guard.wait(self.grace + 15)  # it ends once no group it knows has a live process
            if guard.stdout is not None:
                guard.stdout.close()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        ctrl_c = isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Terminated)
        self.stop(signal.SIGINT if ctrl_c else signal.SIGTERM)

    # ------------------------------------------------------------ the run

    def write_app(self, repo: Path | None = None) -> Path:
        """A Flower App folder: ``server/``, ``clients/`` and a pyproject listing every setting."""
        repo = repo or Path(__file__).resolve().parent.parent
        app = self.workdir / "app"
        shutil.rmtree(app, ignore_errors=True)
        app.mkdir()
        for pkg in ("server", "clients"):
            shutil.copytree(repo / pkg, app / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        config = "\n".join(f"{k} = {tomlio.value(v)}" for k, v in app_config().items())  # as `flwr run .`
        (app / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
            '[project]\nname = "splitfed-app"\nversion = "0.1.0"\n'
            'description = "splitfed ServerApp and ClientApp"\nlicense = "Apache-2.0"\ndependencies = []\n\n'
            '[tool.flwr.app]\npublisher = "splitfed"\n\n'
            '[tool.flwr.app.components]\nserverapp = "server.app:app"\nclientapp = "clients.app:app"\n\n'
            f"[tool.flwr.app.config]\n{config}\n")
        conn = [f'[superlink]\ndefault = "{CONNECTION}"\n', f"[superlink.{CONNECTION}]",
                f'address = "{self.superlink}"']
        conn += [f'root-certificates = "{self.tls_ca}"'] if self.secure else ["insecure = true"]
        (self.home / "config.toml").write_text("\n".join(conn) + "\n")
        return app

    def run_config(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """The run config for ``flwr run``: this deployment's tiers and TLS, then ``overrides``."""
        cfg: dict[str, Any] = {"clients": self.clients, "tiers": self.tiers, "sim-clock": False,
                               "tier-addresses": ",".join(self.tier_addresses)}
        if self.secure:
            cfg.update({"tls-ca": self.tls_ca, "tls-cert": self.tls_cert, "tls-key": self.tls_key})
        if self.token_file:
            cfg["token-file"] = self.token_file
        cfg["coordinator-token-file"] = self.coordinator_token_file  # the ServerApp's: load, fetch, release, sum
        cfg.update(overrides)
        as_run(cfg, "run config")  # refuse bad values before anything runs
        return cfg

    def run(self, overrides: Mapping[str, Any], timeout: float | None = None) -> subprocess.CompletedProcess:
        """``flwr run APP CONNECTION --run-config ... --stream``; returns when the run has ended.

        Its output (stdout and stderr, as one stream) is shown as it comes when ``log`` is set, and
        appended to ``flwr-run.log`` in the workdir; the result's ``stdout`` holds its last ``KEPT_LINES``
        lines (a run of days must not grow in memory). Colour codes reach a terminal only. No time limit
        unless ``timeout`` (then :class:`subprocess.TimeoutExpired`, as :func:`subprocess.run`)."""
        app = self.write_app()
        cmd = [str(BIN / "flwr"), "run", str(app), CONNECTION, "--run-config", _kv(self.run_config(overrides)),
               "--stream"]
        lines: deque[str] = deque(maxlen=KEPT_LINES)
        with open(self.workdir / "flwr-run.log", "a", encoding="utf-8") as log:  # a resume keeps the run before
            if log.tell():
                log.write(f"\n--- flwr run again, {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
            with processes.SIGNALS.held():
                proc = self._flwr = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     stdin=subprocess.DEVNULL, env=self.env, cwd=self.workdir,
                                                     start_new_session=True)
                self._guarded(proc)
            pump = threading.Thread(target=self._pump, args=(proc, log, lines), daemon=True)
            pump.start()
            try:
                processes.wait(proc, timeout, self._check_nodes)
            finally:
                if proc.poll() is None:  # interrupted, or out of time: this run ends with it
                    processes.send_signal([proc], processes.tree(proc.pid), signal.SIGTERM)
                    try:
                        proc.wait(self.grace)
                    except subprocess.TimeoutExpired:
                        processes.send_signal([proc], processes.tree(proc.pid), signal.SIGKILL)
                        proc.wait(5)
                pump.join(10)
        return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")

    def _check_nodes(self) -> None:
        """Raise :class:`NodesGone` once every SuperNode has exited (the run would wait out ``node-wait-s``, then
        blame its own log), naming each one's exit code and log; one node gone is the run's to survive."""
        nodes = {n: p for n, p in self.procs.items() if n.startswith("supernode")}
        if nodes and all(p.poll() is not None for p in nodes.values()):
            raise NodesGone("every SuperNode exited: " + ", ".join(
                f"{n} with code {p.returncode} (see {self.workdir / f'{n}.log'})" for n, p in sorted(nodes.items())))

    def _pump(self, proc: subprocess.Popen, log: TextIO, lines: deque[str]) -> None:
        """``proc``'s output, line by line, to ``log``, ``lines`` and (with ``self.log``) the terminal."""
        assert proc.stdout is not None
        coloured = self.log and sys.stdout.isatty()
        with contextlib.suppress(OSError, ValueError), proc.stdout:
            for raw in iter(proc.stdout.readline, b""):
                text = raw.decode("utf-8", errors="replace")
                plain = _ANSI.sub("", text)
                lines.append(plain)
                log.write(plain)
                log.flush()
                if self.log:
                    sys.stdout.write(text if coloured else plain)
                    sys.stdout.flush()


# what the deployment itself sets (its processes, files and clock), never taken from a resumed run's checkpoint
_DEPLOYMENT_OWN = {"clients", "tiers", "rounds", "out", "resume", "overwrite", "tier_addresses", "tier_torch_device",
                   "tls_ca", "tls_cert", "tls_key", "token_file", "coordinator_token_file", "sim_clock"}


def as_run(values: Mapping[str, Any], source: str) -> RunSettings:
    """The settings of the run that ``values`` as its run config start: over the app's defaults, which
    :meth:`Deployment.write_app` lists (adaptive cuts), not RunSettings' (static ones)."""
    return RunSettings.layered([(app_config(), None), (values, source)])


def refuse_own_sets(sets: Mapping[str, Any]) -> None:
    """A ``--set`` of what deploy sets itself reached the run config over the deployment's own: ``clients=3``
    for 2 SuperNodes started, ``tiers=2`` for 3 tiers, the addresses of tiers it did not start."""
    for raw in sets:
        name = raw.replace("-", "_")
        name = ALIASES.get(name, name)
        if name in _DEPLOYMENT_OWN:
            use = {"tier_addresses": "its own tiers' addresses", "sim_clock": "off: a deployment measures times"}
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"--set {raw}: deploy sets it itself ({use.get(name, f'use {flag}')})")


def check_tokens(args: argparse.Namespace) -> None:
    """Token files every tier reads as it starts, refused as a tier would refuse them (before: a tier's
    traceback, then its exit, once some had started): one that cannot be read, and the devices' token given as
    the coordinator's (every device holds it: it would let any device load, fetch, release and sum)."""
    from splitfed.transport.security import read_tokens

    read_tokens(args.token_file, args.coordinator_token_file,
                hint=" (or leave --coordinator-token-file out: deploy makes one)")


def made_workdir(given: str | None) -> Path:
    """``--workdir`` made a folder (or a fresh temporary one): a file there was a traceback."""
    if not given:
        return Path(tempfile.mkdtemp(prefix="splitfed-deploy-"))
    try:
        Path(given).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--workdir {given}: cannot make it a folder ({e.strerror})") from None
    return Path(given)


def _again(args: argparse.Namespace, out: str, rounds: str) -> str:
    """The command that continues this run: the checkpoint keeps the run's settings, not the deployment's own
    (TLS, token, node profiles, where the tiers compute, where the logs go), so those are repeated."""
    cmd = ["python", "-m", "server.deploy", "--resume", out, *rounds.split()]
    if args.workdir:  # the same logs (flwr-run.log is appended to) and the same FLWR_HOME
        cmd += ["--workdir", str(Path(args.workdir).resolve())]
    for flag in ("tls_ca", "tls_cert", "tls_key", "token_file", "coordinator_token_file"):
        if getattr(args, flag):
            cmd += [f"--{flag.replace('_', '-')}", str(Path(getattr(args, flag)).resolve())]
    for name in args.profile:
        cmd += ["--profile", name]
    if args.tier_torch_device != "cpu":
        cmd += ["--tier-torch-device", args.tier_torch_device]
    return shlex.join(cmd)


def main(argv: list[str] | None = None) -> int:
    line_buffered()  # the run's lines reach a pipe or file (``| tee``) as they are printed, not at its end
    p = argparse.ArgumentParser(prog="python -m server.deploy", description=__doc__.splitlines()[0],
                                epilog="Extra run settings: --set key=value (e.g. --set mode=sflv2).")
    p.add_argument("--clients", type=int, default=None, help="SuperNodes (default 2; resumed: the run's)")
    p.add_argument("--rounds", type=int, default=None, help="(default 1; resumed: the run's)")
    p.add_argument("--tiers", type=int, choices=(2, 3), default=None, help="(default 3; resumed: the run's)")
    p.add_argument("--out", default=None, help="run folder (metrics, checkpoint, logs; default runs/deploy)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    again.add_argument("--overwrite", action="store_true",
                       help="replace the run the --out folder holds (without it, such a folder is refused)")
    p.add_argument("--workdir", default=None, help="logs, app copy and FLWR_HOME (default: a temporary folder); "
                   "an empty folder or one deploy made (it refuses to replace files it did not write)")
    p.add_argument("--tls-ca", default="")
    p.add_argument("--tls-cert", default="")
    p.add_argument("--tls-key", default="")
    p.add_argument("--token-file", default="", help="the devices' token: every tier and SuperNode gets it")
    p.add_argument("--coordinator-token-file", default="",
                   help="the ServerApp's own token: alone allows load, fetch, release and sum on the tiers "
                        "(default: one made in the workdir)")
    p.add_argument("--profile", action="append", default=[], help="device profile of node i (cycled)")
    p.add_argument("--tier-torch-device", default="cpu", metavar="DEV",
                   help="where the edge and cloud tiers compute: cpu | cuda | cuda:N (default cpu)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any run setting")
    args = p.parse_args(argv)
    sets: dict[str, Any] = {}
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep:
            p.error(f"--set wants KEY=VALUE, got {item!r}")
        sets[k.strip()] = v.strip()
    tls_ca, tls_cert, tls_key, token_file, coordinator_token_file = (
        str(Path(f).resolve()) if f else ""
        for f in (args.tls_ca, args.tls_cert, args.tls_key, args.token_file, args.coordinator_token_file))
    wanted: RunSettings | None = None
    try:
        refuse_own_sets(sets)
        check_tls(args.tls_ca, args.tls_cert, args.tls_key)  # the files as given, named as given
        check_tokens(args)
        saved: dict[str, Any] = {}
        if args.resume:  # as splitfed simulate --resume: the run's own settings, then what is given here
            saved = checkpoint.resumed(args.resume, args.out).settings
        clients = args.clients if args.clients is not None else int(saved.get("clients", 2))
        rounds = args.rounds if args.rounds is not None else int(saved.get("rounds", 1))
        tiers = args.tiers if args.tiers is not None else int(saved.get("tiers", 3))
        overrides: dict[str, Any] = {k.replace("_", "-"): v for k, v in saved.items() if k not in _DEPLOYMENT_OWN}
        out = Path(args.resume or args.out or "runs/deploy").resolve()
        overrides.update({"num-server-rounds": rounds, "out": str(out)})
        if args.resume:
            overrides["resume"] = True
        if args.overwrite:
            overrides["overwrite"] = True
        overrides.update(sets)
        wanted = as_run({"clients": clients, "tiers": tiers, "sim-clock": False, **overrides},
                        "command line")  # deploy's own prefix is printed once
        runfolder.check(wanted.out, wanted.resume, wanted.overwrite)  # before anything starts
        if args.profile:  # a typo would leave every node out at registration
            from splitfed.flower.adaptive import profile_refusal

            refusal = profile_refusal(wanted)
            for name in args.profile:
                if (why := refusal(name)) is not None:
                    raise ConfigError(f"--profile {name}: {why}")
        from splitfed.engine.compute import torch_device

        torch_device(args.tier_torch_device, "--tier-torch-device")  # this machine has it: one line, none started
        if wanted.resume:
            from server.app import check_resume

            check_resume(wanted)  # a checkpoint of other math or other data: refused before anything starts
            if runfolder.nothing_to_do(wanted.out, wanted.rounds, args.resume or wanted.out) is not None:
                return 0
        workdir = made_workdir(args.workdir)
        with processes.SIGNALS.installed(), Deployment(clients, workdir, tls_ca, tls_cert, tls_key, token_file,
                                              profiles=args.profile, tiers=tiers,
                                              coordinator_token_file=coordinator_token_file,
                                              torch_device=args.tier_torch_device, compress=wanted.compress) as dep:
            dep.start()
            print(f"tiers {', '.join(dep.tier_addresses)}; superlink {dep.superlink}; "
                  f"{clients} supernode(s); logs in {dep.workdir}", flush=True)
            before = runfolder.record_mark(wanted.out)  # an earlier run's, if any: not this run's end
            result = dep.run(overrides)
            print(f"run folder: {wanted.out}", flush=True)
            return _outcome(args, wanted, dep.workdir, result.returncode, before)
    except ConfigError as e:
        print(f"deploy: error: {e}", file=sys.stderr)
        return 2
    except StartFailed as e:  # every process it started is stopped by now
        print(f"deploy: error: {e}", file=sys.stderr)
        return 1
    except NodesGone as e:  # the run is stopped by now, as every process deploy started
        print(f"deploy: error: {e}; the run is stopped", file=sys.stderr)
        _kept(args, wanted)
        return 1
    except KeyboardInterrupt as e:  # everything it started is stopped by now
        terminated = isinstance(e, Terminated)
        print(f"deploy: {'terminated' if terminated else 'interrupted'}: every process it started is stopped",
              file=sys.stderr)
        _kept(args, wanted)
        return 143 if terminated else 130


def _outcome(args: argparse.Namespace, wanted: RunSettings, workdir: Path, flwr_code: int,
             before: tuple[Any, ...]) -> int:
    """Deploy's exit code once ``flwr run`` has returned: 0 iff the run folder records the run finished with
    every round kept, else 1 with one line saying why. ``flwr run``'s own code says neither: it exits 0 when
    the ServerApp failed, and may exit non-zero after a run that finished. ``before``: the folder's record
    and run files before the run (:func:`runfolder.record_mark`); still the same, the run left no trace, and
    a "finished" there is the run it was to replace (``--overwrite``) or continue."""
    logs = f"see {workdir / 'flwr-run.log'} and {workdir / 'superlink.log'}"
    if runfolder.record_mark(wanted.out) == before:
        print(f"deploy: error: the run left no trace: the run folder {wanted.out} is as it was before (its "
              f"ServerApp did not start, or stopped before round 1 of {wanted.rounds} ended; {logs})",
              file=sys.stderr, flush=True)
        return 1
    st = runstatus.status(wanted.out)
    done, rounds = checkpoint.resume_point(wanted.out, wanted.rounds)
    if st.state == "finished" and done >= wanted.rounds:
        if flwr_code:
            print(f"deploy: flwr run exited with code {flwr_code} after the run finished", file=sys.stderr)
        return 0
    if done >= wanted.rounds:  # every round kept, and no summary: a resume with nothing to train writes it
        said = (f"the run kept every round but did not finish: {_ended(st)} ({logs}); write its summary with: "
                f"{_again(args, wanted.out, rounds)}")
    elif done:
        said = (f"the run stopped after round {done} of {wanted.rounds} ({logs}); continue it with: "
                f"{_again(args, wanted.out, rounds)}")
    else:
        said = f"the run stopped before round 1 of {wanted.rounds} ended ({logs}); nothing to resume"
    print(f"deploy: error: {said}", file=sys.stderr, flush=True)
    return 1


def _ended(st: runstatus.RunStatus) -> str:
    """How the run folder says its run ended (:func:`runstatus.status`), in a few words of one line."""
    rec = st.record
    if st.state == "failed":
        return "it failed: " + " ".join(str(rec.get("error") or rec.get("error_type") or "").split())
    if st.state == "stopped":
        return f"it was stopped by {rec.get('signal') or rec.get('reason') or 'a signal'}"
    if st.state == "crashed":
        return "it crashed (its ServerApp ended without recording how)"
    if st.state == "running":
        return "it was still running when flwr run returned"
    return f"it recorded no end (the folder reads {st.state})"


def _kept(args: argparse.Namespace, wanted: RunSettings | None) -> None:
    """After a run stopped short: what its folder keeps, and how to go on."""
    if wanted is None:
        return
    with contextlib.suppress(ConfigError):
        done, rounds = checkpoint.resume_point(wanted.out, wanted.rounds)
        if 0 < done < wanted.rounds:
            print(f"deploy: round {done} of {wanted.rounds} is kept in {wanted.out}; continue it with: "
                  f"{_again(args, wanted.out, rounds)}", file=sys.stderr)
        elif done == 0:
            print(f"deploy: no round was kept in {wanted.out}: run the same command again to start over",
                  file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
