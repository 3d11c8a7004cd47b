"""One built copy of each model per process: replicas are deep copies of its blocks.

Building and tracing a model is slow; every tier, device and reference in a
process reuses the template and copies only the blocks it needs.
"""

from __future__ import annotations

import copy
import json
import threading
from functools import lru_cache

import torch
from torch import nn

from splitfed.models.blocks import Blocks, to_blocks
from splitfed.models.zoo import ModelSpec, build

_lock = threading.Lock()


def _key(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


@lru_cache(maxsize=16)
def _template(key: str) -> Blocks:
    spec = ModelSpec.from_dict(json.loads(key))
    rng = torch.random.get_rng_state()
    try:
        return to_blocks(build(spec, seed=0))
    finally:
        torch.random.set_rng_state(rng)


def template(spec: ModelSpec) -> Blocks:
    """The shared, never-trained blocks of ``spec`` (do not mutate them)."""
    with _lock:
        return _template(_key(spec))


def copy_blocks(spec: ModelSpec, start: int, stop: int) -> dict[int, nn.Module]:
    t = template(spec)
    with _lock:
        return {i: copy.deepcopy(t.modules[i]) for i in range(start, stop)}


def num_blocks(spec: ModelSpec) -> int:
    return len(template(spec))


@lru_cache(maxsize=256)
def _boundaries(key: str) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    spec = ModelSpec.from_dict(json.loads(key))
    blocks = template(spec)
    x = spec.example_input(2)
    out = [(tuple(x.shape[1:]), x.dtype)]
    with _lock, torch.no_grad():
        modes = [m.training for m in blocks.modules]
        try:
            for m in blocks.modules:
                m.eval()
                x = m(x)
                out.append((tuple(x.shape[1:]), x.dtype))
        finally:
            for m, mode in zip(blocks.modules, modes, strict=True):
                m.train(mode)
    return tuple(out)


def boundary(spec: ModelSpec, index: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-sample shape and dtype of the tensor entering block ``index`` (``L``: the logits)."""
    return _boundaries(_key(spec))[index]
