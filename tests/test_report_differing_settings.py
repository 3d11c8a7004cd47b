"""``splitfed report`` of several runs says which settings they differ in (its terminal output and
``summary.md``'s "Settings that differ"). Before, its table showed mode, tiers and U-shape alone: two runs of
another hysteresis, learning rate or cut policy read alike but for their folder names."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitfed.cli import main
from splitfed.flower.config import RunSettings
from splitfed.report.runs import rows_to_run
from splitfed.report.summary import differing_settings, summary_markdown

ROW = {"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "bytes_up": 0, "bytes_down": 0}


def _run(label: str, **settings: object) -> object:
    return rows_to_run([ROW], label=label, summary={"settings": settings})


def test_two_real_runs_are_told_apart_by_what_they_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from splitfed.sim.inprocess import train_inprocess

    base = RunSettings(rounds=1, clients=2, batch_size=64, seed=3)
    train_inprocess(base.with_(cuts="static:1,3", out=str(tmp_path / "a")))
    train_inprocess(base.with_(cuts="adaptive", hysteresis=0.5, lr=0.1, out=str(tmp_path / "b")))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    lines = printed[printed.index("settings that differ\n"):].splitlines()
    assert lines[1].split() == ["setting", "a", "b"]
    assert [x.split() for x in lines[3:6]] == [["cuts", "static:1,3", "adaptive"], ["hysteresis", "0.05", "0.5"],
                                                ["lr", "0.05", "0.1"]]
    assert lines[6] == ""  # and nothing else: out and run_name are each run's own, the rest alike
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert ("## Settings that differ\n\n| setting | a | b |\n|:---|:---|:---|\n| cuts | static:1,3 | adaptive |\n"
            "| hysteresis | 0.05 | 0.5 |\n| lr | 0.05 | 0.1 |\n\n") in md


def test_runs_alike_or_a_run_alone_have_no_such_section(capsys: pytest.CaptureFixture[str]) -> None:
    alike = [_run("a", lr=0.1, out="x"), _run("b", lr=0.1, out="y")]
    assert differing_settings(alike) == ([], [])  # type: ignore[arg-type]
    assert differing_settings(alike[:1]) == ([], [])  # type: ignore[arg-type]
    assert "Settings that differ" not in summary_markdown(alike)  # type: ignore[arg-type]


def test_only_settings_every_run_records_are_compared_and_the_table_s_own_are_left_to_it() -> None:
    """A run from before a setting existed does not record it: not "differs". Mode, tiers and U-shape are the
    runs table's columns; out, run-name, resume and overwrite are each run's own."""
    old = _run("old", lr=0.1, mode="sl", tiers=2, u_shape=False, out="o", run_name="r1", resume=False)
    new = _run("new", lr=0.1, mode="sflv1", tiers=3, u_shape=True, out="n", run_name="r2", resume=True,
               measurement_weight=0.5, model_kwargs='{"width": 8}', compress="int8")
    assert differing_settings([old, new]) == ([], [])  # type: ignore[arg-type]
    new2 = _run("new2", lr=0.2, measurement_weight=0.5, u_shape=True, model_kwargs='{"width": 16}')
    assert differing_settings([new, new2]) == (  # type: ignore[arg-type]
        ["setting", "new", "new2"], [["lr", "0.1", "0.2"], ["model-kwargs", '{"width": 8}', '{"width": 16}']])
