"""User-style model factories that tests load through ``module:factory`` paths."""

from __future__ import annotations

import torch
from torch import nn


class _SkipAll(nn.Module):
    """The input is added back at the very end: no point carries the whole state alone."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))) + x


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) + y


class _Residual(nn.Module):
    """stem -> residual unit -> head: the residual unit must stay whole."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.unit_a = nn.Linear(8, 8)
        self.unit_b = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = h + self.unit_b(torch.relu(self.unit_a(h)))
        return self.head(h)


def skip_all() -> nn.Module:
    return _SkipAll()


def two_inputs() -> nn.Module:
    return _TwoInputs()


def residual() -> nn.Module:
    return _Residual()


def small_sequential() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 3))


def not_a_module() -> int:
    return 3


def frozen_front() -> nn.Module:
    """Parameter-free blocks first: in U-shape a head and server part may hold nothing to train."""
    return nn.Sequential(nn.Tanh(), nn.Dropout(0.1), nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
