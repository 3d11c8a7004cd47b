"""An experiment's ``policies`` entry may set the adaptive policy's own settings after its ``--cuts`` value:
``"adaptive hysteresis=0.2 measurement-weight=1"``. A researcher comparing ways of adapting (the hysteresis,
the smoothing, a solve's time limit) then gets them side by side in one experiment's runs, tables and figures;
before, each was a whole experiment of its own, with a config of its own. The entry is checked before anything
trains, naming it; its run trains with those settings and is named, recorded and written by them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from simulations import drift
from simulations.common import resolve_policies
from splitfed.errors import ConfigError
from splitfed.flower.config import ADAPTIVE_SETTINGS, RunSettings
from tests.test_experiment_outputs import tiny

BASE = RunSettings(cuts="adaptive", clients=2)


def test_a_drift_experiment_compares_two_hystereses_on_the_same_runs(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The tiny drift fleet's Pi slows 20x at round 2: the default hysteresis moves its cuts, one of 1000x the
    rounds' time never does, and so keeps the slow rounds. The lines it prints keep one column, however long a
    label (before: 24 characters wide)."""
    slow = "adaptive hysteresis=1000 regime-jump=50"
    cfg = tiny(tmp_path, "drift", {'policies = ["static:best"]': f'policies = ["adaptive", "{slow} "]',
                                   "fleets/": str(drift.__file__).rsplit("/", 1)[0] + "/configs/fleets/"})
    out = tmp_path / "out"
    assert drift.cli(["--config", str(cfg), "--out", str(out)]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "makespan before" in x]
    assert len(lines) == 2 and len({x.index("makespan before") for x in lines}) == 1, lines
    a, h = json.loads((out / "results.json").read_text())["policies"]
    assert (a["policy"], a["label"], a["options"]) == ("adaptive", "adaptive", {})
    assert (h["policy"], h["label"], h["options"]) == (slow + " ", slow, {"hysteresis": 1000.0, "regime_jump": 50.0})
    assert a["cuts"] == h["cuts"] == "adaptive"
    assert a["moves"] and not h["moves"]
    assert h["makespan_tail_s"] > a["makespan_tail_s"]
    ran = {p.name: json.loads((p / "summary.json").read_text())["settings"]["hysteresis"]
           for p in (out / "runs").iterdir() if not p.name.startswith(".")}
    assert ran == {"adaptive": 0.05, "adaptive_hysteresis_1000_regime-jump_50": 1000.0}
    with open(out / "results.csv", newline="") as f:
        assert [r["options"] for r in csv.DictReader(f)] == ["", "hysteresis=1000 regime-jump=50"]


def test_an_entry_sets_each_of_the_adaptive_policy_s_settings_over_the_experiment_s() -> None:
    base = BASE.with_(hysteresis=0.3)
    plain, mine = resolve_policies(["adaptive", "adaptive  measurement_weight=1 regime-jump=5 solve-time-limit-s=2 "
                                                "hysteresis=0"], base)
    assert plain.settings == base and plain.options == {}
    assert (mine.settings.hysteresis, mine.settings.measurement_weight, mine.settings.regime_jump,
            mine.settings.solve_time_limit_s) == (0.0, 1.0, 5.0, 2.0)
    assert mine.settings.with_(**{k: getattr(base, k) for k in ADAPTIVE_SETTINGS}) == base  # nothing else
    assert mine.label == "adaptive measurement-weight=1 regime-jump=5 solve-time-limit-s=2 hysteresis=0"
    assert mine.trained_as == mine.label


@pytest.mark.parametrize(("policies", "message"), [
    (["adaptive hysteresis"], "policies entry 'adaptive hysteresis': 'hysteresis' is not KEY=VALUE (after the cuts, "
                              "a setting of the adaptive policy: hysteresis, measurement-weight, regime-jump, "
                              "solve-time-limit-s)"),
    (["adaptive hysteresis="], "'hysteresis=' is not KEY=VALUE"),
    (["adaptive =1"], "'=1' is not KEY=VALUE"),
    (["adaptive hysterisis=0.1"], "policies entry 'adaptive hysterisis=0.1': unknown key 'hysterisis' (did you mean "
                                  "'hysteresis'?)"),
    (["adaptive lr=0.1"], "policies entry 'adaptive lr=0.1': lr is not the adaptive policy's to set: it is the same "
                          "for every run, in the config's [simulate] table"),
    (["adaptive hysteresis=0.1 hysteresis=0.2"], "hysteresis is given twice: give it once"),
    (["adaptive hysteresis=abc"], "policies entry 'adaptive hysteresis=abc': hysteresis must be float, got 'abc'"),
    (["adaptive measurement-weight=2"], "policies entry 'adaptive measurement-weight=2': measurement-weight must be "
                                        "in (0, 1]"),
    (["adaptive regime-jump=inf"], "regime-jump must be a finite number > 1"),
    (["static:2,5 hysteresis=0.1"], "policies entry 'static:2,5 hysteresis=0.1': a static policy never moves its "
                                    "cuts"),
    (["static:best hysteresis=0.1"], "a static policy never moves its cuts"),
    (["greedy regime-jump=2 hysteresis=1"], "policies entry 'greedy regime-jump=2 hysteresis=1': regime-jump and "
                                            "hysteresis set how the adaptive policy moves cuts; greedy never moves "
                                            "them"),
    (["adaptive", "adaptive hysteresis=0.05"], "policies: 'adaptive hysteresis=0.05' and 'adaptive' are the same "
                                               "policy and settings: list them once"),
    (["adaptive hysteresis=0.2", "adaptive hysteresis=.2"], "policies: 'adaptive hysteresis=.2' and 'adaptive "
                                                            "hysteresis=0.2' are the same policy and settings"),
])
def test_an_entry_that_cannot_run_as_written_is_refused_naming_it(policies: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        resolve_policies(policies, BASE)
    assert message in str(e.value), str(e.value)


def test_a_refused_entry_trains_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tiny(tmp_path, "drift", {'policies = ["static:best"]': 'policies = ["static:best", "adaptive jump=2"]'})
    out = tmp_path / "out"
    assert drift.cli(["--config", str(cfg), "--out", str(out)]) == 2
    assert "policies entry 'adaptive jump=2': unknown key 'jump'" in capsys.readouterr().err
    assert not (out / "runs").exists()


def test_entries_told_apart_only_past_a_folder_name_s_length_are_refused() -> None:
    """Run folders are named by the first 60 characters of their labels: two entries whose labels differ only
    after them would train into one folder (before: "'...=12' is given twice (as '...=10')", which it is not)."""
    from simulations.common import check_cases, trained_cases

    long = "adaptive hysteresis=0.5 measurement-weight=0.25 regime-jump="
    cases = trained_cases(resolve_policies([long + "10", long + "12"], BASE))
    with pytest.raises(ConfigError, match=r"'adaptive hysteresis=0.5 measurement-weight=0.25 regime-jump=12' and "
                                          r"'adaptive hysteresis=0.5 measurement-weight=0.25 regime-jump=10' would "
                                          r"train into one folder, runs/adaptive_hysteresis"):
        check_cases(cases, "inprocess")


def test_the_shipped_adaptation_config_resolves_to_a_run_for_each_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """simulations/configs/drift_adaptation.toml (README, "Ways of adapting"): every entry a run of its own,
    checked as its training would check it, each with the settings its entry names."""
    from simulations.common import CONFIGS, check_cases, load_config, trained_cases

    cfg = load_config(CONFIGS / "drift_adaptation.toml", drift.Config)
    entries = resolve_policies(cfg.policies, cfg.settings())
    cases = trained_cases(entries)
    assert len(cases) == len(cfg.policies) == 5
    check_cases(cases, cfg.backend)
    by = {e.written: e.settings for e in entries}
    assert by["adaptive hysteresis=0.9"].hysteresis == 0.9
    assert (by["adaptive regime-jump=100 measurement-weight=0.3"].regime_jump,
            by["adaptive regime-jump=100 measurement-weight=0.3"].measurement_weight) == (100.0, 0.3)
    assert by["adaptive"] == cfg.settings().with_(cuts="adaptive")

