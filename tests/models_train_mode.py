"""Models for tests/test_train_mode_output.py (imported by ``module:factory`` path, as a user's would be)."""

from __future__ import annotations

import torch
from torch import nn


class AuxHead(nn.Module):
    """Logits, and in training mode an auxiliary head's logits beside them (as GoogLeNet/Inception do)."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.main = nn.Linear(8, classes)
        self.aux = nn.Linear(8, classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return (self.main(h), self.aux(h)) if self.training else self.main(h)


class WideWhenTraining(nn.Module):
    """As many logits as expected in eval mode, one more in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.fc(h)
        return out if self.training else out[:, :3]


def aux_head() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), AuxHead())


def wide_when_training() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), WideWhenTraining())


def dropout_and_stats() -> nn.Module:
    """Trains as it should: its training-mode look draws dropout masks and updates running statistics."""
    return nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 3))
