"""What sets an optimal makespan, in one line: the question a user asks of a plan no faster than a static cut.

An optimal round is bound by one of three things. A *straggler*: one client needs the makespan even with the
servers to itself, at its fastest cuts, so no policy can be faster (the reference fleet's field Pis, whose raw
images cross a 2 Mbit/s uplink whatever the cut). A *client* slower than it could be alone: its faster cuts
would put more on shared servers that are full or busy. A *shared resource* (an edge's compute, a link): its
work, summed over the clients, is the round, and cuts trade it against the devices and other tiers. In ``sl``
and ``sflv2`` the clients train in turn, so their rounds add up.

The client-bound line says why the optimizer chose slower cuts: it holds for an optimal answer only (``solve``
proven, or brute force), not for a policy priced as it is.
"""

from __future__ import annotations

import numpy as np

from splitfed.cost.model import Cuts, RoundCost, Scenario, option_table
from splitfed.profile.fleet import Client

_TIE = 1e-9  # a makespan this close (relative) to the straggler's own best is that best, as priced


def _share(used: float, cap: float) -> float:
    """How full a server is (a tier of memory 0 holding nothing is empty; an unbounded one never fills)."""
    return used / cap if cap > 0 else (0.0 if used <= 0 else float("inf"))


def _times(seconds: float, alone: float) -> str:
    """``2.5x``: how many times its time alone a client takes (alone 0, a client of no work: ``infx``)."""
    return f"{seconds / alone:.1f}x" if alone > 0 else "infx"


def fastest_alone(sc: Scenario, client: Client) -> tuple[float, Cuts]:
    """The fastest round ``client`` can have at any cuts its device holds, with the servers to itself, and
    those cuts."""
    t = option_table(sc, client)
    r = np.where(t.fits_device, t.round_s, np.inf)
    o = int(np.argmin(r))
    return float(r[o]), tuple(int(x) for x in t.options[o])


def largest_part(sc: Scenario, cost: RoundCost, name: str) -> str:
    """Which part of client ``name``'s round takes longest (a tier's compute, a link's direction, the weight
    exchange), with the device's speed or link where that is the part."""
    cc = next(c for c in cost.clients if c.name == name)
    names = sc.tier_names
    parts = {f"{names[t]} compute": cc.compute_s[t] for t in range(sc.tiers)}
    for j in range(sc.tiers - 1):
        parts[f"{names[j]}->{names[j + 1]} up"] = cc.up_s[j]
        parts[f"{names[j]}->{names[j + 1]} down"] = cc.down_s[j]
    parts["weight exchange"] = cc.exchange_s
    part, secs = max(parts.items(), key=lambda kv: kv[1])
    c = sc.clients[sc.index(name)]
    detail = {"device compute": f" at {c.device.flops / 1e9:.0f} GFLOP/s",
              "device->edge up": f" at {c.link.up * 8 / 1e6:g} Mbit/s",
              "device->edge down": f" at {c.link.down * 8 / 1e6:g} Mbit/s"}.get(part, "")
    return f"{part}{detail} is {secs:.1f} s of its {cc.round_s:.1f} s"


def bound(sc: Scenario, cost: RoundCost) -> str:
    """``straggler``, ``client`` or ``shared``: what sets ``cost``'s makespan (see the module docstring)."""
    b = cost.bottleneck
    if not b.startswith("client "):
        return "shared"
    alone, _ = fastest_alone(sc, sc.clients[sc.index(b.removeprefix("client "))])
    return "straggler" if cost.makespan_s <= alone * (1 + _TIE) else "client"


def explain(sc: Scenario, cost: RoundCost) -> str:
    """One line: what sets the makespan of ``cost``, an optimal assignment of ``sc``."""
    b = cost.bottleneck
    full = [_share(u, cap) for u, cap in zip(cost.shared_memory.values(), sc.memory_caps, strict=True)]
    mem = ", ".join(f"{t} {f:.0%} full" for t, f in zip(cost.shared_memory, full, strict=True))
    if b.startswith("client "):
        name = b.removeprefix("client ")
        client = sc.clients[sc.index(name)]
        alone, cuts = fastest_alone(sc, client)
        if cost.makespan_s <= alone * (1 + _TIE):
            return (f"straggler-bound: a {client.kind} client needs {alone:.1f} s even alone at its best cuts "
                    f"{','.join(map(str, cuts))} ({largest_part(sc, cost, name)}); no policy can be faster")
        busiest = max(cost.shared_s, key=lambda r: cost.shared_s[r], default=None)
        if max(full, default=0.0) > 0.9 or busiest is None:
            why = (f"the servers' memory is {mem} "
                   f"({'one replica per client' if sc.mode == 'sflv1' else 'one client at a time'})")
        else:
            why = f"busiest shared resource {busiest} at {cost.shared_s[busiest]:.1f} s"
        return (f"client-bound: {name} ({client.kind}) at {','.join(map(str, cost.assignment()[name]))} takes "
                f"{cost.makespan_s:.1f} s, {_times(cost.makespan_s, alone)} its {alone:.1f} s alone, because its "
                f"faster cuts would put more on the shared servers: {why}; {largest_part(sc, cost, name)}")
    if sc.in_turn:  # sl, sflv2: the clients' rounds add up, so every client's own time counts
        return (f"clients in turn: the {len(sc.clients)} clients' rounds add up to {cost.shared_s[b]:.1f} s; cuts "
                f"shorten each client's own round (memory: {mem})")
    return (f"shared-resource-bound: {b} is busy {cost.shared_s[b]:.1f} s with {len(sc.clients)} clients' work; "
            f"cuts trade it against the devices and other tiers (memory: {mem})")
