"""``splitfed profile``: per-block FLOPs, bytes, memory and measured time of a model."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from splitfed.commands._args import (
    add_model_args,
    batch_size,
    model_spec,
    positive_int,
    zoo_name_checked,
)
from splitfed.jsonio import dumps

if TYPE_CHECKING:
    from splitfed.profile.profiler import ModelProfile

JSON_KEYS = ("model", "batch", "names", "input_bytes", "fwd_flops", "bwd_flops", "param_bytes", "out_bytes",
             "act_bytes", "fixed_bytes", "fwd_s", "bwd_s", "reps", "optimizer_slots", "host", "version")
"""The keys of ``--json`` named in ``--help`` (``ModelProfile.to_dict``; the rest are the cost model's)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="profile a model's blocks (FLOPs, bytes, memory, time)",
                       description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--batch", type=batch_size, default=32)
    p.add_argument("--reps", type=positive_int, default=3,
                   help="timed repetitions per block (median); a cached profile timed with fewer is measured again")
    p.add_argument("--optimizer-slots", type=int, default=1, choices=(0, 1, 2),
                   help="optimizer tensors per parameter (SGD 0, momentum 1, Adam 2)")
    p.add_argument("--torch-device", default="cpu", metavar="DEV",
                   help="time the blocks on cpu | cuda | cuda:N (a GPU tier's rate; default cpu)")
    p.add_argument("--no-cache", action="store_true", help="measure again; read and keep no cached profile")
    p.add_argument("--json", action="store_true",
                   help=f"print the profile as one JSON object: {', '.join(JSON_KEYS)} (per-block lists: FLOPs and "
                        "out/act bytes per sample, fwd_s/bwd_s seconds per batch), and further keys of the cost "
                        "model's own (the profile cache's format, versioned by version)")
    p.set_defaults(func=run)


def render(prof: ModelProfile, where: str = "this host") -> str:
    reps = f", times: median of {prof.reps} run(s)" if prof.reps and prof.fwd_s else ""
    rows = [f"{prof.model}: {prof.n_blocks} blocks, batch {prof.batch}, input {prof.input_bytes / 1e3:.1f} kB/sample"
            + reps,
            f"{'#':>3} {'block':<28} {'fwd MFLOP':>10} {'bwd MFLOP':>10} {'params kB':>10} {'out kB':>8} "
            f"{'act kB':>8} {'fixed kB':>10} {'fwd ms':>8} {'bwd ms':>8}"]
    times = prof.fwd_s and prof.bwd_s
    for i, name in enumerate(prof.names):
        fs = f"{prof.fwd_s[i] * 1e3:8.2f} {prof.bwd_s[i] * 1e3:8.2f}" if times else f"{'-':>8} {'-':>8}"
        rows.append(f"{i:>3} {name[:28]:<28} {prof.fwd_flops[i] / 1e6:10.2f} {prof.bwd_flops[i] / 1e6:10.2f} "
                    f"{prof.param_bytes[i] / 1e3:10.1f} {prof.out_bytes[i] / 1e3:8.1f} {prof.act_bytes[i] / 1e3:8.1f} "
                    f"{prof.fixed_bytes[i] / 1e3:10.1f} {fs}")
    rate = prof.host_flops()
    rows.append(f"per sample: {sum(prof.fwd_flops) / 1e6:.1f} MFLOP forward, {sum(prof.bwd_flops) / 1e6:.1f} backward; "
                f"{sum(prof.param_bytes) / 1e6:.2f} MB of parameters"
                + (f"; {where} trains at {rate / 1e9:.3g} GFLOP/s" if rate else ""))
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    zoo_name_checked(args.model)
    from splitfed.engine.compute import describe, torch_device
    from splitfed.profile.profiler import default_cache_dir, profile_model

    spec = model_spec(args)
    dev = torch_device(args.torch_device)
    prof = profile_model(spec, args.batch, optimizer_slots=args.optimizer_slots, reps=args.reps,
                         cache_dir=default_cache_dir(), torch_device=dev, use_cache=not args.no_cache)
    where = "this host" if dev.type == "cpu" else f"this host's {describe(dev)}"
    print(dumps(prof.to_dict(), indent=1) if args.json else render(prof, where))
    return 0
