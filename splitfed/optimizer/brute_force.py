"""Brute force: every combination of device-feasible cuts, priced in vectorised chunks (small fleets only).

The reference the exact optimizer is checked against (the tests' property: equal makespans on random small
instances). It sums each combination's times, loads and server memory as :func:`~splitfed.cost.model.evaluate`
does, re-prices the few within rounding of a memory limit or of the best with ``evaluate`` itself, and refuses
a fleet whose combinations pass ``limit`` before pricing it all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np

from splitfed.cost.model import Cuts, Scenario, client_key, evaluate, tier_of_blocks
from splitfed.errors import ConfigError
from splitfed.optimizer import clock
from splitfed.optimizer.classes import fits_alone, kinds, server_columns
from splitfed.optimizer.defaults import EXHAUSTIVE_LIMIT
from splitfed.optimizer.solution import Solution, shared_infeasible

_EDGE_REL = 1e-9  # brute force: memory this close to a tier's is checked as evaluate() prices it


def count_text(sizes: Sequence[int]) -> str:
    """The product of ``sizes`` (each >= 1) for a message: exact (``2,000,000``) while it is small, else
    ``~1.23e+400`` from its logarithm (``{n:.3g}`` of such an int raised OverflowError, and the exact
    product of 10^5 counts takes long to build)."""
    log = math.fsum(math.log10(m) for m in sizes)
    if log < 15:
        return f"{math.prod(sizes):,}"
    e = math.floor(log)
    m = 10 ** (log - e)
    if m >= 9.995:  # would print as 10
        m, e = m / 10, e + 1
    return f"~{m:.3g}e+{e}"


def _exhaustive_tables(sc: Scenario, limit: int) -> list[tuple[np.ndarray, ...]]:
    """Each client's device-feasible options (options, T, load, mem, held, act, tier of each block), refusing
    as soon as the product of their counts passes ``limit``: identical clients share one table (200 of a kind
    cost one), and the product only grows, so distinct clients are priced only until it is too large."""
    memo: dict[tuple, tuple[np.ndarray, ...]] = {}
    tables = []
    total = 1
    for _, k, t in kinds(sc):
        if t is not None:
            ok = t.fits_device
            mem, held = server_columns(sc, t)
            if sc.in_turn:  # one client at a time on the servers: its option must fit them beside its holder
                # (none: an empty table, a product of 0; the later kinds are still priced, so a device no cut
                # fits is named first, as in solve, and exhaustive then refuses as memory)
                ok = ok & fits_alone(sc, mem, held)
            memo[k] = (t.options[ok], t.round_s[ok], t.shared_load[ok] / sc.capacities, mem[ok], held[ok],
                       t.act_memory[ok, 1:], tier_of_blocks(sc, t.options[ok]))
        tables.append(memo[k])
        total *= len(memo[k][1])
        if total > limit:
            known = [len(memo[kd][1]) for kd in map(client_key, sc.clients) if kd in memo]
            more = "more than " if len(known) < len(sc.clients) else ""
            raise ConfigError(f"exhaustive search over {len(sc.clients):,} clients would check {more}"
                              f"{count_text(known)} assignments (limit {limit:,}); use the default exact MILP "
                              "instead")
    return tables


def _decode(sc: Scenario, tables: list[tuple[np.ndarray, ...]], sizes: list[int], flat: int) -> dict[str, Cuts]:
    """The assignment of a flat index (one mixed-radix digit per client) over ``tables``."""
    assignment: dict[str, Cuts] = {}
    for c, (opts, *_), m in zip(sc.clients, tables, sizes, strict=True):
        assignment[c.name] = tuple(int(x) for x in opts[flat % m])
        flat //= m
    return assignment


def _fits_as_priced(sc: Scenario, tables: list[tuple[np.ndarray, ...]], sizes: list[int], flat: np.ndarray,
                    val: np.ndarray, best: float) -> np.ndarray:
    """Whether each of these assignments, whose memory brute force's sums put within rounding of a tier's,
    fits as :func:`evaluate` prices it (its sum, in another order, may land on the other side). Cheapest
    first, and only while one may still be the best: those past the first that fits are left False."""
    fits = np.zeros(len(flat), bool)
    for j in np.argsort(val, kind="stable"):
        if val[j] > best * (1 + 1e-9):
            break
        if evaluate(sc, _decode(sc, tables, sizes, int(flat[j]))).feasible:
            fits[j] = True
            best = min(best, float(val[j]))
    return fits


def exhaustive(sc: Scenario, limit: int = EXHAUSTIVE_LIMIT) -> Solution:
    """Brute force over every combination of device-feasible cuts (small fleets only), for ``sc.mode``."""
    t0 = clock.now()
    tables = _exhaustive_tables(sc, limit)
    sizes = [len(t[1]) for t in tables]
    total = math.prod(sizes)
    caps = sc.memory_caps
    best = math.inf
    cands: list[tuple[float, int]] = []  # (value, flat index)
    chunk = 250_000 if sc.in_turn else 100_000  # sflv1 counts the clients holding each block on each tier
    for start in range(0, total, chunk):
        idx = np.arange(start, min(total, start + chunk))
        rem = idx.copy()
        tmax = np.zeros(len(idx))
        load = np.zeros((len(idx), tables[0][2].shape[1]))
        mem = np.zeros((len(idx), len(caps)))
        most = np.zeros((len(idx), len(caps)))  # in turn: the largest holder
        act = np.zeros((len(idx), len(caps)))  # sflv1: the activations, and how many clients hold each block
        holding = np.zeros((len(idx), len(caps), sc.profile.n_blocks), np.int32)
        for (_, T, ld, mm, hh, aa, on), m in zip(tables, sizes, strict=True):
            d = rem % m
            rem //= m
            tmax = np.maximum(tmax, T[d])
            load += ld[d]
            if sc.in_turn:
                mem = np.maximum(mem, mm[d])
                most = np.maximum(most, hh[d])
            else:
                mem += mm[d]
                act += aa[d]
                for t in range(len(caps)):
                    holding[:, t] += on[d] == t + 1
        if sc.holders:
            mem += most
        if not sc.in_turn:  # the staged base beside the fixed parts (:func:`~splitfed.cost.model.server_memory`)
            mem += np.maximum((holding >= 2) @ np.asarray(sc.profile.state_bytes, dtype=float) - act, 0.0)
        val = np.maximum(tmax, load.max(axis=1) if load.shape[1] else 0.0)
        ok = cast(np.ndarray, (mem <= caps * (1 - _EDGE_REL)).all(axis=1))  # 2-D in: an array (the stub allows a scalar)
        edge = np.nonzero((mem <= caps * (1 + _EDGE_REL)).all(axis=1) & ~ok)[0]
        ok[edge] = _fits_as_priced(sc, tables, sizes, idx[edge], val[edge], min(best, val[ok].min(initial=math.inf)))
        if not ok.any():
            continue
        vmin = float(val[ok].min())
        if vmin <= best * (1 + 1e-9):
            best = min(best, vmin)
            sel = np.nonzero(ok & (val <= best * (1 + 1e-9)))[0]
            cands = [(v, i) for v, i in cands if v <= best * (1 + 1e-9)] + [(float(val[s]), int(idx[s])) for s in sel]
    if not cands:
        raise shared_infeasible(sc)
    results = []
    seen: set[float] = set()
    for v, flat in sorted(cands):
        if v in seen:  # equal sums in float: re-price one combination per value
            continue
        seen.add(v)
        cost = evaluate(sc, _decode(sc, tables, sizes, flat))
        if cost.feasible:
            results.append(cost)
    if not results:
        raise shared_infeasible(sc)
    cost = min(results, key=lambda c: c.makespan_s)
    return Solution("exhaustive", cost, clock.now() - t0, True, f"{total:,} assignments checked")


