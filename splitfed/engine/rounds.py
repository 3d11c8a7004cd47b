"""One federated round over a chain of tiers, for each variant.

- ``sflv1``: every client trains its own replica of every server-side segment;
  all replicas and device segments are averaged layer-wise at the end.
- ``sflv2``: one shared server-side model per tier, trained by the clients in
  turn; device segments are averaged, and each shared block is averaged with
  the device copies of that block (weighted by the clients that trained it there).
- ``sl``: vanilla split learning: clients in turn, the whole model handed on
  from one client to the next, no averaging.

The helpers here (bounds, loads, state selection, contributions) are also what
the Flower ServerApp uses, so the round logic exists once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from splitfed.aggregate import aggregate
from splitfed.engine import template
from splitfed.engine.device import Device
from splitfed.engine.link import InProcessLink, Link, TierControl
from splitfed.engine.tier import Tier
from splitfed.engine.types import MODES, OptimConfig, SegmentLoad, State
from splitfed.errors import ConfigError
from splitfed.models.blocks import segment_bounds, validate_cuts
from splitfed.models.zoo import ModelSpec, build

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]
SHARED = "shared"


@dataclass(frozen=True)
class RoundConfig:
    run_id: str
    round: int
    model: ModelSpec
    mode: str = "sflv1"
    u_shape: bool = False
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")


@dataclass
class ClientResult:
    client_id: str
    cuts: tuple[int, ...]
    samples: int
    loss: float
    correct: int
    compute_s: float
    link_s: float
    bytes_up: int = 0
    bytes_down: int = 0


def initial_state(model: ModelSpec, seed: int) -> State:
    """The global model before round 1: the same in every process for a seed."""
    rng = torch.random.get_rng_state()
    try:
        from splitfed.models.blocks import to_blocks

        return {k: v.detach().clone() for k, v in to_blocks(build(model, seed)).whole().state_dict().items()}
    finally:
        torch.random.set_rng_state(rng)


def block_of(key: str) -> int:
    return int(key.split(".", 1)[0])


def select(state: State, start: int, stop: int) -> State:
    """The keys of blocks ``[start, stop)``."""
    return {k: v for k, v in state.items() if start <= block_of(k) < stop}


def server_bounds(cuts: Sequence[int], n_blocks: int, u_shape: bool) -> list[tuple[int, int]]:
    """``[start, stop)`` of each server tier, in chain order (the device's parts excluded)."""
    b = segment_bounds(cuts, n_blocks, u_shape)
    return b[1:-1] if u_shape else b[1:]


def device_state(state: State, cuts: Sequence[int], n_blocks: int, u_shape: bool) -> State:
    b = segment_bounds(cuts, n_blocks, u_shape)
    out = select(state, *b[0])
    if u_shape:
        out.update(select(state, *b[-1]))
    return out


def tier_loads(cfg: RoundConfig, client_id: str, cuts: Sequence[int], state: State | None,
               replica: str | None = None, skip: Sequence[set[int]] | None = None) -> list[SegmentLoad]:
    """One load per server tier; ``skip[t]``: blocks tier t already holds for a shared replica."""
    n = template.num_blocks(cfg.model)
    bounds = server_bounds(cuts, n, cfg.u_shape)
    loads = []
    for t, (a, z) in enumerate(bounds):
        part = None
        if state is not None:
            part = {k: v for k, v in select(state, a, z).items() if not (skip and block_of(k) in skip[t])}
        loads.append(SegmentLoad(
            run_id=cfg.run_id, client_id=client_id, round=cfg.round, model=cfg.model, start=a, stop=z,
            replica=replica or client_id, state=part, optim=cfg.optim, seed=cfg.seed,
            loss_here=(t == len(bounds) - 1) and not cfg.u_shape,
        ))
    return loads


def check_assignment(model: ModelSpec, assignment: dict[str, tuple[int, ...]], n_tiers: int, u_shape: bool) -> None:
    n = template.num_blocks(model)
    for cid, cuts in assignment.items():
        try:
            validate_cuts(cuts, n, n_tiers, u_shape, model=model.name)
        except ConfigError as e:
            raise ConfigError(f"client {cid}: {e}") from None


@dataclass
class Chain:
    """The server tiers a device talks to: control handles per tier, and the first link."""

    tiers: list[TierControl]
    link: Link

    @property
    def bytes(self) -> tuple[int, int]:
        return getattr(self.link, "bytes_up", 0), getattr(self.link, "bytes_down", 0)


def inprocess_chain(server_tiers: int = 2, compress_up=None, compress_down=None) -> Chain:  # type: ignore[no-untyped-def]
    """Edge -> ... -> cloud as in-process tiers joined by in-process links."""
    if server_tiers < 1:
        raise ConfigError("a chain needs at least one server tier (2 tiers in all)")
    names = ["edge", *[f"tier{i}" for i in range(2, server_tiers)], "cloud"] if server_tiers > 1 else ["cloud"]
    tiers: list[Tier] = []
    nxt: InProcessLink | None = None
    for name in reversed(names):
        tier = Tier(name, next=nxt)
        tiers.insert(0, tier)
        nxt = InProcessLink(tier, compress_up, compress_down)
    assert nxt is not None
    return Chain(list(tiers), nxt)


def _train(cfg: RoundConfig, chain: Chain, cid: str, cuts: tuple[int, ...], state: State,
           batches: Batches) -> tuple[Device, ClientResult]:
    up0, down0 = chain.bytes
    dev = Device(cfg.model, chain.link, run_id=cfg.run_id, client_id=cid, round=cfg.round, cuts=cuts,
                 state=state, u_shape=cfg.u_shape, optim=cfg.optim, seed=cfg.seed)
    losses, correct = [], 0
    for x, y in batches:
        loss, c = dev.train_step(x, y)
        losses.append(loss)
        correct += c
    up1, down1 = chain.bytes
    return dev, ClientResult(cid, cuts, dev.samples, sum(losses) / max(1, len(losses)), correct,
                             dev.compute_s, dev.link_s, up1 - up0, down1 - down0)


def run_round(cfg: RoundConfig, chain: Chain, global_state: State, assignment: dict[str, tuple[int, ...]],
              data: dict[str, Batches]) -> tuple[State, list[ClientResult]]:
    """Train every client of ``assignment`` on its batches; return the new global state."""
    n_tiers = len(chain.tiers) + 1
    check_assignment(cfg.model, assignment, n_tiers, cfg.u_shape)
    n = template.num_blocks(cfg.model)
    results: list[ClientResult] = []
    if cfg.mode == "sl":
        current = dict(global_state)
        for cid, cuts in assignment.items():
            for tier, load in zip(chain.tiers, tier_loads(cfg, cid, cuts, current), strict=True):
                tier.load(load)
            dev, res = _train(cfg, chain, cid, cuts, current, data[cid])
            current.update(dev.state())
            for tier in chain.tiers:
                current.update(tier.fetch(cfg.run_id, cid))
                tier.release(cfg.run_id, cid)
            results.append(res)
        return current, results

    contributions: list[tuple[State, float]] = []
    if cfg.mode == "sflv1":
        for cid, cuts in assignment.items():
            for tier, load in zip(chain.tiers, tier_loads(cfg, cid, cuts, global_state), strict=True):
                tier.load(load)
        for cid, cuts in assignment.items():
            dev, res = _train(cfg, chain, cid, cuts, global_state, data[cid])
            contributions.append((dev.state(), res.samples))
            results.append(res)
        for cid, res in zip(assignment, results, strict=True):
            for tier in chain.tiers:
                contributions.append((tier.fetch(cfg.run_id, cid), res.samples))
                tier.release(cfg.run_id, cid)
        return aggregate(contributions, previous=global_state), results

    # sflv2: one shared replica per tier; each block enters it from the global state once per round
    held: list[set[int]] = [set() for _ in chain.tiers]
    trained: list[dict[int, float]] = [{} for _ in chain.tiers]
    for cid, cuts in assignment.items():
        loads = tier_loads(cfg, cid, cuts, global_state, replica=SHARED, skip=held)
        for t, (tier, load) in enumerate(zip(chain.tiers, loads, strict=True)):
            tier.load(load)
            held[t].update(range(load.start, load.stop))
        dev, res = _train(cfg, chain, cid, cuts, global_state, data[cid])
        contributions.append((dev.state(), res.samples))
        for t, load in enumerate(loads):
            for i in range(load.start, load.stop):
                trained[t][i] = trained[t].get(i, 0.0) + res.samples
        results.append(res)
    for t, tier in enumerate(chain.tiers):
        bank: State = {}
        for cid in assignment:
            bank.update(tier.fetch(cfg.run_id, cid))
        for i, w in trained[t].items():
            contributions.append((select(bank, i, i + 1), w))
    for cid in assignment:
        for tier in chain.tiers:
            tier.release(cfg.run_id, cid)
    del n
    return aggregate(contributions, previous=global_state), results
