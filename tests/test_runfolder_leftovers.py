"""Run folders and checkpoints: what an earlier review left open. Each test failed before its fix.

- a metrics file made anew (a run's start, a resume's rewrite) or a summary was fsynced, but not the folder
  that names it: after a power loss the name could be gone with every row in it (the in-process backend,
  which keeps no checkpoint, never fsynced its folder at all), and so could a new run folder's own name;
- ``--overwrite`` removed the old run's metrics, summary and checkpoint only: its figures and the report
  of it (``report/``: figures, ``summary.md``, ``rounds.csv``...) stayed beside the new run's rows until
  it ended, the report for good; and a folder in a run file's place left the run half removed;
- a resume read and checked its checkpoint (the sha256 of all it holds) up to three times in the
  ServerApp, and twice to five times more in ``splitfed simulate --resume``: now once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import clients.app
from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.metrics import METRICS, SUMMARY, MetricsWriter
from tests.flower_fixtures import FakeGrid, inprocess_tiers
from tests.test_resume_review import SMALL, _numbers

# ---------------------------------------------------------------- 1. a new file's name is made durable


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, dict[str, int] | None]]:
    """Each fsync: the path synced, and for a folder what it named then (name -> inode)."""
    seen: list[tuple[Path, dict[str, int] | None]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        seen.append((path, {p.name: p.stat().st_ino for p in path.iterdir()} if path.is_dir() else None))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _named_durably(seen: list[tuple[Path, dict[str, int] | None]], path: Path) -> bool:
    """Whether ``path``'s folder was fsynced once it named the file now at ``path``."""
    ino = path.stat().st_ino
    return any(d == path.parent.resolve() and names is not None and names.get(path.name) == ino
               for d, names in seen)


def test_a_metrics_file_made_or_rewritten_and_a_summary_are_named_durably(tmp_path, synced):
    folder = tmp_path / "run"
    writer = MetricsWriter(folder)
    writer.truncate_after(0)  # a run's start: the file made
    assert _named_durably(synced, folder / METRICS)
    writer.append({"round": 1})
    writer.append({"round": 2})
    synced.clear()
    writer.truncate_after(1)  # a resume's rewrite: a new file in the old one's place
    assert _named_durably(synced, folder / METRICS)
    writer.write_summary({"rounds": 1})
    assert _named_durably(synced, folder / SUMMARY)
    (folder / METRICS).unlink()
    synced.clear()
    writer.append({"round": 1})  # appended to a file not there: made by the append
    assert _named_durably(synced, folder / METRICS)
    synced.clear()
    writer.append({"round": 2})  # a row in a file the folder holds: the file's own fsync is enough
    assert [p for p, _ in synced] == [(folder / METRICS).resolve()]
    assert [json.loads(x)["round"] for x in (folder / METRICS).read_text().splitlines()] == [1, 2]


def test_an_inprocess_run_and_a_new_run_folder_are_named_durably(tmp_path, synced):
    """The in-process backend keeps no checkpoint, whose save fsyncs the folder: before, its metrics and
    summary were never named durably, nor the run folder it made (two levels here) in its parent."""
    from splitfed.sim.inprocess import train_inprocess

    folder = tmp_path / "runs" / "run"
    train_inprocess(SMALL.with_(rounds=1, out=str(folder)))
    assert _named_durably(synced, folder / METRICS) and _named_durably(synced, folder / SUMMARY)
    assert _named_durably(synced, folder) and _named_durably(synced, folder.parent)


# ---------------------------------------------------------------- 2. --overwrite leaves nothing of the old run


def _server_run(folder: Path, monkeypatch: pytest.MonkeyPatch, progress: Callable[[str], None] = lambda s: None,
                **kw: object) -> dict:
    import server.app

    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        return server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder), **kw),
                              progress=progress)


def _old_run(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """A finished run of 2 rounds with what ``splitfed simulate`` draws at its end and ``splitfed report``
    writes of it, a deployment's figure, and files of the user's; the user's files (path -> bytes)."""
    from splitfed.commands.simulate import _report

    _server_run(folder, monkeypatch, rounds=2)
    assert _report(str(folder)) >= 5  # the figures simulate draws in the run folder, a cut heatmap among them
    assert main(["report", str(folder)]) == 0  # into folder/report
    (folder / "predicted_vs_measured.png").write_bytes(b"an older deployment's figure")
    mine = {folder / "notes.txt": b"mine\n", folder / "my_plot.png": b"my own figure",
            folder / "report" / "notes.md": b"my notes on the report\n"}
    for p, data in mine.items():
        p.write_bytes(data)
    (folder / "bytes.png.d").mkdir()  # a folder of the user's, however named
    return {str(p.relative_to(folder)): data for p, data in mine.items()}


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_overwrite_removes_the_old_runs_figures_and_report_before_the_new_run_writes(tmp_path, monkeypatch,
                                                                                     capsys):
    """Before, a user looking at the folder in the new run's round 1 saw the old run's figures (and its
    report, which stayed for good) beside the new run's metrics."""
    folder = tmp_path / "run"
    mine = _old_run(folder, monkeypatch)
    old = _listing(folder)
    assert {"accuracy_vs_time.png", "cuts_1_run.png", "report/rounds.csv", "report/summary.md",
            "report/cuts_1_run.png"} <= old
    seen: list[set[str]] = []

    def progress(line: str) -> None:
        if line.startswith("round 1"):  # mid-run: the new run's round 1 is kept
            seen.append(_listing(folder))

    _server_run(folder, monkeypatch, progress, rounds=1, overwrite=True)
    kept = {*mine, "bytes.png.d", "report", runfolder.LOCK}
    assert seen == [kept | {METRICS, checkpoint.FILENAME}], seen  # nothing else of the old run
    assert _listing(folder) == kept | {METRICS, checkpoint.FILENAME, SUMMARY}
    assert all((folder / p).read_bytes() == data for p, data in mine.items())
    assert [json.loads(x)["round"] for x in (folder / METRICS).read_text().splitlines()] == [1]

    (folder / "report" / "notes.md").unlink()  # a report folder with nothing of the user's goes with the run
    assert main(["report", str(folder)]) == 0
    _server_run(folder, monkeypatch, rounds=1, overwrite=True)
    assert not (folder / "report").exists()
    capsys.readouterr()


def test_a_folder_in_a_run_files_place_refuses_overwrite_and_removes_nothing(tmp_path, monkeypatch, capsys):
    """Before, the metrics and summary were removed, then the folder named checkpoint.pt raised
    IsADirectoryError: the old run half removed and no clear word. Now refused, before and at the claim."""
    folder = tmp_path / "run"
    (folder / checkpoint.FILENAME).mkdir(parents=True)
    (folder / METRICS).write_text('{"round": 1}\n')
    (folder / SUMMARY).write_text('{"rounds": 1}\n')
    (folder / "accuracy_vs_time.png").write_bytes(b"old figure")
    before = _listing(folder)
    with pytest.raises(ConfigError, match=f"cannot replace the run in {folder}: .*checkpoint.pt is a folder"):
        runfolder.check(folder, resume=False, overwrite=True)
    with pytest.raises(ConfigError, match=f"cannot replace the run in {folder}: .*checkpoint.pt is a folder"):
        with runfolder.claim(folder, resume=False, overwrite=True):
            pytest.fail("claimed")
    assert _listing(folder) - {runfolder.LOCK} == before  # (a refused claim leaves an empty lock file, as ever)
    assert (folder / "accuracy_vs_time.png").read_bytes() == b"old figure"


# ---------------------------------------------------------------- 3. a resume reads its checkpoint once


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Each read of a checkpoint (checkpoint.load: the whole file, and its sha256 over all it holds)."""
    seen: list[Path] = []
    real = checkpoint.load

    def load(folder):  # type: ignore[no-untyped-def]
        seen.append(Path(folder))
        return real(folder)

    monkeypatch.setattr(checkpoint, "load", load)
    yield seen


def test_a_server_app_resume_reads_its_checkpoint_once_and_ends_as_before(tmp_path, monkeypatch, request):
    folder, whole = tmp_path / "run", tmp_path / "whole"
    _server_run(folder, monkeypatch, rounds=2)
    reads = request.getfixturevalue("reads")
    _server_run(folder, monkeypatch, rounds=3, resume=True)  # before: read twice (three times with nothing to do)
    assert reads == [folder]
    reads.clear()
    (folder / SUMMARY).unlink()
    assert _server_run(folder, monkeypatch, rounds=3, resume=True)["rounds"] == 3  # nothing to do
    assert reads == [folder] and json.loads((folder / SUMMARY).read_text())["rounds"] == 3
    _server_run(whole, monkeypatch, rounds=3)  # the run never stopped: the resumed one is the same
    assert _numbers(folder) == _numbers(whole)
    a, b = checkpoint.load(folder).state, checkpoint.load(whole).state
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_simulate_resume_reads_its_checkpoint_once(tmp_path, monkeypatch, capsys, request):
    """``splitfed simulate --resume``: the settings, the checks before anything starts, the ServerApp. The
    simulation engine is stood in for by the ServerApp run in-process with what simulate hands it."""
    import server.app
    import splitfed.sim.runner

    folder = tmp_path / "run"
    _server_run(folder, monkeypatch, rounds=2)

    def simulate(settings, progress=print, verbose=False, cpus=None, resumed=None):  # type: ignore[no-untyped-def]
        handed = {"resumed": resumed} if resumed is not None else {}  # (none before: read again)
        return server.app.run(FakeGrid(clients.app.app, settings.clients), settings, lambda s: None, **handed)

    monkeypatch.setattr(splitfed.sim.runner, "simulate", simulate)
    reads = request.getfixturevalue("reads")
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        assert main(["simulate", "--resume", str(folder), "--rounds", "3", "--json"]) == 0  # before: 5 reads
        assert reads == [folder]
        reads.clear()
        assert main(["simulate", "--resume", str(folder), "--json"]) == 0  # nothing to do; before: 3 reads
        assert reads == [folder]
    assert [json.loads(x)["round"] for x in (folder / METRICS).read_text().splitlines()] == [1, 2, 3]
    assert "nothing to do" in capsys.readouterr().err


def test_a_checkpoint_written_or_changed_after_it_was_read_is_read_again(tmp_path):
    """What a resume hands on is the file as it is: one another run replaced since, or one changed in
    place (and so damaged), is read again, and refused as such."""
    folder = tmp_path / "run"
    state = {"w": torch.arange(6.0)}
    checkpoint.save(folder, checkpoint.Checkpoint(1, state, {"rounds": 3}))
    held = checkpoint.load(folder)
    assert checkpoint.current(folder, held) is held
    checkpoint.save(folder, checkpoint.Checkpoint(2, state, {"rounds": 3}))
    assert checkpoint.current(folder, held).round == 2
    held = checkpoint.load(folder)
    path = folder / checkpoint.FILENAME
    data = bytearray(path.read_bytes())
    at = data.find(torch.arange(6.0).numpy().tobytes())
    assert at > 0
    data[at + 5] ^= 0x40  # a weight's byte
    time.sleep(0.05)  # past the clock tick of the file's times (a coarse one on most file systems)
    with open(path, "r+b") as f:  # in place: the same inode and size
        f.write(bytes(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, held.stamp[3]))  # even with its time put back (its ctime moves)
    with pytest.raises(ConfigError, match="no longer matches the sha256"):
        checkpoint.current(folder, held)
    path.unlink()
    with pytest.raises(ConfigError, match="does not exist"):
        checkpoint.current(folder, held)
