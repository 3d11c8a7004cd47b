"""A device's training speed, measured on its own hardware when it registers.

The cost model takes a device's effective FLOP/s from its profile, a guess; the
adaptive policy corrects it from each round's measured compute, but only while
the device holds blocks: one the optimizer gives no block (its raw inputs go to
the edge) would keep the guess for good, and a guess that is too low keeps it
there. So a node measures its speed once at registration, as it measures its
link: it trains the model's first blocks (forward and backward, as a device
holding them would) on one batch of its own data, adding blocks until a pass
takes ``budget_s``, and reports which blocks, how many samples and the median
seconds of ``reps`` passes after a warm-up. The coordinator turns that into
FLOP/s with the cost model's own FLOP counts (:func:`measured_flops`), so the
node needs no profile of its own.

A device the plan gives no block keeps measuring: each round the adaptive policy
asks such a node to time the same thing again before it trains (deployment; the
simulated clock times it in the cost model: :func:`first_work`), so a device at
cut 0 that turns faster or slower is learned as one that computes is. The cost
model does not price that check (a few tens of milliseconds a round).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from splitfed.errors import ConfigError
from splitfed.models import rng
from splitfed.models.zoo import ModelSpec, first_line
from splitfed.profile.profiler import ModelProfile

BUDGET_S = 0.02  # seconds of training per timed pass: long enough to dwarf Python's overhead per block
REPS = 3


@dataclass(frozen=True)
class SpeedMeasure:
    """Blocks ``[0, blocks)`` trained on ``samples`` samples in ``seconds`` (median of a few passes)."""

    blocks: int
    samples: int
    seconds: float

    def __post_init__(self) -> None:
        if not (self.blocks >= 1 and self.samples >= 1 and math.isfinite(self.seconds) and self.seconds > 0):
            raise ConfigError(f"a speed measurement needs at least one block and sample and a positive, finite "
                              f"time; got {self.blocks} block(s), {self.samples} sample(s), {self.seconds} s")


def measure_speed(spec: ModelSpec, x: torch.Tensor, where: torch.device | None = None, *,
                  budget_s: float = BUDGET_S, reps: int = REPS,
                  clock: Callable[[], float] = time.perf_counter) -> SpeedMeasure:
    """Time the training of ``spec``'s first blocks on the batch ``x`` (fresh copies of the blocks: nothing
    the node trains is touched; torch's generator is given back as it was)."""
    from splitfed.engine import template
    from splitfed.models.segment import Segment

    where = where or torch.device("cpu")

    def now() -> float:  # a GPU runs behind its caller: wait for it before reading the clock
        if where.type == "cuda":
            torch.cuda.synchronize(where)
        return clock()

    blocks: dict[str, torch.nn.Module] = {}

    def once(stop: int) -> float:
        for i in range(len(blocks), stop):  # copied (and moved to ``where``) as they are added: a small GPU
            blocks[str(i)] = template.copy_blocks(spec, i, i + 1)[i].to(where).train()  # holds the first alone
        seg = Segment({k: blocks[k] for k in map(str, range(stop))}, 0, stop)
        with _generators(where):  # held for the pass alone: the copies above take the template's lock first
            t0 = now()
            out = seg(x)
            outs = [t for t in (out if isinstance(out, tuple | list) else [out])
                    if isinstance(t, torch.Tensor) and t.requires_grad]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            t = now() - t0
        seg.zero_grad(set_to_none=True)
        return t

    try:
        n = template.num_blocks(spec)
        x = x.to(where)
        stop = 1
        while once(stop) < budget_s and stop < n:  # also the warm-up of every block it adds
            stop += 1
        seconds = statistics.median(once(stop) for _ in range(reps))
    except Exception as e:  # noqa: BLE001 - a user's model may raise anything (BatchNorm on one sample: ValueError)
        raise ConfigError(f"could not time training model {spec.name} here: {type(e).__name__}: "
                          f"{first_line(e)}") from None
    return SpeedMeasure(stop, len(x), max(seconds, 1e-9))


def first_work(profile: ModelProfile, samples: int) -> float:
    """FLOPs of training the model's first blocks on ``samples`` samples, up to the first block that computes
    (what a node at cut 0 would time of itself, in the simulated clock); 0 if no block computes."""
    work = 0.0
    for fwd, bwd in zip(profile.fwd_flops, profile.bwd_flops, strict=True):
        work += (fwd + bwd) * samples
        if work > 0:
            break
    return work


def measured_flops(profile: ModelProfile, m: SpeedMeasure) -> float | None:
    """FLOP/s: the cost model's FLOPs of training blocks ``[0, m.blocks)`` on ``m.samples`` samples, over the
    seconds they took. None when the profile counts no work there, or has fewer blocks (another model), or
    the rate is outside what a fleet file accepts for a device (``RANGES["flops"]``: a node's reply is not
    trusted to be sane)."""
    from splitfed.profile.fleet import in_range

    if m.blocks > profile.n_blocks or m.samples > profile.batch:
        return None
    work = (math.fsum(profile.fwd_flops[:m.blocks]) + math.fsum(profile.bwd_flops[:m.blocks])) * m.samples
    flops = work / m.seconds if work > 0 else math.nan
    return flops if in_range(flops, "flops") else None


@contextmanager
def _generators(where: torch.device) -> Iterator[None]:
    """torch's generators (the CPU's and ``where``'s) to oneself and given back (:mod:`splitfed.models.rng`): a
    node may share its process with others that draw, an in-process tier's dropout seeded per step, whose masks
    a timed pass must not move."""
    with rng.seeded():
        cuda_state = torch.cuda.get_rng_state(where) if where.type == "cuda" else None
        try:
            yield
        finally:
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, where)
