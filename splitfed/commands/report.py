"""``splitfed report``: turn run folders into the standard figures, ``summary.md``, CSV tables and a terminal table."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from splitfed.errors import ConfigError, SplitfedError, Terminated


class ReportWriteError(SplitfedError):
    """The report could not be written once it was started (a full disk, a file too large): exit code 1, as
    for any command that started and failed. The report there before is kept whole."""

    exit_code = 1


if TYPE_CHECKING:
    from splitfed.report.runs import Run

MANIFEST = ".splitfed-report.json"  # in an --out folder: the files a report wrote there, by sha256 (_written)


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
                   help="output folder (default: RUN_DIR/report for one run, else COMMON_PARENT/report); "
                        "files there of the names a report writes are replaced only if a report wrote them")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files in --out of the names a report writes (summary.md, summary.csv, "
                        "rounds.csv, the figures) that no report wrote, or that were changed since")
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


def run_file(folder: Path) -> str:
    """The file of a run's in ``folder`` (its metrics, summary, checkpoint or lock), "" if none: a run folder,
    never a report's, whatever its name (``runs/report`` may be a run of ``runs/*``)."""
    from splitfed.flower.runfolder import LOCK, RUN_FILES

    return next((name for name in (*RUN_FILES, LOCK) if os.path.lexists(folder / name)), "")


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
    with _terminated_on_sigterm():  # SIGTERM ends it as Ctrl-C does: its drafts removed, 143
        return _run(args)


@contextlib.contextmanager
def _terminated_on_sigterm() -> Iterator[None]:
    """While held (in the main thread, where SIGTERM has its default action), SIGTERM raises
    :class:`~splitfed.errors.Terminated`: the report's drafts are removed on the way out, where the default
    action would end the process at once and leave them beside the report."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(args: argparse.Namespace) -> int:
    from splitfed.report.plots import standard_plot_files
    from splitfed.report.runs import load_runs, run_notes
    from splitfed.report.summary import csv_files, differing_settings, summary_rows
    from splitfed.report.table import class_table, format_table, shown

    paths = [Path(p) for p in args.runs]
    if args.out is not None and not args.out.strip():  # "" would have meant the default folder, silently
        raise ConfigError("--out is empty: name a folder, or leave --out out for the default")
    out = Path(args.out) if args.out else default_out(paths)  # from every path given: where a report before wrote
    runs = load_runs(without_out(paths, out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder")
    held = run_file(out)
    if held:  # its figures would replace the run's own, and an earlier report's be removed (a folder named report)
        default = "" if args.out else " (the default)"
        raise ConfigError(f"cannot write the report to {out}{default}: it is a run folder ({held} is there); "
                          "give --out another folder")
    # every file checked before any is written: a refusal half way left new figures beside an old summary
    files = [*standard_plot_files(runs, out), out / "summary.md", *csv_files(out)]
    for f in [*files, out / MANIFEST]:
        if f.exists() and not f.is_file():
            raise ConfigError(f"cannot write the report to {out}: {f.name} there is "
                              f"{'a folder' if f.is_dir() else 'not a file'} (move it away, or give another --out)")
        if f.exists() and not os.access(f, os.W_OK):
            raise ConfigError(f"cannot write the report to {out}: {f.name} there is read-only "
                              "(make it writable, or give another --out)")
    owned = owned_folder(out, paths)
    ours = _ours(out, owned)
    theirs = [f.name for f in files if os.path.lexists(f) and not ours(f)]
    if theirs and not args.overwrite:  # before: a summary.md of the user's in --out was replaced, unasked
        one = len(theirs) == 1
        raise ConfigError(f"cannot write the report to {out}: {', '.join(theirs)} there {'was' if one else 'were'} "
                          f"not written by splitfed report (give --overwrite to replace {'it' if one else 'them'}, "
                          "or another --out)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".report.{os.getpid()}.tmp"  # a folder that exists may still refuse writes
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write the report to {out}: {e.strerror or e}") from None
    images = write_report(runs, out, args.target, owned)
    headers, rows = summary_rows(runs, args.target)
    print(format_table(headers, rows))
    named, differ = differing_settings(runs)
    if differ:  # what the runs compare, beside the table's own columns
        print("\nsettings that differ")
        print(format_table(named, differ))
    for r in runs:
        if r.clients:
            print()
            print(class_table(r))
    print(f"\nreport: {len(images)} figure(s), summary.md, summary.csv and rounds.csv in {shown(str(out))}")
    for note in (note for r in runs for note in run_notes(r)):  # on stderr: seen also when stdout is a file
        print(f"splitfed report: note: {shown(note)}", file=sys.stderr)  # one line, whatever the folder's name
    return 0


def write_report(runs: Sequence[Run], out: Path, target: float | None, owned: bool = True) -> dict[str, Path]:
    """The figures, ``summary.md``, ``summary.csv`` and ``rounds.csv`` of ``runs`` in ``out``; name -> figure.
    ``owned``: ``out`` is the report's own folder (:func:`owned_folder`). Elsewhere the manifest (:data:`MANIFEST`) says
    which files there a report wrote, and only an earlier report's figure of runs not in this one is removed.

    Every file is written beside its place first (and synced), and all are put in place once all are written:
    an interrupt (Ctrl-C, SIGTERM) or a failed write (a full disk) leaves the report there before as it was,
    never half a file, nor new figures beside an old summary. A failed write is one line naming the file."""
    from splitfed.jsonio import draft_of, write_draft
    from splitfed.report.plots import draw_standard_plots, remove_stale_plots, run_plot_files
    from splitfed.report.summary import csv_files, csv_texts, summary_markdown

    ours = _ours(out, owned)
    staged: list[tuple[Path, Path]] = []  # (draft, its place)
    manifest = draft_of(out / MANIFEST)
    writing = "the figures"
    replaced = 0
    try:
        drawn = draw_standard_plots(runs, out, target)
        staged += drawn.values()
        rel = {name: path.relative_to(out) for name, (_, path) in drawn.items()}
        texts = [summary_markdown(runs, target, rel), *csv_texts(runs, target)]
        for place, text in zip([out / "summary.md", *csv_files(out)], texts, strict=True):
            writing = place.name
            staged.append((draft_of(place), place))
            write_draft(place, text)
        stale = [p for p in run_plot_files(out) if p not in {place for _, place in staged} and os.path.lexists(p)]
        if not owned or os.path.lexists(out / MANIFEST):  # in place first: it names each file there as it is
            writing = MANIFEST                                # before and after, however far the rest goes
            write_draft(out / MANIFEST, _manifest(staged, [p for p in stale if ours(p) and p.is_file()], ours))
            os.replace(manifest, out / MANIFEST)
        for draft, place in staged:
            writing = place.name
            os.replace(draft, place)
            replaced += 1
        writing = "an earlier report's figures"
        remove_stale_plots(out, [place for _, place in staged] + [p for p in stale if not ours(p)])
    except OSError as e:
        kept = ("the report there before, if any, is kept" if not replaced
                else f"{replaced} of its {len(staged)} files are new")
        raise ReportWriteError(f"cannot write the report to {out}: {_named(e, writing)}: {e.strerror or e} "
                               f"({kept})") from None
    finally:
        for draft, _ in staged[replaced:]:
            draft.unlink(missing_ok=True)
        manifest.unlink(missing_ok=True)
    return {name: place for name, (_, place) in drawn.items()}


def owned_folder(out: Path, paths: list[Path]) -> bool:
    """Whether ``out`` is the report's own folder, where a file of a name a report gives is the report's
    whoever wrote it: the default one for ``paths``, or any run folder's ``report`` (which ``simulate
    --overwrite`` removes with the run). Any other is maybe a folder of the user's (:func:`_ours`)."""
    from splitfed.flower.metrics import METRICS

    folder = Path(os.path.abspath(out))
    return (folder.resolve() == default_out(paths).resolve()
            or (folder.name == "report" and not folder.is_symlink() and (folder.parent / METRICS).is_file()))


def _ours(out: Path, owned: bool) -> Callable[[Path], bool]:
    """Whether a file in ``out`` is a report's, to replace or remove: any in the report's own folder
    (``owned``: :func:`owned_folder`); elsewhere (``--out``: maybe a folder of the user's) only one a report wrote there as
    it is now (its sha256 in the manifest, :data:`MANIFEST`), never a link (a report writes none)."""
    if owned:
        return lambda path: True
    written = _written(out)
    return lambda path: (path.is_file() and not path.is_symlink()
                         and _sha256(path) in written.get(path.name, ()))


def _written(out: Path) -> dict[str, list[str]]:
    """name -> the sha256 of each version of it that reports wrote in ``out``, as its manifest says (none
    there, or one that cannot be read: nothing is taken for a report's)."""
    try:
        files = json.loads((out / MANIFEST).read_text(encoding="utf-8"))["files"]
        return {name: [str(d) for d in digests] for name, digests in files.items() if isinstance(digests, list)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _manifest(staged: Sequence[tuple[Path, Path]], stale: Sequence[Path], ours: Callable[[Path], bool]) -> str:
    """The manifest of a report about to put ``staged`` (draft, place) in place and remove ``stale``: each
    file's new sha256, and its sha256 now where it is a report's (a write that stops part way leaves some
    files old, some new: both stay the report's)."""
    files: dict[str, list[str]] = {}
    for draft, place in staged:
        files[place.name] = [_sha256(draft), *([_sha256(place)] if place.is_file() and ours(place) else [])]
    for place in stale:
        files[place.name] = [_sha256(place)]
    return json.dumps({"written by": "splitfed report", "files": files}, indent=2, sort_keys=True) + "\n"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _named(e: OSError, writing: str) -> str:
    """The file a failed write was for: the one ``e`` names (a figure's draft named as its figure), else
    ``writing``."""
    if not e.filename:
        return writing
    from splitfed.jsonio import drafted_for

    return drafted_for(Path(os.fsdecode(e.filename)).name)
