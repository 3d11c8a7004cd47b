"""The policies the optimizer is compared to, priced by the same cost model: one static cut vector for every
client (given, or the best one), each device's own fastest cuts (greedy: as if the servers were its alone),
and everything on the last server."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitfed.cost.model import Cuts, Scenario, client_key, evaluate, held_memory, option_table
from splitfed.errors import ConfigError
from splitfed.optimizer import clock
from splitfed.optimizer.classes import fits_alone, kinds, server_columns
from splitfed.optimizer.clock import CHECK_EVERY
from splitfed.optimizer.solution import OutOfTime, Solution, caps_text
from splitfed.profile.fleet import Client
from splitfed.units import mib_pair


def static(sc: Scenario, cuts: Sequence[int]) -> Solution:
    """The same cuts for every client; a device they do not fit is named."""
    t0 = clock.now()
    cuts = sc.check_cuts(cuts)
    cost = evaluate(sc, {c.name: cuts for c in sc.clients})
    for c, cc in zip(sc.clients, cost.clients, strict=True):
        if not cc.fits_device:
            need, has = mib_pair(cc.memory[0], c.device.memory)
            raise ConfigError(f"cuts {','.join(map(str, cuts))} do not fit device {c.name!r}: they need {need} "
                              f"of its {has}")
    return Solution(f"static {','.join(map(str, cuts))}", cost, clock.now() - t0, False)


def best_static(sc: Scenario, time_limit: float | None = None) -> Solution:
    """The best single cut vector for all clients (every legal one tried in the cost model).

    Every vector is ranked by a bound (slowest client, busiest shared tier); the few best are then priced
    exactly, each a pass over the whole fleet (~2.5 s for 100,000 clients). ``time_limit``: seconds from this
    call on after which no further one is priced (the first always is); the note says when that cut it short.
    Ranking prices every distinct device's options: refused (ConfigError) when the limit runs out before that
    is done (checked every ``CHECK_EVERY`` devices: a fleet of fewer is always ranked)."""
    t0 = clock.now()
    deadline = None if time_limit is None else t0 + time_limit
    ok = np.ones(len(sc.options), bool)
    round_s = np.zeros(len(sc.options))
    load = np.zeros((len(sc.options), len(sc.capacities)))
    mem = np.zeros((len(sc.options), len(sc.memory_caps)))
    act = np.zeros_like(mem)
    held = held_memory(sc, sc.options) if sc.holders else np.zeros_like(mem)
    groups: dict[tuple, list[Client]] = {}
    for c in sc.clients:
        groups.setdefault(client_key(c), []).append(c)
    for done, members in enumerate(groups.values()):
        if done % CHECK_EVERY == CHECK_EVERY - 1 and clock.expired(deadline):
            what = (f"the time limit ran out while ranking the cut vectors for the {len(sc.clients):,} clients of "
                    f"{sc.profile.model} ({done:,} of their {len(groups):,} distinct devices priced), before any "
                    "was priced exactly")
            raise OutOfTime(f"{what}: raise it (--time-limit)", what)
        n = len(members)
        t = option_table(sc, members[0])
        ok &= t.fits_device
        round_s = np.maximum(round_s, t.round_s)
        load += n * t.shared_load
        if sc.mode == "sflv1":
            mem += n * t.memory[:, 1:]
            act += n * t.act_memory[:, 1:]
        else:  # one client at a time (sl, sflv2), beside a holder of the same cuts
            mem = np.maximum(mem, server_columns(sc, t)[0])
    if sc.mode == "sflv1" and len(sc.clients) > 1:  # every client holds the same server blocks: all are staged
        mem += np.maximum(held_memory(sc, sc.options) - act, 0.0)  # (server_memory's base, beside the fixed parts)
    ok &= (mem + held <= sc.memory_caps * (1 + 1e-9)).all(axis=1)
    val = np.maximum(round_s, (load / sc.capacities).max(axis=1) if load.shape[1] else 0.0)
    if not ok.any():
        raise ConfigError(f"no single cut vector fits every device and server of the fleet for {sc.profile.model}")
    order = np.argsort(np.where(ok, val, np.inf), kind="stable")
    best: Solution | None = None
    priced, note = 0, ""
    for o in order[:8]:  # re-price the few best with the exact cost model
        if not ok[o]:
            break
        if best is not None and time_limit is not None and clock.now() - t0 > time_limit:
            note = f"the time limit ran out after pricing {priced} of the {min(8, int(ok.sum()))} best-ranked vectors"
            break
        s = static(sc, sc.options[o])
        priced += 1
        if s.cost.feasible and (best is None or s.makespan_s < best.makespan_s):
            best = s
    if best is None:
        raise ConfigError(f"no single cut vector fits every device and server of the fleet for {sc.profile.model}")
    return Solution(f"best static {','.join(map(str, best.assignment[sc.clients[0].name]))}", best.cost,
                    clock.now() - t0, False, note)


def greedy(sc: Scenario) -> Solution:
    """Each device picks the cuts that minimise its own round time, as if the servers were its alone: among
    the cuts that fit its device and, alone, every server (together its clients may overflow a server)."""
    t0 = clock.now()
    assignment: dict[str, Cuts] = {}
    memo: dict[tuple, Cuts] = {}
    for c, k, t in kinds(sc):
        if t is not None:
            fits = t.fits_device & fits_alone(sc, *server_columns(sc, t))
            if not fits.any():
                raise ConfigError(f"greedy: no cuts of client {c.name!r} that its device holds fit the server "
                                  f"tiers ({caps_text(sc)}) even with the servers to itself")
            memo[k] = tuple(int(x) for x in t.options[int(np.argmin(np.where(fits, t.round_s, np.inf)))])
        assignment[c.name] = memo[k]
    cost = evaluate(sc, assignment)
    return Solution("greedy", cost, clock.now() - t0, False,
                    "" if cost.feasible else "violates: " + "; ".join(cost.violations))


def all_on_server(sc: Scenario) -> Solution:
    """Everything on the last server (the device only sends its data; U-shape: and computes the loss)."""
    L = sc.profile.n_blocks
    cuts = (0,) * (sc.tiers - 1) + ((L,) if sc.u_shape else ())
    s = static(sc, cuts)
    return Solution("all-on-server", s.cost, s.solve_s, False)
