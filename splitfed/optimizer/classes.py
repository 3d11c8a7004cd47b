"""Each client's cut options, priced and pruned: the input of every exact search.

Clients with identical inputs (device, link, samples; with ``prefer``, also the cuts they hold) have identical
option costs, so they form one :class:`OptionClass`, and a search's size depends on the number of classes, not
of clients. Each class keeps only the options that fit its device (in sl and sflv2, also every server beside
their own holder) and that no other option dominates: one no better in any column (time, each shared load,
server memory; sflv1, where the staged base can bind, which blocks it stages; with ``prefer``, the move cost)
can be swapped for the one that dominates it without raising the makespan or breaking a limit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from splitfed.cost.model import (
    Assignment,
    OptionTable,
    Scenario,
    client_key,
    held_memory,
    move_costs,
    option_table,
    tier_of_blocks,
    turn_memory,
)
from splitfed.errors import ConfigError
from splitfed.optimizer import clock
from splitfed.optimizer.clock import CHECK_EVERY
from splitfed.optimizer.solution import device_infeasible, pricing_out_of_time, shared_infeasible
from splitfed.profile.fleet import Client
from splitfed.units import mib_pair

_STAGED_REL = 1e-9  # sflv1: the rounding a bound on a tier's staged base is allowed (staged_tiers)


@dataclass
class OptionClass:
    """Clients with identical option costs, and their (device-feasible, non-dominated) options."""

    members: list[int]
    options: np.ndarray
    T: np.ndarray               # own round seconds
    load: np.ndarray            # (m, R) seconds of each shared resource (work / capacity)
    mem: np.ndarray             # (m, S) bytes of this client on each server (sl, sflv2: its turn's peak)
    dom: np.ndarray             # (m, K) further columns for dominance: memory, move cost
    all_options: int = 0
    move: np.ndarray | None = None  # (m,) seconds to move here from the preferred cuts
    held: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (m, S) the holder its turn leaves
    act: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (m, S) sflv1: the activation part of mem
    cover: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), bool))  # (m, S, L) sflv1: staged blocks
    _dom: np.ndarray | None = None

    def shared_front(self, tau: float) -> np.ndarray:
        """Options with T <= tau not dominated in shared load and memory by another such option."""
        if self._dom is None:
            self._dom = dominates(np.concatenate([self.load, self.dom], axis=1))
        p = int(np.searchsorted(self.T, tau, side="right"))
        return np.nonzero(~self._dom[:p, :p].any(axis=0))[0]

    def single(self, i: int) -> OptionClass:
        return OptionClass([i], self.options, self.T, self.load, self.mem, self.dom, self.all_options, self.move,
                           held=self.held, act=self.act, cover=self.cover)

    def finite(self) -> OptionClass:
        """Only the options priced finite (own time and every shared load): an option priced infinite ends no
        round, and an infinite coefficient (or inf * a scale of 0) is NaN in a MILP row."""
        keep = np.isfinite(self.T) & np.isfinite(self.load).all(axis=1)
        if keep.all():
            return self
        return OptionClass(self.members, self.options[keep], self.T[keep], self.load[keep], self.mem[keep],
                           self.dom[keep], self.all_options, None if self.move is None else self.move[keep],
                           held=self.held[keep], act=self.act[keep], cover=self.cover[keep])

    def memory_only(self) -> OptionClass:
        """Every option, priced at no time: a MILP over these asks only whether some assignment fits memory."""
        m = len(self.T)
        return OptionClass(self.members, self.options, np.zeros(m), np.zeros((m, 0)), self.mem, self.dom,
                           self.all_options, held=self.held, act=self.act, cover=self.cover)


def varying(V: np.ndarray) -> np.ndarray:
    """``V``'s columns that differ between some rows: one equal in every row decides no dominance (most of a
    vgg11 class's 38 are: its blocks' staged cover, 0 for every option; comparing them made pruning 5x slower)."""
    return V[:, ~(V == V[:1]).all(axis=0)] if V.shape[0] > 1 else V


def dominates(V: np.ndarray) -> np.ndarray:
    """D[a, b]: row a dominates row b (a <= b everywhere, and a < b somewhere or a comes first)."""
    V = varying(V)
    idx = np.arange(V.shape[0])
    le = (V[:, None, :] <= V[None, :, :]).all(-1)
    lt = (V[:, None, :] < V[None, :, :]).any(-1)
    return le & (lt | (idx[:, None] < idx[None, :]))


def pareto(V: np.ndarray) -> np.ndarray:
    """Rows not dominated by another row (a <= b everywhere; among equal rows the first stays).

    Few rows: all pairs at once. Many: a dominating row sorts lexicographically no later than the
    row it dominates (stable for equal rows), so one pass in that order, checking each row against
    the rows kept so far, suffices.
    """
    m = V.shape[0]
    if m <= 256:
        return ~cast(np.ndarray, dominates(V).any(axis=0))  # 2-D in: an array (the stub allows a scalar)
    keep = np.zeros(m, bool)
    V = varying(V)
    order = np.lexsort(V.T[::-1]) if V.shape[1] else np.arange(m)
    front = np.empty_like(V)
    n = 0
    for i in order:
        if n and (front[:n] <= V[i]).all(axis=1).any():
            continue
        front[n] = V[i]
        n += 1
        keep[i] = True
    return keep


def server_columns(sc: Scenario, t: OptionTable) -> tuple[np.ndarray, np.ndarray]:
    """Per option, its bytes on each server (sl, sflv2: its turn's peak, :func:`turn_memory`) and the holder
    it leaves there (zeros in sflv1, which keeps none)."""
    if not sc.in_turn:
        return t.memory[:, 1:], np.zeros_like(t.memory[:, 1:])
    held = held_memory(sc, t.options)
    return turn_memory(t.memory[:, 1:], t.act_memory[:, 1:], held), held


def fits_alone(sc: Scenario, turn: np.ndarray, held: np.ndarray) -> np.ndarray:
    """sl, sflv2: the options that fit every server beside their own holder (a necessary condition: the
    largest holder is at least theirs); one client: alone."""
    return cast(np.ndarray, (turn + (held if sc.holders else 0.0) <= sc.memory_caps).all(axis=1))


def price_classes(sc: Scenario, prefer: Assignment | None = None, deadline: float | None = None,
                  tables: dict[tuple, OptionTable] | None = None) -> list[OptionClass]:
    """Group clients (by their inputs; with ``prefer``, also by their preferred cuts) and price each
    group's legal options; raises for a device no cut fits (first), then, in sl and sflv2, for a
    server no option fits. Refused (:func:`pricing_out_of_time`) when ``deadline`` (``time.perf_counter``) passes
    while the options are priced (checked every ``CHECK_EVERY`` distinct devices, and groups pruned).
    ``tables``: each distinct device's option table (``client_key``), those priced already and those priced here
    (a re-solve prices them once for its makespan and for its move costs)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(sc.clients):
        pc = None if prefer is None or c.name not in prefer else sc.check_cuts(prefer[c.name])
        groups.setdefault((client_key(c), pc), []).append(i)
    tables = {} if tables is None else tables
    kinds = len({k for k, _ in groups})
    for members in groups.values():
        c = sc.clients[members[0]]
        if client_key(c) not in tables:
            if len(tables) % CHECK_EVERY == CHECK_EVERY - 1 and clock.expired(deadline):
                raise pricing_out_of_time(sc, f"{len(tables):,} of their {kinds:,} distinct devices priced")
            tables[client_key(c)] = option_table(sc, c)
    # every device no cut fits, whatever its kind (the same device with other sample counts is priced apart)
    unfit = [i for i, c in enumerate(sc.clients) if not tables[client_key(c)].fits_device.any()]
    if unfit:
        t = tables[client_key(sc.clients[unfit[0]])]
        raise device_infeasible(sc, unfit, t.memory[:, 0], t.options)
    fits = {}
    for k, t in tables.items():
        ok = t.fits_device
        if sc.in_turn:  # one client at a time on the servers: its option must fit them beside its holder
            ok = ok & fits_alone(sc, *server_columns(sc, t))
            if not ok.any():
                raise shared_infeasible(sc)
        fits[k] = ok
    finite = np.isfinite(sc.memory_caps)
    staged = staged_tiers(sc, [(len(m), tables[k], fits[k]) for (k, _), m in groups.items()])
    out: list[OptionClass] = []
    for (key, pc), members in groups.items():
        if len(out) % CHECK_EVERY == CHECK_EVERY - 1 and clock.expired(deadline):  # (each a Pareto front: a few ms)
            raise pricing_out_of_time(sc, f"the options of {len(out):,} of their {len(groups):,} groups pruned")
        t, ok = tables[key], fits[key]
        opts = t.options[ok]
        T, load = t.round_s[ok], t.shared_load[ok] / sc.capacities
        mem, held = (a[ok] for a in server_columns(sc, t))
        act = t.act_memory[ok, 1:]
        cover = staged_cover(sc, opts, staged)
        dom = np.concatenate([mem[:, finite], held[:, finite]], axis=1) if sc.in_turn else \
            np.concatenate([mem, (mem - act)[:, staged], cover.reshape(len(opts), -1)], axis=1)
        move = None
        if pc is not None:
            move = move_costs(sc, sc.clients[members[0]], pc, opts)
            dom = np.concatenate([dom, move[:, None]], axis=1)
        keep = np.nonzero(pareto(np.concatenate([T[:, None], load, dom], axis=1)))[0]
        keep = keep[np.argsort(T[keep], kind="stable")]  # by time: "T <= tau" is a prefix
        out.append(OptionClass(members, opts[keep], T[keep], load[keep], mem[keep], dom[keep], len(ok),
                               None if move is None else move[keep], held=held[keep], act=act[keep], cover=cover[keep]))
    return out


def staged_tiers(sc: Scenario, groups: list[tuple[int, OptionTable, np.ndarray]]) -> np.ndarray:
    """(S,) sflv1: the server tiers whose staged base may take them over their memory (every client's
    largest fixed part and the whole model's state beside it would): only there must the optimizer tell
    which blocks two clients share (see :func:`~splitfed.cost.model.staged_memory`)."""
    n_s = sc.tiers - 1
    if sc.in_turn or sum(n for n, _, _ in groups) < 2:
        return np.zeros(n_s, bool)
    fixed = sum(n * (t.memory[ok, 1:] - t.act_memory[ok, 1:]).max(axis=0) for n, t, ok in groups)
    # a bound that lands on a tier's memory may be a hair under it where the cost model's sum (fsum, another
    # order) is a hair over: such a tier is counted too (its base rows cost nothing where they cannot bind)
    return cast(np.ndarray, fixed + math.fsum(sc.profile.state_bytes) > sc.memory_caps * (1 - _STAGED_REL))


def staged_cover(sc: Scenario, options: np.ndarray, staged: np.ndarray) -> np.ndarray:
    """(m, S, L): whether each option puts block b, one with state, on server tier s, for the ``staged``
    tiers (False elsewhere): a block two clients' options cover is in that tier's staged base (sflv1).
    As dominance columns (0/1), an option dominates another only with a subset of its staged blocks:
    swapping to it then never grows a base."""
    on = tier_of_blocks(sc, options)
    has = np.asarray(sc.profile.state_bytes) > 0
    cover = np.zeros((len(options), sc.tiers - 1, sc.profile.n_blocks), bool)
    for s in np.nonzero(staged)[0]:
        cover[:, s] = (on == s + 1) & has
    return cover


def least_shares(sc: Scenario, classes: list[OptionClass]) -> ConfigError | None:
    """sflv1: the refusal, before any MILP, when some server tiers cannot hold even every client's least share.

    A tier holds sum_i fixed_i + max(staged base, sum_i act_i) >= sum_i mem_i (a replica per client), so for a
    set of tiers, the sum over clients of the least bytes any legal option of theirs puts on that set bounds
    what the set holds from below (dominance keeps, for every set, an option of least bytes). Past the set's
    memory, no assignment fits. Each tier alone misses a fleet that can move its segments from one tier to
    another but not off both: 1,000 distinct clients need 3x edge + cloud, and HiGHS took 13-34 s to say so
    (thousands: minutes, or it ran out of time and asked for more). ``classes``: every option, those priced
    infinite too (memory is about all of them). Sound, not complete: None leaves it to the MILPs."""
    caps = sc.memory_caps
    finite = [s for s in range(len(caps)) if math.isfinite(caps[s])]  # a set with an unbounded tier holds all
    if sc.in_turn or not classes or not finite:  # in turn: one client's segment at a time (checked per option)
        return None
    counts = np.array([len(c.members) for c in classes], dtype=float)
    mem = np.concatenate([c.mem for c in classes])  # every class has an option (price_classes refuses otherwise)
    starts = np.cumsum([0, *(len(c.mem) for c in classes)])[:-1]
    sizes = range(1, len(finite) + 1) if len(finite) <= 6 else (1, len(finite))  # 2^S sets: tiers are few
    for k in sizes:
        over = []
        for tiers in itertools.combinations(finite, k):
            t = list(tiers)
            need, cap = float(counts @ np.minimum.reduceat(mem[:, t].sum(axis=1), starts)), float(caps[t].sum())
            if need > cap * (1 + _STAGED_REL):  # the margin: the cost model's sums run in another order
                over.append((need - cap, need, cap, t))
        if over:  # the fewest tiers that tell it, and of those the one short by most
            _, need, cap, t = max(over, key=lambda o: o[0])
            has_not, has = mib_pair(need, cap)
            n = len(sc.clients)
            whose = "the 1 client's least share" if n == 1 else f"the {n} clients' least shares"
            names = [sc.tier_names[s + 1] for s in t]
            who = names[0] + " needs" if k == 1 else f"{', '.join(names[:-1])} and {names[-1]} together need"
            return shared_infeasible(sc, f"{who} at least {has_not} for {whose}, {'has' if k == 1 else 'have'} "
                                         f"{has}")
    return None


def kinds(sc: Scenario) -> Iterator[tuple[Client, tuple, OptionTable | None]]:
    """Each client with its kind's key and, where the kind is first seen, its option table (identical
    clients are priced once); a device that no option fits is refused, named."""
    seen: set[tuple] = set()
    for i, c in enumerate(sc.clients):
        k = client_key(c)
        t = None
        if k not in seen:
            seen.add(k)
            t = option_table(sc, c)
            if not t.fits_device.any():
                raise device_infeasible(sc, unfit_from(sc, i), t.memory[:, 0], t.options)
        yield c, k, t


def unfit_from(sc: Scenario, first: int) -> list[int]:
    """Client ``first`` (a device no cut fits) and every later one no cut fits, each kind priced once: the
    refusal names them all (the clients before ``first`` fit)."""
    unfit = {client_key(sc.clients[first]): True}
    for c in sc.clients[first + 1:]:
        if client_key(c) not in unfit:
            unfit[client_key(c)] = not option_table(sc, c).fits_device.any()
    return [j for j in range(first, len(sc.clients)) if unfit[client_key(sc.clients[j])]]


