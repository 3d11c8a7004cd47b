"""``splitfed verify``: train split and whole from one seed; exit 0 only if the weights agree."""

from __future__ import annotations

import argparse
import contextlib

from splitfed.commands._args import (
    add_model_args,
    batch_size,
    model_spec,
    positive_int,
    seed,
    zoo_name_checked,
)
from splitfed.engine.modes import MODES
from splitfed.errors import ConfigError, CutError
from splitfed.flower.policy import parse_cuts
from splitfed.jsonio import dumps

JSON_KEYS = ("model", "cuts", "mode", "tiers", "u_shape", "rounds", "clients", "steps", "max_abs_diff", "tolerance",
             "transport", "worst_key", "ok")
"""``--json``'s keys (``VerifyResult.to_dict``), named in ``--help``: a script's contract."""


def _cut_vectors(text: str) -> list[tuple[int, ...]]:
    """``"2,5/3,7"`` -> ``[(2, 5), (3, 7)]``, read as ``--cuts static:2,5/3,7`` is (:func:`parse_cuts`)."""
    try:
        return parse_cuts(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check that training split at given cuts equals training the whole model",
                       description=__doc__)
    add_model_args(p)
    p.add_argument("--cuts", type=_cut_vectors, required=True,
                   help="cut vector K1,K2,... ; several separated by / are given to clients in turn")
    p.add_argument("--tiers", type=positive_int, default=None, help="tiers in the chain (default: cuts + 1)")
    p.add_argument("--steps", type=positive_int, default=2, help="training steps per client per round")
    p.add_argument("--rounds", type=positive_int, default=1)
    p.add_argument("--clients", type=positive_int, default=None,
                   help="clients, dealt the cut vectors in turn (default: one per cut vector)")
    p.add_argument("--batch", type=batch_size, default=4)
    p.add_argument("--mode", choices=MODES, default="sflv1")
    p.add_argument("--u-shape", action="store_true", help="the device also holds the last blocks and the loss")
    p.add_argument("--transport", choices=("inproc", "grpc"), default="inproc",
                   help="grpc: run the server tiers as real tier processes on 127.0.0.1")
    p.add_argument("--seed", type=seed, default=0, help="0..2**32-1")
    p.add_argument("--json", action="store_true", help=f"print one JSON object: {', '.join(JSON_KEYS)}; exit 1 "
                   "when ok is false (max_abs_diff above tolerance; worst_key: the weight it is in); on an "
                   "error, nothing on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    zoo_name_checked(args.model)
    from splitfed.engine import template
    from splitfed.engine.rounds import inprocess_chain
    from splitfed.engine.types import block_of
    from splitfed.engine.verify import verify
    from splitfed.models.segment import validate_cuts
    from splitfed.models.zoo import ZOO

    spec = model_spec(args)
    n = template.num_blocks(spec)
    width = len(args.cuts[0])
    tiers = args.tiers or width + 1 - (1 if args.u_shape else 0)
    if tiers < 2:  # the flag that made it: --tiers, or --cuts one vector too short for --u-shape
        raise ConfigError(f"--tiers {tiers}: a chain needs at least 2 tiers" if args.tiers else
                          f"--cuts {','.join(map(str, args.cuts[0]))} with --u-shape: a chain needs at least 2 "
                          f"tiers, so a U-shape cut vector needs at least 2 cuts (e.g. 2,4)")
    for c in args.cuts:
        try:
            validate_cuts(c, n, tiers, args.u_shape, model=spec.name)
        except CutError as e:
            raise CutError(f"--cuts: {e}") from None
    clients = args.clients or len(args.cuts)
    if clients < len(args.cuts):  # the vectors past the last client would be reported OK, never trained
        unused = "/".join(",".join(map(str, c)) for c in args.cuts[clients:])
        raise ConfigError(f"--clients {clients} leaves cut vector(s) {unused} of --cuts to no client: give "
                          f"--clients {len(args.cuts)} or more, or fewer cut vectors")
    cuts = [args.cuts[i % len(args.cuts)] for i in range(clients)]
    with contextlib.ExitStack() as stack:
        if args.transport == "grpc":
            from splitfed.sim.tiers import tier_names
            from splitfed.transport.chain import close_chain, grpc_chain
            from splitfed.transport.process import local_chain

            allow = () if spec.name in ZOO else (spec.name,)  # the tiers serve the model checked here
            procs = stack.enter_context(local_chain(tier_names(tiers - 1), insecure=True, allow_models=allow))
            chain = grpc_chain([p.address for p in procs], insecure=True)
            stack.callback(close_chain, chain)
        else:
            chain = inprocess_chain(tiers - 1)
        result = verify(spec, cuts, mode=args.mode, u_shape=args.u_shape, steps=args.steps, batch=args.batch,
                        rounds=args.rounds, seed=args.seed, chain=chain, transport=args.transport)
    if args.json:
        print(dumps(result.to_dict()))
    else:
        verdict = "OK" if result.ok else "MISMATCH"
        if not result.ok and result.worst_key:  # where to look: the weight, and the block that holds it
            block = block_of(result.worst_key)
            verdict += f", largest in {result.worst_key} (block {block}, {template.template(spec).names[block]})"
        print(f"verify {spec.name} mode={args.mode} tiers={tiers} cuts={'/'.join(','.join(map(str, c)) for c in args.cuts)}"
              f"{' u-shape' if args.u_shape else ''} transport={args.transport}: max |w_split - w_whole| = "
              f"{result.max_abs_diff:.3e} (tolerance {result.tolerance:.0e}) {verdict}")
    return 0 if result.ok else 1
