"""What the in-process backend holds that its other tests leave open (mutants of ``splitfed/sim/inprocess.py``).

It computes on one torch thread, as every process of a Flower run does (the same kernels, so the same numbers),
and gives the caller's thread count back; a row's ``wall_s`` is that round's own wall time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from splitfed.flower.config import RunSettings
from splitfed.sim.inprocess import train_inprocess


def test_rounds_compute_on_one_thread_and_rows_time_their_own_round(tmp_path: Path) -> None:
    """The thread count seen while rounds run is 1 (2 would change reductions' order, so the numbers a Flower
    run gives), the caller's count comes back after; each round's ``wall_s`` lies within the run's own span."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[int] = []
    try:
        s = RunSettings(rounds=2, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=3,
                        out=str(tmp_path / "r"))
        t0 = time.perf_counter()
        train_inprocess(s, progress=lambda _line: seen.append(torch.get_num_threads()))
        span = time.perf_counter() - t0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(0 < r["wall_s"] <= span for r in rows)  # a round's own time, not the clock's reading plus its start
    assert sum(r["wall_s"] for r in rows) <= span
