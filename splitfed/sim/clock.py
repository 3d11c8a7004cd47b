"""The simulated clock: what a round would take on the fleet's devices, from the one cost model.

A simulation runs on one machine, so measured times say little about a Pi on a
rural uplink. Each virtual client is given a device from the fleet (dealt once
per run, :meth:`~splitfed.profile.fleet.Fleet.sample`) and ``sim_round_s`` is the cost model's makespan of the
round's assignment on those devices (:func:`splitfed.cost.round_time`, the same
function the optimizer minimises), with each client's real sample count and the
fleet's drift applied for the round. A client whose cuts moved since its previous
round also pays for moving the weights between tiers first
(:func:`splitfed.cost.move_cost`, what the adapter weighs a move against).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo, Clock, Cuts
from splitfed.profile.fleet import Fleet, load_fleet


def fleet_for(settings: RunSettings) -> Fleet:
    """The run's fleet: ``settings.clients`` devices dealt from the fleet file (:meth:`Fleet.sample`)."""
    return load_fleet(settings.fleet).sample(settings.clients, seed=settings.seed)


def drawn_devices(fleet: Fleet, clients: Sequence[ClientInfo]) -> dict[str, str] | None:
    """Each client's device by client id when every client is one of the devices the run drew (``fleet``), the
    one case the simulated clock times a round; else None (a node of another device: measured times). The
    clock and the adaptive policy (:func:`splitfed.flower.adaptive.simulated_devices`) both ask it, so they
    never disagree on which rounds are simulated."""
    drawn = {c.name for c in fleet.clients}
    if any(c.profile not in drawn for c in clients):
        return None
    return {c.client_id: c.profile for c in clients}


def make_clock(settings: RunSettings, fleet: Fleet) -> Clock:
    """``clock(round, assignment, clients, previous)``; ``None`` for clients that name no fleet device."""
    from splitfed.cost import Scenario, evaluate, move_cost
    from splitfed.flower.adaptive import run_profile

    profile = run_profile(settings)
    base = Scenario.from_fleet(profile, fleet, tiers=settings.tiers, batch=settings.batch_size,
                               u_shape=settings.u_shape, epochs=settings.local_epochs, mode=settings.mode,
                               codec=settings.compress, min_device_blocks=settings.min_device_blocks)

    def clock(round: int, assignment: Mapping[str, Cuts], clients: Sequence[ClientInfo],
              previous: Mapping[str, Cuts]) -> float | None:
        if not clients or drawn_devices(fleet, clients) is None:
            return None  # deployment: devices are real, times are measured instead
        now = fleet.at_round(round)
        picked = [replace(now.client(c.profile), name=c.client_id, samples=c.samples or now.client(c.profile).samples)
                  for c in clients]
        sc = base.with_clients(picked)
        moves = {c.name: move_cost(sc, c, previous[c.name], assignment[c.name]) for c in picked
                 if c.name in previous and tuple(previous[c.name]) != tuple(assignment[c.name])}
        return evaluate(sc, assignment, extra_s=moves).makespan_s

    return clock


def finished_time(clock: Clock, round: int, assignment: Mapping[str, Cuts], clients: Sequence[ClientInfo],
                  previous: Mapping[str, Cuts], failed: Collection[str]) -> float | None:
    """The simulated time of a round its ``failed`` clients did not finish: the makespan of the ones that did,
    as its bytes, clients and losses are theirs (a dropped straggler set the round's time, in sl and sflv2 its
    whole turn was added). Both backends ask it, so their rows stay the same."""
    done = [c for c in clients if c.client_id not in set(failed)]
    return clock(round, {c.client_id: assignment[c.client_id] for c in done}, done, previous) if done else None
