"""The ``splitfed`` command: one subcommand per module in ``splitfed.commands``.

Each command module defines ``add_parser(subparsers)`` (registering itself with
``set_defaults(func=run)``) and ``run(args) -> int``. Errors a user can act on
(:class:`SplitfedError`) become one line on stderr and exit code 2 for refused
input, 1 for a run that started and failed (a round, the simulation engine).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from splitfed.errors import SplitfedError


def build_parser() -> argparse.ArgumentParser:
    import splitfed.commands as commands

    parser = argparse.ArgumentParser(
        prog="splitfed", description="Split + federated learning across device, edge and cloud tiers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"splitfed.commands.{info.name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SplitfedError as e:
        print(f"splitfed {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"splitfed {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
