"""``splitfed.report.table``, pinned where a mutation run found nothing watching: a long run's round table
shows its first and last rounds around one "..." row (no test had a run of more than 30 rounds), every cell's
format at the edges of its ranges, which columns are right-aligned (numbers, never booleans), and the MB
columns."""

from __future__ import annotations

import pytest

from splitfed.report.runs import rows_to_run
from splitfed.report.table import cut_mix, end_of_run, format_table, format_value, round_table


def _rows(rounds: int) -> list[dict]:
    return [{"round": r, "accuracy": 0.5, "loss": 0.25, "wall_s": 0.1, "sim_round_s": 2.0,
             "bytes_up": 3_000_000 * r, "bytes_down": 1_500_000, "cuts": {}, "clients": 1, "failed": []}
            for r in range(1, rounds + 1)]


def _round_column(table: str) -> list[str]:
    return [line.split()[0] for line in table.splitlines()[3:]]  # title, headers, rule


def test_a_run_of_max_rows_rounds_shows_them_all() -> None:
    assert _round_column(round_table(rows_to_run(_rows(30), "run"))) == [str(r) for r in range(1, 31)]


def test_a_longer_run_shows_its_first_and_last_rounds_around_one_ellipsis() -> None:
    """31 rounds at the default 30: rounds 1-15, "...", 17-31."""
    shown = _round_column(round_table(rows_to_run(_rows(31), "run")))
    assert shown == [*map(str, range(1, 16)), "...", *map(str, range(17, 32))]


@pytest.mark.parametrize(("max_rows", "first", "last"), [(1, [1], []), (2, [1], [40]), (3, [1, 2], [40]),
                                                         (4, [1, 2], [39, 40])])
def test_max_rows_rounds_are_shown_the_odd_one_first(max_rows: int, first: list[int], last: list[int]) -> None:
    """However small the bound, no more rounds than it (a bound below 2 once showed every round)."""
    shown = _round_column(round_table(rows_to_run(_rows(40), "run"), max_rows=max_rows))
    assert shown == [*map(str, first), "...", *map(str, last)]


def test_the_round_column_stays_right_aligned_around_the_ellipsis() -> None:
    lines = round_table(rows_to_run(_rows(40), "run"), max_rows=4).splitlines()
    assert [line[:5] for line in lines[3:]] == ["    1", "    2", "  ...", "   39", "   40"]


def test_the_mb_columns_are_bytes_over_a_million() -> None:
    """Round 2: 6,000,000 bytes up, 1,500,000 down."""
    line = round_table(rows_to_run(_rows(2), "run")).splitlines()[-1]
    assert line.split()[-2:] == ["6.00", "1.50"]


def test_an_empty_metrics_file_is_said_so() -> None:
    assert end_of_run([], label="mine") == "mine: no rounds"


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0"), (-0.0, "0"), (float("inf"), "inf"), (float("-inf"), "inf"), (float("nan"), "-"), (None, "-"),
    (True, "True"), (7, "7"),
    (1e15, "1e+15"), (9.99e14, "999000000000000"), (1e5, "100000"), (99999.5, "99999.50"),
    (1.0, "1.00"), (0.99, "0.9900"), (1e-3, "0.0010"), (9.99e-4, "0.000999"), (-2.5e-4, "-0.00025"),
    (-0.5, "-0.5000"), (-1e15, "-1e+15"),
])
def test_each_range_of_a_cell_at_its_edges(value: object, text: str) -> None:
    """4 decimals below 1, 2 below 1e5, whole from 1e5, 3 significant digits below 1e-3 and from 1e15 (by
    magnitude, either sign); an integer or a boolean as it is."""
    assert format_value(value) == text


def test_numbers_are_right_aligned_and_text_and_booleans_left() -> None:
    table = format_table(["n", "flag", "name"], [[1, True, "a"], [100, False, "bbb"]]).splitlines()
    assert table == ["  n  flag   name", "---  -----  ----", "  1  True   a", "100  False  bbb"]


def test_a_column_of_fillers_only_is_right_aligned_and_a_short_row_is_padded() -> None:
    """Fillers (none, "...") say nothing of a column's kind; a row shorter than the headers gets empty cells."""
    table = format_table(["x", "y"], [[None], ["..."]]).splitlines()
    assert table == ["  x  y", "---  -", "  -", "..."]


def test_cut_vectors_of_equal_count_are_listed_in_cut_order_not_first_seen() -> None:
    """Most common first; a tie in order of the cuts, so the same clients print the same line in any order."""
    assert cut_mix([(2, 5), (1, 4)]) == cut_mix([(1, 4), (2, 5)]) == "1,4; 2,5"
    assert cut_mix([(2, 5), (1, 4), (2, 5)]) == "2,5 x2; 1,4"
