"""The local deployment's own pieces that a mutation run found unpinned (server/deploy.py up to ``_stop``): the
TLS flags refused when given in part, what a Deployment makes as it is built (its workdir with missing parents,
a coordinator token of 32 random bytes, no deployment of 0 clients), the command and node config of a SuperNode
(its edge, its profile in turn, its TLS files, the port asked for), the tiers started for 2 and 3 tiers and the
refusal of 4, how many times a port another process took is chosen again (tiers, SuperLink, each SuperNode) and
what is refused at once, how ``_wait_port`` tells a process that exited from one that listens, and the guard:
in a session of its own (a whole process group killed leaves it to stop the rest), ``kill`` returning only once
the guard has taken the groups found under the killed one, and ``stop`` ending the tree it sees when the guard
is gone.

Most tests stand in for the processes (``_spawn``, ``_wait_port``, ``_wait_served`` replaced), as
tests/test_deploy_checks.py and tests/test_tier_tokens.py do; the guard's own tests start ``sleep``s and ``sh``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from server import deploy, processes
from server.deploy import Deployment, StartFailed, check_tls, free_port
from splitfed.errors import ConfigError
from tests.test_deploy_signals import _ESCAPES, _alive, _escaped, _left, _wait, reaped  # noqa: F401 - a fixture
from tests.transport_fixtures import Certs, certs  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent


class _Proc:
    """A process that stands for one deploy started: running (``returncode`` None) or exited."""

    def __init__(self, returncode: int | None = None) -> None:
        self.returncode = returncode
        self.pid = 0

    def poll(self) -> int | None:
        return self.returncode


def _standing_in(monkeypatch: pytest.MonkeyPatch, dep: Deployment) -> list[tuple[str, list[str]]]:
    """Every (name, command) ``dep`` spawns, in order; nothing really starts (each is a running ``_Proc``)."""
    spawned: list[tuple[str, list[str]]] = []

    def spawn(self: Deployment, name: str, cmd: list[str]) -> _Proc:
        spawned.append((name, cmd))
        self.procs[name] = _Proc()  # type: ignore[assignment]
        return self.procs[name]  # type: ignore[return-value]

    monkeypatch.setattr(Deployment, "_spawn", spawn)
    monkeypatch.setattr(Deployment, "kill", lambda self, name: spawned.append((f"kill {name}", [])))
    return spawned


def _flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def _counting_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports 20001, 20002, ... in the order deploy chooses them."""
    taken = [20000]

    def choose(n: int) -> list[int]:
        taken[0] += n
        return list(range(taken[0] - n + 1, taken[0] + 1))

    monkeypatch.setattr(deploy, "free_ports", choose)


# --------------------------------------------------------------- refusals and what a Deployment makes

@pytest.mark.parametrize("given", [("ca.pem", "", ""), ("", "cert.pem", ""), ("", "", "key.pem"),
                                   ("ca.pem", "cert.pem", ""), ("", "cert.pem", "key.pem")])
def test_tls_files_given_in_part_are_refused_naming_all_three_flags(given: tuple[str, str, str]) -> None:
    """Not silently insecure, nor a refusal of a file nobody gave."""
    with pytest.raises(ConfigError, match=r"^TLS needs --tls-ca, --tls-cert and --tls-key together$"):
        check_tls(*given)
    check_tls("", "", "")  # none: insecure on loopback, as said


def test_a_deployment_of_no_clients_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^clients must be >= 1, got 0$"):
        Deployment(0, tmp_path / "work", log=False)
    assert not (tmp_path / "work").exists()  # refused before it made anything
    Deployment(1, tmp_path / "one", log=False)  # one is enough


def test_a_workdir_whose_parents_are_missing_is_made_with_them(tmp_path: Path) -> None:
    dep = Deployment(1, tmp_path / "a" / "b" / "work", log=False)
    assert dep.workdir == (tmp_path / "a" / "b" / "work").resolve() and (dep.workdir / "flwr-home").is_dir()


def test_the_coordinator_token_made_for_a_deployment_is_32_random_bytes_and_new_each_time(tmp_path: Path) -> None:
    """``secrets.token_urlsafe(32)``: 256 bits, 43 characters; a workdir used again gets a new one."""
    dep = Deployment(1, tmp_path / "work", log=False)
    first = Path(dep.coordinator_token_file).read_text()
    assert len(first) == 43
    again = Path(Deployment(1, tmp_path / "work", log=False).coordinator_token_file).read_text()
    assert len(again) == 43 and again != first


def test_free_port_is_one_port_this_machine_can_listen_on() -> None:
    import socket

    port = free_port()
    assert isinstance(port, int) and 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# --------------------------------------------------------------- a SuperNode's command

def test_a_supernode_is_told_its_partition_the_edge_its_profile_in_turn_and_the_port_asked(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The edge is the first tier address (not the cloud's); profiles go round (node 3 of 2 profiles gets the
    second); an explicit port is used as given."""
    dep = Deployment(4, tmp_path / "work", log=False, profiles=("rpi4", "laptop"), token_file="/t/devices")
    spawned = _standing_in(monkeypatch, dep)
    dep.tier_addresses, dep.superlink = ["127.0.0.1:1001", "127.0.0.1:1002"], "127.0.0.1:1000"
    dep.start_supernode(3, 4567)
    [(name, cmd)] = spawned
    assert name == "supernode3" and cmd[0] == str(deploy.BIN / "flower-supernode")
    assert cmd[1:] == ["--insecure", "--superlink", "127.0.0.1:1000", "--node-config",
                       'partition-id=3 num-partitions=4 edge-address="127.0.0.1:1001" device-profile="laptop" '
                       'token-file="/t/devices"', "--host", "127.0.0.1", "--port", "4567"]
    dep.start_supernode(2)  # no port asked: a free one
    port = _flag(spawned[-1][1], "--port")
    assert port.isdigit() and 0 < int(port) < 65536
    assert 'device-profile="rpi4"' in _flag(spawned[-1][1], "--node-config")


def test_a_supernode_of_a_tls_deployment_verifies_the_superlink_and_gets_the_tls_files(tmp_path, monkeypatch,  # type: ignore[no-untyped-def]
                                                                                   certs: Certs) -> None:  # noqa: F811
    tls = certs.server
    dep = Deployment(1, tmp_path / "work", log=False, tls_ca=str(certs.ca), tls_cert=str(tls.cert),
                     tls_key=str(tls.key))
    assert dep.secure is True
    spawned = _standing_in(monkeypatch, dep)
    dep.tier_addresses, dep.superlink = ["127.0.0.1:1001"], "127.0.0.1:1000"
    dep.start_supernode(0, 4567)
    cmd = spawned[0][1]
    assert "--insecure" not in cmd and _flag(cmd, "--root-certificates") == str(certs.ca)
    assert _flag(cmd, "--node-config") == (f'partition-id=0 num-partitions=1 edge-address="127.0.0.1:1001" '
                                           f'tls-ca="{certs.ca}" tls-cert="{tls.cert}" tls-key="{tls.key}"')


# --------------------------------------------------------------- the tiers

def _tiers(monkeypatch: pytest.MonkeyPatch, dep: Deployment, taken: int = 0) -> list[tuple[str, list[str]]]:
    """``dep``'s tiers stood in for; the first ``taken`` starts find a port another process took."""
    spawned = _standing_in(monkeypatch, dep)
    waits: list[str] = []

    def served(self: Deployment, name: str, address: str, timeout: float = 180.0) -> None:
        waits.append(name)
        if name == "edge" and waits.count(name) <= taken:  # the first awaited at each try
            raise StartFailed(f"{name} exited with code 2:\ncannot listen on {address}", port_taken=True)

    monkeypatch.setattr(Deployment, "_wait_served", served)
    _counting_ports(monkeypatch)
    return spawned


def test_three_tiers_start_cloud_first_and_the_edge_sends_to_the_cloud(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dep = Deployment(1, tmp_path / "work", log=False)
    spawned = _tiers(monkeypatch, dep)
    dep._start_tiers()
    assert dep.tier_addresses == ["127.0.0.1:20001", "127.0.0.1:20002"]
    (cloud_name, cloud), (edge_name, edge) = spawned
    assert (cloud_name, edge_name) == ("cloud", "edge")
    assert (_flag(cloud, "--role"), _flag(cloud, "--listen"), "--next" in cloud) == ("cloud", "127.0.0.1:20002", False)
    assert (_flag(edge, "--role"), _flag(edge, "--listen"), _flag(edge, "--next")) == (
        "edge", "127.0.0.1:20001", "127.0.0.1:20002")


def test_two_tiers_start_one_server_tier_that_computes_the_loss(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The device and one tier: that tier (named edge, where the devices connect) has the cloud's role."""
    dep = Deployment(1, tmp_path / "work", log=False, tiers=2)
    spawned = _tiers(monkeypatch, dep)
    dep._start_tiers()
    [(name, cmd)] = spawned
    assert name == "edge" and _flag(cmd, "--role") == "cloud" and "--next" not in cmd
    assert dep.tier_addresses == ["127.0.0.1:20001"]


def test_four_tiers_are_refused(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A resumed run of 4 tiers (``splitfed simulate`` runs them) is refused, not deployed with 3."""
    dep = Deployment(1, tmp_path / "work", log=False, tiers=4)
    spawned = _tiers(monkeypatch, dep)
    with pytest.raises(ConfigError, match=r"^the local deployment starts 2 or 3 tiers$"):
        dep._start_tiers()
    assert spawned == []


@pytest.mark.parametrize("tiers", [1, 0])
def test_fewer_than_two_tiers_are_refused_as_four_are(tmp_path, monkeypatch, tiers: int) -> None:  # type: ignore[no-untyped-def]
    """Code that builds a ``Deployment`` itself (the CLI takes 2 or 3): one tier started no tier and failed later
    with an IndexError, none started one."""
    dep = Deployment(1, tmp_path / "work", log=False, tiers=tiers)
    spawned = _tiers(monkeypatch, dep)
    with pytest.raises(ConfigError, match=r"^the local deployment starts 2 or 3 tiers$"):
        dep._start_tiers()
    assert spawned == []


def test_tier_ports_taken_twice_are_chosen_again_the_third_time(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(deploy, "PORT_TRIES", 3)
    dep = Deployment(1, tmp_path / "work", log=False)
    spawned = _tiers(monkeypatch, dep, taken=2)
    dep._start_tiers()
    assert [name for name, _ in spawned] == ["cloud", "edge", "kill edge", "kill cloud"] * 2 + ["cloud", "edge"]
    assert dep.tier_addresses == ["127.0.0.1:20005", "127.0.0.1:20006"]
    # each try's edge sends to that try's cloud (with real tiers, a 3-tier restart cost 4 tier processes)
    assert [(_flag(cmd, "--listen"), _flag(cmd, "--next")) for name, cmd in spawned if name == "edge"] == [
        ("127.0.0.1:20001", "127.0.0.1:20002"), ("127.0.0.1:20003", "127.0.0.1:20004"),
        ("127.0.0.1:20005", "127.0.0.1:20006")]


def test_tier_ports_taken_at_every_try_are_refused_after_port_tries(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(deploy, "PORT_TRIES", 3)
    dep = Deployment(1, tmp_path / "work", log=False)
    spawned = _tiers(monkeypatch, dep, taken=99)
    with pytest.raises(StartFailed, match=r"^edge exited with code 2:\ncannot listen on 127\.0\.0\.1:20005$") as e:
        dep._start_tiers()
    assert e.value.port_taken and [name for name, _ in spawned].count("edge") == 3


# --------------------------------------------------------------- the SuperLink and the SuperNodes

def _superlink(monkeypatch: pytest.MonkeyPatch, dep: Deployment, fails: Callable[[str, int], StartFailed | None],
               ) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int]]]:
    """``dep.start()`` with tiers, processes and port waits stood in for: ``fails(name, n)`` is the error of the
    n-th wait (from 1) for process ``name``, or None (it listens). The waits are recorded (name, port)."""
    spawned = _standing_in(monkeypatch, dep)
    waits: list[tuple[str, int]] = []

    def tiers(self: Deployment) -> None:
        self.tier_addresses = ["127.0.0.1:1001", "127.0.0.1:1002"]

    def wait(self: Deployment, port: int, name: str, timeout: float = 180.0) -> None:
        waits.append((name, port))
        error = fails(name, sum(n == name for n, _ in waits))
        if error is not None:
            if "did not listen" not in str(error):  # it exited (a silent one runs on)
                self.procs[name].returncode = 1  # type: ignore[attr-defined]
            raise error

    monkeypatch.setattr(Deployment, "_start_tiers", tiers)
    monkeypatch.setattr(Deployment, "_wait_port", wait)
    monkeypatch.setattr(deploy, "PORT_TRIES", 3)
    _counting_ports(monkeypatch)
    return spawned, waits


def _taken(name: str) -> StartFailed:
    return StartFailed(f"{name} exited with code 1:\naddress already in use", port_taken=True)


def test_a_superlink_port_taken_twice_is_chosen_again_with_its_supernodes(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dep = Deployment(1, tmp_path / "work", log=False)
    spawned, _ = _superlink(monkeypatch, dep, lambda name, n: _taken(name) if name == "superlink" and n <= 2 else None)
    assert dep.start() is dep
    assert [name for name, _ in spawned] == ["superlink", "supernode0", "kill superlink", "kill supernode0"] * 2 + [
        "superlink", "supernode0"]
    assert dep.superlink == "127.0.0.1:20005" and _flag(spawned[-1][1], "--superlink") == "127.0.0.1:20005"


def test_a_superlink_port_taken_at_every_try_is_refused_after_port_tries(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dep = Deployment(1, tmp_path / "work", log=False)
    spawned, _ = _superlink(monkeypatch, dep, lambda name, n: _taken(name) if name == "superlink" else None)
    with pytest.raises(StartFailed, match="^superlink exited") as e:
        dep.start()
    assert e.value.port_taken and [name for name, _ in spawned].count("superlink") == 3


def test_a_superlink_that_exits_for_another_reason_is_said_at_once(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dep = Deployment(1, tmp_path / "work", log=False)
    spawned, _ = _superlink(monkeypatch, dep, lambda name, n: StartFailed("superlink exited with code 1:\nbad flag")
                            if name == "superlink" else None)
    with pytest.raises(StartFailed, match="bad flag") as e:
        dep.start()
    assert not e.value.port_taken and [name for name, _ in spawned].count("superlink") == 1


def test_a_supernode_port_taken_twice_is_chosen_again_for_that_node_and_awaited(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dep = Deployment(2, tmp_path / "work", log=False)
    spawned, waits = _superlink(monkeypatch, dep, lambda name, n: _taken(name) if name == "supernode1" and n <= 2
                                else None)
    assert dep.start() is dep
    # ports: superlink 20001, nodes 20002 and 20003; node 1 again on 20004, then 20005
    assert waits == [("superlink", 20001), ("supernode0", 20002), ("supernode1", 20003), ("supernode1", 20004),
                     ("supernode1", 20005)]
    assert [name for name, _ in spawned] == ["superlink", "supernode0", "supernode1", "kill supernode1", "supernode1",
                                             "kill supernode1", "supernode1"]
    assert _flag(spawned[-1][1], "--port") == "20005"


def test_a_supernode_port_taken_at_every_try_is_refused_after_port_tries(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dep = Deployment(1, tmp_path / "work", log=False)
    spawned, waits = _superlink(monkeypatch, dep, lambda name, n: _taken(name) if name == "supernode0" else None)
    with pytest.raises(StartFailed, match="^supernode0 exited") as e:
        dep.start()
    assert e.value.port_taken and [n for n, _ in waits].count("supernode0") == 3
    assert [name for name, _ in spawned].count("supernode0") == 3


def test_a_supernode_silent_too_long_is_an_error(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Still running, but not listening in time: said, not taken for started."""
    dep = Deployment(1, tmp_path / "work", log=False)
    silent = StartFailed("supernode0 did not listen on port 20002 within 180s:\n")
    spawned, waits = _superlink(monkeypatch, dep, lambda name, n: silent if name == "supernode0" else None)
    with pytest.raises(StartFailed, match="did not listen"):
        dep.start()
    assert [name for name, _ in spawned] == ["superlink", "supernode0"]  # not started again


def test_a_supernode_that_exits_for_another_reason_is_left_to_the_run(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A deployment survives a lost node: neither started again nor an error."""
    dep = Deployment(2, tmp_path / "work", log=False)
    spawned, waits = _superlink(monkeypatch, dep, lambda name, n: StartFailed("supernode0 exited with code 1:\nx")
                                if name == "supernode0" else None)
    assert dep.start() is dep
    assert [n for n, _ in waits] == ["superlink", "supernode0", "supernode1"]
    assert [name for name, _ in spawned] == ["superlink", "supernode0", "supernode1"]


# --------------------------------------------------------------- _wait_port with real processes

def test_wait_port_says_a_process_exited_with_its_code_and_whether_its_port_was_taken(tmp_path: Path) -> None:
    dep = Deployment(1, tmp_path / "work", log=False)
    for said, taken in (("OSError: [Errno 98] Address already in use", True), ("no such flag", False)):
        with open(dep.workdir / "node.log", "w") as out:
            proc = subprocess.Popen([sys.executable, "-c", f"print({said!r}); raise SystemExit(3)"], stdout=out)
        proc.wait(30)
        dep.procs["node"] = proc
        with pytest.raises(StartFailed, match=rf"^node exited with code 3:\n{said[:8]}") as e:
            dep._wait_port(free_port(), "node", timeout=3.0)
        assert e.value.port_taken is taken


def test_wait_port_returns_once_the_process_listens_on_the_port(tmp_path: Path) -> None:
    dep = Deployment(1, tmp_path / "work", log=False)
    listen = ("import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
              "print(s.getsockname()[1], flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", listen], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        dep.procs["node"] = proc
        dep._wait_port(port, "node", timeout=3.0)
        other = free_port()  # not the one it listens on
        with pytest.raises(StartFailed, match=rf"^node did not listen on port {other} within 0s:"):
            dep._wait_port(other, "node", timeout=0.5)
    finally:
        proc.kill()
        proc.wait(10)


# --------------------------------------------------------------- the guard

def test_a_deploy_whose_whole_process_group_is_killed_still_stops_what_it_started(tmp_path, reaped) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The guard leads a session of its own: SIGKILL to deploy's whole process group (a terminal's job
    control, ``timeout``, a CI runner) does not reach it, and it stops the rest."""
    script = textwrap.dedent(f"""
        import time
        from server.deploy import Deployment
        dep = Deployment(1, {str(tmp_path)!r}, log=False)
        dep._spawn("a", ["sleep", "300"])
        print(dep.procs["a"].pid, flush=True)
        time.sleep(300)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert holder.stdout is not None
        child = psutil.Process(int(holder.stdout.readline()))
        reaped.append(child)
        everything = psutil.Process(holder.pid).children(recursive=True)  # the guard and a
        reaped.extend(everything)
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert not _left([child, *everything], 15), everything
    finally:
        holder.kill()
        holder.wait(10)


def test_kill_returns_once_the_groups_found_under_the_killed_process_are_gone(tmp_path, reaped) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A SuperLink that died left its SuperExec (a session of its own) an orphan no process tree leads to:
    ``kill("superlink")`` returns once the guard has taken it, so a port or run folder it held is free then."""
    with Deployment(1, tmp_path, log=False) as dep:
        a = dep._spawn("a", _ESCAPES)
        orphan = psutil.Process(_escaped(tmp_path / "a.log"))
        reaped.append(orphan)
        assert _wait(lambda: os.getsid(orphan.pid) != os.getsid(a.pid), 10)
        time.sleep(1.5)  # the guard looks for new groups twice a second
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
        assert _alive(orphan)
        dep.kill("a")
        assert not _alive(orphan), "kill() returned before the guard took the orphan"
    dep.kill("a")  # a deployment already stopped: nothing left to do, and no error


def test_kill_of_a_process_already_reaped_looks_up_no_tree_under_its_pid(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Once waited for, its pid may be an unrelated process's: its tree is not looked up, so not killed (as
    ``stop`` does); a process not yet reaped still has its tree killed."""
    looked: list[int] = []
    real = processes.tree
    monkeypatch.setattr(processes, "tree", lambda pid: looked.append(pid) or real(pid))
    with Deployment(1, tmp_path, log=False) as dep:
        a = dep._spawn("a", [sys.executable, "-c", "import time; time.sleep(60)"])
        dep.kill("a")
        assert looked == [a.pid] and a.returncode == -signal.SIGKILL
        looked.clear()
        dep.kill("a")
        assert looked == []


def test_stop_ends_the_tree_it_sees_when_the_guard_is_gone(tmp_path, reaped) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Without the guard (killed), stop() still ends each live process's descendants, a grandchild in a
    session of its own included, which no process group of its own leads to."""
    dep = Deployment(1, tmp_path, log=False)
    with dep:
        a = dep._spawn("a", _ESCAPES)
        grandchild = psutil.Process(_escaped(tmp_path / "a.log"))
        reaped.append(grandchild)
        assert _wait(lambda: os.getsid(grandchild.pid) != os.getsid(a.pid), 10)
        guard = dep._guard
        assert guard is not None
        guard.kill()
        guard.wait(10)
    assert a.poll() is not None and not _left([grandchild], 3), "stop() left the grandchild running"
