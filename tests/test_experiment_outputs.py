"""What the experiment scripts and the engine benchmark write, as a reader of their results meets it.

- drift and static_vs_adaptive record each policy alike: ``policy`` as the config wrote it (``static:best``),
  ``label`` as the figures name it (``best static (7,7)``); drift recorded the label as ``policy``;
- ``static:best`` that resolves to a listed static cut trains once, recorded under both labels (before: the
  same cuts trained twice); the same cuts written twice are refused, naming both entries;
- ``solve_time_limit_s = inf`` is recorded as ``"inf"`` in results.json (before: null, "not set");
- the run folders results.json and results.csv name are absolute (before: relative to the working folder,
  lost to a reader elsewhere);
- the heterogeneity sweep's figures name the fleet the config swept at s = 1 (before: "reference fleet",
  whatever it was);
- ``benchmarks/engine.py`` on a model with dropout draws the same masks on both sides, so its weight check
  reads 0, and says what it compared (before: 0.004-0.011 apart, as if the split step were wrong).

The tiny configs train in-process (2 clients, 1-3 rounds, seconds); the sweep prices a few devices.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from simulations import common, drift, heterogeneity_sweep, static_vs_adaptive
from splitfed.report import plots

CONFIGS = Path(common.__file__).parent / "configs"
ROOT = Path(common.__file__).resolve().parents[1]


# static_vs_adaptive.tiny.toml's 2 clients of the iot fleet at this seed: mcu-ble-0 (it holds no block of the cnn)
# and pi-sat-0, so the best single cut keeps nothing on the devices: 0,7 (its own seed 0 deals two Pis: 7,7)
MCU_SEED = {"seed = 0": "seed = 12"}


def tiny(tmp_path: Path, name: str, change: dict[str, str]) -> Path:
    """The script's tiny config with lines replaced (``old -> new``), as a file."""
    text = (CONFIGS / f"{name}.tiny.toml").read_text()
    for old, new in change.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text(),
                      parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))


def csv_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- policy as written, and its label


def test_drift_and_static_vs_adaptive_record_the_policy_as_written_and_its_label(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: drift's ``policy`` was "best static (7,7)" (the label), static_vs_adaptive's "static:best"."""
    svsa = tiny(tmp_path, "static_vs_adaptive", {'policies = ["static:best", "static:0,0"]': 'policies = ["static:best"]',
                                                 "rounds = 2": "rounds = 1", **MCU_SEED})
    assert static_vs_adaptive.cli(["--config", str(svsa), "--out", str(tmp_path / "svsa")]) == 0
    assert drift.cli(["--config", str(CONFIGS / "drift.tiny.toml"), "--out", str(tmp_path / "drift")]) == 0
    capsys.readouterr()
    (a,) = results(tmp_path / "svsa")["policies"]
    (b,) = results(tmp_path / "drift")["policies"]
    assert (a["policy"], a["label"], a["cuts"]) == ("static:best", "best static (0,7)", "static:0,7")
    assert (b["policy"], b["label"], b["cuts"]) == ("static:best", "best static (7,7)", "static:7,7")
    assert a["same_run_as"] is None and b["same_run_as"] is None
    for name in ("svsa", "drift"):
        (row,) = csv_rows(tmp_path / name)
        assert list(row)[:4] == ["policy", "label", "cuts", "same_run_as"]
        assert row["policy"] == "static:best" and row["label"].startswith("best static (")


# ---------------------------------------------------------------- one run per distinct assignment


def test_static_best_that_is_a_listed_static_cut_trains_once_under_both_labels(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``static:best`` (0,7 on this fleet) and ``static:0,7`` trained the same cuts twice, into two
    folders, drawn as two curves one over the other."""
    out = tmp_path / "out"
    cfg = tiny(tmp_path, "static_vs_adaptive", {
        'policies = ["static:best", "static:0,0"]': 'policies = ["static:0,7", "static:best"]', "rounds = 2": "rounds = 1",
        **MCU_SEED})
    assert static_vs_adaptive.cli(["--config", str(cfg), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "  static:best: the same cuts as static:0,7 (static:0,7): trained once, recorded under both\n" in printed
    assert printed.count("] inprocess: cuts=") == 1
    assert sorted(p.name for p in (out / "runs").iterdir()) == [common.MARK, "static_0_7"]
    first, second = results(out)["policies"]
    assert (first["policy"], first["label"], first["same_run_as"]) == ("static:0,7", "static:0,7", None)
    assert (second["policy"], second["label"], second["same_run_as"]) == ("static:best", "best static (0,7)",
                                                                         "static:0,7")
    assert second["path"] == first["path"] == str((out / "runs" / "static_0_7").resolve())
    assert second["accuracy"] == first["accuracy"] and second["sim_round_s"] == first["sim_round_s"]
    assert "**static:0,7 = best static (0,7)**" in (out / "summary.md").read_text()  # one run, both its names


@pytest.mark.parametrize(("policies", "said"), [
    ('["static:0,7", "static: 0,7"]', "policies: 'static: 0,7' and 'static:0,7' are the same cuts: list them once"),
    ('["static:best", "adaptive", "static:best"]', "policies lists 'static:best' twice: list it once"),
    ('["static:0,7", "static:best", "static:0, 7"]',
     "policies: 'static:0, 7' and 'static:0,7' are the same cuts: list them once"),
])
def test_the_same_cuts_written_twice_are_refused_naming_both_entries(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], policies: str, said: str) -> None:
    """Cuts the config shows twice are the user's to list once (as a codec spelled twice is); before, the
    spellings trained twice, and ``static:best`` twice was refused by its label ("'best static (0,7)' is
    given twice"), which the config does not say."""
    out = tmp_path / "out"
    cfg = tiny(tmp_path, "static_vs_adaptive", {'policies = ["static:best", "static:0,0"]': f"policies = {policies}",
                                                **MCU_SEED})  # static:best is static:0,7: the third case names 0,7
    assert static_vs_adaptive.cli(["--config", str(cfg), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.err == f"simulations.static_vs_adaptive: error: {said}\n"
    assert "] inprocess: cuts=" not in printed.out and not (out / "runs").exists()


# ---------------------------------------------------------------- a config's inf, recorded as such


def test_an_infinite_solve_time_limit_is_recorded_as_inf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``"solve_time_limit_s": null``, which reads as "not set" (the default 60 s), not as no limit."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('model = "cnn"\nclients = [4]\nspreads = [1.0]\npolicies = ["optimizer"]\n'
                   "solve_time_limit_s = inf\n")
    assert heterogeneity_sweep.cli(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    config = results(tmp_path / "out")["config"]
    assert config["solve_time_limit_s"] == "inf" and config["spreads"] == [1.0]
    assert common.load_config(cfg, heterogeneity_sweep.Config).solve_time_limit_s == float("inf")


def test_a_config_records_each_non_finite_number_as_toml_spells_it() -> None:
    """Nested in tables and lists too; finite numbers, text and null as they are."""
    got = common.as_written({"a": float("inf"), "b": [float("-inf"), 1.5], "c": {"d": float("nan")}, "e": None,
                             "f": ("x", 2)})
    assert got == {"a": "inf", "b": ["-inf", 1.5], "c": {"d": "nan"}, "e": None, "f": ["x", 2]}


# ---------------------------------------------------------------- run folders: absolute paths


def test_results_name_each_run_folder_by_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``runs/x/runs/static_0_0`` (relative to the folder the experiment ran in) in results.json and
    results.csv, while summary.md named the absolute path."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(tmp_path, "static_vs_adaptive", {'policies = ["static:best", "static:0,0"]': 'policies = ["static:0,0"]',
                                                "rounds = 2": "rounds = 1"})
    assert static_vs_adaptive.cli(["--config", str(cfg), "--out", "x"]) == 0
    capsys.readouterr()
    want = str(tmp_path.resolve() / "x" / "runs" / "static_0_0")
    (rec,) = results(tmp_path / "x")["policies"]
    (row,) = csv_rows(tmp_path / "x")
    assert rec["path"] == row["path"] == want
    assert f"`{want}`" in (tmp_path / "x" / "summary.md").read_text()


# ---------------------------------------------------------------- the sweep's figures: the fleet swept


@pytest.mark.parametrize(("fleet", "name"), [('"iot"', "iot"), ("FILE", "lab")])
def test_the_sweeps_figures_name_the_fleet_it_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], fleet: str, name: str) -> None:
    """s = 1 is the config's fleet as it is: a shipped one by its name, a file without a ``name`` by its stem.
    Before: "1: reference fleet" on every figure, whichever fleet was swept. (``line_plot`` draws as ever; what
    it was given is recorded.)"""
    if fleet == "FILE":
        lab = tmp_path / "lab.toml"
        lab.write_text((CONFIGS / "fleets" / "drift.tiny.toml").read_text().replace('name = "drift-tiny"\n', ""))
        fleet = json.dumps(str(lab))
    given: list[str] = []
    draw = plots.line_plot

    def line_plot(series: Any, path: Path, **kw: Any) -> Path:
        given.append(kw["xlabel"])
        return draw(series, path, **kw)

    monkeypatch.setattr(plots, "line_plot", line_plot)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'model = "cnn"\nfleet = {fleet}\nclients = [2]\nspreads = [0.0, 1.0]\n'
                   'policies = ["optimizer", "greedy"]\n')
    assert heterogeneity_sweep.cli(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert given == [f"spread factor s (0: identical devices, 1: {name} fleet)"] * 2  # makespan, speed-up


# ---------------------------------------------------------------- the engine benchmark's weight check


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_the_engine_benchmark_compares_weights_trained_with_the_same_dropout_masks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], model: str) -> None:
    """cnn and mlp have dropout. Before: the monolithic model drew its own masks (torch's unseeded generator),
    and the check read 1e-3 to 2e-2 apart after 3 steps (each run its own), like a split step gone wrong."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import engine  # type: ignore[import-not-found]

    out = tmp_path / "engine.json"
    assert engine.main(["--model", model, "--batch", "8", "--cuts", "2,4", "--reps", "1", "--steps", "1",
                        "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["max_abs_weight_diff_vs_monolithic"]["split"] <= 1e-6
    compared = "every weight after 3 steps a side from the same weights, on the same batch, with the same dropout masks"
    assert res["weights_compared"] == compared
    printed = capsys.readouterr().out
    assert f"max weight difference vs monolithic: split {res['max_abs_weight_diff_vs_monolithic']['split']:.3g} " \
           f"({compared})\n" in printed
