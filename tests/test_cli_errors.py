"""A command line argparse refuses is one line naming the command and where its help is, exit 2.

Before, argparse printed the command's whole usage block (a dozen lines for ``simulate``) above the one line
that said what was wrong, and an unrecognized argument was blamed on ``splitfed`` rather than the command.
"""

from __future__ import annotations

import pytest

from splitfed.cli import main


@pytest.mark.parametrize("argv, line", [
    (["verify", "--model", "mlp", "--cuts", "2", "--seed", "x"],
     "splitfed verify: error: argument --seed: expected an integer in 0..4,294,967,295, got 'x' "
     "(see splitfed verify --help)"),
    (["simulate", "--mode", "nope"],
     "splitfed simulate: error: argument --mode: invalid choice: 'nope' (choose from 'sl', 'sflv1', 'sflv2') "
     "(see splitfed simulate --help)"),
    (["report", "no/such/run", "--bogus", "3"],  # report, not simulate: were --bogus ignored, nothing would start
     "splitfed report: error: unrecognized arguments: --bogus 3 (see splitfed report --help)"),
    (["ping"], "splitfed ping: error: the following arguments are required: HOST:PORT (see splitfed ping --help)"),
    (["nosuch"], "splitfed: error: argument COMMAND: invalid choice: 'nosuch' (choose from 'blocks', 'optimize', "
                 "'ping', 'profile', 'report', 'simulate', 'tier', 'verify') (see splitfed --help)"),
    (["--bogus"], "splitfed: error: unrecognized arguments: --bogus (see splitfed --help)"),
])
def test_a_refused_command_line_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                      line: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert err == line + "\n" and out == ""  # before: "usage: splitfed ..." lines first


def test_the_console_script_runs_exit_handlers_and_flushes_before_its_quick_exit(tmp_path) -> None:
    """``entry`` ends with ``os._exit`` (the interpreter's teardown of torch, gRPC and Ray took seconds, and
    could join threads a stopped run left blocked forever): what is registered with ``atexit`` still runs, and
    every byte written to stdout arrives, also when stdout is a pipe (block-buffered)."""
    import subprocess
    import sys
    import textwrap

    marker = tmp_path / "atexit-ran"
    script = textwrap.dedent(f"""
        import atexit, pathlib, sys
        atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text("yes"))
        from splitfed.cli import entry
        sys.argv = ["splitfed", "blocks", "--model", "resnet18", "--json"]
        entry()
    """)
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # CI sets it; users do not
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    import json

    assert len(json.loads(p.stdout)["blocks"]) > 3  # the whole JSON document: nothing cut off at exit
    assert marker.read_text() == "yes"
    refused = subprocess.run([sys.executable, "-c", script.replace('"resnet18"', '"nosuchmodel"')],
                             capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and refused.stderr.startswith("splitfed blocks: error: ") and marker.exists()


def test_a_ctrl_c_while_the_commands_are_imported_is_one_line_and_130() -> None:
    """Building the parser imports every command (torch with them: a second or more). A Ctrl-C then printed
    the interpreter's KeyboardInterrupt traceback (60 lines) and ended by the signal, not with 130."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, signal, sys
        import splitfed.cli as cli
        build = cli.build_parser
        def interrupted_while_building():
            os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, delivered during the imports below
            return build()
        cli.build_parser = interrupted_while_building
        sys.argv = ["splitfed", "blocks", "--model", "cnn"]
        cli.entry()
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (p.returncode, p.stderr, p.stdout) == (130, "splitfed: interrupted\n", "")
