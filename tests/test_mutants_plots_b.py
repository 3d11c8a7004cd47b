"""What a mutation run of ``splitfed.report.plots`` found unwatched (the heatmap on, and the files): which colour
each cut is drawn in and the cell a blank is, where the columns sit, which rounds and clients are labelled and up
to how many, the colour bar's ticks, the names of the panels of chains of 4 tiers, nested output folders, the
file named by a write that failed part way, which ``cuts_*.png`` a report owns (and removes when stale), the
first point of a curve, long names kept whole when wrapped, and the slug of a run's file name."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg

from splitfed.report import plots
from splitfed.report.runs import rows_to_run
from tests.plot_fixtures import saved_figures


def _run(cuts_per_round: list[dict[str, list[int]]], label: str = "r", summary: dict[str, Any] | None = None) -> Any:
    rows = [{"round": i + 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": cuts}
            for i, cuts in enumerate(cuts_per_round)]
    return rows_to_run(rows, label, summary)


def _heatmap(monkeypatch: pytest.MonkeyPatch, run: Any, tmp_path: Path, **kw: Any) -> Any:
    """The heatmap's figure, as drawn and saved (``_save`` is where every figure goes to its file)."""
    figs = saved_figures(monkeypatch)
    plots.cuts_heatmap(run, tmp_path / "cuts.png", **kw)
    return figs[-1]


def _panels(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.images]


# ---------------------------------------------------------------- the heatmap's cells and colours


def test_each_cut_has_its_own_evenly_spaced_viridis_colour_and_a_blank_is_white(monkeypatch: pytest.MonkeyPatch,
                                                                                  tmp_path: Path) -> None:
    """Cuts 2..5: four colours, viridis at 0, 1/3, 2/3 and 1, in order (the lowest cut the darkest); a client
    that sat out a round is a white cell, not the colour of some cut."""
    run = _run([{"a": [2], "b": [3]}, {"a": [4], "b": [5]}, {"a": [5]}])
    im = _panels(_heatmap(monkeypatch, run, tmp_path))[0].images[0]
    data = im.get_array()
    assert data.tolist() == [[2, 4, 5], [3, 5, None]]  # clients a, b by rounds 1..3; b sat out round 3
    colours = im.to_rgba(data)
    want = {v: colormaps["viridis"](x) for v, x in zip((2, 3, 4, 5), np.linspace(0, 1, 4), strict=True)}
    for (i, j), v in np.ndenumerate(data.filled(-1)):
        expected = (1.0, 1.0, 1.0, 1.0) if v == -1 else want[int(v)]
        assert tuple(colours[i, j]) == pytest.approx(expected, abs=1e-6), (i, j, v)
    assert list(im.colorbar.get_ticks()) == [2, 3, 4, 5]


def test_cuts_that_are_all_empty_draw_a_bar_of_cuts_0_and_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing to colour: the bar reads 0 and 1 (the range a missing value is given), every cell blank."""
    fig = _heatmap(monkeypatch, _run([{"a": []}, {"a": []}]), tmp_path)
    im = _panels(fig)[0].images[0]
    assert list(im.colorbar.get_ticks()) == [0, 1]
    assert im.get_array().mask.all()


@pytest.mark.parametrize(("values", "ticks"), [(range(1, 13), list(range(1, 13))), (range(0, 13), list(range(0, 13, 2))),
                                               (range(2, 15), list(range(2, 15, 2)))],
                         ids=["twelve-cuts-each", "thirteen-every-second", "thirteen-from-2"])
def test_the_colour_bar_labels_every_cut_up_to_twelve_of_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             values: range, ticks: list[int]) -> None:
    """At most 12 ticks: twelve cuts (1..12) each have one, thirteen (0..12, 2..14) every second."""
    run = _run([{f"c{k}": [k] for k in values}])
    im = _panels(_heatmap(monkeypatch, run, tmp_path))[0].images[0]
    assert list(im.colorbar.get_ticks()) == ticks


def test_columns_and_rows_are_centred_on_their_ticks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Column j spans j-0.5..j+0.5 (its round's tick at j), row i likewise, client 0 at the top: an extent off by
    half a cell put every tick on a border between two rounds or two clients."""
    run = _run([{"a": [1, 3], "b": [2, 3], "c": [1, 4]}] * 4)
    fig = _heatmap(monkeypatch, run, tmp_path)
    for ax in _panels(fig):
        assert ax.images[0].get_extent() == [-0.5, 3.5, 2.5, -0.5]
        assert list(ax.get_xticks()) == [0, 1, 2, 3]
    assert list(_panels(fig)[0].get_yticks()) == [0, 1, 2]


@pytest.mark.parametrize(("n", "shown"), [(15, list(range(1, 16))), (16, list(range(1, 17, 2))),
                                          (30, list(range(1, 31, 2))), (31, list(range(1, 32, 3)))])
def test_at_most_15_rounds_are_labelled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n: int, shown: list[int]) -> None:
    """15 rounds: each labelled; 16: every second (8 labels), 31: every third (11)."""
    fig = _heatmap(monkeypatch, _run([{"a": [1]}] * n), tmp_path)
    ax = _panels(fig)[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(r) for r in shown]


@pytest.mark.parametrize(("max_labels", "labelled"), [(3, True), (4, True), (2, False)])
def test_clients_are_named_with_their_class_up_to_max_labels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             max_labels: int, labelled: bool) -> None:
    """Up to ``max_labels`` clients (3 of 3 included) each row is named, with its device class when that is not
    the name itself (``pi-1 (pi)``, but ``alpha``); more: each class's band once, at its middle, with its count
    (tests/test_report_scale.py)."""
    run = _run([{"pi-2": [1], "alpha": [2], "pi-1": [1]}])
    ax = _panels(_heatmap(monkeypatch, run, tmp_path, max_labels=max_labels))[0]
    if labelled:
        assert list(ax.get_yticks()) == [0, 1, 2]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["alpha", "pi-1 (pi)", "pi-2 (pi)"]
    else:
        assert list(ax.get_yticks()) == [0, 1.5]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["alpha (1)", "pi (2)"]


def test_one_row_of_panels_sharing_the_clients_axis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two cuts: two panels side by side and the colour bar, nothing else; the second panel shares the first's
    client axis, so it shows no numbers 0, 1, ... where the first names the clients."""
    fig = _heatmap(monkeypatch, _run([{"a": [1, 3], "b": [2, 4]}]), tmp_path)
    assert len(fig.axes) == 3  # two panels and the colour bar
    first, second = _panels(fig)
    assert first.get_subplotspec().rowspan == second.get_subplotspec().rowspan
    assert first.get_shared_y_axes().joined(first, second)
    FigureCanvasAgg(fig).draw()
    assert not any(t.get_visible() and t.get_text() for t in second.get_yticklabels())


def test_each_panels_title_has_room(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The figure is made wide enough for the panels' titles (``cut 1: device | edge``...) on a run of few rounds:
    no title runs into its neighbour's."""
    run = _run([{"a": [1, 3, 5], "b": [2, 4, 6]}] * 2, summary={"settings": {"tiers": 3}})
    fig = _heatmap(monkeypatch, run, tmp_path)
    FigureCanvasAgg(fig).draw()
    boxes = [ax.title.get_window_extent() for ax in _panels(fig)]
    assert [ax.get_title() for ax in _panels(fig)] == ["cut 1: device | edge", "cut 2: edge | cloud",
                                                      "cut 3: cloud | device (tail)"]
    for a, b in zip(boxes, boxes[1:], strict=False):
        assert a.x1 < b.x0


# ---------------------------------------------------------------- panel names


@pytest.mark.parametrize(("cut", "titles"), [
    ([1, 3, 5], ["cut 1: device | tier 2", "cut 2: tier 2 | tier 3", "cut 3: tier 3 | tier 4"]),
    ([1, 3, 5, 7], ["cut 1: device | tier 2", "cut 2: tier 2 | tier 3", "cut 3: tier 3 | tier 4",
                    "cut 4: tier 4 | device (tail)"]),
], ids=["4-tiers", "4-tiers-u-shape"])
def test_a_chain_of_four_tiers_names_tiers_2_to_4(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cut: list[int],
                                                 titles: list[str]) -> None:
    run = _run([{"a": cut}], summary={"settings": {"tiers": 4}})
    assert [ax.get_title() for ax in _panels(_heatmap(monkeypatch, run, tmp_path))] == titles


def test_a_settings_tiers_of_1_is_no_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``tiers: 1`` (hand-edited; a chain has 2 at least) is ignored: one cut is device | server, not a
    "device | device (tail)" of a one-tier chain."""
    run = _run([{"a": [2]}], summary={"settings": {"tiers": 1}})
    assert [ax.get_title() for ax in _panels(_heatmap(monkeypatch, run, tmp_path))] == ["cut 1: device | server"]


# ---------------------------------------------------------------- files


def test_figures_go_into_folders_that_do_not_exist_yet(tmp_path: Path) -> None:
    run = _run([{"a": [1]}, {"a": [2]}])
    assert plots.cuts_heatmap(run, tmp_path / "x" / "y" / "h.png").is_file()
    made = plots.standard_plots([run], tmp_path / "a" / "b" / "out")
    assert all(p.is_file() and p.parent == tmp_path / "a" / "b" / "out" for p in made.values())


def test_a_write_that_failed_part_way_names_the_figure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A full disk raises an OSError that names no file: the report names the figure it was drawing; an error that
    names its own file keeps it, and one that is no OSError is passed on as it was."""
    run = _run([{"a": [1]}])
    out = tmp_path / "out"

    def full(*_: Any, **__: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plots, "accuracy_vs_time_plot", full)
    with pytest.raises(OSError) as e:
        plots.draw_standard_plots([run], out)
    assert e.value.filename == str(out / "accuracy_vs_time.png")

    def named(*_: Any, **__: Any) -> Any:
        raise OSError(errno.EACCES, "Permission denied", "/somewhere/else.png")

    monkeypatch.setattr(plots, "accuracy_vs_time_plot", named)
    with pytest.raises(OSError) as e:
        plots.draw_standard_plots([run], out)
    assert e.value.filename == "/somewhere/else.png"

    def other(*_: Any, **__: Any) -> Any:
        raise ValueError("bad")

    monkeypatch.setattr(plots, "accuracy_vs_time_plot", other)
    with pytest.raises(ValueError) as v:
        plots.draw_standard_plots([run], out)
    assert not hasattr(v.value, "filename")
    assert list(out.iterdir()) == []  # no draft left behind


def test_only_the_heatmaps_a_report_names_are_its_own(tmp_path: Path) -> None:
    """``cuts_N_SLUG.png`` (N from 1, SLUG a slug) is a report's; the user's ``cuts_overview.png``,
    ``cuts_1_my figure.png`` (a space: no slug), ``cuts_0_a.png`` and ``cuts_01_a.png`` are not, and stay."""
    ours = ["cuts_1_a.png", "cuts_12_run-x.v2.png", "cuts_3_3.png"]
    theirs = ["cuts_overview.png", "cuts_1_my figure.png", "cuts_0_a.png", "cuts_01_a.png", "cuts_2_.png"]
    for name in ours + theirs:
        (tmp_path / name).write_bytes(b"png")
    assert plots.run_plot_files(tmp_path) == [*(tmp_path / n for n in sorted(ours)),
                                              tmp_path / "predicted_vs_measured.png"]
    plots.remove_stale_plots(tmp_path, [tmp_path / "cuts_1_a.png"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["cuts_1_a.png", *theirs])


def test_the_measured_vs_predicted_figure_only_for_runs_with_predictions(tmp_path: Path) -> None:
    sim = _run([{"a": [1]}])
    rows = [{"round": 1, "accuracy": 0.5, "sim_round_s": None, "measured_round_s": 2.0, "predicted_round_s": 1.5}]
    dep = rows_to_run(rows, "dep")
    assert tmp_path / "predicted_vs_measured.png" not in plots.standard_plot_files([sim], tmp_path)
    assert tmp_path / "predicted_vs_measured.png" in plots.standard_plot_files([sim, dep], tmp_path)


@pytest.mark.parametrize(("label", "want"), [
    ("a b/c-d.e_f", "a_b_c-d.e_f"), ("x" * 70, "x" * 60), ("y" * 59 + "-z", "y" * 59 + "-"), ("", "run"),
])
def test_a_runs_file_name_is_its_label_in_at_most_60_safe_characters(label: str, want: str) -> None:
    assert plots.slug(label) == want


# ---------------------------------------------------------------- curves


@pytest.mark.parametrize(("initial", "first"), [(1.0, (0.0, 1.0)), (0, (0.0, 0.0)), (1.5, None), (2, None)])
def test_a_curve_starts_at_the_accuracy_before_training_when_it_is_one(initial: float, first: Any) -> None:
    """An initial accuracy of exactly 1 (or 0) is drawn at time 0; 1.5 or 2 (a percentage?) is not an accuracy."""
    run = _run([{"a": [1]}, {"a": [1]}], summary={"initial_accuracy": initial})
    xs, ys = plots._with_start(run, run.sim_time)
    if first is None:
        assert (xs, ys) == ([1.0, 2.0], [0.5, 0.5])
    else:
        assert (xs[0], ys[0]) == first and len(xs) == 3


def test_a_long_name_wrapped_in_the_legend_keeps_its_spaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken into lines after a space: the lines joined give the name back (no space dropped at a break)."""
    figs = saved_figures(monkeypatch)
    name = "policy " * 10 + "end"
    plots.accuracy_per_round_plot([_run([{"a": [1]}], name)], tmp_path / "a.png")
    (text,) = [t.get_text() for t in figs[0].axes[0].get_legend().get_texts()]
    assert "\n" in text and text.replace("\n", "") == name
