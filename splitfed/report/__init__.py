"""Reports of runs: read run folders, draw the standard figures, write Markdown and terminal tables."""

from splitfed.report.runs import RoundRow, Run, load_run, load_runs, rows_to_run, write_run
from splitfed.report.summary import markdown_table, summary_markdown, summary_rows
from splitfed.report.table import end_of_run, format_table

__all__ = [
    "RoundRow",
    "Run",
    "end_of_run",
    "format_table",
    "load_run",
    "load_runs",
    "markdown_table",
    "rows_to_run",
    "summary_markdown",
    "summary_rows",
    "write_run",
]
