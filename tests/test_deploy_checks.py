"""What the local deployment checks before and while it runs: ports that cannot collide, device profiles that
exist, SuperNodes that are all gone (found by a user: a SuperNode given the SuperLink's port failed at once, and the
run waited two minutes for nodes, then blamed its own log)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.deploy import Deployment, NodesGone, free_ports
from splitfed.flower.config import RunSettings


def test_ports_handed_out_together_are_all_different() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64 and all(0 < p < 65536 for p in ports)


def test_an_unknown_profile_is_refused_before_anything_starts(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Deploy's ``main``, in this process: the refusal comes before anything starts (a new interpreter only cost
    its imports; ``python -m server.deploy`` runs ``main`` in the real deployment tests)."""
    from server.deploy import main

    code = main(["--profile", "rpi4", "--profile", "nosuch", "--out", str(tmp_path / "run"),
                 "--workdir", str(tmp_path / "work")])
    p = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deploy: error: --profile nosuch: device profile 'nosuch' is "
                                                   "neither a device of fleet 'reference' (an entry: pi-home"), p.stderr
    assert "rpi4" in lines[0]  # the profiles it could name
    assert not (tmp_path / "work").exists()  # nothing was started


def test_a_profile_may_name_any_device_of_the_fleet_file_however_many_clients_run() -> None:
    """Before, only the names of the clients the run drew from the fleet (seeded, e.g. ``phone-mid-0`` for 2
    clients) were known, so ``pi-home`` or ``pi-home-3`` depended on --clients and the seed."""
    from splitfed.flower.adaptive import profile_refusal, scenario
    from splitfed.flower.policy import ClientInfo
    from splitfed.profile import load_fleet

    s = RunSettings(clients=2, cuts="adaptive")
    refusal = profile_refusal(s)
    assert refusal("pi-home") is None and refusal("pi-home-3") is None and refusal("rpi4") is None
    assert refusal("pi-home-99") is not None and refusal("cloud-gpu") is not None  # no such client; no device
    sc = scenario(s, [ClientInfo("client0", 1, 0, "pi-home", 10), ClientInfo("client1", 2, 1, "pi-field-5", 10)])
    fleet = {c.name: c for c in load_fleet("reference").clients}
    assert sc.clients[0].device == fleet["pi-home-0"].device and sc.clients[1].link == fleet["pi-field-5"].link


def test_a_node_whose_profile_is_unknown_is_left_out_at_registration(monkeypatch, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Before, static cuts took it silently (its metrics named the typo) and adaptive ones failed the whole
    run after registration with a traceback."""
    import json

    import clients.app
    import server.app
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    grid = FakeGrid(clients.app.app, 2)
    grid.contexts[grid.node_ids[1]].node_config["device-profile"] = "nosuch"
    s = RunSettings(rounds=1, clients=2, min_clients=1, cuts="adaptive", node_wait_s=5.0, round_timeout_s=30.0,
                    out=str(tmp_path))
    with inprocess_tiers(monkeypatch, 2), caplog.at_level(logging.WARNING, logger="flwr"):
        server.app.run(grid, s, progress=lambda line: None)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert list(row["cuts"]) == ["client0"]
    assert f"Node {grid.node_ids[1]} (partition 1) left out: its node config's device profile 'nosuch'" in caplog.text


def _stand_in_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiers that cost nothing to start (``sleep``, through ``_spawn``, under the tiers' names and guarded as
    they are), for the tests of what starts after them: real tiers cost ~10 CPU-s each time (torch), and
    their own start, port taken included, is the tier tests' below and every real deployment's."""

    from server import deploy

    def start(self: Deployment) -> None:  # deploy's free_ports, as _holding_a_port may replace it: one choice
        self.tier_addresses = [f"127.0.0.1:{p}" for p in deploy.free_ports(len(self.tier_names))]
        for name in reversed(self.tier_names):
            self._spawn(name, ["sleep", "300"])

    monkeypatch.setattr(Deployment, "_start_tiers", start)


@pytest.mark.slow
def test_a_run_whose_supernodes_all_exit_stops_at_once_naming_their_logs(monkeypatch, tmp_path: Path) -> None:
    """A real SuperLink and ``flwr run``; SuperNodes that exit at once (as one given a port in use does); tiers
    that stand in for the real ones (the run stops before it reaches them)."""

    def broken(self: Deployment, i: int, port: int = 0) -> subprocess.Popen:
        return self._spawn(f"supernode{i}", [sys.executable, "-c", "import sys; sys.exit(3)"])

    monkeypatch.setattr(Deployment, "start_supernode", broken)
    _stand_in_tiers(monkeypatch)
    with Deployment(2, tmp_path / "work", log=False) as dep:
        dep.start()
        started = time.monotonic()
        with pytest.raises(NodesGone, match=r"every SuperNode exited: supernode0 with code 3 \(see .*"
                                            r"supernode0\.log\), supernode1 with code 3"):
            dep.run({"num-server-rounds": 1, "out": str(tmp_path / "run"), "node-wait-s": 120.0}, timeout=300)
        assert time.monotonic() - started < 60  # not node-wait-s
    assert all(p.poll() is not None for p in dep.procs.values())  # stopped with the deployment


def _holding_a_port(monkeypatch: pytest.MonkeyPatch, tries: int, first: int = 0,
                    at: int = 0) -> tuple[socket.socket, list[list[int]]]:
    """A port another process listens on, chosen in ``tries`` of the choices deploy makes, from its ``first``
    on, at place ``at`` of the ports chosen at once (or the last): its first choice is the tiers' (the edge's
    port first), the next ones the SuperLink's and then the SuperNodes' (one choice), then a SuperNode's alone."""
    from server import deploy
    from splitfed import ports

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    calls: list[list[int]] = []

    def choose(n: int) -> list[int]:
        chosen = ports.free_ports(n - 1 if first <= len(calls) < first + tries else n)
        if len(chosen) < n:
            chosen.insert(min(at, n - 1), held.getsockname()[1])
        calls.append(chosen)
        return chosen

    monkeypatch.setattr(deploy, "free_ports", choose)
    return held, calls


def _spawns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[subprocess.Popen]]:
    """Every process deploy spawns, by name, in order (a name started again has several)."""
    spawned: dict[str, list[subprocess.Popen]] = {}
    spawn = Deployment._spawn
    monkeypatch.setattr(Deployment, "_spawn",
                        lambda self, name, cmd: spawned.setdefault(name, []).append(spawn(self, name, cmd))
                        or spawned[name][-1])
    return spawned


def _listening_stand_in(monkeypatch: pytest.MonkeyPatch, folder: Path, name: str) -> None:
    """Deploy's commands from ``folder``: the real ones, but ``name`` (``flower-superlink`` or
    ``flower-supernode``) is a process that only listens on the ``--port`` it is given, for the tests about the
    other one: a real Flower process costs seconds of CPU to start (its imports), the stand-in none, and deploy
    awaits either by the port it listens on."""
    from server import deploy

    folder.mkdir()
    for cmd in deploy.BIN.iterdir():
        if cmd.name != name and not cmd.name.startswith(("python", "activate", "Activate")):
            (folder / cmd.name).symlink_to(cmd)
    (folder / name).write_text(
        f"#!{sys.executable}\nimport socket, sys, time\ns = socket.socket()\n"
        's.bind(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])))\ns.listen()\ntime.sleep(300)\n')
    (folder / name).chmod(0o755)
    monkeypatch.setattr(deploy, "BIN", folder)


def test_a_tier_port_another_process_took_is_chosen_again_and_the_tier_answers(monkeypatch, tmp_path: Path) -> None:
    """Another process listens on the port chosen for the edge before the edge binds it. Before, deploy took a
    port that answers for its tier serving (and ran against a stranger); now it waits for the tier's own line,
    sees that it could not listen, and starts the tiers again on other ports. Two tiers (one real tier process a
    try: 3 tiers cost 2 more, ~3 s of CPU each); that each try's edge sends to that try's cloud is
    test_mutants_deploy_a's test_tier_ports_taken_twice_are_chosen_again_the_third_time."""
    from splitfed.transport.client import GrpcTierClient

    held, calls = _holding_a_port(monkeypatch, tries=1)
    taken = f"127.0.0.1:{held.getsockname()[1]}"
    spawned = _spawns(monkeypatch)
    with held, Deployment(1, tmp_path / "work", log=False, tiers=2) as dep:
        dep._start_tiers()
        [address] = dep.tier_addresses
        with GrpcTierClient(address) as c:
            info = c.describe()
        assert spawned["edge"][0].poll() is not None  # the first try's tier is gone
    assert len(calls) == 2 and [len(procs) for procs in spawned.values()] == [2]
    assert taken != address and info.name == "edge"  # the tier deploy started answers there, not a stranger


def test_a_tier_port_taken_at_every_try_is_said_and_nothing_is_left(monkeypatch, tmp_path: Path) -> None:
    """Two tiers (one process a try: the edge's port is the one taken; a cloud behind it adds nothing)."""
    from server import deploy
    from server.deploy import StartFailed

    monkeypatch.setattr(deploy, "PORT_TRIES", 2)
    held, calls = _holding_a_port(monkeypatch, tries=2)
    port = held.getsockname()[1]
    with held, Deployment(1, tmp_path / "work", log=False, tiers=2) as dep:
        with pytest.raises(StartFailed, match=rf"edge exited with code 2:\n.*cannot listen on 127\.0\.0\.1:{port}") as e:
            dep._start_tiers()
        assert e.value.port_taken and len(calls) == 2
    assert all(p.poll() is not None for p in dep.procs.values())


def test_a_tier_that_exits_for_another_reason_is_not_started_again(monkeypatch, tmp_path: Path) -> None:
    from server.deploy import StartFailed

    held, calls = _holding_a_port(monkeypatch, tries=0)
    held.close()
    with Deployment(1, tmp_path / "work", log=False, token_file=str(tmp_path / "missing"), tiers=2) as dep:  # one tier
        with pytest.raises(StartFailed, match=r"edge exited with code 2:\n.*--token-file: cannot read token file .*missing") as e:
            dep._start_tiers()
        assert not e.value.port_taken and len(calls) == 1


def test_a_superlink_port_another_process_took_is_chosen_again(monkeypatch, tmp_path: Path) -> None:
    """The port chosen for the SuperLink answers, but another process listens there. Before f91c337 deploy took
    the SuperLink for started (and its run met a stranger); then it said why it could not start. Now it starts
    the SuperLink again on another port, and the SuperNodes with it (they were pointed at the first). Real
    SuperLinks (their log says the port was taken); the SuperNodes stand in (their own port taken is the tests
    below; a real one here cost ~2 s of CPU each, 4 of them)."""
    from server.processes import listens

    _stand_in_tiers(monkeypatch)  # chosen before the SuperLink's: the first choice is still theirs
    _listening_stand_in(monkeypatch, tmp_path / "bin", "flower-supernode")
    held, calls = _holding_a_port(monkeypatch, tries=1, first=1)
    spawned = _spawns(monkeypatch)
    with held, Deployment(2, tmp_path / "work", log=False) as dep:
        dep.start()
        port = int(dep.superlink.rsplit(":", 1)[1])
        assert port != held.getsockname()[1] and listens(dep.procs["superlink"].pid, port)
        assert [len(spawned[n]) for n in ("edge", "cloud", "superlink", "supernode0", "supernode1")] == [1, 1, 2, 2, 2]
        assert all(spawned[n][0].poll() is not None for n in ("superlink", "supernode0", "supernode1"))
        assert all(spawned[n][-1].poll() is None for n in spawned)  # the second try's, and the tiers, run
        assert f"--superlink {dep.superlink} " in " ".join(spawned["supernode1"][-1].args)
    assert len(calls) == 3


def test_a_superlink_port_taken_at_every_try_is_said_and_nothing_is_left(monkeypatch, tmp_path: Path) -> None:
    """One try (``PORT_TRIES`` 1): the real SuperLink's refusal, said with its log; the tries before the last
    (chosen again, its SuperNodes with it) are the test above's with real SuperLinks, and how many tries are
    made is test_mutants_deploy_a's test_a_superlink_port_taken_at_every_try_is_refused_after_port_tries. The
    SuperNode stands in (real ones here cost ~2 s of CPU each, 2 of them)."""
    from server import deploy
    from server.deploy import StartFailed

    monkeypatch.setattr(deploy, "PORT_TRIES", 1)
    _stand_in_tiers(monkeypatch)  # chosen before the SuperLink's: the first choice is still theirs
    _listening_stand_in(monkeypatch, tmp_path / "bin", "flower-supernode")
    held, calls = _holding_a_port(monkeypatch, tries=1, first=1)
    with held, Deployment(1, tmp_path / "work", log=False) as dep:
        with pytest.raises(StartFailed, match=r"superlink exited with code \d+:\n(?s:.*)address already in use") as e:
            dep.start()
        assert e.value.port_taken and len(calls) == 2
    assert all(p.poll() is not None for p in dep.procs.values())


def test_a_supernode_port_another_process_took_is_chosen_again_for_that_node(monkeypatch, tmp_path: Path) -> None:
    """Another process listens on the port chosen for a SuperNode's own server (its Runtime HTTP API). Before,
    that node exited ('address already in use') and the run went on a node short, or waited out node-wait-s
    for it; now that node alone starts again on another port. Real SuperNodes (their log says the port was
    taken); the SuperLink stands in (the SuperNodes bind their own port before they dial it). That the other
    nodes are left alone is test_mutants_deploy_a's
    test_a_supernode_port_taken_twice_is_chosen_again_for_that_node_and_awaited (here: one node, as 2 cost a
    real SuperNode more)."""
    from server.processes import listens

    _stand_in_tiers(monkeypatch)  # chosen before the SuperLink's: the first choice is still theirs
    _listening_stand_in(monkeypatch, tmp_path / "bin", "flower-superlink")
    held, calls = _holding_a_port(monkeypatch, tries=1, first=1, at=1)  # [superlink, node 0]
    spawned = _spawns(monkeypatch)
    with held, Deployment(1, tmp_path / "work", log=False) as dep:
        dep.start()
        assert calls[1][1] == held.getsockname()[1] and len(calls) == 3 and len(calls[2]) == 1
        assert [len(spawned[n]) for n in ("superlink", "supernode0")] == [1, 2]
        assert spawned["supernode0"][0].poll() is not None and f"--port {calls[2][0]}" in " ".join(
            spawned["supernode0"][1].args)
        assert listens(dep.procs["supernode0"].pid, calls[2][0])
    assert all(p.poll() is not None for ps in spawned.values() for p in ps)


def test_a_supernode_port_taken_at_every_try_is_said_and_nothing_is_left(monkeypatch, tmp_path: Path) -> None:
    """One try (``PORT_TRIES`` 1): the real SuperNode's refusal, said with its log; a try before the last is the
    test above's, and how many are made test_mutants_deploy_a's
    test_a_supernode_port_taken_at_every_try_is_refused_after_port_tries. The SuperLink stands in."""
    from server import deploy
    from server.deploy import StartFailed

    monkeypatch.setattr(deploy, "PORT_TRIES", 1)
    _stand_in_tiers(monkeypatch)  # chosen before the SuperLink's: the first choice is still theirs
    _listening_stand_in(monkeypatch, tmp_path / "bin", "flower-superlink")
    held, calls = _holding_a_port(monkeypatch, tries=1, first=1, at=1)  # [superlink, node 0]
    with held, Deployment(1, tmp_path / "work", log=False) as dep:
        with pytest.raises(StartFailed, match=r"supernode0 exited with code \d+:\n(?s:.*)address already in use") as e:
            dep.start()
        assert e.value.port_taken and len(calls) == 2 and calls[1][1] == held.getsockname()[1]
    assert all(p.poll() is not None for p in dep.procs.values())
