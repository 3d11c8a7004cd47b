"""Flower simulation at scale: seconds per round and peak memory for 10, 50 and 100 virtual clients.

Each fleet size runs in its own child process (``splitfed simulate`` settings:
cnn on digits, IID partition, SplitFed v1, 3 tiers over gRPC on 127.0.0.1,
static cuts, 1 CPU per virtual client on this machine's cores). The child
samples the resident memory of its whole process tree (itself with the
ServerApp, Ray's processes and workers, the tier servers) every 0.5 s and
reports the peak of the summed RSS (counts shared pages, e.g. torch's
libraries, once per process: an upper bound) and of the summed PSS (shared
pages split between their users: what the tree really costs); seconds per round come from the run's ``metrics.jsonl``
(round 1, which starts Ray's workers, is reported apart: seconds per round is the mean of
rounds 2 on, none with ``--rounds 1``), and the run's seconds outside its rounds (start and stop) apart. No pass/fail.
Writes ``benchmarks/results/simulation.json``, with the run's flags and context.

``--accuracy`` instead runs the issue's accuracy check, ``splitfed simulate
--clients 10 --rounds 20 --dataset digits --partition dirichlet:0.5``, beside
centralised training of the same model (same optimizer, batch size and number
of passes over the same training data, one process), and writes
``benchmarks/results/accuracy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psutil

from splitfed.cli import Parser, script
from splitfed.commands._args import int_list, json_out, positive_int
from splitfed.jsonio import dumps, write_json

PROG = "benchmarks/simulation.py"


def _tree_memory(root: psutil.Process) -> tuple[int, int, dict[str, int]]:
    """(RSS sum, PSS sum, PSS by part) of ``root`` and all its descendants."""
    rss_sum, pss_sum = 0, 0
    parts: dict[str, int] = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            mem = p.memory_full_info()
            name = " ".join(p.cmdline()[:4])
        except psutil.Error:
            continue
        pss = getattr(mem, "pss", mem.rss)
        rss_sum += mem.rss
        pss_sum += pss
        kind = "tiers" if "splitfed.cli tier" in name else ("driver" if p.pid == root.pid else "ray")
        parts[kind] = parts.get(kind, 0) + pss
    return rss_sum, pss_sum, parts


def settings(clients: int, rounds: int, out: Path):  # type: ignore[no-untyped-def]
    """The run each fleet size is: built (and so checked) by the parent before any child starts."""
    from splitfed.flower.config import RunSettings

    return RunSettings(rounds=rounds, clients=clients, cuts="static:2,5", dataset="digits", partition="iid",
                       batch_size=16, out=str(out), node_wait_s=600, round_timeout_s=1800)


def one(clients: int, rounds: int, out: Path) -> dict:
    """One fleet size, in this process (the child)."""
    from splitfed.sim.runner import simulate

    me = psutil.Process()
    peak: dict[str, Any] = {"rss": 0, "pss": 0, "parts": {}}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, pss, parts = _tree_memory(me)
            peak["rss"] = max(peak["rss"], rss)
            if pss > peak["pss"]:
                peak.update(pss=pss, parts=parts)
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    simulate(settings(clients, rounds, out), progress=lambda line: print(line, file=sys.stderr, flush=True))
    total_s = time.perf_counter() - t0
    done.set()
    sampler.join()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    later = [r["wall_s"] for r in rows[1:]]
    return {
        "clients": clients,
        "rounds": rounds,
        "first_round_s": rows[0]["wall_s"],
        "seconds_per_round": statistics.mean(later) if later else None,  # round 1 starts Ray: not a round's time
        "round_s": [r["wall_s"] for r in rows],
        "total_s": total_s,
        # the run's seconds outside its rounds: Ray's and the tiers' start, the query round (the clients' processes
        # start), the shutdown; what a run of any length pays once
        "start_stop_s": total_s - sum(r["wall_s"] for r in rows),
        "peak_rss_sum_mb": peak["rss"] / 2**20,
        "peak_pss_mb": peak["pss"] / 2**20,
        "peak_pss_mb_by_part": {k: v / 2**20 for k, v in peak["parts"].items()},
        "final_accuracy": rows[-1]["accuracy"],
    }


def centralised(rounds: int, seed: int = 0) -> float:
    """Test accuracy of the unsplit model trained on all of digits for ``rounds`` epochs."""
    import torch
    import torch.nn.functional as F

    from splitfed.data import batches
    from splitfed.engine.rounds import initial_state
    from splitfed.engine.template import whole_model
    from splitfed.flower.config import RunSettings
    from splitfed.flower.workload import evaluate, test_data, train_data
    from splitfed.models.segment import step_rng

    torch.set_num_threads(1)
    s = RunSettings(seed=seed)
    spec = s.spec
    model = whole_model(spec, initial_state(spec, seed)).train()
    opt = s.optim.build(list(model.parameters()))
    assert opt is not None  # the whole model has parameters
    x, y = train_data(spec, s.dataset, seed)
    step = 0
    for epoch in range(rounds):
        for xb, yb in batches(x, y, s.batch_size, seed=seed, epoch=epoch):
            F.cross_entropy(model(xb, rng=step_rng(seed, "central", epoch, step)), yb).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return evaluate(spec, state, *test_data(spec, s.dataset, seed))[0]


def accuracy(out: Path) -> None:
    """The 10-client, 20-round Dirichlet(0.5) run beside centralised training."""
    from splitfed.cli import main as cli

    with tempfile.TemporaryDirectory(prefix="splitfed-acc-") as tmp:
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        rc = cli(["simulate", "--clients", "10", "--rounds", "20", "--dataset", "digits",
                  "--partition", "dirichlet:0.5", "--out", str(run)])
        wall = time.perf_counter() - t0
        summary = json.loads((run / "summary.json").read_text()) if rc == 0 else {}
    report = {"benchmark": "accuracy", "command": "splitfed simulate --clients 10 --rounds 20 --dataset digits "
              "--partition dirichlet:0.5", "exit_code": rc, "wall_s": wall,
              "federated_split_accuracy": summary.get("final_accuracy"),
              "federated_split_best_accuracy": summary.get("best_accuracy"),
              "centralised_accuracy": centralised(20), "target": 0.93}
    write_json(out, report)
    print(dumps(report, indent=2))


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int_list, default=(10, 50, 100), help="fleet sizes, comma-separated")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--out", type=json_out("simulation.json"),
                    help="the JSON written (default benchmarks/results/simulation.json, with --accuracy "
                         "benchmarks/results/accuracy.json)")
    ap.add_argument("--accuracy", action="store_true",
                    help="instead, check accuracy: splitfed simulate (10 clients, 20 rounds, digits) against the "
                         "unsplit model trained centrally, target 0.93 (minutes)")
    ap.add_argument("--one", type=positive_int, help=argparse.SUPPRESS)  # child mode: one fleet size
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    return script(PROG, lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    folder = Path(__file__).parent / "results"
    if args.accuracy:  # the file named, as every other mode writes it
        accuracy(Path(args.out) if args.out else folder / "accuracy.json")
        return 0
    args.out = args.out or str(folder / "simulation.json")
    if args.one is not None:
        print(dumps(one(args.one, args.rounds, Path(args.run_dir))))
        return 0
    for n in args.clients:  # every size checked before the first child starts (minutes each)
        settings(n, args.rounds, Path("unused"))
    results: list[dict[str, Any]] = []
    failed = 0
    for n in args.clients:
        with tempfile.TemporaryDirectory(prefix="splitfed-bench-") as tmp:
            cmd = [sys.executable, __file__, "--one", str(n), "--rounds", str(args.rounds), "--run-dir",
                   str(Path(tmp) / "run")]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                results.append({"clients": n, "error": proc.stderr.strip().splitlines()[-1:]})
                failed += 1
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            per_round = "n/a" if res["seconds_per_round"] is None else f"{res['seconds_per_round']:.2f}"
            print(f"{n:4d} clients: {per_round} s/round (first {res['first_round_s']:.1f} s, start and stop "
                  f"{res['start_stop_s']:.1f} s), "
                  f"peak PSS {res['peak_pss_mb']:.0f} MB (RSS sum {res['peak_rss_sum_mb']:.0f} MB)", flush=True)
            results.append(res)
    report = {"benchmark": "simulation", "cpus": len(os.sched_getaffinity(0)), "model": "cnn", "dataset": "digits",
              "mode": "sflv1", "tiers": 3, "rounds": args.rounds, "host": platform.node(),
              "python": platform.python_version(), "versions": {m: version(m) for m in ("torch", "flwr", "ray")},
              "args": vars(args), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    print(f"wrote {args.out}")
    if failed:
        print(f"{PROG}: {failed} of {len(args.clients)} fleet sizes failed (their errors are above and in "
              f"{args.out})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
