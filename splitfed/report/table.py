"""Terminal tables: the end-of-run table of ``splitfed simulate`` and the one ``splitfed report`` prints.

One formatter for every table printed to a terminal, so columns line up the
same everywhere. :func:`end_of_run` is what the simulate runner calls with the
metrics objects it wrote: a table of rounds (accuracy, simulated round time,
bytes) and one of device classes (how many clients, which cuts they had in the
first and in the last round, how many times they moved), since with adaptive
cuts "the" cut of a class is a distribution that moves.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from splitfed.report.runs import Cuts, RoundRow, Run, clock_of, rows_to_run

MB = 1e6
_FILLERS = ("", "...", None)


def shown(text: str) -> str:
    """``text`` on one line of a terminal: each character that is not printable (a newline, a tab, an escape
    sequence's ESC, a lone surrogate from a folder name that is not UTF-8) as its Python escape (``\\n``,
    ``\\x1b``, ``\\udcff``), so that a label breaks no row of a table and moves no column."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def width(text: str) -> int:
    """The columns ``text`` takes on a terminal: a wide character (CJK, most emoji) two, a combining mark or a
    zero-width one none; ``len`` counted a device named 東京-pi as 5 columns of its 7 and moved every column after."""
    return sum(0 if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def ljust(text: str, columns: int) -> str:
    """``text`` padded on the right to ``columns`` terminal columns (:func:`width`)."""
    return text + " " * max(0, columns - width(text))


def rjust(text: str, columns: int) -> str:
    return " " * max(0, columns - width(text)) + text


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A plain-text table; numbers right-aligned, text left-aligned (one line per row: :func:`shown`; widths in
    terminal columns: :func:`width`)."""
    cells = format_cells(rows)
    headers = [format_value(h) for h in headers]
    numeric = [all(_is_num(row[j]) for row in rows if j < len(row) and row[j] not in _FILLERS) and bool(rows)
               for j in range(len(headers))]
    widths = [max([width(h), *(width(r[j]) for r in cells if j < len(r))]) for j, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(rjust(v, w) if numeric[j] else ljust(v, w)
                         for j, (v, w) in enumerate(zip(vals, widths, strict=True))).rstrip()

    out = [shown(title)] if title else []
    out += [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(r + [""] * (len(headers) - len(r))) for r in cells]
    return "\n".join(out)


def format_cuts(cuts: Cuts) -> str:
    return ",".join(map(str, cuts)) if cuts else "-"


def cut_mix(cuts: Sequence[Cuts]) -> str:
    """``"2,5 x3; 1,4"``: the distinct cut vectors of a group, most common first."""
    counts = Counter(cuts)
    parts = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "; ".join(format_cuts(c) + (f" x{n}" if n > 1 else "") for c, n in parts) or "-"


def round_table(run: Run, max_rows: int = 30) -> str:
    """Per round: accuracy, loss, simulated round time and bytes (long runs: first and last rounds)."""
    clock = clock_of([run])
    headers = ["round", "accuracy", "loss", f"{clock} round s", f"{clock} total s", "MB up", "MB down"]
    rows: list[list[Any]] = [[r.round, r.accuracy, r.loss, r.sim_round_s, t, r.bytes_up / MB, r.bytes_down / MB]
                             for r, t in zip(run.rounds, run.sim_time, strict=True)]
    if len(rows) > max_rows:  # max_rows rounds: the first ceil(max_rows / 2), then the last floor(max_rows / 2)
        tail = max_rows // 2
        rows = rows[:max_rows - tail] + [["..."] + [""] * (len(headers) - 1)] + rows[len(rows) - tail:]
    return format_table(headers, rows, title=f"{run.label}: rounds")


def class_table(run: Run) -> str:
    """Per device class: clients, the cuts they had in the first and the last round, and (more than one round)
    how many times they moved: a move and its reversal left the first and the last round alike."""
    first, last = run.rounds[0], run.rounds[-1]
    classes: dict[str, list[str]] = {}
    for c in run.clients:
        classes.setdefault(run.class_of(c), []).append(c)
    shown = [first] if first.round == last.round else [first, last]  # one round: one cuts column, no moves
    rows = [[k, len(v), *(_mix(r, v) for r in shown), *([_moves(run, v)] if len(shown) > 1 else [])]
            for k, v in classes.items()]
    return format_table(["device class", "clients", *(f"cuts round {r.round}" for r in shown),
                         *(["moves"] if len(shown) > 1 else [])], rows, title=f"{run.label}: cuts per device class")


def end_of_run(rows: Sequence[Mapping[str, Any]], classes: Mapping[str, str] | None = None,
               label: str = "run") -> str:
    """The table ``splitfed simulate`` prints at the end: rounds, then cuts per device class.

    ``rows`` are the metrics objects of ``metrics.jsonl``; ``classes`` maps client -> device class.
    """
    run = rows_to_run(rows, label, {"classes": dict(classes or {})})
    if not run.rounds:
        return f"{label}: no rounds"
    parts = [round_table(run)]
    if run.clients:
        parts.append(class_table(run))
    return "\n\n".join(parts)


def _moves(run: Run, clients: Sequence[str]) -> int:
    """Changes of cuts of ``clients`` between consecutive rounds, each client in both (a client absent from a
    round, or new in it, did not move)."""
    return sum(prev.cuts[c] != cur.cuts[c] for prev, cur in zip(run.rounds, run.rounds[1:], strict=False)
               for c in clients if c in prev.cuts and c in cur.cuts)


def _mix(row: RoundRow, clients: Sequence[str]) -> str:
    return cut_mix([row.cuts[c] for c in clients if c in row.cuts])


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _decimals(v: float) -> int | None:
    """The decimals :func:`format_value` writes ``v`` with in fixed point; None where it writes it otherwise
    (0, NaN, inf, 3 significant digits)."""
    a = abs(v)
    if not math.isfinite(v) or a == 0 or a >= 1e15 or a < 1e-3:
        return None
    return 0 if a >= 1e5 else 2 if a >= 1 else 4


def format_cells(rows: Sequence[Sequence[Any]]) -> list[list[str]]:
    """Each row's cells, column by column (:func:`format_column`: a column's floats read alike); a row shorter
    than the others has no cell where it ends."""
    n = max(map(len, rows), default=0)
    columns = [format_column([row[j] if j < len(row) else None for row in rows]) for j in range(n)]
    return [[columns[j][i] for j in range(len(row))] for i, row in enumerate(rows)]


def format_column(values: Sequence[Any]) -> list[str]:
    """A column's cells (:func:`format_value`), its floats in fixed point with the decimals of the one that
    takes the most, a zero too: an accuracy of 1.0 reads ``1.0000`` beside ``0.9972``, not ``1.00``, and 0.0
    ``0.0000``. The other cells (text, integers, none, floats written with 3 significant digits) as each is."""
    decimals = [d for v in values if isinstance(v, float) and (d := _decimals(v)) is not None]
    if not decimals:
        return [format_value(v) for v in values]
    most = max(decimals)
    return [f"{abs(v) if v == 0 else v:.{most}f}" if isinstance(v, float) and (v == 0 or _decimals(v) is not None)
            else format_value(v) for v in values]  # (-0.0 as 0.0: "-0.0000" would read as a loss below zero)


def format_value(v: Any) -> str:
    """A cell: ``-`` for none (None, NaN); a float with 4 decimals below 1, 2 below 1e5, whole from there (a
    long run's simulated seconds, 123,456 and 123,900, must read apart: 3 significant digits made both
    ``1.23e+05``), 3 significant digits below 1e-3 and from 1e15. A table's column: :func:`format_column`."""
    if v is None:
        return "-"
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if math.isinf(v):
            return "inf"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1e15 or a < 1e-3:
            return f"{v:.3g}"
        if a >= 1e5:
            return f"{v:.0f}"
        return f"{v:.4f}" if a < 1 else f"{v:.2f}"
    return shown(str(v))
