"""One SplitFed round, cut open where the clients train.

:func:`splitfed.engine.rounds.run_round` runs a round in one call with the
clients trained in-process. Over Flower the clients train elsewhere, some of
them never answer, and SplitFed v1 trains them all at once. :class:`SplitRound`
keeps the same sequence (the same loads, fetches and contribution order, built
from the same helpers) but hands control back at each training point:

    rnd = SplitRound(cfg, tiers, global_state, assignment, min_clients)
    for group in rnd.groups():          # sflv1: everyone at once; sl/sflv2: one by one
        weights = rnd.begin(group)      # loads server segments; device weights to send
        rnd.end(train(weights))         # clients left out of the outcomes failed
    new_state = rnd.finish()            # fetch replicas, aggregate layer-wise

Failure handling: a failed client contributes nothing (its replicas are
released); sl skips it (the next client's load carries the current weights, so
its partial server-side steps are discarded); in sflv2 its partial steps on the
shared replica stay in it, as they would on a real shared server. A round with
fewer than ``min_clients`` successes raises :class:`RoundFailed` and changes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from splitfed.aggregate import aggregate
from splitfed.engine import template
from splitfed.engine.link import TierControl
from splitfed.engine.rounds import (
    SHARED,
    Batches,
    Chain,
    ClientResult,
    RoundConfig,
    _train,
    check_assignment,
    device_state,
    select,
    server_bounds,
    tier_loads,
)
from splitfed.engine.types import State
from splitfed.errors import SplitfedError, TierError

Cuts = tuple[int, ...]


class RoundFailed(SplitfedError):
    """Too few clients finished the round; the global model is unchanged."""


@dataclass
class Outcome:
    """A client's trained device segment(s) and what its round cost."""

    state: State
    result: ClientResult


Trainer = Callable[[RoundConfig, Mapping[str, Cuts], Mapping[str, State]], Mapping[str, Outcome]]
"""``train(cfg, cuts, device_weights) -> outcomes`` for one group; absent clients failed."""


class SplitRound:
    """The tier bookkeeping of one round (see the module docstring)."""

    def __init__(self, cfg: RoundConfig, tiers: Sequence[TierControl], global_state: State,
                 assignment: Mapping[str, Cuts], min_clients: int = 0) -> None:
        check_assignment(cfg.model, dict(assignment), len(tiers) + 1, cfg.u_shape)
        self.cfg, self.tiers, self.global_state = cfg, list(tiers), global_state
        self.assignment = dict(assignment)
        self.order = list(assignment)
        self.min_clients = min_clients or len(self.order)
        self.n_blocks = template.num_blocks(cfg.model)
        self.current = dict(global_state)  # sl: the model handed from client to client
        self.held: list[set[int]] = [set() for _ in self.tiers]  # sflv2: blocks in the shared replica
        self.trained: list[dict[int, float]] = [{} for _ in self.tiers]
        self.done: dict[str, Outcome] = {}
        self.failed: list[str] = []
        self._loaded: list[str] = []
        self._group: list[str] = []

    # ------------------------------------------------------------ the three steps

    def groups(self) -> list[list[str]]:
        return [list(self.order)] if self.cfg.mode == "sflv1" else [[c] for c in self.order]

    def begin(self, group: Sequence[str]) -> dict[str, State]:
        """Load the group's server-side segments; return each client's device weights."""
        cfg = self.cfg
        base = self.current if cfg.mode == "sl" else self.global_state
        self._group = list(group)
        for cid in group:
            cuts = self.assignment[cid]
            if cfg.mode == "sflv2":
                loads = tier_loads(cfg, cid, cuts, self.global_state, replica=SHARED, skip=self.held)
            else:
                loads = tier_loads(cfg, cid, cuts, base)
            self._loaded.append(cid)
            for t, (tier, load) in enumerate(zip(self.tiers, loads, strict=True)):
                tier.load(load)
                if cfg.mode == "sflv2":
                    self.held[t].update(range(load.start, load.stop))
        return {cid: device_state(base, self.assignment[cid], self.n_blocks, cfg.u_shape) for cid in group}

    def end(self, outcomes: Mapping[str, Outcome]) -> None:
        """Take the group's trained device weights; clients missing from ``outcomes`` failed."""
        for cid in self._group:
            out = outcomes.get(cid)
            if out is None:
                self.failed.append(cid)
                self._release(cid)
                continue
            if self.cfg.mode == "sl":
                try:
                    fetched = [tier.fetch(self.cfg.run_id, cid) for tier in self.tiers]
                except TierError:
                    self.failed.append(cid)
                    self._release(cid)
                    continue
                self.current.update(out.state)
                for part in fetched:
                    self.current.update(part)
                self._release(cid)
            elif self.cfg.mode == "sflv2":
                for t, (a, z) in enumerate(server_bounds(self.assignment[cid], self.n_blocks, self.cfg.u_shape)):
                    for i in range(a, z):
                        self.trained[t][i] = self.trained[t].get(i, 0.0) + out.result.samples
            self.done[cid] = out
        self._group = []

    def finish(self) -> State:
        """The new global state; releases every segment of the round."""
        try:
            if len(self.done) < self.min_clients:
                raise RoundFailed(f"round {self.cfg.round}: {len(self.done)} of {len(self.order)} clients "
                                  f"finished, fewer than the minimum {self.min_clients} "
                                  f"(failed: {', '.join(self.failed) or 'none'})")
            if self.cfg.mode == "sl":
                return self.current
            if self.cfg.mode == "sflv1":
                return self._finish_v1()
            return self._finish_v2()
        finally:
            self.close()

    def close(self) -> None:
        """Release whatever is still loaded (safe to call twice, and after errors)."""
        for cid in list(self._loaded):
            self._release(cid)

    @property
    def results(self) -> list[ClientResult]:
        return [self.done[c].result for c in self.order if c in self.done]

    # ------------------------------------------------------------ internals

    def _finish_v1(self) -> State:
        fetched: dict[str, list[State]] = {}
        for cid in self.order:
            if cid not in self.done:
                continue
            try:
                fetched[cid] = [tier.fetch(self.cfg.run_id, cid) for tier in self.tiers]
            except TierError:
                self.failed.append(cid)
                del self.done[cid]
        if len(self.done) < self.min_clients:
            raise RoundFailed(f"round {self.cfg.round}: only {len(self.done)} clients' replicas could be "
                              f"fetched, fewer than the minimum {self.min_clients}")
        contributions: list[tuple[State, float]] = [(self.done[c].state, self.done[c].result.samples)
                                                    for c in self.order if c in self.done]
        for cid in self.order:
            if cid in fetched:
                contributions += [(part, self.done[cid].result.samples) for part in fetched[cid]]
        return aggregate(contributions, previous=self.global_state)

    def _finish_v2(self) -> State:
        contributions: list[tuple[State, float]] = [(self.done[c].state, self.done[c].result.samples)
                                                    for c in self.order if c in self.done]
        for t, tier in enumerate(self.tiers):
            bank: State = {}
            for cid in self.order:
                if cid in self.done:
                    bank.update(tier.fetch(self.cfg.run_id, cid))
            for i, w in self.trained[t].items():
                contributions.append((select(bank, i, i + 1), w))
        return aggregate(contributions, previous=self.global_state)

    def _release(self, cid: str) -> None:
        if cid not in self._loaded:
            return
        self._loaded.remove(cid)
        for tier in self.tiers:
            try:
                tier.release(self.cfg.run_id, cid)
            except Exception:  # noqa: BLE001 - a vanished tier must not mask the round's outcome
                pass


def drive(rnd: SplitRound, train: Trainer) -> State:
    """Run ``rnd`` to the end with ``train`` doing each group's client training."""
    try:
        for group in rnd.groups():
            weights = rnd.begin(group)
            rnd.end(train(rnd.cfg, {c: rnd.assignment[c] for c in group}, weights))
        return rnd.finish()
    finally:
        rnd.close()


def local_trainer(chain: Chain, data: Mapping[str, Batches]) -> Trainer:
    """Clients trained in this process over ``chain.link`` (the in-process form of the ClientApp)."""

    def train(cfg: RoundConfig, cuts: Mapping[str, Cuts], weights: Mapping[str, State]) -> dict[str, Outcome]:
        out = {}
        for cid, w in weights.items():
            dev, res = _train(cfg, chain, cid, cuts[cid], w, data[cid])
            out[cid] = Outcome(dev.state(), res)
        return out

    return train
