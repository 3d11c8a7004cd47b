"""Review of the checkpoint and the metrics file as what must never lose a run: a crash at each point of a
round's write (a real process killed with SIGKILL there) leaves a checkpoint and rows a resume continues as
one consistent pair; a checkpoint it cannot read, of a format it does not know, or of another run is
refused naming the file and what to do."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitfed.errors import ConfigError, RunFolderError
from splitfed.flower import checkpoint
from splitfed.flower.metrics import METRICS, MetricsWriter, check_rounds, run_rows

# rounds 1 and 2 finish; round 3 is killed at POINT (a real SIGKILL of the writing process)
_CHILD = r"""
import json, os, signal, sys
import torch
from splitfed.flower import checkpoint, metrics

folder, point = sys.argv[1], sys.argv[2]
writer = metrics.MetricsWriter(folder)


def die(*_a, **_k):
    os.kill(os.getpid(), signal.SIGKILL)


def one(r):
    row = {"round": r, "loss": 1.0 / r, "accuracy": 0.1 * r, "wall_s": 0.5}
    state = {"w": torch.full((4096,), float(r)), "b": torch.arange(r, dtype=torch.int64)}
    checkpoint.save(folder, checkpoint.Checkpoint(r, state, {"rounds": 5}, row=row))
    writer.append(row)


one(1)
one(2)
if point == "write":  # torch has written part of the new file
    real = checkpoint._Writer.write
    checkpoint._Writer.write = lambda self, data: (real(self, data), die())[0]
elif point == "fsync":  # the new file written, not yet on disk
    os.fsync = die
elif point == "replace":  # the new file durable, not yet in place
    os.replace = die
elif point == "dirsync":  # in place, its name not yet durable
    checkpoint.sync_folder = die
elif point == "row":  # the checkpoint whole, its row not yet written
    metrics.MetricsWriter.append = die
elif point == "halfrow":  # the row's append cut short
    def half(self, row):
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(row))[:17])
            f.flush()
        die()
    metrics.MetricsWriter.append = half
one(3)
"""

_KEPT = {"write": 2, "fsync": 2, "replace": 2, "dirsync": 3, "row": 3, "halfrow": 3}


def _resume_rows(folder: Path) -> tuple[checkpoint.Checkpoint, list[dict[str, object]]]:
    """What a resume does with the folder before its first round (server.app._resume, then the writer)."""
    ckpt = checkpoint.load(folder)
    checkpoint.restore_row(folder, ckpt)
    check_rounds(folder / METRICS, ckpt.round)
    MetricsWriter(folder).truncate_after(ckpt.round)
    return ckpt, run_rows(folder / METRICS)


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(_KEPT))
def test_a_process_killed_at_any_point_of_a_round_leaves_a_pair_a_resume_continues(tmp_path, point):
    """The writer is a fork of this process (torch and splitfed already imported: a fresh interpreter cost ~2 s
    of imports per point), killed with SIGKILL as a fresh one was; it never returns into pytest."""
    folder = tmp_path / "run"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: _CHILD as ``python -c _CHILD FOLDER POINT`` runs it, then only ever exits
        try:
            sys.argv = ["-c", str(folder), point]
            exec(compile(_CHILD, "<child>", "exec"), {"__name__": "__main__"})  # noqa: S102
        except BaseException:  # noqa: BLE001 - a failure is an exit code, never a return into pytest
            import traceback

            traceback.print_exc()
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    ckpt, rows = _resume_rows(folder)
    assert ckpt.round == _KEPT[point]
    assert torch.equal(ckpt.state["w"], torch.full((4096,), float(ckpt.round)))
    assert [r["round"] for r in rows] == list(range(1, ckpt.round + 1))  # checkpoint round == rows kept
    assert rows[-1] == ckpt.row
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [checkpoint.FILENAME,
                                                                                       METRICS]


def test_a_failed_replace_keeps_the_previous_checkpoint_and_no_draft(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    checkpoint.save(folder, checkpoint.Checkpoint(1, {"w": torch.ones(3)}, {"rounds": 2}))

    def refuse(*_a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(RunFolderError, match="previous one is kept"):
        checkpoint.save(folder, checkpoint.Checkpoint(2, {"w": torch.zeros(3)}, {"rounds": 2}))
    monkeypatch.undo()
    assert checkpoint.load(folder).round == 1
    assert [p.name for p in folder.iterdir()] == [checkpoint.FILENAME]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.integers(1, 4), behind=st.booleans(), cut=st.floats(0.0, 1.0))
def test_a_torn_last_row_or_a_row_beyond_the_checkpoint_is_mended_on_resume(tmp_path_factory, rounds, behind,
                                                                              cut):
    """The last row cut anywhere (a crash mid-append), for the checkpoint's round or one after it (a
    diverged round's row, written without a checkpoint): the resume keeps exactly rounds 1..checkpoint."""
    folder = tmp_path_factory.mktemp("run")
    writer = MetricsWriter(folder)
    kept = rounds - 1 if behind else rounds
    for r in range(1, rounds + 1):
        row = {"round": r, "loss": 0.5 + r, "accuracy": None}
        if r <= kept:
            checkpoint.save(folder, checkpoint.Checkpoint(r, {"w": torch.full((2,), float(r))}, {}, row=row))
        writer.append(row)
    path = folder / METRICS
    text = path.read_text()
    start = text.rstrip("\n").rfind("\n") + 1
    path.write_text(text[: start + int(cut * (len(text) - 1 - start))])
    if kept == 0:
        assert not (folder / checkpoint.FILENAME).exists()
        return
    ckpt, rows = _resume_rows(folder)
    assert ckpt.round == kept
    assert [r["round"] for r in rows] == list(range(1, kept + 1))
    assert rows[-1] == ckpt.row
    assert path.read_text().endswith("\n")


def _run(folder: Path, rounds: int, shift: float) -> Path:
    writer = MetricsWriter(folder)
    for r in range(1, rounds + 1):
        row = {"round": r, "loss": 1.0 + shift, "accuracy": 0.25 * r + shift}
        checkpoint.save(folder, checkpoint.Checkpoint(r, {"w": torch.full((3,), r + shift)}, {"rounds": 9},
                                                      row=row))
        writer.append(row)
    return folder


def test_a_checkpoint_of_another_run_is_refused_naming_it(tmp_path):
    """Run b's checkpoint copied over run a's (the same round): resuming would train b's model under a's rows."""
    a, b = _run(tmp_path / "a", 2, 0.0), _run(tmp_path / "b", 2, 0.5)
    shutil.copy(b / checkpoint.FILENAME, a / checkpoint.FILENAME)
    with pytest.raises(ConfigError, match=r"checkpoint\.pt is not the checkpoint of the run in .*metrics\.jsonl"
                                          r".*put this run's checkpoint back, or start the run over"):
        _resume_rows(a)
    assert len(run_rows(a / METRICS)) == 2  # nothing changed


def test_a_truncated_checkpoint_is_refused_saying_what_to_do(tmp_path):
    folder = _run(tmp_path / "run", 1, 0.0)
    path = folder / checkpoint.FILENAME
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ConfigError, match=rf"{path}.*corrupt or truncated.*restore it from a copy or start the "
                                          "run over with --overwrite"):
        checkpoint.load(folder)


@pytest.mark.parametrize(("fmt", "todo"), [(checkpoint.FORMAT + 1, "written by a newer splitfed.*resume it with "
                                                                    "that version"),
                                           (0, "restore it from a copy or start the run over with --overwrite"),
                                           ("2", "restore it from a copy or start the run over with --overwrite")])
def test_a_checkpoint_of_an_unknown_format_is_refused_saying_what_to_do(tmp_path, fmt, todo):
    folder = _run(tmp_path / "run", 1, 0.0)
    path = folder / checkpoint.FILENAME
    payload = torch.load(path, weights_only=True)
    payload["format"] = fmt
    torch.save(payload, path)
    with pytest.raises(ConfigError, match=rf"cannot resume: {path} is of checkpoint format .*{todo}"):
        checkpoint.load(folder)


def test_the_rows_a_checkpoint_keeps_are_the_rows_written(tmp_path):
    """The check of another run's checkpoint compares the row it keeps with the file's: for the run's own
    pair (strict JSON: a NaN loss is null in both) they are equal, and a resume goes on."""
    folder = tmp_path / "run"
    row = {"round": 1, "loss": float("nan"), "accuracy": 0.1, "failed": ["c1"]}
    checkpoint.save(folder, checkpoint.Checkpoint(1, {"w": torch.ones(1)}, {}, row=row))
    MetricsWriter(folder).append(row)
    ckpt, rows = _resume_rows(folder)
    assert rows == [ckpt.row] and json.loads((folder / METRICS).read_text())["loss"] is None
