"""What the small experiment scripts (``simulations/drift.py``, ``static_vs_adaptive.py``, ``compression.py``,
``variants.py``) promise about their numbers and refusals that the mutation run found unpinned.

- drift: ``tail_rounds`` must be >= 1; :func:`drift.moves` lists every change of a client's cuts between
  consecutive rounds (a client new in a round is no move); a drift in the run's last round is refused for
  the tail it leaves empty (not as a drift "after the run's rounds"); each policy's record holds the mean
  makespan of the rounds before the drift round (not it), at it, and of the last ``tail_rounds`` rounds, and
  the line printed says them in seconds;
- static_vs_adaptive: the headline's adaptive time is the ``adaptive`` policy's, the ratio is best static's
  time over adaptive's; the lines printed say the ratio, that the curves are the same when they are, and
  nothing of a ratio or of the curves for a single policy; :func:`accuracy_gap` of no runs is 0;
- compression: :func:`compression.bytes_to_target` counts the bytes up to the round whose accuracy first
  reaches the target (equal counts); each record's bytes and accuracy relative to ``none``, none (and
  nothing printed of it) without a ``none`` case;
- variants: a variant that is not one of the four is refused; ``fedavg`` puts every block on the device at
  each cut, one more cut in U-shape.

run() is exercised with :func:`simulations.common.run_cases` replaced (in the script's module) by a stand-in
that returns runs built in memory from hand-written metrics rows (:func:`splitfed.report.runs.rows_to_run`)
for the cases it was given, and ``report_runs`` / ``makespan_plot`` (the figures) by stand-ins that draw
nothing: what is pinned is the arithmetic of the records, the headline and the lines printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulations import common, compression, drift, static_vs_adaptive, variants
from splitfed.errors import ConfigError
from splitfed.report import plots
from splitfed.report.runs import rows_to_run

TABLE = {"clients": 2, "rounds": 3, "model": "cnn", "dataset": "digits", "partition": "iid",
         "cuts": "static:2,5", "seed": 0}
DRIFT_FLEET = "fleets/drift.tiny.toml"  # both clients drift from round 2


def row(rnd: int, acc: float, secs: float, cuts: dict[str, list[int]] | None = None, up: int = 0,
        down: int = 0) -> dict[str, Any]:
    r: dict[str, Any] = {"round": rnd, "accuracy": acc, "sim_round_s": secs, "bytes_up": up, "bytes_down": down}
    if cuts is not None:
        r["cuts"] = cuts
        r["classes"] = {c: "rpi4" for c in cuts}
    return r


def stand_in(monkeypatch: pytest.MonkeyPatch, module: Any, rows: dict[str, list[dict[str, Any]]]) -> list[Any]:
    """``module.run_cases`` -> runs from ``rows[label]`` for each case; the figures drawn by no one."""
    seen: list[Any] = []

    def fake_run_cases(cases: Any, out: Path, backend: str) -> list[Any]:
        seen.extend(cases)
        return [rows_to_run(rows[label], label=label) for label, _ in cases]

    monkeypatch.setattr(module, "run_cases", fake_run_cases)
    monkeypatch.setattr(module, "report_runs", lambda *a, **k: {})
    monkeypatch.setattr(plots, "makespan_plot", lambda runs, path, **k: path)
    return seen


def refuse_training(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a refused config trained")

    monkeypatch.setattr(module, "run_cases", refuse)


# ---------------------------------------------------------------- drift


def test_drift_tail_rounds_must_be_at_least_one() -> None:
    """0 rounds to average "after recovery" is refused when the config is read; 1 is the least allowed."""
    with pytest.raises(ValueError, match="tail_rounds must be >= 1"):
        drift.Config(tail_rounds=0)
    assert drift.Config(tail_rounds=1).tail_rounds == 1


def test_moves_lists_each_change_between_consecutive_rounds() -> None:
    """Round r is compared with round r-1 only (not itself, not r-2); a client new in a round is no move."""
    run = rows_to_run([
        row(1, 0.1, 1.0, {"client0": [2, 5], "client1": [2, 5]}),
        row(2, 0.2, 1.0, {"client0": [2, 5], "client1": [2, 5]}),
        row(3, 0.3, 1.0, {"client0": [3, 5], "client1": [2, 5]}),
        row(4, 0.4, 1.0, {"client0": [3, 5], "client1": [1, 4], "client2": [2, 5]}),
    ], label="adaptive")
    assert drift.moves(run) == [
        {"client": "client0", "class": "rpi4", "round": 3, "from": [2, 5], "to": [3, 5]},
        {"client": "client1", "class": "rpi4", "round": 4, "from": [2, 5], "to": [1, 4]},
    ]
    assert drift.moves(rows_to_run([row(1, 0.1, 1.0, {"client0": [2, 5]})])) == []


def test_a_drift_in_the_last_round_is_refused_for_its_empty_tail(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The drift at round 2 of 2 is inside the run: the refusal is the tail's, not "after the run's rounds";
    a drift past the run's last round is refused as such. Nothing trains either way."""
    refuse_training(monkeypatch, drift)
    cfg = drift.Config(simulate={**TABLE, "rounds": 2, "fleet": DRIFT_FLEET}, backend="inprocess",
                       policies=("static:2,5",), tail_rounds=1)
    with pytest.raises(ConfigError, match=r"tail_rounds = 1: the run has 0 round\(s\) after the drift round 2"):
        drift.run(cfg, tmp_path / "a")
    cfg = drift.Config(simulate={**TABLE, "rounds": 1, "fleet": DRIFT_FLEET}, backend="inprocess",
                       policies=("static:2,5",), tail_rounds=1)
    with pytest.raises(ConfigError, match="the drift starts at round 2, after the run's 1 rounds"):
        drift.run(cfg, tmp_path / "b")


def test_drift_records_the_makespan_before_at_and_after_the_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Before: round 1 only (the drift round 2 is not "before"); at: round 2; tail: the mean of rounds 3-4;
    the moves are the run's; the printed line says each in seconds."""
    cuts = {"client0": [2, 5], "client1": [2, 5]}
    rows = {"static:2,5": [row(1, 0.1, 1.0, cuts), row(2, 0.2, 8.0, cuts),
                           row(3, 0.3, 4.0, {**cuts, "client0": [3, 5]}), row(4, 0.4, 2.0, {**cuts, "client0": [3, 5]})]}
    seen = stand_in(monkeypatch, drift, rows)
    cfg = drift.Config(simulate={**TABLE, "rounds": 4, "fleet": DRIFT_FLEET}, backend="inprocess",
                       policies=("static:2,5",), tail_rounds=2)
    res = drift.run(cfg, tmp_path)
    assert [label for label, _ in seen] == ["static:2,5"]
    assert res["drift_round"] == 2 and res["drifting_clients"] == {"client0": [2], "client1": [2]}
    (rec,) = res["policies"]
    assert rec["policy"] == "static:2,5" and rec["cuts"] == "static:2,5"
    assert (rec["makespan_before_s"], rec["makespan_drift_round_s"], rec["makespan_tail_s"]) == (1.0, 8.0, 3.0)
    assert rec["moves"] == [{"client": "client0", "class": "rpi4", "round": 3, "from": [2, 5], "to": [3, 5]}]
    printed = capsys.readouterr().out
    assert ("makespan before 1.000s, at drift 8.000s, last 2 rounds 3.000s; 1 cut move(s), in force from round 3\n"
            in printed), printed
    assert drift._from([{"round": 5}, {"round": 3}, {"round": 5}]) == ", in force from rounds 3, 5"
    assert drift._from([]) == ""


def test_a_missing_makespan_prints_as_a_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A run without rounds before the drift (its rows start at the drift round) prints "-", not None."""
    cuts = {"client0": [2, 5]}
    stand_in(monkeypatch, drift, {"static:2,5": [row(2, 0.2, 8.0, cuts), row(3, 0.3, 4.0, cuts)]})
    cfg = drift.Config(simulate={**TABLE, "rounds": 3, "fleet": DRIFT_FLEET}, backend="inprocess",
                       policies=("static:2,5",), tail_rounds=1)
    (rec,) = drift.run(cfg, tmp_path)["policies"]
    assert rec["makespan_before_s"] is None and rec["makespan_tail_s"] == 4.0
    assert "makespan before -, at drift 8.000s, last 1 rounds 4.000s; 0 cut move(s)" in capsys.readouterr().out


# ---------------------------------------------------------------- static_vs_adaptive


def test_the_headline_ratio_is_best_static_over_adaptive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Same accuracy curve, three clocks: the fastest static reaches 0.5 at 2.0 s, adaptive at 0.5 s: 4x.
    The adaptive time is the adaptive policy's (not the first other policy's); the curves are said the same."""
    acc = (0.2, 0.5, 0.6)
    rows = {"static:2,5": [row(i + 1, a, 2.0) for i, a in enumerate(acc)],
            "static:3,5": [row(i + 1, a, 1.0) for i, a in enumerate(acc)],
            "adaptive": [row(i + 1, a, 0.25) for i, a in enumerate(acc)]}
    stand_in(monkeypatch, static_vs_adaptive, rows)
    cfg = static_vs_adaptive.Config(simulate=TABLE, backend="inprocess", target_accuracy=0.5,
                                    policies=("static:2,5", "static:3,5", "adaptive"))
    head = static_vs_adaptive.run(cfg, tmp_path)["headline"]
    assert head == {"target_accuracy": 0.5, "best_static": "static:3,5", "best_static_time_to_target_s": 2.0,
                    "adaptive": "adaptive", "adaptive_time_to_target_s": 0.5, "ratio_best_static_over_adaptive": 4.0,
                    "accuracy_gap": 0.0}
    printed = capsys.readouterr().out
    assert "  best static / adaptive = 4.00x (static:3,5)\n" in printed, printed
    assert "  accuracy per round: the same under every policy\n" in printed, printed
    assert "differs" not in printed and "none (" not in printed


@pytest.mark.parametrize(("policies", "headlined"), [
    (("static:2,5", "adaptive hysteresis=0.3", "adaptive"), "adaptive"),  # the policy as it ships, wherever listed
    (("static:2,5", "adaptive hysteresis=0.3 regime-jump=10", "adaptive hysteresis=0"),
     "adaptive hysteresis=0.3 regime-jump=10"),  # else the first, named as its entry
])
def test_the_headline_s_adaptive_run_is_the_shipped_policy_else_the_first_adaptive_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        policies: tuple[str, ...], headlined: str) -> None:
    """Before: only an entry written "adaptive" was the headline's; one of adaptive entries that each set a
    hysteresis (tests/test_experiment_policy_options.py) had no ratio at all."""
    acc = (0.2, 0.5, 0.6)
    secs = {"static:2,5": 2.0, "adaptive hysteresis=0.3": 0.5, "adaptive": 0.25, "adaptive hysteresis=0": 1.0,
            "adaptive hysteresis=0.3 regime-jump=10": 0.5}
    stand_in(monkeypatch, static_vs_adaptive, {k: [row(i + 1, a, v) for i, a in enumerate(acc)]
                                               for k, v in secs.items()})
    cfg = static_vs_adaptive.Config(simulate=TABLE, backend="inprocess", target_accuracy=0.5, policies=policies)
    head = static_vs_adaptive.run(cfg, tmp_path)["headline"]
    assert head["adaptive"] == headlined
    assert head["ratio_best_static_over_adaptive"] == 2.0 / secs[headlined]
    printed = capsys.readouterr().out
    assert f"  best static / {headlined} = {2.0 / secs[headlined]:.2f}x (static:2,5)\n" in printed
    times = [x for x in printed.splitlines() if " time to 0.5: " in x]  # one column, however long a label
    assert len(times) == 3 and len({x.index(" time to") for x in times}) == 1, times


def test_one_policy_alone_says_nothing_of_ratios_or_curves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Adaptive alone (no static policy to compare, one curve): only its time to target ("never") is printed."""
    stand_in(monkeypatch, static_vs_adaptive, {"adaptive": [row(1, 0.1, 1.0), row(2, 0.2, 1.0)]})
    cfg = static_vs_adaptive.Config(simulate=TABLE, backend="inprocess", target_accuracy=0.5,
                                    policies=("adaptive",))
    head = static_vs_adaptive.run(cfg, tmp_path)["headline"]
    assert head["ratio_best_static_over_adaptive"] is None and head["best_static"] is None
    printed = capsys.readouterr().out
    assert "time to 0.5: never" in printed
    assert "best static / adaptive" not in printed and "accuracy per round" not in printed, printed


def test_accuracy_gap_of_no_runs_is_zero() -> None:
    """No rounds to differ in: the same curve (0), not a gap of 1."""
    assert static_vs_adaptive.accuracy_gap([]) == 0.0


# ---------------------------------------------------------------- compression


def test_bytes_to_target_counts_up_to_the_round_that_reaches_it() -> None:
    """An accuracy equal to the target reaches it; the bytes are cumulative up and down; never: None."""
    run = rows_to_run([row(1, 0.4, 1.0, up=600, down=400), row(2, 0.5, 1.0, up=600, down=400),
                       row(3, 0.7, 1.0, up=600, down=400)])
    assert compression.bytes_to_target(run, 0.5) == 2000
    assert compression.bytes_to_target(run, 0.4) == 1000
    assert compression.bytes_to_target(run, 0.8) is None


def test_each_codec_is_measured_against_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """int8 sent a quarter of none's bytes and ended 0.1 higher; the lines say "x of none"."""
    rows = {"none": [row(1, 0.4, 1.0, up=600, down=400), row(2, 0.5, 1.0, up=600, down=400)],
            "int8": [row(1, 0.5, 1.0, up=150, down=100), row(2, 0.6, 1.0, up=150, down=100)]}
    stand_in(monkeypatch, compression, rows)
    cfg = compression.Config(simulate=TABLE, backend="inprocess", codecs=("none", "int8"), target_accuracy=0.5)
    none, int8 = compression.run(cfg, tmp_path)["codecs"]
    assert (none["bytes_total"], none["bytes_to_target"], none["bytes_vs_none"]) == (2000, 2000, 1.0)
    assert (int8["bytes_total"], int8["bytes_to_target"], int8["bytes_vs_none"]) == (500, 250, 0.25)
    assert none["accuracy_vs_none"] == 0.0 and int8["accuracy_vs_none"] == pytest.approx(0.1)
    printed = capsys.readouterr().out
    assert "(1.00x of none)" in printed and "(0.25x of none)  final accuracy 0.6000" in printed, printed


def test_without_none_nothing_is_relative_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """No reference case: bytes and accuracy vs none are None (no crash), and no "x of none" is printed."""
    stand_in(monkeypatch, compression, {"int8": [row(1, 0.5, 1.0, up=150, down=100)]})
    cfg = compression.Config(simulate=TABLE, backend="inprocess", codecs=("int8",), target_accuracy=0.5)
    (rec,) = compression.run(cfg, tmp_path)["codecs"]
    assert rec["bytes_vs_none"] is None and rec["accuracy_vs_none"] is None
    printed = capsys.readouterr().out
    assert "of none" not in printed and "final accuracy 0.5000" in printed, printed


# ---------------------------------------------------------------- variants


@pytest.mark.parametrize("names", [("fedprox",), ("sl", "fedprox"), ()])
def test_a_variant_not_of_the_four_is_refused(names: tuple[str, ...]) -> None:
    """An unknown name is refused alone as well as beside a known one; so is none at all."""
    with pytest.raises(ValueError, match=r"variants must be some of sl, sflv1, sflv2, fedavg, got \["):
        variants.Config(variants=names)


def test_fedavg_puts_every_block_on_the_device_at_each_cut() -> None:
    """cnn has 7 blocks: 3 tiers make 2 cuts, and U-shape one more (the way back up); the mode is sflv1."""
    base = common.base_settings(TABLE)
    assert base.tiers == 3
    s = variants.variant_settings("fedavg", base)
    assert (s.mode, s.cuts) == ("sflv1", "static:7,7")
    u = variants.variant_settings("fedavg", base.with_(u_shape=True, cuts="static:2,5,6"))
    assert (u.mode, u.cuts) == ("sflv1", "static:7,7,7")
    two = variants.variant_settings("fedavg", common.base_settings({**TABLE, "tiers": 2, "cuts": "static:2"}))
    assert two.cuts == "static:7"
    sl = variants.variant_settings("sl", base)
    assert (sl.mode, sl.cuts) == ("sl", "static:2,5")
