"""Generate the Python code of ``proto/`` with grpcio-tools, and notice when it is stale.

The generated modules are build output (git ignores them), written to
``splitfed/transport/proto/splitfed/`` with ``STAMP.json``: a digest of the
.proto sources and the generator's version. Importing :mod:`splitfed.transport`
regenerates them when the stamp does not match, under a file lock so that
parallel test workers or tier processes starting together generate once.

    python -m splitfed.transport.protogen [--force | --check]
"""

from __future__ import annotations

import argparse
import sys

from splitfed.transport import _codegen
from splitfed.transport._codegen import GEN_DIR, ensure, generate, source_digest, stale_reason

__all__ = ["ensure", "generate", "source_digest", "stale_reason", "main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m splitfed.transport.protogen",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="regenerate even if current")
    ap.add_argument("--check", action="store_true", help="only report: exit 1 if stale")
    args = ap.parse_args(argv)
    reason = stale_reason()
    if args.check:
        print(reason or _current())
        return 1 if reason else 0
    did = generate(force=args.force)
    print(f"generated {GEN_DIR}" if did else _current())
    return 0


def _current() -> str:
    """Current: as it was found, or because importing splitfed.transport (to run this) regenerated it."""
    why = _codegen.regenerated_at_import
    return f"generated {GEN_DIR} when splitfed.transport was imported ({why}); it is current" if why \
        else "generated code is current"


if __name__ == "__main__":
    sys.exit(main())
