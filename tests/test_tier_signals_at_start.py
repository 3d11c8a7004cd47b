"""A signal while ``splitfed tier`` starts stops it before it serves, one line and 130 / 143.

Before, the tier put its handlers in only once it served: a Ctrl-C during torch's import (a second or more) was
raised inside that import, and where it landed in torch's C++ code the process aborted ("terminate called after
throwing an instance of 'pybind11::error_already_set'", SIGABRT; 4 of 150 tries) or the interrupt was lost and the
tier went on serving; a SIGTERM then killed it with no word. The tests send the signal from an import hook at the
moment torch's import begins (real processes, real signals): the import must finish and the tier stop after it.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from splitfed.cli import main

_AT_TORCH = """
import builtins, os, signal, sys
real = builtins.__import__
def hooked(name, *args, **kwargs):
    if name == "torch" and "torch" not in sys.modules:
        builtins.__import__ = real
        os.kill(os.getpid(), signal.{sig})  # the user's signal, as torch's import starts
    return real(name, *args, **kwargs)
builtins.__import__ = hooked
from splitfed.cli import main
code = main(["tier", "--role", "cloud", "--listen", "127.0.0.1:0", "--insecure"])
print("torch imported:", "torch" in sys.modules and hasattr(sys.modules["torch"], "Tensor"), flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize(("sig", "code", "word"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_a_signal_while_torch_imports_stops_the_tier_before_it_serves(sig: str, code: int, word: str) -> None:
    """The import finishes (the signal is not raised inside it), the tier never says it serves, and it exits with
    the signal's code and one line (before: a KeyboardInterrupt inside the import, or SIGTERM's silent death)."""
    done = subprocess.run([sys.executable, "-c", _AT_TORCH.format(sig=sig)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == code, done.stderr
    assert done.stdout == "torch imported: True\n"
    assert done.stderr == f"splitfed tier: {word}\n"


def test_the_command_puts_back_the_handlers_it_found() -> None:
    """In process (a caller's own handlers): the tier's are set for the command only, refused or not."""
    mine = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["tier", "--role", "cloud", "--listen", "127.0.0.1:0"]) == 2  # neither TLS nor --insecure
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == mine
