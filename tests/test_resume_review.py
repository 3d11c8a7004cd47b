"""Checkpoints, run folders and resuming: what a full disk, a crash or a resume asking for less leaves behind.

- a full disk while the checkpoint is written is one line whatever byte it fails at (torch's zip writer
  turned the disk's error into its own "unexpected pos" RuntimeError at most sizes);
- a round-1 checkpoint that cannot be written does not send the user to a ``--resume`` that refuses;
- a row cut short in round 1 (a crash or a full disk mid-append) is no finished round: the folder may be
  run again, and is left tidy;
- ``--resume DIR --rounds N`` below what a run that ended part way holds writes no summary, which would
  make the run read ``finished``.

The full disk is the kernel's own refusal (``RLIMIT_FSIZE``: EFBIG, the ``OSError`` a full disk gives) in a
child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import clients.app
from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder, runstatus
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import METRICS, SUMMARY, rows_kept
from tests.flower_fixtures import FakeGrid, inprocess_tiers

ROOT = Path(__file__).resolve().parent.parent
SMALL = RunSettings(rounds=4, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=1)


def _limited(folder: Path, code: str) -> list[str]:
    """Run ``code`` in a child whose files may grow to ``limit(n)`` bytes at most (set before each try); each
    line it prints comes back."""
    script = textwrap.dedent("""
        import resource, sys, torch
        from pathlib import Path
        from splitfed.errors import RunFolderError
        from splitfed.flower import checkpoint
        folder = Path(sys.argv[1])
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        def limit(n):
            resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
        g = torch.Generator().manual_seed(0)
        def ckpt(rnd):
            state = {"0.weight": torch.randn(64, 256, generator=g), "0.bias": torch.randn(64, generator=g),
                     "1.weight": torch.randn(10, 64, generator=g)}
            return checkpoint.Checkpoint(rnd, state, {"rounds": 5})
    """) + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script, str(folder)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_full_disk_at_any_byte_of_a_checkpoint_is_one_line_and_keeps_the_last_one(tmp_path):
    """Before, most sizes raised torch's ``RuntimeError: [enforce fail at inline_container.cc:672] .
    unexpected pos 7808 vs 7760`` out of the run instead of the disk's error."""
    lines = _limited(tmp_path, """
        checkpoint.save(folder, ckpt(1))
        size = (folder / checkpoint.FILENAME).stat().st_size
        for n in range(1000, size, 3000):
            limit(n)
            try:
                checkpoint.save(folder, ckpt(2))
                print("saved")
            except RunFolderError as e:
                print(e)
            except Exception as e:
                print("other:", type(e).__name__, e)
            limit(hard)
    """)
    assert len(lines) > 10
    assert not [line for line in lines if not line.startswith("cannot write the checkpoint")], lines
    for line in lines:
        assert line.startswith(f"cannot write the checkpoint in {tmp_path}: File too large (the previous one is "
                               f"kept: free space or fix the folder, then continue with --resume {tmp_path})"), line
    assert checkpoint.load(tmp_path).round == 1  # the last one, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.FILENAME]  # no temporary file left


def test_a_full_disk_at_the_first_checkpoint_says_no_round_is_kept(tmp_path):
    """Round 1's checkpoint could not be written: nothing of the run is kept (its row comes after), so
    ``--resume`` has nothing to continue and the error must not send the user there."""
    [line] = _limited(tmp_path, """
        limit(2000)
        try:
            checkpoint.save(folder, ckpt(1))
        except RunFolderError as e:
            print(e)
    """)
    assert line == (f"cannot write the checkpoint in {tmp_path}: File too large (no round is kept yet: free space "
                    "or fix the folder, then run the same command again)")
    assert runfolder.held_run(tmp_path) == ""  # which then starts
    with pytest.raises(ConfigError, match="no round of that run finished: start it again"):  # what --resume says
        checkpoint.load(tmp_path)


def test_a_row_cut_short_in_round_1_is_no_finished_round(tmp_path):
    """Before, a crash or a full disk while round 1's row was appended left a folder that the same command
    refused ("already holds a run (1 finished round(s))") and ``--resume`` refused too ("checkpoint.pt is
    missing, though metrics.jsonl holds 1 finished round(s): put the checkpoint back")."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / METRICS).write_text('{"round": 1, "accuracy": 0.3, "cuts": {"cli')  # no newline: cut short
    assert runfolder.held_run(folder) == ""
    runfolder.check(folder, resume=False, overwrite=False)
    with pytest.raises(ConfigError, match=r"does not exist \(no round of that run finished"):
        checkpoint.load(folder)
    with runfolder.claim(folder, resume=False, overwrite=False):  # a run that ends before round 1 does
        pass
    assert not (folder / METRICS).exists() and not (folder / runfolder.LOCK).exists()  # nothing half left

    (folder / METRICS).write_text('{"round": 1}\n{"round": 2}')  # whole rows, the last without its newline
    assert rows_kept(folder, cut=False) == 2 and runfolder.held_run(folder) == "2 finished round(s)"
    (folder / METRICS).write_text("notes of my own")  # not a row: still the user's, not refused as empty
    assert runfolder.held_run(folder) == "1 finished round(s)"


def _stopped_after(folder: Path, rounds: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of ``SMALL`` stopped (Ctrl-C) once round ``rounds`` was kept (its checkpoint and row), as the
    next round's checkpoint was about to be written."""
    real = checkpoint.save

    def save(where, ckpt):  # type: ignore[no-untyped-def]
        if ckpt.round == rounds + 1:
            raise KeyboardInterrupt
        return real(where, ckpt)

    with inprocess_tiers(monkeypatch, SMALL.tiers - 1), monkeypatch.context() as m:
        import server.app

        m.setattr(checkpoint, "save", save)
        with pytest.raises(KeyboardInterrupt):
            server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder)),
                           progress=lambda line: None)


def test_a_resume_asking_fewer_rounds_of_a_run_that_ended_part_way_leaves_it_unfinished(tmp_path, capsys,
                                                                                         monkeypatch):
    """Before, ``--resume DIR --rounds 1`` of a run stopped at round 2 of 4 wrote its summary.json, so
    ``splitfed report`` read it ``finished``, and said to train on with ``--rounds 3 or more``."""
    _stopped_after(tmp_path, 2, monkeypatch)
    assert runstatus.status(tmp_path).state == "stopped"
    rows = (tmp_path / METRICS).read_bytes()
    assert main(["simulate", "--resume", str(tmp_path), "--rounds", "1", "--json"]) == 0
    assert not (tmp_path / SUMMARY).exists() and (tmp_path / METRICS).read_bytes() == rows
    assert runstatus.status(tmp_path).state == "stopped"
    out = capsys.readouterr()
    assert json.loads(out.out)["rounds"] == 2
    assert f"nothing to do: {tmp_path} holds round 2 of its 4" in out.err
    assert f"(to train on: --resume {tmp_path})" in out.err


def test_server_deploy_resume_asking_fewer_rounds_leaves_a_run_ended_part_way_unfinished(tmp_path, capsys,
                                                                                          monkeypatch):
    """``server.deploy`` answers a resume that asks for nothing as ``simulate`` does (one function): before,
    it wrote the summary of the flags that asked (rounds 1) and marked the run finished; nothing starts."""
    from server import deploy

    _stopped_after(tmp_path, 2, monkeypatch)
    rows = (tmp_path / METRICS).read_bytes()
    assert deploy.main(["--resume", str(tmp_path), "--rounds", "1"]) == 0
    assert not (tmp_path / SUMMARY).exists() and (tmp_path / METRICS).read_bytes() == rows
    assert runstatus.status(tmp_path).state == "stopped"
    err = capsys.readouterr().err
    assert f"nothing to do: {tmp_path} holds round 2 of its 4" in err and f"--resume {tmp_path})" in err
    assert deploy.main(["--resume", str(tmp_path), "--rounds", "2"]) == 0  # its own last round kept: the same
    assert not (tmp_path / SUMMARY).exists()


def _crash_at_round_1(folder: Path, monkeypatch: pytest.MonkeyPatch, *, after_checkpoint: bool) -> None:
    """A run of ``SMALL`` whose process dies (an exception no one catches: the run ends there) as round 1's
    checkpoint is written, before it (nothing of round 1 is kept) or just after it (its row not yet)."""
    real = checkpoint.save

    def save(where, ckpt):  # type: ignore[no-untyped-def]
        if after_checkpoint:
            real(where, ckpt)
        raise SystemExit("killed")

    with inprocess_tiers(monkeypatch, SMALL.tiers - 1), monkeypatch.context() as m:
        import server.app

        m.setattr(checkpoint, "save", save)
        with pytest.raises(SystemExit):
            server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder), rounds=2),
                           progress=lambda line: None)


def _whole(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        import server.app

        server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(out=str(folder), rounds=2),
                       progress=lambda line: None)


def _numbers(folder: Path) -> list[tuple]:
    return [(r["round"], r["accuracy"], r["loss"], r["cuts"], r["device_weight_bytes"])
            for r in map(json.loads, (folder / METRICS).read_text().splitlines())]


@pytest.mark.parametrize("after_checkpoint", [False, True])
def test_a_run_killed_in_round_1_is_started_again_or_resumed(tmp_path, monkeypatch, after_checkpoint) -> None:
    """Before, round 1's row was written before its checkpoint: a run killed between them (just after
    ``round 1/N`` was printed) held a row and no checkpoint, so ``--resume`` refused it ("put the checkpoint
    back") and so did the same command ("already holds a run"); only --overwrite went on. Now the checkpoint
    comes first and keeps its row: killed before it, nothing is kept and the same command starts again;
    killed after it, ``--resume`` puts the row back and trains on. Either way the run ends as one never
    killed."""
    from server.app import run as server_run

    folder, whole = tmp_path / "run", tmp_path / "whole"
    _crash_at_round_1(folder, monkeypatch, after_checkpoint=after_checkpoint)
    assert not (folder / METRICS).is_file() or not (folder / METRICS).read_text().strip()
    assert (folder / checkpoint.FILENAME).is_file() == after_checkpoint
    assert runfolder.held_run(folder) == ("checkpoint.pt" if after_checkpoint else "")
    again = SMALL.with_(out=str(folder), rounds=2, resume=after_checkpoint)
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        server_run(FakeGrid(clients.app.app, SMALL.clients), again, progress=lambda line: None)
    _whole(whole, monkeypatch)
    assert _numbers(folder) == _numbers(whole)
    a, b = checkpoint.load(folder).state, checkpoint.load(whole).state
    assert all(bool((a[k] == b[k]).all()) for k in a)
