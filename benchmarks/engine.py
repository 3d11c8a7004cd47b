"""Split vs monolithic training steps/s, measured side by side in one run.

vgg11 (CIFAR size), batch 64, one thread, 3 tiers in-process (device | edge | cloud).
Rounds of steps alternate between the two (ABBA) so that machine noise hits both;
each side's step time is the median over the rounds of its mean step time in a round.
Both sides start from the same weights and take the same steps on the same batch with
the same dropout masks (the monolithic model draws each step's from the step's key, as
the split chain's tiers do), so they end with the same weights to float rounding: the
JSON records the largest difference and what was compared, the check that neither side
does less work. Writes benchmarks/results/engine.json, with each round's step times
(what it prints) and the run's context. Target: ratio >= 0.97.

With ``--tier-torch-device cuda`` a third side runs the same split step with the
edge and cloud tiers on the GPU (the device's blocks stay on the CPU), and the
JSON adds ``tiers_on_gpu_steps_per_s`` and ``gpu_tiers_vs_cpu_tiers``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from splitfed.cli import Parser, script
from splitfed.commands._args import batch_size, cut_list, json_out, positive_int, zoo_model
from splitfed.errors import ConfigError
from splitfed.jsonio import write_json

# torch and the engine are imported once the flags are read (main's check of --tier-torch-device, measure): a
# bad flag (--model, --cuts' syntax too) is refused at once
if TYPE_CHECKING:
    import torch

    from splitfed.engine.types import State

PROG = "benchmarks/engine.py"
OUT = Path(__file__).parent / "results" / "engine.json"
DEFAULT_MODEL = "vgg11"
# vgg11's cuts are the recorded runs' (results/engine.json); a fixed pair fit no other model (4,10 past cnn's 7
# blocks), so another model's blocks are split in thirds
DEFAULT_CUTS: dict[str, tuple[int, int]] = {"vgg11": (4, 10)}


def default_cuts(model: str, n_blocks: int) -> tuple[int, int]:
    """``--cuts`` when none are given: the model's own, or its blocks in thirds (cnn's 7: 2,5)."""
    return DEFAULT_CUTS.get(model, (round(n_blocks / 3), round(2 * n_blocks / 3)))


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=zoo_model, default=DEFAULT_MODEL, help="a zoo model (default %(default)s)")
    ap.add_argument("--batch", type=batch_size, default=64, help="samples per step (default %(default)s)")
    ap.add_argument("--cuts", type=cut_list, help="device | edge | cloud cut points (default 4,10 on vgg11, "
                                                  "another model's blocks in thirds: 2,5 on cnn)")
    ap.add_argument("--reps", type=positive_int, default=5, help="alternating rounds (default %(default)s)")
    ap.add_argument("--steps", type=positive_int, default=3, help="steps per round and side (default %(default)s)")
    ap.add_argument("--tier-torch-device", default="cpu", help="also time the split step with the server tiers "
                                                                "on this device (e.g. cuda; default cpu: no "
                                                                "third side)")
    ap.add_argument("--out", type=json_out("engine.json"), default=str(OUT),
                    help="the JSON written (default benchmarks/results/engine.json)")
    args = ap.parse_args(argv)
    from splitfed.engine import compute

    try:
        tier_dev = compute.torch_device(args.tier_torch_device, "--tier-torch-device")
    except ConfigError as e:
        ap.error(str(e))
    return script(PROG, lambda: measure(args, tier_dev))


def measure(args: argparse.Namespace, tier_dev: torch.device) -> int:
    import itertools

    import torch
    import torch.nn.functional as F

    from splitfed.engine import compute, template
    from splitfed.engine.device import Device
    from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, tier_loads
    from splitfed.engine.types import OptimConfig
    from splitfed.engine.verify import max_abs_diff
    from splitfed.models.check import stochastic_flags
    from splitfed.models.segment import step_rng, validate_cuts
    from splitfed.models.zoo import resolve_spec

    torch.set_num_threads(1)
    spec = resolve_spec(args.model)
    if args.cuts is None:  # the JSON's args record the cuts taken
        args.cuts = default_cuts(spec.name, template.num_blocks(spec))
    cuts = args.cuts
    validate_cuts(cuts, template.num_blocks(spec), model=spec.name)  # cuts the model cannot take: one line
    state = initial_state(spec, 0)
    optim = OptimConfig(lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, *spec.input_shape, generator=g)
    y = torch.randint(0, spec.num_classes, (args.batch,), generator=g)

    n = template.num_blocks(spec)
    whole = template.whole_model(spec, state)  # its blocks, as verify's reference trains them
    whole.train()
    opt = optim.build(list(whole.parameters()))
    assert opt is not None
    seq = itertools.count()

    def mono_step() -> None:
        # the split step's dropout key (its Device: seed 0, client c0, round 0, its nth step): the same masks,
        # or a model with dropout (cnn, mlp) ends 1e-2 apart from its split twin for no fault of either
        F.cross_entropy(whole(x, rng=step_rng(0, "c0", 0, next(seq))), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    cfg = RoundConfig("bench", 0, spec, optim=optim)

    finals: dict[str, Callable[[], State]] = {"monolithic": whole.state_dict}

    def split_step_on(name: str, where: torch.device) -> Callable[[], None]:
        """One client's split step; its server tiers compute on ``where`` (the loss's float waits for them)."""
        chain = inprocess_chain(len(cuts), torch_device=where)
        for tier, load in zip(chain.tiers, tier_loads(cfg, "c0", cuts, state), strict=True):
            tier.load(load)
        dev = Device(spec, chain.link, run_id="bench", client_id="c0", round=0, cuts=cuts, state=state,
                     optim=optim)

        def final() -> State:  # the device's blocks and every tier's, on the CPU (as verify compares them)
            out = dict(dev.state())
            for t in chain.tiers:
                out.update(t.fetch("bench", "c0"))
            return {k: v.detach().cpu() for k, v in out.items()}

        finals[name] = final
        return lambda: None if dev.train_step(x, y) else None

    sides: dict[str, Callable[[], None]] = {"monolithic": mono_step,
                                            "split": split_step_on("split", torch.device("cpu"))}
    if tier_dev.type != "cpu":
        sides["tiers_on_gpu"] = split_step_on("tiers_on_gpu", tier_dev)

    def done() -> None:
        """A GPU side's timer stops once its queued work (the tiers' last optimizer step) has run."""
        if tier_dev.type == "cuda":
            torch.cuda.synchronize(tier_dev)

    for f in sides.values():  # warm-up (on a GPU: its kernels and memory pool too)
        f()
        f()
    done()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(args.reps):
        order = list(sides.items())
        if rep % 2:
            order.reverse()
        for name, f in order:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                f()
            done()
            times[name].append((time.perf_counter() - t0) / args.steps)
        print(f"round {rep + 1}/{args.reps}: " + ", ".join(f"{name} {1 / t[-1]:.2f} steps/s"
                                                            for name, t in times.items()), flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    mono, split = med["monolithic"], med["split"]
    final = {name: f() for name, f in finals.items()}
    compared = (f"every weight after {2 + args.reps * args.steps} steps a side from the same weights, on the same "
                "batch, with the same dropout masks")
    if "tiers_on_gpu" in sides and any(stochastic_flags(template.template(spec), x, run=False)[cuts[0]:]):
        # the same key seeds the GPU's generator, whose draws are not the CPU's: no fault of the GPU side
        compared += "; tiers_on_gpu's tiers draw their dropout masks on the GPU, other masks for the same key"
    result = {
        "benchmark": "engine", "model": spec.name, "batch": args.batch, "tiers": len(cuts) + 1, "cuts": list(cuts),
        "blocks": n, "threads": torch.get_num_threads(), "reps": args.reps, "steps": args.steps,
        "warmup_steps": 2, "seed": 0, "statistic": "median over reps rounds of the mean step time in a round",
        "monolithic_steps_per_s": 1 / mono, "split_steps_per_s": 1 / split, "ratio": mono / split, "target": 0.97,
        "round_step_s": times,  # what each "round i/n" line prints, as seconds per step
        "max_abs_weight_diff_vs_monolithic": {name: max_abs_diff(final["monolithic"], w)
                                              for name, w in final.items() if name != "monolithic"},
        "weights_compared": compared,
        "host": platform.node(), "python": platform.python_version(), "torch_version": torch.__version__,
        "args": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items()},
    }
    if "tiers_on_gpu" in med:
        result.update({"tier_torch_device": compute.describe(tier_dev),
                       "tiers_on_gpu_steps_per_s": 1 / med["tiers_on_gpu"],
                       "gpu_tiers_vs_cpu_tiers": split / med["tiers_on_gpu"]})
        print(f"split step with the tiers on {compute.describe(tier_dev)} vs on the CPU: "
              f"{result['gpu_tiers_vs_cpu_tiers']:.2f}x steps/s")
    print(f"split/monolithic steps/s ratio: {result['ratio']:.3f} (target >= 0.97)")
    print("max weight difference vs monolithic: " + ", ".join(
        f"{name} {d:.3g}" for name, d in result["max_abs_weight_diff_vs_monolithic"].items()) + f" ({compared})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # after the results are shown: a failed write keeps them
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
