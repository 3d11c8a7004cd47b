"""A checkpoint that is not what was written is refused; a disk that fails while one is written is one line.

torch's zip reader checks no CRC, so without the checkpoint's own sha256 a flipped
byte inside a tensor loads as a wrong weight and a resume trains on from it. The
full-disk case uses the kernel's own refusal (``RLIMIT_FSIZE``: EFBIG) in a child
process, the same ``OSError`` a full disk gives.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.metrics import METRICS, MetricsWriter

ROOT = Path(__file__).resolve().parent.parent


def _ckpt(rnd: int = 3) -> checkpoint.Checkpoint:
    g = torch.Generator().manual_seed(rnd)
    state = {"0.weight": torch.randn(24, 24, generator=g), "0.bias": torch.randn(24, generator=g),
             "1.running_mean": torch.randn(24, generator=g).to(torch.float64),
             "1.num_batches_tracked": torch.tensor(7)}
    return checkpoint.Checkpoint(rnd, state, {"rounds": 5, "lr": 0.05}, {"client0": (1, 3)}, {"ema": [0.5, 1.5]})


def _same(a: checkpoint.Checkpoint, b: checkpoint.Checkpoint) -> bool:
    return (a.round == b.round and a.settings == b.settings and a.assignment == b.assignment
            and a.policy == b.policy and torch.equal(a.rng, b.rng) and a.state.keys() == b.state.keys()
            and all(a.state[k].dtype == b.state[k].dtype and torch.equal(a.state[k], b.state[k]) for k in a.state))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    folder = tmp_path_factory.mktemp("ckpt")
    checkpoint.save(folder, _ckpt())
    assert _same(checkpoint.load(folder), _ckpt())
    return (folder / checkpoint.FILENAME).read_bytes()


def _weight_offset(raw: bytes) -> int:
    """Where the bytes of ``0.weight`` (the first 24 floats of it are what ``_ckpt`` drew) lie in the file."""
    first = _ckpt().state["0.weight"].reshape(-1)[:8].numpy().tobytes()
    at = raw.find(first)
    assert at > 0
    return at


def test_a_byte_changed_inside_a_weight_is_refused_not_loaded(tmp_path, written):
    """The old reader loaded this file without a word, with one weight changed."""
    raw = bytearray(written)
    raw[_weight_offset(written) + 5] ^= 0x40
    (tmp_path / checkpoint.FILENAME).write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=r"checkpoint\.pt is damaged: what it holds no longer matches the sha256"):
        checkpoint.load(tmp_path)


@settings(max_examples=150, deadline=None)
@given(where=st.floats(0, 1, exclude_max=True), flip=st.integers(1, 255))
def test_any_changed_byte_is_refused_or_changes_nothing(tmp_path_factory, written, where, flip):
    """Wherever a byte of the file changes, the load refuses it or gives exactly what was saved (a byte
    of the zip's padding or of a time stamp holds nothing)."""
    folder = tmp_path_factory.mktemp("flip")
    raw = bytearray(written)
    raw[int(where * len(raw))] ^= flip
    (folder / checkpoint.FILENAME).write_bytes(bytes(raw))
    try:
        back = checkpoint.load(folder)
    except ConfigError as e:
        assert "damaged" in str(e) or "corrupt or truncated" in str(e) or "format" in str(e)
    else:
        assert _same(back, _ckpt())


def test_a_checkpoint_from_before_the_digest_still_loads(tmp_path):
    """Checkpoints written by earlier versions (format 1) may carry no digest: they load as they did."""
    checkpoint.save(tmp_path, _ckpt())
    path = tmp_path / checkpoint.FILENAME
    payload = torch.load(path, weights_only=True)
    del payload["sha256"]
    payload["format"] = 1
    torch.save(payload, path)
    assert _same(checkpoint.load(tmp_path), _ckpt())


def test_a_checkpoint_whose_digest_was_taken_out_is_refused(tmp_path):
    """Before, a file without its sha256 read as one from before the digest was kept: a weight changed and
    the digest deleted loaded as if whole."""
    checkpoint.save(tmp_path, _ckpt())
    path = tmp_path / checkpoint.FILENAME
    payload = torch.load(path, weights_only=True)
    del payload["sha256"]
    next(iter(payload["state"].values())).fill_(7.0)
    torch.save(payload, path)
    with pytest.raises(ConfigError, match=r"checkpoint\.pt is damaged: its sha256 is missing"):
        checkpoint.load(tmp_path)


def _full_disk(folder: Path, code: str, limit: int) -> subprocess.CompletedProcess:
    """Run ``code`` with files limited to ``limit`` bytes: writes beyond it fail with EFBIG, as on a full disk
    (Python ignores SIGXFSZ, so the write returns the error)."""
    script = textwrap.dedent(f"""
        import resource, sys
        from pathlib import Path
        from splitfed.errors import RunFolderError
        from tests.test_checkpoint_integrity import _ckpt
        from splitfed.flower import checkpoint
        from splitfed.flower.metrics import MetricsWriter
        folder = Path({str(folder)!r})
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        try:
            {code}
        except RunFolderError as e:
            print(e)
            sys.exit(7)
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_full_disk_while_a_checkpoint_is_written_is_one_line_and_keeps_the_last_one(tmp_path):
    checkpoint.save(tmp_path, _ckpt(1))
    before = (tmp_path / checkpoint.FILENAME).read_bytes()
    out = _full_disk(tmp_path, "checkpoint.save(folder, _ckpt(2))", limit=len(before) // 2)
    assert out.returncode == 7, out.stderr
    assert out.stdout.startswith(f"cannot write the checkpoint in {tmp_path}: File too large")
    assert f"continue with --resume {tmp_path}" in out.stdout and len(out.stdout.splitlines()) == 1
    assert (tmp_path / checkpoint.FILENAME).read_bytes() == before  # the last one, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.FILENAME]  # no temporary file left


def test_a_full_disk_while_a_round_is_written_is_one_line_and_keeps_the_rounds_before(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.append({"round": 1, "loss": 0.5})
    size = (tmp_path / METRICS).stat().st_size
    out = _full_disk(tmp_path, "MetricsWriter(folder).append({'round': 2, 'note': 'x' * 4096})", limit=size + 64)
    assert out.returncode == 7, out.stderr
    assert out.stdout.startswith(f"cannot write {tmp_path / METRICS}: File too large")
    assert [r["round"] for r in writer.rows()] == [1]  # the round cut short is dropped as a crash's is
