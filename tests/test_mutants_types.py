"""What a mutation run of ``splitfed.engine.types`` found unwatched: a learning rate of 0 (a run that trains
nothing) is refused, and an optimizer record that leaves a field out gets the field's default, as a run's
optimizer does."""

from __future__ import annotations

import pytest

from splitfed.engine.types import OptimConfig
from splitfed.errors import ConfigError


@pytest.mark.parametrize("lr", [0.0, -0.0, -0.05])
def test_a_learning_rate_of_zero_or_below_is_refused(lr: float) -> None:
    with pytest.raises(ConfigError, match=f"learning rate must be a finite number > 0, got {lr}"):
        OptimConfig(lr=lr)
    assert OptimConfig(lr=1e-12).lr == 1e-12


def test_an_optimizer_record_without_a_field_takes_its_default() -> None:
    assert OptimConfig.from_dict({}) == OptimConfig() == OptimConfig("sgd", 0.05, 0.0, 0.0)
    assert OptimConfig.from_dict({"name": "adam", "lr": 0.01}) == OptimConfig("adam", 0.01, 0.0, 0.0)
    every = OptimConfig("sgd", 0.1, 0.9, 5e-4)
    assert OptimConfig.from_dict(every.to_dict()) == every
