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

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cli import main as cli
from splitfed.errors import ConfigError
from splitfed.report import plots
from splitfed.report.runs import load_run, rows_to_run, write_run
from splitfed.report.summary import summary_rows
from tests.plot_fixtures import saved_figures

ROOT = Path(__file__).resolve().parents[1]


def _rows(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"round": r, "accuracy": 0.5 + r / (4 * n), "loss": 1.0 / r, "wall_s": 0.5, "sim_round_s": 1.25,
             "bytes_up": 1000 * r, "bytes_down": 500, "cuts": {"client0": [1, 4], "client1": [2, 4]}, **extra}
            for r in range(1, n + 1)]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _captured_heatmap(monkeypatch: pytest.MonkeyPatch, run: Any, tmp_path: Path) -> Any:
    """The heatmap's figure, as drawn (``_save`` is where every figure goes to its file)."""
    figs = saved_figures(monkeypatch)
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
    # the limit is set by the child itself: a preexec_fn forks the test's process, whose gRPC (other tests') runs
    # its fork handlers in the child before the exec, which aborted it (SIGABRT, "epoll_wait error") under load
    limited = "" if limit is None else f"import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
    code = f"import sys\n{limited}{prelude}\nfrom splitfed.cli import main\nsys.exit(main({args!r}))\n"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


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


# ---------------------------------------------------------------- a user comparing runs (figures, table)


def _drawn(fig: Any) -> list[tuple[str, bool]]:
    """Each legend entry of ``fig``'s axes and whether its line has a point drawn (both coordinates finite)."""
    ax = fig.axes[0]
    lines = {str(line.get_label()): line for line in ax.get_lines()}
    out = []
    for t in ax.get_legend().get_texts():
        line = lines[t.get_text()]
        xs, ys = (np.asarray(v, dtype=float) for v in line.get_data())
        out.append((t.get_text(), bool(np.any(np.isfinite(xs) & np.isfinite(ys))) or line.get_linestyle() == ":"))
    return out


def _footnotes(fig: Any) -> str:
    return " ".join(t.get_text() for t in fig.texts)


def test_a_run_whose_every_round_diverged_is_named_not_drawn_as_an_empty_legend_entry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two runs compared, one whose every accuracy is null (diverged). Before: its legend entry stood in the
    accuracy figures with nothing drawn, and nothing said why (an empty series was named in the footnote;
    one of NaNs was not). Now each figure draws every run it lists, and names the one it cannot draw."""
    write_run(tmp_path / "good", _rows(4))
    write_run(tmp_path / "diverged", [{**r, "accuracy": None} for r in _rows(4)])
    figs = saved_figures(monkeypatch)
    assert cli(["report", str(tmp_path / "good"), str(tmp_path / "diverged"), "--out", str(tmp_path / "out"),
                "--target", "0.6"]) == 0
    by_title = {f.axes[0].get_title(): f for f in figs if f.axes[0].get_legend() is not None}
    for title, fig in by_title.items():
        assert all(has_points for _, has_points in _drawn(fig)), title
    for title in ("Test accuracy per round", "Test accuracy vs simulated time"):
        fig = by_title[title]
        assert [name for name, _ in _drawn(fig)][0] == "good"
        assert "diverged" not in [name for name, _ in _drawn(fig)]
        assert "no points: diverged" in _footnotes(fig)
    assert "no points" not in _footnotes(by_title["Simulated round time (makespan)"])  # its times are drawn


def test_accuracy_vs_bytes_names_a_run_that_sent_nothing_over_a_link(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """A run with every block on its devices sends no activation: its curve is a vertical line at 0 MB, which
    read as accuracy reached for free. The footnote now names it, and only it."""
    write_run(tmp_path / "split", _rows(3))
    write_run(tmp_path / "local", [{**r, "bytes_up": 0, "bytes_down": 0} for r in _rows(3)])
    figs = saved_figures(monkeypatch)
    assert cli(["report", str(tmp_path / "split"), str(tmp_path / "local"), "--out", str(tmp_path / "out")]) == 0
    fig = next(f for f in figs if f.axes[0].get_title() == "Test accuracy vs activation bytes")
    assert "no activation or gradient crossed a link: local" in _footnotes(fig)
    assert "split" not in _footnotes(fig)
    xs = {name: list(line.get_xdata()) for line in fig.axes[0].get_lines() if (name := str(line.get_label()))}
    assert xs["local"] == [0.0, 0.0, 0.0] and xs["split"][-1] > 0
    others = [f for f in figs if f is not fig and f.axes and f.axes[0].get_legend() is not None]
    assert others and not any("crossed a link" in _footnotes(f) for f in others)


@settings(max_examples=10, deadline=None)
@given(ys=st.lists(st.one_of(st.floats(0, 1), st.just(math.nan)), min_size=0, max_size=6))
def test_every_legend_entry_of_a_line_plot_has_a_point_drawn(tmp_path_factory: pytest.TempPathFactory,
                                                           ys: list[float]) -> None:
    figs: list[Any] = []
    with pytest.MonkeyPatch.context() as mp:
        real = plots._save
        mp.setattr(plots, "_save", lambda fig, path: (figs.append(fig), real(fig, path))[1])
        plots.line_plot([plots.Series("s", list(range(len(ys))), ys), plots.Series("ref", [0, 1], [0.5, 0.5])],
                        tmp_path_factory.mktemp("p") / "a.png", title="t", xlabel="x", ylabel="y")
    drawable = any(math.isfinite(y) for y in ys)
    assert [name for name, _ in _drawn(figs[0])] == (["s", "ref"] if drawable else ["ref"])
    assert ("no points: s" in _footnotes(figs[0])) is not drawable


def test_a_long_run_name_is_wrapped_inside_the_axes_not_over_them(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """Runs named by their settings (``adaptive-pi-home-60-clients-...``, 150 characters). Before: the legend
    drew the name on one line, wider than the axes: it covered the curves and the y axis's label, and the
    PNG grew to hold it. Now a long name is wrapped (every character kept) and the legend sits in the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    label = "adaptive-cuts " + " ".join(f"pi-home-{i}x60-clients-seed-{i}" for i in range(5))
    label = (label + "-" + "x" * 150)[:150]
    runs = [rows_to_run(_rows(3), label), rows_to_run(_rows(3), "baseline")]
    figs = saved_figures(monkeypatch)
    plots.accuracy_per_round_plot(runs, tmp_path / "a.png")
    plots.bytes_plot(runs, tmp_path / "b.png")
    for fig in figs:
        FigureCanvasAgg(fig).draw()
        ax, legend = fig.axes[0], fig.axes[0].get_legend()
        inside, box = ax.get_window_extent(), legend.get_window_extent()
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1, (box, inside)
        names = [t.get_text() for t in legend.get_texts()]
        assert all(len(line) <= plots.LABEL_WIDTH + len(" down") for n in names for line in n.split("\n"))
    assert [t.get_text().replace("\n", "") for t in figs[0].axes[0].get_legend().get_texts()] == [label, "baseline"]


def test_long_simulated_times_read_apart_in_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two long runs (60 rounds of about 2,000 simulated s) reach the target at 123,456 s and 123,900 s.
    Before: the terminal table and summary.md printed both as ``1.23e+05`` (3 significant digits from 1e5 s
    up, where 99,999 s still had two decimals): the comparison the report is for was lost."""
    for name, s in (("fast", 123456.0), ("slow", 123900.0)):
        write_run(tmp_path / name, [{"round": r, "accuracy": 0.1 + 0.01 * r, "sim_round_s": s / 60}
                                    for r in range(1, 61)])
    assert cli(["report", str(tmp_path / "fast"), str(tmp_path / "slow"), "--target", "0.7",
                "--out", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    headers, rows = summary_rows([load_run(tmp_path / n) for n in ("fast", "slow")], 0.7)
    col = headers.index("sim s to 0.7")
    assert [row[col] for row in rows] == pytest.approx([123456.0, 123900.0])
    for line, want in zip(table[2:], ("123456", "123900"), strict=True):
        assert line.split()[col] == want
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| 123456 |" in md and "| 123900 |" in md


def test_a_run_looks_the_same_in_every_figure_when_another_cannot_be_drawn(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """A run left out of a figure (no point to draw there) takes no other run's colour: ``good`` is drawn
    alike in the accuracy figures (where ``diverged`` has no point) and the makespan figure (where it has)."""
    runs = [rows_to_run([{**r, "accuracy": None} for r in _rows(3)], "diverged"), rows_to_run(_rows(3), "good")]
    figs = saved_figures(monkeypatch)
    plots.accuracy_per_round_plot(runs, tmp_path / "a.png")
    plots.makespan_plot(runs, tmp_path / "m.png")
    looks = [{str(line.get_label()): (line.get_color(), line.get_marker(), line.get_linestyle())
              for line in f.axes[0].get_lines()} for f in figs]
    assert looks[0]["good"] == looks[1]["good"]


def test_a_report_into_a_users_folder_removes_only_its_own_earlier_heatmaps(tmp_path: Path) -> None:
    """``--out`` naming a folder of the user's own figures. Before: every ``cuts_*.png`` there was removed as
    an earlier report's heatmap (``cuts_overview.png``, ``cuts_sketch.png``). Now only names a report gives
    (``cuts_N_LABEL.png``) of runs no longer in it."""
    write_run(tmp_path / "a", _rows(3))
    write_run(tmp_path / "b", _rows(3))
    out = tmp_path / "paper"
    out.mkdir()
    mine = {name: name.encode() for name in ("cuts_overview.png", "cuts_sketch.png", "cuts_1.png", "cuts_.png",
                                             "cuts_0_a.png", "cuts_2_a b.png")}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    assert cli(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    assert {p.name for p in out.glob("cuts_*")} == {*mine, "cuts_1_a.png", "cuts_2_b.png"}
    assert cli(["report", str(tmp_path / "a"), "--out", str(out)]) == 0  # b's heatmap is an earlier report's
    assert {p.name for p in out.glob("cuts_*")} == {*mine, "cuts_1_a.png"}
    assert all((out / name).read_bytes() == data for name, data in mine.items())


def test_time_to_target_of_a_run_that_stopped_early_is_not_called_never(tmp_path: Path) -> None:
    """A run stopped after 3 rounds at 0.55 beside one that reached 0.6. Before: summary.md's legend read
    ``-: never`` for it, which a run that stopped early does not say. Round 1 reaching the target counts
    round 1's time."""
    write_run(tmp_path / "done", [{"round": r, "accuracy": a, "sim_round_s": 2.0}
                                  for r, a in ((1, 0.7), (2, 0.5), (3, 0.65))], {"rounds": 3})
    write_run(tmp_path / "stopped", [{"round": r, "accuracy": a, "sim_round_s": 2.0}  # no summary.json: it
                                     for r, a in ((1, 0.4), (2, 0.5), (3, 0.55))])  # did not finish
    assert cli(["report", str(tmp_path / "done"), str(tmp_path / "stopped"), "--target", "0.6",
                "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "summary.csv") as f:
        got = {r["run"]: (r["sim s to 0.6"], r["rounds to 0.6"]) for r in csv.DictReader(f)}
    assert got == {"done": ("2.0", "1"), "stopped": ("", "")}
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "`-`: never" not in md and "not in the rounds the run has" in md


def test_a_row_without_any_time_is_refused_naming_it(tmp_path):
    """A null ``sim_round_s`` and no ``measured_round_s``: read as NaN, every later time was NaN too, and a
    target the run reached read as never reached."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"round": 1, "accuracy": 0.2, "sim_round_s": 1.0}, {"round": 2, "accuracy": 0.5, "sim_round_s": None},
            {"round": 3, "accuracy": 0.9, "sim_round_s": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"metrics\.jsonl: run: round object #2: 'sim_round_s' is null and there is no 'measured_round_s'"):
        load_run(run)
