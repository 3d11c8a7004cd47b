"""Real deployment on 127.0.0.1: flower-superlink, flower-supernodes, edge and cloud tier processes.

One ``flwr run`` (2 SuperNodes, insecure on loopback; TLS of each hop is tested by
the transport's tests) of 2 rounds serves both tests; Flower 1.42 starts a
ClientApp process for every message, so each run costs a minute or more here:

- round 1, with both clients: a real deployment trains a round (metrics, checkpoint,
  measured times, the device profiles named in ``--node-config``, each node's
  link to the edge measured when it registered);
- round 2: one SuperNode and its ClientApp process are SIGKILLed while they work on
  the round's message; the round completes with the other client (min-clients 1)
  after the round timeout, and ``flwr run`` returns: no hang.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psutil
import pytest

from server.deploy import Deployment, _tree

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-real")]


def _rows(out: Path) -> list[dict]:
    if not (out / "metrics.jsonl").is_file():
        return []
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _clientapps(pid: int) -> set[int]:
    found = set()
    for p in _tree(pid):
        try:
            if any("flwr-clientapp" in part for part in p.cmdline()):
                found.add(p.pid)
        except psutil.Error:
            pass
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Deploy, run 2 rounds, kill supernode1 once its round-2 ClientApp process exists."""
    work = tmp_path_factory.mktemp("deploy")
    out = work / "run"
    with Deployment(2, work, profiles=("rpi4", "laptop"), log=False) as dep:
        dep.start()
        victim = dep.procs["supernode1"]
        # the timeout covers a ClientApp process start (one per message) and its training
        overrides = {"num-server-rounds": 2, "out": str(out), "min-clients": 1, "round-timeout-s": 45.0,
                     "cuts": "static:1,3/2,5", "lr": 0.1}
        result: dict = {}
        runner = threading.Thread(target=lambda: result.update(res=dep.run(overrides, timeout=600)))
        started = time.monotonic()
        runner.start()
        while not _rows(out) and runner.is_alive() and time.monotonic() - started < 400:
            time.sleep(0.2)  # round 1, both clients
        before = _clientapps(victim.pid)  # round 1's ClientApp process may still be exiting
        while runner.is_alive() and not (_clientapps(victim.pid) - before) and time.monotonic() - started < 400:
            time.sleep(0.1)  # round 2's message reached the victim: it starts a ClientApp process
        killed_alive = runner.is_alive()
        dep.kill("supernode1")
        runner.join(timeout=300)
        yield {"out": out, "res": result.get("res"), "hung": runner.is_alive(), "killed_mid_run": killed_alive,
               "log": dep.tail("superlink", 60)}


def test_deployment_runs_a_round(run):
    rows = _rows(run["out"])
    assert rows, run["log"]
    row = rows[0]
    assert row["round"] == 1 and row["clients"] == 2 and row["failed"] == [] and row["accuracy"] > 0.2
    assert row["cuts"] == {"client0": [1, 3], "client1": [2, 5]}
    assert row["sim_round_s"] is None and row["measured_round_s"] > 0  # deployment: times are measured
    assert {c["profile"] for c in row["per_client"].values()} == {"rpi4", "laptop"}
    streamed = run["res"].stdout + run["res"].stderr  # the ServerApp's log, streamed by flwr run
    assert streamed.count("(measured up ") == 2, streamed[-3000:]  # each node measured its link to the edge
    assert (run["out"] / "checkpoint.pt").is_file() and (run["out"] / "summary.json").is_file()


def test_killed_client_does_not_stop_the_round(run):
    assert run["killed_mid_run"], "the run ended before the victim could be killed"
    assert not run["hung"], "flwr run hangs after a client was killed"
    res = run["res"]
    assert res is not None and res.returncode == 0, (res.stdout[-3000:] if res else "") + run["log"]
    rows = _rows(run["out"])
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[1]["clients"] == 1 and rows[1]["failed"] == ["client1"]
