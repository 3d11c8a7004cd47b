"""Real Flower simulation (Ray), real gRPC tier processes on 127.0.0.1: the Flower must-shows.

One real run (a Ray start) for the module: 4 virtual clients, 3 tiers, 8 rounds, heterogeneous static cuts.

- accuracy rises and the global model equals FedAvg of the unsplit model over the same client batches, round
  by round;
- the run removes the Ray session folder it made (``$RAY_TMPDIR/ray/session_<date>_<pid>``), and only that,
  and holds its resources flat (was tests/test_ray_session.py's
  test_a_simulation_removes_its_own_ray_session_and_nothing_else_and_holds_its_resources_flat, a Ray start of
  its own: its per-link compression check is now on tests/test_sim_review.py's SIGKILL run);
- a run stopped part way and resumed ends bit-identical to an uninterrupted run: tests/test_signals.py's
  ``test_a_signal_stops_the_run_cleanly_resumably_and_tidily[ctrl-c]`` (was test_stopped_run_resumes_bit_identical
  here, a second Ray start, for a resume of a run that had ended).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from splitfed.engine.rounds import device_state, initial_state, state_bytes
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.sim import ray_start
from tests.flower_fixtures import assert_rounds_are_the_reference, kept_rounds

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-real")]

SETTINGS = RunSettings(rounds=8, clients=4, tiers=3, mode="sflv1", cuts="static:1,3/2,5/0,4/3,7",
                       partition="dirichlet:0.5", batch_size=32, lr=0.05, momentum=0.9, seed=3)


OTHER = "session_2000-01-01_00-00-00_000000_1"  # another run's Ray session, beside this run's


@dataclass
class Run:
    out: Path
    summary: dict[str, Any]
    kept: dict[int, dict]  # each round's global model, as the run checkpoints it
    ray_dir: Path  # $RAY_TMPDIR/ray
    sessions: list[tuple[Path, bool, str]]  # at round 1: Ray's session, whether it is there, session_latest
    seen: dict[int, tuple[tuple[int, int], list[int]]]  # round -> (ServerApp's (fds, threads), tiers' fds)
    chains: list[Any]  # the tier chain the run started


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One real simulation of 8 rounds in this process (shared by the tests of this module). Ray runs under a
    folder of the module's own (``RAY_TMPDIR``, short for Ray's sockets) holding another run's session; and
    with ``RAY_ADDRESS`` set, as on a Ray cluster's node, whose environment names the cluster: the run still
    starts a Ray of its own (before: ray.init went to connect there, refused the run's num_cpus, and the run
    failed after 3 tries)."""
    import ray

    import splitfed.sim.runner as runner
    from tests.test_resources import _usage

    out = tmp_path_factory.mktemp("sim") / "run"
    base = Path(tempfile.mkdtemp(prefix="sfr", dir="/tmp"))
    ray_dir = base / "ray"
    (ray_dir / OTHER / "logs").mkdir(parents=True)
    (ray_dir / OTHER / "logs" / "raylet.out").write_text("another run's log\n")
    chains: list[Any] = []
    start_tiers = runner.start_tiers

    @contextlib.contextmanager
    def keeping(settings: RunSettings) -> Iterator[Any]:
        with start_tiers(settings) as chain:
            chains.append(chain)
            yield chain

    sessions: list[tuple[Path, bool, str]] = []
    seen: dict[int, tuple[tuple[int, int], list[int]]] = {}

    def progress(line: str) -> None:
        if not line.startswith("round ") or "  acc " not in line:  # a round's own line, not one while it waits
            return
        rnd = int(line.split()[1].split("/")[0])
        if rnd == 1:  # during the run: Ray's session and the link Ray points at it
            ctx = ray.get_runtime_context()
            session = Path(ctx.get_temp_dir()) / ctx.get_session_name()
            sessions.append((session, session.is_dir(), os.readlink(ray_dir / "session_latest")))
        if rnd in (2, 8):
            gc.collect()
            seen[rnd] = (_usage(), [_usage(p)[0] for p in chains[0].pids])

    try:
        with pytest.MonkeyPatch.context() as mp, kept_rounds() as kept:  # the ServerApp runs in this process
            mp.setenv("RAY_TMPDIR", str(base))
            mp.setenv("RAY_ADDRESS", "127.0.0.1:9")
            mp.setattr(runner, "start_tiers", keeping)
            summary = runner.simulate(SETTINGS.with_(out=str(out)), progress)
        yield Run(out, summary, kept, ray_dir, sessions, seen, chains)
    finally:
        for session in ray_dir.glob("session_2*"):  # what a failing run left: killed and removed
            ray_start._kill(ray_start._session_processes(session))
        shutil.rmtree(base, ignore_errors=True)


def _rows(out):  # type: ignore[no-untyped-def]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_simulation_trains_and_equals_unsplit_fedavg(run: Run) -> None:
    out, summary, kept = run.out, run.summary, run.kept
    rows = _rows(out)
    assert [r["round"] for r in rows] == list(range(1, 9)) and summary["rounds"] == 8
    for r in rows:
        assert r["clients"] == 4 and r["failed"] == []
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0 and r["sim_round_s"] > 0
        assert r["cuts"] == {"client0": [1, 3], "client1": [2, 5], "client2": [0, 4], "client3": [3, 7]}
        # the devices' weights went down and came back over Flower, counted as the in-process backend counts
        sent = sum(state_bytes(device_state(initial_state(SETTINGS.spec, SETTINGS.seed), c, 7, False))
                   for c in [(1, 3), (2, 5), (0, 4), (3, 7)])
        assert r["device_weight_bytes"] == [sent, sent] and sent > 0
    assert rows[1]["accuracy"] > rows[0]["accuracy"] > 0.2  # 10 classes: chance is 0.1
    # what the user asked for is recorded, not the addresses and temporary token of the tiers started for it
    recorded = json.loads((out / "summary.json").read_text())["settings"]
    assert recorded == checkpoint.load(out).settings
    assert recorded["tier_addresses"] == recorded["coordinator_token_file"] == ""
    assert {k: v for k, v in recorded.items() if k != "run_name"} == {
        k: v for k, v in SETTINGS.with_(out=str(out)).to_dict().items() if k != "run_name"}
    assert all(torch.equal(v, kept[8][k]) for k, v in checkpoint.load(out).state.items())
    assert_rounds_are_the_reference(SETTINGS, kept)


def test_a_simulation_removes_its_own_ray_session_and_nothing_else_and_holds_its_resources_flat(run: Run) -> None:
    """Its Ray session: there while it runs, gone with it, with the link to it, and nothing else (before, every
    run left its session folder, ~250 KB of logs and sockets, behind; a researcher running many simulations
    collected thousands). Its resources (tests/test_resources.py's law, for a real simulate): the ServerApp
    process's descriptors and threads, and the tier processes' descriptors, are at round 8 what they were at
    round 2; once it ends, its tier processes are gone and its coordinator token file is removed. A failed run
    keeps its session: tests/test_ray_session.py's test_a_failed_simulation_keeps_its_ray_session_and_names_its_logs."""
    from tests.test_resources import _running

    [(session, was_there, latest)] = run.sessions
    assert was_there and session.parent == run.ray_dir and session.name.startswith("session_")  # its own Ray
    assert Path(latest) == session
    assert not session.exists()  # gone with the run...
    assert sorted(p.name for p in run.ray_dir.iterdir()) == [OTHER]  # ...with the link to it, and nothing else
    assert (run.ray_dir / OTHER / "logs" / "raylet.out").read_text() == "another run's log\n"
    (me2, tiers2), (me8, tiers8) = run.seen[2], run.seen[8]
    grown = f"round 2 -> 8: ServerApp (fds, threads) {me2} -> {me8}, tiers' fds {tiers2} -> {tiers8}"
    assert me8[0] <= me2[0] + 3 and me8[1] <= me2[1] + 8, grown
    assert all(b <= a + 3 for a, b in zip(tiers2, tiers8, strict=True)), grown
    (chain,) = run.chains
    assert chain.coordinator_token_file and not Path(chain.coordinator_token_file).exists()
    assert not any(_running(pid) for pid in chain.pids)

