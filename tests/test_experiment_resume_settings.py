"""An experiment's ``--resume`` keeps its finished runs or refuses, and its config's relative paths are its own.

Before, ``--resume`` with another config than the runs were trained with (a U-shape run resumed with the shipped
non-U config) took each finished run for unfinished and trained it again over its folder, saying only
"[sl] inprocess: ... -> runs/sl"; and a config's relative ``fleet`` (or dataset file) was looked up from the
current folder, then ``simulations/configs``, never beside the config: a fleet ``drift.tiny.toml`` beside it
loaded the shipped experiment config of that name ("unknown key 'policies'").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulations import common, variants
from splitfed.errors import ConfigError

CONFIGS = Path(common.__file__).resolve().parent / "configs"
TABLE = {"clients": 2, "rounds": 1, "model": "cnn", "dataset": "digits", "partition": "iid", "seed": 0}
U = {**TABLE, "cuts": "static:2,5,6", "u-shape": True}


def _cases(table: dict[str, object]) -> list[tuple[str, object]]:
    base = common.base_settings(table)
    return [(v, variants.variant_settings(v, base)) for v in ("sl", "fedavg")]


def _trained(out: Path) -> dict[str, bytes]:
    """The variants' runs of the U-shape table trained into ``out`` (as the experiment trains them): summaries."""
    with common._resuming(False, "variants"):
        common.run_cases(_cases(U), out, "inprocess")
    return {v: (out / "runs" / v / "summary.json").read_bytes() for v in ("sl", "fedavg")}


def _refusal(out: Path, run: str) -> str:
    cuts = {"sl": "'static:2,5,6' -> 'static:2,5'", "fedavg": "'static:7,7,7' -> 'static:7,7'"}[run]
    return (f"run {out / 'runs' / run}: cannot resume with different cuts ({cuts}), u-shape "
            "(True -> False): --resume with the config it ran with, or give another --out, or --overwrite to start "
            "over")


# ---------------------------------------------------------------- --resume with other settings


def test_resume_with_another_config_refuses_and_keeps_the_finished_runs(tmp_path: Path, capsys) -> None:
    """The prober's repro: before, rc 0 and runs/sl/summary.json said u_shape false."""
    out = tmp_path / "out"
    before = _trained(out)
    capsys.readouterr()
    cfg = tmp_path / "plain.toml"
    cfg.write_text((CONFIGS / "variants.tiny.toml").read_text().replace('"sl", "sflv1", "sflv2", "fedavg"',
                                                                        '"sl", "fedavg"'))
    assert variants.cli(["--config", str(cfg), "--out", str(out), "--resume"]) == 2
    printed = capsys.readouterr()
    assert printed.err == f"simulations.variants: error: {_refusal(out, 'sl')}\n"
    assert "[sl]" not in printed.out  # nothing trained
    assert {v: (out / "runs" / v / "summary.json").read_bytes() for v in before} == before
    assert not (out / "results.json").exists()


def test_the_refusal_comes_before_any_run_trains(tmp_path: Path) -> None:
    """A run that did not finish (no summary) is trained again, but not before a later finished one is checked."""
    out = tmp_path / "out"
    before = _trained(out)
    (out / "runs" / "sl" / "summary.json").unlink()
    with common._resuming(True, "variants"), pytest.raises(ConfigError) as e:
        common.run_cases(_cases(TABLE), out, "inprocess")
    assert str(e.value) == _refusal(out, "fedavg")
    assert not (out / "runs" / "sl" / "summary.json").exists()  # not trained again
    assert (out / "runs" / "fedavg" / "summary.json").read_bytes() == before["fedavg"]


def test_the_flower_backend_refuses_a_run_with_its_checkpoint_alike(tmp_path: Path) -> None:
    """Flower keeps checkpoint.pt beside the summary: refused as well, before Flower starts, the folder untouched."""
    out = tmp_path / "out"
    before = _trained(out)
    (out / "runs" / "sl" / "checkpoint.pt").write_bytes(b"kept")
    with common._resuming(True, "variants"), pytest.raises(ConfigError) as e:
        common.run_cases(_cases(TABLE), out, "flower")
    assert str(e.value) == _refusal(out, "sl")
    assert (out / "runs" / "sl" / "checkpoint.pt").read_bytes() == b"kept"
    assert (out / "runs" / "sl" / "summary.json").read_bytes() == before["sl"]


def test_resume_with_the_same_settings_keeps_finished_runs_and_trains_the_rest(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    before = _trained(out)
    (out / "runs" / "sl" / "summary.json").unlink()
    capsys.readouterr()
    with common._resuming(True, "variants"):
        runs = common.run_cases(_cases(U), out, "inprocess")
    printed = capsys.readouterr().out
    assert f"  [fedavg] kept: its 1 round(s) in {out / 'runs' / 'fedavg'}\n" in printed
    assert f"[sl] inprocess: cuts=static:2,5,6 mode=sl compress=none -> {out / 'runs' / 'sl'}\n" in printed
    assert [r.label for r in runs] == ["sl", "fedavg"]
    assert (out / "runs" / "fedavg" / "summary.json").read_bytes() == before["fedavg"]
    assert (out / "runs" / "sl" / "summary.json").is_file()


# ---------------------------------------------------------------- relative paths beside the config


def _config(folder: Path, simulate: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "exp.toml"
    cfg.write_text('variants = ["sl"]\nbackend = "inprocess"\n[simulate]\nclients = 2\nrounds = 1\nmodel = "cnn"\n'
                   + simulate)
    return cfg


def test_a_fleet_beside_the_config_is_its_own_not_a_shipped_file_of_that_name(tmp_path: Path, monkeypatch) -> None:
    """Before: simulations/configs/drift.tiny.toml (an experiment config) was read as the fleet."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "x" / "drift.tiny.toml"
    mine.parent.mkdir()
    mine.write_text((CONFIGS / "fleets" / "drift.tiny.toml").read_text())
    cfg = common.load_config(_config(tmp_path / "x", 'fleet = "drift.tiny.toml"\n'), variants.Config)
    assert cfg.settings().fleet == str(mine.resolve())


def test_a_dataset_file_beside_the_config_is_found(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "x" / "d.npz"
    data.parent.mkdir()
    x = np.zeros((20, 1, 8, 8), np.float32)
    np.savez(data, x_train=x, y_train=np.arange(20) % 10, x_test=x[:4], y_test=np.arange(4))
    cfg = common.load_config(_config(tmp_path / "x", 'dataset = "npz:d.npz"\n'), variants.Config)
    assert cfg.settings().dataset == f"npz:{data.resolve()}"


def test_the_shipped_configs_folder_is_still_looked_in_after_the_config_s(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = common.load_config(_config(tmp_path / "x", 'fleet = "fleets/drift.tiny.toml"\n'), variants.Config)
    assert cfg.settings().fleet == str(CONFIGS / "fleets" / "drift.tiny.toml")


def test_a_fleet_found_nowhere_is_refused_naming_the_config_s_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = _config(tmp_path / "x", 'fleet = "nope.toml"\n')
    with pytest.raises(ConfigError) as e:
        common.load_config(path, variants.Config)
    assert str(e.value) == (f"{path}: [simulate]: fleet 'nope.toml': no such file from the current folder "
                            f"({tmp_path}) or from {tmp_path / 'x'}, and no shipped fleet of that name (shipped: "
                            "iot, reference, small)")


def test_the_heterogeneity_sweeps_fleet_is_looked_for_beside_its_config(tmp_path: Path, monkeypatch) -> None:
    """Its top-level ``fleet`` (not a [simulate] table): before, only from the current folder ("no such fleet")."""
    from simulations import heterogeneity_sweep

    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "x" / "myfleet.toml"
    mine.parent.mkdir()
    mine.write_text((CONFIGS / "fleets" / "drift.tiny.toml").read_text())
    config = tmp_path / "x" / "sweep.toml"
    config.write_text('model = "cnn"\nfleet = "myfleet.toml"\nclients = [3]\nspreads = [0.0]\n')
    assert common.load_config(config, heterogeneity_sweep.Config).fleet == str(mine.resolve())
    assert heterogeneity_sweep.Config(fleet="reference").fleet == "reference"  # not read from a file: as given
