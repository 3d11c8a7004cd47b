"""Runs started at once: a default run folder is made when chosen, so two runs never choose one; a folder another
run holds is refused as in use before anything else is said of it (the other refusals' advice would be refused too).

Real processes hold the folders (killed with SIGKILL: the kernel drops their lock).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitfed.cli import main
from splitfed.commands.simulate import _fresh_folder
from splitfed.errors import ConfigError
from splitfed.flower import runfolder
from splitfed.flower.metrics import METRICS, SUMMARY

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def holder() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes that hold a folder (started by :func:`_hold`), killed at the test's end."""
    held: list[subprocess.Popen[str]] = []
    yield held
    for p in held:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def _hold(held: list[subprocess.Popen[str]], folder: Path, how: str) -> int:
    """Another process that holds ``folder`` until it is killed: ``reserve`` (a run still starting) or ``claim``
    (a run training); its pid."""
    call = {"reserve": "runfolder.reserve({f!r}, resume=False, overwrite=False)",
            "claim": "runfolder.claim({f!r}, resume=True, overwrite=False)"}[how].format(f=str(folder))
    code = textwrap.dedent(f"""
        import time
        from splitfed.flower import runfolder
        with {call}:
            print("held", flush=True)
            time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    held.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p.pid


def _finished_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / METRICS).write_text('{"round": 1}\n{"round": 2}\n')
    (folder / SUMMARY).write_text('{"rounds": 2}\n')


# ---------------------------------------------------------------- 1. a default folder is made when chosen


def test_two_default_folders_chosen_in_one_second_are_two_folders(tmp_path: Path) -> None:
    stem = tmp_path / "runs" / "sim-20261130-120000"
    first, second = _fresh_folder(stem), _fresh_folder(stem)
    try:
        assert (first, second) == (str(stem), str(tmp_path / "runs" / "sim-20261130-120000-2"))
        assert Path(first).is_dir() and Path(second).is_dir()  # made, so another process's choice skips them
    finally:
        runfolder.unmake(first)
        runfolder.unmake(second)


def test_a_folder_made_after_it_was_looked_at_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process makes the folder between this choice's look at the name and its own making of it: the
    look says it is free, and the choice must still not take it (simulated: the name reads as free)."""
    stem = tmp_path / "sim-20261130-120000"
    stem.mkdir()
    (stem / "theirs").write_text("another run's file\n")
    exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self, *a, **k: False if self == stem else exists(self, *a, **k))
    chosen = _fresh_folder(stem)
    try:
        assert chosen == str(tmp_path / "sim-20261130-120000-2")
        assert Path(chosen).is_dir()
    finally:
        runfolder.unmake(chosen)


def test_a_default_folder_no_run_held_goes_and_a_held_one_is_tidied(tmp_path: Path) -> None:
    """What a refused run left before: nothing. A made folder never held goes (unmake); one held by a run
    that kept no round goes with the run (as a folder its claim made); one holding a round stays."""
    stem = tmp_path / "runs" / "sim-20261130-120000"
    made = _fresh_folder(stem)
    runfolder.unmake(made)
    assert not (tmp_path / "runs").exists()  # the parent it made as well
    made = _fresh_folder(stem)
    runfolder.check(made, resume=False, overwrite=False)  # an empty folder: a new run's
    with pytest.raises(RuntimeError, match="^stopped in round 1$"), runfolder.reserve(made, False, False) as held:
        with runfolder.claim(made, resume=False, overwrite=False, reservation=held):
            raise RuntimeError("stopped in round 1")
    assert not Path(made).exists() and (tmp_path / "runs").is_dir()
    made = _fresh_folder(stem)
    with runfolder.claim(made, resume=False, overwrite=False):
        (Path(made) / METRICS).write_text('{"round": 1}\n')
    runfolder.unmake(made)  # held since: left as it is
    assert sorted(p.name for p in Path(made).iterdir()) == [runfolder.LOCK, METRICS]


def test_a_refused_default_run_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import splitfed.sim.runner

    def started(*a: object, **k: object) -> None:
        raise AssertionError("the simulation started: the run should have been refused before")

    monkeypatch.setattr(splitfed.sim.runner, "simulate", started)
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--clients", "2", "--min-clients", "3"]) == 2  # refused by its settings
    assert "error: command line: min-clients (3) is more than clients (2)" in capsys.readouterr().err
    assert main(["simulate", "--clients", "2", "--cuts", "static:9,9"]) == 2  # refused by validate
    assert "error: cuts 'static:9,9': cut 9 is out of range" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 2. in use, said first


def test_resume_of_a_folder_whose_run_is_starting_is_refused_as_in_use(
        tmp_path: Path, holder: list[subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    pid = _hold(holder, folder, "reserve")  # no checkpoint yet: its first round is not kept
    assert main(["simulate", "--resume", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"error: run folder {folder} is in use by another run (pid {pid} on " in err
    assert "still starting); wait for it to end or choose another out" in err
    assert "checkpoint" not in err


def test_a_new_run_into_a_folder_whose_run_trains_is_refused_as_in_use(
        tmp_path: Path, holder: list[subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    _finished_run(folder)
    pid = _hold(holder, folder, "claim")
    assert main(["simulate", "--clients", "2", "--rounds", "1", "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"error: run folder {folder} is in use by another run (pid {pid} on " in err
    assert "already holds" not in err
    for resume, overwrite in ((False, False), (True, False), (False, True)):
        with pytest.raises(ConfigError, match=rf"^run folder {folder} is in use by another run \(pid {pid} on "):
            runfolder.check(folder, resume=resume, overwrite=overwrite)
        with pytest.raises(ConfigError, match=rf"^run folder {folder} is in use by another run \(pid {pid} on "):
            with runfolder.claim(folder, resume=resume, overwrite=overwrite):
                pass
    assert (folder / SUMMARY).read_text() == '{"rounds": 2}\n'  # the live run's files are as they were
