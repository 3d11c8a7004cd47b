"""Split vs monolithic training steps/s, measured side by side in one run.

vgg11 (CIFAR size), batch 64, one thread, 3 tiers in-process (device | edge | cloud).
Rounds of steps alternate between the two so that machine noise hits both.
Writes benchmarks/results/engine.json. Target: ratio >= 0.97.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from splitfed.engine import template
from splitfed.engine.device import Device
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, tier_loads
from splitfed.engine.types import OptimConfig
from splitfed.jsonio import write_json
from splitfed.models.zoo import resolve_spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--cuts", default="4,10", help="device | edge | cloud cut points")
    ap.add_argument("--reps", type=int, default=5, help="alternating rounds")
    ap.add_argument("--steps", type=int, default=3, help="steps per round and side")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = resolve_spec(args.model)
    cuts = tuple(int(c) for c in args.cuts.split(","))
    state = initial_state(spec, 0)
    optim = OptimConfig(lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, *spec.input_shape, generator=g)
    y = torch.randint(0, spec.num_classes, (args.batch,), generator=g)

    n = template.num_blocks(spec)
    whole = template.template(spec).whole()
    import copy

    whole = copy.deepcopy(whole)
    whole.load_state_dict(state)
    whole.train()
    opt = optim.build(list(whole.parameters()))
    assert opt is not None

    def mono_step() -> None:
        F.cross_entropy(whole(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    chain = inprocess_chain(len(cuts))
    cfg = RoundConfig("bench", 0, spec, optim=optim)
    for tier, load in zip(chain.tiers, tier_loads(cfg, "c0", cuts, state), strict=True):
        tier.load(load)
    dev = Device(spec, chain.link, run_id="bench", client_id="c0", round=0, cuts=cuts, state=state, optim=optim)

    def split_step() -> None:
        dev.train_step(x, y)

    for f in (mono_step, split_step):  # warm-up
        f()
    times: dict[str, list[float]] = {"monolithic": [], "split": []}
    for rep in range(args.reps):
        order = [("monolithic", mono_step), ("split", split_step)]
        if rep % 2:
            order.reverse()
        for name, f in order:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                f()
            times[name].append((time.perf_counter() - t0) / args.steps)
        print(f"round {rep + 1}/{args.reps}: monolithic {1 / times['monolithic'][-1]:.2f} steps/s, "
              f"split {1 / times['split'][-1]:.2f} steps/s", flush=True)
    mono = statistics.median(times["monolithic"])
    split = statistics.median(times["split"])
    result = {
        "benchmark": "engine", "model": spec.name, "batch": args.batch, "tiers": len(cuts) + 1, "cuts": list(cuts),
        "blocks": n, "threads": torch.get_num_threads(),
        "monolithic_steps_per_s": 1 / mono, "split_steps_per_s": 1 / split, "ratio": mono / split, "target": 0.97,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    print(f"split/monolithic steps/s ratio: {result['ratio']:.3f} (target >= 0.97) -> {args.out}")


if __name__ == "__main__":
    main()
