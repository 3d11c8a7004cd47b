"""A new run records its dataset's and fleet file's paths absolute: its settings are what ``--resume`` reads, from
whatever folder it is given in. A config file's relative dataset path is found beside the config, as its fleet is.

Before, ``dataset = "npz:mydata.npz"`` beside a config was looked for in the current folder only ("no such file"),
and a run started with ``--dataset mnist:data`` recorded ``mnist:data``: resumed from another folder it read
another folder's files, or none ("mnist: missing data/...")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from splitfed.cli import build_parser
from splitfed.commands.simulate import settings_from_args
from splitfed.flower.config import dataset_beside


def _npz(path: Path) -> Path:
    x = np.zeros((20, 1, 8, 8), np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=x, y_train=np.arange(20) % 10, x_test=x[:4], y_test=np.arange(4))
    return path


def _settings(*argv: str):  # noqa: ANN202
    return settings_from_args(build_parser().parse_args(["simulate", *argv]))


def test_a_relative_dataset_path_is_made_absolute_from_where_it_is(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    here, there = tmp_path / "here", tmp_path / "cfg"
    here.mkdir()
    _npz(there / "d.npz")
    monkeypatch.chdir(here)
    assert dataset_beside("npz:d.npz", there) == f"npz:{there / 'd.npz'}"  # beside the config only
    _npz(here / "d.npz")
    assert dataset_beside("npz:d.npz", there) == f"npz:{here / 'd.npz'}"  # the current folder's first
    assert dataset_beside("MNIST:nowhere") == f"mnist:{(here / 'nowhere').resolve()}"  # refused later, by this name
    assert dataset_beside(f"cifar10:{there}") == f"cifar10:{there}"
    for other in ("digits", "synthetic", "npz:", "what:x", 7):
        assert dataset_beside(other, there) == other  # nothing to place: its own check names it


def test_a_tilde_is_the_home_folder_not_a_folder_beside_the_config(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _npz(tmp_path / "home" / "d.npz")
    assert dataset_beside("npz:~/d.npz", tmp_path / "cfg") == f"npz:{tmp_path / 'home' / 'd.npz'}"


def test_a_config_s_dataset_and_fleet_are_found_beside_it_and_recorded_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_dir, elsewhere = tmp_path / "experiment", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _npz(cfg_dir / "data" / "mine.npz")
    (cfg_dir / "lab.toml").write_text((Path(__file__).parents[1] / "splitfed" / "fleets" / "small.toml").read_text())
    cfg = cfg_dir / "run.toml"
    cfg.write_text('dataset = "npz:data/mine.npz"\nfleet = "lab.toml"\nmodel = "cnn"\nclients = 2\n')
    monkeypatch.chdir(elsewhere)
    s = _settings("--config", str(cfg), "--out", "run")
    assert s.dataset == f"npz:{cfg_dir / 'data' / 'mine.npz'}"
    assert s.fleet == str(cfg_dir / "lab.toml")
    assert s.spec.input_shape == (1, 8, 8)  # the file it names is read


def test_flags_relative_paths_are_recorded_from_the_current_folder(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _npz(tmp_path / "d.npz")
    (tmp_path / "f.toml").write_text((Path(__file__).parents[1] / "splitfed" / "fleets" / "small.toml").read_text())
    monkeypatch.chdir(tmp_path)
    s = _settings("--dataset", "npz:d.npz", "--fleet", "f.toml", "--model", "cnn", "--out", "run")
    assert (s.dataset, s.fleet) == (f"npz:{tmp_path / 'd.npz'}", str(tmp_path / "f.toml"))
    shipped = _settings("--fleet", "small", "--out", "run")
    assert (shipped.dataset, shipped.fleet) == ("digits", "small")  # names, not paths: as they are


def test_an_experiment_s_dataset_is_found_as_its_fleet_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simulations import common

    monkeypatch.setattr(common, "CONFIGS", tmp_path / "configs")
    _npz(tmp_path / "configs" / "data" / "mine.npz")
    monkeypatch.chdir(tmp_path)
    s = common.base_settings({"dataset": "npz:data/mine.npz", "model": "cnn"}, "x.toml")
    assert s.dataset == f"npz:{(tmp_path / 'configs' / 'data' / 'mine.npz').resolve()}"
    assert common.base_settings({"dataset": "digits"}).dataset == "digits"
