"""``splitfed optimize``: choose every client's cuts for a fleet, or price a policy, in the cost model."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from splitfed.commands._args import (
    add_model_args,
    batch_size,
    int_list,
    model_spec,
    positive_int,
    zoo_name_checked,
)
from splitfed.errors import ConfigError, CutError
from splitfed.fleets import shipped_fleets
from splitfed.jsonio import dumps
from splitfed.optimizer.defaults import DEFAULT_GAP, EXHAUSTIVE_LIMIT
from splitfed.units import mib_text

if TYPE_CHECKING:
    from splitfed.cost.model import ClientCost, Scenario
    from splitfed.optimizer.solution import Solution

JSON_KEYS = ("model", "blocks", "fleet", "tiers", "cloud_unused", "batch", "u_shape", "method", "optimal", "gap",
             "solve_s", "note", "makespan_s", "mode", "bottleneck", "feasible", "violations", "shared_s",
             "shared_memory_bytes", "why", "clients")
"""``--json``'s keys, named in ``--help``: a script's contract (``Solution.to_dict`` and the run's own)."""
CLIENT_KEYS = ("name", "cuts", "time_s", "device_memory_bytes")
COMPARE_KEYS = ("model", "blocks", "fleet", "tiers", "cloud_unused", "batch", "u_shape", "mode", "policies", "why")
"""``--compare --json``'s keys; ``policies`` maps each policy (:data:`splitfed.optimizer.compare.POLICIES`) to its
entry (:func:`splitfed.optimizer.compare.compare`)."""
PER_CLIENT_MAX = 20
"""The table lists each client up to this many clients; above it, one row per device class and cuts
(``--per-client`` lists each client whatever the size; ``--json`` always does)."""
TICK_S = 5.0
"""A policy still being priced this long says so on stderr, and again every ``TICK_S``: a large fleet's solve
runs up to its ``--time-limit`` (60 s), silent before."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="choose each client's cuts for a fleet (or price a policy)",
                       description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--fleet", required=True, type=fleet_name,
                   help=f"fleet TOML file, or a shipped fleet: {', '.join(shipped_fleets())}")
    p.add_argument("--tiers", type=int, choices=(2, 3), default=3)
    p.add_argument("--batch", type=batch_size, default=32)
    p.add_argument("--epochs", type=positive_int, default=1, help="local epochs per round")
    p.add_argument("--optimizer-slots", type=int, default=1, choices=(0, 1, 2),
                   help="optimizer tensors per parameter the tiers hold (SGD 0, momentum 1, Adam 2; default 1)")
    p.add_argument("--mode", choices=("sl", "sflv1", "sflv2"), default="sflv1",
                   help="variant to price: sflv1 (parallel, replica per client), sflv2 (shared server model, "
                        "clients in turn on it), sl (clients in turn)")
    p.add_argument("--compress", metavar="CODEC", default="none",
                   help="compression of boundary tensors: none|fp16|int8|topk:F (F >= 0.001) on every link, or one "
                        "per link, the device's first (none,int8)")
    # the name simulate, ping and tier give the same codec list; --codec, optimize's own before, still reads
    p.add_argument("--codec", dest="compress", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--u-shape", action="store_true", help="the device also holds the last blocks and the loss")
    p.add_argument("--min-device-blocks", type=int, default=0,
                   help="leading blocks every device must keep, run on its raw inputs before anything leaves it (1: raw "
                        "data never leaves the device)")
    p.add_argument("--round", type=positive_int, default=1, help="price the fleet as it is in this round (drift)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--exhaustive", action="store_true",
                   help=f"brute force (small fleets: at most {EXHAUSTIVE_LIMIT:,} assignments)")
    g.add_argument("--static", type=int_list, metavar="K1,K2", help="the same cuts for every client")
    g.add_argument("--best-static", action="store_true", help="the best single cut vector for all")
    g.add_argument("--greedy", action="store_true", help="each device minimises its own time, ignoring sharing")
    g.add_argument("--all-on-server", action="store_true", help="devices only send their data")
    g.add_argument("--compare", action="store_true",
                   help="the optimizer, the best static cut, greedy and all-on-server side by side: each one's "
                        "makespan and its ratio to the optimizer's (--json: an object with policies, one entry each)")
    p.add_argument("--gap", type=float, default=DEFAULT_GAP, help="relative optimality gap the MILP must prove")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds for the whole exact solve (> 0): pricing each device's cuts, every MILP (one that "
                        "HiGHS runs past it is given up 0.5 s later) and the tie-breaks; when they run out, the best "
                        "assignment found so far is printed, marked not proven optimal, or, if none was found yet, an "
                        "error says so (with --best-static: ranking every cut vector, then the exact pricing of the "
                        "best-ranked ones, the first always); Ctrl-C stops a solve at once (exit 130)")
    p.add_argument("--per-client", action="store_true",
                   help=f"list each client in the table whatever the fleet's size (default: each client up to "
                        f"{PER_CLIENT_MAX} clients; above that, one row per device class and cuts)")
    p.add_argument("--json", action="store_true",
                   help=f"print one JSON object: {', '.join(JSON_KEYS)} (with --compare: {', '.join(COMPARE_KEYS)}); "
                        f"clients is a list, one per client: "
                        f"{', '.join(CLIENT_KEYS)}; on an error, nothing on stdout (a priced policy that does not "
                        "fit still prints, with feasible false, and exits 1)")
    p.set_defaults(func=run)


def fleet_name(text: str) -> str:
    """``--fleet``'s value: not empty (``""`` is the current folder to a path, refused as "a folder")."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a fleet file or a shipped fleet's name, got nothing")
    return text


@contextlib.contextmanager
def _flag(flag: str) -> Iterator[None]:
    """A policy flag's refusal (its cuts, or its size limit: a :class:`CutError` or :class:`ConfigError`) names
    the flag."""
    try:
        yield
    except (CutError, ConfigError) as e:
        raise type(e)(f"{flag}: {e}") from None


@contextlib.contextmanager
def _ticking(what: str, limit: float | None) -> Iterator[None]:
    """While the block runs, every ``TICK_S`` a line on stderr: ``what``, the seconds so far, and when it stops."""
    done = threading.Event()
    t0 = time.monotonic()
    until = f"; it gives up at {limit:g} s (--time-limit)" if limit is not None else ""

    def tick() -> None:
        while not done.wait(TICK_S):
            try:
                print(f"{what}: {time.monotonic() - t0:.0f} s so far{until}; Ctrl-C stops it", file=sys.stderr,
                      flush=True)
            except (OSError, ValueError):  # stderr gone (a closed pipe): the answer still goes to stdout
                return

    ticker = threading.Thread(target=tick, name="optimize-ticker", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def render(sc: Scenario, sol: Solution, header: str, per_client: bool | None = None) -> str:
    """The table under ``header``, the makespan and the solve. ``per_client``: a row per client (True), a row
    per (device class, cuts) (False), or per client up to ``PER_CLIENT_MAX`` clients (None)."""
    from splitfed.report.table import ljust, width

    cost = sol.cost
    if per_client is None:
        per_client = len(cost.clients) <= PER_CLIENT_MAX
    if per_client:
        w = max(6, *(width(c.name) for c in cost.clients))  # terminal columns: a wide name moves no column
        rows = [header, f"{'client':<{w}}  {'cuts':<10} {'time_s':>10} {'device memory':>15}"]
        for c in cost.clients:
            rows.append(f"{ljust(c.name, w)}  {','.join(map(str, c.cuts)):<10} {c.round_s:10.3f} "
                        f"{mib_text(c.memory[0]):>15}")
    else:
        rows = [header, *_grouped(sc, cost.clients)]
    shared = ", ".join(f"{k} {v:.3f} s" for k, v in cost.shared_s.items())
    rows.append(f"makespan {cost.makespan_s:.3f} s (bottleneck: {cost.bottleneck}); shared busy: {shared}")
    rows.append(f"{sol.method}: solved in {sol.solve_s:.3f} s" + (f"; {sol.note}" if sol.note else "")
                + ("; the time limit ran out: the best assignment found, not proven optimal"
                   if sol.method == "milp" and not sol.optimal else ""))
    for v in cost.violations:
        rows.append(f"INFEASIBLE: {v}")
    return "\n".join(rows)


def render_compare(got: dict[str, dict[str, Any]], header: str) -> str:
    """``--compare``'s table under ``header``: each policy's makespan and ratio to the optimizer's, a refusal's
    reason or a memory limit broken beside it, then what sets the optimizer's makespan."""
    names = {"optimizer": "optimizer", "best_static": "best static", "greedy": "greedy",
             "all_on_server": "all-on-server"}
    rows = [header, f"{'policy':<22} {'makespan_s':>10} {'vs optimizer':>12}"]
    for key, r in got.items():
        name = r.get("method", names[key]) if key != "optimizer" else "optimizer"
        if r["makespan_s"] is None:
            rows.append(f"{name:<22} {'n/a':>10} {'n/a':>12}  refused: {r['note']}")
            continue
        ratio = r.get("ratio_vs_optimizer")
        cell = "1.00x" if key == "optimizer" else f"{ratio:.2f}x" if ratio is not None else "n/a"
        tail = "" if r["feasible"] else f"  breaks memory: {'; '.join(r['violations'])}"
        if r["method"] == "milp" and not r["optimal"]:
            tail = "  not proven optimal: the time limit ran out"
        rows.append(f"{name:<22} {r['makespan_s']:>10.3f} {cell:>12}{tail}")
    if got["optimizer"].get("why"):
        rows.append(f"why: {got['optimizer']['why']}")
    return "\n".join(rows)


def _grouped(sc: Scenario, clients: Sequence[ClientCost]) -> list[str]:
    """One row per (device class, cuts), in the order of their first client: the class (the fleet's
    ``[[device]]`` entry), how many clients, their cuts, time and device memory (the largest in the group,
    should its clients differ), then a line saying what the rows are."""
    from splitfed.report.table import ljust, width

    kind = {c.name: c.kind for c in sc.clients}
    groups: dict[tuple[str, tuple[int, ...]], list[ClientCost]] = {}
    for c in clients:
        groups.setdefault((kind.get(c.name, c.name), tuple(c.cuts)), []).append(c)
    w = max(5, *(width(k) for k, _ in groups))
    n = max(7, len(str(max(len(g) for g in groups.values()))))
    rows = [f"{'class':<{w}}  {'clients':>{n}}  {'cuts':<10} {'time_s':>10} {'device memory':>15}"]
    differ = False
    for (k, cuts), g in groups.items():
        times, mems = {c.round_s for c in g}, {c.memory[0] for c in g}
        differ |= len(times) > 1 or len(mems) > 1
        rows.append(f"{ljust(k, w)}  {len(g):>{n}}  {','.join(map(str, cuts)):<10} {max(times):10.3f} "
                    f"{mib_text(max(mems)):>15}")
    rows.append(f"{len(clients)} clients in {len(groups)} row{'s' if len(groups) != 1 else ''}, one per device class and cuts"
                + ("; time_s and device memory: the largest of the row's clients" if differ else "")
                + " (--per-client lists each client; --json too)")
    return rows


def run(args: argparse.Namespace) -> int:
    zoo_name_checked(args.model)
    from splitfed import optimizer
    from splitfed.cost.model import Scenario
    from splitfed.cost.wire import link_codecs
    from splitfed.profile.fleet import load_fleet
    from splitfed.profile.profiler import default_cache_dir, profile_model

    if args.min_device_blocks < 0:
        raise ConfigError("--min-device-blocks must be >= 0")
    if not 0 <= args.gap < 1:
        raise ConfigError(f"--gap must be in [0, 1), got {args.gap}")
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):  # -1, 0 and nan ran as 0.1 s per MILP
        raise ConfigError(f"--time-limit must be a finite number of seconds > 0, got {args.time_limit}")
    link_codecs(args.compress, args.tiers - 1, what="--compress")  # in the flag's name, before any profiling
    spec = model_spec(args)
    fleet = load_fleet(args.fleet).at_round(args.round)
    prof = profile_model(spec, args.batch, optimizer_slots=args.optimizer_slots, reps=1, cache_dir=default_cache_dir())
    sc = Scenario.from_fleet(prof, fleet, tiers=args.tiers, batch=args.batch, u_shape=args.u_shape,
                             mode=args.mode, codec=args.compress,
                             epochs=args.epochs, min_device_blocks=args.min_device_blocks)
    n = len(sc.clients)
    clients = f"{n:,} client{'s' if n != 1 else ''} of {spec.name}"
    header = (f"{spec.name} ({prof.n_blocks} blocks) on fleet {fleet.name} ({n} client{'s' if n != 1 else ''}), "
              f"{args.tiers} tiers{' U-shape' if args.u_shape else ''}, batch {args.batch}"
              + (" (the fleet's [cloud] is not used)" if args.tiers == 2 and fleet.cloud is not None else ""))
    about = {"model": spec.name, "blocks": prof.n_blocks, "fleet": fleet.name, "tiers": args.tiers,
             "cloud_unused": args.tiers == 2 and fleet.cloud is not None, "batch": args.batch, "u_shape": args.u_shape}
    if args.compare:
        from splitfed.optimizer.compare import compare

        with _ticking(f"still comparing the policies for {clients} (the solve and --best-static each give up at "
                      f"{args.time_limit:g} s, --time-limit)", None):
            got = compare(sc, gap=args.gap, time_limit=args.time_limit, static_time_limit=args.time_limit)
        if args.json:
            print(dumps({**about, "mode": sc.mode, "policies": got, "why": got["optimizer"]["why"]}, indent=1))
        else:
            print(render_compare(got, header))
        return 0
    # the policy the flags ask for (the first given), else the optimizer; those whose refusals name their flag
    # (:func:`_flag`) are wrapped; only solve and --best-static keep to --time-limit
    flag, price, named = next(((f, fn, w) for f, on, fn, w in (
        ("--exhaustive", args.exhaustive, lambda: optimizer.exhaustive(sc), True),  # above its size limit
        ("--static", args.static is not None, lambda: optimizer.static(sc, args.static), True),  # cuts it cannot take
        ("--best-static", args.best_static, lambda: optimizer.best_static(sc, time_limit=args.time_limit), False),
        ("--greedy", args.greedy, lambda: optimizer.greedy(sc), False),
        ("--all-on-server", args.all_on_server, lambda: optimizer.all_on_server(sc), True),  # 0,0 a device cannot hold
    ) if on), (None, lambda: optimizer.solve(sc, gap=args.gap, time_limit=args.time_limit), False))
    with _ticking(f"still choosing the cuts of {clients}" if flag is None else f"still pricing {flag} for {clients}",
                  args.time_limit if flag in (None, "--best-static") else None), \
            (_flag(flag) if named and flag is not None else contextlib.nullcontext()):
        sol = price()
    from splitfed.optimizer.compare import why as why_of

    why = why_of(sc, sol)
    if args.json:
        print(dumps({**about, **sol.to_dict(), "why": why}, indent=1))
    else:
        print(render(sc, sol, header, per_client=True if args.per_client else None)
              + (f"\nwhy: {why}" if why else ""))
    if sol.cost.violations:  # a priced policy that overflows a tier is a result, but not a usable one
        print(f"splitfed optimize: error: {sol.method} does not fit: {'; '.join(sol.cost.violations)}", file=sys.stderr)
        return 1
    return 0
