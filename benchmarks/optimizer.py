"""Segment optimizer vs the policies it replaces, all priced by the one cost model (the simulated clock).

On the reference fleet (60 heterogeneous clients, T4 edge, A100 cloud), 3 tiers,
vgg11 and resnet18 at batch 32: the round makespan of the optimizer, the best
single static cut, per-device greedy and all-on-server, in two settings: raw
data may leave the device (any cut) and raw data stays (>= 1 block on device,
the premise of split learning); and the same on 1,000 clients drawn from the
reference fleet, where the shared edge and cloud are contended. Then the optimizer's solve time for 100, 1,000
and 10,000 clients drawn from the fleet's device classes, and for 100 and 1,000
clients that are all different (no classes to group). One run; prints a table,
writes ``benchmarks/results/optimizer.json``.

    .venv/bin/python benchmarks/optimizer.py
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from splitfed.cost.model import Scenario
from splitfed.errors import SplitfedError
from splitfed.models.zoo import resolve_spec
from splitfed.optimizer.solve import Solution, all_on_server, best_static, greedy, solve
from splitfed.profile.fleet import Fleet, load_fleet
from splitfed.profile.profiler import profile_model

OUT = Path(__file__).parent / "results" / "optimizer.json"


def policies(sc: Scenario) -> dict[str, dict]:
    out: dict[str, dict] = {}
    runs = {"optimizer": lambda: solve(sc), "best_static": lambda: best_static(sc), "greedy": lambda: greedy(sc),
            "all_on_server": lambda: all_on_server(sc)}
    for name, fn in runs.items():
        try:
            s: Solution = fn()
        except SplitfedError as e:
            out[name] = {"makespan_s": None, "note": str(e)}
            continue
        out[name] = {"makespan_s": s.makespan_s, "feasible": s.cost.feasible, "bottleneck": s.cost.bottleneck,
                     "method": s.method, "solve_s": s.solve_s, "note": s.note,
                     "cuts_by_class": _by_class(sc, s)}
    opt = out["optimizer"]["makespan_s"]
    for name in ("best_static", "greedy", "all_on_server"):
        m = out[name]["makespan_s"]
        out[name]["ratio_vs_optimizer"] = None if m is None else m / opt
    return out


def _by_class(sc: Scenario, s: Solution) -> dict[str, dict[str, int]]:
    kinds: dict[str, dict[str, int]] = {}
    for c in sc.clients:
        cuts = ",".join(map(str, s.assignment[c.name]))
        kinds.setdefault(c.kind, {}).setdefault(cuts, 0)
        kinds[c.kind][cuts] += 1
    return kinds


def _cell(r: dict) -> str:
    if r["makespan_s"] is None:
        return f"{'n/a':>18}"
    return f"{r['makespan_s']:9.2f} ({r['ratio_vs_optimizer']:5.2f}x){' ' if r['feasible'] else '!'}"


def distinct(fleet: Fleet) -> Fleet:
    """Every client different (FLOP/s nudged by i * 1e-9), so no two share a class; the problem is the same."""
    return replace(fleet, clients=tuple(replace(c, device=replace(c.device, flops=c.device.flops * (1 + i * 1e-9)))
                                        for i, c in enumerate(fleet.clients)))


def main() -> int:
    torch.set_num_threads(1)
    fleet = load_fleet("reference")
    result: dict = {"fleet": fleet.name, "clients": len(fleet.clients), "tiers": 3, "batch": 32,
                    "host": platform.node(), "python": sys.version.split()[0], "models": {}, "scaling": {}}
    rows = []
    fleets = {"reference": fleet, "reference x1000": fleet.sample(1_000, seed=0)}
    for model in ("vgg11", "resnet18"):
        prof = profile_model(resolve_spec(model), 32, reps=1)
        result["models"][model] = {}
        for fname, f in fleets.items():
            for setting, mdb in (("any_cut", 0), ("data_stays", 1)):
                sc = Scenario.from_fleet(prof, f, tiers=3, batch=32, min_device_blocks=mdb)
                res = policies(sc)
                result["models"][model][f"{fname}/{setting}"] = res
                rows.append((model, fname, setting, res))
    print("makespan s per round, 3 tiers, batch 32; (ratio = policy / optimizer); ! = breaks a memory limit")
    print(f"{'model':<9} {'fleet':<16} {'setting':<11} {'optimizer':>9} {'best static':>18} {'greedy':>18} "
          f"{'all-on-server':>18}  optimizer bottleneck")
    for model, fname, setting, res in rows:
        cells = [_cell(res[k]) for k in ("best_static", "greedy", "all_on_server")]
        print(f"{model:<9} {fname:<16} {setting:<11} {res['optimizer']['makespan_s']:9.2f} {cells[0]:>18} "
              f"{cells[1]:>18} {cells[2]:>18}  {res['optimizer']['bottleneck']}")

    print("\nsolve time (optimizer, vgg11 and resnet18, 3 tiers)")
    print(f"{'model':<9} {'clients':>8} {'kind':<9} {'solve s':>8} {'makespan s':>11}  note")
    for model in ("vgg11", "resnet18"):
        prof = profile_model(resolve_spec(model), 32, reps=1)
        result["scaling"][model] = []
        cases = [(n, "classes", fleet.sample(n, seed=0)) for n in (100, 1_000, 10_000)]
        cases += [(n, "distinct", distinct(fleet.sample(n, seed=0))) for n in (100, 1_000)]
        for n, kind, f in cases:
            sc = Scenario.from_fleet(prof, f, tiers=3, batch=32)
            t0 = time.perf_counter()
            s = solve(sc, time_limit=120)
            dt = time.perf_counter() - t0
            result["scaling"][model].append({"clients": n, "kind": kind, "solve_s": dt, "makespan_s": s.makespan_s,
                                             "optimal": s.optimal, "gap": s.gap, "note": s.note})
            print(f"{model:<9} {n:>8} {kind:<9} {dt:8.2f} {s.makespan_s:11.2f}  {s.note}"
                  + ("" if s.optimal else " (time limit: best found)"))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
