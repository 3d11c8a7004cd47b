"""Run folders, tables, figures and ``splitfed report``, on small hand-made runs (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from splitfed.cli import main as cli
from splitfed.commands.report import MANIFEST
from splitfed.errors import ConfigError
from splitfed.flower.metrics import MetricsWriter, read_rows
from splitfed.report import plots
from splitfed.report.runs import load_run, load_runs, parse_row, rows_to_run, write_run
from splitfed.report.summary import markdown_table, summary_markdown, summary_rows
from splitfed.report.table import cut_mix, end_of_run, format_table


def make_rows(rounds: int = 5, step_s: float = 2.0, moving: bool = False) -> list[dict]:
    """Rows as the ServerApp writes them (per_client profiles give the device classes)."""
    profiles = {"client0": "pi-home-0", "client1": "pi-home-1", "client2": "phone-mid-0"}
    rows = []
    for r in range(1, rounds + 1):
        cuts = {c: [1 + (r > 2 and moving and c == "client2"), 5] for c in profiles}
        rows.append({"round": r, "accuracy": 1 - 0.5 ** r, "loss": 0.5 ** r, "wall_s": 0.25, "sim_round_s": step_s,
                     "bytes_up": 1000 * r, "bytes_down": 500 * r, "cuts": cuts, "clients": 3, "failed": [],
                     "per_client": {c: {"profile": p, "cuts": cuts[c]} for c, p in profiles.items()}})
    return rows


def valid_png(path: Path) -> tuple[int, int]:
    assert path.is_file() and path.stat().st_size > 1000, path
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size


# ---------------------------------------------------------------- reading


def test_load_run_round_trip(tmp_path: Path) -> None:
    write_run(tmp_path / "a", make_rows(), {"label": "static"})
    run = load_run(tmp_path / "a")
    assert run.label == "static"
    assert [r.round for r in run.rounds] == [1, 2, 3, 4, 5]
    assert run.sim_time == pytest.approx([2, 4, 6, 8, 10])
    assert run.cum_bytes == pytest.approx([1500, 4500, 9000, 15000, 22500])
    assert run.rounds[0].cuts["client2"] == (1, 5)
    assert run.classes == {"client0": "pi-home", "client1": "pi-home", "client2": "phone-mid"}
    assert run.clients == ["client2", "client0", "client1"]  # grouped by class
    assert run.rounds[0].extra["clients"] == 3  # unknown keys are kept


def test_time_and_rounds_to_target() -> None:
    run = rows_to_run(make_rows(), "r")
    assert run.time_to_target(0.9) == pytest.approx(8.0)  # 1 - 0.5**4 = 0.9375 in round 4
    assert run.rounds_to_target(0.9) == 4
    assert run.time_to_target(0.999) is None and run.rounds_to_target(0.999) is None


def test_rows_out_of_order_are_sorted_and_lists_of_cuts_accepted() -> None:
    rows = [{"round": 2, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": [[1, 2], [3, 4]]},
            {"round": 1, "accuracy": 0.4, "sim_round_s": 1.0, "cuts": [[1, 2], [3, 4]]}]
    run = rows_to_run(rows)
    assert [r.round for r in run.rounds] == [1, 2]
    assert run.rounds[0].cuts == {"0": (1, 2), "1": (3, 4)}


def test_deployment_rows_use_measured_round_time() -> None:
    row = parse_row({"round": 1, "accuracy": 0.5, "sim_round_s": None, "measured_round_s": 3.5})
    assert row.sim_round_s == 3.5


@pytest.mark.parametrize("row,match", [
    ({"accuracy": 0.5, "sim_round_s": 1.0}, "missing 'round'"),
    ({"round": 1, "accuracy": "high", "sim_round_s": 1.0}, "'accuracy' must be a number"),
    ({"round": 1.5, "accuracy": 0.5, "sim_round_s": 1.0}, "'round' must be a non-negative integer"),
    ({"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"c": ["a"]}}, "cuts of client 'c'"),
    # a colour (and before, a colour-bar tick) per cut value: 100,000 hung the report, 10**23 crashed it half way
    ({"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"a": [0], "b": [100000]}},
     r"cuts of client 'b' must lie in 0..10,000 \(blocks before each cut\), got \[100000\]"),
    ({"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"a": [10**23]}}, "cuts of client 'a' must lie in"),
    ({"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {"a": [-1, 2]}}, "cuts of client 'a' must lie in"),
])
def test_bad_rows_are_named(row: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_row(row)


def test_bad_files_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a run folder"):
        load_run(tmp_path / "empty")
    d = tmp_path / "broken"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps(make_rows(1)[0]) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: not valid JSON"):
        load_run(d)


@given(st.lists(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=8), st.none()),
                                max_size=3), min_size=1, max_size=5), st.data())
def test_a_metrics_file_cut_anywhere_reads_as_its_complete_rows(tmp_path_factory, rows, data) -> None:  # type: ignore[no-untyped-def]
    """A crash (or a reader racing the writer) can cut the last append anywhere: the rows before it are read,
    never an error; the cut row at most comes whole."""
    folder = tmp_path_factory.mktemp("m")
    writer = MetricsWriter(folder)
    for r in rows:
        writer.append(r)
    raw = writer.path.read_bytes()
    cut = data.draw(st.integers(0, len(raw)))
    writer.path.write_bytes(raw[:cut])
    got = read_rows(writer.path)
    whole = raw[:cut].count(b"\n")
    assert got in (rows[:whole], rows[:whole + 1])


def test_report_reads_a_run_whose_last_row_was_cut_short(tmp_path: Path) -> None:
    rows = make_rows(3)
    write_run(tmp_path / "run", rows)
    raw = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    (tmp_path / "run" / "metrics.jsonl").write_bytes(raw[:-20])
    assert [r.round for r in load_run(tmp_path / "run").rounds] == [1, 2]


def test_report_names_an_output_folder_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "run", make_rows(2))
    (tmp_path / "file").write_text("x")
    assert cli(["report", str(tmp_path / "run"), "--out", str(tmp_path / "file" / "report")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splitfed report: error: cannot write the report to ") and "Traceback" not in err
    from splitfed.commands.report import default_out

    assert default_out([Path("/a/x"), Path("/b/y")]) == Path("report")  # not /report
    assert default_out([tmp_path / "a", tmp_path / "b"]) == tmp_path.resolve() / "report"
    assert cli(["report", str(tmp_path / "run"), "--out", ""]) == 2  # before: the default folder, silently
    assert "--out is empty" in capsys.readouterr().err and not (tmp_path / "run" / "report").exists()


@pytest.mark.parametrize("blocked", ["summary.md", "rounds.csv", "cuts_1_run.png"])
def test_report_refuses_before_writing_anything_when_an_output_is_a_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], blocked: str) -> None:
    write_run(tmp_path / "run", make_rows(2, moving=True))
    out = tmp_path / "out"
    (out / blocked).mkdir(parents=True)
    (out / "keep.txt").write_text("x")
    assert cli(["report", str(tmp_path / "run"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"splitfed report: error: cannot write the report to {out}: {blocked} there is a folder "
                   "(move it away, or give another --out)\n"), err
    assert sorted(p.name for p in out.iterdir()) == sorted([blocked, "keep.txt"])  # before: the PNGs were written
    assert not any((out / blocked).iterdir())
    (out / blocked).rmdir()
    assert cli(["report", str(tmp_path / "run"), "--out", str(out)]) == 0
    made = {p.name for p in out.iterdir()} - {"keep.txt", MANIFEST}
    runs = load_runs([tmp_path / "run"])
    assert made == {"summary.md", "summary.csv", "rounds.csv", *(p.name for p in plots.standard_plot_files(runs, out))}
    assert blocked in made


def test_a_figure_that_fails_to_draw_leaves_the_report_folder_as_it_was(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    write_run(tmp_path / "run", make_rows(2, moving=True))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")

    def fails(*args: object, **kwargs: object) -> None:
        raise ValueError("x and y arguments to pcolormesh cannot have non-finite values")

    monkeypatch.setattr(plots, "cuts_heatmap", fails)  # drawn after the others: they were already in place
    with pytest.raises(ValueError, match="non-finite"):
        cli(["report", str(tmp_path / "run"), "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_clashing_labels_are_made_unique(tmp_path: Path) -> None:
    write_run(tmp_path / "x" / "run", make_rows(2))
    write_run(tmp_path / "y" / "run", make_rows(2))
    labels = [r.label for r in load_runs([tmp_path / "x" / "run", tmp_path / "y" / "run"])]
    assert labels == ["x/run", "y/run"]


# ---------------------------------------------------------------- tables


def test_format_table_aligns_numbers_right() -> None:
    text = format_table(["name", "value"], [["a", 1.5], ["bbb", 10.25], ["c", math.nan]])
    lines = text.splitlines()
    assert lines[0].split() == ["name", "value"]
    assert lines[2].endswith(" 1.50") and lines[3].endswith("10.25") and lines[4].endswith("-")


def test_a_columns_floats_read_alike_in_the_terminal_and_in_markdown() -> None:
    """Before, each cell had its own decimals by its magnitude: accuracy 1.0 read ``1.00`` beside ``0.9972``
    (and 0.0 ``0``). Now a column's floats take the decimals of the one that takes the most; integers, none,
    and what 3 significant digits write stay as they were."""
    rows = [["a", 1.0, 0.0, 3], ["b", 0.9972, 12.5, None], ["c", 0.5, 2e-4, 7]]
    lines = format_table(["run", "final accuracy", "s", "n"], rows).splitlines()
    assert [line.split() for line in lines[2:]] == [["a", "1.0000", "0.00", "3"], ["b", "0.9972", "12.50", "-"],
                                                    ["c", "0.5000", "0.0002", "7"]]
    md = markdown_table(["run", "final accuracy", "s", "n"], rows).splitlines()
    assert md[2:] == ["| a | 1.0000 | 0.00 | 3 |", "| b | 0.9972 | 12.50 | - |", "| c | 0.5000 | 0.0002 | 7 |"]
    assert format_table(["x"], [[1.0], [2.25]]).splitlines()[2:] == ["1.00", "2.25"]  # none below 1: 2 decimals
    # a row shorter than the others: each cell stays in its own row (a column was read without the short rows'
    # places, so the cells below a short row moved up one)
    ragged = format_table(["run", "acc", "s"], [["a", 1.0], ["b", 0.9972, 2.5], ["c", 0.5, 0.25]]).splitlines()
    assert [line.split() for line in ragged[2:]] == [["a", "1.0000"], ["b", "0.9972", "2.5000"],
                                                     ["c", "0.5000", "0.2500"]]


def test_cut_mix_counts_most_common_first() -> None:
    assert cut_mix([(2, 5), (1, 3), (2, 5)]) == "2,5 x2; 1,3"
    assert cut_mix([]) == "-"


def test_end_of_run_table_has_rounds_and_classes() -> None:
    text = end_of_run(make_rows(moving=True), label="main")
    assert "main: rounds" in text and "main: cuts per device class" in text
    assert "sim round s" in text and "MB up" in text
    classes = text.split("cuts per device class")[1]
    assert "pi-home" in classes and "1,5 x2" in classes
    assert "phone-mid" in classes and "2,5" in classes  # moved by round 5


def test_one_round_has_one_cuts_column() -> None:
    """Before: ``cuts round 1  cuts round 1`` (the first and the last round were the same one)."""
    classes = end_of_run(make_rows(1)).split("cuts per device class")[1]
    assert classes.count("cuts round 1") == 1 and classes.count("1,5 x2") == 1, classes
    two = end_of_run(make_rows(2)).split("cuts per device class")[1]
    assert "cuts round 1" in two and "cuts round 2" in two


def test_a_client_that_failed_every_round_keeps_its_device_class() -> None:
    """It has no per_client measurement; the row's profiles still name its device."""
    rows = make_rows(2)
    for r in rows:
        del r["per_client"]["client2"]
        r["failed"], r["profiles"] = ["client2"], {"client0": "pi-home-0", "client1": "pi-home-1",
                                                    "client2": "phone-mid-0"}
    classes = end_of_run(rows).split("cuts per device class")[1]
    assert "phone-mid" in classes and "client2" not in classes


def test_end_of_run_explicit_classes_win() -> None:
    text = end_of_run(make_rows(2), classes={"client0": "laptop"})
    assert "laptop" in text


def test_markdown_summary() -> None:
    runs = [rows_to_run(make_rows(step_s=2.0), "static"), rows_to_run(make_rows(step_s=1.0), "adaptive")]
    headers, rows = summary_rows(runs, target=0.9)
    assert headers[-2:] == ["sim s to 0.9", "rounds to 0.9"]
    assert rows[0][-2:] == [pytest.approx(8.0), 4] and rows[1][-2:] == [pytest.approx(4.0), 4]
    table = markdown_table(headers, rows)
    assert table.splitlines()[1].startswith("|:---|---:")
    md = summary_markdown(runs, 0.9, {"accuracy": "acc.png"})
    assert "| static | - | - | - | 5 |" in md and "![accuracy](acc.png)" in md


# ---------------------------------------------------------------- figures


def test_standard_plots_are_valid_pngs(tmp_path: Path) -> None:
    runs = [rows_to_run(make_rows(step_s=2.0), "static"), rows_to_run(make_rows(step_s=1.0, moving=True), "adaptive")]
    made = plots.standard_plots(runs, tmp_path, target=0.9)
    assert {"accuracy vs simulated time", "makespan per round", "bytes per round", "accuracy vs bytes",
            "cuts: static", "cuts: adaptive"} <= set(made)
    for p in made.values():
        w, h = valid_png(p)
        assert w > 300 and h > 200


def test_heatmap_with_clients_missing_from_rounds(tmp_path: Path) -> None:
    rows = make_rows(4)
    del rows[1]["cuts"]["client1"]  # client1 sat out round 2
    p = plots.cuts_heatmap(rows_to_run(rows, "partial"), tmp_path / "h.png")
    valid_png(p)


@pytest.mark.parametrize(("cuts", "ticks"), [([7], [7]), ([0, 3], [0, 1, 2, 3]), ([0, 40], list(range(0, 41, 4)))])
def test_heatmap_colour_bar_ticks_are_whole_cuts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuts, ticks) -> None:  # type: ignore[no-untyped-def]
    """One cut for every client gave ticks 6.5, 6.6, ... 7.5 on a bar labelled "cut"."""
    from matplotlib.figure import Figure

    seen: list[list[float]] = []
    colorbar = Figure.colorbar

    def keeping(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(kwargs["ticks"]))
        return colorbar(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "colorbar", keeping)
    rows = [{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {f"c{i}": [k] for i, k in enumerate(cuts)}}]
    valid_png(plots.cuts_heatmap(rows_to_run(rows, "one"), tmp_path / "h.png"))
    assert seen == [ticks]


def test_a_report_again_into_its_folder_leaves_only_its_own_runs_figures(tmp_path: Path) -> None:
    """A heatmap is named by its run's place in the list: a second report of fewer runs left the first one's
    heatmaps beside its own."""
    for name in ("a", "b", "c"):
        write_run(tmp_path / name, make_rows(2, moving=True))
    out = tmp_path / "out"
    assert cli(["report", *(str(tmp_path / n) for n in "abc"), "--out", str(out)]) == 0
    assert len(list(out.glob("cuts_*.png"))) == 3
    assert cli(["report", str(tmp_path / "c"), "--out", str(out)]) == 0
    runs = load_runs([tmp_path / "c"])
    assert sorted(out.glob("cuts_*.png")) == sorted(p for p in plots.standard_plot_files(runs, out)
                                                   if p.name.startswith("cuts_"))


def test_heatmap_two_tiers_many_clients(tmp_path: Path) -> None:
    rows = [{"round": r, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": {f"dev-{i}": [i % 4] for i in range(60)}}
            for r in (1, 2, 3)]
    valid_png(plots.cuts_heatmap(rows_to_run(rows, "fleet"), tmp_path / "h.png"))


def test_line_plot_with_reference_lines(tmp_path: Path) -> None:
    p = plots.line_plot([plots.Series("a", [1, 10, 100], [3, 2, 1])], tmp_path / "l.png", title="t",
                        xlabel="x", ylabel="y", logx=True, logy=True, hline=1.5, vline=10)
    valid_png(p)
    p = plots.line_plot([plots.Series("a", [1, 2], [1, 2]), plots.Series("none", [], [])], tmp_path / "e.png",
                        title="t", xlabel="x", ylabel="y", integer_x=True, note="a note")
    valid_png(p)


# ---------------------------------------------------------------- the command


def test_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "runs" / "static", make_rows(step_s=2.0), {"label": "static"})
    write_run(tmp_path / "runs" / "adaptive", make_rows(step_s=1.0, moving=True), {"label": "adaptive"})
    rc = cli(["report", str(tmp_path / "runs" / "static"), str(tmp_path / "runs" / "adaptive"), "--target", "0.9"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "static" in out and "adaptive" in out and "sim s to 0.9" in out
    report = tmp_path / "runs" / "report"  # common parent
    md = (report / "summary.md").read_text()
    assert "| adaptive |" in md
    for name in ("accuracy_vs_time.png", "makespan.png", "bytes.png", "accuracy_vs_bytes.png"):
        valid_png(report / name)
        assert f"({name})" in md
    # the same numbers as CSV, unrounded: one row per run, one per (run, round)
    import csv

    summary = list(csv.DictReader((report / "summary.csv").open()))
    assert [r["run"] for r in summary] == ["static", "adaptive"]
    assert float(summary[1]["sim time s"]) == 5.0 and float(summary[0]["final accuracy"]) == 1 - 0.5 ** 5
    assert summary[0]["sim s to 0.9"] == "8.0" and summary[1]["rounds to 0.9"] == "4"
    rounds = list(csv.DictReader((report / "rounds.csv").open()))
    assert len(rounds) == 10 and [r["round"] for r in rounds[:5]] == ["1", "2", "3", "4", "5"]
    mine = [r for r in rounds if r["run"] == "adaptive"]
    assert [float(r["sim_time_s"]) for r in mine] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [int(r["bytes_total"]) for r in mine] == [1500 * k for k in range(1, 6)] and mine[0]["clients"] == "3"


def test_report_command_single_run_default_out(tmp_path: Path) -> None:
    write_run(tmp_path / "one", make_rows(3))
    assert cli(["report", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "report" / "summary.md").is_file()


def test_report_command_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["report", str(tmp_path), "--target", "2"])


def test_csv_leaves_missing_numbers_empty(tmp_path: Path) -> None:
    import csv

    from splitfed.report.summary import write_csv

    rows = make_rows(2)
    rows[1]["loss"] = None  # a diverged model's loss is written as null
    write_run(tmp_path / "r", rows)
    write_csv([load_run(tmp_path / "r")], tmp_path / "out")
    got = list(csv.DictReader((tmp_path / "out" / "rounds.csv").open()))
    assert got[0]["loss"] == "0.5" and got[1]["loss"] == ""


@pytest.mark.parametrize("change, words", [
    ({"accuracy": 1.7}, r"'accuracy' must be in \[0, 1\], got 1.7"),
    ({"accuracy": -0.1}, r"'accuracy' must be in \[0, 1\]"),
    ({"bytes_up": -5}, r"'bytes_up' must be >= 0, got -5"),
    ({"sim_round_s": -1.0}, r"'sim_round_s' must be >= 0"),
    ({"round": 1}, r"round\(s\) 1 appear more than once"),  # before: counted twice in the totals
])
def test_rows_no_run_writes_are_refused(change, words) -> None:  # type: ignore[no-untyped-def]
    rows = make_rows(3)
    rows[2] = {**rows[2], **change}
    with pytest.raises(ConfigError, match=words):
        rows_to_run(rows, "run")


def test_a_diverged_rounds_null_accuracy_is_kept_and_one_run_is_not_reported_twice(tmp_path: Path) -> None:
    rows = make_rows(2)
    rows[1] = {**rows[1], "accuracy": None}
    assert math.isnan(rows_to_run(rows, "run").rounds[1].accuracy)
    write_run(tmp_path / "run", make_rows(2))
    with pytest.raises(ConfigError, match="is the same run as"):
        load_runs([tmp_path / "run", tmp_path / "x" / ".." / "run"])


# ---------------------------------------------------------------- found by a user audit


def _report_runs_column(report: Path) -> list[str]:
    import csv

    return [r["run"] for r in csv.DictReader((report / "summary.csv").open())]


def test_report_again_on_the_same_glob_leaves_its_own_output_folder_out(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``splitfed report runs/*`` writes runs/report; before, the same command again globbed that folder in
    and was refused: "runs/report is not a run folder: no metrics.jsonl in it", rc 2."""
    runs = tmp_path / "runs"
    write_run(runs / "a", make_rows(2), {"label": "a"})
    write_run(runs / "b", make_rows(2), {"label": "b"})
    assert cli(["report", *map(str, sorted(runs.iterdir()))]) == 0
    again = sorted(runs.iterdir())  # what the shell's runs/* is now
    assert runs / "report" in again
    capsys.readouterr()
    assert cli(["report", *map(str, again)]) == 0, capsys.readouterr().err
    assert _report_runs_column(runs / "report") == ["a", "b"]
    elsewhere = tmp_path / "elsewhere"  # the folder --out names, given among the runs, is left out too
    assert cli(["report", str(runs / "a"), str(runs / "b"), "--out", str(elsewhere)]) == 0
    assert cli(["report", str(runs / "a"), str(runs / "b"), str(elsewhere) + "/", "--out", str(elsewhere)]) == 0
    assert _report_runs_column(elsewhere) == ["a", "b"]
    (runs / "notes").mkdir()  # any other folder without metrics.jsonl is still refused
    capsys.readouterr()
    assert cli(["report", str(runs / "a"), str(runs / "b"), str(runs / "notes")]) == 2
    assert capsys.readouterr().err == (f"splitfed report: error: {runs / 'notes'} is not a run folder: "
                                       "no metrics.jsonl in it (leave it out to report the other 2)\n")


def test_report_of_a_metrics_file_writes_beside_its_run_folder(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "cannot write the report to RUN/metrics.jsonl/report: Not a directory"."""
    from splitfed.commands.report import default_out

    write_run(tmp_path / "run", make_rows(2))
    assert cli(["report", str(tmp_path / "run" / "metrics.jsonl")]) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "report" / "summary.md").is_file()
    assert default_out([tmp_path / "run" / "metrics.jsonl"]) == tmp_path / "run" / "report"
    with pytest.raises(ConfigError, match="is the same run as"):  # before: reported twice, as run#1 and run#2
        load_runs([tmp_path / "run", tmp_path / "run" / "metrics.jsonl"])


def test_report_tells_of_a_run_that_did_not_finish_and_of_a_cut_short_last_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a run stopped after round 1 of 3, its last row cut short, was shown like any finished run."""
    write_run(tmp_path / "done", make_rows(3), {"label": "done"})
    stopped = write_run(tmp_path / "stopped", make_rows(3))  # no summary.json: it never got to the end
    metrics = stopped / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    metrics.write_bytes(b"".join(lines[:1]) + lines[1][:-20])  # round 2's append was cut short
    assert cli(["report", str(tmp_path / "done"), str(stopped)]) == 0
    out, err = capsys.readouterr()
    assert err == (f"splitfed report: note: {stopped} has no summary.json: it did not finish, or is still running "
                   "(1 round kept)\n"
                   f"splitfed report: note: {metrics}: its last line was cut short (a crash, or a round still being "
                   "written) and is left out\n"), err
    assert "stopped" in out
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "## Notes" in md and f"{stopped} has no summary.json" in md and "cut short" in md
    assert load_run(tmp_path / "done").finished and not load_run(tmp_path / "done").cut_short
    run = load_run(stopped)
    assert not run.finished and run.cut_short and [r.round for r in run.rounds] == [1]
    capsys.readouterr()
    assert cli(["report", str(tmp_path / "done")]) == 0
    assert capsys.readouterr().err == ""  # a finished, whole run: nothing to say
    assert "## Notes" not in (tmp_path / "done" / "report" / "summary.md").read_text()


def test_only_clashing_labels_change_and_by_the_shortest_path_that_tells_them_apart(tmp_path: Path) -> None:
    """Before: ``runs/adaptive#1``, ``runs/adaptive#2``, ``best static (0,7)#3``."""
    for where in ("a", "b"):
        write_run(tmp_path / where / "runs" / "adaptive", make_rows(2), {"label": "adaptive"})
    write_run(tmp_path / "a" / "runs" / "best_static", make_rows(2), {"label": "best static (0,7)"})
    runs = load_runs([tmp_path / "a" / "runs" / "adaptive", tmp_path / "b" / "runs" / "adaptive",
                      tmp_path / "a" / "runs" / "best_static"])
    assert [r.label for r in runs] == ["a/runs/adaptive", "b/runs/adaptive", "best static (0,7)"]
    from splitfed.report.runs import unique_labels

    # a summary's label that is not its folder's name keeps its words; folders of one parent are told by name
    assert unique_labels(["fast", "fast"], [Path("/x/a/runs/f1"), Path("/x/b/runs/f1")]) == ["a/runs/fast",
                                                                                           "b/runs/fast"]
    assert unique_labels(["fast", "fast"], [Path("/runs/f1"), Path("/runs/f2")]) == ["fast (f1)", "fast (f2)"]


_PART = st.sampled_from(["a", "b", "runs", "adaptive"])


@given(st.lists(st.tuples(st.sampled_from(["adaptive", "a", "runs/adaptive", "a/runs/adaptive", "x"]),
                          st.lists(_PART, min_size=1, max_size=4)), min_size=1, max_size=8,
                unique_by=lambda t: tuple(t[1])))
def test_unique_labels_are_unique_and_leave_labels_that_do_not_clash_alone(runs) -> None:  # type: ignore[no-untyped-def]
    from collections import Counter

    from splitfed.report.runs import unique_labels

    labels = [label for label, _ in runs]
    folders = [Path("/", *parts) for _, parts in runs]
    got = unique_labels(labels, folders)
    assert len(set(got)) == len(got)
    counts = Counter(labels)
    for label, new in zip(labels, got, strict=True):
        assert new == label if counts[label] == 1 else (new != label and label in new)


def test_a_reader_that_closes_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """``splitfed report RUNS | head -2``: before, a BrokenPipeError traceback and rc 1 (a command's own
    prints were not guarded, only the console script's last flush); now rc 141 (128 + SIGPIPE, as a shell
    reports for a Unix tool a closed pipe ended) and nothing on stderr, whether the reader was gone at a print
    (unbuffered) or only at the last flush."""
    import os
    import subprocess
    import sys

    write_run(tmp_path / "runs" / "a", make_rows(3), {"label": "a"})
    write_run(tmp_path / "runs" / "b", make_rows(3), {"label": "b"})
    for unbuffered in (True, False):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        if unbuffered:
            env["PYTHONUNBUFFERED"] = "1"
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first line: no race with the command's prints
        try:
            p = subprocess.run([sys.executable, "-m", "splitfed.cli", "report", str(tmp_path / "runs" / "a"),
                                str(tmp_path / "runs" / "b")], stdout=write, stderr=subprocess.PIPE, text=True,
                               timeout=300, env=env)
        finally:
            os.close(write)
        assert (p.returncode, p.stderr) == (141, ""), (unbuffered, p.stderr)
        assert (tmp_path / "runs" / "report" / "summary.md").is_file()


def test_a_broken_pipe_that_is_not_stdout_is_still_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BrokenPipeError of a socket or a child's pipe, stdout still there, is not taken for ``| head``."""
    import argparse

    from splitfed import cli as cli_module

    def broken(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli_module.build_parser()
    monkeypatch.setattr(cli_module, "build_parser", lambda: parser)
    report = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["report"]
    report.set_defaults(func=broken)
    with pytest.raises(BrokenPipeError):
        cli(["report", "x"])


def test_report_says_a_deployed_runs_times_are_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A deployment writes no simulated round time (null) and its measured one stands in, under "sim time s"
    and on the "simulated time" axes, without a word: the reader took measured times for simulated ones."""
    rows = [{**r, "sim_round_s": None, "measured_round_s": 1.5} for r in make_rows(2)]
    deployed = write_run(tmp_path / "deployed", rows, {"label": "deployed"})
    write_run(tmp_path / "simulated", make_rows(2), {"label": "simulated"})
    assert cli(["report", str(deployed), str(tmp_path / "simulated")]) == 0
    err = capsys.readouterr().err
    assert err == (f"splitfed report: note: {deployed} has no simulated clock (a deployment): its times (the time "
                   "columns and axes) are the measured round times\n"), err


def test_headers_and_axes_name_the_clock_the_runs_have(tmp_path: Path) -> None:
    """Measured times under "sim time s" and on "simulated time" axes misled a reader even with the note:
    the headers, the round table and the axes now name the clock (sim, measured, or both for a mix)."""
    from splitfed.report.plots import _views
    from splitfed.report.runs import clock_of, load_runs
    from splitfed.report.summary import summary_markdown, summary_rows
    from splitfed.report.table import round_table

    measured_rows = [{**r, "sim_round_s": None, "measured_round_s": 1.5} for r in make_rows(2)]
    deployed = write_run(tmp_path / "deployed", measured_rows, {"label": "deployed"})
    simulated = write_run(tmp_path / "simulated", make_rows(2), {"label": "simulated"})
    for paths, clock, axis in (([simulated], "sim", "simulated"), ([deployed], "measured", "measured"),
                               ([deployed, simulated], "sim/measured", "simulated or measured")):
        runs = load_runs(paths)
        assert clock_of(runs) == clock
        headers, _ = summary_rows(runs, target=0.7)
        assert headers[7:9] == [f"{clock} time s", f"mean {clock} round s"] and headers[-2] == f"{clock} s to 0.7"
        assert f"| {clock} time s |" in summary_markdown(runs, target=0.7)
        assert f"{clock_of(runs[:1])} round s" in round_table(runs[0])
        names = [name for name, _, _ in _views(runs, tmp_path, None)]
        assert f"accuracy vs {axis} time" in names
    assert summary_rows(load_runs([deployed]))[1][0][7] == 3.0  # the measured times themselves: 2 x 1.5 s


def test_rounds_csv_says_which_clock_each_rows_times_are_and_what_was_predicted(tmp_path: Path) -> None:
    """A deployment's rows have measured times in the ``sim_*`` columns (readers go by header): before, nothing
    in rounds.csv said so, and the cost model's prediction beside them was in no table."""
    import csv

    from splitfed.report.summary import write_csv

    measured = [{**r, "sim_round_s": None, "measured_round_s": 1.5, "predicted_round_s": 1.25}
                for r in make_rows(2)]
    write_run(tmp_path / "sim", make_rows(2))
    write_run(tmp_path / "dep", measured)
    write_csv([load_run(tmp_path / "sim"), load_run(tmp_path / "dep")], tmp_path / "out")
    got = list(csv.DictReader((tmp_path / "out" / "rounds.csv").open()))
    assert [(r["clock"], r["predicted_round_s"]) for r in got] == [("sim", ""), ("sim", ""), ("measured", "1.25"),
                                                                  ("measured", "1.25")]
    assert got[2]["sim_round_s"] == "1.5"


def test_real_time_runs_get_a_figure_of_measured_beside_predicted_round_times(tmp_path: Path) -> None:
    from splitfed.report.plots import standard_plot_files, standard_plots

    measured = [{**r, "sim_round_s": None, "measured_round_s": 1.5 + r["round"], "predicted_round_s": 1.25}
                for r in make_rows(3)]
    write_run(tmp_path / "dep", measured)
    write_run(tmp_path / "sim", make_rows(3))
    dep, sim = load_run(tmp_path / "dep"), load_run(tmp_path / "sim")
    made = standard_plots([sim, dep], tmp_path / "out")
    assert made["measured vs predicted round time"].name == "predicted_vs_measured.png"
    assert made["measured vs predicted round time"].stat().st_size > 1000
    assert (tmp_path / "out" / "predicted_vs_measured.png") in standard_plot_files([sim, dep], tmp_path / "out")
    assert "measured vs predicted round time" not in standard_plots([sim], tmp_path / "only_sim")  # nothing to show
