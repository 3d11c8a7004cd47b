"""What a checkpoint promises that the mutation run found unpinned: a checkpoint file runs no code when it is
read, a disk's failed write is never passed over, and ``restore_row`` puts back (and says it put back) the
row of a crash between a checkpoint and its row, and touches the file in no other case."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.metrics import METRICS


def _row(rnd: int) -> dict[str, Any]:
    return {"round": rnd, "accuracy": 0.25 * rnd, "loss": 2.0 / rnd}


def _line(rnd: int) -> str:
    return json.dumps(_row(rnd)) + "\n"


def _ckpt(rnd: int, row: dict[str, Any] | None) -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(rnd, {"w": torch.arange(4.0)}, {"rounds": 5}, row=row)


class _Touch:
    """Unpickled, it makes ``marker``: the code a checkpoint file could run if it were read with pickle's
    full power."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return Path.touch, (self.marker,)


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_none(tmp_path: Path) -> None:
    """An otherwise whole format-2 checkpoint (its sha256 right: the digest covers no extra key) with one
    pickled call in it: read with weights_only it is refused as unreadable, and the call never runs."""
    folder = tmp_path / "run"
    marker = tmp_path / "ran"
    checkpoint.save(folder, _ckpt(2, _row(2)))
    path = folder / checkpoint.FILENAME
    payload = torch.load(path, weights_only=True)
    assert payload["sha256"] == checkpoint.digest(payload)
    payload["extra"] = _Touch(marker)
    torch.save(payload, path)
    with pytest.raises(ConfigError, match="cannot read checkpoint .*corrupt or truncated"):
        checkpoint.load(folder)
    assert not marker.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full, a device that is always full")
def test_a_write_the_disk_refuses_is_raised_and_kept_not_passed_over() -> None:
    """torch ignores what ``write`` returns: a failed write that were passed over would leave a checkpoint
    missing bytes, fsynced and moved over the good one. /dev/full refuses every write as a full disk does."""
    with open("/dev/full", "wb", buffering=0) as f:
        out = checkpoint._Writer(f)
        with pytest.raises(Exception):  # noqa: B017 - torch's own echo of the OSError, whatever its type
            torch.save({"w": torch.arange(64.0)}, out)  # type: ignore[arg-type]
        assert out.error is not None and out.error.errno == errno.ENOSPC
        direct = checkpoint._Writer(f)
        with pytest.raises(OSError) as e:
            direct.write(b"x")
        assert e.value.errno == errno.ENOSPC and direct.error is e.value


def test_restore_row_puts_back_a_row_a_crash_lost_and_says_so(tmp_path: Path) -> None:
    """Rounds 1..2 whole and round 3's row cut short: round 3's row is put back whole, the cut line gone."""
    (tmp_path / METRICS).write_text(_line(1) + _line(2) + _line(3)[:9])
    assert checkpoint.restore_row(tmp_path, _ckpt(3, _row(3))) is True
    assert (tmp_path / METRICS).read_text() == _line(1) + _line(2) + _line(3)


@pytest.mark.parametrize("text", ["", "{\"round\": 1}\n", _line(1) + _line(2) + _line(3)])
def test_restore_row_without_a_row_to_put_back_touches_nothing_and_says_so(tmp_path: Path, text: str) -> None:
    """The checkpoint's row already there (the file holds its round), or rounds missing before it (refused
    later by check_rounds): nothing is written, and it says it did nothing."""
    if text:
        (tmp_path / METRICS).write_text(text)
    assert checkpoint.restore_row(tmp_path, _ckpt(3, _row(3))) is False
    assert ((tmp_path / METRICS).read_text() == text) if text else not (tmp_path / METRICS).exists()


@pytest.mark.parametrize(("rnd", "row"), [(3, None), (0, _row(1))])
def test_restore_row_with_no_row_kept_touches_nothing_and_says_so(tmp_path: Path, rnd: int,
                                                                 row: dict[str, Any] | None) -> None:
    """A checkpoint from before rows were kept in it, or of no finished round: nothing to put back."""
    (tmp_path / METRICS).write_text(_line(1) + _line(2)[:9])
    assert checkpoint.restore_row(tmp_path, _ckpt(rnd, row)) is False
    assert (tmp_path / METRICS).read_text() == _line(1) + _line(2)[:9]
