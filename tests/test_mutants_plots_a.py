"""What a mutation run of ``splitfed.report.plots`` found unwatched (``line_plot`` and the standard views of runs):
which series reach the legend and which the footnote, the dashes and hollow markers that tell series apart, the
reference lines' labels, a log y axis, the views' default titles and the drift line's place, the measured and
predicted round times, the megabytes drawn, the runs a footnote names as sending nothing, the bytes figure's
shrinking markers, and the heatmap's one panel of one cell per client and round at the least."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from splitfed.report import plots
from splitfed.report.plots import Series
from splitfed.report.runs import rows_to_run
from tests.plot_fixtures import saved_figures

NAN = math.nan


@pytest.fixture
def figs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure drawn, as saved (``_save`` is where each goes to its file)."""
    return saved_figures(monkeypatch)


def _lines(fig: Any) -> dict[str, Any]:
    return {str(line.get_label()): line for line in fig.axes[0].get_lines()}


def _legend(fig: Any) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def _notes(fig: Any) -> list[str]:
    return [t.get_text() for t in fig.texts]


def _plot(series: list[Series], tmp_path: Path, **kw: Any) -> None:
    plots.line_plot(series, tmp_path / "p.png", **{"title": "t", "xlabel": "x", "ylabel": "y", **kw})


def _rows(*rows: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"round": i + 1, "accuracy": 0.5, "sim_round_s": 1.0, **r} for i, r in enumerate(rows)]


# ---------------------------------------------------------------- line_plot


def test_a_series_without_a_drawable_point_is_named_in_the_footnote_never_in_the_legend(
        figs: list[Any], tmp_path: Path) -> None:
    """Round numbers with every accuracy NaN (a run that diverged) draw nothing: its x alone being finite does not
    make a point; the footnote names it after the caller's note, and a plot whose every series draws has none."""
    series = [Series("drawn", [1, 2], [0.5, 0.6]), Series("diverged", [1, 2], [NAN, NAN]), Series("none", [], [])]
    _plot(series, tmp_path)
    _plot(series, tmp_path, note="seed 3")
    _plot(series[:1], tmp_path)
    assert [_legend(f) for f in figs] == [["drawn"]] * 3
    assert [_notes(f) for f in figs] == [["no points: diverged, none"], ["seed 3; no points: diverged, none"], []]


def test_a_callers_note_is_the_footnote(figs: list[Any], tmp_path: Path) -> None:
    _plot([Series("a", [1], [1])], tmp_path, note="seeds 0-4")
    assert _notes(figs[0]) == ["seeds 0-4"]


def test_series_are_told_apart_by_dashes_every_second_and_hollow_markers_every_other(figs: list[Any],
                                                                                     tmp_path: Path) -> None:
    """Equal curves (two policies that agree) stay visible: the dash changes every two series, the marker is
    filled then hollow, by each series' place."""
    _plot([Series(f"s{i}", [1, 2], [1, 1]) for i in range(8)], tmp_path)
    lines = list(_lines(figs[0]).values())
    assert [x.get_linestyle() for x in lines] == ["-", "-", "--", "--", "-.", "-.", ":", ":"]
    assert [x.get_markerfacecolor() == "none" for x in lines] == [False, True] * 4
    assert [x.get_marker() for x in lines] == list(plots._MARKERS)


@pytest.mark.parametrize("kind", ["hline", "vline"])
def test_a_reference_line_is_drawn_and_named_by_its_label_else_its_value(figs: list[Any], tmp_path: Path,
                                                                         kind: str) -> None:
    _plot([Series("a", [1, 2], [0.5, 0.9])], tmp_path, **{kind: 0.75})
    _plot([Series("a", [1, 2], [0.5, 0.9])], tmp_path, **{kind: 0.75, f"{kind}_label": "target 0.75"})
    assert [_legend(f) for f in figs] == [["a", "0.75"], ["a", "target 0.75"]]
    assert all(_lines(f)["a"].get_linewidth() > 0 and list(f.axes[0].get_lines())[-1].get_linewidth() > 0
               for f in figs)  # a width of 0 drew a legend entry and no line


def test_the_y_axis_is_logarithmic_only_when_asked(figs: list[Any], tmp_path: Path) -> None:
    _plot([Series("a", [1, 2], [1, 100])], tmp_path)
    _plot([Series("a", [1, 2], [1, 100])], tmp_path, logy=True)
    assert [f.axes[0].get_yscale() for f in figs] == ["linear", "log"]


# ---------------------------------------------------------------- the standard views of runs


def test_accuracy_vs_time_and_makespan_have_their_default_titles_else_the_callers(figs: list[Any],
                                                                                  tmp_path: Path) -> None:
    runs = [rows_to_run(_rows({}, {}), "a")]
    plots.accuracy_vs_time_plot(runs, tmp_path / "a.png")
    plots.accuracy_vs_time_plot(runs, tmp_path / "b.png", title="mine")
    plots.makespan_plot(runs, tmp_path / "c.png")
    plots.makespan_plot(runs, tmp_path / "d.png", title="also mine")
    assert [f.axes[0].get_title() for f in figs] == ["Test accuracy vs simulated time", "mine",
                                                     "Simulated round time (makespan)", "also mine"]


def test_the_drift_line_falls_between_the_round_before_and_the_marked_round(figs: list[Any], tmp_path: Path) -> None:
    """Round 3 marked: the line at 2.5, named by the round; no round marked, none."""
    runs = [rows_to_run(_rows({}, {}, {}, {}), "a")]
    plots.makespan_plot(runs, tmp_path / "m.png", mark_round=3)
    plots.makespan_plot(runs, tmp_path / "n.png")
    line = _lines(figs[0])["change from round 3"]
    assert list(line.get_xdata()) == [2.5, 2.5]
    assert _legend(figs[0]) == ["a", "change from round 3"] and _legend(figs[1]) == ["a"]


def test_the_prediction_plot_draws_each_measured_round_beside_its_prediction(figs: list[Any], tmp_path: Path) -> None:
    """Rounds 1 and 2 measured with a prediction; round 3 predicted ``true`` (not a time) and round 4 without a
    prediction are left out."""
    rows = [{"round": 1, "accuracy": 0.5, "sim_round_s": None, "measured_round_s": 2.0, "predicted_round_s": 1.5},
            {"round": 2, "accuracy": 0.6, "sim_round_s": None, "measured_round_s": 3.0, "predicted_round_s": 4},
            {"round": 3, "accuracy": 0.7, "sim_round_s": None, "measured_round_s": 5.0, "predicted_round_s": True},
            {"round": 4, "accuracy": 0.8, "sim_round_s": None, "measured_round_s": 6.0}]
    plots.predicted_plot([rows_to_run(rows, "real")], tmp_path / "p.png")
    lines = _lines(figs[0])
    measured, predicted = lines["real: measured"], lines["real: predicted"]
    assert (list(measured.get_xdata()), list(measured.get_ydata())) == ([1, 2], [2.0, 3.0])
    assert (list(predicted.get_xdata()), list(predicted.get_ydata())) == ([1, 2], [1.5, 4.0])


def test_the_prediction_plot_of_one_round_has_its_round_as_the_only_tick(figs: list[Any], tmp_path: Path) -> None:
    rows = [{"round": 1, "accuracy": 0.5, "sim_round_s": None, "measured_round_s": 2.0, "predicted_round_s": 1.5}]
    plots.predicted_plot([rows_to_run(rows, "real")], tmp_path / "p.png")
    FigureCanvasAgg(figs[0]).draw()
    assert [t.get_text() for t in figs[0].axes[0].get_xticklabels()] == ["1"]


def test_bytes_are_drawn_in_megabytes(figs: list[Any], tmp_path: Path) -> None:
    """2e6 bytes up and 5e5 down per round: 2 and 0.5 MB a round, 2.5 and 5 MB in all against accuracy."""
    run = rows_to_run(_rows({"bytes_up": 2_000_000, "bytes_down": 500_000},
                            {"bytes_up": 2_000_000, "bytes_down": 500_000, "accuracy": 0.7}), "a")
    plots.bytes_plot([run], tmp_path / "b.png")
    plots.accuracy_vs_bytes_plot([run], tmp_path / "c.png")
    lines = _lines(figs[0])
    assert list(lines["a up"].get_ydata()) == [2.0, 2.0] and list(lines["a down"].get_ydata()) == [0.5, 0.5]
    assert list(_lines(figs[1])["a"].get_xdata()) == [2.5, 5.0]


def test_the_bytes_figure_draws_each_of_four_runs_markers_smaller_than_the_last(figs: list[Any],
                                                                                tmp_path: Path) -> None:
    """Runs with the same cuts send the same bytes: each marker drawn inside the one before it, none of size 0 or
    below (no marker at all)."""
    same = [rows_to_run(_rows({"bytes_up": 10**6, "bytes_down": 10**6}), f"r{i}") for i in range(4)]
    plots.bytes_plot(same, tmp_path / "b.png")
    lines = _lines(figs[0])
    for way in ("up", "down"):
        sizes = [lines[f"r{i} {way}"].get_markersize() for i in range(4)]
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 4 and min(sizes) > 0, (way, sizes)


def test_the_footnote_names_only_the_runs_that_sent_nothing(figs: list[Any], tmp_path: Path) -> None:
    """A run that sent bytes is not named; one with no rounds draws nothing (named as such), not as silent."""
    sender = rows_to_run(_rows({"bytes_up": 10**6}), "sender")
    silent = rows_to_run(_rows({}), "silent")
    empty = rows_to_run([], "empty")
    plots.accuracy_vs_bytes_plot([sender, silent, empty], tmp_path / "c.png")
    assert _notes(figs[0]) == ["no activation or gradient crossed a link: silent; no points: empty"]


# ---------------------------------------------------------------- the heatmap at its smallest


def _panels(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.images]


@pytest.mark.parametrize("rows", [
    [],  # no rounds at all
    [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"a": []}}],  # cuts all empty
    [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"a": [2]}}],  # one client, one round
], ids=["no-rounds", "empty-cuts", "one-cell"])
def test_the_smallest_heatmap_is_one_panel_of_one_cell(figs: list[Any], tmp_path: Path,
                                                       rows: list[dict[str, Any]]) -> None:
    """One client in one round is one cell, not a cell and a blank beside or below it; nothing to show is one
    blank panel, not two or a failure."""
    plots.cuts_heatmap(rows_to_run(rows, "r"), tmp_path / "h.png")
    assert [ax.images[0].get_array().shape for ax in _panels(figs[0])] == [(1, 1)]
