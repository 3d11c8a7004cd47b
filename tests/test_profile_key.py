"""The key a profile is cached under: it tells apart what makes another profile (a GPU's, another default dtype),
and a CPU float32 profile of a zoo model keeps the key it had before those fields existed, so a cache on disk
written then is still read (the profiler's mutation run found all of it unpinned)."""

from __future__ import annotations

import hashlib
import json
import platform

import pytest
import torch

from splitfed.engine import compute
from splitfed.models.zoo import resolve_spec
from splitfed.profile import profiler

SPEC = resolve_spec("mlp", input_shape=(8,), num_classes=3)


def _as_before(batch: int, slots: int) -> str:
    """The key's form before a device or a default dtype could be chosen: the fields, sorted, SHA-1, 16 digits."""
    raw = json.dumps({"spec": SPEC.to_dict(), "batch": batch, "slots": slots, "torch": torch.__version__,
                      "host": platform.node(), "v": profiler.PROFILE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def test_a_cpu_float32_profile_of_a_zoo_model_keeps_the_key_it_had() -> None:
    assert profiler._key(SPEC, 32, 1, torch.device("cpu")) == _as_before(32, 1)
    assert profiler._key(SPEC, 8, 2, torch.device("cpu")) == _as_before(8, 2)


def test_a_gpus_profile_has_a_key_of_its_own_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured on a GPU, a profile's times are that GPU's: not the CPU's key, nor another GPU's (no GPU is
    needed to make the key: the GPU's description is given)."""
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(compute, "describe", lambda where: "GPU A")
    a = profiler._key(SPEC, 32, 1, gpu)
    monkeypatch.setattr(compute, "describe", lambda where: "GPU B")
    b = profiler._key(SPEC, 32, 1, gpu)
    assert len({a, b, _as_before(32, 1)}) == 3


def test_another_default_dtype_has_a_key_of_its_own() -> None:
    """A process that set float64 as torch's default builds float64 parameters and activations: twice the bytes."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        f64 = profiler._key(SPEC, 32, 1, torch.device("cpu"))
    finally:
        torch.set_default_dtype(before)
    assert f64 != _as_before(32, 1) and profiler._key(SPEC, 32, 1, torch.device("cpu")) == _as_before(32, 1)
