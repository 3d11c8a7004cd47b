"""Shared test set-up: one torch thread (CI has 2 cores), hypothesis without deadlines.

Engineers append fixtures for their area below (or import them from a tests/*_fixtures.py module).
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

settings.register_profile(
    "splitfed",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.load_profile("splitfed")
