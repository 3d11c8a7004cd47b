"""The refusal of a folder that holds a run names each way on in both forms: the command-line flag and the
run-config key (a ``flwr run`` user has only the run config). It gave ``overwrite = true`` but no key for
``--resume``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from splitfed.engine.rounds import initial_state
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.config import RunSettings


def _held(folder: Path, checkpointed: bool) -> None:
    """A finished run of one round in ``folder``, with its checkpoint or without (the in-process backend's)."""
    folder.mkdir(parents=True)
    if checkpointed:
        s = RunSettings(clients=2, rounds=1, tiers=2, cuts="static:2", model="mlp", out=str(folder))
        checkpoint.save(folder, checkpoint.Checkpoint(1, initial_state(s.spec, s.seed), s.to_dict()))
    (folder / "metrics.jsonl").write_text(json.dumps({"round": 1, "loss": 0.5, "accuracy": 0.8}) + "\n")


def test_a_resumable_run_is_refused_naming_resume_and_overwrite_as_flags_and_as_keys(tmp_path: Path) -> None:
    folder = tmp_path / "my run"
    _held(folder, checkpointed=True)
    with pytest.raises(ConfigError) as e:
        runfolder.check(folder, resume=False, overwrite=False)
    assert str(e.value) == (
        f"run folder {folder} already holds a run (1 finished round(s)); continue it with --resume "
        f"{shlex.quote(str(folder))}, replace it with --overwrite, or choose another out (in a run config: "
        "resume = true, or overwrite = true)")


def test_without_a_checkpoint_only_overwrite_is_named_in_both_forms(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _held(folder, checkpointed=False)
    with pytest.raises(ConfigError) as e:
        runfolder.check(folder, resume=False, overwrite=False)
    assert str(e.value) == (f"run folder {folder} already holds a run (1 finished round(s)); replace it with "
                            "--overwrite, or choose another out (in a run config: overwrite = true)")
