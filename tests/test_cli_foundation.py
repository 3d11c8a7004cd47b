"""The user-facing commands of the foundation: verify and blocks.

verify runs as a real process here (``python -m splitfed.cli`` in :func:`test_verify_json_ok`, the console
script in :func:`test_verify_grpc_serves_the_users_own_model`); the tests of its words, exit code and JSON call
``splitfed.cli.main`` in this process, where a process each cost ~3 s of imports. ``blocks --json`` runs as a
process in test_cli_errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def splitfed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "splitfed.cli", *args], capture_output=True, text=True, timeout=300)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``splitfed ARGS`` through :func:`splitfed.cli.main` in this process: its code, stdout and stderr."""
    from splitfed.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's refusal
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["splitfed", *args], code, out, err)


def test_verify_json_ok() -> None:
    p = splitfed("verify", "--model", "cnn", "--cuts", "2,5", "--clients", "2", "--mode", "sflv1", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is True and out["max_abs_diff"] <= 1e-5
    assert out["model"] == "cnn" and out["mode"] == "sflv1" and out["cuts"] == [[2, 5], [2, 5]]


def test_verify_custom_factory_u_shape(capsys: pytest.CaptureFixture[str]) -> None:
    p = in_process(capsys, "verify", "--model", "tests.models_for_tests:small_sequential", "--input-shape", "6",
                 "--num-classes", "3", "--cuts", "1,2,3", "--u-shape", "--mode", "sl", "--steps", "3")
    assert p.returncode == 0, p.stderr
    assert "OK" in p.stdout


MYMODELS = """import torch.nn as nn

def make_net():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 10))
"""


def test_verify_grpc_serves_the_users_own_model(tmp_path: Path) -> None:
    """``verify --transport grpc`` on a module:factory model of the user's folder: the tier processes it
    starts serve that model (--allow-model) and import it from where the user ran the command."""
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    script = Path(sys.executable).parent / "splitfed"  # as a user runs it: the user's folder is not on sys.path
    p = subprocess.run([str(script), "verify", "--model", "mymodels:make_net", "--input-shape", "64",
                        "--num-classes", "10", "--cuts", "2,5", "--mode", "sflv1", "--clients", "2",
                        "--transport", "grpc", "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is True and out["transport"] == "grpc" and out["model"] == "mymodels:make_net"


@pytest.mark.parametrize(
    "args,match",
    [
        (["--model", "cnn", "--cuts", "5,2"], "non-decreasing"),
        (["--model", "cnn", "--cuts", "2,50"], "out of range"),
        (["--model", "cnn", "--cuts", "2,3", "--tiers", "4"], "need 3 cut"),
        (["--model", "no_such.mod:f", "--cuts", "1", "--input-shape", "4"], "cannot import"),
        (["--model", "tests.models_for_tests:skip_all", "--cuts", "1", "--input-shape", "4"], "no legal cut"),
    ],
)
def test_verify_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], match: str) -> None:
    p = in_process(capsys, "verify", *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], p.stderr


def test_blocks_json(capsys: pytest.CaptureFixture[str]) -> None:
    p = in_process(capsys, "blocks", "--model", "resnet18", "--json")
    assert p.returncode == 0, p.stderr
    blocks = json.loads(p.stdout)["blocks"]
    assert blocks[-1]["output_shape"] == [10]
    assert all(b["params"] > 0 for b in blocks)
    assert [b["index"] for b in blocks] == list(range(len(blocks)))
