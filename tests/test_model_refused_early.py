"""A ``--model`` no zoo holds and no ``module:factory`` is, refused at once: ``splitfed simulate`` (its flag, or
the ``model`` key of its config file), ``profile``, ``blocks``, ``verify``, ``ping`` and ``optimize``.

Before: the refusal came after torch's import (2-4 s for one line), as the zoo that names the models imports torch.
Now :mod:`splitfed.zoo_names` (torch-free, held to the zoo by tests/test_benchmark_input.py) refuses such a name
first, with the message the zoo gives it; a ``module:factory`` is still imported where it was, and its refusal is
as before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.models.zoo import resolve_spec

ROOT = Path(__file__).resolve().parent.parent
UNKNOWN = ("unknown model 'nonsense': use one of cnn, mlp, mobilenetv2, resnet18, transformer, vgg11 or "
           "'module.path:factory'")


def test_a_bad_model_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    """One interpreter, seven refusals in turn (the simulate flag, a simulate config file's key, the profile,
    blocks, verify, ping and optimize flags): each exit 2 with its one line, torch imported by none of them, and
    no run folder made."""
    config = tmp_path / "run.toml"
    config.write_text('model = "nonsense"\n')
    out = tmp_path / "run"
    commands = [["simulate", "--model", "nonsense", "--out", str(out)],
                ["simulate", "--config", str(config), "--out", str(out)],
                ["profile", "--model", "nonsense"],
                ["blocks", "--model", "nonsense"],
                ["verify", "--model", "nonsense", "--cuts", "1,2"],
                ["ping", "127.0.0.1:9", "--model", "nonsense"],  # no tier is asked: refused first
                ["optimize", "--model", "nonsense", "--fleet", "small"]]
    code = ("import json, sys\n"
            "from splitfed.cli import main\n"
            "seen = []\n"
            f"for argv in {commands!r}:\n"
            "    seen.append([main(argv), 'torch' in sys.modules])\n"
            "    print('', file=sys.stderr)\n"
            "print(json.dumps(seen))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert json.loads(p.stdout.splitlines()[-1]) == [[2, False]] * 7, p.stdout + p.stderr
    assert p.stderr.split("\n\n") == [f"splitfed simulate: error: command line: model: {UNKNOWN}",
                                      f"splitfed simulate: error: {config} + command line: model: {UNKNOWN}",
                                      *(f"splitfed {c}: error: {UNKNOWN}" for c in ("profile", "blocks", "verify",
                                                                                   "ping", "optimize")), ""], p.stderr
    assert not out.exists()


@pytest.mark.parametrize(("argv", "named"), [
    (["--model", "nonsense"], "command line"),
    (["--config", "{config}"], "{config}"),  # no flag: the default run folder is not made
    (["--config", "{config}", "--rounds", "2"], "{config} + command line"),  # the file's, with other flags
])
def test_simulate_names_where_the_model_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], argv: list[str],
                                                  named: str) -> None:
    """The refusal is the one the whole settings' check gave it, its sources named; no run folder is made."""
    config = tmp_path / "run.toml"
    config.write_text('[simulate]\nmodel = "nonsense"\n')
    monkeypatch.chdir(tmp_path)  # where the default run folder (runs/sim-<time>) would be
    assert main(["simulate", *(a.format(config=config) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err == f"splitfed simulate: error: {named.format(config=config)}: model: {UNKNOWN}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]


def test_a_flag_s_model_is_the_one_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The flag's model wins over the file's, as it does in a run: a bad flag over a good file is refused, a good
    flag over a bad file is not refused for it (it is refused for its --cuts instead, which the whole check
    reads later)."""
    config = tmp_path / "run.toml"
    config.write_text('model = "cnn"\n')
    out = ["--out", str(tmp_path / "run")]
    assert main(["simulate", "--config", str(config), "--model", "nonsense", *out]) == 2
    assert capsys.readouterr().err == f"splitfed simulate: error: {config} + command line: model: {UNKNOWN}\n"
    config.write_text('model = "nonsense"\n')
    assert main(["simulate", "--config", str(config), "--model", "mlp", "--cuts", "bogus", *out]) == 2
    assert capsys.readouterr().err.startswith(f"splitfed simulate: error: {config} + command line: cuts: ")


def test_simulate_still_imports_a_module_factory_model_to_check_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A name with ':' is no zoo name: it is imported as before, and a module that is not there is said so."""
    assert main(["simulate", "--model", "tests.no_such_module:factory", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splitfed simulate: error: cannot import 'tests.no_such_module' for model "
                          "'tests.no_such_module:factory': "), err


def test_profile_refuses_a_bad_model_with_the_zoo_s_message(capsys: pytest.CaptureFixture[str]) -> None:
    """The early refusal (:func:`splitfed.zoo_names.unknown_model_message`) says what the zoo says of the same
    name: this test holds the two alike."""
    with pytest.raises(ConfigError) as e:
        resolve_spec("nonsense")
    assert str(e.value) == UNKNOWN
    assert main(["profile", "--model", "nonsense"]) == 2
    assert capsys.readouterr().err == f"splitfed profile: error: {UNKNOWN}\n"
