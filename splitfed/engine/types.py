"""Plain typed records exchanged by tiers, links and the round orchestrator."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

# the variants: defined where the command line reads them without torch, and re-exported here
from splitfed.engine.modes import IN_TURN as IN_TURN
from splitfed.engine.modes import MODES as MODES
from splitfed.engine.optim import SGD, Adam, SegmentOptimizer
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec

State = dict[str, torch.Tensor]
"""A (partial) model state: keys ``"<block index>.<key in block>"``."""


def block_of(key: str) -> int:
    """The block a state key belongs to."""
    return int(key.split(".", 1)[0])

BASE_PREFIX = "@"  # a client id that names a coordinator's base segment (SegmentLoad.base), not a client


def is_base(client_id: str) -> bool:
    return client_id.startswith(BASE_PREFIX)


@dataclass(frozen=True)
class StepKey:
    """Identifies one training step of one client; ``seq`` grows by one per step in a round.

    ``secret`` is the client's binding secret (:attr:`SegmentLoad.secret`): a tier refuses a step
    that does not carry the secret its segment was loaded with. Never shown in a repr or message.
    """

    run_id: str
    client_id: str
    round: int
    seq: int
    secret: str = field(default="", repr=False)


def step_count_bytes(slots: int) -> int:
    """Bytes an optimizer with ``slots`` keeps per Parameter that trains besides its slots: Adam (the one with
    2: :attr:`OptimConfig.slots`, ``--optimizer-slots 2``) keeps a step count for each, a 0-d tensor on the CPU
    as torch.optim.Adam hosts it (:class:`splitfed.engine.optim.Adam`), float32, or float64 where that is
    torch's default dtype. SGD keeps none."""
    if slots != 2:
        return 0
    return 8 if torch.get_default_dtype() == torch.float64 else 4


def optimizer_state_bytes(slots: int, train_bytes: float, train_tensors: int) -> float:
    """Bytes of optimizer state for Parameters that train (``train_bytes`` in all, ``train_tensors`` of them,
    each Parameter once): ``slots`` tensors shaped as each, and each one's step count
    (:func:`step_count_bytes`). The one rule the profile's fixed bytes and a tier's reservation both count;
    torch makes the state at a parameter's first gradient, so one that never gets one has none."""
    return train_bytes * slots + train_tensors * step_count_bytes(slots)


@dataclass(frozen=True)
class OptimConfig:
    """Each tier builds its own optimizer from this; per-parameter rules keep splits exact."""

    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in ("sgd", "adam"):
            raise ConfigError(f"optimizer must be sgd or adam, got {self.name!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"learning rate must be a finite number > 0, got {self.lr}")
        for name in ("momentum", "weight_decay"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name.replace('_', ' ')} must be a finite number >= 0, got {v}")
        if self.momentum >= 1:  # v <- m*v + g never forgets a gradient at m = 1 and grows without bound above
            raise ConfigError(f"momentum must be below 1 (0.9 is usual), got {self.momentum}")

    @property
    def slots(self) -> int:
        """Tensors this optimizer keeps per parameter (Adam: two moments; SGD: a momentum buffer, if any):
        what the memory model counts for it."""
        return 2 if self.name == "adam" else int(self.momentum > 0)

    def state_bytes(self, train_bytes: int, train_tensors: int) -> int:
        """Bytes this optimizer keeps for Parameters that train: :func:`optimizer_state_bytes`."""
        return int(optimizer_state_bytes(self.slots, train_bytes, train_tensors))

    def build(self, params: list[torch.nn.Parameter]) -> SegmentOptimizer | None:
        """The optimizer (:mod:`splitfed.engine.optim`: torch.optim's updates without its torch._dynamo
        import); None for no Parameters."""
        if not params:
            return None
        if self.name == "adam":
            return Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def to_dict(self) -> dict:
        return {"name": self.name, "lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}

    @classmethod
    def from_dict(cls, d: dict) -> OptimConfig:
        return cls(str(d.get("name", "sgd")), float(d.get("lr", 0.05)), float(d.get("momentum", 0.0)),
                   float(d.get("weight_decay", 0.0)))


@dataclass
class SegmentLoad:
    """Control message: bind a client to blocks ``[start, stop)`` on a tier for one round.

    ``replica`` names the weights the client trains: its own id (SplitFed v1:
    one replica per client) or a shared name (SplitFed v2 / vanilla SL: one
    server-side model, clients in turn). ``state`` (keys of blocks in range)
    overwrites those weights; ``None`` keeps what the replica holds.
    ``loss_here``: this tier ends the client's chain (no later tier holds a
    block of it): it computes the loss, or (U-shape) hands its output back to
    the device; it never calls the next tier for this client.
    ``secret``: the binding's secret, chosen by the coordinator per client and round
    (:meth:`RoundConfig.secret_of <splitfed.engine.rounds.RoundConfig.secret_of>`) and given only
    to that client: every later step, fetch, release and re-load of the client must carry it, and so
    must a load that joins a replica other clients are bound to. Empty: an unprotected binding.
    ``base``: copy the weights of the blocks ``state`` leaves out from that replica of the run, already on
    the tier (the round's global server segments, staged once per tier rather than shipped once per client;
    the replica of the client before, in turn); ``base_secret`` must be the secret it was loaded with.
    """

    run_id: str
    client_id: str
    round: int
    model: ModelSpec
    start: int
    stop: int
    replica: str
    state: State | None
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    loss_here: bool = True
    secret: str = field(default="", repr=False)
    base: str = ""
    base_secret: str = field(default="", repr=False)


@dataclass(frozen=True)
class ReduceItem:
    """One client whose trained server segment a tier adds into its mean, weighted by ``weight`` (its samples)."""

    client_id: str
    secret: str = field(repr=False)
    weight: float


@dataclass
class Reduced:
    """A tier's sample-weighted mean of its clients' trained segments, per key, on the CPU: float32 for a
    floating key of 32 bits or fewer, float64 for the rest (:func:`~splitfed.aggregate.wire_dtype`). The
    coordinator, which knows the weight behind each key, turns it back into a float64 sum
    (:meth:`~splitfed.aggregate.Partial.of_means`) and adds that into :func:`~splitfed.aggregate.aggregate`
    instead of every replica. ``refused``: clients left out of the mean, and why (weights not finite, no
    segment loaded): the coordinator drops them."""

    means: State
    refused: dict[str, str] = field(default_factory=dict)


@dataclass
class StepReply:
    """What comes back from one forward+backward round trip down the chain."""

    grad: torch.Tensor | None  # gradient w.r.t. the activation sent (None if it needs none)
    loss: float
    correct: int  # correct predictions in the batch (for training accuracy)
