"""``splitfed report`` and the experiment scripts on hand-edited or odd run folders: a byte count or a round time
that Python's json reads as NaN or Infinity, cuts that are all empty, a metrics file that cannot be read, a
policy's run that diverged where another did not, and the sweep's tied makespan curves."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from simulations import heterogeneity_sweep
from simulations.static_vs_adaptive import accuracy_gap
from splitfed.cli import main as cli
from splitfed.errors import ConfigError
from splitfed.report import plots, runs
from splitfed.report.runs import load_run, rows_to_run
from tests.plot_fixtures import saved_figures


def _folder(tmp_path: Path, *lines: str, name: str = "r") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    return d


def _report(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli(["report", str(folder), "--out", str(folder.parent / "out")])
    return code, capsys.readouterr().err


ROW = '{"round": 1, "accuracy": 0.5, "sim_round_s": 1'


@pytest.mark.parametrize("extra, words", [
    ('"bytes_up": NaN', "'bytes_up' must be a finite number of bytes, got nan"),  # before: ValueError
    ('"bytes_down": Infinity', "'bytes_down' must be a finite number of bytes, got inf"),  # before: OverflowError
    ('"bytes_up": 1e400', "'bytes_up' must be a finite number of bytes, got inf"),
    ('"bytes_up": 1' + "0" * 400, "'bytes_up' is out of range (over 1e308)"),  # before: OverflowError in float()
], ids=["nan", "infinity", "1e400", "401-digits"])
def test_a_byte_count_no_integer_holds_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            extra: str, words: str) -> None:
    d = _folder(tmp_path, f"{ROW}, {extra}}}")
    code, err = _report(d, capsys)
    assert code == 2 and err == f"splitfed report: error: {d / 'metrics.jsonl'}: r: round object #1: {words}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("row, words", [
    # before: read, and every time from it on (the totals, the time to a target) was NaN, shown as "-"
    ('{"round": 1, "accuracy": 0.5, "sim_round_s": NaN}', "'sim_round_s' must be a finite number of seconds, got nan"),
    ('{"round": 1, "accuracy": 0.5, "sim_round_s": Infinity}',
     "'sim_round_s' must be a finite number of seconds, got inf"),
    ('{"round": 1, "accuracy": 0.5, "sim_round_s": null, "measured_round_s": NaN}',
     "'measured_round_s' must be a finite number of seconds, got nan"),
], ids=["nan", "infinity", "measured-nan"])
def test_a_round_time_that_is_not_finite_is_refused_as_a_null_one_is(tmp_path: Path, row: str, words: str) -> None:
    d = _folder(tmp_path, row, '{"round": 2, "accuracy": 0.9, "sim_round_s": 1}')
    with pytest.raises(ConfigError, match=f": r: round object #1: {words}$"):
        load_run(d)


def test_cuts_that_are_all_empty_draw_a_blank_heatmap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``[]`` is a client's cuts the tables show as ``-``; the heatmap had no panel to draw (ValueError)."""
    d = _folder(tmp_path, f'{ROW}, "cuts": {{"c0": [], "c1": []}}}}')
    code, err = _report(d, capsys)
    assert code == 0, err
    assert (tmp_path / "out" / "cuts_1_r.png").stat().st_size > 1000


def test_a_metrics_file_that_cannot_be_read_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user who is not root meets a file of mode 000 (PermissionError was a traceback)."""
    d = _folder(tmp_path, ROW + "}")

    def unreadable(path: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(runs, "read_rows_cut", unreadable)
    code, err = _report(d, capsys)
    assert (code, err) == (2, f"splitfed report: error: {d / 'metrics.jsonl'}: cannot read it: Permission denied\n")


@pytest.mark.parametrize("where", ["metrics.jsonl", "summary.json"])
def test_an_integer_json_will_not_read_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   where: str) -> None:
    """An integer of over 4,300 digits: json's ValueError (not a JSONDecodeError) was a traceback."""
    huge = "9" * 5000
    d = _folder(tmp_path, f'{ROW}, "bytes_up": {huge}}}' if where == "metrics.jsonl" else ROW + "}")
    if where == "summary.json":
        (d / "summary.json").write_text(f'{{"rounds": {huge}}}\n')
    code, err = _report(d, capsys)
    line = ":1" if where == "metrics.jsonl" else ""  # a metrics file's line is named, as for any row it refuses
    assert code == 2 and err.startswith(f"splitfed report: error: {d / where}{line}: not valid JSON: Exceeds the limit")
    assert err.count("\n") == 1 and "set_int_max_str_digits" not in err


def _run(label: str, accuracies: list[float]) -> Any:
    return rows_to_run([{"round": i + 1, "accuracy": None if math.isnan(a) else a, "sim_round_s": 1.0}
                        for i, a in enumerate(accuracies)], label)


@pytest.mark.parametrize("order", [0, 1])
def test_a_run_that_diverged_where_another_did_not_is_not_the_same_curve(order: int) -> None:
    """max/min of [0.5, nan] is 0 (printed "the same under every policy"), of [nan, 0.5] nan: by the runs' order."""
    pair = [_run("static", [0.5, 0.6]), _run("adaptive", [0.5, math.nan])]
    assert accuracy_gap(pair[::-1] if order else pair) == math.inf
    assert accuracy_gap([_run("a", [0.5, math.nan]), _run("b", [0.5, math.nan])]) == 0  # both diverged: alike
    assert accuracy_gap([_run("a", [0.5, 0.7]), _run("b", [0.5, 0.6])]) == pytest.approx(0.1)


def test_the_sweeps_makespan_figure_shows_every_policy_that_ties_the_optimizer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a homogeneous fleet best-static and greedy price as the optimizer does: drawn alike, the last hid the
    others' curves (the speed-up figure was untied, the makespan one was not)."""
    rows = [{"clients": 20, "spread": s, "policy": p, "makespan_s": m, "feasible": True}
            for s in (0.0, 1.0) for p, m in (("optimizer", 1 + s), ("greedy", 1 + s), ("all-on-server", 5 + s))]
    monkeypatch.setattr(heterogeneity_sweep, "sweep", lambda cfg: rows)
    drawn: dict[str, list[Any]] = {}
    real = plots.line_plot

    def line_plot(series: list[Any], path: Path, **kw: Any) -> Path:
        drawn[Path(path).name] = series
        return real(series, path, **kw)

    monkeypatch.setattr(plots, "line_plot", line_plot)
    cfg = heterogeneity_sweep.Config(model="cnn", clients=(20,), spreads=(0.0, 1.0),
                                     policies=("optimizer", "greedy", "all-on-server"))
    heterogeneity_sweep.run(cfg, tmp_path)
    optimizer, greedy, alone = drawn["makespan_vs_spread_20.png"]
    assert optimizer.style.get("linestyle") != greedy.style.get("linestyle")
    assert optimizer.style.get("marker") != greedy.style.get("marker")
    assert alone.style == {}  # a curve that ties none: as it was


def test_a_run_of_one_round_has_its_round_as_the_only_tick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``variants.tiny`` (one round), or a run stopped after its first: the round axes read 0.945, 0.96, ..."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figs = saved_figures(monkeypatch)
    one = [_run("a", [0.5]), _run("b", [0.6])]
    plots.accuracy_per_round_plot(one, tmp_path / "a.png")
    plots.makespan_plot(one, tmp_path / "m.png")
    plots.bytes_plot(one, tmp_path / "b.png")
    plots.accuracy_per_round_plot([_run("a", [0.5, 0.6, 0.7])], tmp_path / "three.png")
    for fig in figs:
        FigureCanvasAgg(fig).draw()
    ticks = [[t.get_text() for t in fig.axes[0].get_xticklabels()] for fig in figs]
    assert ticks[:3] == [["1"]] * 3
    assert all(float(t.replace("\u2212", "-")).is_integer() for t in ticks[3])  # more rounds: whole numbers, as before


def test_runs_that_send_the_same_bytes_each_show_in_the_bytes_figure(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``sl``, ``sflv1`` and ``sflv2`` with the same cuts send the same bytes: every run's uplink had marker "o"
    of one size, so the last run's curve hid the others' (the variants experiment showed one of three)."""
    figs = saved_figures(monkeypatch)
    same = [rows_to_run([{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "bytes_up": 10**6, "bytes_down": 10**6}],
                        name) for name in ("sl", "sflv1", "sflv2")]
    plots.bytes_plot(same, tmp_path / "b.png")
    lines = {str(line.get_label()): line for line in figs[0].axes[0].get_lines()}
    ups = [lines[f"{name} up"] for name in ("sl", "sflv1", "sflv2")]
    assert len({line.get_marker() for line in ups}) == 3
    sizes = [line.get_markersize() for line in ups]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3  # each drawn inside the one before it


def test_results_csv_leaves_a_missing_number_empty_as_the_reports_csv_does(tmp_path: Path) -> None:
    """A run whose every round diverged has no best accuracy: results.json says null, summary.csv leaves the cell
    empty, and results.csv said ``nan`` (text to a spreadsheet)."""
    from simulations.common import write_results

    write_results(tmp_path, [{"label": "a", "best_accuracy": math.nan, "ratio": math.inf, "rounds": 2,
                              "time_to_target_s": None}])
    assert (tmp_path / "results.csv").read_text().splitlines() == [
        "label,best_accuracy,ratio,rounds,time_to_target_s", "a,,,2,"]


def test_results_csv_is_never_left_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write stopped part way (Ctrl-C, a full disk) left the header and the rows before it, the rest missing
    unseen; now the file there before stays whole."""
    import csv

    from simulations.common import write_csv

    (tmp_path / "results.csv").write_text("before\n")
    real = csv.DictWriter.writerow

    def writerow(self: Any, row: Any) -> Any:
        if row.get("n") == 2:
            raise KeyboardInterrupt
        return real(self, row)

    monkeypatch.setattr(csv.DictWriter, "writerow", writerow)
    with pytest.raises(KeyboardInterrupt):
        write_csv(tmp_path / "results.csv", [{"n": 1}, {"n": 2}])
    assert (tmp_path / "results.csv").read_text() == "before\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no draft left beside it


@pytest.mark.parametrize("value, threads", [("4,2", 4), (" 3 ", 3), ("abc", 1), ("", 1), ("0", 1)])
def test_an_openmp_thread_list_does_not_stop_an_experiment(monkeypatch: pytest.MonkeyPatch, value: str,
                                                           threads: int) -> None:
    """``OMP_NUM_THREADS=4,2`` (OpenMP's nested levels) stopped every experiment script with a ValueError."""
    import torch

    from simulations import common

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    told: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", told.append)
    common._threads()
    assert told == [threads]


def test_an_experiments_folder_is_refused_naming_its_run_folders(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """An experiment's ``--out`` holds its runs in ``runs/``: "not a run folder" alone left the user to find them."""
    exp = tmp_path / "exp"
    (exp / "runs").mkdir(parents=True)
    for name in ("adaptive", "static"):
        _folder(exp / "runs", ROW + "}", name=name)
    (exp / "results.json").write_text("{}")
    code, err = _report(exp, capsys)
    assert (code, err) == (2, f"splitfed report: error: {exp} is not a run folder: no metrics.jsonl in it; its run "
                              f"folders are below it: splitfed report {exp / 'runs'}/*\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _report(empty, capsys)[1] == f"splitfed report: error: {empty} is not a run folder: no metrics.jsonl in it\n"


@pytest.mark.parametrize("initial, drawn", [(0.1, True), (0, True), (math.nan, False), (10.0, False), (-0.5, False),
                                            (True, False), ("0.1", False)])
def test_an_initial_accuracy_is_drawn_only_when_it_is_one(initial: Any, drawn: bool) -> None:
    """A summary's ``initial_accuracy`` leads the curves at x = 0; a NaN, a percentage or a negative number was
    drawn too, off the axis the rounds share."""
    run = rows_to_run([{"round": 1, "accuracy": 0.5, "sim_round_s": 2.0}], "r", summary={"initial_accuracy": initial})
    xs, ys = plots._with_start(run, run.sim_time)
    assert (xs, ys) == (([0.0, 2.0], [initial, 0.5]) if drawn else ([2.0], [0.5]))


def test_one_run_of_many_that_cannot_be_read_says_how_to_report_the_others(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A glob over an experiment's runs meets one that crashed before its first round: the refusal named it, and
    left the user to find that leaving it out reports the rest."""
    good = _folder(tmp_path, '{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}', name="good")
    empty = _folder(tmp_path, name="empty")
    assert cli(["report", str(good), str(empty), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(f"{empty / 'metrics.jsonl'}: no rounds in it (leave it out to report the other 1)")
    with pytest.raises(ConfigError, match=r"no rounds in it$"):  # one run alone: nothing else to report
        runs.load_runs([empty])
