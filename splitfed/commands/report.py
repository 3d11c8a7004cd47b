"""``splitfed report``: turn run folders into the standard figures, ``summary.md``, CSV tables and a terminal table."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from splitfed.errors import ConfigError


def _accuracy(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an accuracy in (0, 1], got {text!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"expected an accuracy in (0, 1], got {v}")
    return v


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="plots and a Markdown summary of one or more run folders",
                       description=__doc__)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="run folders (each with metrics.jsonl), or their metrics.jsonl files; the output folder "
                        "itself, given among them (runs/* once runs/report is there), is left out")
    p.add_argument("--out", default=None,
                   help="output folder (default: RUN_DIR/report for one run, else COMMON_PARENT/report)")
    p.add_argument("--target", type=_accuracy, default=None,
                   help="target accuracy: adds simulated time and rounds to reach it")
    p.set_defaults(func=run)


def default_out(paths: list[Path]) -> Path:
    """Beside the runs (a ``metrics.jsonl`` given stands for its folder); runs with nothing but ``/`` in
    common get ``./report`` rather than ``/report``."""
    from splitfed.report.runs import run_folder

    folders = [run_folder(p) for p in paths]
    if len(folders) == 1:
        return folders[0] / "report"
    common = Path(os.path.commonpath([p.resolve() for p in folders]))
    return Path("report") if common == Path(common.anchor) else common / "report"


def without_out(paths: list[Path], out: Path) -> list[Path]:
    """``paths`` less the output folder itself where it is among them and holds no run: ``splitfed report
    runs/*`` writes ``runs/report``, which the same command's ``runs/*`` then names too. Any other folder
    without ``metrics.jsonl`` is still refused (by the reader), and so is the output folder given alone."""
    from splitfed.flower.metrics import METRICS

    def is_out(p: Path) -> bool:
        return p.is_dir() and not (p / METRICS).exists() and p.resolve() == out.resolve()

    kept = [p for p in paths if not is_out(p)]
    return kept or paths


def run(args: argparse.Namespace) -> int:
    from splitfed.report.plots import standard_plot_files, standard_plots
    from splitfed.report.runs import load_runs, run_notes
    from splitfed.report.summary import csv_files, summary_markdown, summary_rows, write_csv
    from splitfed.report.table import class_table, format_table

    paths = [Path(p) for p in args.runs]
    if args.out is not None and not args.out.strip():  # "" would have meant the default folder, silently
        raise ConfigError("--out is empty: name a folder, or leave --out out for the default")
    out = Path(args.out) if args.out else default_out(paths)  # from every path given: where a report before wrote
    runs = load_runs(without_out(paths, out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder")
    # every file checked before any is written: a refusal half way left new figures beside an old summary
    for f in [*standard_plot_files(runs, out), out / "summary.md", *csv_files(out)]:
        if f.exists() and not f.is_file():
            raise ConfigError(f"cannot write the report to {out}: {f.name} there is "
                              f"{'a folder' if f.is_dir() else 'not a file'} (move it away, or give another --out)")
        if f.exists() and not os.access(f, os.W_OK):
            raise ConfigError(f"cannot write the report to {out}: {f.name} there is read-only "
                              "(make it writable, or give another --out)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".report.{os.getpid()}.tmp"  # a folder that exists may still refuse writes
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write the report to {out}: {e.strerror or e}") from None
    images = standard_plots(runs, out, args.target)
    rel = {name: p.relative_to(out) for name, p in images.items()}
    (out / "summary.md").write_text(summary_markdown(runs, args.target, rel))
    write_csv(runs, out, args.target)
    headers, rows = summary_rows(runs, args.target)
    print(format_table(headers, rows))
    for r in runs:
        if r.clients:
            print()
            print(class_table(r))
    print(f"\nreport: {len(images)} figure(s), summary.md, summary.csv and rounds.csv in {out}")
    for note in (note for r in runs for note in run_notes(r)):  # on stderr: seen also when stdout is a file
        print(f"splitfed report: note: {note}", file=sys.stderr)
    return 0
