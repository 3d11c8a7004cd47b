"""An audit of the data layer against independent references, as a user who brings real files.

Every file here is written from its format's specification with ``struct`` / plain numpy (never
with splitfed's helpers), and every loaded tensor is compared with what the specification says it
holds. The cases marked "before:" failed on the code as it was.
"""

from __future__ import annotations

import gzip
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cli import main
from splitfed.data import cifar10, mnist, partition
from splitfed.data.datasets import (
    dataset_digest,
    read_idx,
    read_npz,
    sample_classes,
    sample_shape,
    spec_for,
)
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec

CNN = resolve_spec("cnn")  # (1, 8, 8) images, 10 classes

# ---------------------------------------------------------------- reference writers (from the specs)

MNIST_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """IDX: magic 0x0000TTDD big-endian (TT: 0x08 unsigned byte, DD: dimensions), each dimension a
    big-endian uint32, then the data row-major."""
    magic = struct.pack(">I", (type_code << 8) | array.ndim)
    return magic + b"".join(struct.pack(">I", d) for d in array.shape) + array.astype(np.uint8).tobytes()


def write_mnist(folder: Path, n_train: int = 7, n_test: int = 3, gz: bool = False,
                seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images_name, labels_name = MNIST_NAMES[split]
        arrays[images_name] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        arrays[labels_name] = rng.integers(0, 10, n, dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        data = idx_bytes(a)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


def mnist_reference(images: np.ndarray) -> np.ndarray:
    """The normalisation ``mnist`` documents: pixels / 255, then (p - 0.1307) / 0.3081, as (N, 1, 28, 28)."""
    return ((images.astype(np.float64) / 255.0 - 0.1307) / 0.3081)[:, None]


def corrupt_deflate(data: bytes, start: int) -> bytes:
    """``data`` with the deflate block at ``start`` given the reserved block type 11: zlib refuses it."""
    out = bytearray(data)
    out[start] |= 0b110
    return bytes(out)


CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465]).reshape(3, 1, 1)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616]).reshape(3, 1, 1)


def cifar_file(labels: np.ndarray, images: np.ndarray) -> bytes:
    """CIFAR-10 binary: per record 1 label byte, then 1024 red, 1024 green, 1024 blue bytes, each plane
    32x32 row-major. ``images`` is (N, 32, 32, 3) (height, width, channel): written plane by plane,
    pixel by pixel, as the format's page describes it."""
    out = bytearray()
    for label, img in zip(labels, images, strict=True):
        out.append(int(label))
        for c in range(3):
            for row in range(32):
                out += bytes(int(v) for v in img[row, :, c])
    return bytes(out)


def write_cifar(root: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    written = {}
    for name, n in sizes.items():
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        (folder / name).write_bytes(cifar_file(labels, images))
        written[name] = (labels, images)
    return written


# ---------------------------------------------------------------- MNIST


@pytest.mark.parametrize("layout", ["plain", "gz", "torchvision"])
def test_mnist_matches_the_idx_spec_pixel_for_pixel(tmp_path: Path, layout: str) -> None:
    folder = tmp_path / "MNIST" / "raw" if layout == "torchvision" else tmp_path
    arrays = write_mnist(folder, gz=layout != "plain")
    train, test = mnist(tmp_path)
    for split, data in (("train", train), ("test", test)):  # train-* is train, t10k-* is test
        images_name, labels_name = MNIST_NAMES[split]
        x, y = data.tensors
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.shape == (len(arrays[images_name]), 1, 28, 28)
        assert np.allclose(x.numpy(), mnist_reference(arrays[images_name]), rtol=0, atol=1e-6)
        assert np.array_equal(y.numpy(), arrays[labels_name])


@pytest.mark.parametrize("layout", ["flat", "dotted-folders", "hyphen-folders"])
def test_mnist_reads_kaggles_spelling(tmp_path: Path, layout: str) -> None:
    """Kaggle's copy names the files ``train-images.idx3-ubyte`` and nests each in a folder of its name
    (``train-images-idx3-ubyte/train-images-idx3-ubyte`` in the archive most loaders read); it was reported
    missing."""
    plain = tmp_path / "plain"
    arrays = write_mnist(plain)
    kaggle = tmp_path / "kaggle"
    for name in arrays:
        spelt = name.replace("-idx", ".idx")
        to = {"flat": kaggle / spelt, "dotted-folders": kaggle / spelt / spelt,
              "hyphen-folders": kaggle / name / name}[layout]
        to.parent.mkdir(parents=True, exist_ok=True)
        to.write_bytes((plain / name).read_bytes())
    for got, want in zip(mnist(kaggle), mnist(plain), strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got.tensors, want.tensors, strict=True))
    assert dataset_digest(f"mnist:{kaggle}") == dataset_digest(f"mnist:{plain}")  # the same bytes read


def test_read_idx_reads_any_unsigned_byte_idx_array(tmp_path: Path) -> None:
    a = np.arange(2 * 3 * 5, dtype=np.uint8).reshape(2, 3, 5)
    (tmp_path / "a").write_bytes(idx_bytes(a))
    assert np.array_equal(read_idx(tmp_path / "a"), a)


def _damage(tmp_path: Path, case: str) -> Path:
    """Write good MNIST files into ``tmp_path``, damage one as ``case`` says, return the damaged file."""
    gz = case == "corrupt gzip stream"
    arrays = write_mnist(tmp_path, gz=gz)
    images, labels = (tmp_path / f"{n}{'.gz' if gz else ''}" for n in MNIST_NAMES["train"])
    n = len(arrays["train-labels-idx1-ubyte"])
    if case == "empty file":
        labels.write_bytes(b"")
        return labels
    if case == "truncated data":
        images.write_bytes(images.read_bytes()[:-100])
    elif case == "truncated header":
        images.write_bytes(images.read_bytes()[:9])
    elif case == "wrong magic":
        images.write_bytes(b"\x1f\x8b" + images.read_bytes()[2:])
    elif case == "not unsigned bytes":
        images.write_bytes(idx_bytes(arrays["train-images-idx3-ubyte"], type_code=0x0B))
    elif case == "corrupt gzip stream":  # before: zlib.error escaped as a traceback
        images.write_bytes(corrupt_deflate(images.read_bytes(), 10))  # gzip's header is 10 bytes
    elif case == "fewer labels than images":  # before: the message named no file
        labels.write_bytes(idx_bytes(np.zeros(n - 1)))
        return labels
    elif case == "label beyond 9":  # before: the message named no file
        labels.write_bytes(idx_bytes(np.array([1, 12] + [0] * (n - 2))))
        return labels
    elif case == "images file where labels belong":
        labels.write_bytes(images.read_bytes())
        return labels
    elif case == "images not 28x28":  # before: accepted, and the run failed in its first round on the tiers
        images.write_bytes(idx_bytes(np.zeros((n, 14, 14))))
    elif case == "no samples":  # before: accepted (with an empty test set a run scored 0 and said nothing)
        images.write_bytes(idx_bytes(np.zeros((0, 28, 28))))
        labels.write_bytes(idx_bytes(np.zeros(0)))
    return images


@pytest.mark.parametrize(("case", "words"), [
    ("empty file", "not an IDX file"),
    ("truncated data", "file holds"),
    ("truncated header", "header truncated"),
    ("wrong magic", "not an IDX file"),
    ("not unsigned bytes", "not unsigned byte"),
    ("corrupt gzip stream", "cannot read IDX file"),
    ("fewer labels than images", "do not match"),
    ("label beyond 9", r"label 12 out of range 0\.\.9"),
    ("images file where labels belong", "do not match"),
    ("images not 28x28", "images are 14x14, MNIST's are 28x28"),
    ("no samples", "no samples"),
])
def test_a_bad_mnist_file_is_refused_naming_it(tmp_path: Path, case: str, words: str) -> None:
    bad = _damage(tmp_path, case)
    with pytest.raises(ConfigError, match=words) as e:
        mnist(tmp_path)
    assert str(bad) in str(e.value)


def test_a_run_on_mnist_images_of_another_size_is_refused_before_it_starts(tmp_path: Path) -> None:
    """Before: ``validate`` passed, Ray and the tiers started, and every client failed in round 1 with
    'activation: shape [8, 16, 14, 14] does not match the segment's [B, 16, 28, 28]'."""
    from splitfed.sim.runner import validate

    bad = _damage(tmp_path / "m", "images not 28x28")
    with pytest.raises(ConfigError, match="28x28") as e:
        validate(RunSettings(model="cnn", dataset=f"mnist:{tmp_path / 'm'}", clients=2))
    assert str(bad) in str(e.value)


# ---------------------------------------------------------------- CIFAR-10


def test_cifar10_matches_the_binary_spec_pixel_for_pixel(tmp_path: Path) -> None:
    written = write_cifar(tmp_path, {"data_batch_1.bin": 3, "data_batch_2.bin": 2, "test_batch.bin": 2})
    train, test = cifar10(tmp_path)
    for data, names in ((train, ["data_batch_1.bin", "data_batch_2.bin"]), (test, ["test_batch.bin"])):
        labels = np.concatenate([written[n][0] for n in names])
        hwc = np.concatenate([written[n][1] for n in names])
        x, y = data.tensors
        assert x.dtype == torch.float32 and x.shape == (len(labels), 3, 32, 32)
        assert np.array_equal(y.numpy(), labels)
        for i in range(len(labels)):  # channel c, row r, column k of the model's input is pixel (r, k)'s c
            for c in range(3):
                want = (hwc[i, :, :, c] / 255.0 - CIFAR_MEAN[c, 0, 0]) / CIFAR_STD[c, 0, 0]
                assert np.allclose(x[i, c].numpy(), want, rtol=0, atol=1e-5)
        # a sanity check of the check: reading the planes as HWC would not pass it
        wrong = hwc.reshape(len(labels), 3, 32, 32)
        assert not np.allclose(x.numpy(), (wrong / 255.0 - CIFAR_MEAN) / CIFAR_STD, atol=1e-3)


@pytest.mark.parametrize("extra", [-1, 1, 3072, 3074])
def test_a_cifar_file_of_partial_records_is_refused_naming_it(tmp_path: Path, extra: int) -> None:
    write_cifar(tmp_path, {"data_batch_1.bin": 2, "test_batch.bin": 1})
    bad = tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin"
    data = bad.read_bytes()
    bad.write_bytes(data[:extra] if extra < 0 else data + b"\0" * extra)
    with pytest.raises(ConfigError, match="3073-byte CIFAR-10 records") as e:
        cifar10(tmp_path)
    assert str(bad) in str(e.value)


def test_a_cifar_label_beyond_9_is_refused_naming_its_file(tmp_path: Path) -> None:
    """Before: the message named the folder, not which of six files holds the bad label."""
    write_cifar(tmp_path, {"data_batch_1.bin": 2, "data_batch_2.bin": 2, "test_batch.bin": 1})
    bad = tmp_path / "cifar-10-batches-bin" / "data_batch_2.bin"
    data = bytearray(bad.read_bytes())
    data[3073] = 10  # the second record's label
    bad.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"label 10 out of range 0\.\.9") as e:
        cifar10(tmp_path)
    assert str(bad) in str(e.value)


def test_an_unreadable_cifar_batch_is_refused_naming_it(tmp_path: Path) -> None:
    """Before: ``IsADirectoryError`` (or ``PermissionError``) escaped as a traceback."""
    write_cifar(tmp_path, {"data_batch_1.bin": 1, "test_batch.bin": 1})
    bad = tmp_path / "cifar-10-batches-bin" / "data_batch_2.bin"
    bad.mkdir()
    with pytest.raises(ConfigError, match="cannot read CIFAR-10 file") as e:
        cifar10(tmp_path)
    assert str(bad) in str(e.value)


@pytest.mark.parametrize("point_at", ["parent", "folder"])
def test_the_python_cifar_version_is_named_as_such(tmp_path: Path, point_at: str) -> None:
    """torchvision leaves ``cifar-10-batches-py`` (pickles): before, the user was told only that
    ``data_batch_1.bin`` was missing, beside their ``data_batch_1``."""
    py = tmp_path / "cifar-10-batches-py"
    py.mkdir()
    for name in ("data_batch_1", "test_batch", "batches.meta"):
        (py / name).write_bytes(b"\x80\x04pickled")
    root = tmp_path if point_at == "parent" else py
    with pytest.raises(ConfigError, match=r"python \(pickle\) version, which splitfed never reads: get the "
                                          r"binary version \(cifar-10-binary\.tar\.gz\).*never downloads"):
        cifar10(root)


# ---------------------------------------------------------------- .npz


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "float64", "int32", "bool"])
def test_npz_tensors_equal_numpys_arrays(tmp_path: Path, dtype: str, compressed: bool) -> None:
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(6, 1, 8, 8)) * 100).astype(dtype)
    arrays = {"x_train": x, "y_train": np.array([0, 1, 2, 9, 4, 0], np.uint8), "x_test": x[:2],
              "y_test": np.array([3, 9], np.int32)}
    path = tmp_path / "d.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    train, test = read_npz(path, CNN)
    with np.load(path) as f:
        for (x_t, y_t), xk, yk in ((train.tensors, "x_train", "y_train"), (test.tensors, "x_test", "y_test")):
            assert x_t.dtype == torch.float32 and y_t.dtype == torch.int64
            assert np.array_equal(x_t.numpy(), f[xk].astype(np.float32))  # as given: never normalised
            assert np.array_equal(y_t.numpy(), f[yk].astype(np.int64))
    assert sample_shape(f"npz:{path}") == (1, 8, 8) == tuple(train.tensors[0].shape[1:])
    assert sample_classes(f"npz:{path}") == 10


def _corrupt_member(path: Path, member: str) -> None:
    """Give the deflate stream of ``member`` of the zip at ``path`` an invalid block type."""
    with zipfile.ZipFile(path) as z:
        offset = z.getinfo(member).header_offset
    data = path.read_bytes()
    name_len, extra_len = struct.unpack("<HH", data[offset + 26:offset + 30])  # the local file header
    path.write_bytes(corrupt_deflate(data, offset + 30 + name_len + extra_len))


@pytest.mark.parametrize("member", ["x_train.npy", "y_test.npy"])
def test_a_corrupt_compressed_npz_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       member: str) -> None:
    """Before: ``zlib.error`` from ``read_npz`` (and ``sample_shape``, ``sample_classes``, so from building
    a run's settings) escaped as a traceback, out of ``splitfed simulate`` too."""
    path = tmp_path / "d.npz"
    np.savez_compressed(path, x_train=np.zeros((4, 1, 8, 8), np.float32), y_train=np.arange(4),
                        x_test=np.zeros((2, 1, 8, 8), np.float32), y_test=np.arange(2))
    _corrupt_member(path, member)
    with pytest.raises(ConfigError, match=f"dataset npz:{path}: cannot read it"):
        read_npz(path, CNN)
    assert sample_shape(f"npz:{path}") in (None, (1, 8, 8))  # unreadable now: named by the reader
    assert sample_classes(f"npz:{path}") in (None, 4)
    rc = main(["simulate", "--dataset", f"npz:{path}", "--clients", "2", "--rounds", "1",
               "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and f"dataset npz:{path}: cannot read it" in err and "Traceback" not in err


def test_cli_refuses_a_corrupt_gzipped_mnist_file_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad = _damage(tmp_path / "m", "corrupt gzip stream")
    rc = main(["simulate", "--dataset", f"mnist:{tmp_path / 'm'}", "--clients", "2", "--rounds", "1",
               "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and f"cannot read IDX file {bad}" in err and "Traceback" not in err


# ---------------------------------------------------------------- partitions


def _shares(labels: np.ndarray, parts: list[np.ndarray], classes: np.ndarray) -> np.ndarray:
    """(classes, clients): the share of each class's samples each client holds."""
    counts = np.array([[np.sum(labels[p] == k) for p in parts] for k in classes], dtype=np.float64)
    return counts / counts.sum(axis=1, keepdims=True)


@settings(max_examples=40)
@given(values=st.lists(st.sampled_from([-7, 0, 3, 1000, 2**40]), min_size=1, max_size=200),
       num_clients=st.integers(1, 12), alpha=st.sampled_from([None, 0.02, 0.5, 50.0]),
       seed=st.integers(0, 2**40), min_size=st.integers(0, 5), as_float=st.booleans())
def test_every_sample_goes_to_exactly_one_client_whatever_the_label_values(
        values: list[int], num_clients: int, alpha: float | None, seed: int, min_size: int, as_float: bool) -> None:
    labels = np.array(values, dtype=np.float64 if as_float else np.int64)
    num_clients = min(num_clients, len(labels))
    min_size = min(min_size, len(labels) // num_clients)
    scheme = "iid" if alpha is None else f"dirichlet:{alpha}"
    parts = partition(labels, num_clients, scheme, seed, min_size=min_size)
    everything = np.concatenate(parts)
    assert len(everything) == len(labels) and np.array_equal(np.sort(everything), np.arange(len(labels)))
    assert min(len(p) for p in parts) >= min_size
    again = partition(torch.from_numpy(labels), num_clients, scheme, seed, min_size=min_size)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_takes_random_samples_of_each_class_not_the_first_in_the_file(seed: int) -> None:
    """With a huge alpha every client gets ~1/5 of every class, and which ones must not depend on the
    file's order. Now: client 0 gets the first fifth of every class, client 4 the last (the
    partitioner cuts each class in row order), so a file sorted by source or date gives each client
    one source: a skew of the inputs that the partition scheme never asked for."""
    labels = np.tile(np.arange(10), 200)  # 2000 samples; the first 1000 from one "source"
    parts = partition(labels, 5, "dirichlet:1000", seed, min_size=0)
    for p in parts:
        assert 300 < len(p) < 500
        first_half = np.mean(p < len(labels) // 2)
        assert 0.35 < first_half < 0.65, first_half  # ~0.5 +- 0.025; now: 1.0 for client 0, 0.0 for 4


def _reference_shares(alpha: float, num_clients: int, classes: int, draws: int, seed: int) -> np.ndarray:
    """Each class split among clients by a Dirichlet(alpha) draw: numpy's own generator."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet([alpha] * num_clients, size=draws * classes)


def test_dirichlet_label_shares_follow_numpys_dirichlet() -> None:
    """The share of class k a client holds is, per class, one Dirichlet(alpha) draw over clients: its spread
    over 20 seeded runs matches numpy's draws and the Beta marginal's variance (1/K)(1-1/K)/(K alpha + 1);
    small alpha skews, large alpha evens out. Fixed seeds: the numbers are fixed, the bounds wide."""
    k_clients, classes, per_class, runs = 5, 10, 300, 20
    labels = np.repeat(np.arange(classes), per_class)
    spread = {}
    for alpha in (0.1, 1.0, 10.0):
        ours = np.concatenate([_shares(labels, partition(labels, k_clients, f"dirichlet:{alpha}", s, min_size=0),
                                       np.arange(classes)) for s in range(runs)])
        ref = _reference_shares(alpha, k_clients, classes, runs, seed=1)
        theory = (1 / k_clients) * (1 - 1 / k_clients) / (k_clients * alpha + 1)
        assert np.allclose(ours.sum(axis=1), 1.0)
        assert abs(ours.mean() - 1 / k_clients) < 1e-9  # shares of a class sum to 1 over clients
        v_ours, v_ref = float(ours.var()), float(ref.var())
        assert 0.6 < v_ours / theory < 1.6 and 0.6 < v_ref / theory < 1.6, (alpha, v_ours, v_ref, theory)
        assert 0.5 < v_ours / v_ref < 2.0
        spread[alpha] = v_ours
    assert spread[0.1] > 3 * spread[1.0] > 9 * spread[10.0]


# ---------------------------------------------------------------- what a run is told about its data


def test_shape_classes_and_digest_agree_with_what_the_loaders_return(tmp_path: Path) -> None:
    write_mnist(tmp_path / "m", gz=True)
    write_cifar(tmp_path / "c", {"data_batch_1.bin": 2, "test_batch.bin": 1})
    npz = tmp_path / "d.npz"
    np.savez(npz, x_train=np.zeros((5, 3, 6, 6), np.float32), y_train=np.array([0, 1, 2, 3, 2]),
             x_test=np.zeros((2, 3, 6, 6), np.float32), y_test=np.array([5, 0]))
    for dataset, load in ((f"mnist:{tmp_path / 'm'}", lambda: mnist(tmp_path / "m")),
                          (f"cifar10:{tmp_path / 'c'}", lambda: cifar10(tmp_path / "c")),
                          (f"npz:{npz}", lambda: read_npz(npz, spec_for("cnn", f"npz:{npz}")))):
        train, test = load()
        x, y = train.tensors
        assert sample_shape(dataset) == tuple(x.shape[1:]) == tuple(test.tensors[0].shape[1:])
        assert spec_for("cnn", dataset).input_shape == tuple(x.shape[1:])
        top = max(int(y.max()), int(test.tensors[1].max()))
        assert spec_for("cnn", dataset).num_classes == (top + 1 if dataset.startswith("npz") else 10)
    assert sample_classes(f"npz:{npz}") == 6


def test_the_digest_follows_the_file_the_loader_reads(tmp_path: Path) -> None:
    """Both ``name`` and ``name.gz``: the loader reads the plain file, and so does the digest."""
    arrays = write_mnist(tmp_path, gz=False)
    write_mnist(tmp_path, gz=True, seed=1)  # other data beside it, gzipped
    dataset = f"mnist:{tmp_path}"
    assert np.array_equal(mnist(tmp_path)[1].tensors[1].numpy(), arrays["t10k-labels-idx1-ubyte"])
    before = dataset_digest(dataset)
    gz = tmp_path / "t10k-labels-idx1-ubyte.gz"
    gz.write_bytes(gzip.compress(idx_bytes(np.zeros(3))))
    assert dataset_digest(dataset) == before  # not read: not digested
    plain = tmp_path / "t10k-labels-idx1-ubyte"
    labels = arrays["t10k-labels-idx1-ubyte"].copy()
    labels[0] = (labels[0] + 1) % 10
    plain.write_bytes(idx_bytes(labels))
    assert dataset_digest(dataset) != before
    assert np.array_equal(mnist(tmp_path)[1].tensors[1].numpy(), labels)


def test_the_cli_trains_on_torchvisions_mnist_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``splitfed simulate --dataset mnist:ROOT`` on the gzipped files torchvision leaves in
    ``ROOT/MNIST/raw``: the command's flags, checks and run folder as a user runs it, one round, tested on every
    t10k image. With ``--json`` its stdout is the summary alone (a script pipes it to ``jq``); what the run says
    goes to stderr.

    The rounds run on the in-process backend (:func:`splitfed.sim.inprocess.train_inprocess`: the same data,
    clients, policy and evaluation, without Ray and tier processes, which cost ~30 s here and read no dataset
    file); a real Flower run of ``splitfed simulate`` is test_signals.py's."""
    from splitfed.sim import inprocess, runner

    def rounds_inprocess(settings: RunSettings, verbose: bool = False, resumed: object = None) -> dict[str, object]:
        assert resumed is None
        return inprocess.train_inprocess(settings, progress=print)

    monkeypatch.setattr(runner, "simulate", rounds_inprocess)
    monkeypatch.chdir(tmp_path)
    write_mnist(tmp_path / "data" / "MNIST" / "raw", n_train=24, n_test=5, gz=True)
    out = tmp_path / "run"
    rc = main(["simulate", "--dataset", f"mnist:{tmp_path / 'data'}", "--clients", "2", "--rounds", "1",
               "--batch-size", "8", "--cuts", "static:1,3", "--partition", "dirichlet:0.5", "--out", str(out),
               "--json"])
    done = capsys.readouterr()
    assert rc == 0, done.err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads(done.out) == summary  # one JSON object, no progress line before it
    assert "round 1/1" in done.err, done.err[-2000:]
    assert summary["rounds"] == 1
    accuracy = summary["final_accuracy"]
    assert accuracy is not None and round(accuracy * 5) == pytest.approx(accuracy * 5)  # k of 5 test images


def test_a_label_far_above_the_rest_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One stray 99 among 0..9 gives the model 100 outputs: it is still the dataset's classes, but the run says
    which classes no sample has, once per dataset; a dataset whose labels are 0..K-1 says nothing."""
    import logging

    x = np.zeros((12, 1, 8, 8), np.float32)
    stray = tmp_path / "stray.npz"
    np.savez(stray, x_train=x, y_train=np.array([*range(10), 99, 0]), x_test=x[:2], y_test=np.array([1, 2]))
    whole = tmp_path / "whole.npz"
    np.savez(whole, x_train=x, y_train=np.arange(12) % 10, x_test=x[:2], y_test=np.array([1, 2]))
    with caplog.at_level(logging.WARNING, logger="splitfed.data.datasets"):
        assert sample_classes(f"npz:{whole}") == 10
        assert not caplog.records
        assert sample_classes(f"npz:{stray}") == 100
        assert sample_classes(f"npz:{stray}") == 100
    (rec,) = caplog.records
    assert "labels run to 99" in rec.getMessage() and "no sample has class 10, 11, 12, 13, 14 (+84 more)" in \
        rec.getMessage() and "relabel to 0..10" in rec.getMessage()
