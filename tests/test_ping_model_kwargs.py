"""``splitfed ping --model M --model-kwargs JSON`` asks each tier about the model those arguments build.

simulate, optimize, profile, verify and blocks took ``--model-kwargs`` and ping did not (an argparse error), so a
tier could not be asked about the model a run with options would load. It is the shared flag (``_args.
add_model_kwargs``: the same parsing and refusals), and the spec ping sends and --fleet-entry times carries it.
The tier is real (``serve_tier`` on 127.0.0.1), in process.
"""

from __future__ import annotations

import json
import socket

import pytest

from splitfed import cli
from splitfed.engine.limits import BuildLimits, current_limits, set_limits
from splitfed.models.zoo import build, resolve_spec
from splitfed.transport.server import serve_tier
from splitfed.units import MIB, mib_text


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed: asking it would fail late


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line of stderr of a command refused with exit status 2 (by argparse: SystemExit), nothing on
    stdout."""
    try:
        code: object = cli.main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, (out, err)
    return err.rstrip("\n")


@pytest.mark.parametrize("model,kwargs,words", [
    ("cnn", '{"widht": 8}', "model cnn takes no keyword argument 'widht': its options are width"),
    ("mlp", '{"hidden": 1}', "model mlp: option hidden must be >= 2, got 1"),
])
def test_a_bad_model_kwarg_is_refused_with_the_zoo_s_message_before_any_tier_is_asked(
        model: str, kwargs: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(capsys, ["ping", _closed_port(), "--model", model, "--model-kwargs", kwargs, "--timeout", "2"])
    assert line == f"splitfed ping: error: {words}"


def test_a_fleet_entry_without_model_refuses_a_bad_kwarg_of_cnn_before_any_tier_is_asked(
        capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(capsys, ["ping", _closed_port(), "--fleet-entry", "box", "--model-kwargs", '{"widht": 8}',
                             "--timeout", "2"])
    assert line == "splitfed ping: error: model cnn takes no keyword argument 'widht': its options are width"


@pytest.mark.parametrize("text", ["[1]", "{not json"])
def test_the_flag_is_the_one_the_other_commands_parse(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = _refused(capsys, ["blocks", "--model", "cnn", "--model-kwargs", text])
    ping = _refused(capsys, ["ping", _closed_port(), "--model", "cnn", "--model-kwargs", text])
    assert blocks.startswith("splitfed blocks: error: argument --model-kwargs: must be a JSON object of the model "
                             "factory's keyword arguments")
    assert ping == blocks.replace("splitfed blocks", "splitfed ping")


def test_the_tier_is_asked_about_the_model_the_kwargs_build(capsys: pytest.CaptureFixture[str]) -> None:
    """Under a 1 MiB build limit a tier builds the default cnn (55 kB of parameters) and refuses it 256 wide."""
    wide = sum(p.numel() * p.element_size() for p in build(resolve_spec("cnn", options={"width": 256})).parameters())
    why = (f"RESOURCE_EXHAUSTED: model 'cnn' {{'width': 256}} has {mib_text(wide)} of parameters; this process builds "
           "at most 1 MiB")
    with serve_tier("cloud", insecure=True) as cloud:
        before = current_limits()
        set_limits(BuildLimits(model_bytes=MIB))  # the tier is in process: its limits are this process's
        try:
            assert cli.main(["ping", cloud.address, "--count", "1", "--model", "cnn"]) == 0
            assert "will not build" not in capsys.readouterr().out
            assert cli.main(["ping", cloud.address, "--count", "1", "--model", "cnn", "--model-kwargs",
                             '{"width": 256}']) == 1
            out, err = capsys.readouterr()
            assert f"\n  will not build the model: {why}\n" in out + "\n", out
            assert err == (f"the tier chain {cloud.address} cannot run: tier cloud at {cloud.address} will not build "
                           f"model 'cnn': {why}\n")
            assert cli.main(["ping", cloud.address, "--count", "1", "--model", "cnn", "--model-kwargs",
                             '{"width": 256}', "--json"]) == 1
            (row,) = json.loads(capsys.readouterr().out)["tiers"]
            assert row["model_error"] == why
        finally:
            set_limits(before)
