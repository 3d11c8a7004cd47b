"""What a user gets wrong about a run's files and flags is refused in one line, before anything starts.

Each case here reached a traceback, a misleading message, or a value silently ignored before
(found by feeding the CLI bad input): a damaged ``.npz``, an unreadable fleet file, a run
setting above ``[simulate]``, ``--out ""``, ``--resume`` with another ``--out``, settings no
round could satisfy, a damaged checkpoint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from splitfed.cli import main
from splitfed.data.datasets import read_npz
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec
from splitfed.profile.fleet import load_fleet

CNN = resolve_spec("cnn")


def _good_npz(path: Path) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.random((8, 1, 8, 8), dtype=np.float32), y_train=np.arange(8) % 10,
             x_test=rng.random((4, 1, 8, 8), dtype=np.float32), y_test=np.arange(4))
    return path


@pytest.mark.parametrize("make, words", [
    (lambda p, good: np.save(p, np.zeros((3, 64), np.float32)), "not a .npz archive"),  # a .npy by another name
    (lambda p, good: p.write_text("x_train,y_train\n1,2\n"), "not a .npz archive"),  # text (np.load said "pickled")
    (lambda p, good: p.write_bytes(good.read_bytes()[:500]), "cannot read it as a NumPy .npz"),  # a cut download
])
def test_a_damaged_npz_is_named_not_a_traceback(tmp_path, make, words) -> None:  # type: ignore[no-untyped-def]
    good = _good_npz(tmp_path / "good.npz")
    bad = tmp_path / "bad.npz"
    make(bad, good)
    if not bad.exists():  # np.save appends .npy
        Path(str(bad) + ".npy").rename(bad)
    with pytest.raises(ConfigError, match=rf"dataset npz:{bad}: {words}"):
        read_npz(bad, CNN)
    assert len(read_npz(good, CNN)) == 2


def test_an_unreadable_fleet_file_is_named(tmp_path) -> None:
    with pytest.raises(ConfigError, match="is a folder, not a fleet file"):
        load_fleet(tmp_path)
    binary = tmp_path / "fleet.toml"
    binary.write_bytes(b"\xff\xfename = 'x'\n")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0\)"):
        load_fleet(binary)
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked.toml"
        locked.write_text("name = 'x'\n")
        locked.chmod(0)
        with pytest.raises(ConfigError, match="cannot read fleet file"):
            load_fleet(locked)


def test_a_run_setting_above_simulate_is_refused_and_an_experiments_key_is_not(tmp_path) -> None:
    lost = tmp_path / "lost.toml"
    lost.write_text('rounds = 0\n[simulate]\nclients = 2\n')  # before: rounds silently 3
    with pytest.raises(ConfigError, match=r"'rounds' above \[simulate\] would be ignored"):
        RunSettings.from_toml(lost)
    experiment = tmp_path / "experiment.toml"
    experiment.write_text('codecs = ["none"]\ntarget_accuracy = 0.9\n[simulate]\nclients = 2\n')
    assert RunSettings.from_toml(experiment).clients == 2
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"clients = 2\n\xff\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        RunSettings.from_toml(binary)


def test_settings_no_round_could_satisfy_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"min-clients \(5\) is more than clients \(2\): no round could finish"):
        RunSettings(clients=2, min_clients=5)
    with pytest.raises(ConfigError, match=r"seed must be an integer in 0\.\.4,294,967,295 \(2\*\*32-1\), got "):
        RunSettings(seed=2**64)
    with pytest.raises(ConfigError, match=r"^clients must be at most 100,000 \(a fleet splitfed holds\), got 100,001$"):
        RunSettings(clients=100_001, min_clients=1)  # before: refused by Fleet.sample, not naming clients
    assert RunSettings(clients=100_000).clients == 100_000


@pytest.mark.parametrize("key", ["lr", "weight_decay"])  # momentum: below 1 (test_flower_units)
def test_an_optimizer_number_that_does_not_fit_float32_is_refused_with_the_config(tmp_path, key) -> None:
    from splitfed.flower.config import FLOAT32_MAX

    config = tmp_path / "c.toml"
    config.write_text(f"{key} = 1e300\n")  # before: accepted, then a float overflow (or -inf weights) at a tier
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(config))}: {key.replace('_', '-')} 1e\+300 does not "
                                          r"fit float32, which the "
                                          r"tiers' optimizer works in: give at most 3\.403e\+38$"):
        RunSettings.from_toml(config)
    assert getattr(RunSettings(**{key: FLOAT32_MAX}), key) == FLOAT32_MAX


def test_run_config_and_cli_seeds_share_one_bound(capsys) -> None:
    from splitfed.cli import build_parser
    from splitfed.commands import _args
    from splitfed.flower import config

    assert _args.MAX_SEED is config.MAX_SEED == 2**32 - 1
    assert RunSettings(seed=2**32 - 1).seed == 2**32 - 1  # before: the run config took up to 2**63-1
    for bad in (2**32, -1):
        with pytest.raises(ConfigError, match=rf"^seed must be an integer in 0\.\.4,294,967,295 \(2\*\*32-1\), got {bad}$"):
            RunSettings(seed=bad)
    verify = ["verify", "--model", "mlp", "--cuts", "2", "--seed"]
    assert build_parser().parse_args([*verify, str(2**32 - 1)]).seed == 2**32 - 1
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*verify, str(2**32)])
    assert exc.value.code == 2
    assert "argument --seed: expected an integer in 0..4,294,967,295, got 4294967296" in capsys.readouterr().err


def test_a_batch_size_beyond_what_any_host_holds_is_refused_as_the_other_commands_refuse_it(tmp_path,
                                                                                           capsys) -> None:
    """simulate took any --batch-size: 10**20 overflowed torch (a traceback), 10**8 tried to allocate 25 GB while
    profiling and then named --batch, a flag simulate does not have."""
    from splitfed.engine.limits import MAX_BATCH

    out = tmp_path / "run"
    for bad in ("99999999999999999999", str(MAX_BATCH + 1)):
        with pytest.raises(SystemExit) as exc:
            main(["simulate", "--clients", "2", "--rounds", "1", "--batch-size", bad, "--out", str(out)])
        assert exc.value.code == 2
        assert (f"argument --batch-size: expected an integer in 1..{MAX_BATCH:,}, got {bad}"
                in capsys.readouterr().err)
    config = tmp_path / "c.toml"
    config.write_text(f"batch-size = {MAX_BATCH + 1}\n")
    with pytest.raises(ConfigError, match=f"c.toml: batch-size must be at most 1,048,576, got {MAX_BATCH + 1}$"):
        RunSettings.from_toml(config)
    assert not out.exists()


def test_a_config_with_an_integer_python_will_not_read_is_named(tmp_path, capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text("rounds = 1" + "0" * 5000 + "\n")
    assert main(["simulate", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"splitfed simulate: error: config file {config}: not valid TOML: ") and "4300" in err
    assert err.count("\n") == 1, err


def test_a_run_folder_that_cannot_be_written_is_refused_before_anything_starts(tmp_path, capsys) -> None:
    """Only files in the way were looked for: the engine and the tiers started (28 s) before the folder was
    made, and refused. /proc refuses every user, root too."""
    from splitfed.flower import runfolder

    assert main(["simulate", "--clients", "2", "--rounds", "1", "--out", "/proc/splitfed-test/run"]) == 2
    out, err = capsys.readouterr()
    assert "starting" not in out + err, out + err
    assert err.startswith("splitfed simulate: error: cannot write run folder /proc/splitfed-test/run: ") and \
        err.count("\n") == 1, err
    nested = tmp_path / "a" / "b" / "run"
    runfolder.check(nested, resume=False, overwrite=False)  # a folder it can write: accepted, and nothing made
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "there").mkdir()
    runfolder.check(tmp_path / "there", resume=False, overwrite=False)
    assert list((tmp_path / "there").iterdir()) == []


def test_resume_in_a_config_says_to_give_resume_on_the_command_line(tmp_path, capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text("resume = true\n")
    assert main(["simulate", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # before: "resume needs the run folder (out)", nothing on what to do
    assert f"{config}: resume is for a run config" in err and "drop resume and give --resume FOLDER" in err, err
    assert not (tmp_path / "run").exists()


def test_a_model_given_as_a_table_is_refused_as_such(tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('model = {name = "cnn"}\n')  # before: cannot import "{'name'"
    with pytest.raises(ConfigError, match=r": model must be a string \(a zoo name or module:factory\), got a table$"):
        RunSettings.from_toml(config)
    config.write_text('[simulate]\ndataset = {name = "digits"}\n')
    with pytest.raises(ConfigError, match=r"c\.toml: dataset must be a string, got a table$"):
        RunSettings.from_toml(config)
    with pytest.raises(ConfigError, match=r"^x: lr must be float, got 1000"):  # before: OverflowError traceback
        RunSettings.from_mapping({"lr": 10**400}, source="x")


def test_simulate_flags_that_would_lose_the_run_are_refused(tmp_path, capsys) -> None:
    assert main(["simulate", "--out", "", "--rounds", "1"]) == 2  # before: trained, then failed to write
    assert "--out must name a folder" in capsys.readouterr().err
    checkpoint.save(tmp_path / "a", checkpoint.Checkpoint(1, {"w": torch.ones(2)}, RunSettings().to_dict()))
    assert main(["simulate", "--resume", str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 2
    assert "cannot move it" in capsys.readouterr().err  # before: --out silently ignored


def test_too_few_samples_for_the_clients_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys) -> None:
    import splitfed.sim.runner

    monkeypatch.setattr(splitfed.sim.runner, "simulate", lambda *a, **k: pytest.fail("started"))
    one = tmp_path / "one.npz"
    np.savez(one, x_train=np.zeros((1, 1, 8, 8), np.float32), y_train=np.zeros(1, np.int64),
             x_test=np.zeros((1, 1, 8, 8), np.float32), y_test=np.zeros(1, np.int64))
    assert main(["simulate", "--dataset", f"npz:{one}", "--clients", "2", "--cuts", "static:1,3",
                 "--out", str(tmp_path / "run")]) == 2
    assert "2 clients but only 1 sample: each client needs at least one; use at most 1 client, or more samples" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_damaged_checkpoint_says_so(tmp_path) -> None:
    folder = tmp_path / "run"
    checkpoint.save(folder, checkpoint.Checkpoint(1, {"w": torch.ones(2)}, RunSettings().to_dict()))
    raw = (folder / checkpoint.FILENAME).read_bytes()
    for damaged in (raw[: len(raw) // 2], b"", b"plain text"):
        (folder / checkpoint.FILENAME).write_bytes(damaged)
        with pytest.raises(ConfigError, match="it is corrupt or truncated"):
            checkpoint.load(folder)
    (folder / checkpoint.FILENAME).unlink()
    (folder / checkpoint.FILENAME).mkdir()
    with pytest.raises(ConfigError, match="is not a file"):
        checkpoint.load(folder)
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a run folder"):
        checkpoint.load(tmp_path / "plain")


def test_a_run_that_fails_before_any_round_leaves_nothing_behind(tmp_path) -> None:
    folder = tmp_path / "new"
    with pytest.raises(RuntimeError), runfolder.claim(folder, resume=False, overwrite=False):
        (folder / "metrics.jsonl").write_text("")  # as a run's writer starts it
        raise RuntimeError("round 1 failed")
    assert not folder.exists()  # the run made it, and nothing of it is left
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with runfolder.claim(kept, resume=False, overwrite=False):
        (kept / "metrics.jsonl").write_text("")
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    with runfolder.claim(kept, resume=False, overwrite=False):
        (kept / "metrics.jsonl").write_text('{"round": 1}\n')
    assert sorted(p.name for p in kept.iterdir()) == [runfolder.LOCK, "metrics.jsonl", "notes.txt"]


def test_addresses_and_node_config_values_are_checked_where_they_are_read(tmp_path) -> None:
    from splitfed.flower.node import NodeConfig

    with pytest.raises(ConfigError, match=r"bad tier-addresses entry '127.0.0.1:99999': want HOST:PORT"):
        RunSettings(tiers=3, tier_addresses="127.0.0.1:7000,127.0.0.1:99999")
    assert RunSettings(tiers=3, tier_addresses="edge.local:7000,[::1]:7001").addresses == ("edge.local:7000",
                                                                                          "[::1]:7001")
    base = {"partition-id": 0, "num-partitions": 2}
    for cfg, words in (({**base, "edge-address": "edge"}, "bad node config: edge-address 'edge'"),
                       ({"partition-id": 0, "num-partitions": 0}, "num-partitions must be >= 1, got 0"),
                       ({"partition-id": "\u00b2", "num-partitions": 2}, "partition-id must be an integer"),
                       ({**base, "data-file": str(tmp_path)}, "a folder, not a file")):
        with pytest.raises(ConfigError, match=words):
            NodeConfig.parse(cfg)


@pytest.mark.parametrize("name", ["exp 1", "-exp", "x" * 201, "exp/1", "é"])
def test_a_run_name_the_tiers_could_not_take_is_refused(name) -> None:
    """Before: accepted, then every load refused by the tiers (over 256 characters) or a name in the tiers'
    logs that splits on a space."""
    with pytest.raises(ConfigError, match=r"^run-name must be 1\.\.200 letters, digits, '\.', '_' or '-' "):
        RunSettings(run_name=name)
    assert RunSettings(run_name="exp_1.a-" + "x" * 192).run_name.endswith("x")


def test_resume_on_a_changed_dataset_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys) -> None:
    """The digest of the dataset's files is checked with the other resume checks, before Ray and the tiers
    start (before: the same refusal, ~30 s later, from the running ServerApp)."""
    import splitfed.sim.runner

    monkeypatch.setattr(splitfed.sim.runner, "simulate", lambda *a, **k: pytest.fail("started"))
    data = _good_npz(tmp_path / "d.npz")
    run = tmp_path / "run"
    settings = RunSettings(dataset=f"npz:{data}", clients=2, rounds=1, out=str(run))
    checkpoint.save(run, checkpoint.Checkpoint(1, {"w": torch.ones(2)}, settings.to_dict(), data="0" * 64))
    assert main(["simulate", "--resume", str(run), "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"cannot resume: the files of dataset 'npz:{data}' changed since the checkpoint (sha256 000000000000" \
           "... then, " in err, err


def test_resume_on_a_fleet_whose_devices_changed_is_refused_before_anything_starts(tmp_path, monkeypatch,
                                                                                   capsys) -> None:
    """Before, a fleet file edited between a crash and its resume was taken as it was now: the rounds after
    were simulated on other devices than the ones before, under the same client names, and the adaptive
    policy carried what it had learned of the old ones. A comment changes nothing: the devices are compared."""
    import splitfed.sim.runner
    from splitfed.profile.fleet import fleet_digest

    monkeypatch.setattr(splitfed.sim.runner, "simulate", lambda *a, **k: pytest.fail("started"))
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[edge]\nprofile = "edge-server"\n[[device]]\nname = "pi"\nprofile = "rpi4"\n')
    run = tmp_path / "run"
    settings = RunSettings(fleet=str(fleet), clients=2, rounds=1, out=str(run))
    checkpoint.save(run, checkpoint.Checkpoint(1, {"w": torch.ones(2)}, settings.to_dict(),
                                               fleet=fleet_digest(fleet)))
    fleet.write_text("# the same devices\n" + fleet.read_text())
    assert fleet_digest(fleet) == checkpoint.load(run).fleet
    fleet.write_text(fleet.read_text().replace("rpi4", "laptop"))
    assert main(["simulate", "--resume", str(run), "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"cannot resume: the devices of fleet '{fleet}' changed since the checkpoint (sha256 " in err, err


_MCU_FLEET = """
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "mcu"
flops = 2e7
memory_mb = 0.25
up_mbps = 0.7
down_mbps = 0.7
rtt_ms = 50
[[device]]
name = "pi"
profile = "rpi4"
"""


def _refused_static(tmp_path: Path, capsys: pytest.CaptureFixture[str], fleet_text: str, cuts: str,
                    clients: int) -> tuple[Path, str]:
    """``splitfed simulate`` of static ``cuts`` on a fleet file: refused (exit 2) with nothing written; the
    fleet file and the refusal."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_text)
    out = tmp_path / "run"
    assert main(["simulate", "--fleet", str(fleet), "--cuts", f"static:{cuts}", "--clients", str(clients),
                 "--rounds", "1", "--out", str(out)]) == 2
    assert not out.exists()
    return fleet, capsys.readouterr().err


def test_static_cuts_a_device_cannot_hold_are_refused_naming_its_fleet_entry(tmp_path, capsys) -> None:
    """Before: simulate ran them and its clock priced rounds no such device could train, while
    ``splitfed optimize --static`` refused the same cuts (a static baseline that is physically impossible)."""
    fleet, err = _refused_static(tmp_path, capsys, _MCU_FLEET, "7,7", 3)
    # 3 clients of its 2 devices (seed 0): each once and the pi once more, in the file's order: mcu-0 is client0
    assert re.search(r"cuts 7,7 do not fit fleet device 'mcu' \(client0\): they need 0\.58 MiB "
                     r"of its 0\.25 MiB", err), err
    assert main(["optimize", "--model", "cnn", "--fleet", str(fleet), "--static", "7,7"]) == 2  # the same verdict
    assert "do not fit device 'mcu" in capsys.readouterr().err
    from splitfed.sim.runner import validate

    settings = RunSettings(fleet=str(fleet), clients=3, rounds=1)
    validate(settings.with_(cuts="static:0,7"))  # cuts that keep nothing on the device fit every device
    validate(settings.with_(cuts="static:0,7/7,7/7,7"))  # dealt out by client: the mcu (client0) gets 0,7
    with pytest.raises(ConfigError, match=r"cuts 7,7 do not fit fleet device 'mcu' \(client0\)"):
        validate(settings.with_(cuts="static:7,7/0,7/0,7"))  # the pis (client1, 2) get 0,7: the mcu does not


def test_static_cuts_a_server_tier_cannot_hold_are_refused_too(tmp_path, capsys) -> None:
    """Only the devices were checked: cuts that overflowed the fleet's edge were simulated and timed without a
    word, while ``splitfed optimize --static`` called them infeasible."""
    fleet, err = _refused_static(tmp_path, capsys, '[edge]\nprofile = "edge-server"\nmemory_mb = 0.5\n[cloud]\n'
                                 'profile = "cloud-gpu"\n[[device]]\nname = "pi"\nprofile = "rpi4"\ncount = 2\n',
                                 "0,7", 2)
    assert re.search(r"cuts 0,7 overflow the fleet's edge: its segments of the 2 clients need 1\.16 MiB of its "
                     r"0\.5 MiB", err), err
    from splitfed.sim.runner import validate

    validate(RunSettings(fleet=str(fleet), clients=2, rounds=1, cuts="static:7,7"))  # all on the devices: fits


def test_a_drift_at_round_1_is_in_the_first_plan(tmp_path) -> None:
    """The plan of round 1 (adaptive, greedy, best static) was made on the fleet before its drift, which the
    clock applied from round 1: devices already 100x slower were planned as they were not."""
    from splitfed.flower.adaptive import scenario
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.inprocess import sim_clients

    fleet = tmp_path / "drift.toml"
    fleet.write_text('[edge]\nprofile = "edge-server"\n[cloud]\nprofile = "cloud-gpu"\n'
                     '[[device]]\nname = "phone"\nprofile = "phone-mid"\n'
                     '[[device.drift]]\nround = 1\nflops_scale = 0.01\n')
    settings = RunSettings(fleet=str(fleet), clients=1, rounds=2, cuts="adaptive")
    drawn = fleet_for(settings)
    (planned,) = scenario(settings, sim_clients(settings, drawn)).clients
    assert planned.device.flops == pytest.approx(drawn.clients[0].device.flops * 0.01)


def test_the_memory_a_device_needs_counts_the_run_s_optimizer_state(tmp_path, capsys) -> None:
    """Adam keeps two tensors per parameter (and a step count per trained Parameter), SGD with momentum one,
    plain SGD none. Before, simulate's memory model counted one whatever the run's optimizer: an Adam run was
    let onto a device it overflows."""
    from splitfed.sim.runner import validate

    fleet = tmp_path / "mcu.toml"
    fleet.write_text(_MCU_FLEET.replace("memory_mb = 0.25", "memory_mb = 0.6"))
    settings = RunSettings(fleet=str(fleet), clients=3, rounds=1, cuts="static:7,7")
    validate(settings)  # SGD, momentum 0.9: 0.58 MiB
    validate(settings.with_(momentum=0.0))  # plain SGD: 0.527 MiB
    with pytest.raises(ConfigError, match=r"do not fit fleet device 'mcu' .*need 0\.633 MiB of its 0\.6 MiB"):
        validate(settings.with_(optimizer="adam"))
    base = ["optimize", "--model", "cnn", "--fleet", str(fleet), "--static", "7,7"]
    assert main([*base, "--optimizer-slots", "1"]) == 0
    capsys.readouterr()
    assert main([*base, "--optimizer-slots", "2"]) == 2  # the same verdict from the same cost model
    assert "do not fit device 'mcu" in capsys.readouterr().err


def test_a_last_batch_of_one_sample_a_batchnorm_cannot_train_on_is_refused() -> None:
    """Before: that client failed every round ("Expected more than 1 value per channel"), each time dropped."""
    from splitfed.sim.runner import validate

    settings = RunSettings(model="tests.own_models:digits_batchnorm", clients=2, rounds=1, cuts="static:1,3",
                           batch_size=718)  # digits: 1437 training samples, so 719 and 718
    with pytest.raises(ConfigError, match=r"client\d has 719 sample\(s\): with batch size 718 its last batch "
                                          r"holds one sample, and model .* cannot train on one \(Expected more"):
        validate(settings)
    validate(settings.with_(batch_size=64))  # 719 % 64 = 15
    validate(settings.with_(model="cnn"))  # its BatchNorm2d sees 4x4 values a channel: one sample trains


def test_resume_of_a_checkpoint_holding_another_model_is_refused_before_anything_starts(tmp_path, monkeypatch,
                                                                                         capsys) -> None:
    """A checkpoint from before a run on an .npz took its labels' classes holds a 10-class head; before, the
    resume started Ray and the tiers, failed at the first load, exited 2 and suggested the same command."""
    import splitfed.sim.runner
    from splitfed.data.datasets import spec_for
    from splitfed.engine.rounds import initial_state
    from splitfed.models.zoo import resolve_spec

    monkeypatch.setattr(splitfed.sim.runner, "simulate", lambda *a, **k: pytest.fail("started"))
    rng = np.random.default_rng(0)
    data = tmp_path / "three.npz"
    np.savez(data, x_train=rng.normal(size=(30, 1, 8, 8)).astype(np.float32), y_train=np.arange(30) % 3,
             x_test=rng.normal(size=(6, 1, 8, 8)).astype(np.float32), y_test=np.arange(6) % 3)
    run = tmp_path / "run"
    settings = RunSettings(model="mlp", dataset=f"npz:{data}", clients=2, rounds=1, out=str(run))
    assert spec_for("mlp", f"npz:{data}").num_classes == 3
    old = initial_state(resolve_spec("mlp", (64,), 10), 0)  # what the run was sized as before: 10 classes
    checkpoint.save(run, checkpoint.Checkpoint(1, old, settings.to_dict()))
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    assert main(["simulate", "--resume", str(run), "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume: the checkpoint holds another model than this run builds from its settings and data" \
           in err and "[10, 64] in the checkpoint, float32 [3, 64] here" in err and "--overwrite" in err, err
    assert "continue with" not in err
