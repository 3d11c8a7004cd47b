"""What the report's runs table and its Markdown and CSV forms promise, pinned where a mutation run found nothing
checking it.

``summary_rows``: the final and mean round time, activation and weight MB of a run of several rounds, each by
hand. ``markdown_text``: ``_`` left as it is only between two letters or digits (``run_1``), escaped elsewhere;
``markdown_item``: a text that would start a heading or a list escaped; ``markdown_code``: fenced by one backtick
more than its longest run of them, padded only where CommonMark would otherwise eat or misread an end (exact
outputs, and a property: the rendered code span reads as the text). ``summary.md`` has its Notes section only
where a run has a note. ``rounds.csv``'s clients: the row's own count where it is an integer >= 0. ``write_csv``
makes its folder (nested or there already) and returns the two paths it wrote.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from splitfed.report.runs import rows_to_run
from splitfed.report.summary import (
    csv_cell,
    csv_files,
    csv_texts,
    markdown_code,
    markdown_item,
    markdown_text,
    summary_markdown,
    summary_rows,
    write_csv,
)
from splitfed.report.table import shown


def _rows(n: int = 3, **extra: Any) -> list[dict[str, Any]]:
    """Rounds 1..n: round r takes r simulated seconds, sends r MB of activations and 1.5 MB of weights."""
    return [{"round": r, "accuracy": 0.1 * r, "sim_round_s": float(r), "wall_s": 0.5, "bytes_up": 1_000_000 * r,
             "bytes_down": 0, "device_weight_bytes": [1_000_000, 500_000], "cuts": {"c0": [1, 3], "c1": [2, 3]},
             **extra} for r in range(1, n + 1)]


# ---------------------------------------------------------------- the runs table


def test_summary_row_numbers_of_a_run_of_three_rounds() -> None:
    """Time 1+2+3 = 6 s (the last round's total, not the first's), mean 6/3 = 2 s a round, activations
    1+2+3 = 6 MB, weights 3 x 1.5 = 4.5 MB: a mutant that multiplied, or read the first round, went unseen
    (one round, or zero weight bytes, makes them all agree)."""
    headers, (row,) = summary_rows([rows_to_run(_rows(), "a")])
    got = dict(zip(headers, row, strict=True))
    assert got["rounds"] == 3
    assert got["sim time s"] == 6.0
    assert got["mean sim round s"] == 2.0
    assert got["activation MB"] == 6.0
    assert got["weight MB"] == 4.5
    assert got["wall s"] == 1.5


# ---------------------------------------------------------------- Markdown escaping


@pytest.mark.parametrize("text, want", [
    ("run_1", "run_1"),                # between a letter and a digit: no emphasis, left as it is
    ("a_b", "a_b"),                    # the first and last characters around it
    ("x a_b", "x a_b"),                # the character before the letter does not matter
    ("_a1", r"\_a1"),                  # first: nothing before it
    ("a1_", r"a1\_"),                  # last: nothing after it
    ("x _b", r"x \_b"),                # a space before it
    ("a_.", r"a\_."),                  # punctuation after it
    ("a__b", r"a\_\_b"),               # each _ of two has an _ beside it
    ("*x* | `y`", r"\*x\* \| \`y\`"),
    (" a ", "&#32;a&#32;"),
])
def test_markdown_text_escapes_underscore_only_where_it_could_make_emphasis(text: str, want: str) -> None:
    """``run_1`` stays as it reads in summary.md's source; an ``_`` at an end or next to a space or punctuation
    is escaped (the index arithmetic of ``_inside_word``: each neighbour, each bound)."""
    assert markdown_text(text) == want


@pytest.mark.parametrize("text, want", [
    ("# x", r"- \# x"),
    ("#x", r"- \#x"),
    ("+ x", r"- \+ x"),
    ("- x", r"- \- x"),
    ("= x", r"- \= x"),
    ("1. x", r"- 1\. x"),
    ("2) x", r"- 2\) x"),
    ("x # y", "- x # y"),
    ("plain", "- plain"),
])
def test_markdown_item_escapes_what_would_start_a_block(text: str, want: str) -> None:
    """A note that starts as a heading or a list would read as one inside the item; other text is left alone."""
    assert markdown_item(text) == want


@pytest.mark.parametrize("text, want", [
    ("a", "`a`"),
    ("a`b", "``a`b``"),                # a fence longer than the run inside
    ("a``b`c", "```a``b`c```"),
    ("`a", "`` `a ``"),               # a backtick at an end: padded, else it joins the fence
    ("ab`", "`` ab` ``"),
    ("a`", "`` a` ``"),
    ("`", "`` ` ``"),
    (" a ", "`  a  `"),                # a space at both ends: CommonMark strips one each side, so one more
    ("a ", "`a `"),                    # at one end only: nothing stripped, no pad
    (" a", "` a`"),
    ("aba", "`aba`"),
    ("  ", "`  `"),                    # only spaces: nothing stripped
])
def test_markdown_code_fence_and_pad(text: str, want: str) -> None:
    """The exact code span: its fence one backtick longer than the longest run in the text, a space each side
    only where a backtick, or a space at both ends, is at an end."""
    assert markdown_code(text) == want


def _code_spans(md: str) -> list[str]:
    tokens = MarkdownIt("commonmark").parseInline(md)
    return [c.content for tok in tokens for c in (tok.children or []) if c.type == "code_inline"]


@settings(max_examples=200)
@given(text=st.text(min_size=1, max_size=20))
@example(text="`")
@example(text="``a")
@example(text=" ` ")
@example(text="a\nb")
def test_markdown_code_reads_as_its_text(text: str) -> None:
    """Rendered (CommonMark), a code span holds the text on one line as it is: no backtick run inside it closes
    it, and no end is lost to the one space CommonMark strips."""
    code = markdown_code(text)
    fence = len(code) - len(code.lstrip("`"))
    assert fence > max((len(run) for run in re.findall(r"`+", shown(text))), default=0)
    assert _code_spans(f"x {code} y") == [shown(text)]


# ---------------------------------------------------------------- summary.md


def test_summary_md_has_notes_only_where_a_run_has_one() -> None:
    """A finished run: no "Notes" heading (an empty one before); a stopped run: its note under it."""
    run = rows_to_run(_rows(), "a")
    assert "## Notes" not in summary_markdown([run])
    stopped = replace(run, status="stopped", record={"signal": "SIGINT", "until": "noon"})
    md = summary_markdown([stopped])
    assert "## Notes\n\n- a was stopped by Ctrl-C (SIGINT) at noon, before its end (3 rounds kept)\n" in md


# ---------------------------------------------------------------- CSV


@pytest.mark.parametrize("clients, want", [
    (5, 5),          # the row says: 5, though only 2 have cuts (a client that failed keeps its cuts)
    (0, 0),          # none finished
    (-1, 2),         # not a count: those with cuts
    (True, 2),
    ("3", 2),
    (None, 2),
])
def test_rounds_csv_clients_is_the_rows_own_count_where_it_is_one(clients: Any, want: int) -> None:
    """The row's ``clients`` where it is an integer >= 0 (0 included), else the clients with cuts."""
    extra = {} if clients is None else {"clients": clients}
    _, rounds = csv_texts([rows_to_run(_rows(1, **extra), "a")])
    (row,) = csv.DictReader(io.StringIO(rounds, newline=""))
    assert row["clients"] == str(want)


def test_csv_cell_of_a_missing_number_is_empty() -> None:
    """None and non-finite numbers: an empty cell ("" itself, as the docstring says); others as they are."""
    assert csv_cell(None) == ""
    assert csv_cell(math.nan) == "" and csv_cell(math.inf) == ""
    assert csv_cell(-0.5) == -0.5 and csv_cell("=x") == "'=x"


def test_write_csv_makes_its_folder_and_returns_what_it_wrote(tmp_path: Path) -> None:
    """A nested folder not there yet, and one there already: both written; the paths returned are the two
    files (``csv_files``), holding ``csv_texts``."""
    runs = [rows_to_run(_rows(), "a")]
    for out in (tmp_path / "x" / "y", tmp_path / "x" / "y", tmp_path):
        paths = write_csv(runs, out, target=0.2)
        assert paths == csv_files(out)
        assert tuple(p.read_bytes().decode() for p in paths) == csv_texts(runs, 0.2)
