"""The report at fleet scale: the heatmap of 100 clients names its rows (one tick per device class band, or every
n-th client when the classes are as many), names sort naturally everywhere they are listed (the class table, the
progress line's moved clients: client2 before client10, as the heatmap has them), the accuracy-per-round figure
starts at the accuracy before training as the other accuracy figures do, and ``--fraction``'s help says that
greedy and adaptive cuts refuse one below 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import server.app
from splitfed.cli import main
from splitfed.report import plots
from splitfed.report.runs import rows_to_run
from splitfed.report.table import class_table
from tests.plot_fixtures import saved_figures

README = Path(__file__).resolve().parents[1] / "README.md"


def _run(clients: list[str], classes: dict[str, str] | None = None, rounds: int = 2,
         summary: dict[str, Any] | None = None) -> Any:
    rows = [{"round": i + 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {c: [2] for c in clients}}
            for i in range(rounds)]
    return rows_to_run(rows, "r", {"classes": classes or {}, **(summary or {})})


def _heatmap_panel(monkeypatch: pytest.MonkeyPatch, run: Any, tmp_path: Path) -> Any:
    figs = saved_figures(monkeypatch)
    plots.cuts_heatmap(run, tmp_path / "cuts.png")
    return next(ax for ax in figs[-1].axes if ax.images)


def _first_column(table: str) -> list[str]:
    """The first cell of each row of a printed table (after its title, headers and rule)."""
    return [line.split()[0] for line in table.splitlines()[3:]]


# ---------------------------------------------------------------- the heatmap of many clients


def test_a_heatmap_of_100_clients_names_each_class_band_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Above 40 clients no row had a name; now each class has one tick at the middle of its band, with its count,
    and a thin line between bands, the rows staying where they were."""
    clients = [f"client{i}" for i in range(100)]
    classes = {c: "pi-sat" if i < 30 else "phone" for i, c in enumerate(clients)}
    ax = _heatmap_panel(monkeypatch, _run(clients, classes), tmp_path)
    assert list(ax.get_yticks()) == [34.5, 84.5]  # phone rows 0..69, then pi-sat rows 70..99
    assert [t.get_text() for t in ax.get_yticklabels()] == ["phone (70)", "pi-sat (30)"]
    assert [tuple(line.get_ydata()) for line in ax.get_lines()] == [(69.5, 69.5)]
    assert ax.get_ylim() == (99.5, -0.5)


def test_a_heatmap_of_more_classes_than_labels_names_every_nth_client(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """100 clients, each its own class (no fleet recorded): every third row named, in natural order."""
    ax = _heatmap_panel(monkeypatch, _run([f"client{i}" for i in range(100)]), tmp_path)
    assert list(ax.get_yticks()) == list(range(0, 100, 3))
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"client{i}" for i in range(0, 100, 3)]
    assert ax.get_lines() == []


# ---------------------------------------------------------------- natural order


def test_the_class_table_lists_classes_in_natural_order() -> None:
    """client0, client1, client2, ..., client10, client11: text order put client10 and client11 after client1."""
    table = class_table(_run([f"client{i}" for i in range(12)]))
    assert _first_column(table) == [f"client{i}" for i in range(12)]


def test_the_class_table_and_heatmap_order_numbered_class_names_naturally() -> None:
    classes = {"a": "tier10", "b": "tier2", "c": "tier1"}
    run = _run(list(classes), classes)
    assert run.clients == ["c", "b", "a"]
    assert _first_column(class_table(run)) == ["tier1", "tier2", "tier10"]


def test_the_progress_line_names_the_first_moved_clients_in_natural_order() -> None:
    moved = {f"client{i}": ([7, 7], [0, 7]) for i in (10, 1, 2, 0, 11)}
    line = server.app._moved({"moved": moved}, {"client0": "phone-mid-0"})
    assert line == "  moved 5: client0 (phone-mid-0) 7,7 -> 0,7, client1 7,7 -> 0,7, client2 7,7 -> 0,7, +2 more"


# ---------------------------------------------------------------- accuracy per round starts before training


@pytest.mark.parametrize(("summary", "row_extra", "points"), [
    ({"initial_accuracy": 0.1}, {}, ([0.0, 1.0, 2.0], [0.1, 0.5, 0.6])),
    ({}, {"initial_accuracy": 0.2}, ([0.0, 1.0, 2.0], [0.2, 0.5, 0.6])),  # a run cut short: round 1's row has it
    ({}, {}, ([1.0, 2.0], [0.5, 0.6])),  # none recorded: nothing made up
], ids=["summary", "first-row", "none"])
def test_accuracy_per_round_starts_at_round_0_with_the_initial_accuracy(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, summary: dict[str, Any], row_extra: dict[str, Any],
        points: tuple[list[float], list[float]]) -> None:
    rows = [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, **row_extra},
            {"round": 2, "accuracy": 0.6, "sim_round_s": 1.0}]
    figs = saved_figures(monkeypatch)
    plots.accuracy_per_round_plot([rows_to_run(rows, "r", summary)], tmp_path / "a.png")
    (line,) = figs[-1].axes[0].get_lines()
    assert (list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))) == points


# ---------------------------------------------------------------- --fraction with greedy or adaptive cuts


def test_the_fraction_help_says_greedy_and_adaptive_refuse_one_below_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("--fraction FRACTION share of clients sampled per round (default 1; --cuts greedy and adaptive plan "
            "for every client in every round and refuse one below 1)") in text


@pytest.mark.parametrize("cuts", ["greedy", "adaptive"])
def test_greedy_and_adaptive_cuts_refuse_a_fraction_below_1_as_the_help_says(
        cuts: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--cuts", cuts, "--fraction", "0.5", "--rounds", "1", "--out", "unused"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"splitfed simulate: error: cuts {cuts} plans for every client in every round: use fraction 1")
    assert list(tmp_path.iterdir()) == []  # refused before any run folder was made


def test_the_readme_says_so_beside_fraction() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert ("`--fraction F` (the share of clients sampled per round, default 1; `greedy` and `adaptive` plan for "
            "every client in every round and refuse one below 1)") in text
