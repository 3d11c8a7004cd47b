"""How large a model one process agrees to build, and how long a tier holds an unused segment
(torch-free: the CLI reads the defaults and bounds when it builds its parser)."""

from __future__ import annotations

from dataclasses import dataclass

from splitfed.errors import ConfigError

MAX_BATCH = 1 << 20  # samples per batch: beyond this, one batch of any model outgrows a host's memory
MAX_VOCAB = 1 << 24  # token ids: an embedding table beyond this is no model splitfed can build
MAX_CLASSES = 1_000_000  # a classifier head beyond this is no longer a model splitfed can build
MAX_KWARGS_JSON = 64 << 10  # a model's options as JSON: a few numbers and names, never megabytes
MAX_CLIENTS = 100_000  # clients in one fleet (counts added up, or one sample): each is an object held in memory
# Seeds every command takes (the run config's, ``verify --seed``): only their low 32 bits reach a step's dropout
# key (models.segment.step_rng) and the Dirichlet partition (data.partition), so 2**32 would repeat seed 0.
MAX_SEED = 2**32 - 1
MOST_MB = 1 << 40
"""The largest size in MiB a tier takes for its limits (``splitfed tier --max-*-mb``, :class:`BuildLimits`): in
bytes, it still fits the int64 of ``Describe`` (a larger one broke every Describe of the tier with gRPC's
"Exception calling application")."""


@dataclass(frozen=True)
class BuildLimits:
    """What one process agrees to build for a model spec it is sent.

    The parameters of the whole model, and the largest tensor any module produces
    for one sample. A spec is sized on PyTorch's meta device (no memory) before it
    is built, so a tier refuses a model it could never hold (RESOURCE_EXHAUSTED)
    instead of running out of memory trying. ``splitfed tier --max-model-mb
    --max-sample-mb`` sets them for a tier process.

    ``held_bytes``: what a tier's segments may hold at once, all clients and runs together (their weights and
    buffers, gradients and optimizer state, as the cost model's fixed bytes count them); a load beyond it is
    refused, not run into the machine's out-of-memory killer. 0: three quarters of the memory of the tier's
    device when the tier starts. ``splitfed tier --max-held-mb`` sets it.
    """

    model_bytes: int = 4 << 30
    sample_bytes: int = 256 << 20
    held_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("model_bytes", "sample_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.held_bytes < 0:
            raise ConfigError(f"held_bytes must be >= 0 (0: three quarters of the device's memory), "
                              f"got {self.held_bytes}")
        for name in ("model_bytes", "sample_bytes", "held_bytes"):
            if getattr(self, name) > MOST_MB << 20:
                raise ConfigError(f"{name} must be at most {MOST_MB << 20:,} ({MOST_MB:,} MiB), "
                                  f"got {getattr(self, name):,}")


DEFAULT_LIMITS = BuildLimits()

MAX_DIMS = 16  # dimensions of a tensor that crosses a link (the wire's limit: every link keeps it)
IDLE_RELEASE_S = 3600.0  # a tier releases a segment unused this long: far above a round (see Tier.sweep)
STREAM_IDLE_S = 30.0  # a stream that moves nothing for this long is cancelled: it holds a worker thread
# and one that moves less than this on average (bytes/s; 128 kbit/s: a fifth of the slowest link of the shipped
# fleets, iot.toml's BLE microcontrollers at 0.7 Mbit/s): see splitfed.transport.server._IdleStreams
STREAM_MIN_BYTES_S = 16_000
_limits = DEFAULT_LIMITS


def set_limits(limits: BuildLimits) -> None:
    """This process's limits from now on (a tier sets them once, at start)."""
    global _limits
    _limits = limits


def current_limits() -> BuildLimits:
    return _limits
