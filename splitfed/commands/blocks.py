"""``splitfed blocks``: the legal cut positions of a model, with shapes and parameter counts."""

from __future__ import annotations

import argparse

from splitfed.commands._args import add_model_args, model_spec, zoo_name_checked
from splitfed.jsonio import dumps

BLOCK_KEYS = ("index", "name", "output_shape", "params", "trainable", "cut_after")
"""The keys of each of ``--json``'s blocks (:func:`describe`'s rows), named in ``--help``."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("blocks", help="list a model's blocks (the places it can be cut)", description=__doc__)
    add_model_args(p)
    p.add_argument("--json", action="store_true",
                   help=f"print one JSON object: model, input_shape, and blocks, one per block: {', '.join(BLOCK_KEYS)}")
    p.set_defaults(func=run)


def describe(spec) -> list[dict]:  # type: ignore[no-untyped-def]
    """One row per block: its parameters (``params``; each storage once: two Parameters tied by ``.data`` are
    one weight) and how many of them train (``trainable``: ``requires_grad``; fewer in a frozen block)."""
    from splitfed.engine import template
    from splitfed.models.tying import param_sizes

    blocks = template.template(spec)
    rows = []
    for i, (m, name) in enumerate(zip(blocks.modules, blocks.names, strict=True)):
        shape, dtype = template.boundary(spec, i + 1)
        params = list(m.parameters())
        row = (i, name, list(shape), param_sizes(params)[0], param_sizes([p for p in params if p.requires_grad])[0],
               i + 1)
        rows.append(dict(zip(BLOCK_KEYS, row, strict=True)))
    return rows


def run(args: argparse.Namespace) -> int:
    zoo_name_checked(args.model)
    spec = model_spec(args)
    rows = describe(spec)
    if args.json:
        print(dumps({"model": spec.name, "input_shape": list(spec.input_shape), "blocks": rows}))
        return 0
    print(f"{spec.name}: {len(rows)} blocks, input {list(spec.input_shape)}; cut k puts blocks < k on the earlier tier")
    frozen = any(r["trainable"] < r["params"] for r in rows)  # a column for what trains only where some does not
    print(f"{'block':>5}  {'name':<28} {'output':<18} {'params':>10}" + (f" {'trainable':>10}" if frozen else ""))
    for r in rows:
        print(f"{r['index']:>5}  {r['name'][:28]:<28} {str(r['output_shape']):<18} {r['params']:>10,}"
              + (f" {r['trainable']:>10,}" if frozen else ""))
    return 0
