"""splitfed/data/datasets.py (CIFAR-10 to the end), pinned where a mutation run found nothing watching: the
CIFAR-10 warning about missing batches (said once, never when all five are there) and the pickle hint (only for a
real ``cifar-10-batches-py`` folder); ``read_npz``'s refusals at their edges (a 1-D array, float tokens, a token
equal to vocab, a label equal to the class count); which strings read which files (``dataset_files``,
``sample_shape``, ``sample_classes``: only ``npz:`` reads an .npz, never with pickle); the class count an .npz gives
at its edges (all 0, 0..1, MAX_CLASSES - 1 vs MAX_CLASSES) and the unused-class warning's "+N more" from exactly
6 unused classes; the channel-last rule's edges; the cnn's own shape for a flat .npz; the classes MNIST and
CIFAR-10 need; the flat CIFAR-10 test set; and the synthetic train/test sizes and draws."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from splitfed.data import cifar10
from splitfed.data.datasets import (
    dataset_digest,
    dataset_files,
    for_model,
    read_npz,
    sample_classes,
    sample_shape,
    spec_for,
    synthetic,
)
from splitfed.errors import ConfigError
from splitfed.models.zoo import MAX_CLASSES, ModelSpec, resolve_spec

LOGGER = "splitfed.data.datasets"


def _npz(path: Path, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray | None = None,
         y_test: np.ndarray | None = None) -> Path:
    np.savez(path, x_train=x_train, y_train=y_train,
             x_test=x_train if x_test is None else x_test, y_test=y_train if y_test is None else y_test)
    return path


def _labels_file(path: Path, y_train: list[int], y_test: list[int] | None = None) -> str:
    """An npz dataset of 1x8x8 float images with these labels."""
    ytr = np.array(y_train, np.int64)
    yte = ytr if y_test is None else np.array(y_test, np.int64)
    _npz(path, np.zeros((len(ytr), 1, 8, 8), np.float32), ytr, np.zeros((len(yte), 1, 8, 8), np.float32), yte)
    return f"npz:{path}"


def _cifar_records(labels: list[int]) -> bytes:
    return b"".join(bytes([label]) + bytes([label * 20]) * 3072 for label in labels)


def _write_cifar(root: Path, batches: tuple[int, ...] = (1, 2)) -> Path:
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for i in batches:
        (folder / f"data_batch_{i}.bin").write_bytes(_cifar_records([i % 10]))
    (folder / "test_batch.bin").write_bytes(_cifar_records([7]))
    return folder


# ---------------------------------------------------------------- CIFAR-10


def test_cifar_warns_of_missing_batches_once_and_never_when_all_five_are_there(tmp_path: Path, caplog) -> None:
    """A subset of the batches is said once per folder; a whole copy is not warned about at all."""
    _write_cifar(tmp_path / "whole", batches=(1, 2, 3, 4, 5))
    part = _write_cifar(tmp_path / "part", batches=(1, 3))
    with caplog.at_level("WARNING", logger=LOGGER):
        train, _ = cifar10(tmp_path / "whole")
        assert train.tensors[1].tolist() == [1, 2, 3, 4, 5]
        assert not caplog.records
        cifar10(tmp_path / "part")
        cifar10(part)
    assert [r.getMessage() for r in caplog.records] == [
        f"cifar10: {part} has no data_batch_2.bin, data_batch_4.bin, data_batch_5.bin: training on 2 of the 5 batches"]


def test_the_pickle_hint_names_only_a_real_python_cifar_folder(tmp_path: Path) -> None:
    """An empty folder, or a *file* named cifar-10-batches-py, is not called the python version."""
    (tmp_path / "data").mkdir()
    with pytest.raises(ConfigError, match=r"missing .*data_batch_1\.bin") as e:
        cifar10(tmp_path / "data")
    assert "python (pickle) version" not in str(e.value)
    (tmp_path / "data" / "cifar-10-batches-py").write_bytes(b"not a folder")
    with pytest.raises(ConfigError, match=r"missing .*data_batch_1\.bin") as e:
        cifar10(tmp_path / "data")
    assert "python (pickle) version" not in str(e.value)


def test_a_vector_model_gets_cifar_flat_in_train_and_test(tmp_path: Path) -> None:
    """Both sets are flattened to (N, 3072), not only the training set."""
    _write_cifar(tmp_path)
    train, test = for_model(resolve_spec("mlp", input_shape=(3072,)), f"cifar10:{tmp_path}", seed=0)
    assert tuple(train.tensors[0].shape) == (2, 3072) and tuple(test.tensors[0].shape) == (1, 3072)
    assert test.tensors[1].tolist() == [7]


@pytest.mark.parametrize("name, shape", [("mnist", (1, 28, 28)), ("cifar10", (3, 32, 32))])
def test_mnist_and_cifar_need_ten_outputs_before_any_file_is_read(tmp_path: Path, name: str,
                                                                   shape: tuple[int, ...]) -> None:
    """A model of 9 outputs on a 10-class dataset is refused as such (not as missing files)."""
    spec = resolve_spec("cnn", input_shape=shape, num_classes=9)
    with pytest.raises(ConfigError, match=r"has 10 classes; model 'cnn' has only 9 outputs"):
        for_model(spec, f"{name}:{tmp_path / 'absent'}", seed=0)


# ---------------------------------------------------------------- read_npz's checks at their edges


def test_a_one_dimensional_input_array_is_refused_as_such(tmp_path: Path) -> None:
    path = _npz(tmp_path / "d.npz", np.zeros(5, np.float32), np.zeros(5, np.int64))
    with pytest.raises(ConfigError, match=r"x_train: want one or more samples, shape \(N, \.\.\.\), got \(5,\)"):
        read_npz(path, ModelSpec("mlp", (64,), 10))


def test_token_models_refuse_float_tokens_and_a_token_equal_to_vocab(tmp_path: Path) -> None:
    spec = ModelSpec("transformer", (4,), 3, vocab=5)
    y = np.zeros(2, np.int64)
    floats = _npz(tmp_path / "f.npz", np.zeros((2, 4), np.float32), y)
    with pytest.raises(ConfigError, match=r"x_train: model 'transformer' takes int tokens of shape \(4,\), "
                                          r"got float32 \(4,\)"):
        read_npz(floats, spec)
    top = _npz(tmp_path / "t.npz", np.array([[0, 1, 2, 5], [4, 4, 4, 4]]), y)
    with pytest.raises(ConfigError, match=r"x_train: tokens must lie in 0\.\.4, found 0\.\.5"):
        read_npz(top, spec)
    ok = _npz(tmp_path / "ok.npz", np.array([[0, 1, 2, 4], [4, 4, 4, 4]]), y)
    assert read_npz(ok, spec)[0].tensors[0].tolist() == [[0, 1, 2, 4], [4, 4, 4, 4]]


def test_a_label_equal_to_the_class_count_is_refused(tmp_path: Path) -> None:
    spec = ModelSpec("mlp", (2,), 3)
    x = np.zeros((2, 2), np.float32)
    bad = _npz(tmp_path / "b.npz", x, np.array([0, 3]))
    with pytest.raises(ConfigError, match=r"y_train: labels must lie in 0\.\.2 \(model 'mlp' has 3 outputs\), "
                                          r"found 0\.\.3"):
        read_npz(bad, spec)
    assert read_npz(_npz(tmp_path / "ok.npz", x, np.array([0, 2])), spec)[0].tensors[1].tolist() == [0, 2]


# ---------------------------------------------------------------- which strings read which files


def test_dataset_files_is_an_empty_list_for_datasets_of_no_files(tmp_path: Path) -> None:
    """``digits``, a kind with an empty path and an unknown kind read no file: an empty list, digest ""."""
    for dataset in ("digits", "synthetic", "npz:", "npz:  ", "mnist:", f"imagenet:{tmp_path}", f"digits:{tmp_path}"):
        assert dataset_files(dataset) == [], dataset
        assert dataset_digest(dataset) == "", dataset
    assert dataset_files(f"npz:{tmp_path / 'd.npz'}") == [tmp_path / "d.npz"]


def test_sample_shape_of_digits_and_only_npz_reads_an_npz(tmp_path: Path) -> None:
    assert sample_shape("digits") == (1, 8, 8) and sample_shape(" Digits ") == (1, 8, 8)
    assert sample_shape("digits:x") is None
    dataset = _labels_file(tmp_path / "d.npz", [0, 1, 2, 3, 4, 5])
    path = dataset.partition(":")[2]
    assert sample_shape(dataset) == (1, 8, 8) and sample_classes(dataset) == 6
    for other in (f"imagenet:{path}", f"synthetic:{path}"):
        assert sample_shape(other) is None and sample_classes(other) is None


def _mkdir_on_unpickle(folder: str) -> object:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.mkdir, (folder,)

    a = np.empty(2, dtype=object)
    a[0], a[1] = Evil(), 1
    return a


def test_the_class_count_never_unpickles_an_object_array(tmp_path: Path) -> None:
    """Labels stored as a pickled object array are not loaded (loading them would run the pickle's code)."""
    marker = tmp_path / "ran"
    path = tmp_path / "d.npz"
    np.savez(path, x_train=np.zeros((2, 1, 8, 8), np.float32), y_train=_mkdir_on_unpickle(str(marker)),
             x_test=np.zeros((2, 1, 8, 8), np.float32), y_test=np.array([0, 1]))
    assert sample_classes(f"npz:{path}") is None
    assert not marker.exists()


def test_float_or_empty_labels_give_no_class_count(tmp_path: Path) -> None:
    """Left to read_npz to name; neither counted nor a traceback."""
    x = np.zeros((3, 1, 8, 8), np.float32)
    floats = _npz(tmp_path / "f.npz", x, np.array([0.0, 4.0, 5.0]))
    assert sample_classes(f"npz:{floats}") is None
    empty = _npz(tmp_path / "e.npz", x, np.array([0, 4, 5]), x[:0], np.zeros(0, np.int64))
    assert sample_classes(f"npz:{empty}") is None


# ---------------------------------------------------------------- the class count at its edges


@pytest.mark.parametrize("labels, classes", [([0, 0, 0], None), ([0, 1, 1], 2), ([1, 2, 2], 3), ([0, 5, 3], 6)])
def test_the_class_count_is_the_top_label_plus_one_from_two_classes(tmp_path: Path, labels: list[int],
                                                                    classes: int | None) -> None:
    assert sample_classes(_labels_file(tmp_path / "d.npz", labels)) == classes


def test_the_top_label_may_be_max_classes_minus_one_not_max_classes(tmp_path: Path, caplog) -> None:
    with caplog.at_level("WARNING", logger=LOGGER):
        assert sample_classes(_labels_file(tmp_path / "ok.npz", [0, MAX_CLASSES - 1])) == MAX_CLASSES
    over = _labels_file(tmp_path / "over.npz", [0, MAX_CLASSES])
    with pytest.raises(ConfigError, match=rf"label {MAX_CLASSES} would give the model {MAX_CLASSES + 1:,} outputs; "
                                          rf"splitfed builds at most {MAX_CLASSES:,} classes"):
        sample_classes(over)


@pytest.mark.parametrize("top, shown", [(6, "1, 2, 3, 4, 5: relabel"), (7, "1, 2, 3, 4, 5 (+1 more): relabel"),
                                        (8, "1, 2, 3, 4, 5 (+2 more): relabel")])
def test_the_unused_class_warning_shows_five_then_how_many_more(tmp_path: Path, caplog, top: int, shown: str) -> None:
    dataset = _labels_file(tmp_path / "d.npz", [0, top])
    with caplog.at_level("WARNING", logger=LOGGER):
        assert sample_classes(dataset) == top + 1
    (rec,) = caplog.records
    assert f"labels run to {top}, so the model gets {top + 1} outputs, but no sample has class {shown} to 0..1 " \
        in rec.getMessage()


# ---------------------------------------------------------------- the model's shape for an npz


@pytest.mark.parametrize("stored, refused", [
    ((32, 3, 3), True),   # first not 1/3/4, last 3, 32 > 3: the middle is not looked at
    ((8, 1, 1), True),
    ((2, 8, 1), True),    # 2 is no channel count that the rule leaves alone
    ((3, 8, 1), False),   # 3 channels of 8x1
    ((4, 8, 3), False),
    ((5, 8, 5), False),   # last not 1/3/4
])
def test_the_channel_last_rule_at_its_edges(tmp_path: Path, stored: tuple[int, ...], refused: bool) -> None:
    dataset = f"npz:{_npz(tmp_path / 'd.npz', np.zeros((2, *stored), np.float32), np.array([0, 1]))}"
    if refused:
        with pytest.raises(ConfigError, match=r"looks channel-last"):
            spec_for("cnn", dataset)
    else:
        assert spec_for("cnn", dataset) == ModelSpec("cnn", stored, 2)


def test_a_zoo_image_model_on_flat_npz_samples_keeps_its_own_shape(tmp_path: Path) -> None:
    dataset = _npz(tmp_path / "d.npz", np.zeros((6, 64), np.float32), np.arange(6))
    assert spec_for("cnn", f"npz:{dataset}") == ModelSpec("cnn", (1, 8, 8), 6)


# ---------------------------------------------------------------- synthetic


@pytest.mark.parametrize("n, n_test", [(1, 1), (3, 1), (4, 1), (8, 2), (16, 4)])
def test_synthetic_test_part_is_a_quarter_and_another_draw(n: int, n_test: int) -> None:
    spec = resolve_spec("mlp")
    train, test = for_model(spec, "synthetic", seed=3, n_synthetic=n)
    assert len(train) == n and len(test) == n_test
    for got, want in ((train, synthetic(spec, n, 3, part=0)), (test, synthetic(spec, n_test, 3, part=1))):
        assert all(torch.equal(a, b) for a, b in zip(got.tensors, want.tensors, strict=True))
    assert not torch.equal(train.tensors[0][:1], test.tensors[0][:1])
