"""What ``splitfed.report.runs`` promises about reading and writing run folders and naming runs, pinned where a
mutation run found nothing checking it.

``load_run``: a ``metrics.jsonl`` given directly is read (only a ``summary.json`` given directly is refused, with
its message). ``run_notes``: a stop no signal caused names its reason. ``unique_labels``: labels told apart by
the shortest end of their paths (``/x`` against ``b/x``), and the last resort for two paths that end alike numbers
the second ``#2``. ``write_run``: makes nested folders and writes both files with sorted keys. ``Run.clients``:
digits sorted as numbers (``pi-2`` before ``pi-10``). Device classes: a ``per_client`` entry without a
``profile`` is passed over, not a crash.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from splitfed.errors import ConfigError
from splitfed.flower.metrics import METRICS, SUMMARY
from splitfed.report.runs import load_run, rows_to_run, run_notes, unique_labels, write_run


def _rows(n: int = 2, **extra: Any) -> list[dict[str, Any]]:
    return [{"round": r, "accuracy": 0.25 * r, "sim_round_s": float(r), **extra} for r in range(1, n + 1)]


# ---------------------------------------------------------------- reading


def test_load_run_reads_a_metrics_file_given_directly(tmp_path: Path) -> None:
    """``splitfed report RUN/metrics.jsonl`` reads the run; only ``summary.json`` given directly is refused."""
    folder = write_run(tmp_path / "r", _rows(3), {"label": "lab"})
    run = load_run(folder / METRICS)
    assert run.label == "lab"
    assert [r.round for r in run.rounds] == [1, 2, 3]
    assert run.time_to_target(0.5) == 3.0
    assert run.finished is True
    with pytest.raises(ConfigError, match=r"is a run's summary, not its metrics: give the run folder"):
        load_run(folder / SUMMARY)


# ---------------------------------------------------------------- notes


def test_a_stop_without_a_signal_names_its_reason() -> None:
    """A run stopped because its output closed (no signal): the note says why, in brackets."""
    run = replace(rows_to_run(_rows(2), "a"), status="stopped", finished=False,
                  record={"reason": "its output closed", "until": "T1"})
    assert run_notes(run) == ["a was stopped (its output closed) at T1, before its end (2 rounds kept)"]
    by_signal = replace(run, record={"signal": "SIGTERM", "reason": "ignored", "until": "T1"})
    assert run_notes(by_signal) == ["a was stopped by SIGTERM at T1, before its end (2 rounds kept)"]


def test_a_whole_finished_run_has_no_notes() -> None:
    """No note at all for a finished run (not an empty one)."""
    assert run_notes(rows_to_run(_rows(1), "a")) == []


# ---------------------------------------------------------------- labels


def test_labels_are_told_apart_by_the_shortest_differing_path_end() -> None:
    """``/a`` against ``/b/a``: the first has no more parts, so it is named from ``/``; the second by its
    parent only (no leading ``/``: it has one more part)."""
    assert unique_labels(["x", "x"], [Path("/a"), Path("/b/a")]) == ["/x", "b/x"]
    assert unique_labels(["fast", "fast"], [Path("/w/f1"), Path("/w/f2")]) == ["fast (f1)", "fast (f2)"]
    assert unique_labels(["x", "x", "y"], [Path("/a/b/r"), Path("/c/b/r"), Path("/d")]) == ["a/b/x", "c/b/x", "y"]


def test_two_paths_that_end_alike_are_numbered_from_two() -> None:
    """The last resort: the first keeps the name, the second is ``#2`` (then ``#3``)."""
    assert unique_labels(["x", "x"], [Path("/p/a"), Path("/p/a")]) == ["p/x", "p/x#2"]
    assert unique_labels(["x", "x", "x"], [Path("/p/a")] * 3) == ["p/x", "p/x#2", "p/x#3"]


# ---------------------------------------------------------------- writing


def test_write_run_makes_nested_folders_and_sorts_keys(tmp_path: Path) -> None:
    """A folder two levels below one that does not exist is made; both files' keys are sorted (stable diffs)."""
    rows = [{"sim_round_s": 1.0, "round": 1, "accuracy": 0.5, "wall_s": 0.25}]
    d = write_run(tmp_path / "new" / "deeper" / "run", rows, {"zeta": 1, "alpha": 2, "label": "l"})
    assert d == tmp_path / "new" / "deeper" / "run"
    lines = (d / METRICS).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    assert list(json.loads(lines[0])) == ["accuracy", "round", "sim_round_s", "wall_s"]
    assert lines[0].index('"accuracy"') < lines[0].index('"round"') < lines[0].index('"sim_round_s"')
    text = (d / SUMMARY).read_text(encoding="utf-8")
    assert list(json.loads(text)) == ["alpha", "label", "zeta"]
    assert text.index('"alpha"') < text.index('"label"') < text.index('"zeta"')
    assert load_run(d).label == "l"


# ---------------------------------------------------------------- clients and classes


def test_clients_sort_their_digits_as_numbers() -> None:
    """``pi-2`` before ``pi-10`` (both of class ``pi``), whatever order the rows name them in."""
    run = rows_to_run(_rows(1, cuts={"pi-10": [1, 2], "pi-2": [1, 2], "pi-1": [2, 3]}), "a")
    assert run.clients == ["pi-1", "pi-2", "pi-10"]


def test_a_per_client_entry_without_a_profile_is_passed_over() -> None:
    """A ``per_client`` entry that has no ``profile`` (a client's loss only) gives no class, not a KeyError."""
    run = rows_to_run(_rows(1, cuts={"pi-1": [1, 2], "jetson-1": [1, 2]},
                            per_client={"pi-1": {"loss": 1.0}, "jetson-1": {"profile": "orin-3"}}), "a")
    assert dict(run.classes) == {"jetson-1": "orin"}
    assert run.class_of("pi-1") == "pi"
    assert run.clients == ["jetson-1", "pi-1"]


def test_write_run_rewrites_a_run_folder_that_is_there(tmp_path: Path) -> None:
    """Writing a run into a folder that exists (a run written again) replaces its rows, no FileExistsError."""
    d = tmp_path / "run"
    write_run(d, _rows(3))
    write_run(d, _rows(1), {"label": "again"})
    run = load_run(d)
    assert (run.label, [r.round for r in run.rounds]) == ("again", [1])
