"""Seeded mini-batches: the split engine and the unsplit reference must see the same ones."""

from __future__ import annotations

import torch
from torch import Tensor

from splitfed.data._seed import derive_seed
from splitfed.errors import ConfigError


def batch_order(n: int, seed: int, epoch: int = 0) -> Tensor:
    """The sample order of one epoch: a function of (seed, epoch) only, never of global RNG state."""
    if epoch < 0:
        raise ConfigError(f"epoch must be >= 0, got {epoch}")
    g = torch.Generator().manual_seed(derive_seed(seed, epoch))
    return torch.randperm(n, generator=g)


def batches(x: Tensor, y: Tensor, batch_size: int, seed: int, epoch: int = 0,
            drop_last: bool = False) -> list[tuple[Tensor, Tensor]]:
    """Shuffle (x, y) with a private generator and cut it into batches of ``batch_size``.

    The last batch is shorter unless ``drop_last``; an empty input gives no batches.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    if len(x) != len(y):
        raise ConfigError(f"inputs and labels differ in length: {len(x)} vs {len(y)}")
    order = batch_order(len(x), seed, epoch)
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    # slices, not Tensor.split: split() of an empty tensor yields one empty batch
    return [(x[idx], y[idx]) for idx in (order[i:i + batch_size] for i in range(0, stop, batch_size))]
