"""Three defects of the profiler a review reproduced.

1. The cache key of a user's model missed a helper function its forward calls from another file: an edit to
   the helper kept the old profile (its FLOPs) in the cache.
2. A block's fixed memory (the cost model's m_i) left out its buffers (a causal mask, BatchNorm's running
   statistics), which a tier holds and counts (``template.held_bytes``).
3. ``splitfed profile --batch 1`` of a model with BatchNorm crashed with a traceback, where ``verify``
   refuses a batch of one sample in one line.

The models of 2 and 3 are defined here and loaded by ``module:factory`` path, as a user's would be.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from splitfed.cli import main
from splitfed.engine import template
from splitfed.engine.types import optimizer_state_bytes, step_count_bytes
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile import profiler as profiler_mod
from splitfed.profile.digest import code_digest
from splitfed.profile.profiler import profile_model

torch.set_num_threads(1)

T = 512  # the causal mask is T x T float32: 1 MiB
MASK_BYTES = T * T * 4


# ---------------------------------------------------------------- 1. a helper in another file


NET = """\
import torch.nn as nn
import torch.nn.functional as F
{import_line}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 32)
        self.d = nn.Linear(32, 10)

    def forward(self, x):
        h = F.relu(self.a(x))
        h = F.relu({call}(h, self.b)) * 1.0
        return self.d(h)


def make():
    return Net()
"""
ONCE = "def body(x, lin):\n    return lin(x)\n"
THRICE = "def body(x, lin):\n    return lin(lin(lin(x)))\n"
B_FLOPS = 2 * 32 * 32  # per sample, one pass through block b (Linear 32 -> 32)


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """Names of a model module and a helper module (fresh names: no other test's ``net`` in sys.modules),
    written by the test into ``tmp_path``, which is on sys.path; both forgotten afterwards."""
    tag = uuid.uuid4().hex[:8]
    net, helpers = f"review_net_{tag}", f"review_helpers_{tag}"
    monkeypatch.syspath_prepend(str(tmp_path))
    profiler_mod.clear_cache()
    yield net, helpers
    for name in (net, helpers, f"review_other_{tag}"):
        sys.modules.pop(name, None)
    profiler_mod.clear_cache()


def _block_b_flops(spec: ModelSpec, cache: Path) -> float:
    prof = profile_model(spec, batch=4, reps=1, cache_dir=cache)
    return prof.fwd_flops[prof.names.index("b")]


@pytest.mark.parametrize("style", ["import module", "from module import function"])
def test_a_cached_profile_follows_an_edit_to_a_helper_the_forward_calls_from_another_file(
        style: str, user_modules: tuple[str, str], tmp_path: Path) -> None:
    """The model's file and its class are unchanged; only the helper its forward calls, in another file, is
    edited (and reloaded, as in a notebook): the profile is measured again, not the cached one returned.
    An unrelated module beside them, imported or edited, leaves the key as it was."""
    net, helpers = user_modules
    import_line, call = ((f"import {helpers}", f"{helpers}.body") if style == "import module"
                         else (f"from {helpers} import body", "body"))
    (tmp_path / f"{helpers}.py").write_text(ONCE)
    (tmp_path / f"{net}.py").write_text(NET.format(import_line=import_line, call=call))
    spec = resolve_spec(f"{net}:make", input_shape=(8,), num_classes=10)
    cache = tmp_path / "cache"

    assert _block_b_flops(spec, cache) == B_FLOPS
    before = code_digest(spec)
    other = net.replace("net", "other")  # in the same folder, imported by nobody the model uses
    (tmp_path / f"{other}.py").write_text("X = 1\n")
    importlib.import_module(other)
    (tmp_path / f"{other}.py").write_text("X = 2\n")
    assert code_digest(spec) == before  # not the model's code: no new key

    (tmp_path / f"{helpers}.py").write_text(THRICE)
    importlib.reload(sys.modules[helpers])
    if style != "import module":  # the name bound in the model's module is the old function: reload it too
        importlib.reload(sys.modules[net])
    assert code_digest(spec) != before
    assert _block_b_flops(spec, cache) == 3 * B_FLOPS  # before: 1x, the stale profile from the cache
    assert len(list(cache.iterdir())) == 2  # one cached profile per version of the helper
    profiler_mod.clear_cache()
    assert _block_b_flops(spec, cache) == 3 * B_FLOPS  # and from disk, as a new process reads it


# The reviewer's repro (``splitfed profile`` run twice in its own processes, the helper edited between) is
# test_profile_digest's test_a_fresh_profile_process_measures_again_after_the_helper_changes: the same command,
# the same layers and edit, its cache's keys counted too, the helper imported where a fresh process has not
# imported it when the key is made (in forward); a helper imported at the top of the model's file, as here, is
# followed by the test above (its key, and its profile measured again and read from disk).


# ---------------------------------------------------------------- 2. buffers in fixed memory


class CausalMix(nn.Module):
    """nanoGPT-style: a causal mask kept as a (persistent) buffer."""

    mask: torch.Tensor

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(T, T)))
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        return self.lin(self.mask[:t, :t] @ x)


def causal() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), CausalMix(), nn.Flatten(), nn.Linear(4 * 16, 10))


def batchnorm() -> nn.Module:
    """BatchNorm1d: running mean and variance (float32) and a step counter (int64) as buffers."""
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


SPECS = {"causal": ((4, 8), 10), "batchnorm": ((8,), 3)}


def _spec(model: str) -> ModelSpec:
    shape, classes = SPECS[model]
    return resolve_spec(f"tests.test_profile_review:{model}", input_shape=shape, num_classes=classes)


@pytest.mark.parametrize("slots", [0, 1, 2])
@pytest.mark.parametrize("model", list(SPECS))
def test_fixed_bytes_hold_the_buffers_as_a_tier_counts_them(model: str, slots: int) -> None:
    """m_i is what a tier holds for the block: its parameters and buffers (``held_bytes``' first part, each
    storage once), and a gradient and the optimizer's slots for each byte that trains (its second), and Adam's
    step count for each Parameter that trains (``train_tensors``)."""
    spec = _spec(model)
    prof = profile_model(spec, batch=4, reps=1, optimizer_slots=slots, use_cache=False)
    for i in range(prof.n_blocks):
        weights, trains = template.held_bytes(spec, i)
        optim = optimizer_state_bytes(slots, trains, template.train_tensors(spec, i))
        assert prof.fixed_bytes[i] == weights + trains + optim, (model, i)
    if model == "causal":
        assert prof.fixed_bytes[1] >= MASK_BYTES  # before: 3264 B for the mask's block at 1 slot
        assert prof.param_bytes[1] < MASK_BYTES  # a buffer is no parameter
    else:
        assert prof.fixed_bytes[1] == (prof.param_bytes[1] * (2 + slots) + 16 * 4 * 2 + 8  # + mean, var, counter
                                       + 2 * step_count_bytes(slots))  # + Adam's step count for weight and bias


def test_a_batch_of_one_for_a_model_with_batchnorm_is_refused_in_one_line(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    """As ``verify`` refuses it (``template.one_sample_error``): a ConfigError, one line and exit code 2 from
    the command, not a traceback from the measurement; a batch of 2 is profiled, and a model without
    BatchNorm is profiled at batch 1."""
    spec = _spec("batchnorm")
    with pytest.raises(ConfigError, match=r"^batch 1: model .*batchnorm cannot train on one sample \(Expected"):
        profile_model(spec, batch=1, reps=1, use_cache=False)
    argv = ["profile", "--model", "tests.test_profile_review:batchnorm", "--input-shape", "8", "--num-classes", "3",
            "--reps", "1", "--no-cache"]
    assert main([*argv, "--batch", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.err.startswith("splitfed profile: error: batch 1: ") and "give a batch of 2" in captured.err
    assert main([*argv, "--batch", "2"]) == 0
    assert "Linear" in capsys.readouterr().out
    assert profile_model(_spec("causal"), batch=1, reps=1, use_cache=False).batch == 1


@pytest.mark.parametrize("slots", [-1, 3, True, 1.0, "1"])
def test_profile_model_refuses_an_optimizer_slot_count_no_optimizer_has(slots: object) -> None:
    """The CLI offers 0, 1, 2; a caller of the API that passes another count (or True, or 1.0) would have its fixed
    memory priced for an optimizer that does not exist and cached under that key."""
    with pytest.raises(ConfigError, match=r"optimizer_slots must be 0 \(plain SGD\), 1 .* or 2 \(Adam\), got "):
        profile_model(resolve_spec("cnn"), 4, optimizer_slots=slots, use_cache=False)  # type: ignore[arg-type]
