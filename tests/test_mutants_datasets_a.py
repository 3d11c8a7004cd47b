"""The first half of the datasets module (splitfed/data/datasets.py) where a mutation run found it unpinned:
a kept digits split with a label outside 0..9 is computed again; ``test_fraction`` refuses exactly 0 and 1 with
its own words; the digits split of a seed is its own (seeds whose derived seeds collide in fewer than 32 bits
still split differently); ``synthetic`` takes 0 samples and 1 class, refuses 0 classes, and is exactly the
documented teacher and draws (teacher of ``seed`` alone, inputs of each part a stream of their own, tokens from 0,
columns scaled alike); IDX headers of exactly 3, 4 and 5 bytes and of exactly ``MAX_IDX_DIMS`` dimensions; an
MNIST label of 10; an empty CIFAR-10 batch. Every file is written here from its format's specification."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from splitfed.data import cifar10, mnist
from splitfed.data._seed import derive_seed
from splitfed.data.datasets import MAX_IDX_DIMS, digits, read_idx, synthetic
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec
from tests.data_fixtures import idx_bytes

# ---------------------------------------------------------------- digits


def _same_split(a, b) -> bool:
    return all(torch.equal(x, y) for da, db in zip(a, b, strict=True)
               for x, y in zip(da.tensors, db.tensors, strict=True))


@pytest.mark.parametrize(("key", "label"), [("y_train", 10), ("y_test", 10), ("y_train", -1), ("y_test", 255)])
def test_a_kept_split_with_a_label_outside_0_to_9_is_computed_again(own_cache: Path, key: str, label: int) -> None:
    """The digits have classes 0..9: an entry holding another label (int64 and 1-D, as a sound one) is not
    the split, and a run would train on a class no model has."""
    want = digits(seed=3)
    (entry,) = sorted((own_cache / "digits").glob("*.npz"))
    kept = dict(np.load(entry))
    kept[key] = kept[key].copy()
    kept[key][0] = label
    np.savez(entry, **kept)
    got = digits(seed=3)
    assert _same_split(got, want)
    assert all(0 <= int(d.tensors[1].min()) and int(d.tensors[1].max()) <= 9 for d in got)
    assert int(np.load(entry)[key][0]) != label  # replaced by the sound split


@pytest.mark.parametrize("fraction", [0, 0.0, 1, 1.0, 1.5, 2, -0.5])
def test_test_fraction_outside_the_open_interval_is_refused_in_its_own_words(fraction: float) -> None:
    """0 and 1 themselves are outside (0, 1): the refusal says so, not scikit-learn's split."""
    with pytest.raises(ConfigError, match=rf"^test_fraction must be in \(0, 1\), got {fraction}$"):
        digits(test_fraction=fraction)


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95])
def test_test_fraction_inside_the_interval_splits_that_share(fraction: float) -> None:
    train, test = digits(test_fraction=fraction)
    assert len(train) + len(test) == 1797
    assert len(test) == math.ceil(fraction * 1797)


@pytest.mark.parametrize(("a", "b"), [(9, 10), (27752, 57003)])
def test_seeds_whose_derived_seeds_share_low_bits_split_differently(a: int, b: int) -> None:
    """Seeds 9 and 10 derive seeds equal modulo 64, 27752 and 57003 ones equal modulo 2**31 (not 2**32): each
    seed is still its own split, as any two seeds' are (a split seeded by fewer bits would repeat)."""
    low = 6 if a == 9 else 31
    assert derive_seed(a) % 2**low == derive_seed(b) % 2**low  # why these seeds
    (tra, tea), (trb, teb) = digits(seed=a), digits(seed=b)
    assert not torch.equal(tea.tensors[0], teb.tensors[0])
    assert not torch.equal(tra.tensors[1], trb.tensors[1])
    assert _same_split(digits(seed=a), (tra, tea))


# ---------------------------------------------------------------- synthetic

FLOAT = ModelSpec("float", (2, 3), num_classes=4)
TOKENS = ModelSpec("tokens", (7,), num_classes=3, vocab=5)


def _documented(spec: ModelSpec, n: int, seed: int, part: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The docstring's construction, one stream per purpose: the teacher from ``derive_seed(seed, 0)``, the
    inputs of part ``p`` from ``derive_seed(seed, p + 1)``; float inputs N(0, 1) and a teacher linear in them,
    token inputs uniform in [0, vocab) and a teacher linear in their counts, centred; columns of unit norm."""
    teacher = torch.Generator().manual_seed(derive_seed(seed, 0))
    draw = torch.Generator().manual_seed(derive_seed(seed, part + 1))
    d, c = math.prod(spec.input_shape), spec.num_classes
    if spec.vocab:
        w = torch.randn(spec.vocab, c, generator=teacher)
        w = w - w.mean(dim=0)
        x = torch.randint(0, spec.vocab, (n, *spec.input_shape), generator=draw)
        features = torch.nn.functional.one_hot(x.reshape(n, d), spec.vocab).sum(1).float()
    else:
        w = torch.randn(d, c, generator=teacher)
        x = torch.randn(n, *spec.input_shape, generator=draw)
        features = x.reshape(n, d)
    return x, (features @ (w / w.norm(dim=0))).argmax(dim=1)


@pytest.mark.parametrize("spec", [FLOAT, TOKENS])
@pytest.mark.parametrize(("seed", "part"), [(0, 0), (0, 1), (5, 0), (5, 2)])
def test_synthetic_is_the_documented_teacher_and_draw(spec: ModelSpec, seed: int, part: int) -> None:
    """A run's synthetic data is reproducible from its seed across versions: the same streams, in the same
    roles (a draw that reused the teacher's stream, or another part's, would be another data set)."""
    x, y = synthetic(spec, 200, seed=seed, part=part).tensors
    want_x, want_y = _documented(spec, 200, seed, part)
    assert torch.equal(x, want_x)
    assert torch.equal(y, want_y)


def test_synthetic_parts_are_distinct_draws_of_one_teacher() -> None:
    """Part 0 and part 1 are different inputs; neither is the teacher's own stream."""
    a, b = (synthetic(FLOAT, 50, seed=1, part=p).tensors[0] for p in (0, 1))
    assert not torch.equal(a, b)
    teacher = torch.randn(6, 4, generator=torch.Generator().manual_seed(derive_seed(1, 0))).flatten()
    for x in (a, b):
        assert not torch.equal(x.flatten()[:24], teacher)


def test_synthetic_teacher_is_independent_of_the_inputs() -> None:
    """One feature, two classes: a teacher drawn from the inputs' own stream would give the first sample class 0
    for every seed (its weight is the sample itself); an independent one does not."""
    spec = ModelSpec("one", (1,), num_classes=2)
    first = {int(synthetic(spec, 4, seed=s).tensors[1][0]) for s in range(40)}
    assert first == {0, 1}


def test_synthetic_tokens_cover_the_whole_vocabulary() -> None:
    """Tokens are uniform in [0, vocab): 0 is one of them."""
    x = synthetic(TOKENS, 300, seed=2).tensors[0]
    assert set(x.unique().tolist()) == set(range(TOKENS.vocab))


@pytest.mark.parametrize("spec", [FLOAT, TOKENS])
def test_synthetic_of_zero_samples_is_empty_not_refused(spec: ModelSpec) -> None:
    x, y = synthetic(spec, 0, seed=0).tensors
    assert x.shape == (0, *spec.input_shape) and x.dtype == spec.input_dtype
    assert y.shape == (0,) and y.dtype == torch.int64


@pytest.mark.parametrize("vocab", [0, 5])
def test_synthetic_of_one_class_labels_every_sample_0(vocab: int) -> None:
    spec = ModelSpec("one-class", (4,), num_classes=1, vocab=vocab)
    x, y = synthetic(spec, 30, seed=0).tensors
    assert len(x) == 30 and torch.equal(y, torch.zeros(30, dtype=torch.int64))


@pytest.mark.parametrize("vocab", [0, 5])
def test_synthetic_of_zero_classes_is_refused(vocab: int) -> None:
    spec = ModelSpec("none", (4,), num_classes=0, vocab=vocab)
    with pytest.raises(ConfigError, match=r"^model 'none' has 0 classes; need at least 1$"):
        synthetic(spec, 10, seed=0)


# ---------------------------------------------------------------- IDX files (MNIST)


def test_an_idx_file_of_three_bytes_is_refused_as_no_idx_file(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(bytes([0, 0, 0x08]))
    with pytest.raises(ConfigError, match=r"short is not an IDX file \(bad magic number\)$"):
        read_idx(path)


def test_an_idx_header_of_four_bytes_is_a_scalar_missing_its_byte(tmp_path: Path) -> None:
    """Four bytes are a whole magic number (0 dimensions): what is missing is the scalar's data byte."""
    path = tmp_path / "scalar"
    path.write_bytes(bytes([0, 0, 0x08, 0]))
    with pytest.raises(ConfigError, match=r"IDX header says shape \(\) \(1 bytes\), file holds 0 data bytes$"):
        read_idx(path)
    path.write_bytes(bytes([0, 0, 0x08, 0, 7]))
    a = read_idx(path)
    assert a.shape == () and int(a) == 7


@pytest.mark.parametrize("second", [1, 8])
def test_an_idx_magic_with_a_nonzero_second_byte_is_refused(tmp_path: Path, second: int) -> None:
    path = tmp_path / "bad"
    path.write_bytes(bytes([0, second, 0x08, 1]) + struct.pack(">I", 2) + bytes([1, 2]))
    with pytest.raises(ConfigError, match=r"bad is not an IDX file \(bad magic number\)$"):
        read_idx(path)


def test_an_idx_array_of_exactly_max_dims_is_read(tmp_path: Path) -> None:
    a = np.arange(2 * 3, dtype=np.uint8).reshape((2, 1, 3) + (1,) * (MAX_IDX_DIMS - 3))
    assert a.ndim == MAX_IDX_DIMS
    (tmp_path / "deep").write_bytes(idx_bytes(a))
    got = read_idx(tmp_path / "deep")
    assert got.shape == a.shape and np.array_equal(got, a)
    deeper = a[..., None]
    (tmp_path / "deeper").write_bytes(idx_bytes(deeper))
    with pytest.raises(ConfigError, match=rf"IDX header says {MAX_IDX_DIMS + 1} dimensions; at most {MAX_IDX_DIMS}"):
        read_idx(tmp_path / "deeper")


def _write_mnist(root: Path, train_labels: list[int]) -> None:
    n = len(train_labels)
    files = {"train-images-idx3-ubyte": np.zeros((n, 28, 28)), "train-labels-idx1-ubyte": np.array(train_labels),
             "t10k-images-idx3-ubyte": np.zeros((2, 28, 28)), "t10k-labels-idx1-ubyte": np.array([0, 9])}
    for name, a in files.items():
        (root / name).write_bytes(idx_bytes(a))


def test_an_mnist_label_of_10_is_refused_naming_the_file(tmp_path: Path) -> None:
    _write_mnist(tmp_path, [3, 10, 9])
    with pytest.raises(ConfigError, match=r"train-labels-idx1-ubyte: label 10 out of range 0\.\.9$"):
        mnist(tmp_path)
    _write_mnist(tmp_path, [3, 0, 9])
    train, test = mnist(tmp_path)
    assert train.tensors[1].tolist() == [3, 0, 9] and test.tensors[1].tolist() == [0, 9]


# ---------------------------------------------------------------- CIFAR-10 (binary)

RECORD = 1 + 3 * 32 * 32


def test_an_empty_cifar_batch_is_refused_naming_it(tmp_path: Path) -> None:
    """An empty file holds no record: refused as a file of 0 bytes, not a traceback of an empty array."""
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    (folder / "data_batch_1.bin").write_bytes(b"")
    (folder / "test_batch.bin").write_bytes(bytes([4]) + bytes(RECORD - 1))
    with pytest.raises(ConfigError, match=rf"data_batch_1\.bin: 0 bytes is not a whole number of {RECORD}-byte"):
        cifar10(tmp_path)
    (folder / "data_batch_1.bin").write_bytes((bytes([1]) + bytes(RECORD - 1)) * 2 + bytes([9]) + bytes(RECORD - 1))
    train, test = cifar10(tmp_path)
    assert train.tensors[1].tolist() == [1, 1, 9] and test.tensors[1].tolist() == [4]
    assert train.tensors[0].shape == (3, 3, 32, 32)
