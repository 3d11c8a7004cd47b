"""Tables line up in terminal columns, not characters: a device named in CJK or with an emoji takes two columns per
such character, a combining accent none. With ``len`` a fleet's 東京-pi (5 characters, 7 columns) pushed every
column after it two columns right in ``splitfed optimize``'s table and in every table ``format_table`` draws."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitfed.cli import main
from splitfed.report.table import format_table, ljust, rjust, width

FLEET = """
name = "wide"
samples = 64
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "{0}"
profile = "rpi4"
[[device]]
name = "pi"
profile = "rpi4"
"""


def test_width_counts_terminal_columns() -> None:
    assert width("pi") == 2
    assert width("東京-pi") == 7
    assert width("phone-📱") == 8
    assert width(unicodedata.normalize("NFD", "café")) == 4  # e + a combining acute: one column
    assert width("a\u200bb") == 2  # a zero-width space takes none


_CHARS = st.sampled_from(["a", "Z", "-", "7", "東", "京", "📱", "\u0301", "é", "\u200b", "ﾃ"])


@given(st.text(_CHARS, max_size=12), st.integers(0, 30))
def test_padding_reaches_the_columns_asked_and_keeps_the_text(text: str, columns: int) -> None:
    for padded in (ljust(text, columns), rjust(text, columns)):
        assert width(padded) == max(columns, width(text))
        assert padded.strip(" ") == text.strip(" ")


def _columns_before(line: str, needle: str) -> int:
    return width(line[:line.index(needle)])


def test_format_table_aligns_wide_labels() -> None:
    text = format_table(["device", "clients"], [["東京-pi", 3], ["pi", 12]])
    header, rule, a, b = text.splitlines()
    assert width(a) == width(b) == width(header) == width(rule)
    assert _columns_before(a, "3") + 1 == _columns_before(b, "12") + 2  # right-aligned numbers end together


@pytest.mark.parametrize("name", ["東京-pi", "phone-📱"])
def test_optimize_s_table_lines_up_with_a_wide_device_name(name: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.format(name), encoding="utf-8")
    assert main(["optimize", "--model", "mlp", "--fleet", str(fleet), "--static", "2,3"]) == 0
    rows = capsys.readouterr().out.splitlines()
    header, wide, narrow = rows[1], rows[2], rows[3]
    assert wide.startswith(name) and narrow.startswith("pi ")
    assert width(wide) == width(narrow) == width(header)
    assert _columns_before(wide, "2,3") == _columns_before(narrow, "2,3") == _columns_before(header, "cuts")
