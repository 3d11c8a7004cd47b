"""Bad model input is refused in one line with exit status 2, never a traceback.

Wrong input shapes for zoo models and user factories, factories that raise, a class count the
model does not output, out-of-range numeric flags, and a profile cache that cannot be used.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.profile import profiler

FACTORIES = textwrap.dedent("""
    from torch import nn

    def good():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def boom():
        raise RuntimeError("no weights here")

    def needs_arg(n):
        return good()
""")


@pytest.fixture
def mymods(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"mymods_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) >= 1 and "Traceback" not in err
    return lines[-1]


@pytest.mark.parametrize("cmd", ["blocks", "profile", "verify"])
@pytest.mark.parametrize("model,shape", [("cnn", "3,32"), ("cnn", "1,2,2"), ("vgg11", "3,8,8"),
                                         ("resnet18", "32"), ("transformer", "3,8,8")])
def test_wrong_input_shape_of_a_zoo_model(capsys: pytest.CaptureFixture[str], cmd: str, model: str,
                                          shape: str) -> None:
    extra = {"blocks": [], "profile": ["--batch", "2", "--reps", "1", "--no-cache"], "verify": ["--cuts", "1"]}[cmd]
    line = _refused(capsys, [cmd, "--model", model, "--input-shape", shape, *extra])
    want = f"({shape},)" if "," not in shape else f"({shape.replace(',', ', ')})"
    assert f"model {model} does not take inputs of shape {want}: " in line, line
    assert line.startswith(f"splitfed {cmd}: error: ")


def test_wrong_input_shape_in_optimize(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    line = _refused(capsys, ["optimize", "--model", "cnn", "--input-shape", "3,32", "--fleet", "small"])
    assert "model cnn does not take inputs of shape (3, 32): " in line


def test_user_factory_errors(capsys: pytest.CaptureFixture[str], mymods: str) -> None:
    line = _refused(capsys, ["blocks", "--model", f"{mymods}:good", "--input-shape", "32"])
    assert f"model {mymods}:good does not take inputs of shape (32,) (floats; a model that takes tokens, an nn.Embedding first, needs --vocab N): mat1 and mat2" in line
    line = _refused(capsys, ["blocks", "--model", f"{mymods}:boom", "--input-shape", "64"])
    assert f"model factory {mymods}:boom raised RuntimeError: no weights here" in line
    line = _refused(capsys, ["profile", "--model", f"{mymods}:needs_arg", "--input-shape", "64", "--no-cache"])
    assert f"model factory {mymods}:needs_arg raised TypeError: " in line
    line = _refused(capsys, ["verify", "--model", f"{mymods}:good", "--input-shape", "64", "--num-classes", "20",
                             "--cuts", "2"])
    assert f"model {mymods}:good outputs 10 classes, and 20 are expected (--num-classes" in line
    assert main(["blocks", "--model", f"{mymods}:good", "--input-shape", "64"]) == 0


@settings(max_examples=30)
@given(model=st.sampled_from(["mlp", "cnn", "vgg11", "resnet18", "mobilenetv2", "transformer"]),
       shape=st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_any_input_shape_is_accepted_or_refused_cleanly(model: str, shape: list[int]) -> None:
    from splitfed.engine import template
    from splitfed.models.zoo import resolve_spec

    spec = resolve_spec(model, tuple(shape), 3)
    try:
        blocks = template.template(spec)
    except ConfigError as e:
        assert str(e).startswith(f"model {model} does not take inputs of shape {tuple(shape)}: ")
        return
    assert template.boundary(spec, len(blocks)) == ((3,), template.boundary(spec, len(blocks))[1])


def test_seed_message_names_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse refuses it: exit 2, one error line
        main(["verify", "--model", "mlp", "--cuts", "2", "--seed", "-1"])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("splitfed verify: error: argument --seed:") and line.endswith(
        "got -1 (see splitfed verify --help)"), line


@pytest.mark.parametrize("argv,flag", [
    (["profile", "--model", "cnn", "--batch", "99999999999", "--no-cache"], "--batch"),
    (["optimize", "--model", "cnn", "--fleet", "small", "--batch", "99999999999"], "--batch"),
    (["profile", "--model", "cnn", "--num-classes", "10000000000", "--no-cache"], "--num-classes"),
    (["optimize", "--model", "cnn", "--fleet", "small", "--num-classes", "10000000000"], "--num-classes"),
])
def test_huge_batch_or_class_count_is_refused(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              flag: str) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse refuses it: exit 2, one error line
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected an integer in" in err and "Traceback" not in err


def _profile() -> int:
    profiler.clear_cache()
    return main(["profile", "--model", "mlp", "--batch", "2", "--reps", "1", "--json"])


def test_unusable_profile_cache_is_skipped(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
                                           tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING, logger="splitfed.profile.profiler")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(a_file))  # the cache path is a file
    assert _profile() == 0
    assert any("cannot be written" in r.getMessage() for r in caplog.records)

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(cache))
    assert _profile() == 0
    (entry,) = cache.glob("*.json")
    entry.write_text("[1, 2]")  # a JSON list, not a profile
    assert _profile() == 0
    assert isinstance(json.loads(entry.read_text()), dict)  # measured again and rewritten

    real_read, real_replace = pathlib.Path.read_text, os.replace

    def deny_read(self: pathlib.Path, *a: object, **k: object) -> str:
        if self == entry:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *a, **k)

    def deny_replace(src: object, dst: object, *a: object, **k: object) -> None:
        if pathlib.Path(str(dst)).parent == cache:
            raise PermissionError(13, "Permission denied", str(dst))
        real_replace(src, dst, *a, **k)  # type: ignore[arg-type]

    caplog.clear()
    monkeypatch.setattr(pathlib.Path, "read_text", deny_read)  # an unreadable entry
    monkeypatch.setattr(os, "replace", deny_replace)  # a read-only folder (root writes anywhere: simulated)
    assert _profile() == 0
    msgs = [r.getMessage() for r in caplog.records]
    assert any("cannot be read" in m for m in msgs) and any("cannot be written" in m for m in msgs)
    assert not list(cache.glob("*.tmp*"))
    capsys.readouterr()
