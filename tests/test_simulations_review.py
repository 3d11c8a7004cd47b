"""Review of the experiment scripts as a researcher runs them: what each claims, and the config it refuses.

In-process backend, 2 clients, 1-3 rounds (seconds each); the heterogeneity sweep's checks price nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations import compression, drift, heterogeneity_sweep, static_vs_adaptive
from splitfed.errors import ConfigError
from splitfed.flower.config import MAX_SEED
from splitfed.profile.fleet import MAX_CLIENTS
from tests.test_simulations import ROOT, _tiny, run_tiny

# ---------------------------------------------------------------- compression: the reference codec


def test_a_codec_spelled_otherwise_is_still_the_uncompressed_reference(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``None`` trained uncompressed (the run normalises it) but the script looked for the text "none",
    so every ``bytes_vs_none`` and ``accuracy_vs_none`` was null and no "x of none" was printed."""
    cfg = _tiny(tmp_path, "compression", {'codecs = ["none", "int8"]': 'codecs = ["None", "INT8"]',
                                          "rounds = 2": "rounds = 1"})
    res = run_tiny(compression, "compression", tmp_path / "out", capsys, config=cfg)
    recs = {r["codec"]: r for r in res["codecs"]}
    assert set(recs) == {"none", "int8"}
    assert recs["none"]["bytes_vs_none"] == 1.0 and recs["none"]["accuracy_vs_none"] == 0.0
    assert recs["int8"]["bytes_vs_none"] == recs["int8"]["bytes_total"] / recs["none"]["bytes_total"] < 0.5


def test_one_codec_spelled_twice_is_refused_before_any_trains(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``int8`` and ``INT8`` trained the same run twice, into two folders, drawn as two curves."""
    out = tmp_path / "out"
    cfg = _tiny(tmp_path, "compression", {'codecs = ["none", "int8"]': 'codecs = ["int8", "INT8"]'})
    assert compression.cli(["--config", str(cfg), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert "codecs entry 'INT8' is given twice (as 'int8'): list it once" in printed.err, printed.err
    assert "] round 1/" not in printed.out and not (out / "runs").exists()


# ---------------------------------------------------------------- drift: the tail after recovery


def test_a_tail_longer_than_the_rounds_after_the_drift_is_refused_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: 3 rounds, drift at round 2, ``tail_rounds = 2``: printed "last 2 rounds" for the mean of the drift
    round and the one after it, so the "after recovery" figure held the slow round it recovers from."""
    out = tmp_path / "out"
    cfg = _tiny(tmp_path, "drift", {"tail_rounds = 1": "tail_rounds = 2"})
    assert drift.cli(["--config", str(cfg), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert "simulations.drift: error: tail_rounds = 2: the run has 1 round(s) after the drift round 2" in printed.err
    assert "] round 1/" not in printed.out and not (out / "runs").exists()


# ---------------------------------------------------------------- heterogeneity sweep: seed and fleet size


@given(seed=st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_SEED + 1, max_value=2**63 - 1)))
def test_a_seed_out_of_range_is_refused_naming_the_key(seed: int) -> None:
    """Before: -1 reached numpy's draw of the fleet, a traceback after the output folder was taken."""
    with pytest.raises(ConfigError, match=rf"^seed must be an integer in 0\.\.{MAX_SEED:,} .*got {seed}$"):
        heterogeneity_sweep.Config(seed=seed)


def test_a_negative_seed_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('model = "cnn"\nclients = [5]\nspreads = [0.0]\nseed = -1\n')
    assert heterogeneity_sweep.cli(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed must be an integer" in err, err
    assert not (tmp_path / "out").exists()


def test_a_fleet_larger_than_can_be_drawn_is_refused_naming_clients() -> None:
    """Before: "sample size must be in 1..100,000", from the sweep, after the output folder was taken."""
    with pytest.raises(ConfigError, match=r"^clients: 100,001 is more than a fleet draws"):
        heterogeneity_sweep.Config(clients=(20, MAX_CLIENTS + 1))
    heterogeneity_sweep.Config(clients=(MAX_CLIENTS,), seed=MAX_SEED)  # the largest are taken


# ---------------------------------------------------------------- static vs adaptive: the claims it prints


def test_the_same_accuracy_is_checked_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cuts leave the math alone: the headline's gap is 0 and the script says so (before: not checked)."""
    rc = static_vs_adaptive.cli(["--config", str(_tiny(tmp_path, "static_vs_adaptive", {})),
                                 "--out", str(tmp_path / "out")])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "accuracy per round: the same under every policy" in printed.out
    head = json.loads((tmp_path / "out" / "results.json").read_text())["headline"]
    assert head["accuracy_gap"] == 0.0


@pytest.mark.parametrize(("target", "said"), [
    (0.95, "best static / adaptive: none (adaptive never reached 0.95 in 2 round(s))"),
    (0.99, "best static / adaptive: none (neither a static policy nor adaptive reached 0.99 in 2 round(s))"),
])
def test_a_lossy_codec_makes_the_curves_differ_and_the_script_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], target: float, said: str) -> None:
    """Before: with ``compress = "int8"`` (it acts at the cuts) all-on-the-server reached 0.95 and adaptive never,
    and the script printed the times alone, as if the curves were the same; nor did it say that no ratio
    could be given, and why."""
    cfg = _tiny(tmp_path, "static_vs_adaptive", {
        'policies = ["static:best", "static:0,0"]': 'policies = ["static:0,0", "adaptive"]',
        "target_accuracy = 0.3": f"target_accuracy = {target}", 'fleet = "iot"': 'fleet = "reference"\ncompress = "int8"'})
    rc = static_vs_adaptive.cli(["--config", str(cfg), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    pols = {p["policy"]: p for p in results["policies"]}
    gap = max(abs(a - b) for a, b in zip(pols["static:0,0"]["accuracy"], pols["adaptive"]["accuracy"], strict=True))
    assert results["headline"]["accuracy_gap"] == gap > 0
    assert f"accuracy per round differs by up to {gap:.4f} between policies (compress=int8 acts at the cuts)" \
        in printed.out
    assert (pols["static:0,0"]["time_to_target_s"] is None) == (target == 0.99)
    assert pols["adaptive"]["time_to_target_s"] is None and results["headline"]["ratio_best_static_over_adaptive"] is None
    assert said in printed.out


# ---------------------------------------------------------------- a stopped sweep: what it says to do next


@pytest.mark.slow
def test_a_stopped_sweep_does_not_send_the_user_to_a_resume_it_refuses(tmp_path: Path) -> None:
    """Before: "the runs that ended are in OUT/runs ...; to continue: the same command with --resume", for a
    folder the sweep never writes runs into, and --resume then refused it ("holds no experiment's runs")."""
    cfg = tmp_path / "c.toml"
    # 1,000 clients, not 20,000: a line is seconds of pricing, not a minute (the first line is waited for and one
    # more may be priced before the signal is acted on); 59 more lines to go still leave the sweep far from done
    spreads = ", ".join(f"{0.05 * i:.2f}" for i in range(60))  # far more pricing than the first line's
    cfg.write_text(f'model = "vgg11"\nclients = [1000]\nspreads = [{spreads}]\n')
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "simulations.heterogeneity_sweep", "--config", str(cfg),
                          "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "clients=" in line:
                break
        p.send_signal(signal.SIGTERM)
        _, stderr = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 143, stderr[-2000:]
    assert stderr.strip().splitlines() == [
        "simulations.heterogeneity_sweep: terminated; it keeps no runs to continue from (results.json comes at the "
        "end); to start again: the same command"], stderr[-2000:]
