"""The coordinator's weight exchange in one SplitFed v1 round, two ways side by side in one run.

Over real gRPC tiers in their own processes (edge -> cloud, loopback, one torch
thread each), for ``--clients`` clients whose cuts spread over the model:

- ``per_client``: what every round did before: each client's server segments
  loaded with the global weights (one copy per client and tier), and every
  trained replica fetched back and averaged by the coordinator;
- ``base_reduce``: what :class:`~splitfed.engine.rounds.SplitRound` does now:
  the global blocks staged once per tier (a base segment the clients' loads copy
  there), and each tier's sample-weighted mean taken back (``Reduce``: float32
  for the float32 weights, float64 for integer buffers; the coordinator knows
  the weight behind each key and makes it a sum again).

The clients do not train (the weights come back as loaded): only the exchange
is measured (after one untimed round of each). Each side is timed in two phases, the loads before training and the
collection after it (fetches and averaging, or means and averaging), and counts
the weight bytes each way. Rounds alternate ABBA so that drift hits both sides.
The two new global models are compared (float64 sums in another order, and the
tiers' means rounded to float32: equal to float32 rounding). Writes benchmarks/results/weights.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

from splitfed.cli import Parser, script
from splitfed.commands._args import json_out, positive_int, zoo_model
from splitfed.jsonio import write_json

PROG = "benchmarks/weights.py"
DEFAULT_MODEL = "vgg11"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=zoo_model, default=DEFAULT_MODEL, help="a zoo model (default %(default)s)")
    ap.add_argument("--clients", type=positive_int, default=20)
    ap.add_argument("--reps", type=positive_int, default=3, help="rounds per side, alternating")
    ap.add_argument("--out", type=json_out("weights.json"),
                    default=str(Path(__file__).parent / "results" / "weights.json"))
    args = ap.parse_args(argv)
    return script(PROG, lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    import torch

    from splitfed.aggregate import aggregate
    from splitfed.engine import template
    from splitfed.engine.rounds import (
        ClientResult,
        Outcome,
        RoundConfig,
        SplitRound,
        device_state,
        initial_state,
        state_bytes,
        tier_loads,
    )
    from splitfed.engine.verify import max_abs_diff
    from splitfed.models.zoo import resolve_spec
    from splitfed.transport.chain import close_chain, grpc_chain
    from splitfed.transport.process import TierProcess

    torch.set_num_threads(1)
    spec = resolve_spec(args.model)
    n = template.num_blocks(spec)
    # device cuts spread over the first half, the cloud's part the last third: every tier's part differs by client
    assignment = {f"client{i}": (1 + i % max(1, n // 2), max(1 + i % max(1, n // 2), n - 1 - i % max(1, n // 3)))
                  for i in range(args.clients)}
    state = initial_state(spec, 0)
    samples = {c: 32 + 8 * i for i, c in enumerate(assignment)}

    def outcomes(weights: dict) -> dict:
        return {c: Outcome(w, ClientResult(c, assignment[c], samples[c], 0.0, 0, 0.0, 0.0)) for c, w in weights.items()}

    def base_reduce(tiers: list, r: int) -> tuple[float, float, list[list[int]], dict]:
        rnd = SplitRound(RoundConfig("bench-weights", r, spec), tiers, state, assignment)
        t0 = time.perf_counter()
        weights = rnd.begin(rnd.groups()[0])
        t1 = time.perf_counter()
        rnd.end(outcomes(weights))
        t2 = time.perf_counter()
        new = rnd.finish()
        t3 = time.perf_counter()
        return t1 - t0, t3 - t2, rnd.weight_bytes, new

    def per_client(tiers: list, r: int) -> tuple[float, float, list[list[int]], dict]:
        cfg = RoundConfig("bench-weights", r, spec, binding_key="k" * 32)
        moved = [[0, 0] for _ in tiers]
        t0 = time.perf_counter()
        for c, cuts in assignment.items():
            for t, (tier, load) in enumerate(zip(tiers, tier_loads(cfg, c, cuts, state), strict=True)):
                tier.load(load)
                moved[t][0] += state_bytes(load.state or {})
        t1 = time.perf_counter()
        contributions = []
        for c, cuts in assignment.items():
            contributions.append((device_state(state, cuts, n, False), samples[c]))
            for t, tier in enumerate(tiers):
                part = tier.fetch(cfg.run_id, c, cfg.secret_of(c))
                moved[t][1] += state_bytes(part)
                contributions.append((part, samples[c]))
        new = aggregate(contributions, previous=state)
        t2 = time.perf_counter()
        for c in assignment:
            for tier in tiers:
                tier.release(cfg.run_id, c, cfg.secret_of(c))
        return t1 - t0, t2 - t1, moved, new

    sides = {"per_client": per_client, "base_reduce": base_reduce}
    times: dict[str, dict[str, list[float]]] = {k: {"load_s": [], "collect_s": []} for k in sides}
    moved: dict[str, list[list[int]]] = {}
    news: dict[str, dict] = {}
    with TierProcess.start("cloud", insecure=True, threads=1) as cloud, \
            TierProcess.start("edge", next_address=cloud.address, insecure=True, threads=1) as edge:
        chain = grpc_chain([edge.address, cloud.address])
        try:
            for side in sides.values():  # warm-up: the tiers build the model's template on their first load
                side(chain.tiers, 0)
            for rep in range(args.reps):
                order = list(sides.items())
                for name, side in (reversed(order) if rep % 2 else order):
                    load_s, collect_s, moved[name], news[name] = side(chain.tiers, rep + 1)
                    times[name]["load_s"].append(load_s)
                    times[name]["collect_s"].append(collect_s)
                    print(f"round {rep + 1}/{args.reps} {name:<11} load {load_s:6.2f} s  collect {collect_s:6.2f} s",
                          flush=True)
        finally:
            close_chain(chain)
    med = {k: {p: statistics.median(v) for p, v in ph.items()} for k, ph in times.items()}
    total = {k: m["load_s"] + m["collect_s"] for k, m in med.items()}
    result = {
        "benchmark": "weights", "model": spec.name, "clients": args.clients, "blocks": n, "server_tiers": 2,
        "assignment": {c: list(k) for c, k in assignment.items()}, "reps": args.reps,
        "statistic": "median over reps of each phase's wall time",
        "median_s": med, "exchange_s": total, "speedup": total["per_client"] / total["base_reduce"],
        "round_s": times,
        "weight_bytes": moved,  # per server tier: [sent, received] by the coordinator
        "bytes_ratio": (sum(map(sum, moved["per_client"])) / sum(map(sum, moved["base_reduce"]))),
        "max_abs_diff_of_new_models": max_abs_diff(news["per_client"], news["base_reduce"]),
        "host": platform.node(), "python": platform.python_version(), "torch_version": torch.__version__,
        "args": vars(args),
    }
    mb = {k: [[b / 1e6 for b in t] for t in v] for k, v in moved.items()}
    print(f"\n{spec.name}, {args.clients} clients, edge -> cloud over gRPC loopback (median of {args.reps})")
    print(f"{'':<12}{'load s':>9}{'collect s':>11}{'MB to/from edge':>20}{'MB to/from cloud':>20}")
    for k in sides:
        (e_to, e_back), (c_to, c_back) = mb[k]
        print(f"{k:<12}{med[k]['load_s']:>9.2f}{med[k]['collect_s']:>11.2f}{e_to:>11.1f}/{e_back:<8.1f}"
              f"{c_to:>11.1f}/{c_back:<8.1f}")
    print(f"exchange {result['speedup']:.2f}x faster, {result['bytes_ratio']:.1f}x fewer bytes; new models differ by "
          f"{result['max_abs_diff_of_new_models']:.2e} at most")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # after the results are shown: a failed write keeps them
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
