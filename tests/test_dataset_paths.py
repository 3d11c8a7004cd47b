"""Where a dataset spec's path leads: ``~`` is the user's home in every spec and in a config file (no shell
expands it after ``mnist:``), a CIFAR-10 copy is read with its batches directly in PATH as in
``PATH/cifar-10-batches-bin``, and an ``npz:`` path that is a folder or no regular file is called what it is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from splitfed.data.datasets import (
    cifar10,
    dataset_digest,
    dataset_files,
    for_model,
    read_npz,
    sample_classes,
    sample_shape,
    spec_for,
)
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec
from splitfed.sim.runner import validate
from tests.data_fixtures import idx_bytes

CNN = resolve_spec("cnn")
NEVER = "splitfed never downloads: put the files there yourself"


def _mnist(folder: Path) -> Path:
    """The four IDX files of a 3-sample train and 2-sample test MNIST in ``folder``."""
    folder.mkdir(parents=True)
    for prefix, n in (("train", 3), ("t10k", 2)):
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(idx_bytes(np.full((n, 28, 28), 7)))
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(np.arange(n)))
    return folder


def _npz(path: Path) -> Path:
    """8 train and 4 test samples shaped as digits, labels 0..3."""
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.random((8, 1, 8, 8), dtype=np.float32), y_train=np.arange(8) % 4,
             x_test=rng.random((4, 1, 8, 8), dtype=np.float32), y_test=np.arange(4))
    return path


def _cifar_records(labels: list[int]) -> bytes:
    return b"".join(bytes([label]) + bytes([label * 20]) * 3072 for label in labels)


def _cifar(folder: Path) -> Path:
    """Two training batches (labels 1; 2) and a test batch (label 7) in ``folder``."""
    folder.mkdir(parents=True)
    (folder / "data_batch_1.bin").write_bytes(_cifar_records([1]))
    (folder / "data_batch_2.bin").write_bytes(_cifar_records([2]))
    (folder / "test_batch.bin").write_bytes(_cifar_records([7]))
    return folder


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# ---------------------------------------------------------------- ~ in a spec


def test_tilde_in_an_mnist_spec_is_the_home_folder(home: Path) -> None:
    """Before: ``mnist: missing ~/mn/train-images-idx3-ubyte[.gz] (or train-images.idx3-ubyte)``."""
    _mnist(home / "mn")
    spec = spec_for("cnn", "mnist:~/mn")
    assert spec.input_shape == (1, 28, 28)
    train, test = for_model(spec, "mnist:~/mn", 0)
    assert train.tensors[1].tolist() == [0, 1, 2] and test.tensors[1].tolist() == [0, 1]
    assert dataset_files("mnist:~/mn")[0] == home / "mn" / "train-images-idx3-ubyte"


def test_tilde_in_an_npz_spec_is_the_home_folder(home: Path) -> None:
    """Before: ``dataset npz:~/d.npz: no such file`` from the reader; the shape and classes were not read."""
    home.mkdir()
    path = _npz(home / "d.npz")
    assert sample_shape("npz:~/d.npz") == (1, 8, 8) and sample_classes("npz:~/d.npz") == 4
    assert spec_for("cnn", "npz:~/d.npz").num_classes == 4
    train, test = for_model(CNN, " npz: ~/d.npz ", 0)
    assert len(train) == 8 and len(test) == 4
    assert dataset_files("npz:~/d.npz") == [path]
    assert dataset_digest("npz:~/d.npz") == dataset_digest(f"npz:{path}")


def test_tilde_in_a_cifar_spec_is_the_home_folder(home: Path) -> None:
    _cifar(home / "c" / "cifar-10-batches-bin")
    train, test = for_model(resolve_spec("cnn", (3, 32, 32)), "cifar10:~/c", 0)
    assert train.tensors[1].tolist() == [1, 2] and test.tensors[1].tolist() == [7]
    assert dataset_files("cifar10:~/c")[-1] == home / "c" / "cifar-10-batches-bin" / "test_batch.bin"


def test_tilde_in_a_config_files_dataset_is_the_home_folder(home: Path, tmp_path: Path) -> None:
    """A config file's value meets no shell: it was refused as missing ``~/d.npz``."""
    home.mkdir()
    _npz(home / "d.npz")
    config = tmp_path / "run.toml"
    config.write_text('model = "cnn"\ndataset = "npz:~/d.npz"\nclients = 2\nrounds = 1\n')
    settings = RunSettings.from_toml(config)
    assert settings.dataset == "npz:~/d.npz"
    validate(settings)  # reads the test set and a client's samples
    assert settings.spec.num_classes == 4


def test_an_unknown_users_tilde_is_refused_as_missing_by_name(tmp_path: Path) -> None:
    """``~nosuchuser`` cannot be expanded (Path.expanduser raises RuntimeError): the path as written is missing."""
    with pytest.raises(ConfigError) as e:
        for_model(CNN, "npz:~splitfed-no-such-user/d.npz", 0)
    assert str(e.value) == f"dataset npz:~splitfed-no-such-user/d.npz: no such file; {NEVER}"


# ---------------------------------------------------------------- CIFAR-10 batches directly in PATH


def test_cifar_batches_directly_in_a_folder_of_another_name_are_read(tmp_path: Path) -> None:
    """Before: ``cifar10: missing mycifar/cifar-10-batches-bin/data_batch_1.bin``, though MNIST takes its files
    directly in PATH."""
    folder = _cifar(tmp_path / "mycifar")
    train, test = cifar10(folder)
    assert train.tensors[1].tolist() == [1, 2] and test.tensors[1].tolist() == [7]
    assert train.tensors[0].shape == (2, 3, 32, 32)
    assert dataset_files(f"cifar10:{folder}") == [folder / "data_batch_1.bin", folder / "data_batch_2.bin",
                                                  folder / "test_batch.bin"]


def test_cifar_prefers_the_archives_folder_when_both_hold_batches(tmp_path: Path) -> None:
    _cifar(tmp_path / "c")
    inner = tmp_path / "c" / "cifar-10-batches-bin"
    inner.mkdir()
    (inner / "data_batch_1.bin").write_bytes(_cifar_records([5]))
    (inner / "test_batch.bin").write_bytes(_cifar_records([6]))
    train, test = cifar10(tmp_path / "c")
    assert train.tensors[1].tolist() == [5] and test.tensors[1].tolist() == [6]


def test_missing_cifar_batches_name_both_places_looked_in(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as e:
        cifar10(tmp_path / "empty")
    assert str(e.value) == (f"cifar10: missing {tmp_path}/empty/cifar-10-batches-bin/data_batch_1.bin or "
                            f"{tmp_path}/empty/data_batch_1.bin (want data_batch_1..5.bin and test_batch.bin); "
                            f"{NEVER}")
    named = tmp_path / "cifar-10-batches-bin"  # the archive's folder itself: only it is looked in
    named.mkdir()
    with pytest.raises(ConfigError) as e:
        cifar10(named)
    assert str(e.value) == (f"cifar10: missing {named}/data_batch_1.bin (want data_batch_1..5.bin and "
                            f"test_batch.bin); {NEVER}")


def test_a_missing_test_batch_beside_direct_batches_is_named(tmp_path: Path) -> None:
    folder = _cifar(tmp_path / "mycifar")
    (folder / "test_batch.bin").unlink()
    with pytest.raises(ConfigError) as e:
        cifar10(folder)
    assert str(e.value) == f"cifar10: missing {folder}/test_batch.bin; {NEVER}"


# ---------------------------------------------------------------- npz: a folder, not a regular file


def test_an_npz_spec_naming_a_folder_says_it_is_a_folder(tmp_path: Path) -> None:
    """Before: ``no such file``, of a folder that is there."""
    _npz(tmp_path / "d.npz")
    with pytest.raises(ConfigError) as e:
        for_model(CNN, f"npz:{tmp_path}", 0)
    assert str(e.value) == (f"dataset npz:{tmp_path}: a folder, not a file: name the .npz file itself "
                            f"(npz:FOLDER/NAME.npz)")


def test_an_npz_spec_naming_no_regular_file_says_so(tmp_path: Path) -> None:
    """Before: ``dataset npz:/dev/null: no such file``."""
    with pytest.raises(ConfigError) as e:
        read_npz("/dev/null", CNN)
    assert str(e.value) == ("dataset npz:/dev/null: not a regular file, so not an .npz archive (a zip of arrays, "
                            "as numpy.savez writes): name the .npz file itself")
    assert sample_shape("npz:/dev/null") is None and sample_classes("npz:/dev/null") is None
