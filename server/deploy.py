"""A whole deployment on one machine: SuperLink, N SuperNodes, edge and cloud tiers, ``flwr run``.

    python -m server.deploy --clients 2 --rounds 1 --out runs/deploy
    python -m server.deploy --resume runs/deploy --rounds 3      # or --overwrite: replace that run
    python -m server.deploy --clients 3 --tls-ca ca.pem --tls-cert cert.pem --tls-key key.pem \\
        --token-file token --profile rpi4 --profile laptop --profile phone-mid

What it starts (every process in its own session, all stopped on exit, error
or Ctrl-C, children included):

1. the cloud and edge tier servers (``splitfed tier``), edge -> cloud;
2. ``flower-superlink`` (Fleet, Control and Runtime APIs on one HTTP port);
3. ``flower-supernode`` i = 0..N-1 with ``--node-config 'partition-id=i
   num-partitions=N device-profile="..." edge-address="..."'`` (and the TLS
   files the ClientApp uses towards the edge);
4. ``flwr run APP CONNECTION --run-config ... --stream`` where APP is a copy of
   ``server/`` and ``clients/`` with a generated ``pyproject.toml`` (every
   setting of :class:`~splitfed.flower.config.RunSettings` is listed under
   ``[tool.flwr.app.config]`` so any of them can be overridden) and CONNECTION
   is written to a private ``FLWR_HOME/config.toml``. (Flower 1.42 keeps
   SuperLink connections there; run against the repository itself, ``flwr run``
   would move ``[tool.flwr.federations]`` out of its pyproject.toml.)

TLS: with ``--tls-ca/--tls-cert/--tls-key`` every hop is encrypted: SuperLink
(``--ssl-*``), SuperNodes and ``flwr`` (verify it against the CA), and the
tier servers (mutual TLS: the ServerApp and every ClientApp present the given
certificate). The certificate must name 127.0.0.1 (or the host you use) and
allow both server and client authentication. Without certificates everything
runs with ``--insecure``, which is only sensible on loopback.

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
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from splitfed import tomlio
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.config import RunSettings

BIN = Path(sys.executable).parent
CONNECTION = "splitfed-local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    tiers: int = 3
    log: bool = True
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    tier_addresses: list[str] = field(default_factory=list)
    superlink: str = ""

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ConfigError(f"clients must be >= 1, got {self.clients}")
        if bool(self.tls_cert) != bool(self.tls_key) or (self.tls_cert and not self.tls_ca):
            raise ConfigError("TLS needs --tls-ca, --tls-cert and --tls-key together")
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = self.workdir / "flwr-home"
        self.home.mkdir(exist_ok=True)
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": "1"}

    @property
    def secure(self) -> bool:
        return bool(self.tls_ca)

    # ------------------------------------------------------------ processes

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        out = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env, cwd=self.workdir, start_new_session=True)
        out.close()
        self.procs[name] = proc
        return proc

    def start(self) -> Deployment:
        """Start tiers, SuperLink and SuperNodes (all at once: they find each other by address)."""
        self._start_tiers()
        port = free_port()
        self.superlink = f"127.0.0.1:{port}"
        tls = (["--ssl-certfile", self.tls_cert, "--ssl-keyfile", self.tls_key, "--ssl-ca-certfile", self.tls_ca]
               if self.secure else ["--insecure"])
        self._spawn("superlink", [str(BIN / "flower-superlink"), *tls, "--host", "127.0.0.1", "--port", str(port),
                                  "--disable-runtime-dependency-installation"])
        for i in range(self.clients):
            self.start_supernode(i)
        self._wait_port(port, "superlink")
        return self

    def start_supernode(self, i: int) -> subprocess.Popen:
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
            "--host", "127.0.0.1", "--port", str(free_port())])

    def _start_tiers(self) -> None:
        """Cloud first (the edge needs its address); ports chosen here, readiness awaited."""
        names = ["edge", "cloud"][: self.tiers - 1] if self.tiers <= 3 else None
        if names is None:
            raise ConfigError("the local deployment starts 2 or 3 tiers")
        ports = [free_port() for _ in names]
        self.tier_addresses = [f"127.0.0.1:{p}" for p in ports]
        security = (["--tls-cert", self.tls_cert, "--tls-key", self.tls_key, "--tls-ca", self.tls_ca]
                    if self.secure else ["--insecure"])
        if self.token_file:
            security += ["--token-file", self.token_file]
        for idx in reversed(range(len(names))):
            role = "edge" if idx + 1 < len(names) else "cloud"
            nxt = ["--next", self.tier_addresses[idx + 1]] if idx + 1 < len(names) else []
            self._spawn(names[idx], [str(BIN / "splitfed"), "tier", "--role", role, "--name", names[idx],
                                     "--listen", self.tier_addresses[idx], *nxt, *security])
        for name, port in zip(names, ports, strict=True):
            self._wait_port(port, name)

    def _wait_port(self, port: int, name: str, timeout: float = 180.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}:\n{self.tail(name)}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{name} did not listen on port {port} within {timeout:.0f}s:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""

    def kill(self, name: str) -> None:
        """SIGKILL a process and everything it started (a machine that dies)."""
        proc = self.procs[name]
        for p in _tree(proc.pid):
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.wait(10)

    def stop(self) -> None:
        """SIGTERM every process tree, SIGKILL what is left after 5 s."""
        trees = {name: _tree(p.pid) for name, p in self.procs.items() if p.poll() is None}
        for tree in trees.values():
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGTERM)
        alive = [p for tree in trees.values() for p in tree]
        _, alive = psutil.wait_procs(alive, timeout=5)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ the run

    def write_app(self, repo: Path | None = None) -> Path:
        """A Flower App folder: ``server/``, ``clients/`` and a pyproject listing every setting."""
        repo = repo or Path(__file__).resolve().parent.parent
        app = self.workdir / "app"
        shutil.rmtree(app, ignore_errors=True)
        app.mkdir()
        for pkg in ("server", "clients"):
            shutil.copytree(repo / pkg, app / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        defaults = {k.replace("_", "-"): v for k, v in RunSettings().to_dict().items()}
        defaults["num-server-rounds"] = defaults.pop("rounds")
        config = "\n".join(f"{k} = {tomlio.value(v)}" for k, v in defaults.items())
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
        cfg.update(overrides)
        RunSettings.from_mapping(cfg, source="run config")  # refuse bad values before anything runs
        return cfg

    def run(self, overrides: Mapping[str, Any], timeout: float = 1800.0) -> subprocess.CompletedProcess:
        """``flwr run APP CONNECTION --run-config ... --stream``; returns when the run has ended."""
        app = self.write_app()
        cmd = [str(BIN / "flwr"), "run", str(app), CONNECTION, "--run-config", _kv(self.run_config(overrides)),
               "--stream"]
        out = subprocess.run(cmd, env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout)
        (self.workdir / "flwr-run.log").write_text(out.stdout + out.stderr)
        if self.log:
            print(out.stdout[-4000:], out.stderr[-2000:], sep="\n")
        return out


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


# what the deployment itself sets (its processes, files and clock), never taken from a resumed run's checkpoint
_DEPLOYMENT_OWN = {"clients", "tiers", "rounds", "out", "resume", "overwrite", "tier_addresses", "tls_ca", "tls_cert",
                   "tls_key", "token_file", "sim_clock"}


def main(argv: list[str] | None = None) -> int:
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
    p.add_argument("--workdir", default=None, help="logs, app copy and FLWR_HOME (default: a temporary folder)")
    p.add_argument("--tls-ca", default="")
    p.add_argument("--tls-cert", default="")
    p.add_argument("--tls-key", default="")
    p.add_argument("--token-file", default="")
    p.add_argument("--profile", action="append", default=[], help="device profile of node i (cycled)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any run setting")
    args = p.parse_args(argv)
    sets: dict[str, Any] = {}
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep:
            p.error(f"--set wants KEY=VALUE, got {item!r}")
        sets[k.strip()] = v.strip()
    tls_ca, tls_cert, tls_key, token_file = (str(Path(f).resolve()) if f else ""
                                             for f in (args.tls_ca, args.tls_cert, args.tls_key, args.token_file))
    try:
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
        wanted = RunSettings.from_mapping({"clients": clients, "tiers": tiers, "sim-clock": False, **overrides},
                                          source="deploy")
        runfolder.check(wanted.out, wanted.resume, wanted.overwrite)  # before anything starts
        if wanted.resume:
            from server.app import check_resume

            check_resume(wanted)  # a checkpoint of other math or other data: refused before anything starts
            done = checkpoint.load(wanted.out).round
            if done >= wanted.rounds:
                print(f"nothing to do: {wanted.out} already holds round {done} of {wanted.rounds} "
                      f"(to train on: --resume {args.resume or wanted.out} --rounds {done + 1} or more)",
                      file=sys.stderr)
                return 0
        workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="splitfed-deploy-"))
        with Deployment(clients, workdir, tls_ca, tls_cert, tls_key, token_file, profiles=args.profile,
                        tiers=tiers) as dep:
            dep.start()
            print(f"tiers {', '.join(dep.tier_addresses)}; superlink {dep.superlink}; "
                  f"{clients} supernode(s); logs in {workdir}", flush=True)
            result = dep.run(overrides)
            print(f"run folder: {overrides['out']}")
            return result.returncode
    except ConfigError as e:
        print(f"deploy: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
