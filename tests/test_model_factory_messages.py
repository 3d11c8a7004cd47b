"""What a user naming a model or its keyword arguments wrongly is told: the real reason, in one line.

- a file path given as the model (``./mymod.py:net``) is told that ``--model`` takes a module path, the module to
  name and the folder to run from; before, import's own words: a TypeError on a relative import's package, or
  ``No module named '/abs/mymod'``;
- a zoo model's options are sizes: one that is not a positive number of its type is refused before the model is
  built (before: a model of empty tensors, torch warning of each, refused as not taking its input shape);
- a model given keyword arguments that fails to build or to run is told so, naming them, not that its input shape
  is wrong; without them the input shape is still what it is told.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
from torch import nn

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.models.zoo import model_blocks, resolve_spec

HERE = "tests.test_model_factory_messages"
FLOATS = " (floats; a model that takes tokens, an nn.Embedding first, needs --vocab N)"


def widthed(width: int = 8) -> nn.Module:
    """4 features in, 3 classes out; its last layer takes 8 features, so only the default width runs."""
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(8, 3))


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line of stderr of a command refused with exit status 2."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A factory module's name (unique: a module imports once per process), written in ``tmp_path``, the current
    folder; sys.path is given back (a factory's import puts the current folder on it)."""
    name = f"mymod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("from torch import nn\n\n\ndef net():\n"
                                         "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), "
                                         "nn.Linear(32, 10))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return name


def _told(given: str, module: str, folder: Path | str) -> str:
    return (f"splitfed blocks: error: model {given!r}: --model takes a module path (module:factory, importable from "
            f"the current folder or PYTHONPATH), not a file: give '{module}:net', run from {folder} or with {folder} "
            "on PYTHONPATH")


@pytest.mark.parametrize("relative", [True, False])
def test_a_file_given_as_the_model_is_told_the_module_to_name(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                              module: str, relative: bool) -> None:
    given = f"./{module}.py:net" if relative else f"{tmp_path / module}.py:net"
    assert _refused(capsys, ["blocks", "--model", given, "--input-shape", "64"]) == _told(given, module, tmp_path)
    assert main(["blocks", "--model", f"{module}:net", "--input-shape", "64"]) == 0  # as told: it runs


def test_a_file_in_another_folder_names_that_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    given = f"../{module}.py:net"
    assert _refused(capsys, ["blocks", "--model", given, "--input-shape", "64"]) == _told(given, module, tmp_path)
    missing = "nothere.py:net"
    assert _refused(capsys, ["blocks", "--model", missing, "--input-shape", "64"]) == (
        _told(missing, "nothere", tmp_path / "elsewhere") + f" (and there is no {tmp_path / 'elsewhere'}/nothere.py)")


def test_a_module_that_cannot_be_imported_is_still_told_import_s_reason() -> None:
    with pytest.raises(ConfigError) as e:
        resolve_spec("no_such_module_here:net", (64,))
    assert str(e.value) == ("cannot import 'no_such_module_here' for model 'no_such_module_here:net': "
                            "ModuleNotFoundError: No module named 'no_such_module_here'")


@pytest.mark.parametrize("model,kwargs,words", [
    ("cnn", {"width": 0}, "option width must be >= 1, got 0"),
    ("cnn", {"width": -3}, "option width must be >= 1, got -3"),
    ("cnn", {"width": 2.5}, "option width must be an integer, got 2.5"),
    ("cnn", {"width": True}, "option width must be an integer, got True"),
    ("resnet18", {"width": 0}, "option width must be >= 1, got 0"),
    ("mlp", {"hidden": -1}, "option hidden must be >= 2, got -1"),
    ("transformer", {"layers": 0}, "option layers must be >= 1, got 0"),
    ("transformer", {"d": 0}, "option d must be >= 1, got 0"),
    ("vgg11", {"width": 0}, "option width must be a number > 0, got 0"),
    ("mobilenetv2", {"width": -0.5}, "option width must be a number > 0, got -0.5"),
    ("mobilenetv2", {"width": float("inf")}, "option width must be a number > 0, got inf"),
    ("vgg11", {"width": "1"}, "option width must be a number > 0, got '1'"),
])
def test_a_zoo_model_refuses_a_size_that_is_not_positive(model: str, kwargs: dict, words: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before anything is built: no torch warning of empty tensors
        with pytest.raises(ConfigError) as e:
            resolve_spec(model, options=kwargs)
    assert str(e.value) == f"model {model}: {words}"


def test_a_zoo_size_refused_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        line = _refused(capsys, ["blocks", "--model", "cnn", "--model-kwargs", '{"width": 0}'])
    assert line == "splitfed blocks: error: model cnn: option width must be >= 1, got 0"
    assert main(["blocks", "--model", "vgg11", "--model-kwargs", '{"width": 1}']) == 0  # an int for a float: taken


def test_a_model_with_keyword_arguments_that_fails_is_not_blamed_on_its_input(
        capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(capsys, ["blocks", "--model", f"{HERE}:widthed", "--input-shape", "4",
                             "--model-kwargs", '{"width": 5}'])
    assert line.startswith(f"splitfed blocks: error: model {HERE}:widthed fails with its keyword arguments "
                           f"{{'width': 5}} (--model-kwargs) on inputs of shape (4,){FLOATS}: mat1 and mat2 "), line
    with pytest.raises(ConfigError) as e:  # a zoo model whose options fail together: d across 4 heads
        model_blocks(resolve_spec("transformer", d=6))
    assert str(e.value) == ("model transformer fails with its keyword arguments {'d': 6} (--model-kwargs) on inputs "
                            "of shape (64,): d must be a multiple of the 4 attention heads, got 6")
    assert main(["blocks", "--model", f"{HERE}:widthed", "--input-shape", "4", "--num-classes", "3"]) == 0


def test_a_model_without_keyword_arguments_is_still_told_its_input_shape(capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(capsys, ["blocks", "--model", f"{HERE}:widthed", "--input-shape", "5"])
    assert line.startswith(f"splitfed blocks: error: model {HERE}:widthed does not take inputs of shape (5,)"
                           f"{FLOATS}: mat1 and mat2 "), line
    with pytest.raises(ConfigError, match=r"^model cnn does not take inputs of shape \(3, 32\): expected \(channels"):
        model_blocks(resolve_spec("cnn", (3, 32)))


def test_a_factory_that_raises_on_its_keyword_arguments_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(capsys, ["blocks", "--model", f"{HERE}:widthed", "--input-shape", "4",
                             "--model-kwargs", '{"width": -1}'])
    assert line.startswith(f"splitfed blocks: error: model factory {HERE}:widthed given {{'width': -1}} "
                           "(--model-kwargs) raised RuntimeError: "), line
