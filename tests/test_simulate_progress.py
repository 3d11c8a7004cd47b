"""``splitfed simulate`` says what it waits for, and refuses a folder Ray cannot start in before its heavy imports.

Before: at 200 clients on 2 cores the run said nothing for 20 s after its "tiers: ..." line: the ServerApp's query
round (each simulated node loads its data to answer) logged only to Flower's log, which ``simulate`` keeps off;
and a RAY_TMPDIR too deep for Ray's sockets was refused only after torch, Ray and Flower were imported (~5 s for
a one-line refusal). ``server.strategy``'s clock here is a fake that only ``sleep`` moves: no test waits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Context, Message

import clients.app
import server.app
import server.strategy
from server.strategy import SplitFedAvg
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import make_policy
from tests.flower_fixtures import FakeGrid, StrategyClock, inprocess_tiers

ROOT = Path(__file__).resolve().parent.parent
SMALL = RunSettings(rounds=1, clients=4, tiers=3, cuts="static:1,3", batch_size=32, node_wait_s=120.0,
                    round_timeout_s=30.0)


def _asking(nodes: int) -> str:
    return (f"query round: asking the {nodes} node(s) for their partition and device (the first answer waits for "
            "their ClientApps to start)...")


class _OneAnswerAtATime(FakeGrid):
    """Gives the answers back one at a time, in the order asked, one every ``every`` pulls (a pull each 0.2 s
    of the fake clock): 4 s apart for the default 20."""

    def __init__(self, client_app, num_nodes: int, every: int = 20) -> None:  # type: ignore[no-untyped-def]
        super().__init__(client_app, num_nodes)
        self.every, self.pulls, self.order = every, 0, []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = list(super().push_messages(messages))
        self.order += ids
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        wanted = set(message_ids)
        ready = [m for m in self.order if m in wanted and m in self.replies]
        return [self.replies.pop(ready[0])] if ready and self.pulls % self.every == 0 else []


def test_the_query_round_says_it_starts_and_every_10_s_how_many_answered(strategy_clock: StrategyClock) -> None:
    """4 nodes answering 4 s apart (the first with an error): the start at once, the count at 10 s, no more once
    all answered (16 s). Before: nothing to the run's progress (only Flower's log, off in simulate)."""
    def app(msg: Message, ctx: Context) -> Message:
        if ctx.node_id == 1000:  # FakeGrid's first node
            raise RuntimeError("no data here")
        return clients.app.app(msg, ctx)

    said: list[str] = []
    strategy = SplitFedAvg(SMALL, [], make_policy(SMALL), say=said.append)
    got = strategy.register(_OneAnswerAtATime(app, 4))
    assert said == [_asking(4),
                    "query round: 2/4 node(s) answered (1 failed)  wall 10s"]
    assert [c.client_id for c in got] == ["client1", "client2", "client3"]


def test_the_wait_for_nodes_is_said_to_the_runs_progress(strategy_clock: StrategyClock,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Where the run has a progress (``say``: simulate's terminal), the wait for nodes is said there, as often as
    in Flower's log before; without one, Flower's log has it (tests/test_node_wait_messages.py)."""
    class _Late(FakeGrid):  # 3 of 4 nodes for 5 s, then all
        def get_node_ids(self) -> Iterable[int]:
            return self.node_ids if strategy_clock.now >= 105 else self.node_ids[:3]

    said: list[str] = []
    with caplog.at_level("INFO"):
        SplitFedAvg(SMALL, [], make_policy(SMALL), say=said.append).register(_Late(clients.app.app, 4))
    assert said[0] == "Waiting for nodes: 3 of 4 registered"
    assert said[1] == _asking(4)
    assert "Waiting for nodes" not in caplog.text  # said once, where the run's lines are


def test_a_serverapp_run_says_its_query_round_before_its_first_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the ServerApp as ``splitfed simulate`` runs it (its progress: the terminal)."""
    s = SMALL.with_(clients=2, model="mlp", dataset="synthetic")
    lines: list[str] = []
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, s.clients), s, progress=lines.append)
    asked = lines.index(_asking(2))
    assert lines[asked + 1].startswith("run ") and lines[asked + 1].endswith("2 client(s), rounds 1..1"), lines


def test_ray_temp_root_reads_the_folder_as_ray_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The copy that spares ``splitfed simulate`` importing Ray to check the folder: Ray's own answer, each way
    Ray reads it (RAY_TMPDIR first, then TMPDIR, then /tmp)."""
    from ray._common.utils import get_default_ray_temp_dir

    from splitfed.sim.ray_start import ray_temp_root

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "r"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    assert ray_temp_root() == get_default_ray_temp_dir() == str(tmp_path / "r" / "ray")
    monkeypatch.delenv("RAY_TMPDIR")
    assert ray_temp_root() == get_default_ray_temp_dir() == str(tmp_path / "t" / "ray")
    monkeypatch.delenv("TMPDIR")
    assert ray_temp_root() == get_default_ray_temp_dir()


def test_the_runner_refuses_a_deep_folder_before_it_says_or_imports_anything(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Python API (``runner.simulate``): the refusal is its only word, not after "starting the simulation
    engine..." and the draw."""
    from splitfed.sim import runner

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / ("d" * 120)))
    lines: list[str] = []
    with pytest.raises(ConfigError, match="^Ray cannot start under "):
        runner.simulate(SMALL, progress=lines.append, cpus=1)
    assert lines == []


def test_the_runner_says_when_ray_is_up_and_the_tiers_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's start and the tiers' took 8 s (20 s on a busy machine) after the draw's line, without a word between.
    Ray's start is a stand-in that starts nothing, and the tiers' one that refuses: no process starts."""
    from splitfed.sim import runner

    def start_tiers(settings: RunSettings) -> None:
        raise ConfigError("no tiers in this test")

    monkeypatch.setattr(runner, "start_ray", lambda init_args, **kwargs: None)
    monkeypatch.setattr(runner, "start_tiers", start_tiers)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="sfp") as short:  # tmp_path: too deep for Ray's sockets
        monkeypatch.setenv("RAY_TMPDIR", short)
        with pytest.raises(ConfigError, match="no tiers in this test"):
            runner.simulate(SMALL, progress=lines.append, cpus=1)
    assert lines[0] == "starting the simulation engine (Ray, 1 CPU(s)) and 2 tier process(es)..."
    assert lines[1:] == [runner.draw_note(SMALL), "Ray is up; starting 2 tier process(es)..."]


def test_simulate_refuses_a_deep_folder_before_importing_torch_or_ray(tmp_path: Path) -> None:
    """One interpreter: the command's refusal (exit 2, one line, no run folder), with neither torch, Ray nor
    Flower imported by then (before: all three, ~5 s)."""
    deep, out = tmp_path / ("d" * 120), tmp_path / "run"
    code = ("import json, sys\n"
            "from splitfed.cli import main\n"
            f"code = main(['simulate', '--rounds', '1', '--out', {str(out)!r}])\n"
            "print(json.dumps([code, sorted(m for m in ('torch', 'ray', 'flwr') if m in sys.modules)]))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "RAY_TMPDIR": str(deep)})
    assert json.loads(p.stdout.splitlines()[-1]) == [2, []], p.stdout + p.stderr
    assert p.stderr.startswith(f"splitfed simulate: error: Ray cannot start under {deep}/ray: "), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not deep.exists() and not out.exists()
