"""torch's process-wide random generator, shared safely by threads.

Dropout masks and a model's initial weights come from torch's default CPU
generator, which every thread of a process shares: a tier runs many clients'
steps in threads, and a process may run several runs. Whoever seeds it or draws
from it does so under :data:`LOCK`, or another thread could reseed it between a
seed and its draws: a wrong dropout mask, or wrong initial weights, silently.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

LOCK = threading.RLock()


@contextmanager
def seeded(seed: int | None = None) -> Iterator[None]:
    """The generator to oneself, seeded with ``seed`` if given; its state is given back afterwards.

    Only the CPU generator: ``torch.manual_seed`` also queues lazy CUDA/XPU/MTIA seeding,
    each capturing a stack trace (~1.5 ms a call), and splitfed computes on the CPU.
    """
    with LOCK:
        before = torch.default_generator.get_state()
        try:
            if seed is not None:
                torch.default_generator.manual_seed(seed)
            yield
        finally:
            torch.default_generator.set_state(before)
