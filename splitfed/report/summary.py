"""The Markdown summary of one or more runs: one row per run, the numbers a paper table needs.

The same rows feed the terminal table (:func:`summary_rows` + ``table.format_table``),
``summary.md`` (:func:`markdown_table`) and ``summary.csv`` (:func:`write_csv`), so they never disagree.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from splitfed.jsonio import write_atomic
from splitfed.report.runs import MEASURED, RoundRow, Run, clock_of, run_notes
from splitfed.report.table import MB, format_cells, format_value, shown

HEADERS = ("run", "mode", "tiers", "U-shape", "rounds", "final accuracy", "best accuracy", "sim time s",
           "mean sim round s", "activation MB", "weight MB", "wall s", "status")  # "sim" as :func:`clock_of` says: "measured" for a deployment's runs


def summary_rows(runs: Sequence[Run], target: float | None = None) -> tuple[list[str], list[list[Any]]]:
    """Headers and one row per run (with time and rounds to ``target`` accuracy when given). ``status``: what
    became of the run (:attr:`~splitfed.report.runs.Run.status`: finished, stopped, failed, crashed, running...)."""
    clock = clock_of(runs)
    headers = [h.replace("sim", clock) for h in HEADERS]
    if target is not None:
        headers += [f"{clock} s to {target:g}", f"rounds to {target:g}"]
    rows = []
    for r in runs:
        n = len(r.rounds)
        wall = [x.wall_s for x in r.rounds]
        row: list[Any] = [r.label, *chain_of(r), n, r.final.accuracy, best_accuracy(r), r.sim_time[-1],
                          r.sim_time[-1] / n, r.cum_bytes[-1] / MB, r.weight_bytes / MB, sum(wall), r.status] \
            if n else [r.label, *chain_of(r), n, *[None] * 7, r.status]  # alive in round 1: no numbers yet
        if target is not None:
            row += [r.time_to_target(target), r.rounds_to_target(target)]
        rows.append(row)
    return headers, rows


def chain_of(run: Run) -> tuple[str | None, int | None, str | None]:
    """The run's mode, tiers and U-shape ("yes" or "no") from its settings (``summary.json``'s, else those its
    checkpoint records: a run stopped before its end); None for what they do not say (a run without either),
    so two runs' rows tell what they compare."""
    s = run.settings
    mode, tiers, u = s.get("mode"), s.get("tiers"), s.get("u_shape")
    return (mode if isinstance(mode, str) else None,
            tiers if isinstance(tiers, int) and not isinstance(tiers, bool) else None,
            {True: "yes", False: "no"}.get(u) if isinstance(u, bool) else None)


def best_accuracy(run: Run) -> float:
    """The run's best test accuracy over the rounds that have one (a diverged round's ``null`` reads as NaN,
    which ``max`` would return or skip by where it stands); NaN when no round has one."""
    return max((x.accuracy for x in run.rounds if not math.isnan(x.accuracy)), default=math.nan)


_MARKDOWN = frozenset("\\`*[]<>|~$&")  # what starts or ends markup in a line of GitHub Markdown (``$``: math)


def markdown_text(text: str) -> str:
    """``text`` as it reads, in a Markdown table's cell or inside a line: on one line (:func:`shown`), each
    character that would make markup backslash-escaped, ``\\`` too (so that ``a\\|b`` neither splits a cell
    nor loses its backslash); ``_`` only where it could (not inside a word: ``run_1`` stays as it is). Spaces
    at either end are ``&#32;``: a table's cell, and an emphasis, trims them."""
    t = shown(text)
    t = "".join("\\" + c if c in _MARKDOWN or (c == "_" and not _inside_word(t, i)) else c for i, c in enumerate(t))
    return re.sub(r"^ +| +$", lambda m: "&#32;" * len(m.group()), t)


def _inside_word(text: str, i: int) -> bool:
    """Whether ``text[i]`` stands between two letters or digits, where CommonMark's ``_`` makes no emphasis."""
    return 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()


def markdown_item(text: str) -> str:
    """``- text``: a list item that reads as ``text`` (:func:`markdown_text`), also where ``text`` starts as a
    block would (``# x`` a heading, ``- x`` or ``1. x`` a list)."""
    t = markdown_text(text)
    t = re.sub(r"^(\d{1,9})([.)])(?=[ \t]|$)", r"\1\\\2", t)
    return "- " + ("\\" + t if t[:1] in ("#", "+", "-", "=") else t)


def markdown_code(text: str) -> str:
    """``text`` as a code span on one line: fenced by more backticks than it holds in a row, padded where
    it starts or ends with one (CommonMark strips one space each side only where both have one)."""
    text = shown(text)
    fence = "`" * (1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip()) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (text escaped: :func:`markdown_text`; numbers right-aligned, a column's
    floats with alike decimals: :func:`~splitfed.report.table.format_cells`)."""
    cells = format_cells(rows)
    numeric = [all(isinstance(row[j], int | float) or row[j] is None for row in rows) and bool(rows)
               for j in range(len(headers))]
    out = ["| " + " | ".join(markdown_text(format_value(h)) for h in headers) + " |",
           "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    out += ["| " + " | ".join(markdown_text(c) for c in row) + " |" for row in cells]
    return "\n".join(out)


# settings every run has its own of (never what two runs compare), and those the runs table shows
_OWN = frozenset({"out", "run_name", "resume", "overwrite", "mode", "tiers", "u_shape"})


def differing_settings(runs: Sequence[Run]) -> tuple[list[str], list[list[Any]]]:
    """Headers (``setting``, then each run's label) and a row per setting that not every run has alike (of
    those every run records): what the runs compare, the table's columns aside (``cuts``, ``hysteresis``,
    ``lr``...). None for fewer than two runs."""
    if len(runs) < 2:
        return [], []
    shared = set.intersection(*(set(r.settings) for r in runs)) - _OWN
    rows = [[key.replace("_", "-"), *(_as_set(r.settings[key]) for r in runs)] for key in sorted(shared)
            if len({json.dumps(r.settings[key], sort_keys=True) for r in runs}) > 1]
    return (["setting", *(r.label for r in runs)], rows) if rows else ([], [])


def _as_set(v: Any) -> str:
    """A setting's value as a config file sets it: ``0.05``, ``true``, ``adaptive`` (not a table's 0.0500)."""
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def summary_markdown(runs: Sequence[Run], target: float | None = None,
                     images: Mapping[str, str | Path] | None = None, title: str = "splitfed report") -> str:
    """``summary.md``: the runs table, what a reader must know of a run (did not finish, a cut line),
    where each run came from (its absolute path: the file is read from its own folder, not from where the
    command ran), and the figures (relative links)."""
    runs = [r if r.path is None else replace(r, path=r.path.resolve()) for r in runs]
    headers, rows = summary_rows(runs, target)
    parts = [f"# {title}", "", markdown_table(headers, rows), ""]
    named, differ = differing_settings(runs)
    if differ:
        parts += ["## Settings that differ", "", markdown_table(named, differ), ""]
    notes = [markdown_item(note) for r in runs for note in run_notes(r)]
    if notes:
        parts += ["## Notes", "", *notes, ""]
    if target is not None:
        seconds = {"sim": "simulated seconds (cost-model clock)", "measured": "measured seconds (round times)"}.get(
            clock_of(runs), "simulated seconds (cost-model clock), or measured ones for a deployment")
        parts += [f"Time to target: {seconds} until the global model's test "
                  f"accuracy first reaches {target:g}; `-`: not in the rounds the run has (a run that did not "
                  "finish may reach it later).", ""]
    sources = [f"- **{markdown_text(r.label)}**: {markdown_code(str(r.path))}" for r in runs if r.path is not None]
    if sources:
        parts += ["## Runs", "", *sources, ""]
    if images:
        parts += ["## Figures", ""]
        parts += [f"![{markdown_text(name)}]({Path(p).as_posix()})" for name, p in images.items()]
        parts.append("")
    return "\n".join(parts)


# the time columns keep their names (readers go by header); ``clock`` says what they hold in each row: "sim" (the
# cost model's clock) or "measured" (a run without one: its measured round times); ``predicted_round_s``: what
# the cost model predicted of a measured round before it ran
ROUND_COLUMNS = ("run", "round", "accuracy", "loss", "sim_round_s", "sim_time_s", "wall_s", "bytes_up",
                 "bytes_down", "bytes_total", "clients", "clock", "predicted_round_s", "weight_bytes")


def _number(v: Any) -> float | None:
    """A number a metrics row may hold (anything else: an empty cell)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def csv_files(out: Path) -> tuple[Path, Path]:
    """The files :func:`write_csv` writes in ``out``: ``summary.csv`` and ``rounds.csv``."""
    return out / "summary.csv", out / "rounds.csv"


def _clients(row: RoundRow) -> int:
    """The clients that finished the round: the row's own ``clients`` where it says (a client that failed
    keeps its cuts in the row), else those with cuts."""
    n = row.extra.get("clients")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else len(row.cuts)


_FORMULA = ("=", "+", "-", "@", "\t", "\r")  # what starts a formula in a spreadsheet's cell (OWASP: CSV injection)


def csv_text(text: str) -> str:
    """``text`` as a CSV cell that a spreadsheet (Excel, LibreOffice) shows as it is and never runs: one that
    would start a formula (a run named ``=HYPERLINK(...)``) led by ``'``, which they read as "text"."""
    return "'" + text if text.startswith(_FORMULA) else text


def csv_cell(v: Any) -> Any:
    """A value as its CSV cell: a missing or non-finite number empty, text as :func:`csv_text` writes it, a
    number as it is (``-0.5`` stays a number)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return csv_text(v) if isinstance(v, str) else v


def csv_texts(runs: Sequence[Run], target: float | None = None) -> tuple[str, str]:
    """The text of ``summary.csv`` and of ``rounds.csv`` (see :func:`write_csv`)."""
    headers, rows = summary_rows(runs, target)
    summary, rounds = io.StringIO(newline=""), io.StringIO(newline="")
    w = csv.writer(summary)
    w.writerow([csv_cell(h) for h in headers])
    w.writerows([[csv_cell(v) for v in row] for row in rows])
    w = csv.writer(rounds)
    w.writerow([csv_cell(h) for h in ROUND_COLUMNS])
    for r in runs:
        for row, t in zip(r.rounds, r.sim_time, strict=True):
            w.writerow([csv_cell(v) for v in (r.label, row.round, row.accuracy, row.loss, row.sim_round_s, t,
                                              row.wall_s, row.bytes_up, row.bytes_down, row.bytes_total,
                                              _clients(row), "measured" if row.extra.get(MEASURED) else "sim",
                                              _number(row.extra.get("predicted_round_s")), row.weight_bytes)])
    return summary.getvalue(), rounds.getvalue()


def write_csv(runs: Sequence[Run], out: Path, target: float | None = None) -> tuple[Path, Path]:
    """``summary.csv`` (the runs table, numbers unrounded) and ``rounds.csv`` (every round of every run),
    for spreadsheets and dataframes; a missing or non-finite number is an empty cell, and text that would
    start a formula is led by ``'`` (:func:`csv_text`). Each file is replaced in one step: an interrupted or
    failed write leaves the one there before, never half of one."""
    out.mkdir(parents=True, exist_ok=True)
    paths = csv_files(out)
    for path, text in zip(paths, csv_texts(runs, target), strict=True):
        write_atomic(path, text)
    return paths

