"""A client's round of several local epochs makes each batch as it trains on it.

Before, ``round_batches`` built every epoch's shuffled batches up front: a copy of the client's data per epoch
(1,000 epochs of a digits-sized share: 190 MB; ``--local-epochs 100000`` took each Ray actor past 10 GB and Ray's
memory monitor killed the run). The batches themselves are unchanged: the same as :func:`batches`, pass by pass.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.data import batches
from splitfed.data.batches import EpochBatches
from splitfed.errors import ConfigError
from splitfed.flower.workload import round_batches

batches_module = importlib.import_module("splitfed.data.batches")  # the package's `batches` is the function


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n) % 7


def _same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb)
                                    for (xa, ya), (xb, yb) in zip(a, b, strict=True))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(1, 12), st.integers(0, 2**31), st.integers(0, 50), st.integers(1, 4))
def test_the_batches_are_those_of_each_pass_in_turn(n: int, size: int, seed: int, first: int, epochs: int) -> None:
    """Every batch, in order, equals :func:`batches` of its pass (what ``round_batches`` returned as a list);
    indexing from the end and slices agree with iteration."""
    x, y = _data(n)
    lazy = EpochBatches(x, y, size, seed, range(first, first + epochs))
    eager = [b for e in range(first, first + epochs) for b in batches(x, y, size, seed=seed, epoch=e)]
    assert len(lazy) == len(eager)
    assert _same(list(lazy), eager)
    assert _same(lazy[1::2], eager[1::2])
    if eager:
        assert _same([lazy[-1]], [eager[-1]])
        with pytest.raises(IndexError):
            lazy[len(eager)]


def test_a_round_of_many_epochs_makes_no_batch_before_it_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand local epochs: no pass is shuffled (no batch made) until one is asked for; training through
    them shuffles each pass once, in turn."""
    shuffled: list[int] = []
    order = batches_module.batch_order
    monkeypatch.setattr(batches_module, "batch_order",
                        lambda n, seed, epoch=0: shuffled.append(epoch) or order(n, seed, epoch))
    x, y = _data(10)
    many = round_batches(x, y, 4, seed=3, partition_id=1, round=2, epochs=1_000)
    assert shuffled == []
    assert len(many) == 3_000
    it = iter(many)
    for _ in range(7):  # two passes and a batch of the third
        next(it)
    assert shuffled == [1_000, 1_001, 1_002]  # round 2's epochs follow round 1's thousand


def test_refusals_are_those_of_batches() -> None:
    x, y = _data(4)
    with pytest.raises(ConfigError, match=r"^batch_size must be a positive integer, got 0$"):
        EpochBatches(x, y, 0, 0, range(1))
    with pytest.raises(ConfigError, match=r"^inputs and labels differ in length: 4 vs 3$"):
        EpochBatches(x, y[:3], 2, 0, range(1))
