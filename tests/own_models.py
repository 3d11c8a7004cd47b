"""Models a user brings that once trained as another model (tests/test_own_models.py loads them by path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def reused_activation() -> nn.Module:
    """One ReLU object used twice: ``children()`` yields it once, and its second use was dropped."""
    act = nn.ReLU()
    return nn.Sequential(nn.Linear(16, 8), act, nn.Linear(8, 8), act, nn.Linear(8, 3))


def reused_layer() -> nn.Module:
    """One Linear used twice (its weights shared by two places in the chain)."""
    a = nn.Linear(8, 8)
    return nn.Sequential(nn.Linear(16, 8), a, nn.ReLU(), a, nn.ReLU(), nn.Linear(8, 3))


def tied_sequential() -> nn.Module:
    """Two layers that share one weight tensor (weight tying), two blocks apart."""
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    b.weight = a.weight
    return nn.Sequential(nn.Linear(16, 8), a, nn.ReLU(), b, nn.ReLU(), nn.Linear(8, 3))


class _TiedTraced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.a, self.b, self.out = nn.Linear(16, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        h = F.relu(self.a(h))
        h = F.relu(self.b(h))
        return self.out(h)


def tied_traced() -> nn.Module:
    return _TiedTraced()


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, 2 * x


class _Sum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.lin(pair[0]) + pair[1]


def tuple_between() -> nn.Module:
    """Children that pass a tuple between them: no cut may fall there (a link carries one tensor)."""
    return nn.Sequential(nn.Linear(16, 8), _Pair(), _Sum(), nn.ReLU(), nn.Linear(8, 3))


def inplace_first() -> nn.Module:
    """ReLU(inplace=True) right after a cut: a tier's first op writes its input."""
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.ReLU(inplace=True),
                         nn.Linear(8, 3))


def batch_statistics() -> nn.Module:
    """A BatchNorm without running statistics: it needs two samples even in eval mode."""
    return nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.ReLU(),
                         nn.Linear(8, 3))


def tied_ends() -> nn.Module:
    """The first and last layers share a weight: every block stays together, so there is no cut."""
    first, last = nn.Linear(16, 16), nn.Linear(16, 16)
    last.weight = first.weight
    return nn.Sequential(first, nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), last)


class _DropoutByFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.dropout(F.relu(self.a(x)), 0.5, self.training))


def dropout_by_flag() -> nn.Module:
    return _DropoutByFlag()


class _Mean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(1)


def tokens() -> nn.Module:
    """Integer tokens in (an nn.Embedding first): a user's own token model."""
    return nn.Sequential(nn.Embedding(20, 8), _Mean(), nn.Linear(8, 8), nn.Linear(8, 3))


def digits_batchnorm() -> nn.Module:
    """Digits (1x8x8) through a BatchNorm1d: one sample per channel in a batch of one."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
