"""The ``splitfed`` command: one subcommand per module in ``splitfed.commands``.

Each command module defines ``add_parser(subparsers)`` (registering itself with
``set_defaults(func=run)``) and ``run(args) -> int``. Errors a user can act on
(:class:`SplitfedError`) become one line on stderr and exit code 2 for refused
input, 1 for a run that started and failed (a round, the simulation engine).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
import threading
from typing import NoReturn

from splitfed.errors import SplitfedError, Terminated


class Parser(argparse.ArgumentParser):
    """A refused command line is one line, ``splitfed CMD: error: MESSAGE (see splitfed CMD --help)``, exit 2,
    rather than the whole usage block before it. ``add_subparsers`` makes every command's parser of this class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    import splitfed.commands as commands

    parser = Parser(prog="splitfed", description="Split + federated learning across device, edge and cloud tiers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"splitfed.commands.{info.name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would name "splitfed", not the command they were given to
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        commands.get(getattr(args, "command", None), parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SplitfedError as e:
        print(f"splitfed {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated)
        print(f"splitfed {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130


def entry() -> None:
    """The console script: :func:`main`, then exit without waiting on threads a stopped run left blocked.

    Ctrl-C in a simulation leaves Flower's engine threads waiting on Ray actors that are gone;
    the interpreter would join them forever at exit. By the time ``main`` returns, every process
    the run started is stopped and every file it wrote is flushed and fsynced, so such threads
    hold nothing worth waiting for.
    """
    code = main()
    stray = [t for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stray:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
