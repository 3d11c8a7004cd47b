"""What ``server/deploy.py``'s stopping, ``flwr run`` and process helpers promise that the mutation run found
unpinned (its lines 521-760):

- a stop gives every process ``grace`` seconds after its SIGTERM (or SIGINT after a Ctrl-C, SIGTERM otherwise),
  returns as soon as the processes and their trees are gone, SIGKILLs only what is left at the grace, and
  closes its pipe from the guard;
- the run config names the deployment's own tiers, TLS and token files (only those it has), with the simulated
  clock off; ``flwr run`` leads a session of its own and is ended when its time is up;
- ``_check_nodes`` fails the run once every SuperNode has exited, not before; in ``server/processes.py`` (split
  out of deploy since), ``listens`` finds a port held by a process under the one started; ``wait`` runs its
  check between slices and names its timeout; ``alive`` tells a live process from a zombie; ``send_signal``
  never signals the group of a leader already waited for;
- ``--workdir`` may name nested folders (none: a temporary one); ``--help`` opens with the module's first line;
  ``--tiers`` takes 2 and 3 and nothing else.

The stop's own loop runs on a fake clock (and fake processes): exact, and no test waits out a grace.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from server import deploy, processes
from server.deploy import Deployment, NodesGone, free_port, made_workdir, main
from splitfed.errors import Terminated
from tests.transport_fixtures import Certs, certs  # noqa: F401 - certs: a fixture

# ------------------------------------------------------------------ the stop, on a fake clock

STEP = 0.125  # each sleep of the stop's loop moves the fake clock this far (exact in binary)


class _Clock:
    """``time`` as deploy's stop sees it: ``sleep`` moves ``now`` on, and nothing really waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += STEP


class _Proc:
    """A process deploy started (a ``Popen``) that ends ``ends_after`` fake seconds after its first signal
    (never, with None); its tree is itself and ``under`` (processes under it, maybe in other groups)."""

    def __init__(self, clock: _Clock, pid: int, ends_after: float | None, under: tuple[_Under, ...] = ()) -> None:
        self.clock, self.pid, self.ends_after, self.under = clock, pid, ends_after, under
        self.returncode: int | None = None
        self.signalled_at: float | None = None

    def poll(self) -> int | None:
        if (self.returncode is None and self.signalled_at is not None and self.ends_after is not None
                and self.clock.now >= self.signalled_at + self.ends_after):
            self.returncode = -signal.SIGTERM
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.poll()


class _Under:
    """A process under a leader (psutil's view): alive until ``ends_after`` fake seconds after its signal."""

    def __init__(self, clock: _Clock, ends_after: float | None, leader: _Proc | None = None) -> None:
        self.clock, self.ends_after, self.leader = clock, ends_after, leader
        self.signalled_at: float | None = None
        self.killed = False

    def alive(self) -> bool:
        if self.leader is not None:  # the leader itself, as its own tree lists it
            return self.leader.poll() is None
        if self.killed:
            return False
        return not (self.signalled_at is not None and self.ends_after is not None
                    and self.clock.now >= self.signalled_at + self.ends_after)


def _fake_stop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clock: _Clock, procs: dict[str, _Proc],
               grace: float) -> list[tuple[float, int, list[object]]]:
    """Stop a deployment of ``procs`` on ``clock``; each signal as (when, signal, what it reached alive)."""
    sent: list[tuple[float, int, list[object]]] = []

    def fake_signal(leaders: list[_Proc], under: list[_Under], sig: int) -> None:
        reached: list[object] = [p for p in leaders if p.returncode is None]
        reached += [q for q in under if q.leader is None and q.alive()]
        for p in reached:
            if sig == signal.SIGKILL:
                if isinstance(p, _Proc):
                    p.returncode = -signal.SIGKILL
                else:
                    p.killed = True
            elif p.signalled_at is None:
                p.signalled_at = clock.now
        sent.append((clock.now, sig, reached))

    trees = {p.pid: [_Under(clock, None, leader=p), *p.under] for p in procs.values()}
    monkeypatch.setattr(deploy, "time", clock)
    monkeypatch.setattr(processes, "send_signal", fake_signal)
    monkeypatch.setattr(processes, "tree", lambda pid: trees.get(pid, []))
    monkeypatch.setattr(processes, "alive", lambda q: q.alive())
    dep = Deployment(1, tmp_path, log=False, grace=grace)
    dep.procs.update(procs)  # type: ignore[arg-type]
    dep.stop()
    return sent


def test_a_stop_waits_for_a_process_that_ends_on_sigterm_and_returns_once_it_has(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A process that takes 0.25 s to end after its SIGTERM (a ServerApp recording its stop) is given that
    time, not SIGKILLed at once; and the stop returns as soon as it has ended, not at the end of the grace."""
    clock = _Clock()
    app = _Proc(clock, 101, ends_after=0.25)
    sent = _fake_stop(monkeypatch, tmp_path, clock, {"app": app}, grace=5.0)
    assert [(t, sig) for t, sig, _ in sent] == [(0.0, signal.SIGTERM), (0.25, signal.SIGKILL)]
    assert sent[0][2] == [app] and sent[1][2] == []  # the SIGKILL reaches nothing: nothing is left
    assert app.returncode == -signal.SIGTERM and clock.now == 0.25


def test_a_stop_waits_for_a_process_under_a_leader_that_ended_first(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A SuperLink ends at once on SIGTERM, the SuperExec under it (a session of its own) takes 0.5 s: the stop
    waits for both, so that neither is SIGKILLed in the middle of its own stop."""
    clock = _Clock()
    exec_ = _Under(clock, ends_after=0.5)
    link = _Proc(clock, 102, ends_after=0.125, under=(exec_,))
    sent = _fake_stop(monkeypatch, tmp_path, clock, {"superlink": link}, grace=5.0)
    assert [(t, sig) for t, sig, _ in sent] == [(0.0, signal.SIGTERM), (0.5, signal.SIGKILL)]
    assert sent[0][2] == [link, exec_] and sent[1][2] == []
    assert not exec_.killed and link.returncode == -signal.SIGTERM


def test_what_ignores_sigterm_is_sigkilled_once_the_grace_is_up(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A process that never ends on SIGTERM gets SIGKILL at the grace (0.5 s here), with the process under it
    that did not end either, and the one that did end is not signalled again."""
    clock = _Clock()
    stuck_under = _Under(clock, ends_after=None)
    stuck = _Proc(clock, 103, ends_after=None, under=(stuck_under,))
    quick = _Proc(clock, 104, ends_after=0.125)
    sent = _fake_stop(monkeypatch, tmp_path, clock, {"stuck": stuck, "quick": quick}, grace=0.5)
    assert [(t, sig) for t, sig, _ in sent] == [(0.0, signal.SIGTERM), (0.5, signal.SIGKILL)]
    assert sent[1][2] == [stuck, stuck_under]
    assert (stuck.returncode, quick.returncode) == (-signal.SIGKILL, -signal.SIGTERM) and stuck_under.killed


@pytest.mark.parametrize("exc, sig", [(None, signal.SIGTERM), (KeyboardInterrupt(), signal.SIGINT),
                                      (Terminated(), signal.SIGTERM), (RuntimeError("boom"), signal.SIGTERM)])
def test_leaving_a_deployment_passes_on_a_ctrl_c_as_sigint_and_stops_with_sigterm_otherwise(
        tmp_path: Path, exc: BaseException | None, sig: int) -> None:
    """The run folder records the signal its ServerApp gets: a Ctrl-C is the user's (SIGINT); SIGTERM to deploy
    (Terminated, a KeyboardInterrupt too), an error or a normal end stop everything with SIGTERM."""
    dep = Deployment(1, tmp_path, log=False)
    stops: list[int] = []
    dep.stop = stops.append  # type: ignore[method-assign, assignment]
    dep.__exit__(type(exc) if exc is not None else None, exc, None)
    assert stops == [sig]


def test_a_stop_closes_its_pipe_from_the_guard(tmp_path: Path) -> None:
    """The guard has ended with the deployment, and deploy keeps no pipe from it open (one per deployment)."""
    dep = Deployment(1, tmp_path, log=False)
    with dep:
        proc = dep._spawn("a", ["sleep", "300"])
        guard = dep._guard
        assert guard is not None and guard.stdout is not None and not guard.stdout.closed
    assert proc.returncode == -signal.SIGTERM
    assert guard.returncode is not None and guard.stdout.closed and dep._guard is None


# ------------------------------------------------------------------ the run config and flwr run


def _dep(tmp_path: Path, **kw: Any) -> Deployment:
    dep = Deployment(2, tmp_path / "work", log=False, **kw)
    dep.tier_addresses = ["127.0.0.1:1001", "127.0.0.1:1002"]
    return dep


def test_the_run_config_without_tls_or_token_names_neither(tmp_path: Path) -> None:
    """The deployment's own clients, tiers and addresses, the clock off (a deployment measures its times), its
    coordinator token, then the overrides; no TLS or device-token key when it has none."""
    dep = _dep(tmp_path)
    out = str(tmp_path / "run")
    assert dep.run_config({"num-server-rounds": 2, "out": out}) == {
        "clients": 2, "tiers": 3, "sim-clock": False, "tier-addresses": "127.0.0.1:1001,127.0.0.1:1002",
        "coordinator-token-file": dep.coordinator_token_file, "num-server-rounds": 2, "out": out}
    assert deploy.as_run(dep.run_config({"out": out}), "run config").sim_clock is False


def test_the_run_config_with_tls_and_a_token_names_their_files(tmp_path: Path, certs: Certs) -> None:  # noqa: F811
    """With TLS and a devices' token, the ServerApp gets the same files the tiers were started with."""
    token = tmp_path / "token"
    token.write_text("a-devices-token-of-some-length-0123456789")
    tls = {"tls_ca": str(certs.ca), "tls_cert": str(certs.server.cert), "tls_key": str(certs.server.key)}
    dep = _dep(tmp_path, token_file=str(token), **tls)
    cfg = dep.run_config({})
    assert {k: cfg.get(k) for k in ("tls-ca", "tls-cert", "tls-key", "token-file", "sim-clock")} == {
        "tls-ca": str(certs.ca), "tls-cert": str(certs.server.cert), "tls-key": str(certs.server.key),
        "token-file": str(token), "sim-clock": False}


def _fake_flwr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """deploy's ``flwr`` is a Python script of ``body`` (nothing of Flower runs)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "flwr").write_text(f"#!{sys.executable}\n{body}\n")
    (folder / "flwr").chmod(0o755)
    monkeypatch.setattr(deploy, "BIN", folder)


def test_flwr_run_leads_a_session_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal's Ctrl-C reaches deploy alone (which passes it on as it stops everything), not ``flwr run``
    beside it; its output comes back in the result."""
    _fake_flwr(tmp_path, monkeypatch, "import os\nprint(os.getpid(), os.getsid(0), flush=True)")
    with _dep(tmp_path) as dep:
        result = dep.run({"out": str(tmp_path / "run")})
    pid, sid = (int(w) for w in result.stdout.split())
    assert result.returncode == 0 and pid == sid != os.getsid(0)


def test_flwr_run_out_of_time_is_ended_before_the_timeout_is_raised(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``run(timeout=...)``: once the time is up, ``flwr run`` is ended (SIGTERM) by the time the
    TimeoutExpired reaches the caller."""
    _fake_flwr(tmp_path, monkeypatch, "import time\ntime.sleep(300)")
    with _dep(tmp_path) as dep:
        with pytest.raises(subprocess.TimeoutExpired):
            dep.run({"out": str(tmp_path / "run")}, timeout=0.3)
        assert dep._flwr is not None and dep._flwr.returncode == -signal.SIGTERM


# ------------------------------------------------------------------ the helpers


def _exited(code: int) -> SimpleNamespace:
    return SimpleNamespace(poll=lambda: code, returncode=code)


RUNNING = SimpleNamespace(poll=lambda: None, returncode=None)


def test_the_run_fails_once_every_supernode_has_exited_and_not_before(tmp_path: Path) -> None:
    """One node gone is the run's to survive (a tier gone is not a node); all gone, NodesGone names each
    node's exit code and log."""
    dep = Deployment(2, tmp_path, log=False)
    dep.procs.update({"edge": _exited(1), "supernode0": _exited(3), "supernode1": RUNNING})  # type: ignore[dict-item]
    dep._check_nodes()
    dep.procs["supernode1"] = _exited(-9)  # type: ignore[assignment]
    with pytest.raises(NodesGone) as e:
        dep._check_nodes()
    assert str(e.value) == (f"every SuperNode exited: supernode0 with code 3 (see {dep.workdir / 'supernode0.log'}), "
                            f"supernode1 with code -9 (see {dep.workdir / 'supernode1.log'})")
    dep.procs.update({"supernode0": RUNNING, "supernode1": RUNNING})  # type: ignore[dict-item]
    dep._check_nodes()


_LISTEN = ("import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
           "print(s.getsockname()[1], flush=True)\ntime.sleep(300)")


def test_a_port_held_by_a_process_two_levels_under_the_one_started_is_found() -> None:
    """As a SuperLink's port may be held by a process it started: the listener is a grandchild here (a shell,
    a subshell, then Python). Only that port counts: not another one, free."""
    inner = f"{sys.executable} -c \"$L\"; :"
    root = subprocess.Popen(["sh", "-c", f"sh -c '{inner}'; :"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "L": _LISTEN}, start_new_session=True)
    try:
        assert root.stdout is not None
        port = int(root.stdout.readline())
        listener = next(p for p in psutil.Process(root.pid).children(recursive=True) if p.name().startswith("python"))
        assert listener.ppid() != root.pid  # two levels under
        assert listener in processes.tree(root.pid)
        assert processes.listens(root.pid, port) is True
        other = free_port()
        assert other != port and processes.listens(root.pid, other) is False
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait(10)


@pytest.fixture
def sleeper():  # type: ignore[no-untyped-def]
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield p
    if p.poll() is None:
        p.kill()
    p.wait(10)


def test_wait_names_its_timeout_and_runs_without_a_check(sleeper) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(subprocess.TimeoutExpired) as e:
        processes.wait(sleeper, 0.3)
    assert e.value.timeout == 0.3 and "0.3 seconds" in str(e.value)
    with pytest.raises(subprocess.TimeoutExpired) as e:
        processes.wait(sleeper, 0)
    assert e.value.timeout == 0.0 and sleeper.poll() is None


def test_wait_runs_its_check_between_slices_and_lets_it_raise(sleeper) -> None:  # type: ignore[no-untyped-def]
    """The run's check (every SuperNode gone) ends the wait long before its timeout."""
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise NodesGone("every SuperNode exited")

    with pytest.raises(NodesGone):
        processes.wait(sleeper, 30.0, check)
    assert len(calls) == 2 and sleeper.poll() is None


def test_alive_tells_a_live_process_from_a_zombie_and_one_gone(sleeper) -> None:  # type: ignore[no-untyped-def]
    assert processes.alive(psutil.Process(sleeper.pid)) is True
    done = subprocess.Popen(["true"])
    zombie = psutil.Process(done.pid)
    try:
        for _ in range(100):
            if zombie.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        assert zombie.is_running() and zombie.status() == psutil.STATUS_ZOMBIE
        assert processes.alive(zombie) is False
    finally:
        done.wait(10)
    assert processes.alive(zombie) is False

    def gone() -> str:
        raise psutil.NoSuchProcess(12345)

    assert processes.alive(SimpleNamespace(is_running=lambda: True, status=gone)) is False  # type: ignore[arg-type]


def test_signal_reaches_a_live_leaders_group_and_never_one_already_waited_for(sleeper) -> None:  # type: ignore[no-untyped-def]
    """A leader already waited for may have had its pid (its group's number) given to another process: that
    group is not signalled. A live leader's group is."""
    waited = SimpleNamespace(pid=sleeper.pid, returncode=0)  # its pid: now another process's group
    processes.send_signal([waited], [], signal.SIGTERM)  # type: ignore[list-item]
    live = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        processes.send_signal([live], [], signal.SIGTERM)
        assert live.wait(10) == -signal.SIGTERM
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(0.3)
    finally:
        live.kill()
        live.wait(10)


# ------------------------------------------------------------------ the command line


def test_workdir_may_name_nested_folders_and_none_is_a_fresh_temporary_one(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b" / "work"
    assert made_workdir(str(nested)) == nested and nested.is_dir()
    for given in (None, ""):
        made = made_workdir(given)
        try:
            assert made.is_dir() and made.parent == Path(tempfile.gettempdir())
            assert made.name.startswith("splitfed-deploy-") and not any(made.iterdir())
        finally:
            shutil.rmtree(made)


def test_help_opens_with_the_first_line_of_the_module(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "A whole deployment on one machine: SuperLink, N SuperNodes, edge and cloud tiers, ``flwr run``." in out


@pytest.mark.parametrize("tiers", ["2", "3"])
def test_tiers_takes_2_and_3(tiers: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Taken: the next check (a --set of what deploy sets) refuses, before anything starts."""
    assert main(["--tiers", tiers, "--out", str(tmp_path / "run"), "--set", "clients=3"]) == 2
    err = capsys.readouterr().err
    assert err == "deploy: error: --set clients: deploy sets it itself (use --clients)\n", err


@pytest.mark.parametrize("tiers", ["1", "4"])
def test_tiers_refuses_anything_else(tiers: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as e:
        main(["--tiers", tiers, "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    assert f"argument --tiers: invalid choice: {tiers} (choose from 2, 3)" in capsys.readouterr().err
