"""What a user whose .npz almost fits is told to do: grayscale images stored without a channel axis (Keras'
MNIST is (N, 28, 28)) are told to add one, naming the shape the model would then take, not the zoo's default;
tokens above a token model's vocab are told the ``--vocab`` (a config file's ``vocab``) that takes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from splitfed.cli import main
from splitfed.data.datasets import for_model, read_npz, spec_for
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec
from splitfed.sim.runner import validate

IMAGE_MODELS = ("cnn", "vgg11", "resnet18", "mobilenetv2")


def _images(path: Path, *sample: int) -> Path:
    """6 train and 2 test float samples of shape ``sample``, labels 0..5 and 0..1."""
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.random((6, *sample), dtype=np.float32), y_train=np.arange(6),
             x_test=rng.random((2, *sample), dtype=np.float32), y_test=np.arange(2))
    return path


def _tokens(path: Path, top: int, low: int = 0) -> Path:
    """4 train and 2 test rows of 64 tokens running ``low``..``top``."""
    row = np.linspace(low, top, 64).round().astype(np.int64)
    np.savez(path, x_train=np.tile(row, (4, 1)), y_train=np.arange(4), x_test=np.tile(row, (2, 1)),
             y_test=np.arange(2))
    return path


# ---------------------------------------------------------------- (N, H, W) images


@pytest.mark.parametrize("model", IMAGE_MODELS)
def test_images_without_a_channel_axis_are_told_to_add_one(tmp_path: Path, model: str) -> None:
    """Before: ``x_train: model 'cnn' takes samples of shape (1, 8, 8), got (28, 28)`` ((3, 32, 32) for the
    others): the zoo's default shape, which the model would not take either."""
    path = _images(tmp_path / "hw.npz", 28, 28)
    with pytest.raises(ConfigError) as e:
        spec_for(model, f"npz:{path}")
    assert str(e.value) == (f"npz:{path}: samples are (28, 28), with no channel axis; model {model!r} takes "
                            "(C, H, W), here (1, 28, 28): store x_train and x_test as x[:, None] (numpy), which "
                            "makes (N, 1, 28, 28) (or train a module:factory model, which takes samples as stored)")


@pytest.mark.parametrize("model", IMAGE_MODELS)
def test_the_shape_the_hint_names_is_the_one_the_model_then_takes(tmp_path: Path, model: str) -> None:
    """The hint's fix, done: the same arrays with x[:, None] give the model (1, 28, 28) inputs."""
    with np.load(_images(tmp_path / "hw.npz", 28, 28)) as f:
        arrays = {k: f[k][:, None] if k.startswith("x") else f[k] for k in f.files}
    np.savez(tmp_path / "fixed.npz", **arrays)
    spec = spec_for(model, f"npz:{tmp_path / 'fixed.npz'}")
    assert spec.input_shape == (1, 28, 28)
    train, _ = for_model(spec, f"npz:{tmp_path / 'fixed.npz'}", 0)
    assert train.tensors[0].shape == (6, 1, 28, 28)


def test_simulate_says_how_to_add_the_channel_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _images(tmp_path / "hw.npz", 12, 20)
    assert main(["simulate", "--dataset", f"npz:{path}", "--model", "cnn", "--clients", "2", "--rounds", "1",
                 "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"splitfed simulate: error: npz:{path}: samples are (12, 20), with no channel axis; model 'cnn' takes "
        "(C, H, W), here (1, 12, 20): store x_train and x_test as x[:, None] (numpy), which makes (N, 1, 12, 20) "
        "(or train a module:factory model, which takes samples as stored)")
    assert not (tmp_path / "run").exists()


def test_a_vector_model_still_takes_such_images_flat(tmp_path: Path) -> None:
    path = _images(tmp_path / "hw.npz", 28, 28)
    spec = spec_for("mlp", f"npz:{path}")
    assert spec.input_shape == (784,)
    assert for_model(spec, f"npz:{path}", 0)[0].tensors[0].shape == (6, 784)


# ---------------------------------------------------------------- tokens above the vocab


def test_tokens_above_the_vocab_are_told_the_vocab_that_takes_them(tmp_path: Path) -> None:
    """Before: ``tokens must lie in 0..16, found 0..99``, with no way out."""
    path = _tokens(tmp_path / "t.npz", 99)
    with pytest.raises(ConfigError) as e:
        read_npz(path, resolve_spec("transformer"))
    assert str(e.value) == (f"dataset npz:{path}: x_train: tokens must lie in 0..16, found 0..99: pass --vocab 100 "
                            "(in a config file, vocab = 100), the largest token + 1")


def test_the_vocab_the_hint_names_is_taken_by_flag_and_config_key(tmp_path: Path) -> None:
    path = _tokens(tmp_path / "t.npz", 99)
    validate(RunSettings(model="transformer", dataset=f"npz:{path}", clients=2, vocab=100))
    config = tmp_path / "run.toml"
    config.write_text(f'model = "transformer"\ndataset = "npz:{path}"\nclients = 2\nvocab = 100\n')
    settings = RunSettings.from_toml(config)
    validate(settings)
    assert settings.spec.vocab == 100


def test_negative_tokens_get_no_vocab_hint(tmp_path: Path) -> None:
    """No vocab takes a token below 0."""
    path = _tokens(tmp_path / "t.npz", 99, low=-1)
    with pytest.raises(ConfigError) as e:
        read_npz(path, resolve_spec("transformer"))
    assert str(e.value) == f"dataset npz:{path}: x_train: tokens must lie in 0..16, found -1..99"


def test_tokens_beyond_any_vocab_get_no_vocab_hint(tmp_path: Path) -> None:
    """splitfed builds at most 2**24 tokens: a --vocab above it would be refused."""
    path = _tokens(tmp_path / "t.npz", 1 << 24)
    with pytest.raises(ConfigError) as e:
        read_npz(path, resolve_spec("transformer"))
    assert str(e.value) == f"dataset npz:{path}: x_train: tokens must lie in 0..16, found 0..16777216"
