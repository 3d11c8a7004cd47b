"""The experiments' runs as ``splitfed simulate`` makes them: its default cuts, its up-front checks, and the
keys of ``[simulate]`` an experiment would ignore refused (in-process backend, digits, seconds each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulations import compression
from simulations.common import base_settings
from splitfed.cli import build_parser
from splitfed.commands.simulate import settings_from_args
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.sim.inprocess import train_inprocess
from splitfed.sim.runner import validate
from tests.test_simulations import _tiny, run_tiny

# ---------------------------------------------------------------- [simulate] without cuts: simulate's default


@pytest.mark.parametrize(("table", "cuts"), [
    ({"tiers": 2}, "static:2"),
    ({"u-shape": True}, "static:2,5,6"),
    ({"u_shape": True, "tiers": 3}, "static:2,5,6"),
    ({}, "static:2,5"),
    ({"tiers": 2, "cuts": "static:3"}, "static:3"),  # cuts given are kept
    ({"cuts": "adaptive", "u-shape": True}, "adaptive"),
])
def test_a_simulate_table_without_cuts_takes_the_cuts_simulate_gives_it(
        tmp_path: Path, table: dict[str, object], cuts: str) -> None:
    """Before: ``tiers = 2`` alone kept the 3-tier default's ``static:2,5`` (refused: 2 tiers need 1 cut)."""
    assert base_settings(table).cuts == cuts
    cfg = tmp_path / "run.toml"
    cfg.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    args = build_parser().parse_args(["simulate", "--config", str(cfg), "--out", str(tmp_path / "run")])
    assert settings_from_args(args).cuts == cuts  # the same as splitfed simulate --config


@pytest.mark.parametrize(("line", "cuts"), [("tiers = 2", "static:2"), ("u-shape = true", "static:2,5,6")])
def test_an_experiment_on_2_tiers_or_in_u_shape_runs_without_cuts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, cuts: str) -> None:
    """Before: "none: cuts 'static:2,5': 2 tiers need 1 cut(s), got 2" (U-shape: "3 tiers in U-shape need 3
    cut(s), got 2"), exit 2, for a table ``splitfed simulate --config`` runs."""
    cfg = _tiny(tmp_path, "compression", {'cuts = "static:2,5"': line, 'codecs = ["none", "int8"]': 'codecs = ["none"]',
                                          "rounds = 2": "rounds = 1"})
    out = tmp_path / "out"
    res = run_tiny(compression, "compression", out, capsys, config=cfg)
    assert [r["codec"] for r in res["codecs"]] == ["none"]
    summary = json.loads((out / "runs" / "none" / "summary.json").read_text())
    assert summary["settings"]["cuts"] == cuts and summary["rounds"] == 1


# ---------------------------------------------------------------- compression: the codecs are its own


def test_compression_refuses_a_codec_under_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``compress = "fp16"`` was replaced by each entry of codecs, unsaid (out, resume and overwrite,
    which it would also replace, were refused)."""
    cfg = _tiny(tmp_path, "compression", {"seed = 0": 'seed = 0\ncompress = "fp16"'})
    out = tmp_path / "out"
    assert compression.cli(["--config", str(cfg), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.err == (f"simulations.compression: error: {cfg}: [simulate] compress: this experiment trains one "
                           "run per entry of codecs, each with its codec; list the codecs in codecs and remove the "
                           "key\n")
    assert not (out / "runs").exists()


@pytest.mark.parametrize(("codecs", "said"), [
    ('["int8", "INT8"]', "codecs entry 'INT8' is given twice (as 'int8'): list it once"),
    ('["none", "topk:0.1", "topk:0.10"]', "codecs entry 'topk:0.10' is given twice (as 'topk:0.1'): list it once"),
    ('["none", "int8", "none"]', "codecs entry 'none' is given twice: list it once"),
])
def test_a_codec_given_twice_is_named_as_its_second_entry_spells_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], codecs: str, said: str) -> None:
    """Before: "'int8' is given twice (as 'int8')", both quotes the first entry's codec as the run spells it."""
    cfg = _tiny(tmp_path, "compression", {'codecs = ["none", "int8"]': f"codecs = {codecs}"})
    out = tmp_path / "out"
    assert compression.cli(["--config", str(cfg), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.err == f"simulations.compression: error: {said}\n"
    assert "] inprocess: cuts=" not in printed.out and not (out / "runs").exists()


# ---------------------------------------------------------------- the in-process engine's up-front checks


def test_in_process_training_refuses_a_one_sample_batch_before_it_trains(tmp_path: Path) -> None:
    """resnet18's BatchNorm cannot train on one sample: client0's 719 digits in batches of 718 failed every round
    ("Expected more than 1 value per channel"), where splitfed simulate refuses them before it starts."""
    out = tmp_path / "run"
    settings = RunSettings.from_mapping({"model": "resnet18", "model-kwargs": {"width": 4}, "dataset": "digits",
                                         "clients": 2, "rounds": 1, "batch-size": 718, "partition": "iid",
                                         "out": str(out)})
    with pytest.raises(ConfigError) as refused:
        train_inprocess(settings)
    said = str(refused.value)
    assert said.startswith("client0 has 719 sample(s): with batch size 718 its last batch holds one sample, and "
                           "model resnet18 cannot train on one (Expected more than 1 value per channel")
    assert said.endswith("); choose another batch size or number of clients")
    with pytest.raises(ConfigError) as runner:
        validate(settings)
    assert str(runner.value) == said  # the runner's own words
    assert not out.exists()  # refused before its run folder was made
