"""Every program's lines reach a pipe or a file as they are printed, not in 8 KiB blocks at its end.

Before, ``splitfed simulate ... | tee run.log`` (or ``> run.log``, a scheduler's log) showed nothing until
the run ended, unless the user knew to set ``PYTHONUNBUFFERED``; CI set it, so the suite never saw it. Each
program here prints a line and then waits on its stdin: the line must arrive while it waits. Its stdout is
a pipe and ``PYTHONUNBUFFERED`` is unset, as in a user's shell. The real run through a pipe is
``tests/test_signals.py``, whose signals are sent at progress lines.

The deadline below only detects a line that never comes; it is not a speed target.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WAIT = 120  # seconds: far beyond a program's start; only a line held in a buffer gets here
LINE = b"the first line"

# the console script (``splitfed``): its main prints a line, then waits
ENTRY = textwrap.dedent("""
    import sys

    from splitfed import cli


    def main(argv=None):
        print("the first line")
        sys.stdin.readline()
        return 0


    cli.main = main
    cli.entry()
""")

# a benchmark's main, under the command's rules
SCRIPT = textwrap.dedent("""
    import sys

    from splitfed.cli import script


    def body():
        print("the first line")
        sys.stdin.readline()
        return 0


    raise SystemExit(script("bench", body))
""")

# an experiment (python -m simulations.NAME): its progress, printed without flush
EXPERIMENT = textwrap.dedent("""
    import dataclasses
    import sys

    from simulations.common import main


    @dataclasses.dataclass
    class Config:
        pass


    def experiment(cfg, out):
        print("the first line")
        sys.stdin.readline()
        return {}


    raise SystemExit(main("probe", Config, experiment, sys.argv[1:]))
""")

# the deployment script, refused at once (a missing CA file), then a line and a wait in the same process
DEPLOY = textwrap.dedent("""
    import sys

    from server import deploy

    assert deploy.main(["--tls-ca", sys.argv[1], "--tls-cert", sys.argv[1], "--tls-key", sys.argv[1]]) == 2
    print("the first line")
    sys.stdin.readline()
""")


def _line_while_waiting(code: str, *args: str) -> None:
    """Run ``code`` with stdout a pipe and no ``PYTHONUNBUFFERED``; its ``LINE`` must arrive while it waits on
    stdin (it is still running), and it must then end cleanly once given a line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdin is not None and p.stdout is not None
    got = b""
    try:
        deadline = time.monotonic() + WAIT
        while LINE not in got:
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"the line never reached the pipe while the program waited: {got!r}")
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                pytest.fail(f"the program ended before its line reached the pipe: {got!r}")
            got += chunk
        assert p.poll() is None, got  # it still waits: the line came as it was printed, not at its exit
    finally:
        try:
            _, err = p.communicate(b"\n", timeout=WAIT)  # what it waits for, then stdin closes
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail("the program did not end once given its line")
    assert p.returncode == 0, err.decode(errors="replace")
    assert got.splitlines()[-1] == LINE, got  # the line whole, once, and last


def test_the_console_scripts_lines_reach_a_pipe_as_printed() -> None:
    _line_while_waiting(ENTRY)


def test_a_benchmarks_lines_reach_a_pipe_as_printed() -> None:
    _line_while_waiting(SCRIPT)


def test_an_experiments_lines_reach_a_pipe_as_printed(tmp_path: Path) -> None:
    config = tmp_path / "probe.toml"
    config.write_text("")
    _line_while_waiting(EXPERIMENT, "--config", str(config), "--out", str(tmp_path / "out"))
    assert (tmp_path / "out" / "results.json").is_file()  # the experiment ran to its end


def test_the_deployments_lines_reach_a_pipe_as_printed(tmp_path: Path) -> None:
    _line_while_waiting(DEPLOY, str(tmp_path / "missing.pem"))

