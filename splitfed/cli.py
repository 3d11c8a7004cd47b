"""The ``splitfed`` command: one subcommand per module in ``splitfed.commands``.

Each command module defines ``add_parser(subparsers)`` (registering itself with
``set_defaults(func=run)``) and ``run(args) -> int``. Errors a user can act on
(:class:`SplitfedError`) become one line on stderr and exit code 2 for refused
input, 1 for a run that started and failed (a round, the simulation engine).

A command module's top level, and the argparse types it uses, import nothing heavy
(torch, numpy, scipy, Flower, gRPC: its ``run`` does), so that building the parser,
any help and a command line argparse refuses take a fraction of a second
(tests/test_cli_light.py).

A stdout whose reader has gone (``splitfed report RUNS | head -2``) ends the command
quietly, as it ends a Unix tool: nothing on stderr, exit code 141 (128 + SIGPIPE, what
a shell reports for a tool that signal ended, as 130 and 143 are for SIGINT and SIGTERM).
"""

from __future__ import annotations

import argparse
import atexit
import errno
import importlib
import logging
import os
import pkgutil
import select
import sys
from collections.abc import Callable
from typing import NoReturn

from splitfed.errors import SplitfedError, Terminated

# gRPC's C core logs each refused TLS handshake (one line per retry) at INFO: a refusal is splitfed's one line
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a write refused for want of room
STDOUT_CLOSED = 141  # 128 + SIGPIPE: the code a shell shows for it, though Python ignores SIGPIPE (the write raises)
OUTPUT_CLOSED = "output closed"  # a run's record of such an end (``reason``, with no signal: none came)


class Parser(argparse.ArgumentParser):
    """A refused command line is one line, ``splitfed CMD: error: MESSAGE (see splitfed CMD --help)``, exit 2,
    rather than the whole usage block before it. ``add_subparsers`` makes every command's parser of this class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """``--version``: the versions are read when asked for, not each time the parser is built."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> NoReturn:
        from splitfed.versions import version_text

        print(version_text())  # on stdout, as argparse's own version action prints
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    import splitfed.commands as commands

    parser = Parser(prog="splitfed", description="Split + federated learning across device, edge and cloud tiers.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show splitfed's version and those of Python, torch, Flower, Ray, gRPC, protobuf and "
                             "numpy it runs on, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"splitfed.commands.{info.name}").add_parser(sub)
    for command in sub.choices.values():  # a module's docstring is its help: shown as text, not reST literals
        command.description = (command.description or "").replace("``", "")
        for action in command._actions:
            _show_default(action)
    return parser


def _show_default(action: argparse.Action) -> None:
    """An option's help says what it is when not given (``--batch BATCH  (default: 32)``), unless its own words
    say so already; a flag, an empty value or one worked out later (``None``) has none to show."""
    default, text = action.default, action.help
    unset = default is None or default is False or default is argparse.SUPPRESS or default in ("", [])
    if unset or text == argparse.SUPPRESS or not action.option_strings:  # (0 == False: identity, not ``in``)
        return
    if text and "default" in text:
        return
    action.help = f"{text} (default: %(default)s)" if text else "default: %(default)s"


def main(argv: list[str] | None = None) -> int:
    try:  # quick (a command imports torch and the rest in its run), but a Ctrl-C here is one line all the same
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
    except KeyboardInterrupt:
        print("splitfed: interrupted", file=sys.stderr)
        return 130
    if extra:  # argparse would name "splitfed", not the command they were given to
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        command: str | None = getattr(args, "command", None)
        (commands.get(command, parser) if command else parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SplitfedError as e:
        print(f"splitfed {args.command}: error: {e}", file=sys.stderr)
        _hint(args.command, e)
        return e.exit_code
    except BrokenPipeError:
        if not _stdout_gone():  # a socket's or a child's pipe: a failure to show
            raise
        _stdout_to_devnull()
        return STDOUT_CLOSED
    except OSError as e:
        if e.errno not in _FULL:
            raise
        # a full disk (``> /dev/full``, a run folder's file): one line, not a traceback; the output is lost
        print(f"splitfed {args.command}: error: {e}", file=sys.stderr)
        _stdout_to_devnull()
        return 1
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated)
        print(f"splitfed {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        _hint(args.command, e)
        return 143 if terminated else 130


def script(prog: str, body: Callable[[], int | None]) -> int:
    """A script's ``main`` (the benchmarks) under the command's rules: a :class:`SplitfedError` is one line
    and its exit code, Ctrl-C one line and 130, a reader of its output gone (``| head``) the quiet 141 of a
    command, a file that cannot be written (its result's: a full disk) one line and 1, rather than a traceback; its lines reach a pipe as they are printed (:func:`line_buffered`)."""
    line_buffered()
    try:
        code = int(body() or 0)
        sys.stdout.flush()  # here, not at the interpreter's exit, where a closed pipe is a message and rc 120
        return code
    except SplitfedError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        if not _stdout_gone():  # a socket's or a child's pipe: a failure to show
            raise
        _stdout_to_devnull()
        return STDOUT_CLOSED
    except OSError as e:
        if e.filename is None:  # not a file's (a socket's, say): a failure to show
            raise
        from splitfed.jsonio import drafted_for

        # a file's: its result file, written once the measuring is done (--out's folder gone, a full disk), is
        # one line naming the file asked for, not the draft written first
        folder, name = os.path.split(os.fsdecode(e.filename))
        print(f"{prog}: error: {os.path.join(folder, drafted_for(name))}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def output_gone(e: BaseException) -> bool:
    """Whether ``e`` is a write refused because stdout's reader has gone (``| head``): the user ended the command,
    as a Unix tool's reader ends it (exit 141), so what it was doing was stopped, not failed."""
    return isinstance(e, BrokenPipeError) and _stdout_gone()


def _stdout_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone: a BrokenPipeError is also what a socket or a
    child's pipe raises, and only this one is the user's ``| head``."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor (a test's capture)
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at /dev/null: what is still buffered for it goes there at the last flush,
    rather than raising a second BrokenPipeError (and a traceback) then."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def line_buffered() -> None:
    """Each line printed reaches stdout's pipe or file at once (``| tee run.log``, ``> run.log``, a scheduler's
    log, a test reading the progress): Python writes such a stdout in 8 KiB blocks, so a run's progress came
    all at its end. A terminal's stdout is line-buffered already; one without ``reconfigure`` (a test's capture,
    a stream a caller put there) is left as it is."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if callable(reconfigure):
        try:
            reconfigure(line_buffering=True)
        except (ValueError, OSError):  # closed (``>&-``), or a descriptor that refuses the flush it does
            pass


def _hint(command: str, e: BaseException) -> None:
    """What the user can do next (``e.hint``, set by a command that knows, e.g. how to continue a run)."""
    hint = getattr(e, "hint", "")
    if hint:
        print(f"splitfed {command}: {hint}", file=sys.stderr)


def entry() -> None:
    """The console script: :func:`main`, its exit handlers, then exit at once.

    By the time ``main`` returns, every process the run started is stopped and every file it wrote
    is flushed and fsynced. What the interpreter would still do is worth nothing and costs seconds:
    tearing down torch, gRPC and Ray takes ~4 s after a simulation's last line (~1 s after any command
    that imported torch), and after a Ctrl-C, Flower's engine threads may be left waiting on Ray
    actors that are gone, which the interpreter would join forever. The exit handlers (``atexit``:
    temporary files, loggers) still run.
    """
    line_buffered()
    code = main()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with it closed (``>&-``): Python gives None, and print writes nothing
            continue
        try:
            stream.flush()
        except BrokenPipeError:  # a reader gone (``| head``) before the output, all of it buffered, reached it
            if stream is sys.stdout and code == 0:
                code = STDOUT_CLOSED  # the same end as a print the closed pipe refused (main)
        except (OSError, ValueError):  # closed: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
