"""``python -m server.deploy`` ended from outside, or losing its SuperLink: nothing it started keeps running.

Deploy starts every process in a session of its own (a terminal's Ctrl-C reaches deploy alone), and Flower
starts more in sessions of their own (the SuperLink's SuperExec and the flwr-serverapp it runs). Before:

- SIGKILL (or SIGTERM) to deploy left the whole deployment running: tiers, SuperLink, SuperNodes and the
  ServerApp went on training into the run folder, and ``--resume`` was refused "in use by another run";
- deploy exited 0 when the ServerApp died mid-run (``flwr run``'s exit code);
- stopping only reached the trees of live processes: a dead SuperLink's orphaned flwr-serverapp kept the
  run folder locked for 5-50 s after deploy had returned.

The first two tests need no Flower (processes that stand for it, ~2 s each); the real ones (slow) each start
a whole local deployment of 50 rounds and end it while its ServerApp and a ClientApp run (~30 s on 2 cores).
Those that need a round kept (a SIGKILLed SuperLink; Ctrl-C, in test_deploy_review) resume a run folder that
holds round 1 (what a finished round leaves: ``_held_run``) rather than train it first (that cost ~30 s more
each; rounds trained by a real deployment are test_flower_deploy's). All but the SIGKILL of deploy run one
SuperNode; that one keeps two, so that every kind of group the guard must take is there twice.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from server.deploy import Deployment
from server.processes import SIGNALS
from splitfed.errors import ConfigError, Terminated
from splitfed.flower import checkpoint, runfolder, runstatus
from tests.sigint_ignored import ignoring_sigint
from tests.test_flower_deploy import _held_run

pytestmark = pytest.mark.xdist_group("flower-deploy")  # real deployments, one at a time (no Ray: beside flower-real)

ROOT = Path(__file__).resolve().parent.parent
GONE_S = 15.0  # the guard's grace (5 s) and its SIGKILL, with room to spare; only a leak gets here


def _alive(p: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's zombie may stay: the init of a container need not reap it)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait(what: Callable[[], object], timeout: float, step: float = 0.2) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = what()
        if found:
            return found
        time.sleep(step)
    return what()


def _left(procs: list[psutil.Process], timeout: float = 0.0) -> list[str]:
    """Those of ``procs`` still alive after ``timeout`` s, by command line."""
    _wait(lambda: not any(_alive(p) for p in procs), timeout)
    return [f"{p.pid} {_cmd(p)[:160]}" for p in procs if _alive(p)]


@pytest.fixture
def reaped() -> Iterator[list[psutil.Process]]:
    """Processes a test saw: whatever of them a failing test leaves is SIGKILLed (psutil checks each is still
    the process that was seen)."""
    seen: list[psutil.Process] = []
    yield seen
    for p in seen:
        if _alive(p):
            try:
                p.kill()
            except psutil.Error:
                pass


# --------------------------------------------------------------- the guard, with stand-ins for Flower

# a child that leads its own session (as deploy starts each) and starts a grandchild in a session of its own
# (as a SuperLink starts its SuperExec), then both sleep; prints the grandchild's pid
_ESCAPES = ["sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 300"]


def _escaped(log: Path) -> int:
    return int(str(_wait(lambda: log.read_text().strip() if log.is_file() else "", 10)))


def test_a_killed_deploy_takes_every_process_group_with_it(tmp_path, reaped):
    """SIGKILL to the process holding a Deployment: the guard stops its children and the grandchild that
    made a session of its own (no Flower needed to show it)."""
    script = textwrap.dedent(f"""
        import sys, time
        from server.deploy import Deployment
        dep = Deployment(1, {str(tmp_path)!r}, log=False)
        dep._spawn("a", {_ESCAPES!r})
        print(dep.procs["a"].pid, flush=True)
        time.sleep(300)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        child = psutil.Process(int(holder.stdout.readline()))
        grandchild = psutil.Process(_escaped(tmp_path / "a.log"))
        reaped.extend([child, grandchild])
        # out of reach of its parent's group (once setsid has run: `$!` is known before it has)
        assert _wait(lambda: os.getsid(grandchild.pid) != os.getsid(child.pid), 10)
        time.sleep(1.5)  # the guard looks for new groups twice a second
        everything = [*psutil.Process(holder.pid).children(recursive=True), grandchild]
        reaped.extend(everything)
        holder.kill()
        holder.wait(10)
        assert not _left(everything, GONE_S), everything
    finally:
        holder.kill()
        holder.wait(10)


def test_stop_takes_the_group_of_an_orphan(tmp_path, reaped):
    """A child dies alone (as a SuperLink may); its grandchild in a session of its own (its flwr-serverapp)
    is an orphan no process tree leads to: stop() still ends it. Deployment.kill takes the whole group of
    the process it kills, not only its tree."""
    dep = Deployment(1, tmp_path, log=False)
    with dep:
        a = dep._spawn("a", _ESCAPES)
        orphan = psutil.Process(_escaped(tmp_path / "a.log"))
        # b's group holds a process that is not in b's tree: its parent (a subshell) is gone
        b = dep._spawn("b", ["sh", "-c", "(sleep 300 </dev/null >/dev/null 2>&1 &); exec sleep 300"])
        # b's shell waits for its subshell before it execs sleep: once b is sleep, the subshell is gone
        b_kids = _wait(lambda: psutil.Process(b.pid).name() == "sleep" and _group(b.pid) - {b.pid}, 10)
        assert isinstance(b_kids, set) and b_kids and not psutil.Process(b.pid).children(), b_kids
        b_kids = [psutil.Process(pid) for pid in b_kids]
        reaped.extend([orphan, *b_kids])
        time.sleep(1.5)  # the guard looks for new groups twice a second
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
        assert _alive(orphan) and orphan.ppid() != a.pid
        dep.kill("b")  # a machine that dies: its process and every one of its group
        assert b.returncode == -signal.SIGKILL and not _left(b_kids, 5), b_kids
        started = time.monotonic()
    assert not _left([orphan]), "stop() left the orphan running"
    assert time.monotonic() - started < dep.grace + 3


def _group(pgid: int) -> set[int]:
    found = set()
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and _alive(p):
                found.add(p.pid)
        except (OSError, psutil.Error):
            pass
    return found


def test_a_signal_while_a_child_starts_waits_until_the_child_is_guarded():
    """A child started but not yet handed to the guard would outlive deploy: the signal waits for that."""
    before = signal.getsignal(signal.SIGTERM)
    reached = False
    with pytest.raises(Terminated), SIGNALS.installed():
        with SIGNALS.held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs here, and holds the signal back
            reached = True
    assert reached
    assert signal.getsignal(signal.SIGTERM) is before  # main() leaves the handlers as it found them


def test_a_deploy_started_ignoring_sigint_leaves_it_ignored():
    """A background job of a script starts with SIGINT ignored (Ctrl-C is for the job in the foreground):
    deploy put its own handler in anyway, and a Ctrl-C meant for another job stopped the deployment."""
    script = ("import signal\n"
              "from server.processes import SIGNALS\n"
              "with SIGNALS.installed():\n"
              "    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN,\n"
              "          signal.getsignal(signal.SIGTERM) == SIGNALS.handle)\n"
              "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n")
    p = subprocess.run(ignoring_sigint([sys.executable, "-c", script]), cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.stdout.split() == ["True", "True", "True"], p.stderr


# --------------------------------------------------------------- real deployments

def _deploy(tmp: Path, *args: str, clients: int = 2) -> tuple[subprocess.Popen, Path, Path]:
    out, work = tmp / "run", tmp / "work"
    log = open(tmp / "deploy.out", "w")  # noqa: SIM115 - a file, not a pipe: deploy's output never blocks it
    p = subprocess.Popen([sys.executable, "-m", "server.deploy", "--clients", str(clients), "--out", str(out),
                          "--workdir", str(work), *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    log.close()
    return p, out, work


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _family(p: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(p.pid).children(recursive=True)
    except psutil.Error:
        return []


def _running(p: subprocess.Popen, reaped: list[psutil.Process], tmp: Path, *, checkpointed: bool,
             names: tuple[str, ...] = ("flwr-serverapp", "flower-superexec", "flwr-clientapp")) -> list:
    """Wait until the deployment runs (round 1 checkpointed, if asked) and every process in ``names`` is
    there; all of deploy's descendants then."""
    out = tmp / "run"

    def ready() -> list[psutil.Process] | None:
        if p.poll() is not None:
            pytest.fail(f"deploy ended ({p.returncode}):\n{(tmp / 'deploy.out').read_text()[-3000:]}")
        if checkpointed and not (out / checkpoint.FILENAME).is_file():
            return None
        family = _family(p)
        reaped.extend(family)
        cmds = [_cmd(q) for q in family if _alive(q)]
        return family if all(any(n in c for c in cmds) for n in names) else None

    family = _wait(ready, 240)
    assert family, (tmp / "deploy.out").read_text()[-3000:]
    assert isinstance(family, list)
    return family


def _not_in_use(out: Path) -> None:
    """What deploy checks before a --resume starts anything: the folder is not in use by another run."""
    runfolder.check(out, resume=True, overwrite=False)


def _free_soon(out: Path, timeout: float = GONE_S) -> None:
    """The folder is free within ``timeout``: the ServerApp that holds it is not deploy's descendant (Flower's
    SuperExec starts it), so the guard's SIGKILL after its grace, on a loaded host, may come after the check
    of deploy's own family."""
    def free() -> bool:
        try:
            _not_in_use(out)
            return True
        except ConfigError:
            return False

    if not _wait(free, timeout):
        _not_in_use(out)  # its refusal names the holder


def _in_use(out: Path) -> None:
    with pytest.raises(ConfigError, match="in use by another run"):
        _not_in_use(out)


def _resumed(tmp: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """Deploy (one SuperNode) resuming a run folder that keeps round 1 of a 1-client run, to 50 rounds: its
    record of a stop (or of a crash) then stays, as after a round trained here, from the moment its ServerApp
    holds the folder (:func:`_held`)."""
    _held_run(tmp / "run", 1, clients=1)
    return _deploy(tmp, "--resume", str(tmp / "run"), "--rounds", "50", *args, clients=1)


def _held(p: subprocess.Popen, tmp: Path) -> None:
    """Until the ServerApp of deploy ``p`` holds its run folder."""
    def held() -> bool:
        if p.poll() is not None:
            pytest.fail(f"deploy ended ({p.returncode}):\n{(tmp / 'deploy.out').read_text()[-3000:]}")
        try:
            _not_in_use(tmp / "run")
            return False
        except ConfigError:
            return True

    _wait(held, 240)
    _in_use(tmp / "run")


@pytest.mark.slow
def test_sigkilled_deploy_leaves_nothing_running(tmp_path, reaped):
    p, out, _ = _deploy(tmp_path, "--rounds", "50")
    try:
        family = _running(p, reaped, tmp_path, checkpointed=False)  # mid-round 1: no need to wait for it
        _in_use(out)  # by the ServerApp
        shown = tmp_path / "deploy.out"  # flwr run's output reaches deploy's as it comes, not at the end: the
        # ServerApp's first line (a ClientApp runs: the ServerApp is past it; its registration is not awaited)
        assert _wait(lambda: "clients: 2 of the 60 devices of fleet " in shown.read_text(), 60), shown.read_text()
        family += _family(p)  # and what started since
        p.kill()
        p.wait(10)
        assert not _left(family, GONE_S), "still running after deploy was SIGKILLed"
        _free_soon(out)
    finally:
        p.kill()
        p.wait(10)


@pytest.mark.slow
def test_sigterm_stops_deploy_like_ctrl_c(tmp_path, reaped):
    p, out, _ = _deploy(tmp_path, "--rounds", "50", clients=1)
    try:
        family = _running(p, reaped, tmp_path, checkpointed=False)
        _in_use(out)
        family += _family(p)
        p.send_signal(signal.SIGTERM)
        code = p.wait(60)
        text = (tmp_path / "deploy.out").read_text()
        assert code == 143, text[-3000:]
        assert "deploy: terminated: every process it started is stopped" in text, text[-3000:]
        kept = (out / checkpoint.FILENAME).is_file()  # stopped in round 1: as a rule, none
        assert ("round 1 of 50 is kept" if kept else "deploy: no round was kept in") in text, text[-3000:]
        assert not _left(family), "still running after deploy exited"
        _not_in_use(out)
        # the ServerApp ends under Flower's handler (os._exit): its stop is recorded all the same (it read crashed);
        # or, when its own end comes first, a run stopped before any round finished leaves nothing (runfolder._tidy)
        st = runstatus.status(out)
        if (out / runfolder.LOCK).exists() or kept:
            assert (st.state, st.record.get("signal")) == ("stopped", "SIGTERM"), st
        else:
            assert not runfolder.held_run(out) and not (out / "metrics.jsonl").exists(), sorted(out.iterdir())
    finally:
        p.kill()
        p.wait(10)


@pytest.mark.slow
def test_a_dead_superlink_fails_the_deployment_and_frees_the_run_folder(tmp_path, reaped):
    """The SuperLink is SIGKILLed alone while its ServerApp holds a run folder that keeps round 1 (a resumed one:
    :func:`_resumed`): deploy exits 1 with the round and the --resume command, and by then its orphaned
    flwr-serverapp (a session of its own) no longer runs nor holds the folder."""
    p, out, work = _resumed(tmp_path)
    try:
        family = _running(p, reaped, tmp_path, checkpointed=True, names=("flwr-serverapp",))
        superlink = next(q for q in family if "flower-superlink" in _cmd(q))
        _held(p, tmp_path)
        family += _family(p)
        superlink.kill()
        code = p.wait(120)
        text = (tmp_path / "deploy.out").read_text()
        assert code == 1, text[-3000:]
        done = checkpoint.load(out).round
        m = re.search(r"deploy: error: the run stopped after round (\d+) of 50 \(see (\S+) and (\S+)\); "
                      r"continue it with: python -m server\.deploy --resume (\S+)", text)
        assert m, text[-3000:]
        assert int(m[1]) == done and m[2] == str(work / "flwr-run.log") and m[4] == str(out), m[0]
        assert not _left(family), "still running after deploy exited"
        _not_in_use(out)
    finally:
        p.kill()
        p.wait(10)
