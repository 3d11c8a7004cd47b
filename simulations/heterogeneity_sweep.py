"""Makespan of each cut policy as the fleet's spread of device speeds and bandwidths grows.

Cost model only (no training), so it scales to fleets of 10,000 clients. The
fleet is the device classes of the config's ``fleet`` (the reference fleet by
default), dealt out to ``clients`` clients (:meth:`Fleet.sample`), with their heterogeneity scaled
by a factor ``s``: each class's FLOP/s and up/down bandwidth become
``g * (x / g) ** s``, ``g`` the fleet's geometric mean of that quantity.
``s = 0`` is a homogeneous fleet of average devices, ``s = 1`` the fleet as it
is, ``s = 2`` twice as spread on a log scale. Memory, latency and sample counts
stay as they are. Scaling classes keeps the number of
distinct devices (and so the exact optimizer's MILP) small at any fleet size.

Every policy is priced by the one cost model: the exact optimizer
(``splitfed.optimizer``), the best single static cut for everyone, per-device
greedy, and all-on-server.

The config is checked when it is read (one line naming the key): every spread a
finite number >= 0, fleet sizes in 1..MAX_CLIENTS, a seed in 0..2**32-1, known
policies, at least one of each, none listed twice (it would be priced and drawn
twice), and a solver time limit > 0 (``inf``: none). A spread so large that the
fleet's numbers overflow or vanish is refused before anything is priced.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from simulations.common import config_fleet, config_folder, main, recorded, scenario, write_csv
from splitfed.errors import ConfigError

POLICIES = ("optimizer", "best-static", "greedy", "all-on-server")


@dataclass(frozen=True)
class Config:
    model: str = "vgg11"
    fleet: str = "reference"
    tiers: int = 3
    batch: int = 32
    clients: tuple[int, ...] = (100, 1000, 10000)
    spreads: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)
    policies: tuple[str, ...] = POLICIES
    seed: int = 0
    solve_time_limit_s: float = 60.0

    def __post_init__(self) -> None:
        folder = config_folder()
        if folder is not None:  # read from a file: its relative fleet is looked for beside it, as a [simulate]'s
            object.__setattr__(self, "fleet", config_fleet(self.fleet, folder, "fleet"))
        known = ", ".join(POLICIES)
        if not self.policies:
            raise ConfigError(f"policies must name at least one of {known}")
        bad = next((p for p in self.policies if p not in POLICIES), None)
        if bad is not None:
            raise ConfigError(f"policies: unknown {bad!r} (known: {known})")
        if not self.clients:
            raise ConfigError("clients must list at least one fleet size")
        from splitfed.engine.limits import MAX_CLIENTS, MAX_SEED

        small = next((n for n in self.clients if n < 1), None)
        if small is not None:
            raise ConfigError(f"clients: {small} is not a fleet size >= 1")
        large = next((n for n in self.clients if n > MAX_CLIENTS), None)
        if large is not None:  # the fleet's draw refused it mid-sweep, naming no key
            raise ConfigError(f"clients: {large:,} is more than a fleet draws (MAX_CLIENTS, {MAX_CLIENTS:,})")
        if not 0 <= self.seed <= MAX_SEED:  # numpy's draw of the fleet took -1 as a traceback
            raise ConfigError(f"seed must be an integer in 0..{MAX_SEED:,} (2**32-1), got {self.seed}")
        if not self.spreads:
            raise ConfigError("spreads must list at least one spread factor")
        wrong = next((s for s in self.spreads if not (math.isfinite(s) and s >= 0)), None)
        if wrong is not None:  # nan and inf reached the optimizer (IndexError) and _ratio (ZeroDivisionError)
            raise ConfigError(f"spreads: {wrong} is not a finite number >= 0")
        for key, values in (("clients", self.clients), ("spreads", self.spreads), ("policies", self.policies)):
            _once(key, values)
        if not self.solve_time_limit_s > 0:  # the optimizer would run it as 0.1 s
            raise ConfigError(f"solve_time_limit_s must be > 0 seconds, got {self.solve_time_limit_s}")


def _once(key: str, values: Sequence[Any]) -> None:
    """Refuse a value listed twice: it would be priced twice and drawn twice, one curve over the other."""
    twice = next((v for v, n in Counter(values).items() if n > 1), None)
    if twice is not None:
        raise ConfigError(f"{key} lists {twice!r} twice")


def spread_fleet(fleet: Any, s: float) -> Any:
    """``fleet`` with every client's FLOP/s and bandwidths pulled to (s < 1) or pushed from (s > 1) the mean."""
    from splitfed.profile import LinkProfile, TierProfile

    cs = fleet.clients
    g = {k: math.exp(float(np.mean([math.log(v) for v in vals])))
         for k, vals in (("flops", [c.device.flops for c in cs]), ("up", [c.link.up for c in cs]),
                         ("down", [c.link.down for c in cs]))}

    def scale(x: float, key: str) -> float:
        return g[key] * (x / g[key]) ** s

    cache: dict[tuple, Any] = {}

    def spread(c: Any) -> Any:
        key = (c.device, c.link)
        if key not in cache:
            try:
                values = [scale(c.device.flops, "flops"), scale(c.link.up, "up"), scale(c.link.down, "down")]
            except OverflowError:
                values = [math.inf]
            if not all(math.isfinite(v) and v > 0 for v in values):
                raise ConfigError(f"spreads: {s:g} scales a device's FLOP/s or bandwidth of this fleet out of "
                                  "the numbers a float holds (overflow or 0); use a smaller spread")
            flops, up, down = values
            cache[key] = (TierProfile(flops, c.device.memory), LinkProfile(up, down, c.link.rtt))
        dev, link = cache[key]
        return replace(c, device=dev, link=link)

    return replace(fleet, clients=tuple(spread(c) for c in cs))


def _ratio(values: list[float]) -> float:
    return max(values) / min(values)


def _policy(name: str, sc: Any, time_limit: float) -> Any:
    from splitfed.optimizer import all_on_server, best_static, greedy, solve

    if name == "optimizer":
        return solve(sc, time_limit=time_limit)
    if name == "best-static":
        return best_static(sc)
    if name == "greedy":
        return greedy(sc)
    return all_on_server(sc)


def sweep(cfg: Config) -> list[dict[str, Any]]:
    """One row per (fleet size, spread, policy), priced by the cost model."""
    from splitfed.profile import load_fleet

    base = load_fleet(cfg.fleet)
    fleets = {n: base.sample(n, seed=cfg.seed) for n in cfg.clients}
    for drawn in fleets.values():  # the widest spread is the one that may overflow: refused before any pricing
        spread_fleet(drawn, max(cfg.spreads))
    rows: list[dict[str, Any]] = []
    for n, drawn in fleets.items():
        for s in cfg.spreads:
            fleet = spread_fleet(drawn, s)
            sc = scenario(cfg.model, fleet, cfg.tiers, cfg.batch)
            where = {"clients": n, "spread": s, "flops_ratio": _ratio([c.device.flops for c in fleet.clients]),
                     "bandwidth_ratio": _ratio([c.link.up for c in fleet.clients])}
            line = []
            for p in cfg.policies:
                try:
                    sol = _policy(p, sc, cfg.solve_time_limit_s)
                except ConfigError as e:  # e.g. no single static cut fits every device
                    rows.append({**where, "policy": p, "makespan_s": None, "feasible": False, "error": str(e)})
                    line.append(f"{p}=n/a")
                    continue
                rows.append({**where, "policy": p, "makespan_s": sol.makespan_s, "solve_s": sol.solve_s,
                             "bottleneck": sol.cost.bottleneck, "feasible": sol.cost.feasible,
                             "optimal": sol.optimal})
                line.append(f"{p}={sol.makespan_s:.3g}s" + ("" if sol.cost.feasible else " (over memory)"))
            print(f"  clients={n:>6} spread={s:<5g} " + "  ".join(line), flush=True)
    return rows


def run(cfg: Config, out: Path) -> dict[str, Any]:
    from splitfed.profile import load_fleet
    from splitfed.report.plots import Series, line_plot

    rows = sweep(cfg)
    speedups = _speedups(rows, cfg)
    write_csv(out / "results.csv", rows)
    # s = 1 is the config's fleet as it is: its name (a file's, or its stem), not always the reference fleet
    xlabel = f"spread factor s (0: identical devices, 1: {load_fleet(cfg.fleet).name} fleet)"
    figures = {}
    for n in cfg.clients:
        ok = [r for r in rows if r["clients"] == n and r["feasible"]]
        series = [Series(p, [r["spread"] for r in ok if r["policy"] == p], [r["makespan_s"] for r in ok if r["policy"] == p])
                  for p in cfg.policies]
        figures[f"makespan_{n}"] = recorded(line_plot(  # untied: the policies that tie the optimizer hid its curve
            untie(series), out / f"makespan_vs_spread_{n}.png", logy=True, xlabel=xlabel,
            title=f"Round makespan vs heterogeneity ({cfg.model}, {n} clients, {cfg.tiers} tiers)",
            ylabel="makespan (simulated s, log)", note="points over a server's memory are left out"))
    others = [p for p in cfg.policies if p != "optimizer"]
    if "optimizer" in cfg.policies and others:
        series = [Series(f"{other} / optimizer, {n} clients",
                         [r["spread"] for r in speedups if r["clients"] == n and r.get(other) is not None],
                         [r[other] for r in speedups if r["clients"] == n and r.get(other) is not None],
                         {"linestyle": ["-", "--", ":", "-."][i % 4], "color": f"C{j}"})
                  for i, n in enumerate(cfg.clients) for j, other in enumerate(others)]
        figures["speedup"] = recorded(line_plot(
            untie(series), out / "speedup_vs_spread.png", hline=1.0, hline_label="no gain", xlabel=xlabel,
            title=f"Optimizer's speed-up over each policy ({cfg.model}, {cfg.tiers} tiers)",
            ylabel="makespan ratio (policy / optimizer)", note="policies over a server's memory are left out"))
    return {"rows": rows, "speedups": speedups, "figures": figures}


def untie(series: Sequence[Any]) -> list[Any]:
    """``series`` with each group of curves that have the same points (policies that tie, e.g. best-static and
    greedy at 1.0 on a homogeneous fleet) drawn so that every one shows: dashes of one length, each curve's
    dashes in its own place along the line (its colour in turn), and its own marker, larger and hollow for
    each after the first. A curve that ties no other is left as it is."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(series):
        if len(s.x):
            groups.setdefault((tuple(s.x), tuple(np.round(np.asarray(s.y, dtype=float), 9))), []).append(i)
    out = list(series)
    dash = 4.0
    for members in (g for g in groups.values() if len(g) > 1):
        for j, i in enumerate(members):
            style = {**series[i].style, "linestyle": (j * dash, (dash, dash * (len(members) - 1))),
                     "marker": _TIE_MARKERS[j % len(_TIE_MARKERS)], "markersize": 4 + 2.5 * j,
                     "markerfacecolor": "none" if j else None}
            out[i] = replace(series[i], style=style)
    return out


_TIE_MARKERS = ("o", "s", "D", "^", "v", "P")


def _speedups(rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """Per (clients, spread): each policy's makespan over the optimizer's (None: infeasible or failed)."""
    out = []
    for n in cfg.clients:
        for s in cfg.spreads:
            ms = {r["policy"]: r["makespan_s"] for r in rows
                  if r["clients"] == n and r["spread"] == s and r.get("feasible")}
            opt = ms.get("optimizer")
            if not opt:
                continue
            out.append({"clients": n, "spread": s, **{p: (ms[p] / opt if ms.get(p) else None)
                                                      for p in cfg.policies if p != "optimizer"}})
    return out


def cli(argv: list[str] | None = None) -> int:
    """``python -m simulations.heterogeneity_sweep [--config FILE] [--out DIR]``."""
    return main("heterogeneity_sweep", Config, run, argv, doc=__doc__, runs=False)  # no runs: no --resume


if __name__ == "__main__":
    raise SystemExit(cli())
