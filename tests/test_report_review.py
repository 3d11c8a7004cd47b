"""``splitfed report`` reviewed as a user would use it: numbers recomputed from the metrics rows, the cut
heatmap's panels and columns, and what is left on disk when writing the report fails or is stopped."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from splitfed.cli import main as cli
from splitfed.errors import ConfigError
from splitfed.report import plots
from splitfed.report.runs import load_run, rows_to_run, write_run
from splitfed.report.summary import summary_rows

ROOT = Path(__file__).resolve().parents[1]


def _rows(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"round": r, "accuracy": 0.5 + r / (4 * n), "loss": 1.0 / r, "wall_s": 0.5, "sim_round_s": 1.25,
             "bytes_up": 1000 * r, "bytes_down": 500, "cuts": {"client0": [1, 4], "client1": [2, 4]}, **extra}
            for r in range(1, n + 1)]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _captured_heatmap(monkeypatch: pytest.MonkeyPatch, run: Any, tmp_path: Path) -> Any:
    """The heatmap's figure, as drawn (``_save`` is where every figure goes to its file)."""
    figs: list[Any] = []
    real = plots._save

    def keep(fig: Any, path: Any) -> Path:
        figs.append(fig)
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    plots.cuts_heatmap(run, tmp_path / "cuts.png")
    return figs[-1]


# ---------------------------------------------------------------- numbers


def test_best_accuracy_skips_a_diverged_round_wherever_it_stands(tmp_path: Path) -> None:
    """Before: ``max`` over the accuracies with a NaN (a diverged round's null) first returned NaN: the best
    accuracy read ``-`` though a later round had one (and summary.json, from the same rows, says 0.6)."""
    rows = [{"round": 1, "accuracy": None, "sim_round_s": 1.0}, {"round": 2, "accuracy": 0.6, "sim_round_s": 1.0},
            {"round": 3, "accuracy": 0.4, "sim_round_s": 1.0}]
    headers, table = summary_rows([rows_to_run(rows, "a"), rows_to_run(rows[::-1], "b")])
    best = headers.index("best accuracy")
    assert [row[best] for row in table] == [0.6, 0.6]
    assert math.isnan(summary_rows([rows_to_run(rows[:1], "c")])[1][0][best])  # none has one: "-"
    write_run(tmp_path / "run", rows)
    assert cli(["report", str(tmp_path / "run")]) == 0
    with open(tmp_path / "run" / "report" / "summary.csv") as f:
        assert next(csv.DictReader(f))["best accuracy"] == "0.6"
    from simulations.common import run_record  # an experiment's results.json counts it the same way

    assert run_record(rows_to_run(rows, "a"))["best_accuracy"] == 0.6


def test_rounds_csv_counts_the_clients_that_finished(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A real run (the ServerApp, in-process tiers) where one of 4 clients fails: its row says ``clients``: 3
    (and keeps the failed client's cuts). Before: rounds.csv's ``clients`` counted the cuts, 4. Every other
    number of both tables is recomputed here from the rows."""
    import clients.app
    import server.app
    from splitfed.flower.config import RunSettings
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    real = clients.app.app

    def fails(msg: Any, ctx: Any) -> Any:
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 2:
            raise RuntimeError("device out of memory")
        return real(msg, ctx)

    out = tmp_path / "run"
    s = RunSettings(rounds=2, clients=4, tiers=3, cuts="static:2,5", batch_size=32, node_wait_s=5.0,
                    round_timeout_s=30.0, out=str(out))
    with inprocess_tiers(monkeypatch, 2):
        server.app.run(FakeGrid(fails, 4), s, progress=lambda line: None)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["clients"], len(r["cuts"]), r["failed"]) for r in rows] == [(3, 4, ["client2"])] * 2

    assert cli(["report", str(out), "--target", "0.01"]) == 0
    with open(out / "report" / "rounds.csv") as f:
        table = list(csv.DictReader(f))
    with open(out / "report" / "summary.csv") as f:
        (summary,) = list(csv.DictReader(f))
    elapsed = 0.0
    for got, row in zip(table, rows, strict=True):
        elapsed += row["sim_round_s"]
        assert got["clients"] == "3"
        assert float(got["sim_time_s"]) == pytest.approx(elapsed, rel=1e-12)
        assert int(got["bytes_total"]) == row["bytes_up"] + row["bytes_down"]
        assert int(got["weight_bytes"]) == sum(row["device_weight_bytes"])
        assert float(got["accuracy"]) == row["accuracy"] and got["clock"] == "sim"
    assert int(summary["rounds"]) == 2 and float(summary["final accuracy"]) == rows[-1]["accuracy"]
    assert float(summary["best accuracy"]) == max(r["accuracy"] for r in rows)
    assert float(summary["sim time s"]) == pytest.approx(elapsed, rel=1e-12)
    assert float(summary["activation MB"]) == pytest.approx(
        sum(r["bytes_up"] + r["bytes_down"] for r in rows) / 1e6, rel=1e-12)
    assert float(summary["weight MB"]) == pytest.approx(sum(sum(r["device_weight_bytes"]) for r in rows) / 1e6)
    assert float(summary["wall s"]) == pytest.approx(sum(r["wall_s"] for r in rows), rel=1e-12)
    assert float(summary["sim s to 0.01"]) == pytest.approx(rows[0]["sim_round_s"]) and summary["rounds to 0.01"] == "1"


# ---------------------------------------------------------------- the cut heatmap


@pytest.mark.parametrize("settings,cuts,titles", [
    ({"tiers": 2, "u_shape": True}, [2, 6], ["cut 1: device | server", "cut 2: server | device (tail)"]),
    ({"tiers": 3, "u_shape": True}, [1, 3, 6],
     ["cut 1: device | edge", "cut 2: edge | cloud", "cut 3: cloud | device (tail)"]),
    ({"tiers": 3, "u_shape": False}, [2, 5], ["cut 1: device | edge", "cut 2: edge | cloud"]),
    ({"tiers": 2, "u_shape": False}, [3], ["cut 1: device | server"]),
])
def test_heatmap_names_the_tiers_of_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            settings: dict[str, Any], cuts: list[int], titles: list[str]) -> None:
    """Before: two cuts were always "device | edge" and "edge | cloud", also for a U-shape on two tiers
    (``splitfed simulate --tiers 2 --u-shape``), whose chain has no edge and no cloud."""
    rows = [{"round": r, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"client0": cuts}} for r in (1, 2)]
    run = rows_to_run(rows, "u", {"settings": settings})
    fig = _captured_heatmap(monkeypatch, run, tmp_path)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == titles


def test_heatmap_reads_the_chain_from_rows_without_a_summary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A run that did not finish has no summary.json; its rows' ``tier_weight_bytes`` name its server tiers."""
    rows = [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"client0": [2, 6]},
             "tier_weight_bytes": [[10, 10]]}]
    fig = _captured_heatmap(monkeypatch, rows_to_run(rows, "u"), tmp_path)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["cut 1: device | server",
                                                                     "cut 2: server | device (tail)"]


def test_heatmap_columns_sit_under_their_rounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Rows that skip rounds (1, 2, 5, 9): before, four columns were stretched over rounds 0.5..9.5, so the
    tick of round 2 stood over round 1's column and the tick of round 5 between two columns."""
    rounds = [1, 2, 5, 9]
    rows = [{"round": r, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"a": [r, 10]}} for r in rounds]
    fig = _captured_heatmap(monkeypatch, rows_to_run(rows, "gaps"), tmp_path)
    ax = fig.axes[0]
    image = ax.images[0]
    data = image.get_array()
    left, right = image.get_extent()[:2]
    width = (right - left) / data.shape[1]
    seen = {}
    for x, label in zip(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()], strict=True):
        seen[int(label)] = int(data[0, int((x - left) // width)])
    assert seen == {r: r for r in rounds}  # the cut shown under each round's tick is that round's


# ---------------------------------------------------------------- bad input


def test_a_summary_json_given_for_the_metrics_is_named_as_such(tmp_path: Path) -> None:
    """Before: ``summary.json:1: not valid JSON`` (it is valid JSON, read as JSON lines)."""
    write_run(tmp_path / "run", _rows(2), {"label": "x", "settings": {}, "rounds": 2})
    with pytest.raises(ConfigError, match=r"summary.json is a run's summary, not its metrics: give the run folder"):
        load_run(tmp_path / "run" / "summary.json")


def test_a_summary_json_that_is_not_text_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a traceback (UnicodeDecodeError)."""
    write_run(tmp_path / "run", _rows(2))
    (tmp_path / "run" / "summary.json").write_bytes(b"\xff\xfe{")
    assert cli(["report", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().endswith("summary.json: not valid JSON: not UTF-8 text")


def test_a_metrics_file_whose_only_line_was_cut_short_says_so(tmp_path: Path) -> None:
    write_run(tmp_path / "run", _rows(1))
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(metrics.read_text()[:40])
    with pytest.raises(ConfigError, match=r"metrics.jsonl: no rounds in it \(its only line was cut short"):
        load_run(tmp_path / "run")


# ---------------------------------------------------------------- writing


def _report(args: list[str], *, prelude: str = "", limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """``splitfed report ARGS`` in a process of its own (optionally under a file size limit: a disk that
    fills), ``prelude`` run before it."""
    code = f"import sys\n{prelude}\nfrom splitfed.cli import main\nsys.exit(main({args!r}))\n"

    def limited() -> None:
        import resource

        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=limited, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_write_that_fails_keeps_the_report_before_and_says_which_file(tmp_path: Path) -> None:
    """A disk that fills part way (here: a file size limit that rounds.csv, not the figures, passes). Before:
    a traceback, rounds.csv cut off half way and summary.md, summary.csv and the figures already of the new
    report beside it."""
    write_run(tmp_path / "run", _rows(4000))
    out = tmp_path / "run" / "report"
    assert cli(["report", str(tmp_path / "run")]) == 0
    assert (out / "rounds.csv").stat().st_size > 250_000
    before = _digests(out)
    done = _report(["report", str(tmp_path / "run"), "--target", "0.6"], limit=200_000)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"splitfed report: error: cannot write the report to {out}: rounds.csv: File too large "
        "(the report there before, if any, is kept)")
    assert _digests(out) == before  # every file as it was, no draft left


def test_sigterm_while_drawing_leaves_no_drafts(tmp_path: Path) -> None:
    """``timeout``, ``docker stop``: SIGTERM as a figure is drawn. Before: the process died at once and left
    ``.accuracy_vs_time.png.PID.tmp`` in the report folder."""
    write_run(tmp_path / "run", _rows(3))
    prelude = ("import os, signal\nimport splitfed.report.plots as P\nreal = P._save\n"
               "def save(fig, path):\n    real(fig, path)\n    os.kill(os.getpid(), signal.SIGTERM)\n    return path\n"
               "P._save = save")
    done = _report(["report", str(tmp_path / "run")], prelude=prelude)
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "splitfed report: terminated"
    out = tmp_path / "run" / "report"
    assert not out.exists() or list(out.iterdir()) == []
