"""Seeded mini-batches: the split engine and the unsplit reference must see the same ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

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


class EpochBatches(Sequence[tuple[Tensor, Tensor]]):
    """The batches of several shuffled passes over (x, y) (``epochs``: each pass's epoch number, as in
    :func:`batches`), each made when it is asked for: the same batches as :func:`batches` pass by pass, but
    a client of many local epochs no longer holds a copy of its data per epoch (1,000 epochs of a
    digits-sized share held 190 MB; 100,000 took a Ray actor past 10 GB)."""

    def __init__(self, x: Tensor, y: Tensor, batch_size: int, seed: int, epochs: Sequence[int]) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if len(x) != len(y):
            raise ConfigError(f"inputs and labels differ in length: {len(x)} vs {len(y)}")
        self._x, self._y, self._size, self._seed, self._epochs = x, y, batch_size, seed, epochs
        self._per = -(-len(x) // batch_size)  # batches per pass
        self._order: tuple[int, Tensor] | None = None  # the last pass's order (batches are asked for in turn)

    def __len__(self) -> int:
        return self._per * len(self._epochs)

    @overload
    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[Tensor, Tensor]]: ...

    def __getitem__(self, i: int | slice) -> tuple[Tensor, Tensor] | list[tuple[Tensor, Tensor]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        e, j = divmod(i, self._per)
        epoch = self._epochs[e]
        order = self._order
        if order is None or order[0] != epoch:
            order = self._order = (epoch, batch_order(len(self._x), self._seed, epoch))
        idx = order[1][j * self._size:(j + 1) * self._size]
        return self._x[idx], self._y[idx]
