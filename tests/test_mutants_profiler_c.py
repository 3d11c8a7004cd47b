"""Parts of ``splitfed.profile.profiler``'s measurement (``_measure_blocks``) that a mutation run found unpinned:
around a block that detaches its input but trains its own weights (its output gets a gradient, its input none),
the profile's per-block backward FLOPs, backward with an input gradient, trainable bytes, backward seconds and
shared activations follow the gradient's reach at the block's OUTPUT (boundary ``i + 1``), not at its input or
the block before; a U-shape tail never shares block 0's input with the batch; the measured seconds are the
median of the ``reps`` timed runs after one warm-up (each the difference of two clock readings around the
forward, then the backward), checked here with a clock that the test drives (no speed is asserted); a tensor
passed on between blocks keeps its storage as a tier takes it (a slice keeps the whole storage it views, as the
engine's tier holds it); and a CPU profile's host is the machine's name alone. Expected values are worked out by
hand."""

from __future__ import annotations

import platform
import statistics
import time
import types

import pytest
import torch
from torch import nn

from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile import profiler
from splitfed.profile.profiler import profile_model

B = 4
F32 = 4  # bytes per float32


class _DetachLinear(nn.Module):
    """A Linear on its input detached: its weights train (its output gets a gradient), its input gets none."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.detach())


def detached() -> nn.Module:
    """Blocks: Linear(6, 8), detach + Linear(8, 8), Tanh, Linear(8, 3)."""
    return nn.Sequential(nn.Linear(6, 8), _DetachLinear(), nn.Tanh(), nn.Linear(8, 3))


class _Take(nn.Module):
    """The first four features: a view of its input (no copy, no parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :4]


def sliced() -> nn.Module:
    """Blocks: a slice of the (6,)-feature batch, Linear(4, 3) (it keeps its input, a view, for its weights)."""
    return nn.Sequential(_Take(), nn.Linear(4, 3))


def _spec(factory: str, features: int = 6) -> ModelSpec:
    return resolve_spec(f"tests.test_mutants_profiler_c:{factory}", input_shape=(features,), num_classes=3)


# ---------------------------------------------------------------- the gradient's reach, per block's output


def test_a_block_that_detaches_its_input_trains_and_runs_its_backward_the_one_before_it_neither() -> None:
    """The gradient reaches boundaries 2..4 only (block 1 detaches its input). Block 0 (before the detach)
    never trains and never runs a backward: 0 bytes, 0 FLOPs both ways, even with an input gradient (a U-shape
    tail starting at 0 would need it for nothing). Block 1, whose OUTPUT the gradient reaches, trains its
    Linear(8, 8) (72 floats) and runs its weight gradient: 2 x 8 x 8 FLOPs per sample either way (its input
    is detached: no input gradient). Tanh: no FLOPs; the last Linear(8, 3): input and weight gradients,
    2 x 2 x 8 x 3."""
    prof = profile_model(_spec("detached"), batch=B, reps=1, use_cache=False)
    assert prof.grad_reach == (False, False, True, True, True)
    assert prof.fwd_flops == (2 * 6 * 8, 2 * 8 * 8, 0.0, 2 * 8 * 3)
    assert prof.bwd_flops == (0.0, 2 * 8 * 8, 0.0, 2 * 2 * 8 * 3)
    assert prof.grad_bwd_flops == (0.0, 2 * 8 * 8, 0.0, 2 * 2 * 8 * 3)
    assert prof.train_bytes == (0.0, (64 + 8) * F32, 0.0, (24 + 3) * F32)
    assert prof.param_bytes == ((48 + 8) * F32, (64 + 8) * F32, 0.0, (24 + 3) * F32)


def test_what_blocks_share_starts_at_the_batch_in_training_and_never_in_a_tail() -> None:
    """Training: block 0's Linear keeps the input batch (6 floats a sample), which the device holds anyway:
    (-1, 0, 24); the Tanh ending block 2 keeps its output, which the Linear of block 3 keeps as its input:
    (2, 3, 32). With every input needing a gradient (a U-shape tail), the tail's input is a clone the tail
    makes, never the device's batch: only (2, 3, 32)."""
    prof = profile_model(_spec("detached"), batch=B, reps=1, use_cache=False)
    assert prof.shared_act == ((-1, 0, 6 * F32), (2, 3, 8 * F32))
    assert prof.grad_shared_act == ((2, 3, 8 * F32),)


# ---------------------------------------------------------------- the measured seconds


def test_seconds_are_the_median_of_the_timed_runs_after_the_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock the test drives: its n-th reading (from 0) says n^2 seconds, and the profiler reads it three
    times per run of a block (before the forward, between forward and backward, after the backward): (reps + 1)
    runs per block, the first a warm-up. With reps 3, block b's timed runs r = 1..3 start at reading
    n = 12 b + 3 r: forward (n + 1)^2 - n^2 = 2n + 1, backward 2n + 3; the median is run 2's. Block 0, whose
    output no gradient reaches, has no backward seconds."""
    reads = iter(range(10_000))
    monkeypatch.setattr(profiler, "time", types.SimpleNamespace(perf_counter=lambda: float(next(reads) ** 2)))
    prof = profile_model(_spec("detached"), batch=B, reps=3, use_cache=False)
    starts = [12 * b + 6 for b in range(4)]
    assert prof.reps == 3
    assert prof.fwd_s == tuple(2.0 * n + 1 for n in starts)
    assert prof.bwd_s == (0.0, *(2.0 * n + 3 for n in starts[1:]))
    assert next(reads) == 12 * 4  # no other reading


def test_measured_seconds_lie_within_the_call_that_measured_them() -> None:
    """Each forward and backward interval lies inside the profile call: never negative, never longer than the
    whole call (a sum of two clock readings, not their difference, would be)."""
    t0 = time.perf_counter()
    prof = profile_model(_spec("detached"), batch=B, reps=2, use_cache=False)
    wall = time.perf_counter() - t0
    assert len(prof.fwd_s) == len(prof.bwd_s) == 4
    assert all(0.0 <= t <= wall for t in prof.fwd_s + prof.bwd_s), (prof.fwd_s, prof.bwd_s, wall)
    assert statistics.fmean(prof.fwd_s) > 0.0


# ---------------------------------------------------------------- the tensor passed on, as a tier takes it


def test_a_slice_passed_on_keeps_the_whole_storage_it_views() -> None:
    """Block 0 slices 4 of 6 features (a view); no block before block 1 trains, so a tier starting there takes
    the tensor as it is, detached: the view of the whole batch's storage, which the Linear keeps for its weight
    gradient: 6 floats a sample, not the 4 a copy would hold. (With an input gradient a tier clones it: 4.)"""
    prof = profile_model(_spec("sliced"), batch=B, reps=1, use_cache=False)
    assert prof.out_bytes == (4 * F32, 3 * F32)
    assert prof.act_bytes == (0.0, 6 * F32)
    assert prof.grad_act_bytes == (0.0, 4 * F32)


# ---------------------------------------------------------------- where it ran


def test_a_cpu_profile_names_the_host_alone() -> None:
    """On the CPU the host is the machine's name, without a device description (a GPU's profile has one)."""
    prof = profile_model(_spec("sliced"), batch=B, reps=1, use_cache=False)
    assert prof.host == platform.node()
