"""Per-round metrics as JSON lines, and the run's summary.

``metrics.jsonl`` gets one object per finished round, flushed as it is written
so a crashed run keeps every round it finished; a resumed run first drops rows
after its checkpoint's round, so the file never holds a round twice. A finished
run resumed for more rounds amends its last row's ``decision`` (``amend``): the
adaptive policy's "last round" made again for the rounds added, as one run's row says.
``summary.json`` is written (atomically) at the end of the run. Both are strict
JSON (what jq, browsers and pandas read): a NaN or infinite number, such as the
loss of a diverged model, is written as ``null``.

A round's row is written right after its checkpoint, which keeps a copy of it: a
resume puts back the row of a crash between the two (``checkpoint.restore_row``), so
the file holds every round the checkpoint does, and one that lacks another of them
(damaged, or cut by hand) is refused rather than continued with a hole. A disk that fails while a
row is written is one :class:`~splitfed.errors.RunFolderError` line.

Each row is fsynced as it is appended; a file made anew (the metrics a run starts or a resume rewrites, the
summary) is also made durable in its folder (:func:`~splitfed.jsonio.sync_folder`): an fsynced file whose name the folder
has not recorded on disk may be gone after a power loss.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from splitfed.errors import ConfigError, RunFolderError
from splitfed.jsonio import dumps, sync_folder, write_atomic

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


def rows_kept(folder: str | Path, *, cut: bool = True) -> int:
    """How many rows (finished rounds) a run folder's metrics hold, counted without parsing them (0: none, or no
    file). A last row that a crash or a full disk cut short (no newline, not JSON) counts if ``cut``; without,
    it is no finished round (a resume puts it back whole from its checkpoint: ``checkpoint.restore_row``)."""
    path = Path(folder) / METRICS
    if not path.is_file():
        return 0
    text = path.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if not cut and lines and not text.endswith("\n") and lines[-1].lstrip().startswith("{"):
        try:
            json.loads(lines[-1])
        except ValueError:
            return len(lines) - 1
    return len(lines)


def read_rows(path: str | Path) -> list[Any]:
    """The lines of a metrics file, as JSON values. A last line without its newline is a row whose append a
    crash (or a write still in progress) cut short: it is dropped, and a resumed run redoes that round. Any
    other line that is not JSON is refused with its line number."""
    return read_rows_cut(path)[0]


def read_rows_cut(path: str | Path) -> tuple[list[Any], bool]:
    """:func:`read_rows`, and whether a cut-short last line was dropped (one read: a row appended
    meanwhile is not taken for a cut one)."""
    rows, cut = _numbered_rows(Path(path))
    return [row for _, row in rows], cut


def run_rows(path: str | Path) -> list[dict[str, Any]]:
    """:func:`read_rows` of a run's own metrics, each line a row: an object whose ``round`` is a whole number
    >= 1, else refused naming the line. A resume keeps, drops and counts rows by their round, and such a line
    made it stop with a traceback (``[]``: AttributeError; ``"round": null``: TypeError) or a false reason
    (``{}``: "out of order", ``"round": 2.5``: "round 2 twice")."""
    p = Path(path)
    rows, _ = _numbered_rows(p)
    for n, row in rows:
        r = row.get("round") if isinstance(row, dict) else None
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            what = f"its round is {json.dumps(r)}" if isinstance(row, dict) else f"not an object: {dumps(row)[:40]}"
            raise ConfigError(f"{p}:{n}: not a metrics row ({what}); put the file back as the run wrote it, or start "
                              "the run again with --overwrite")
    return [row for _, row in rows]


def _numbered_rows(p: Path) -> tuple[list[tuple[int, Any]], bool]:
    text = p.read_text(errors="replace")
    lines = text.splitlines()
    rows: list[tuple[int, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            if n == len(lines) and not text.endswith("\n"):
                return rows, True
            raise ConfigError(f"{p}:{n}: not valid JSON: {e.msg}: column {e.colno}") from None
        except (ValueError, RecursionError) as e:  # past json's grammar: an integer of over 4,300 digits, nesting
            raise ConfigError(f"{p}:{n}: not valid JSON: {str(e).split(';')[0]}") from None
    return rows, False


def check_rounds(path: str | Path, round: int) -> None:
    """Refuse to continue after ``round`` (the checkpoint's) unless the file holds rounds 1..``round``, each
    once (rows after it are a round the crash cut short; the resume redoes it)."""
    p = Path(path)
    held = [int(r["round"]) for r in run_rows(p)] if p.is_file() else []
    held = [r for r in held if r <= round]
    if held == list(range(1, round + 1)):
        return
    missing = sorted(set(range(1, round + 1)) - set(held))
    twice = sorted({r for r in held if held.count(r) > 1})
    what = (f"lacks round(s) {_rounds(missing)}" if missing else f"holds round(s) {_rounds(twice)} twice"
            if twice else "holds its rounds out of order")
    raise ConfigError(f"cannot resume: {p} {what}, but the checkpoint holds round {round} (a row is written "
                      "right after its round's checkpoint, which keeps a copy of it, so the file was changed after "
                      "it was written); put the file back, or start the run again with --overwrite")


def _rounds(rounds: Sequence[int], show: int = 5) -> str:
    more = f", +{len(rounds) - show} more" if len(rounds) > show else ""
    return ", ".join(map(str, rounds[:show])) + more


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        again = shlex.quote(str(path.parent))
        raise RunFolderError(f"cannot write {path}: {e.strerror or e} (the rounds before it are kept: free space "
                             f"or fix the folder, then continue with --resume {again})") from None


class MetricsWriter:
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / METRICS

    def rows(self) -> list[dict[str, Any]]:
        return run_rows(self.path) if self.path.is_file() else []

    def truncate_after(self, round: int) -> None:
        """Keep only rows of rounds <= ``round`` (a resumed run redoes the rest)."""
        keep = [r for r in self.rows() if r["round"] <= round]
        with _writing(self.path):
            write_atomic(self.path, "".join(dumps(r) + "\n" for r in keep))  # its name made durable too

    def amend(self, round: int, **fields: Any) -> None:
        """Set ``fields`` in the row of round ``round`` (the file rewritten atomically: a crash leaves it as it
        was or amended, never cut)."""
        rows = [{**r, **fields} if r["round"] == round else r for r in self.rows()]
        with _writing(self.path):
            write_atomic(self.path, "".join(dumps(r) + "\n" for r in rows))

    def append(self, row: Mapping[str, Any]) -> None:
        with _writing(self.path):
            made = not self.path.exists()
            with open(self.path, "a") as f:
                f.write(dumps(dict(row)) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if made:  # a row in a file the folder does not yet hold on disk would be lost with the file
                sync_folder(self.folder)

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        path = self.folder / SUMMARY
        with _writing(path):
            write_atomic(path, dumps(dict(summary), indent=2, sort_keys=True) + "\n")
        return path


def summary_again(folder: str | Path, done: int, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a run whose checkpoint holds its last round (``done``), written again from its rows
    (a lost or stale ``summary.json``): what a resume with nothing left to do leaves behind."""
    writer = MetricsWriter(folder)
    rows = [r for r in writer.rows() if r["round"] <= done]  # checked on resume: rounds 1..done
    summary = summarise(rows, settings)
    writer.write_summary(summary)
    return summary


def summarise(rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The run in one object: final and best accuracy, totals of time and bytes."""
    acc = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
    sim = [r["sim_round_s"] for r in rows if r.get("sim_round_s") is not None]
    return {
        "rounds": len(rows),
        # the model's before any training (round 1's row: a resumed run keeps it)
        "initial_accuracy": next((r.get("initial_accuracy") for r in rows if r.get("round") == 1), None),
        "final_accuracy": acc[-1] if acc else None,
        "best_accuracy": max(acc) if acc else None,
        "final_loss": rows[-1]["loss"] if rows else None,
        "wall_s": sum(r.get("wall_s", 0.0) for r in rows),
        "sim_time_s": sum(sim) if sim else None,
        "bytes_up": sum(r.get("bytes_up", 0) for r in rows),
        "bytes_down": sum(r.get("bytes_down", 0) for r in rows),
        # the coordinator's weight traffic with the server tiers, all rounds: [sent, received] per tier
        "tier_weight_bytes": _tier_weight_bytes(rows),
        # the devices' weight exchange, all rounds: [to the devices, back]
        "device_weight_bytes": [sum(_pair(r.get("device_weight_bytes"))[k] for r in rows) for k in (0, 1)],
        "failed_clients": sum(len(r.get("failed", [])) for r in rows),
        "settings": dict(settings),
    }


def _pair(v: Any) -> tuple[int, int]:
    """A row's [sent, received] (rows older than the field have none: 0, 0)."""
    return (int(v[0]), int(v[1])) if isinstance(v, list | tuple) and len(v) == 2 else (0, 0)


def _tier_weight_bytes(rows: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """[sent, received] bytes per server tier over the rows that say (rows older than the field do not)."""
    total: list[list[int]] = []
    for r in rows:
        for t, (to, back) in enumerate(r.get("tier_weight_bytes") or []):
            if t == len(total):
                total.append([0, 0])
            total[t][0] += int(to)
            total[t][1] += int(back)
    return total
