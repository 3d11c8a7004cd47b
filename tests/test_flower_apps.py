"""The ServerApp and ClientApp end to end, in-process (FakeGrid, in-process tiers): fast and exact.

The same checks over real Flower (simulation engine, SuperLink/SuperNodes) and
real gRPC tier processes are in ``test_flower_sim.py`` and ``test_flower_deploy.py``.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

import clients.app
import server.app
from splitfed.engine.rounds import RoundFailed, device_state, initial_state
from splitfed.engine.template import num_blocks
from splitfed.engine.verify import TOLERANCE, max_abs_diff
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.records import CONFIG, TrainInstruction
from splitfed.models.zoo import resolve_spec
from tests.flower_fixtures import (
    FakeGrid,
    assert_rounds_are_the_reference,
    inprocess_tiers,
    kept_rounds,
    reference_run,
)

BASE = RunSettings(rounds=2, clients=4, tiers=3, cuts="static:1,3/2,5/0,4/3,7", batch_size=32, lr=0.05,
                   momentum=0.9, node_wait_s=5.0, round_timeout_s=30.0)


def _run(monkeypatch, settings, grid=None, progress=lambda line: None):  # type: ignore[no-untyped-def]
    grid = grid or FakeGrid(clients.app.app, settings.clients)
    with inprocess_tiers(monkeypatch, settings.tiers - 1) as chain:
        summary = server.app.run(grid, settings, progress=progress)
        assert [t.clients() for t in chain.controls] == [0] * (settings.tiers - 1)  # all released
    return summary, grid


@pytest.mark.parametrize("mode", ["sflv1", "sflv2", "sl"])
def test_run_equals_unsplit_reference(monkeypatch, tmp_path, mode):
    s = BASE.with_(mode=mode, out=str(tmp_path), partition="dirichlet:0.5")
    with kept_rounds() as kept:
        summary, grid = _run(monkeypatch, s)
    assert_rounds_are_the_reference(s, kept)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and summary["rounds"] == 2
    assert rows[0]["cuts"]["client2"] == [0, 4] and rows[0]["bytes_up"] > 0
    # per-node state lives in each node's own context
    assert [int(c.state.metric_records[clients.app.STATS]["rounds"]) for c in grid.contexts.values()] == [2] * 4


def test_accuracy_rises(monkeypatch, tmp_path):
    _run(monkeypatch, BASE.with_(rounds=3, out=str(tmp_path), lr=0.1))
    acc = [json.loads(line)["accuracy"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert acc[-1] > acc[0] and acc[-1] > 0.5


def test_each_node_gets_only_its_own_segment(monkeypatch):
    _, grid = _run(monkeypatch, BASE.with_(rounds=1))
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(train) == 4
    full = initial_state(resolve_spec(BASE.model), BASE.seed)
    for msg in train:
        ins = TrainInstruction.from_record(msg.content.config_records[CONFIG])
        want = device_state(full, ins.cuts, num_blocks(ins.model), False)  # device blocks only
        assert set(msg.content.array_records["arrays"]) == set(want)
    assert len({id(m.content) for m in train}) == 4  # a fresh RecordDict per node


def test_resume_is_bit_identical(monkeypatch, tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    s = BASE.with_(rounds=3, partition="dirichlet:0.5")
    _run(monkeypatch, s.with_(out=str(whole)))
    _run(monkeypatch, s.with_(out=str(part), rounds=2))
    assert checkpoint.load(part).round == 2
    _run(monkeypatch, s.with_(out=str(part), resume=True))
    a, b = checkpoint.load(whole), checkpoint.load(part)
    assert a.round == b.round == 3
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    rows = lambda d: [json.loads(x)["accuracy"] for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert rows(whole) == rows(part)


def test_crashed_round_resumes_bit_identical(monkeypatch, tmp_path):
    """Round 3 fails (every node gone): the checkpoint keeps round 2 and the resumed run ends as if nothing happened."""
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    s = BASE.with_(rounds=3, min_clients=2, round_timeout_s=0.25)  # round 3 waits it out
    _run(monkeypatch, s.with_(out=str(whole)))
    dead = FakeGrid(clients.app.app, 4, drop=lambda node, msg: msg.metadata.group_id == "3")
    with pytest.raises(RoundFailed, match="round 3: 0 of 4"):
        _run(monkeypatch, s.with_(out=str(crashed)), grid=dead)
    assert checkpoint.load(crashed).round == 2
    _run(monkeypatch, s.with_(out=str(crashed), resume=True))
    a, b = checkpoint.load(whole), checkpoint.load(crashed)
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)


def test_failed_node_is_tolerated_down_to_the_minimum(monkeypatch, tmp_path):
    def broken(node, msg):  # type: ignore[no-untyped-def]
        return msg.metadata.message_type == "train" and node == grid.node_ids[1] and msg.metadata.group_id == "2"

    grid = FakeGrid(clients.app.app, 4, drop=broken)
    s = BASE.with_(out=str(tmp_path), min_clients=3, round_timeout_s=0.25)  # round 2 waits it out
    _run(monkeypatch, s, grid=grid)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["failed"] == [] and rows[1]["failed"] == ["client1"] and rows[1]["clients"] == 3
    assert rows[0]["why_failed"] == {} and rows[1]["why_failed"] == {"client1": "no reply before the round timeout"}


def test_client_exception_becomes_a_failure(monkeypatch, tmp_path):
    """A ClientApp that raises (Flower's error reply) is dropped like a silent one."""
    real = clients.app.app

    def app(msg, ctx):  # type: ignore[no-untyped-def]
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 2:
            raise RuntimeError("device out of memory")
        return real(msg, ctx)

    _run(monkeypatch, BASE.with_(rounds=1, out=str(tmp_path)), grid=FakeGrid(app, 4))
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["failed"] == ["client2"] and row["clients"] == 3


def test_error_reply_without_a_reason_is_a_failure_with_one(monkeypatch, tmp_path):
    """A node's error reply need not carry a reason (Flower's ``Error.reason`` is optional): the client is
    dropped as for any error, and the metrics row and the progress line name its error code."""
    from flwr.app import Error, Message

    real = clients.app.app

    def app(msg, ctx):  # type: ignore[no-untyped-def]
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 2:
            return Message(Error(code=3), reply_to=msg)
        return real(msg, ctx)

    lines: list[str] = []
    _run(monkeypatch, BASE.with_(rounds=1, out=str(tmp_path)), grid=FakeGrid(app, 4), progress=lines.append)
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["failed"] == ["client2"] and row["clients"] == 3
    assert row["why_failed"] == {"client2": "error reply with code 3 and no reason"}
    assert sum("failed 1: client2 (error reply with code 3" in x for x in lines) == 1


def _poison_first(state):  # type: ignore[no-untyped-def]
    state[min(state)].view(-1)[0] = float("inf")  # the same key whatever order the state comes in


def diverges(msg, ctx):  # type: ignore[no-untyped-def]
    """The ClientApp, except that partition 1 returns weights holding an infinity (a diverged device)."""
    from splitfed.flower.records import ARRAYS, record_to_state, state_to_record

    reply = clients.app.app(msg, ctx)
    if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 1:
        state = record_to_state(reply.content.array_records[ARRAYS])
        _poison_first(state)
        reply.content[ARRAYS] = state_to_record(state)
    return reply


def test_client_with_nan_weights_is_dropped_like_a_failed_one(monkeypatch, tmp_path, caplog):
    """A node that returns NaN weights (diverged, or corrupt) costs its own update, not the global model;
    the metrics row and the progress line say why."""
    real = clients.app.app

    def raises(msg, ctx):  # type: ignore[no-untyped-def]
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 1:
            raise RuntimeError("device out of memory")
        return real(msg, ctx)

    s = BASE.with_(rounds=1)
    _run(monkeypatch, s.with_(out=str(tmp_path / "raises")), grid=FakeGrid(raises, 4))
    lines: list[str] = []
    with caplog.at_level("WARNING"):
        _run(monkeypatch, s.with_(out=str(tmp_path / "nan")), grid=FakeGrid(diverges, 4), progress=lines.append)
    oom = json.loads((tmp_path / "raises" / "metrics.jsonl").read_text())
    row = json.loads((tmp_path / "nan" / "metrics.jsonl").read_text())
    assert "device out of memory" in oom["why_failed"]["client1"]
    assert row["failed"] == ["client1"] and row["clients"] == 3
    assert list(row["why_failed"]) == ["client1"]
    assert re.fullmatch(r"its device weights '[\w.]+' hold NaN or infinite values", row["why_failed"]["client1"])
    assert "client1 dropped from round 1: its device weights" in caplog.text
    assert sum(f"failed 1: client1 ({row['why_failed']['client1'][:40]}" in x for x in lines) == 1
    a, b = checkpoint.load(tmp_path / "raises").state, checkpoint.load(tmp_path / "nan").state
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_inprocess_backend_drops_a_diverged_client_as_the_flower_run_does(monkeypatch, tmp_path):
    import splitfed.engine.rounds as rounds
    from splitfed.sim.inprocess import train_inprocess

    s = BASE.with_(rounds=2, min_clients=3)
    _run(monkeypatch, s.with_(out=str(tmp_path / "flower")), grid=FakeGrid(diverges, 4))
    trainer = rounds.local_trainer

    def diverging_trainer(chain, data, failed=None):  # type: ignore[no-untyped-def]
        inner = trainer(chain, data, failed)

        def train(cfg, cuts, weights):  # type: ignore[no-untyped-def]
            out = inner(cfg, cuts, weights)
            _poison_first(out["client1"].state)
            return out

        return train

    monkeypatch.setattr(rounds, "local_trainer", diverging_trainer)
    train_inprocess(s.with_(out=str(tmp_path / "local")))
    keys = ("round", "accuracy", "loss", "train_loss", "bytes_up", "cuts", "clients", "failed", "why_failed")
    rows = {d: [{k: json.loads(x)[k] for k in keys} for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
            for d in ("flower", "local")}
    assert rows["local"] == rows["flower"] and rows["local"][1]["failed"] == ["client1"]


def test_a_client_whose_training_raises_fails_alone_in_both_backends(monkeypatch, tmp_path):
    """lr 50: one client's activation overflows and the edge refuses it; in a Flower run its node
    replies with an error and only it is dropped. The in-process backend did not catch it: the whole run
    ended with the tier's bare 'activation: contains NaN'. Now both end alike, naming every client's reason."""
    from splitfed.sim.inprocess import train_inprocess

    s = BASE.with_(rounds=2, lr=50.0)
    messages = []
    for name in ("flower", "local"):
        with pytest.raises(RoundFailed) as err:
            if name == "flower":
                _run(monkeypatch, s.with_(out=str(tmp_path / name)))
            else:
                train_inprocess(s.with_(out=str(tmp_path / name)))
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "round 1: only 0 clients' replicas could be used" in messages[1]
    assert "client2 (InvalidArgument: activation: contains NaN or infinite values)" in messages[1]
    assert err.value.exit_code == 1


@pytest.mark.parametrize("mode", ["sflv1", "sl"])
def test_a_round_a_client_failed_is_timed_for_the_clients_that_finished_in_both_backends(monkeypatch, tmp_path,
                                                                                       mode):
    """The clock priced every sampled client, the failed one too, while the row's bytes, clients and losses were
    the others': a dropped straggler set the round's time (in sl its whole turn was added)."""
    import splitfed.engine.rounds as rounds
    from splitfed.errors import SplitfedError
    from splitfed.sim.clock import fleet_for, make_clock
    from splitfed.sim.inprocess import sim_clients, train_inprocess

    s = BASE.with_(rounds=1, mode=mode, min_clients=2)

    def crashes(msg, ctx):  # type: ignore[no-untyped-def]
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 2:
            raise RuntimeError("the node crashed")
        return clients.app.app(msg, ctx)

    _run(monkeypatch, s.with_(out=str(tmp_path / "flower")), grid=FakeGrid(crashes, s.clients))
    train = rounds.train_client

    def raising(cfg, chain, cid, *args, **kwargs):  # type: ignore[no-untyped-def]
        if cid == "client2":
            raise SplitfedError("the node crashed")
        return train(cfg, chain, cid, *args, **kwargs)

    monkeypatch.setattr(rounds, "train_client", raising)
    train_inprocess(s.with_(out=str(tmp_path / "local")))
    fleet = fleet_for(s)
    done = [c for c in sim_clients(s, fleet) if c.client_id != "client2"]
    cuts = {c.client_id: tuple(int(k) for k in s.cuts.removeprefix("static:").split("/")[c.partition_id].split(","))
            for c in done}
    want = make_clock(s, fleet)(1, cuts, done, {})
    for name in ("flower", "local"):
        (row,) = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert row["failed"] == ["client2"] and row["sim_round_s"] == want, (name, row["sim_round_s"], want)


def test_a_diverged_global_model_stops_the_run_and_is_not_checkpointed(monkeypatch, tmp_path):
    """The main job at lr 100: after round 1 the global model's weights are finite, but its logits overflow
    (test loss NaN). The run stops there, in both backends, instead of failing every client of round 2;
    the row says so (loss null) and no checkpoint holds that model."""
    from pathlib import Path

    from splitfed.flower.workload import RunDiverged
    from splitfed.sim.inprocess import train_inprocess

    main = RunSettings.from_toml(Path(__file__).parents[1] / "simulations/configs/main.toml")
    s = main.with_(rounds=3, lr=100.0, node_wait_s=5.0)
    lines: list[str] = []
    with pytest.raises(RunDiverged, match=r"round 1: the global model diverged \(its test loss is not finite\); "
                                          r"the run stops and no round is kept \(start it again with --overwrite; flwr run: overwrite = true\) \(a learning rate "
                                          r"below 100\?\)") as err:
        _run(monkeypatch, s.with_(out=str(tmp_path / "flower")), grid=FakeGrid(clients.app.app, s.clients),
             progress=lines.append)
    assert err.value.exit_code == 1 and lines[-1].startswith("round 1/3") and re.search(r"loss (nan|inf) ", lines[-1])
    rows = [json.loads(x) for x in (tmp_path / "flower" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1] and rows[0]["loss"] is None
    assert not (tmp_path / "flower" / checkpoint.FILENAME).exists()
    with pytest.raises(RunDiverged, match="round 1: the global model diverged"):
        train_inprocess(s.with_(out=str(tmp_path / "local")))


def test_a_run_that_diverges_later_keeps_its_last_good_checkpoint(monkeypatch, tmp_path):
    """Round 2's global model evaluates to NaN (a stand-in for the evaluation only): the checkpoint keeps
    round 1, and a resumed run would start from there."""
    from splitfed.flower.workload import RunDiverged

    real = server.app.evaluate

    def evaluate(spec, state, x, y):  # type: ignore[no-untyped-def]
        acc, loss = real(spec, state, x, y)
        return (acc, float("nan")) if len(rows_so_far()) == 1 else (acc, loss)

    def rows_so_far():  # type: ignore[no-untyped-def]
        path = tmp_path / "metrics.jsonl"
        return path.read_text().splitlines() if path.exists() else []

    monkeypatch.setattr(server.app, "evaluate", evaluate)
    with pytest.raises(RunDiverged, match="round 2: .* the checkpoint keeps round 1"):
        _run(monkeypatch, BASE.with_(rounds=3, out=str(tmp_path)))
    assert checkpoint.load(tmp_path).round == 1 and len(rows_so_far()) == 2


def test_resume_refuses_changed_math(monkeypatch, tmp_path):
    _run(monkeypatch, BASE.with_(rounds=1, out=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"cannot resume with different lr \(0.05 -> 0.2\)"):
        _run(monkeypatch, BASE.with_(rounds=2, out=str(tmp_path), resume=True, lr=0.2))
    # which cuts run (their simulated time, bytes): the adaptive policy's hysteresis is the run's, as cuts are
    with pytest.raises(ConfigError, match=r"cannot resume with different hysteresis \(0.05 -> 0.2\)"):
        _run(monkeypatch, BASE.with_(rounds=2, out=str(tmp_path), resume=True, hysteresis=0.2))


@pytest.mark.parametrize("run_name", ["", "exp"])
def test_two_runs_with_one_seed_share_tiers_without_touching_each_other(monkeypatch, tmp_path, run_name):
    """Tiers are services many runs share. Two runs with the same seed (the default 0), or given the
    same run-name, but other math load their round-1 segments into the same tiers before either trains
    (a barrier forces it): each still ends exactly where it ends alone. Under one name the second load
    would take over the first run's segments, and a step of one run would be answered from the other's
    replay cache. Both starting at once, each also checks its model while the other builds its own: a check
    that drew from torch's generator without holding it moved the other's initial weights or a mask (about
    once in 150 runs; tests/test_rng_held.py holds that law every time)."""
    import threading

    from splitfed.engine import rounds

    a = BASE.with_(rounds=2, clients=3, cuts="static:1,3/2,5/0,4", run_name=run_name)
    b = a.with_(lr=0.2)
    with inprocess_tiers(monkeypatch, a.tiers - 1) as chain:
        for name, s in (("a", a), ("b", b)):
            server.app.run(FakeGrid(clients.app.app, s.clients), s.with_(out=str(tmp_path / f"{name}-alone")),
                           progress=lambda line: None)
        both_loaded = threading.Barrier(2, timeout=60)
        begin = rounds.SplitRound.begin

        def begin_then_wait(self, group):  # type: ignore[no-untyped-def]
            states = begin(self, group)
            if self.cfg.round == 1:
                both_loaded.wait()
            return states

        monkeypatch.setattr(rounds.SplitRound, "begin", begin_then_wait)
        errors: list[BaseException] = []

        def run(name: str, s: RunSettings) -> None:
            try:
                server.app.run(FakeGrid(clients.app.app, s.clients), s.with_(out=str(tmp_path / f"{name}-shared")),
                               progress=lambda line: None)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                both_loaded.abort()

        threads = [threading.Thread(target=run, args=x) for x in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert [t.clients() for t in chain.controls] == [0, 0]  # both released everything
    for name in ("a", "b"):
        alone, shared = checkpoint.load(tmp_path / f"{name}-alone"), checkpoint.load(tmp_path / f"{name}-shared")
        assert shared.round == 2 and all(torch.equal(alone.state[k], shared.state[k]) for k in alone.state), name
        # and each round as it went: its losses, and the bytes its clients sent and got (each node's own link)
        rows = [[{k: r[k] for k in ("round", "train_loss", "loss", "bytes_up", "bytes_down", "cuts")}
                 for r in map(json.loads, (tmp_path / f"{name}-{how}" / "metrics.jsonl").read_text().splitlines())]
                for how in ("alone", "shared")]
        assert rows[0] == rows[1] and len(rows[0]) == 2, name
    names = {json.loads((tmp_path / f"{n}-shared" / "summary.json").read_text())["settings"]["run_name"]
             for n in ("a", "b")}
    assert len(names) == 2 and all(n.startswith(f"{run_name or 'splitfed-0'}-") for n in names)


def test_a_resumed_run_keeps_its_name_on_the_tiers(monkeypatch, tmp_path):
    """So that its loads replace whatever the crashed run left behind on long-lived tiers."""
    lines: list[str] = []
    _run(monkeypatch, BASE.with_(rounds=1, out=str(tmp_path)), progress=lines.append)
    first = checkpoint.load(tmp_path).settings["run_name"]
    _run(monkeypatch, BASE.with_(rounds=2, out=str(tmp_path), resume=True), progress=lines.append)
    assert checkpoint.load(tmp_path).settings["run_name"] == first
    # the first line of each run names it (the name the tiers' status lines show) and its rounds
    starts = [x for x in lines if x.startswith("run ")]
    assert starts == [f"run {first}: sflv1, 3 tiers, cuts {BASE.cuts}, 4 client(s), rounds 1..1",
                      f"run {first}: sflv1, 3 tiers, cuts {BASE.cuts}, 4 client(s), rounds 2..2"]
    # resumed from a copy of the folder (which may be resumed twice at once), it is another run
    shutil.copytree(tmp_path, tmp_path.parent / "copy")
    _run(monkeypatch, BASE.with_(rounds=3, out=str(tmp_path.parent / "copy"), resume=True), progress=lines.append)
    copied = checkpoint.load(tmp_path.parent / "copy").settings["run_name"]
    assert copied != first and copied.startswith("splitfed-0-")


def test_every_run_gets_its_own_name_unless_it_continues_in_place(tmp_path) -> None:
    named = server.app.named
    mine = [named(BASE.with_(run_name="mine")).run_id for _ in range(2)]
    assert mine[0] != mine[1] and all(re.fullmatch(r"mine-[0-9a-f]{8}", n) for n in mine)
    assert re.fullmatch(r"splitfed-0-[0-9a-f]{8}", named(BASE).run_id)
    here = BASE.with_(out=str(tmp_path), resume=True)

    def ckpt(name: str, where: str) -> checkpoint.Checkpoint:
        return checkpoint.Checkpoint(1, {}, BASE.with_(run_name=name).to_dict(), where=where)

    in_place = checkpoint.place(tmp_path)
    assert named(here, ckpt("exp-0123abcd", in_place)).run_id == "exp-0123abcd"  # from the checkpoint (simulate)
    assert named(here.with_(run_name="exp"), ckpt("exp-0123abcd", in_place)).run_id == "exp-0123abcd"  # flwr run
    assert named(here.with_(run_name="exp-0123abcd"), ckpt("exp-0123abcd", "")).run_id == "exp-0123abcd"  # older
    assert named(here.with_(run_name="mine"), ckpt("mine", in_place)).run_id == "mine"  # named before tags
    renamed = named(here.with_(run_name="other"), ckpt("exp-0123abcd", in_place)).run_id
    assert re.fullmatch(r"other-[0-9a-f]{8}", renamed)
    copy = ckpt("exp-0123abcd", checkpoint.place(tmp_path / "x"))
    assert re.fullmatch(r"exp-0123abcd-[0-9a-f]{8}", named(here.with_(run_name="exp-0123abcd"), copy).run_id)
    assert re.fullmatch(r"splitfed-0-[0-9a-f]{8}", named(here, copy).run_id)
    assert checkpoint.place(tmp_path) == checkpoint.place(tmp_path / "x" / "..")


@pytest.mark.parametrize("cuts", ["adaptive", "greedy"])
def test_optimizer_policies_run_and_resume_exactly(monkeypatch, tmp_path, cuts):
    """--cuts adaptive/greedy: legal cuts from the optimizer; the adapter's state survives a resume."""
    s = BASE.with_(rounds=3, clients=5, cuts=cuts, fleet="small")
    _run(monkeypatch, s.with_(out=str(tmp_path / "whole")))
    _run(monkeypatch, s.with_(out=str(tmp_path / "part"), rounds=2))
    _run(monkeypatch, s.with_(out=str(tmp_path / "part"), resume=True))
    a, b = checkpoint.load(tmp_path / "whole"), checkpoint.load(tmp_path / "part")
    assert a.policy == b.policy and a.assignment == b.assignment and len(a.assignment) == 5
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    rows = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sim_round_s"] > 0 for r in rows)


def test_a_finished_adaptive_run_resumed_for_more_rounds_plans_them_as_one_run_would(monkeypatch, tmp_path):
    """Its last round's decision kept every cut (no round left to repay a move), and the resumed rounds ran
    those cuts: two phones 100x slower from round 2 stayed on their devices, rounds 3.3 s instead of 0.6 s."""
    fleet = tmp_path / "drift.toml"
    fleet.write_text('samples = 300\n[edge]\nprofile = "edge-server"\n[cloud]\nprofile = "cloud-gpu"\n'
                     '[[device]]\nname = "phone"\nprofile = "phone-mid"\ncount = 2\n'
                     '[[device.drift]]\nround = 2\nflops_scale = 0.01\n'
                     '[[device]]\nname = "pi"\nprofile = "rpi4"\n')
    s = BASE.with_(clients=3, rounds=3, cuts="adaptive", fleet=str(fleet), seed=2)
    _run(monkeypatch, s.with_(out=str(tmp_path / "whole")))
    _run(monkeypatch, s.with_(out=str(tmp_path / "part"), rounds=2))
    _run(monkeypatch, s.with_(out=str(tmp_path / "part"), resume=True))
    whole, part = ([json.loads(x) for x in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
                   for n in ("whole", "part"))
    assert whole[2]["moved"]  # the one run moves the phones' blocks after round 2
    assert [(r["cuts"], r["sim_round_s"]) for r in part] == [(r["cuts"], r["sim_round_s"]) for r in whole]


@pytest.mark.parametrize("tiers, u_shape, cuts", [(2, False, "static:2/4"), (3, True, "static:1,3,6/2,5,7")])
def test_two_tiers_and_u_shape_equal_reference(monkeypatch, tmp_path, tiers, u_shape, cuts):
    s = BASE.with_(rounds=1, tiers=tiers, u_shape=u_shape, cuts=cuts, out=str(tmp_path))
    _run(monkeypatch, s)
    assert max_abs_diff(checkpoint.load(tmp_path).state, reference_run(s)) <= TOLERANCE


def test_a_run_gives_the_callers_thread_count_back(monkeypatch, tmp_path):
    """A run computes with one torch thread (as every process of a Flower run); a caller running it
    in its own process (a notebook, the in-process tests) keeps its own setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _run(monkeypatch, BASE.with_(rounds=1, clients=2, cuts="static:1,3/2,5"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_a_client_a_tier_will_not_load_is_dropped_and_the_round_goes_on(monkeypatch, tmp_path):
    """A tier's refusal to load one client's segments (here: the cloud is full) failed the round, and with it
    the Flower run; now that client is dropped with the tier's reason and the others train."""
    s = BASE.with_(rounds=1, out=str(tmp_path), min_clients=2)
    grid = FakeGrid(clients.app.app, s.clients)
    with inprocess_tiers(monkeypatch, 2) as chain:
        chain.controls[1].max_clients = 3
        server.app.run(grid, s, progress=lambda line: None)
        assert [t.clients() for t in chain.controls] == [0, 0]
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["clients"] == 3 and row["failed"] == ["client3"]
    assert "could not be loaded" in row["why_failed"]["client3"] and "serves 3 clients" in row["why_failed"]["client3"]
