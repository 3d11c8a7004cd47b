"""A fresh process's first training step: splitfed's optimizers vs torch.optim, side by side in one run.

Every tier process, every simulated client's process (a Ray actor, a deployment's ClientApp process) starts
cold and trains: what its first step costs is paid once per process, and on a Raspberry Pi many times over.
torch.optim imports ``torch._dynamo`` at an optimizer's first use (to mark its methods not to be compiled);
splitfed's own optimizers (:mod:`splitfed.engine.optim`, the same updates bit for bit) do not.

Each rep starts one ``python`` per side (alternating ABBA, so that drift hits both), which imports torch and
splitfed, builds ``--model``, trains one batch and reports the CPU seconds from start to the end of that
step, its wall seconds, its peak memory (RSS) and whether ``torch._dynamo`` was imported. Writes
benchmarks/results/startup.json and prints the medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from splitfed.cli import Parser, script
from splitfed.commands._args import json_out, positive_int, zoo_model
from splitfed.errors import SplitfedError
from splitfed.jsonio import write_json
from splitfed.versions import versions

PROG = "benchmarks/startup.py"
SIDES = ("splitfed", "torch.optim")
DEFAULT_MODEL = "cnn"


class ChildFailed(SplitfedError):
    """A measured process failed: the run had started (exit 1, not a usage error's 2)."""

    exit_code = 1

# one process's work; argv: side, model, batch
_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
import torch
import torch.nn.functional as F
from splitfed.engine import template
from splitfed.engine.rounds import initial_state
from splitfed.engine.types import OptimConfig
from splitfed.models.zoo import resolve_spec
side, model, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
spec = resolve_spec(model)
whole = template.whole_model(spec, initial_state(spec, 0))
params = list(whole.parameters())
cfg = OptimConfig(momentum=0.9)
opt = cfg.build(params) if side == "splitfed" else torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
x = torch.randn(batch, *spec.input_shape)
y = torch.randint(0, spec.num_classes, (batch,))
F.cross_entropy(whole(x), y).backward()
opt.step()
opt.zero_grad(set_to_none=True)
print(json.dumps({"cpu_s": time.process_time(), "wall_s": time.perf_counter() - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "dynamo": "torch._dynamo" in sys.modules}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=zoo_model, default=DEFAULT_MODEL, help="a zoo model (default %(default)s)")
    ap.add_argument("--batch", type=positive_int, default=32)
    ap.add_argument("--reps", type=positive_int, default=5, help="processes per side, alternating")
    ap.add_argument("--out", type=json_out("startup.json"),
                    default=str(Path(__file__).parent / "results" / "startup.json"))
    args = ap.parse_args(argv)
    return script(PROG, lambda: measure(args))


def _one(side: str, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, side, args.model, str(args.batch)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ChildFailed(f"the {side} process failed: {last}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t0  # with the interpreter's own start and exit
    return row


def measure(args: argparse.Namespace) -> int:
    rows: dict[str, list[dict]] = {s: [] for s in SIDES}
    for rep in range(args.reps):
        for side in (SIDES if rep % 2 == 0 else SIDES[::-1]):
            rows[side].append(row := _one(side, args))
            print(f"rep {rep + 1}/{args.reps} {side:<12} cpu {row['cpu_s']:5.2f} s  wall {row['wall_s']:5.2f} s  "
                  f"peak {row['peak_rss_mb']:6.1f} MB  dynamo {'yes' if row['dynamo'] else 'no'}", flush=True)
    keys = ("cpu_s", "wall_s", "process_s", "peak_rss_mb")
    med = {s: {k: statistics.median(r[k] for r in rows[s]) for k in keys} for s in SIDES}
    ours, theirs = med["splitfed"], med["torch.optim"]
    result = {
        "model": args.model, "batch": args.batch, "reps": args.reps, "median": med, "runs": rows,
        "cpu_ratio": theirs["cpu_s"] / ours["cpu_s"], "wall_ratio": theirs["wall_s"] / ours["wall_s"],
        "rss_saved_mb": theirs["peak_rss_mb"] - ours["peak_rss_mb"],
        "dynamo_imported": {s: any(r["dynamo"] for r in rows[s]) for s in SIDES},
        "host": platform.node(), "python": platform.python_version(), "versions": versions("torch"),
        "args": vars(args),
    }
    print(f"\n{args.model}, batch {args.batch}: a fresh process to the end of its first step (median of {args.reps})")
    print(f"{'':<13}{'cpu s':>8}{'wall s':>8}{'peak MB':>9}")
    for s in SIDES:
        print(f"{s:<13}{med[s]['cpu_s']:>8.2f}{med[s]['wall_s']:>8.2f}{med[s]['peak_rss_mb']:>9.1f}")
    print(f"torch.optim's process took {result['cpu_ratio']:.2f}x the CPU and {result['wall_ratio']:.2f}x the wall "
          f"time of splitfed's to its first step, and {result['rss_saved_mb']:.0f} MB more memory")
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
