"""Models a user brings for tests/test_api_audit33.py (loaded by path, ``tests.models_audit33:factory``)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import prune


def pruned() -> nn.Module:
    """A layer pruned with ``torch.nn.utils.prune``: a forward pre-hook recomputes its ``weight`` attribute."""
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    prune.l1_unstructured(m[0], "weight", amount=0.5)
    return m


class _PrunedTraced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 3)
        prune.l1_unstructured(self.a, "weight", amount=0.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(F.relu(self.a(x)) + x)


def pruned_traced() -> nn.Module:
    return _PrunedTraced()


class _FrozenStatsSequential(nn.Sequential):
    """Keeps its BatchNorm in eval mode in ``train()``: the frozen-statistics pattern of detection backbones."""

    def train(self, mode: bool = True) -> _FrozenStatsSequential:
        super().train(mode)
        self[1].eval()
        return self


def frozen_stats_sequential() -> nn.Module:
    return _FrozenStatsSequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


class _Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn = nn.Linear(16, 16), nn.BatchNorm1d(16)

    def train(self, mode: bool = True) -> _Backbone:
        super().train(mode)
        self.bn.eval()
        return self

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.a(x)))


class _FrozenStatsTraced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone, self.head = _Backbone(), nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))


def frozen_stats_traced() -> nn.Module:
    """The override on a module inside a traced model: tracing keeps its BatchNorm, not its ``train``."""
    return _FrozenStatsTraced()


def frozen_stats_child() -> nn.Module:
    """The override on a Sequential model's child: a block of its own, whose ``train`` a tier calls."""
    return nn.Sequential(_Backbone(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


class _LastStep(nn.Module):
    def forward(self, x: tuple[Tensor, object]) -> Tensor:
        return x[0][:, -1]


def lstm_head() -> nn.Module:
    """An LSTM over 5 steps of 8 features: on CPU torch runs it as one fused mkldnn kernel."""
    return nn.Sequential(nn.LSTM(8, 16, batch_first=True), _LastStep(), nn.Linear(16, 3))
