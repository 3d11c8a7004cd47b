"""The vgg11 profile the optimizer's tests price fleets with (profiled once a worker: a few seconds), and the
reference fleet, whole or dealt to n clients, as a 3-tier scenario of it."""

from __future__ import annotations

import pytest

from splitfed.cost import Scenario
from splitfed.profile import ModelProfile


@pytest.fixture(scope="session")
def vgg11() -> ModelProfile:
    from splitfed.models.zoo import resolve_spec
    from splitfed.profile.profiler import profile_model

    return profile_model(resolve_spec("vgg11"), 32, reps=1)


def reference(prof: ModelProfile, n: int | None = None) -> Scenario:
    """The reference fleet (n None or its size) or n clients dealt from its devices (seed 0), at batch 32 on 3
    tiers."""
    from splitfed.profile.fleet import load_fleet

    fleet = load_fleet("reference")
    return Scenario.from_fleet(prof, fleet if n in (None, len(fleet.clients)) else fleet.sample(n, seed=0), tiers=3,
                               batch=32)
