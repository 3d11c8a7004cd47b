"""benchmarks/startup.py: a fresh process's first step with splitfed's optimizers and with torch.optim, side by
side. Run in this process (it starts its two kinds of child process itself); the flags' refusals before torch
is imported are test_benchmark_input's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_fixtures import load_benchmark


def test_the_startup_benchmark_compares_both_optimizers_in_fresh_processes(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "startup.json"
    assert load_benchmark("startup").main(["--model", "mlp", "--batch", "4", "--reps", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["model"] == "mlp" and res["reps"] == 1 and set(res["runs"]) == {"splitfed", "torch.optim"}
    assert res["versions"]["torch"].startswith("2.")  # what torch.optim's side measured depends on
    # what the benchmark is about: only torch.optim's process imported torch._dynamo
    assert res["dynamo_imported"] == {"splitfed": False, "torch.optim": True}
    med = res["median"]
    for side in ("splitfed", "torch.optim"):
        (run,) = res["runs"][side]
        assert 0 < run["cpu_s"] and 0 < run["wall_s"] <= run["process_s"] and run["peak_rss_mb"] > 0
        assert med[side]["cpu_s"] == run["cpu_s"]
    assert res["cpu_ratio"] == pytest.approx(med["torch.optim"]["cpu_s"] / med["splitfed"]["cpu_s"])
    assert res["rss_saved_mb"] == pytest.approx(med["torch.optim"]["peak_rss_mb"] - med["splitfed"]["peak_rss_mb"])
    assert f"took {res['cpu_ratio']:.2f}x the CPU" in printed and f"wrote {out}" in printed


def test_a_failing_child_is_one_line_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A child process that fails is said in one line (its last line of stderr), with no result written."""
    mod = load_benchmark("startup")
    mod._CHILD = "import sys; sys.exit('boom: no model here')"
    assert mod.main(["--model", "mlp", "--reps", "1", "--out", str(tmp_path / "s.json")]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "benchmarks/startup.py: error: the splitfed process failed: boom: no model here"
    assert not (tmp_path / "s.json").exists()
