"""Unit tests of the Flower integration's plain parts: settings, policy, records, round, checkpoint."""

from __future__ import annotations

import os
import re

import pytest
import torch

from splitfed.data import synthetic
from splitfed.engine.rounds import (
    RoundConfig,
    RoundFailed,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    run_round,
)
from splitfed.engine.types import OptimConfig
from splitfed.errors import ConfigError, RunFolderError
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import MetricsWriter, summarise
from splitfed.flower.policy import ClientInfo, StaticPolicy, make_policy, parse_static
from splitfed.flower.records import (
    NodeInfo,
    TrainInstruction,
    TrainReport,
    record_to_state,
    state_to_record,
)
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("cnn")
ASSIGN = {"client0": (1, 3), "client1": (2, 5), "client2": (0, 7)}


def _data(n_steps: int = 2, batch: int = 4) -> dict:
    out = {}
    for i, cid in enumerate(ASSIGN):
        x, y = synthetic(SPEC, n_steps * batch, 100 + i).tensors
        out[cid] = [(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]) for s in range(n_steps)]
    return out


# ---------------------------------------------------------------- settings


def test_settings_from_run_config_and_toml(tmp_path):
    s = RunSettings.from_mapping({"num-server-rounds": 7, "mode": "sflv2", "min-clients": "2", "u-shape": "true"})
    assert (s.rounds, s.mode, s.min_clients, s.u_shape) == (7, "sflv2", 2, True)
    f = tmp_path / "run.toml"
    f.write_text('[simulate]\nclients = 10\npartition = "dirichlet:0.5"\ntier-addresses = ["a:1", "b:2"]\n')
    s = RunSettings.from_toml(f)
    assert s.clients == 10 and s.partition == "dirichlet:0.5" and s.addresses == ("a:1", "b:2")


@pytest.mark.parametrize("values, words", [
    ({"rounds": 0}, "rounds must be >= 1"),
    ({"mode": "fedprox"}, "mode must be one of"),
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"clients": "many"}, "clients must be int"),
    ({"fraction": 1.5}, "fraction must be in"),
    ({"tier-addresses": "a:1"}, "3 tiers need 2"),
    ({"resume": True}, "resume needs the run folder"),
    ({"lr": -1.0}, "learning rate"),
    ({"min-device-blocks": -1}, "min-device-blocks must be >= 0"),
    ({"model": ["cnn", "mlp"]}, "model must be a string, got a list"),  # before: ran as model 'cnn,mlp'
    ({"cuts": ["static:2", "5"]}, "cuts must be a string, got a list"),  # before: ran as static:2,5
])
def test_settings_refuse_bad_values(values, words):
    with pytest.raises(ConfigError, match=words):
        RunSettings.from_mapping(values)


# ---------------------------------------------------------------- policy


def test_static_policy_deals_options_by_partition():
    pol = make_policy(RunSettings(cuts="static:1,3/2,5"))
    clients = [ClientInfo(f"client{i}", 100 + i, i) for i in range(4)]
    assert pol.assign(1, clients) == {"client0": (1, 3), "client1": (2, 5), "client2": (1, 3), "client3": (2, 5)}
    assert isinstance(pol, StaticPolicy) and pol.state_dict() == {"options": [[1, 3], [2, 5]]}


@pytest.mark.parametrize("spec, words", [("static:a,b", "integers"), ("static:", "at least one"),
                                         ("optimal", "unknown cut policy")])
def test_policy_refuses_bad_specs(spec, words):
    with pytest.raises(ConfigError, match=words):
        make_policy(RunSettings(cuts=spec))


@pytest.mark.parametrize("cuts", ["adaptive", "greedy"])
def test_min_device_blocks_keeps_raw_inputs_on_every_device(cuts, tmp_path):
    """A slow microcontroller on a fast link ships its raw inputs to the edge (cut 0) unless told otherwise.
    (The iot fleet's mcu-ble, 256 KiB, cannot hold block 0 beside the output it sends and its gradient.)"""
    from splitfed.sim.clock import fleet_for, make_clock
    from splitfed.sim.inprocess import sim_clients

    fleet = tmp_path / "mcu.toml"
    fleet.write_text('[edge]\nprofile = "edge-server"\n[cloud]\nprofile = "cloud-gpu"\n'
                     '[[device]]\nname = "phone"\nprofile = "phone-mid"\n'
                     '[[device]]\nname = "mcu-eth"\nflops = 2e7\nmemory_mb = 1\nup_mbps = 10\ndown_mbps = 10\n'
                     'rtt_ms = 10\n')
    base = RunSettings(clients=4, cuts=cuts, fleet=str(fleet), partition="dirichlet:0.5")
    clients = sim_clients(base, fleet_for(base))
    free = make_policy(base).assign(1, clients)
    assert min(c[0] for c in free.values()) == 0  # the constraint below changes something
    s = base.with_(min_device_blocks=1)
    kept = make_policy(s).assign(1, clients)
    assert min(c[0] for c in kept.values()) >= 1
    assert make_clock(s, fleet_for(s))(1, kept, clients, {}) > 0  # the clock prices the same cut space


def test_min_device_blocks_names_the_device_that_cannot_keep_them(tmp_path):
    fleet = tmp_path / "tiny.toml"
    fleet.write_text('[edge]\nprofile = "edge-server"\n[cloud]\nprofile = "cloud-gpu"\n'
                     '[[device]]\nname = "phone"\nprofile = "phone-mid"\n'
                     '[[device]]\nname = "sensor"\nprofile = "rpi4"\nmemory_mb = 0.02\n')
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.inprocess import sim_clients

    s = RunSettings(clients=2, cuts="adaptive", fleet=str(fleet))
    clients = sim_clients(s, fleet_for(s))
    sensor = next(c.client_id for c in clients if c.profile.startswith("sensor"))
    assert make_policy(s).assign(1, clients)[sensor][0] == 0  # it fits only by keeping nothing
    with pytest.raises(ConfigError, match=f"device '{sensor}' \\(fleet entry 'sensor'\\) cannot train any legal cut"):
        make_policy(s.with_(min_device_blocks=1)).assign(1, clients)


def test_parse_static_matches_verify_syntax():
    assert parse_static("2,5") == [(2, 5)]
    assert parse_static("1,3/2,5") == [(1, 3), (2, 5)]


# ---------------------------------------------------------------- records


def test_state_record_round_trip_is_exact():
    state = initial_state(SPEC, 3)
    back = record_to_state(state_to_record(state))
    assert set(back) == set(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)


def test_instruction_report_nodeinfo_round_trip():
    ins = TrainInstruction("run", 2, "client1", (1, 3), "sflv1", False, SPEC, OptimConfig(lr=0.1, momentum=0.9),
                           7, "digits", "dirichlet:0.5", 16, 2, "127.0.0.1:5000", token_file="/t")
    assert TrainInstruction.from_record(ins.to_record()) == ins
    rep = TrainReport(40, 3, 0.5, 30, 0.2, 0.3, 1000, 900)
    assert TrainReport.from_record(rep.to_record()) == rep
    assert rep.to_record()["num-examples"] == 40
    info = NodeInfo(3, 10, 144, "rpi4", "10.0.0.2:5000")
    assert NodeInfo.from_record(info.to_record()) == info


def test_malformed_instruction_names_the_key():
    rec = TrainInstruction("run", 1, "client0", (1, 3), "sflv1", False, SPEC, OptimConfig(), 0, "digits", "iid",
                           8, 1, "x:1").to_record()
    del rec["cuts"]
    with pytest.raises(ConfigError, match="missing 'cuts'"):
        TrainInstruction.from_record(rec)


# ---------------------------------------------------------------- one round, cut open


@pytest.mark.parametrize("mode", ["sflv1", "sflv2", "sl"])
def test_split_round_equals_run_round_bitwise(mode):
    data = _data()
    cfg = RoundConfig("r", 1, SPEC, mode, optim=OptimConfig(lr=0.05, momentum=0.9))
    s0 = initial_state(SPEC, 0)
    want, _ = run_round(cfg, inprocess_chain(2), s0, ASSIGN, data)
    chain = inprocess_chain(2)
    got = drive(SplitRound(cfg, chain.tiers, s0, ASSIGN), local_trainer(chain, data))
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert [t.clients() for t in chain.tiers] == [0, 0]  # everything released


@pytest.mark.parametrize("mode", ["sflv1", "sflv2", "sl"])
def test_failed_client_is_left_out(mode):
    """A client that never answers changes nothing: the round equals one without it."""
    data = _data()
    cfg = RoundConfig("r", 1, SPEC, mode, optim=OptimConfig(lr=0.05))
    s0 = initial_state(SPEC, 0)
    others = {c: k for c, k in ASSIGN.items() if c != "client1"}
    want, _ = run_round(cfg, inprocess_chain(2), s0, others, data)
    chain = inprocess_chain(2)
    inner = local_trainer(chain, data)

    def flaky(cfg, cuts, weights):  # type: ignore[no-untyped-def]
        return inner(cfg, {c: k for c, k in cuts.items() if c != "client1"},
                     {c: w for c, w in weights.items() if c != "client1"})

    rnd = SplitRound(cfg, chain.tiers, s0, ASSIGN, min_clients=2)
    got = drive(rnd, flaky)
    assert rnd.failed == ["client1"]
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert [t.clients() for t in chain.tiers] == [0, 0]


def _poison(t: torch.Tensor) -> None:
    with torch.no_grad():
        t.view(-1)[0] = float("nan")


def _trainer_that_diverges(chain, data, victim: str, where: str):  # type: ignore[no-untyped-def]
    """Real training, after which ``victim``'s device weights or edge replica hold a NaN (a diverged client)."""
    inner = local_trainer(chain, data)

    def train(cfg, cuts, weights):  # type: ignore[no-untyped-def]
        out = inner(cfg, cuts, weights)
        if victim in out:
            if where == "device":
                _poison(next(iter(out[victim].state.values())))
            else:
                _poison(next(chain.tiers[0]._bindings[(cfg.run_id, victim)].segment.parameters()))
        return out

    return train


@pytest.mark.parametrize("mode", ["sflv1", "sl", "sflv2"])  # sflv2 as sl: only a finished client hands it on
@pytest.mark.parametrize("where", ["device", "edge"])
def test_diverged_client_is_left_out_like_a_failed_one(mode, where):
    """NaN weights from one client (on its device or its edge replica) never reach the global model:
    the round equals one without that client, and says why it dropped it."""
    data = _data()
    cfg = RoundConfig("r", 1, SPEC, mode, optim=OptimConfig(lr=0.05))
    s0 = initial_state(SPEC, 0)
    want, _ = run_round(cfg, inprocess_chain(2), s0, {c: k for c, k in ASSIGN.items() if c != "client1"}, data)
    chain = inprocess_chain(2)
    rnd = SplitRound(cfg, chain.tiers, s0, ASSIGN, min_clients=2)
    got = drive(rnd, _trainer_that_diverges(chain, data, "client1", where))
    assert rnd.failed == ["client1"] and f"{where} weights" in rnd.why["client1"]
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert [t.clients() for t in chain.tiers] == [0, 0]


@pytest.mark.parametrize("mode, minimum, victim, where, words", [
    # too few clients left: the reason is in the error
    ("sflv1", 3, "client0", "device", r"failed: client0 \(its device weights '0\.\S+' hold NaN"),
    ("sflv2", 3, "client2", "edge", r"failed: client2 \(its edge weights"),
])
def test_divergence_that_leaves_nothing_fails_the_round(mode, minimum, victim, where, words):
    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig("r", 1, SPEC, mode), chain.tiers, initial_state(SPEC, 0), ASSIGN,
                     min_clients=minimum)
    with pytest.raises(RoundFailed, match=words):
        drive(rnd, _trainer_that_diverges(chain, _data(), victim, where))
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_round_below_minimum_fails_and_releases():
    chain = inprocess_chain(2)
    cfg = RoundConfig("r", 1, SPEC, "sflv1")
    rnd = SplitRound(cfg, chain.tiers, initial_state(SPEC, 0), ASSIGN, min_clients=2)
    with pytest.raises(RoundFailed, match="1 of 3 clients finished, fewer than the minimum 2"):
        drive(rnd, lambda cfg, cuts, w: local_trainer(chain, _data())(cfg, {"client0": cuts["client0"]},
                                                                      {"client0": w["client0"]}))
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_round_failure_names_at_most_three_clients():
    chain = inprocess_chain(2)
    many = {f"client{i}": (1, 3) for i in range(5)}
    rnd = SplitRound(RoundConfig("r", 1, SPEC, "sflv1"), chain.tiers, initial_state(SPEC, 0), many)
    with pytest.raises(RoundFailed, match=r"\(failed: client0, client1, client2, \+2 more\)$"):
        drive(rnd, lambda cfg, cuts, w: {})  # nobody answers
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_a_tier_that_is_gone_is_asked_to_release_once_a_round_not_once_per_client():
    """Real tiers over gRPC; the cloud stops mid-round. Each release to it waits out its client's retries
    (~2.3 s by default), so a failing round spent that per client before it said so; now once a round."""
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.server import serve_tier

    cloud = serve_tier("cloud", insecure=True)
    edge = serve_tier("edge", next_address=cloud.address, insecure=True)
    controls = [GrpcTierClient(a, insecure=True, deadline_s=5.0, retries=1) for a in (edge.address, cloud.address)]
    asked = [0, 0]

    def counted(t: int, release):  # type: ignore[no-untyped-def]
        def release_counted(run_id: str, client_id: str, secret: str = "") -> None:
            asked[t] += 1
            release(run_id, client_id, secret)
        return release_counted

    for t, c in enumerate(controls):
        c.release = counted(t, c.release)  # type: ignore[method-assign]
    try:
        rnd = SplitRound(RoundConfig("r", 1, SPEC, "sflv1"), controls, initial_state(SPEC, 0), ASSIGN)
        rnd.begin(rnd.groups()[0])
        assert edge.tier.clients() == cloud.tier.clients() == 3  # the clients; their base segments are released
        asked[:] = [0, 0]
        cloud.stop(0)
        rnd.close()
        assert asked == [3, 1] and edge.tier.clients() == 0  # before: [3, 3]
    finally:
        edge.stop(0)
        cloud.stop(0)
        for c in controls:
            c.close()


# ---------------------------------------------------------------- checkpoint and metrics


def test_checkpoint_round_trip(tmp_path):
    state = initial_state(SPEC, 1)
    ck = checkpoint.Checkpoint(4, state, RunSettings().to_dict(), {"client0": (1, 3)}, {"options": [[1, 3]]})
    checkpoint.save(tmp_path, ck)
    back = checkpoint.load(tmp_path)
    assert back.round == 4 and back.assignment == {"client0": (1, 3)} and back.policy == {"options": [[1, 3]]}
    assert all(torch.equal(back.state[k], state[k]) for k in state)
    assert torch.equal(back.rng, ck.rng) and back.settings == RunSettings().to_dict()


def test_resume_with_out_naming_the_same_folder_another_way_is_accepted(tmp_path, monkeypatch):
    """``--resume run --out /abs/run`` was refused as a move ("cannot move it"): the paths were compared as
    spelled."""
    run = tmp_path / "run"
    checkpoint.save(run, checkpoint.Checkpoint(1, initial_state(SPEC, 1), RunSettings().to_dict(), {}, {}))
    monkeypatch.chdir(tmp_path)
    for same in (run, "run/", "./run", tmp_path / "x" / ".." / "run"):
        assert checkpoint.resumed("run", same).round == 1
    with pytest.raises(ConfigError, match="--out elsewhere cannot move it"):
        checkpoint.resumed("run", "elsewhere")


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    """A crash while writing leaves the previous checkpoint whole and no temporary file."""
    state = initial_state(SPEC, 1)
    checkpoint.save(tmp_path, checkpoint.Checkpoint(1, state, {}))

    def crash(obj, f):  # type: ignore[no-untyped-def]
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(RunFolderError, match=f"cannot write the checkpoint in {tmp_path}: disk full"):
        checkpoint.save(tmp_path, checkpoint.Checkpoint(2, state, {}))
    monkeypatch.undo()
    assert checkpoint.load(tmp_path).round == 1
    assert os.listdir(tmp_path) == [checkpoint.FILENAME]


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=f"cannot resume: there is no folder {tmp_path / 'typo'}$"):
        checkpoint.load(tmp_path / "typo")  # before: "typo/checkpoint.pt does not exist (no round ... finished)"
    with pytest.raises(ConfigError, match="does not exist \\(no round of that run finished: start it again with --out"):
        checkpoint.load(tmp_path)
    (tmp_path / checkpoint.FILENAME).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        checkpoint.load(tmp_path)


def test_a_lost_checkpoint_beside_kept_rounds_is_named_so(tmp_path):
    """The metrics hold finished rounds but the checkpoint is gone (deleted, moved, a partial copy). Before,
    the message said no round had finished and to start again with --out, which the folder then refused."""
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n')
    with pytest.raises(ConfigError, match=r"checkpoint\.pt is missing, though .*metrics\.jsonl holds 2 finished "
                                          r"round\(s\): put the checkpoint back, or start the run over with "
                                          r"--overwrite"):
        checkpoint.load(tmp_path)


def test_metrics_writer_truncates_on_resume(tmp_path):
    w = MetricsWriter(tmp_path)
    for r in (1, 2, 3):
        w.append({"round": r, "accuracy": r / 10, "loss": 1.0, "wall_s": 1.0, "sim_round_s": 2.0,
                  "bytes_up": 10, "bytes_down": 20, "failed": []})
    w.truncate_after(2)
    rows = w.rows()
    assert [r["round"] for r in rows] == [1, 2]
    s = summarise(rows, {"seed": 0})
    assert s["final_accuracy"] == 0.2 and s["sim_time_s"] == 4.0 and s["bytes_up"] == 20


def test_metrics_are_strict_json_even_when_the_model_diverged(tmp_path):
    """A diverged model's loss is NaN; jq, browsers and pandas refuse NaN/Infinity in JSON: write null."""
    import json

    def strict(text: str):  # type: ignore[no-untyped-def]
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))

    w = MetricsWriter(tmp_path)
    w.append({"round": 1, "accuracy": 0.1, "loss": float("nan"), "train_loss": float("inf"), "failed": [],
              "decision": {"predicted_s": float("-inf"), "moved": []}, "per_client": {"a": [1.5, float("nan")]}})
    w.append({"round": 2, "accuracy": 0.2, "loss": 1.0, "failed": []})
    w.truncate_after(2)  # rewrites the file
    rows = [strict(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss"] is None and rows[0]["train_loss"] is None
    assert rows[0]["decision"]["predicted_s"] is None and rows[0]["per_client"]["a"] == [1.5, None]
    assert rows[1]["loss"] == 1.0
    path = w.write_summary(summarise([{**rows[1], "loss": float("nan")}], {"seed": 0}))
    assert strict(path.read_text())["final_loss"] is None


# ---------------------------------------------------------------- the simulate command refuses bad input early


@pytest.mark.parametrize("argv, words", [
    (["--cuts", "static:9,9"], "cuts 'static:9,9': cut 9 is out of range"),
    (["--tiers", "2", "--cuts", "static:2,5"], "cuts 'static:2,5': 2 tiers need 1 cut"),  # alone: static:2
    (["--partition", "dirichlet:-1"], "bad Dirichlet alpha"),
    (["--dataset", "imagenet"], "unknown dataset"),
    (["--cuts", "adaptive", "--fraction", "0.5"], "use fraction 1"),
    (["--resume", "/nonexistent/run"], "cannot resume"),
    (["--cuts", "static:2,5/0,4", "--min-device-blocks", "1"], "static cuts 0,4 keep 0 leading block(s) on the device"),
    (["--cuts", "adaptive", "--min-device-blocks", "8"], "no legal cut keeps 8 leading block(s) on the device"),
    (["--cuts", "adaptive", "--fleet", "iot", "--clients", "10", "--min-device-blocks", "3"],
     "cannot train any legal cut"),
    (["--lr", "inf"], "learning rate must be a finite number > 0"),
    (["--momentum", "nan"], "momentum must be a finite number >= 0"),
    (["--momentum", "1"], "command line: momentum must be below 1"),
    (["--weight-decay", "-1"], "weight decay must be a finite number >= 0"),
    (["--compress", "zip"], "unknown codec 'zip'"),
    (["--round-timeout-s", "0"], "round-timeout-s must be a positive number"),
    (["--call-timeout-s", "-1"], "call-timeout-s must be a positive number"),
])
def test_simulate_refuses_bad_input_before_starting_anything(argv, words, tmp_path, capsys, monkeypatch):
    import splitfed.sim.runner
    from splitfed.cli import main

    monkeypatch.setattr(splitfed.sim.runner, "simulate", lambda *a, **k: pytest.fail("simulate started"))
    assert main(["simulate", "--out", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_simulate_flags_override_the_config_file_and_absent_flags_keep_it(tmp_path):
    """Every run setting a user changes between experiments is a flag too (u-shape, codec, optimizer...)."""
    from splitfed.cli import build_parser
    from splitfed.commands.simulate import settings_from_args

    cfg = tmp_path / "run.toml"
    cfg.write_text('[simulate]\nu-shape = true\ncompress = "int8"\nmomentum = 0.5\nlr = 0.2\n')

    def settings(*argv: str) -> RunSettings:
        return settings_from_args(build_parser().parse_args(["simulate", "--config", str(cfg), "--out", "x", *argv]))

    kept = settings()
    assert (kept.u_shape, kept.compress, kept.momentum, kept.lr, kept.optimizer) == (True, "int8", 0.5, 0.2, "sgd")
    s = settings("--no-u-shape", "--compress", "topk:0.1", "--optimizer", "adam", "--lr", "0.01", "--momentum", "0",
                 "--weight-decay", "1e-4", "--round-timeout-s", "30", "--min-clients", "2",
                 "--call-timeout-s", "12.5")
    assert (s.u_shape, s.compress, s.optimizer, s.lr, s.momentum, s.weight_decay, s.round_timeout_s,
            s.min_clients, s.call_timeout_s) == (False, "topk:0.1", "adam", 0.01, 0.0, 1e-4, 30.0, 2, 12.5)
    assert kept.call_timeout_s == 60.0
    assert settings("--u-shape").u_shape is True
    assert RunSettings().min_clients == 1  # what --help says the default is


def test_a_config_file_and_the_flags_are_checked_as_a_whole_and_a_refusal_names_them(tmp_path):
    """A file's min-clients = 9 is right once --clients 10 is given; checking the file alone refused it."""
    from splitfed.cli import build_parser
    from splitfed.commands.simulate import settings_from_args

    cfg = tmp_path / "run.toml"
    cfg.write_text("[simulate]\nmin-clients = 9\n")

    def settings(*argv: str) -> RunSettings:
        return settings_from_args(build_parser().parse_args(["simulate", "--config", str(cfg), *argv]))

    s = settings("--clients", "10", "--out", "x")
    assert (s.min_clients, s.clients, s.out) == (9, 10, "x")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(cfg))}: min-clients \(9\) is more than clients \(4\)"):
        settings()  # the file alone: only the file is named (the run folder chosen for it is no one's doing)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(cfg))} \+ command line: min-clients \(9\) is more "
                                          r"than clients \(3\)"):
        settings("--clients", "3")
    with pytest.raises(ConfigError, match=r"^run config: momentum must be below 1 \(0.9 is usual\), got 1.5"):
        RunSettings.from_mapping({"momentum": 1.5}, source="run config")
    assert RunSettings.from_mapping({"momentum": 0.99}).momentum == 0.99


@pytest.mark.parametrize("error, code", [("round", 1), ("engine", 1), ("config", 2)])
def test_simulate_exit_code_tells_a_failed_run_from_refused_input(error, code, tmp_path, capsys, monkeypatch):
    import splitfed.sim.runner
    from splitfed.cli import main
    from splitfed.engine.rounds import RoundFailed

    raised = {"round": RoundFailed("round 2: only 0 clients' replicas could be used"),
              "engine": splitfed.sim.runner.SimulationError("the simulation engine failed: Ray did not start"),
              "config": ConfigError("bad value")}[error]

    def fail(*a, **k):  # type: ignore[no-untyped-def]
        raise raised

    monkeypatch.setattr(splitfed.sim.runner, "simulate", fail)
    assert main(["simulate", "--out", str(tmp_path / "run"), "--rounds", "1"]) == code
    assert capsys.readouterr().err.strip() == f"splitfed simulate: error: {raised}"
