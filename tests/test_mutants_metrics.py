"""What the run's metrics writer and summary promise, pinned where a mutation run found nothing checking it.

``summary.json``'s numbers are checked against rows written as the coordinator writes them
(``server.app.metrics_row``), through :class:`MetricsWriter`, with the totals summed by hand here; rows of an
older splitfed lack some fields, and each missing one counts 0. ``rows_kept`` counts a run folder's rows with and
without a last line a crash cut short; ``check_rounds`` names at most 5 missing rounds then "+N more"; a failed
write is one :class:`RunFolderError` that says how to continue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitfed.errors import ConfigError, RunFolderError
from splitfed.flower.metrics import (
    METRICS,
    SUMMARY,
    MetricsWriter,
    check_rounds,
    rows_kept,
    run_rows,
    summarise,
    summary_again,
)


def _row(r: int, acc: float, wall_s: float, ups_downs: list[tuple[int, int]], tiers: list[list[int]],
         device: list[int], initial: tuple[float, float] | None = None) -> dict[str, Any]:
    from server.app import metrics_row
    from server.strategy import RoundRecord
    from splitfed.flower.policy import Measurement

    ms = [Measurement(f"client{i}", (2, 5), 10, 0.5, 0.25, up, down) for i, (up, down) in enumerate(ups_downs)]
    rec = RoundRecord(r, {m.client_id: m.cuts for m in ms}, measurements=ms, sim_round_s=1.0,
                      tier_weight_bytes=tiers, device_weight_bytes=device)
    return metrics_row(rec, acc, 2.0 - acc, wall_s, {}, initial=initial)


def _three_rounds() -> list[dict[str, Any]]:
    # the best accuracy is neither the first, the last nor the lowest; every pair is lopsided so that [sent,
    # received] swapped or one counted twice shows; round 1 has one server tier, later rounds two
    return [
        _row(1, 0.30, 1.5, [(100, 40), (7, 3)], [[11, 5]], [13, 2], initial=(0.1, 2.3)),
        _row(2, 0.70, 2.25, [(50, 20)], [[1, 2], [30, 40]], [100, 9]),
        _row(3, 0.55, 0.25, [(1, 1000)], [[4, 6], [0, 8]], [0, 50]),
    ]


def test_summary_totals_rows_as_the_coordinator_writes_them(tmp_path: Path) -> None:
    """best/final accuracy, wall seconds, bytes up/down, per-tier and device weight traffic, summed by hand."""
    w = MetricsWriter(tmp_path)
    for row in _three_rounds():
        w.append(row)
    summary = summary_again(tmp_path, 3, {"seed": 7})
    want = {
        "rounds": 3,
        "initial_accuracy": 0.1,
        "final_accuracy": 0.55,
        "best_accuracy": 0.70,
        "final_loss": 2.0 - 0.55,
        "wall_s": 1.5 + 2.25 + 0.25,
        "sim_time_s": 3.0,
        "bytes_up": 100 + 7 + 50 + 1,
        "bytes_down": 40 + 3 + 20 + 1000,
        "tier_weight_bytes": [[11 + 1 + 4, 5 + 2 + 6], [30 + 0, 40 + 8]],
        "device_weight_bytes": [13 + 100 + 0, 2 + 9 + 50],
        "failed_clients": 0,
        "settings": {"seed": 7},
    }
    assert summary == want
    assert json.loads((tmp_path / SUMMARY).read_text()) == want  # what the folder holds


def test_a_row_lacking_a_field_counts_zero(tmp_path: Path) -> None:
    """An older splitfed's row (no wall_s, bytes, tier or device weight traffic) adds nothing to the totals."""
    w = MetricsWriter(tmp_path)
    w.append({"round": 1, "accuracy": 0.2, "loss": 1.0, "failed": []})
    w.append({"round": 2, "accuracy": 0.4, "loss": 0.5, "failed": ["c1"], "wall_s": 2.0, "bytes_up": 5,
              "bytes_down": 6, "device_weight_bytes": [3, 4], "tier_weight_bytes": [[1, 2]]})
    w.append({"round": 3, "accuracy": None, "loss": 0.7, "failed": [], "device_weight_bytes": None,
              "tier_weight_bytes": []})
    s = summarise(w.rows(), {})
    assert (s["wall_s"], s["bytes_up"], s["bytes_down"]) == (2.0, 5, 6)
    assert s["device_weight_bytes"] == [3, 4]
    assert s["tier_weight_bytes"] == [[1, 2]]
    assert (s["final_accuracy"], s["best_accuracy"], s["failed_clients"], s["final_loss"]) == (0.4, 0.4, 1, 0.7)
    s = summarise([{"round": 1, "accuracy": None, "loss": 1.0}], {})
    assert (s["wall_s"], s["bytes_up"], s["bytes_down"], s["device_weight_bytes"], s["tier_weight_bytes"]) == (
        0.0, 0, 0, [0, 0], [])
    assert s["best_accuracy"] is None and s["final_accuracy"] is None


pairs = st.tuples(st.integers(0, 10**9), st.integers(0, 10**9))


@given(st.lists(st.tuples(st.floats(0, 1), st.lists(pairs, max_size=3), pairs), min_size=1, max_size=6))
def test_summary_best_accuracy_and_traffic_are_the_rows_own(rounds: list[Any]) -> None:
    rows = [{"round": i, "accuracy": acc, "loss": 1.0, "tier_weight_bytes": [list(p) for p in tiers],
             "device_weight_bytes": list(dev)} for i, (acc, tiers, dev) in enumerate(rounds, 1)]
    s = summarise(rows, {})
    assert s["best_accuracy"] == sorted(acc for acc, _, _ in rounds)[-1]
    assert s["final_accuracy"] == rounds[-1][0]
    width = max(len(tiers) for _, tiers, _ in rounds)
    want = [[0, 0] for _ in range(width)]
    for _, tiers, _ in rounds:
        for t, (to, back) in enumerate(tiers):
            want[t] = [want[t][0] + to, want[t][1] + back]
    assert s["tier_weight_bytes"] == want
    assert s["device_weight_bytes"] == [sum(d[0] for _, _, d in rounds), sum(d[1] for _, _, d in rounds)]


# ---------------------------------------------------------------- rows_kept


def _metrics(folder: Path, text: str) -> None:
    (folder / METRICS).write_text(text)


def test_rows_kept_counts_a_whole_file_and_none(tmp_path: Path) -> None:
    assert rows_kept(tmp_path) == 0 and rows_kept(tmp_path, cut=False) == 0  # no file
    _metrics(tmp_path, "")
    assert rows_kept(tmp_path) == 0 and rows_kept(tmp_path, cut=False) == 0
    _metrics(tmp_path, "".join(json.dumps({"round": r}) + "\n" for r in (1, 2, 3)))
    assert rows_kept(tmp_path) == 3 and rows_kept(tmp_path, cut=False) == 3
    _metrics(tmp_path, '{"round": 1}\n{"round": 2}')  # a whole row, its newline not yet written: finished
    assert rows_kept(tmp_path) == 2 and rows_kept(tmp_path, cut=False) == 2


def test_rows_kept_a_last_line_cut_short_counts_only_with_cut(tmp_path: Path) -> None:
    _metrics(tmp_path, '{"round": 1}\n{"round": 2}\n{"round": 3, "accur')
    assert rows_kept(tmp_path) == 3  # cut=True is the default
    assert rows_kept(tmp_path, cut=True) == 3
    assert rows_kept(tmp_path, cut=False) == 2


# ---------------------------------------------------------------- run_rows and check_rounds refuse


@pytest.mark.parametrize("line", ['{"round": true}', '{"round": 0}', '{"round": "1"}', '{"round": null}', "{}",
                                  '{"round": 1.0}'])
def test_run_rows_refuses_a_row_whose_round_is_not_a_whole_number(tmp_path: Path, line: str) -> None:
    _metrics(tmp_path, '{"round": 1}\n' + line + "\n")
    with pytest.raises(ConfigError, match=f"{METRICS}:2: not a metrics row \\(its round is"):
        run_rows(tmp_path / METRICS)


def _refusal(path: Path, round: int) -> str:
    with pytest.raises(ConfigError) as e:
        check_rounds(path, round)
    return str(e.value)


def test_check_rounds_names_five_missing_rounds_then_how_many_more(tmp_path: Path) -> None:
    path = tmp_path / METRICS
    assert f"{path} lacks round(s) 1, 2, 3, 4, 5, but the checkpoint holds round 5 " in _refusal(path, 5)
    assert f"{path} lacks round(s) 1, 2, 3, 4, 5, +1 more, but the checkpoint holds round 6 " in _refusal(path, 6)
    assert "lacks round(s) 1, 2, 3, 4, 5, +4 more, but" in _refusal(path, 9)


# ---------------------------------------------------------------- writing


def test_a_failed_write_is_one_run_folder_error(tmp_path: Path) -> None:
    """The disk refuses (here: a folder where the file goes): named, with how to continue, never silent."""
    (tmp_path / METRICS).mkdir()
    (tmp_path / SUMMARY).mkdir()
    w = MetricsWriter(tmp_path)
    with pytest.raises(RunFolderError, match=f"cannot write {tmp_path / METRICS}: .*--resume {tmp_path}\\)"):
        w.append({"round": 1, "accuracy": 0.5, "loss": 1.0})
    with pytest.raises(RunFolderError, match=f"cannot write {tmp_path / SUMMARY}: "):
        w.write_summary({"rounds": 0})


def test_the_writer_makes_its_folder_and_the_folders_above(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "a" / "b"
    w = MetricsWriter(folder)
    assert folder.is_dir()
    w.append({"round": 1})
    assert rows_kept(folder) == 1
