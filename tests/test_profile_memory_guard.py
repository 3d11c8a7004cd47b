"""A profile batch beyond this host's memory is refused before it is allocated.

``splitfed optimize --model cnn --batch 1048576`` ran for a minute and was ended by the kernel's OOM killer (exit
137, no message): Linux grants a large allocation and kills the process later, so the profiler's MemoryError never
came. From ``profiler.GUARD_BATCH`` samples on, a batch-2 profile bounds the memory from below first.
"""

from __future__ import annotations

import re
import resource

import pytest
import torch

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.models import resolve_spec
from splitfed.profile import profile_model
from splitfed.profile import profiler as profiler_mod
from splitfed.units import mib_text

torch.set_num_threads(1)

BIG = 2**20  # MAX_BATCH
SHAPE = (1, 128, 128)  # cnn keeps ~2 MiB a sample at 128x128: ~2 TiB at BIG, beyond any host's memory
SPEC = resolve_spec("cnn", SHAPE)


def _expected(name: str, batch: int) -> str:
    """The refusal's text up to what is available (which moves while the test runs), from a batch-2 profile."""
    small = profile_model(resolve_spec(name, SHAPE), 2, reps=1, use_cache=False)
    per = max(i + a + o for i, a, o in zip((small.input_bytes, *small.out_bytes[:-1]), small.act_bytes,
                                            small.out_bytes, strict=True))
    return (f"profiling model {name} at batch {batch:,} needs at least {mib_text(batch * per + sum(small.param_bytes))}"
            f" ({mib_text(per)} a sample), and this host has ")


def _refusal(text: str, name: str, batch: int) -> None:
    head = _expected(name, batch)
    assert text.startswith(head), text
    assert re.fullmatch(r"[\d,.]+ MiB available: use a smaller --batch \(a run's batch_size\)",
                        text.removeprefix(head)), text


def test_a_batch_beyond_memory_is_refused_before_it_is_allocated() -> None:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with pytest.raises(ConfigError) as e:
        profile_model(SPEC, BIG, reps=1, use_cache=False)
    _refusal(str(e.value), "cnn", BIG)
    # the input batch alone would be 64 GiB: nothing near it was allocated
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 1 << 20


def test_profile_command_refuses_it_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "cnn", "--input-shape", "1,128,128", "--batch", str(BIG), "--no-cache"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1
    _refusal(err.removeprefix("splitfed profile: error: ").rstrip("\n"), "cnn", BIG)


def test_optimize_command_refuses_it_before_planning(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "--model", "cnn", "--input-shape", "1,128,128", "--fleet", "small", "--batch", str(BIG)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _refusal(err.removeprefix("splitfed optimize: error: ").rstrip("\n"), "cnn", BIG)


def test_a_large_batch_that_fits_is_profiled() -> None:
    prof = profile_model(resolve_spec("mlp"), profiler_mod.GUARD_BATCH, reps=1, use_cache=False)
    assert prof.batch == profiler_mod.GUARD_BATCH
    assert prof.out_bytes[-1] == 10 * 4  # per sample, as at any batch
