"""Leftovers of the report and CLI reviews, each reproduced first: labels that broke the report's tables and
figures, a cut heatmap that named the tiers of a run that does not record them, and flags of ``optimize`` and
``verify`` that were dropped or refused without naming the flag."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from splitfed.cli import main as cli
from splitfed.flower.metrics import MetricsWriter
from splitfed.report import plots
from splitfed.report.runs import load_run, rows_to_run, write_run
from splitfed.report.summary import csv_text, csv_texts, summary_markdown, summary_rows
from splitfed.report.table import class_table, format_table, width
from tests.plot_fixtures import saved_figures

# ---------------------------------------------------------------- labels in every table


def text(label: str) -> str:
    """The label every output holds: itself, a lone surrogate (not UTF-8) as its escape."""
    return label.encode("utf-8", "backslashreplace").decode("utf-8")


def shown(label: str) -> str:
    """The label on one line of a table: each character that is not printable as its Python escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in label)


def _rows(client: str) -> list[dict[str, Any]]:
    return [{"round": r, "accuracy": 0.25 * r, "sim_round_s": 1.5, "bytes_up": 10, "bytes_down": 20,
             "cuts": {client: [2, 5], "other-1": [1, 4]}, "classes": {client: client}} for r in (1, 2)]


def _inline_text(children: list[Any]) -> str:
    """What a reader sees of an inline run of Markdown: its text, with no line break in it."""
    assert not any(c.type in ("softbreak", "hardbreak", "html_inline") for c in children), children
    return "".join(c.content for c in children if c.type in ("text", "text_special", "code_inline"))


def _markdown_table(md: str) -> list[list[str]]:
    """Each row of the first table in ``md`` (header first), as its cells read once rendered."""
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    rows: list[list[str]] = []
    for tok in tokens:
        if tok.type == "tr_open":
            rows.append([])
        elif tok.type == "inline" and rows:
            rows[-1].append(_inline_text(tok.children or []))
        elif tok.type == "table_close":
            break
    return rows


def _markdown_strong(md: str) -> list[str]:
    """The bold text of each list item (``summary.md``'s list of runs)."""
    tokens = MarkdownIt("commonmark").parse(md)
    out = []
    for tok in tokens:
        kids = tok.children or []
        for i, c in enumerate(kids):
            if c.type == "strong_open":
                j = next(k for k in range(i, len(kids)) if kids[k].type == "strong_close")
                out.append(_inline_text(kids[i + 1:j]))
    return out


labels = st.text(min_size=1, max_size=24)


@settings(max_examples=150)
@given(label=labels)
@example(label="two\nlines")
@example(label="a|b")
@example(label="a\\|b")
@example(label="a,b\r\nc\"d")
@example(label="  spaced  ")
@example(label="**bold** `code` [link](x) <b>&amp; $x$ ~~s~~ _i_")
@example(label="\x1b[31mred\x1b[0m\ttab\x00nul\u2028sep")
@example(label="bad\udcff")
@example(label="=1+1")
@example(label="pi¹")
def test_every_table_carries_any_label(label: str) -> None:
    """A label (a run's, a client's) with a newline, a ``|``, a comma...: before, a newline split a row of the
    terminal table and of summary.md in two, ``a\\|b`` split a Markdown cell (GitHub) or lost its backslash,
    and a lone surrogate (a folder name that is not UTF-8) stopped the report (below). Now summary.csv holds
    it as it is, and the terminal and Markdown tables one line per row, as :func:`shown` writes it."""
    run = rows_to_run(_rows(label), label)
    want = text(label)  # the label itself, a lone surrogate as its escape (UTF-8 cannot hold it)
    assert run.label == want and want in run.clients

    summary, rounds = csv_texts([run])
    (head, row) = list(csv.reader(io.StringIO(summary, newline="")))
    assert row[0] == csv_text(want) and len(row) == len(head)  # a formula's start led by ' (csv_text)
    table = list(csv.reader(io.StringIO(rounds, newline="")))
    assert [r[0] for r in table[1:]] == [csv_text(want)] * 2

    md = summary_markdown([run])
    cells = _markdown_table(md)
    assert len(cells) == 2 and len(cells[1]) == len(cells[0]) == len(summary_rows([run])[0])
    assert cells[1][0] == shown(want) and cells[1][-1] == "finished"

    headers, rows = summary_rows([run])
    lines = format_table(headers, rows).split("\n")
    assert len(lines) == 3 and lines[2].startswith(shown(want))
    # the columns still line up, in a terminal's columns (a wide character takes two)
    assert width(lines[2][:lines[2].index("finished")]) == width(lines[0][:lines[0].index("status")])
    classes = class_table(run).split("\n")
    assert len(classes) == 5 and classes[0] == f"{shown(want)}: cuts per device class"
    assert any(line.startswith(shown(want)) for line in classes[3:])


@settings(max_examples=60)
@given(label=labels)
@example(label="two\nlines")
@example(label="a\\|b")
@example(label="  spaced  ")
@example(label="[x](y) **z**")
def test_summary_md_names_each_run_as_it_is(tmp_path_factory: pytest.TempPathFactory, label: str) -> None:
    """The list of runs in summary.md (``- **label**: `path` ``): before, the label and path went in raw."""
    folder = tmp_path_factory.mktemp("r") / "run"
    write_run(folder, _rows("c"), {"label": label})
    md = summary_markdown([load_run(folder)])
    assert _markdown_strong(md) == [shown(text(label))]


def _legend(fig: Any) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


@settings(max_examples=12)
@given(label=labels)
@example(label="a$\\frac$b")
@example(label="_baseline")
@example(label="cost $5 and $10")
def test_figures_draw_any_label(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
                                label: str) -> None:
    """Before: a label with two ``$`` was drawn as math, and one that is not math (``a$\\frac$b``) stopped the
    report with a traceback; one that starts with ``_`` was left out of the legend; a control character was
    drawn as a missing glyph. Now each is drawn as the tables show it (:func:`shown`)."""
    figs = saved_figures(monkeypatch)
    runs = [rows_to_run(_rows(label), label), rows_to_run(_rows("b"), "other")]
    plots.accuracy_per_round_plot(runs, tmp_path_factory.mktemp("f") / "a.png")
    drawn = [t.replace("\\$", "$") for t in _legend(figs[-1])]  # what matplotlib draws of the text
    # a name shown longer than LABEL_WIDTH is drawn in lines (escapes lengthen it: "\x1f" is 4 characters)
    assert all(len(line) <= plots.LABEL_WIDTH for t in drawn for line in t.split("\n"))
    assert [t.replace("\n", "") for t in drawn] == [shown(text(label)), "other"]
    plots.cuts_heatmap(runs[0], tmp_path_factory.mktemp("f") / "c.png")


def test_a_run_folder_whose_name_is_not_utf8_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a traceback (matplotlib's TypeError on ``bad\\udcff``; the CSV could not be written either)."""
    folder = tmp_path / os.fsdecode(b"bad\xff")
    write_run(folder, _rows("c"))
    assert cli(["report", str(folder), "--out", str(tmp_path / "out")]) == 0
    assert "bad\\udcff" in capsys.readouterr().out
    with open(tmp_path / "out" / "summary.csv", newline="", encoding="utf-8") as f:
        assert list(csv.reader(f))[1][0] == "bad\\udcff"


# ---------------------------------------------------------------- how many tiers a run had


def _titles(monkeypatch: pytest.MonkeyPatch, run: Any, tmp_path: Path) -> tuple[list[str], str]:
    figs = saved_figures(monkeypatch)
    plots.cuts_heatmap(run, tmp_path / "cuts.png")
    fig = figs[-1]
    return [ax.get_title() for ax in fig.axes if ax.get_title()], fig.get_suptitle()


def _older_rows(cuts: tuple[int, ...]) -> list[dict[str, Any]]:
    """Rows as the coordinator writes them (``server.app.metrics_row``), less ``tier_weight_bytes``: what a
    splitfed before that field wrote."""
    from server.app import metrics_row
    from server.strategy import RoundRecord

    rows = []
    for r in (1, 2):
        row = metrics_row(RoundRecord(r, {"client0": cuts, "client1": cuts}, sim_round_s=1.0,
                                      tier_weight_bytes=[[8, 8]] * (len(cuts))), 0.5, 2.0, 1.0, {})
        del row["tier_weight_bytes"]
        rows.append(row)
    return rows


def test_two_cuts_of_a_run_that_does_not_record_its_tiers_are_not_named(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """A run cut at two places is on 3 tiers, or on 2 in a U-shape; without its settings (no summary.json: it
    crashed) and without ``tier_weight_bytes`` (an older splitfed's rows) nothing says which. Before, the
    heatmap named a 2-tier U-shape run's cuts "device | edge" and "edge | cloud"; now they are numbered."""
    writer = MetricsWriter(tmp_path / "u2")
    for row in _older_rows((2, 6)):
        writer.append(row)
    run = load_run(tmp_path / "u2")
    assert not run.finished and "tiers" not in json.dumps(run.summary)
    titles, suptitle = _titles(monkeypatch, run, tmp_path)
    assert titles == ["cut 1", "cut 2"]
    assert "does not record its tiers" in suptitle
    # what does say: its settings, or its rows' weight traffic per server tier (one tier: two cuts are a U-shape)
    told = rows_to_run(_older_rows((2, 6)), "u2", {"settings": {"tiers": 2, "u_shape": True}})
    assert _titles(monkeypatch, told, tmp_path)[0] == ["cut 1: device | server", "cut 2: server | device (tail)"]
    rows = [{**r, "tier_weight_bytes": [[8, 8], [8, 8]]} for r in _older_rows((2, 6))]
    titles, suptitle = _titles(monkeypatch, rows_to_run(rows, "three"), tmp_path)
    assert titles == ["cut 1: device | edge", "cut 2: edge | cloud"] and "record" not in suptitle
    one = _titles(monkeypatch, rows_to_run(_older_rows((3,)), "one"), tmp_path)  # one cut: 2 tiers, sure
    assert one[0] == ["cut 1: device | server"] and "record" not in one[1]


# ---------------------------------------------------------------- optimize and verify as a user


@pytest.fixture
def profile_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "profiles"))


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line on stderr of a command line refused with exit code 2 (by argparse or by the command)."""
    try:
        code = cli(argv)
    except SystemExit as e:  # argparse's refusal: its exit, as the console script's
        code = int(e.code or 0)
    assert code == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("cuts", ["2,,5", "2,5,", ",2,5", "2,5/3,,7"])
def test_verify_refuses_a_cut_left_out(capsys: pytest.CaptureFixture[str], cuts: str) -> None:
    """Before: ``--cuts 2,,5`` dropped the empty entry and checked 2,5 (exit 0), where every other cut list
    (``_args.int_list``) refuses it."""
    err = _refused(capsys, ["verify", "--model", "cnn", "--cuts", cuts])
    assert "argument --cuts" in err and repr(cuts) in err


def test_verify_checks_every_cut_vector_given(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``--cuts 2,5/3,7`` with the default ``--clients 1`` trained 2,5 only, and printed
    ``cuts=2,5/3,7 ... OK``; now the default is one client per vector, and fewer clients are refused."""
    assert cli(["verify", "--model", "cnn", "--cuts", "2,5/3,7", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cuts"] == [[2, 5], [3, 7]] and result["clients"] == 2 and result["ok"]
    err = _refused(capsys, ["verify", "--model", "cnn", "--cuts", "2,5/3,7", "--clients", "1"])
    assert "--clients 1" in err and "3,7" in err
    assert cli(["verify", "--model", "cnn", "--cuts", "2,5", "--clients", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cuts"] == [[2, 5]] * 3


@pytest.mark.parametrize("argv,flag", [
    (["verify", "--model", "cnn", "--cuts", "2,5/3"], "--cuts: 3 tiers need 2 cut(s), got 1: 3"),
    (["verify", "--model", "cnn", "--cuts", "2,99"], "--cuts: cut 99 is out of range"),
    (["optimize", "--model", "cnn", "--fleet", "small", "--static", "2"], "--static: 3 tiers need 2 cut(s)"),
    (["optimize", "--model", "cnn", "--fleet", "small", "--static", "2,99"], "--static: cut 99 is out of range"),
    (["optimize", "--model", "cnn", "--fleet", "small", "--tiers", "2", "--static", "2,5"],
     "--static: 2 tiers need 1 cut(s)"),
    (["optimize", "--model", "cnn", "--fleet", ""], "argument --fleet: expected a fleet file or a shipped fleet"),
])
def test_a_refused_value_names_its_flag(capsys: pytest.CaptureFixture[str], profile_cache: None,
                                        argv: list[str], flag: str) -> None:
    """Before: ``3 tiers need 2 cut(s), got 1: 2`` named no flag, and ``--fleet ""`` was refused as "fleet ''
    is a folder" (an empty path is the current folder)."""
    err = _refused(capsys, argv)
    assert flag in err and "is a folder" not in err
