"""What the shared command-line flags promise that the mutation run of ``splitfed/commands/_args.py`` left open.

``--model`` is required by every command that builds one (argparse's refusal, exit 2, not a traceback from a
spec of None); ``--vocab`` takes 2 tokens and up (one token is no vocabulary), refusing 1 with its bounds.
"""

from __future__ import annotations

import pytest

from splitfed.cli import build_parser
from splitfed.engine.limits import MAX_VOCAB


@pytest.mark.parametrize("command", [["profile"], ["blocks"], ["verify", "--cuts", "1"],
                                     ["optimize", "--fleet", "reference"]])
def test_a_command_without_model_is_refused(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(command)
    assert e.value.code == 2
    assert "the following arguments are required: --model" in capsys.readouterr().err


def test_vocab_takes_two_tokens_and_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["profile", "--model", "transformer", "--vocab", "2"]).vocab == 2
    assert build_parser().parse_args(["profile", "--model", "transformer", "--vocab", str(MAX_VOCAB)]).vocab == MAX_VOCAB
    for bad in ("1", str(MAX_VOCAB + 1)):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["profile", "--model", "transformer", "--vocab", bad])
        assert f"expected an integer in 2..{MAX_VOCAB:,}, got {bad}" in capsys.readouterr().err
