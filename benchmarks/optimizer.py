"""Segment optimizer vs the policies it replaces, all priced by the one cost model (the simulated clock).

Cases, for vgg11 and resnet18 at batch 32, 3 tiers (T4 edge, A100 cloud), each in two
settings: raw data may leave the device (any cut) and raw data stays (>= 1 block on the
device, the premise of split learning):

- ``reference``: the shipped reference fleet (60 heterogeneous clients);
- ``reference x1000`` / ``reference x10000``: 1,000 and 10,000 clients dealt from its
  devices by ``Fleet.sample`` (the shared edge and cloud are contended; ``--sampled``
  sets these sizes: ``--sampled 1000`` leaves out the 10,000-client cases, most of the pricing);
- ``reference w/o <class>``: the reference fleet without its straggler class (the class
  whose fastest possible round, alone on the servers, is the slowest: found per model,
  not assumed), so that the other 54 clients' cuts are what sets the makespan.

For each case: the round makespan of the optimizer, the best single static cut,
per-device greedy and all-on-server, the ratios, the optimizer's bottleneck with a
one-line explanation, and whether the targets hold (>= 1.3x faster than the best
static cut; never slower than greedy where greedy keeps within memory). Then the
optimizer's solve time for 100, 1,000 and 10,000 clients dealt from the fleet's
devices, and for 100 and 1,000 clients that are all different (no classes to
group), its re-solve time from its own answer (what an adaptive round asks when the
beliefs did not change), and the adaptive round's decision when every device's beliefs
moved by up to 2 % (a deployment's measurements; "k": no plan beats the cuts by the
hysteresis, kept after one MILP), beside the same re-solve that does not ask that first
("unasked"). Then a contention sweep: fleets of 60 to 5,000 clients dealt from the reference
fleet's devices, sharing the same edge and cloud, and the optimizer's speed-up
over the best static cut at each size: where per-device cuts start to pay. One run;
a line on stderr as each case is priced (minutes in all), then the tables on stdout; writes
``benchmarks/results/optimizer.json``.

    .venv/bin/python benchmarks/optimizer.py [--mode sflv1|sflv2|sl] [--compress none|fp16|int8|topk:F]
                                             [--sampled 1000,10000] [--sweep 60,250,1000] [--no-scaling]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitfed.cli import Parser, script
from splitfed.commands._args import int_list, json_out
from splitfed.engine.limits import MAX_CLIENTS
from splitfed.engine.modes import MODES
from splitfed.errors import SplitfedError
from splitfed.jsonio import write_json

# numpy, torch and the cost model are imported once the flags are read (in the functions that use them): a bad
# flag is refused at once
if TYPE_CHECKING:
    from splitfed.cost.model import Scenario
    from splitfed.profile.fleet import Fleet

OUT = Path(__file__).parent / "results" / "optimizer.json"
TARGET = 1.3
SWEEP = (60, 125, 250, 500, 1000, 2000, 5000)  # --sweep's fleet sizes
SAMPLED = (1_000, 10_000)  # --sampled's: the cases "reference xN"


def policies(sc: Scenario) -> dict[str, Any]:
    """Every policy priced (:func:`splitfed.optimizer.compare.compare`), what sets the optimizer's makespan, and
    whether the targets are met."""
    from splitfed.optimizer.compare import compare

    out: dict[str, Any] = compare(sc)
    opt = out["optimizer"]
    why = opt.pop("why")
    opt["explanation"] = (why if why is not None else f"no assignment: {opt['note']}" if opt["makespan_s"] is None
                          else f"not proven optimal: {opt['note']}")
    bs, gr = out["best_static"], out["greedy"]
    out["targets"] = {
        "vs_best_static": None if bs["ratio_vs_optimizer"] is None else bool(bs["ratio_vs_optimizer"] >= TARGET),
        # greedy ignores that the servers are shared: where it breaks a memory limit it is no rival
        "not_slower_than_greedy": (None if gr["ratio_vs_optimizer"] is None or not gr["feasible"]
                                   else bool(gr["ratio_vs_optimizer"] >= 1 - 1e-9)),
    }
    return out


def best_alone(sc: Scenario, kind: str) -> tuple[float, tuple[int, ...]]:
    """The fastest round the slowest client of ``kind`` can have at any cut that fits it (servers to itself),
    and that cut: clients of one kind may hold different sample counts, and the slowest is the kind's
    straggler. Each distinct client is priced once (``client_key``)."""
    from splitfed.cost.model import client_key
    from splitfed.optimizer.explain import fastest_alone

    best: dict[tuple, tuple[float, tuple[int, ...]]] = {}
    for c in sc.clients:
        if c.kind == kind and client_key(c) not in best:
            best[client_key(c)] = fastest_alone(sc, c)
    return max(best.values(), key=lambda r: r[0])


def straggler_class(sc: Scenario) -> str:
    return max({c.kind for c in sc.clients}, key=lambda k: best_alone(sc, k)[0])


def _cell(r: dict) -> str:
    if r["makespan_s"] is None:
        return f"{'n/a':>18}"
    ratio = f"({r['ratio_vs_optimizer']:5.2f}x)" if r.get("ratio_vs_optimizer") is not None else f"{'':8}"
    return f"{r['makespan_s']:9.2f} {ratio}{' ' if r['feasible'] else '!'}"


def _yes(v: bool | None) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[v]


def distinct(fleet: Fleet) -> Fleet:
    """Every client different (FLOP/s nudged by i * 1e-9), so no two share a class; the problem is the same."""
    return replace(fleet, clients=tuple(replace(c, device=replace(c.device, flops=c.device.flops * (1 + i * 1e-9)))
                                        for i, c in enumerate(fleet.clients)))


def without(fleet: Fleet, kind: str) -> Fleet:
    return replace(fleet, clients=tuple(c for c in fleet.clients if c.kind != kind),
                   kinds={k: v for k, v in fleet.kinds.items() if k != kind})


def sweep(prof, fleet: Fleet, sizes: list[int], kw: dict) -> list[dict]:  # type: ignore[no-untyped-def]
    """Optimizer vs best static cut (any cut) for fleets of ``sizes`` clients dealt from ``fleet``'s devices."""
    from splitfed.cost.model import Scenario
    from splitfed.optimizer import best_static, solve
    from splitfed.optimizer.explain import bound

    out = []
    for n in sizes:
        sc = Scenario.from_fleet(prof, fleet.sample(n, seed=0), **kw)
        opt, static = solve(sc), best_static(sc)
        out.append({"clients": n, "optimizer_s": opt.makespan_s, "best_static_s": static.makespan_s,
                    "best_static_cuts": list(static.assignment[sc.clients[0].name]),
                    "ratio": static.makespan_s / opt.makespan_s, "bound": bound(sc, opt.cost)})
    return out


NOISE = 0.02  # how far a deployment's measurements move each device's beliefs in a round (the decide column)


def moved(sc: Scenario, noise: float = NOISE, seed: int = 0) -> Scenario:
    """``sc`` with each distinct device's FLOP/s and uplink scaled by a factor drawn in [1 - noise, 1 + noise]
    (seeded): beliefs after a round of measurements. Identical devices move alike, so classes stay classes."""
    import random

    from splitfed.cost.model import client_key

    rng = random.Random(seed)
    factors: dict[tuple, tuple[float, float]] = {}
    clients = []
    for c in sc.clients:
        f, g = factors.setdefault(client_key(c), (1 + rng.uniform(-noise, noise), 1 + rng.uniform(-noise, noise)))
        clients.append(replace(c, device=replace(c.device, flops=c.device.flops * f),
                               link=replace(c.link, up=c.link.up * g)))
    return replace(sc, clients=tuple(clients))


def solve_times(sc: Scenario, time_limit: float = 120) -> dict[str, Any]:
    """One solve from nothing; the re-solve an adaptive round asks when beliefs did not change (from the answer's
    own cuts, as a simulated run's measurements leave them); and the adapter's re-solve after beliefs moved by up
    to ``NOISE`` (:func:`moved`), which first asks for a plan the hysteresis would let through (``below``), each
    timed."""
    from splitfed.cost.model import evaluate
    from splitfed.optimizer import solve
    from splitfed.optimizer.defaults import HYSTERESIS

    t0 = time.perf_counter()
    s = solve(sc, time_limit=time_limit)
    t1 = time.perf_counter()
    again = solve(sc, time_limit=time_limit, prefer=s.assignment)
    t2 = time.perf_counter()
    noisy = moved(sc)
    below = (1 - HYSTERESIS) * evaluate(noisy, s.assignment).makespan_s
    t3 = time.perf_counter()
    decide = solve(noisy, time_limit=time_limit, prefer=s.assignment, below=below)
    t4 = time.perf_counter()
    solve(noisy, time_limit=time_limit, prefer=s.assignment)  # the same decision without asking first
    t5 = time.perf_counter()
    return {"solve_s": t1 - t0, "makespan_s": s.makespan_s, "optimal": s.optimal, "gap": s.gap, "note": s.note,
            "resolve_s": t2 - t1, "resolve_makespan_s": again.makespan_s, "resolve_note": again.note,
            "decide_s": t4 - t3, "decide_kept": decide.kept, "decide_note": decide.note, "decide_unasked_s": t5 - t4}


def fleet_sizes(text: str) -> tuple[int, ...]:
    """``--sweep`` and ``--sampled``: fleet sizes in 1..MAX_CLIENTS, or none (empty)."""
    if not text.strip():
        return ()
    sizes = int_list(text)
    if not all(1 <= n <= MAX_CLIENTS for n in sizes):
        raise argparse.ArgumentTypeError(f"fleet sizes must lie in 1..{MAX_CLIENTS:,}, got {text!r}")
    return sizes


def codec(text: str) -> str:
    """``--compress``: checked by the transport's own parser (which imports torch: a codec given is read slowly)."""
    from splitfed.cost.wire import parse_codec

    try:
        parse_codec(text)
    except SplitfedError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


PROG = "benchmarks/optimizer.py"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="sflv1", choices=MODES, help="the split mode priced (default %(default)s)")
    # no default here: argparse would check it with codec (which imports torch) before refusing a flag it does
    # not know. The flag's name is the one splitfed optimize, simulate, ping and tier give the codec; --codec, the
    # benchmark's own before, still reads (hidden). Both fill args.codec: the JSON keeps its key names
    ap.add_argument("--compress", dest="codec", metavar="CODEC", type=codec,
                    help="compression of boundary tensors: none|fp16|int8|topk:F (default none)")
    ap.add_argument("--codec", dest="codec", type=codec, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ap.add_argument("--no-scaling", action="store_true", help="skip the solve-time table")
    ap.add_argument("--sweep", type=fleet_sizes, default=SWEEP,
                    help="fleet sizes of the contention sweep (comma-separated; empty: none; default "
                         f"{','.join(map(str, SWEEP))})")
    ap.add_argument("--sampled", type=fleet_sizes, default=SAMPLED,
                    help="sizes of the fleets dealt from the reference fleet's devices priced as cases "
                         "'reference xN' (comma-separated; empty: none; default "
                         f"{','.join(map(str, SAMPLED))})")
    ap.add_argument("--out", type=json_out("optimizer.json"), default=str(OUT),
                    help="the JSON written (default benchmarks/results/optimizer.json)")
    args = ap.parse_args(argv)
    if args.codec is None:
        args.codec = "none"
    return script(PROG, lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    import numpy as np
    import scipy
    import torch

    from splitfed.cost.model import Scenario
    from splitfed.models.zoo import resolve_spec
    from splitfed.profile.fleet import load_fleet
    from splitfed.profile.profiler import profile_model

    torch.set_num_threads(1)
    fleet = load_fleet("reference")
    kw = {"tiers": 3, "batch": 32, "mode": args.mode, "codec": args.codec}
    result: dict = {"fleet": fleet.name, "clients": len(fleet.clients), "tiers": 3, "batch": 32,
                    "mode": args.mode, "codec": args.codec, "target_vs_best_static": TARGET,
                    "host": platform.node(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "scipy": scipy.__version__, "torch_version": torch.__version__,  # HiGHS (scipy) sets solve times
                    "threads": torch.get_num_threads(), "args": vars(args), "models": {}, "scaling": {}}
    rows: list[tuple[str, str, str, dict[str, Any]]] = []
    models, settings = ("vgg11", "resnet18"), (("any_cut", 0), ("data_stays", 1))
    for model in models:
        t0 = time.perf_counter()
        prof = profile_model(resolve_spec(model), 32, reps=1)
        result["models"][model] = {}
        slow = straggler_class(Scenario.from_fleet(prof, fleet, **kw))
        fleets = {"reference": fleet, **{f"reference x{n}": fleet.sample(n, seed=0) for n in args.sampled},
                  f"reference w/o {slow}": without(fleet, slow)}
        total = len(models) * len(fleets) * len(settings)  # each model prices the same fleets
        for fname, f in fleets.items():
            for setting, mdb in settings:
                sc = Scenario.from_fleet(prof, f, min_device_blocks=mdb, **kw)
                res = policies(sc)
                # the tables need every case (minutes): a line on stderr as each is done, stdout's tables as before
                opt = res["optimizer"]["makespan_s"]
                print(f"case {len(rows) + 1}/{total}: {model} {fname}/{setting}: optimizer "
                      f"{'n/a' if opt is None else f'{opt:.2f} s'} (took {time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                res["clients"] = len(f.clients)
                if fname.startswith("reference w/o"):
                    res["note"] = f"the reference fleet without its straggler class {slow!r} ({len(f.clients)} clients)"
                result["models"][model][f"{fname}/{setting}"] = res
                rows.append((model, fname, setting, res))
    print(f"makespan s per round, {args.mode}, codec {args.codec}, 3 tiers, batch 32; "
          "(ratio = policy / optimizer); ! = breaks a memory limit")
    print(f"{'model':<9} {'fleet':<24} {'setting':<11} {'optimizer':>9} {'best static':>18} {'greedy':>18} "
          f"{'all-on-server':>18}  >=1.3x static  >=greedy")
    for model, fname, setting, res in rows:
        cells = [_cell(res[k]) for k in ("best_static", "greedy", "all_on_server")]
        t = res["targets"]
        opt = res["optimizer"]["makespan_s"]
        print(f"{model:<9} {fname:<24} {setting:<11} {'n/a' if opt is None else f'{opt:.2f}':>9} {cells[0]:>18} "
              f"{cells[1]:>18} {cells[2]:>18}  {_yes(t['vs_best_static']):>13}  {_yes(t['not_slower_than_greedy']):>8}")
    print("\nwhat sets the optimizer's makespan")
    for model, fname, setting, res in rows:
        print(f"{model:<9} {fname:<24} {setting:<11} {res['optimizer']['explanation']}")
    met = [(m, f, s) for m, f, s, r in rows if r["targets"]["vs_best_static"] and
           r["targets"]["not_slower_than_greedy"] is not False]
    result["cases_meeting_targets"] = [f"{m} {f}/{s}" for m, f, s in met]
    print(f"\ntargets (>= {TARGET}x vs best static and never slower than a memory-feasible greedy) met in "
          f"{len(met)} of {len(rows)} cases: " + ("; ".join(result["cases_meeting_targets"]) or "none"))

    sizes = list(args.sweep)
    if sizes:
        print(f"\ncontention sweep: optimizer speed-up over the best static cut (any cut), fleets dealt from the "
              f"reference devices sharing one edge and cloud ({args.mode}); bound: what sets the makespan")
        print(f"{'model':<9} " + " ".join(f"{n:>15}" for n in sizes))
        result["contention_sweep"] = {}
        for model in ("vgg11", "resnet18"):
            prof = profile_model(resolve_spec(model), 32, reps=1)
            pts = sweep(prof, fleet, sizes, kw)
            result["contention_sweep"][model] = pts
            first = next((p["clients"] for p in pts if p["ratio"] >= TARGET), None)
            print(f"{model:<9} " + " ".join(f"{p['ratio']:5.2f}x {p['bound']:>9}" for p in pts)
                  + f"   >= {TARGET}x from {first if first else 'none of these'}")

    if not args.no_scaling:
        print(f"\nsolve time (optimizer, vgg11 and resnet18, 3 tiers, {args.mode})")
        print(f"{'model':<9} {'clients':>8} {'kind':<9} {'solve s':>8} {'re-solve s':>10} {'decide s':>8} "
              f"{'unasked':>8} {'makespan s':>11}  note")
        for model in ("vgg11", "resnet18"):
            prof = profile_model(resolve_spec(model), 32, reps=1)
            result["scaling"][model] = []
            cases = [(n, "classes", fleet.sample(n, seed=0)) for n in (100, 1_000, 10_000)]
            cases += [(n, "distinct", distinct(fleet.sample(n, seed=0))) for n in (100, 1_000)]
            for n, kind, f in cases:
                row = {"clients": n, "kind": kind, **solve_times(Scenario.from_fleet(prof, f, **kw))}
                result["scaling"][model].append(row)
                print(f"{model:<9} {n:>8} {kind:<9} {row['solve_s']:8.2f} {row['resolve_s']:10.2f} "
                      f"{row['decide_s']:7.2f}{'k' if row['decide_kept'] else ' '} {row['decide_unasked_s']:8.2f} "
                      f"{row['makespan_s']:11.2f}  {row['note']}" + ("" if row["optimal"] else " (time limit: best found)"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result, indent=1)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
