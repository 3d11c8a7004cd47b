"""The README's first command, shortened: the main job's config with 2 clients and 1 round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-real")]
ROOT = Path(__file__).resolve().parents[1]


def test_main_job_short(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "splitfed.cli", "simulate", "--config", str(ROOT / "simulations/configs/main.toml"),
         "--clients", "2", "--rounds", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    # progress per round, the end-of-run table with cuts per device class, and where the results are
    assert "round 1/1" in p.stdout
    assert "cuts per device class" in p.stdout
    assert f"run folder: {out}" in p.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    for key in ("round", "accuracy", "loss", "wall_s", "sim_round_s", "bytes_up", "bytes_down", "cuts"):
        assert key in row, key
    assert row["bytes_up"] > 0 and row["sim_round_s"] > 0 and len(row["cuts"]) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in pngs)
