"""Datasets that feed zoo models, all from local files: splitfed never downloads.

Every loader returns ``(train, test)`` ``TensorDataset``s of (float32 or int64 inputs,
int64 labels), so a partition, a batch order and a model see plain tensors.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import math
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from numpy.lib.npyio import NpzFile
from torch.utils.data import TensorDataset

from splitfed.data._seed import derive_seed
from splitfed.engine.limits import MAX_VOCAB
from splitfed.errors import ConfigError
from splitfed.models.zoo import MAX_CLASSES, ZOO, ModelSpec, resolve_spec

log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # what was said once per process (a dataset's unused classes, CIFAR's missing batches)

Layout = Literal["image", "flat", "tokens"]
Split = tuple[TensorDataset, TensorDataset]

DIGITS_SHAPE = (1, 8, 8)
DIGITS_VOCAB = 17  # pixel intensities 0..16
MNIST_SHAPE = (1, 28, 28)
CIFAR10_SHAPE = (3, 32, 32)
_MNIST_MEAN, _MNIST_STD = 0.1307, 0.3081
_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)
_NEVER = "splitfed never downloads: put the files there yourself"
_FORMS = "'digits', 'synthetic', 'mnist:PATH', 'cifar10:PATH' or 'npz:FILE'"
# what reading a damaged file raises: zlib.error (a corrupt deflate stream in a .gz or a compressed .npz)
# is no OSError, and would otherwise escape as a traceback instead of a refusal naming the file
_UNREADABLE = (OSError, EOFError, zlib.error)
# what np.load and zipfile raise on a damaged or unusual .npz, besides those: a member compressed by a method
# zipfile lacks (Deflate64, as Windows' and 7-Zip's zip write) raises NotImplementedError, an encrypted one
# RuntimeError, an array header claiming more than memory holds (a damaged or cut-short member) MemoryError;
# each escaped as a traceback
_BAD_NPZ = (*_UNREADABLE, ValueError, zipfile.BadZipFile, NotImplementedError, RuntimeError, MemoryError)
_GZIP_MAGIC = b"\x1f\x8b"


def local_path(path: str) -> Path:
    """A dataset spec's PATH (``mnist:PATH``, ``cifar10:PATH``, ``npz:FILE``) as the path it names, ``~``
    expanded: the one place a spec's path becomes one. A shell leaves ``mnist:~/x`` as it is (``~`` expands
    only at a word's start) and a config file's value meets no shell at all."""
    try:
        return Path(path.strip()).expanduser()
    except RuntimeError:  # ~user of no such user, or no home: the path as written, refused as missing by name
        return Path(path.strip())


# ---------------------------------------------------------------- digits


@lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # ships with scikit-learn; no network

    d = load_digits()
    return d.data.astype(np.int64), d.target.astype(np.int64)


DIGITS_SAMPLES = 1797


def _digits_split(test_fraction: float, random_state: int) -> tuple[np.ndarray, ...]:
    """(x_train, x_test, y_train, y_test) as int64, from the cache when kept there: a hit imports no scikit-learn
    (seconds in every process that loads a client's data, :mod:`splitfed.cache`)."""
    import sys

    from splitfed import cache

    key = cache.entry_key(kind="digits-split", test_fraction=float(test_fraction), random_state=random_state,
                          code=cache.source_digest(sys.modules[__name__]),
                          **cache.versions("scikit-learn", "numpy"))

    def split() -> dict[str, np.ndarray]:
        from sklearn.model_selection import train_test_split

        x, y = _digits_raw()
        try:
            xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, stratify=y,
                                                  random_state=random_state)
        except ValueError as e:  # too few samples on one side for a stratified split
            raise ConfigError(f"cannot split digits with test_fraction={test_fraction}: {e}") from None
        return {"x_train": xtr, "x_test": xte, "y_train": ytr, "y_test": yte}

    a = cache.kept("digits", key, _whole_digits, split)
    return a["x_train"], a["x_test"], a["y_train"], a["y_test"]


def _whole_digits(a: dict[str, np.ndarray]) -> bool:
    """A kept split is the digits: int64 pixels 0..16 in rows of 64, labels 0..9, every sample on one side."""
    xs, ys = (a["x_train"], a["x_test"]), (a["y_train"], a["y_test"])
    return (all(x.dtype == np.int64 and x.ndim == 2 and x.shape[1] == 64 and ((x >= 0) & (x <= 16)).all() for x in xs)
            and all(y.dtype == np.int64 and y.ndim == 1 and ((y >= 0) & (y <= 9)).all() for y in ys)
            and [len(y) for y in ys] == [len(x) for x in xs] and sum(len(y) for y in ys) == DIGITS_SAMPLES)


def digits(test_fraction: float = 0.2, seed: int = 0, layout: Layout = "image") -> Split:
    """scikit-learn's 8x8 digits (1797 samples, 10 classes): the offline dataset for tests.

    image: float32 (N, 1, 8, 8) in [0, 1]; flat: float32 (N, 64) in [0, 1]; tokens: int64
    (N, 64) pixel intensities 0..16 (vocab 17). The train/test split is stratified and seeded.
    """
    if layout not in ("image", "flat", "tokens"):
        raise ConfigError(f"unknown digits layout {layout!r}: use 'image', 'flat' or 'tokens'")
    if not 0 < test_fraction < 1:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction}")
    xtr, xte, ytr, yte = _digits_split(test_fraction, derive_seed(seed) % 2**32)

    def tensor(a: np.ndarray) -> torch.Tensor:
        if layout == "tokens":
            return torch.from_numpy(a.copy())
        t = torch.from_numpy(a.astype(np.float32) / 16.0)
        return t.reshape(-1, *DIGITS_SHAPE) if layout == "image" else t

    return (TensorDataset(tensor(xtr), torch.from_numpy(ytr.copy())),
            TensorDataset(tensor(xte), torch.from_numpy(yte.copy())))


# ---------------------------------------------------------------- synthetic


def synthetic(spec: ModelSpec, n: int, seed: int, part: int = 0) -> TensorDataset:
    """``n`` random inputs for ``spec`` labelled by a fixed random linear teacher.

    The teacher depends on ``seed`` only and ``part`` picks an independent draw of inputs,
    so ``part=0`` and ``part=1`` are a train and a test set of the same learnable task.
    Float inputs are N(0, 1) and the teacher is linear in the flattened input. Token inputs
    are uniform in [0, vocab) and the teacher is linear in the token counts (a bag of
    tokens), which a pooled embedding model can learn. Teacher columns are centred and
    scaled alike so that no class dominates.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"synthetic dataset size must be a non-negative integer, got {n!r}")
    if spec.num_classes < 1:
        raise ConfigError(f"model {spec.name!r} has {spec.num_classes} classes; need at least 1")
    if part < 0:
        raise ConfigError(f"part must be >= 0, got {part}")
    teacher = torch.Generator().manual_seed(derive_seed(seed, 0))
    draw = torch.Generator().manual_seed(derive_seed(seed, part + 1))
    c, d = spec.num_classes, math.prod(spec.input_shape)
    if spec.vocab:
        w = torch.randn(spec.vocab, c, generator=teacher)
        w = w - w.mean(dim=0)
        x = torch.randint(0, spec.vocab, (n, *spec.input_shape), generator=draw)
        counts = torch.zeros(n, spec.vocab).scatter_add_(1, x.reshape(n, d), torch.ones(n, d))
        logits = counts @ (w / w.norm(dim=0).clamp_min(1e-12))
    else:
        w = torch.randn(d, c, generator=teacher)
        x = torch.randn(n, *spec.input_shape, generator=draw)
        logits = x.reshape(n, d) @ (w / w.norm(dim=0).clamp_min(1e-12))
    return TensorDataset(x, logits.argmax(dim=1))


# ---------------------------------------------------------------- MNIST (IDX files)

_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find(root: Path, name: str, dataset: str) -> Path:
    """``root/name`` or ``root/name.gz``, also under torchvision's ``MNIST/raw`` layout, and as Kaggle's copy
    spells and nests it (``train-images.idx3-ubyte``; each file also in a folder of its own name, either way)."""
    kaggle = name.replace("-idx", ".idx")
    for folder in (root, root / "MNIST" / "raw"):
        for candidate in (folder / name, folder / f"{name}.gz", folder / kaggle, folder / kaggle / kaggle,
                          folder / name / name):
            if candidate.is_file():
                return candidate
    raise ConfigError(f"{dataset}: missing {root / name}[.gz] (or {kaggle}); {_NEVER}")


MAX_IDX_DIMS = 8


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX array of unsigned bytes (the MNIST format), gzipped or not.

    A ``.gz`` whose bytes are not gzip is read as it is: browsers save a download's ``.gz`` already
    decompressed, name unchanged; its own magic number then says whether it is IDX.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if path.suffix == ".gz" and raw[:2] == _GZIP_MAGIC:
            raw = gzip.decompress(raw)
    except _UNREADABLE as e:  # also gzip.BadGzipFile
        raise ConfigError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ConfigError(f"{path} is not an IDX file (bad magic number)")
    if raw[2] != 0x08:
        raise ConfigError(f"{path}: IDX data type 0x{raw[2]:02x} is not unsigned byte (0x08)")
    ndim = raw[3]
    if ndim > MAX_IDX_DIMS:  # numpy takes at most 64
        raise ConfigError(f"{path}: IDX header says {ndim} dimensions; at most {MAX_IDX_DIMS} are read "
                          "(MNIST files have 1 or 3)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConfigError(f"{path}: IDX header truncated")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if len(raw) - header != math.prod(shape):
        raise ConfigError(f"{path}: IDX header says shape {shape} ({math.prod(shape)} bytes), "
                          f"file holds {len(raw) - header} data bytes")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def mnist(root: str | Path) -> Split:
    """MNIST from the four standard IDX files in ``root``: float32 (N, 1, 28, 28), normalised.

    Each split must hold at least one 28x28 image (the shape a run's model is built for before any
    file is read; an empty test set would score 0 silently); refusals name the files.
    """
    root = Path(root)
    out = []
    for split, (images_name, labels_name) in _MNIST_FILES.items():
        images_path, labels_path = _find(root, images_name, "mnist"), _find(root, labels_name, "mnist")
        images, labels = read_idx(images_path), read_idx(labels_path)
        where = f"mnist {split} ({images_path}, {labels_path})"
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ConfigError(f"{where}: images {images.shape} and labels {labels.shape} "
                              f"do not match (want (N, 28, 28) and (N,))")
        if images.shape[1:] != MNIST_SHAPE[1:]:
            raise ConfigError(f"{where}: images are {images.shape[1]}x{images.shape[2]}, MNIST's are 28x28")
        if not len(labels):
            raise ConfigError(f"{where}: no samples (the header says 0 images)")
        if labels.max() > 9:
            raise ConfigError(f"{labels_path}: label {labels.max()} out of range 0..9")
        x = (torch.from_numpy(images.astype(np.float32) / 255.0) - _MNIST_MEAN) / _MNIST_STD
        out.append(TensorDataset(x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))))
    return out[0], out[1]


# ---------------------------------------------------------------- CIFAR-10 (binary version)

_CIFAR_RECORD = 1 + 3 * 32 * 32  # label byte, then R, G, B planes of 32x32


def _read_cifar_bin(paths: list[Path]) -> TensorDataset:
    """Records of ``paths`` in order; an unreadable or malformed file is refused by name."""
    chunks = []
    for path in paths:
        try:
            raw = np.fromfile(path, dtype=np.uint8)
        except OSError as e:  # a folder of that name, no permission: a refusal, not a traceback
            raise ConfigError(f"cannot read CIFAR-10 file {path}: {e.strerror or e}") from None
        if raw.size == 0 or raw.size % _CIFAR_RECORD:
            raise ConfigError(f"{path}: {raw.size} bytes is not a whole number of "
                              f"{_CIFAR_RECORD}-byte CIFAR-10 records")
        if raw[::_CIFAR_RECORD].max() > 9:
            raise ConfigError(f"{path}: CIFAR-10 label {raw[::_CIFAR_RECORD].max()} out of range 0..9")
        chunks.append(raw.reshape(-1, _CIFAR_RECORD))
    records = np.concatenate(chunks)
    labels = records[:, 0].astype(np.int64)
    x = torch.from_numpy(records[:, 1:].reshape(-1, *CIFAR10_SHAPE).astype(np.float32) / 255.0)
    mean = torch.tensor(_CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(_CIFAR_STD).view(1, 3, 1, 1)
    return TensorDataset((x - mean) / std, torch.from_numpy(labels))


def _cifar_folders(root: Path) -> tuple[Path, ...]:
    """Where the batches may lie: ``root/cifar-10-batches-bin`` (the archive's layout), else ``root`` itself,
    whatever its name (a copy renamed, or the files alone)."""
    return (root,) if root.name == "cifar-10-batches-bin" else (root / "cifar-10-batches-bin", root)


def _cifar_files(root: Path) -> tuple[Path, list[Path], Path]:
    """The batches folder (the first of :func:`_cifar_folders` holding a training batch), its training batches
    and its test batch."""
    folders = _cifar_folders(root)

    def batches(folder: Path) -> list[Path]:  # these only: not a stray data_batch_old.bin
        return [folder / f"data_batch_{i}.bin" for i in range(1, 6)]

    folder = next((f for f in folders if any(p.exists() for p in batches(f))), folders[0])
    named = batches(folder)
    train = [p for p in named if p.exists()]
    missing = [p.name for p in named if p not in train]
    if train and missing and str(folder) not in _WARNED:  # a subset is fine (small copies), but said
        _WARNED.add(str(folder))
        log.warning("cifar10: %s has no %s: training on %d of the 5 batches", folder, ", ".join(missing), len(train))
    return folder, train, folder / "test_batch.bin"


def cifar10(root: str | Path) -> Split:
    """CIFAR-10 from the *binary* files (never pickle): float32 (N, 3, 32, 32), normalised.

    ``root`` is the folder holding ``cifar-10-batches-bin/``, or the folder holding the batches themselves.
    """
    folder, train, test = _cifar_files(Path(root))
    if not train:
        pickled = next((p for p in (Path(root), Path(root) / "cifar-10-batches-py")
                        if p.name == "cifar-10-batches-py" and p.is_dir()), None)
        hint = (f"; {pickled} is the python (pickle) version, which splitfed never reads: get the binary "
                f"version (cifar-10-binary.tar.gz)" if pickled else "")  # what torchvision leaves
        looked = " or ".join(str(f / "data_batch_1.bin") for f in _cifar_folders(Path(root)))
        raise ConfigError(f"cifar10: missing {looked} "
                          f"(want data_batch_1..5.bin and test_batch.bin){hint}; {_NEVER}")
    if not test.is_file():
        raise ConfigError(f"cifar10: missing {test}; {_NEVER}")
    return _read_cifar_bin(train), _read_cifar_bin([test])


# ---------------------------------------------------------------- your own data: one .npz file

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


@contextmanager
def _open_npz(path: Path, keys: tuple[str, ...]) -> Iterator[NpzFile]:
    """The ``.npz`` at ``path``, opened without pickle, once it holds ``keys``: the one place every reader
    of an .npz opens it, so each refuses the same files with the same words. A read in the block that
    fails (a corrupt member, an object array) is refused too, naming the file."""
    where = f"dataset npz:{path}"
    if path.is_dir():
        raise ConfigError(f"{where}: a folder, not a file: name the .npz file itself (npz:FOLDER/NAME.npz)")
    if path.exists() and not path.is_file():  # /dev/null, a pipe: reading one would hang or yield nothing
        raise ConfigError(f"{where}: not a regular file, so not an .npz archive (a zip of arrays, as "
                          f"numpy.savez writes): name the .npz file itself")
    if not path.is_file():
        raise ConfigError(f"{where}: no such file; {_NEVER}")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it: {e.strerror or e}") from None
    if magic != b"PK\x03\x04":  # np.load would take a .npy array, or guess a text file holds pickled data
        raise ConfigError(f"{where}: not a .npz archive (a zip of arrays, as numpy.savez writes; "
                          f"a .npy file holds one array)")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in keys if k not in f.files]
            if missing:
                raise ConfigError(f"{where}: missing array(s) {', '.join(missing)} (it has "
                                  f"{', '.join(f.files) or 'none'}; want {', '.join(keys)})")
            yield f
    except ConfigError:
        raise
    except (*_BAD_NPZ, KeyError) as e:  # a truncated or corrupt npz, object arrays, a zip numpy cannot read
        raise ConfigError(f"{where}: cannot read it as a NumPy .npz without pickle: {type(e).__name__}: {e}") \
            from None


def read_npz(path: str | Path, spec: ModelSpec, keys: tuple[str, ...] = NPZ_KEYS) -> list[TensorDataset]:
    """``(x, y)`` pairs from a NumPy ``.npz`` file (``x_train``, ``y_train``, ``x_test``, ``y_test``)
    as ``spec`` takes them; loaded without pickle, every array checked, nothing normalised.

    Inputs are floats (float32 for the model) shaped as the model's input, or flat when the model
    takes them flat; for a token model (``vocab``), integers in ``0..vocab-1``. Labels are integers in
    ``0..num_classes-1``, one per input. Every refusal names the file and the array.
    """
    path = Path(path)
    where = f"dataset npz:{path}"
    with _open_npz(path, keys) as f:
        arrays = {k: f[k] for k in keys}
    out = []
    for xk, yk in zip(keys[::2], keys[1::2], strict=True):
        x, y = arrays[xk], arrays[yk]
        out.append(TensorDataset(_npz_inputs(x, spec, f"{where}: {xk}"), _npz_labels(y, len(x), spec, f"{where}: {yk}")))
    return out


def _npz_sample_shape(path: Path) -> tuple[int, ...]:
    """The shape of one ``x_train`` sample of the ``.npz`` at ``path``, read from that array's header only;
    where there is none, :func:`read_npz`'s refusal (no such file, a missing or unreadable array, no samples)."""
    with _open_npz(path, NPZ_KEYS) as f:
        assert f.zip is not None  # open until the block ends
        with f.zip.open("x_train.npy") as fh:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(fh)
        if dtype.hasobject:  # loading it is refused, as the reader refuses it: an object array needs pickle
            f["x_train"]
    _samples(shape, f"dataset npz:{path}: x_train")
    return tuple(int(d) for d in shape[1:])


def _samples(shape: tuple[int, ...], where: str) -> None:
    """Refuses an input array ``shape`` that holds no samples of their own shape."""
    if len(shape) < 2 or shape[0] == 0:
        raise ConfigError(f"{where}: want one or more samples, shape (N, ...), got {shape}")


def _npz_inputs(x: np.ndarray, spec: ModelSpec, where: str) -> torch.Tensor:
    _samples(x.shape, where)
    want, native = tuple(spec.input_shape), tuple(x.shape[1:])
    if spec.vocab:
        if x.dtype.kind not in "iu" or native != want:
            raise ConfigError(f"{where}: model {spec.name!r} takes int tokens of shape {want}, got {x.dtype} "
                              f"{native}")
        if x.min() < 0 or x.max() >= spec.vocab:
            top = int(x.max()) + 1  # the vocab these tokens need, when none is below 0 and splitfed builds it
            fix = (f": pass --vocab {top} (in a config file, vocab = {top}), the largest token + 1"
                   if x.min() >= 0 and top <= MAX_VOCAB else "")
            raise ConfigError(f"{where}: tokens must lie in 0..{spec.vocab - 1}, found {x.min()}..{x.max()}{fix}")
        return torch.from_numpy(x.astype(np.int64))
    if x.dtype.kind not in "fiub":
        raise ConfigError(f"{where}: inputs must be real numbers, got dtype {x.dtype}")
    if native != want and want != (math.prod(native),):
        raise ConfigError(f"{where}: model {spec.name!r} takes samples of shape {want}, got {native}")
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32 becomes inf: refused just below
        out = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(len(x), *want)
    if not torch.isfinite(out).all():
        raise ConfigError(f"{where}: holds NaN or infinite values (or values beyond float32)")
    return out


def _npz_labels(y: np.ndarray, n: int, spec: ModelSpec, where: str) -> torch.Tensor:
    if y.dtype.kind not in "iu" or y.shape != (n,):
        raise ConfigError(f"{where}: want {n} integer class labels, shape ({n},), got {y.dtype} {y.shape}")
    if y.min() < 0 or y.max() >= spec.num_classes:
        raise ConfigError(f"{where}: labels must lie in 0..{spec.num_classes - 1} (model {spec.name!r} has "
                          f"{spec.num_classes} outputs), found {y.min()}..{y.max()}")
    return torch.from_numpy(y.astype(np.int64))


# ---------------------------------------------------------------- choosing for a model


def _must_flatten(native: tuple[int, ...], spec: ModelSpec, dataset: str) -> bool:
    """Whether ``spec`` takes ``native`` inputs flattened; checked before any file is read."""
    want = tuple(spec.input_shape)
    if spec.vocab:
        raise ConfigError(f"dataset {dataset!r} gives float32 inputs of shape {native}; model "
                          f"{spec.name!r} wants int64 tokens of shape {want} (vocab {spec.vocab})")
    if want in (native, (math.prod(native),)):
        return want != native
    raise ConfigError(f"dataset {dataset!r} gives inputs of shape {native} (or flat "
                      f"({math.prod(native)},)); model {spec.name!r} wants {want}")


def _flatten(data: Split) -> Split:
    (xtr, ytr), (xte, yte) = (d.tensors for d in data)
    return TensorDataset(xtr.flatten(1), ytr), TensorDataset(xte.flatten(1), yte)


def _check_classes(spec: ModelSpec, dataset: str, classes: int) -> None:
    if spec.num_classes < classes:
        raise ConfigError(f"dataset {dataset!r} has {classes} classes; model {spec.name!r} "
                          f"has only {spec.num_classes} outputs")


def dataset_files(dataset: str) -> list[Path]:
    """The local files ``dataset`` reads (none for ``digits`` and ``synthetic``), as :func:`for_model` finds them."""
    name, sep, path = dataset.strip().partition(":")
    name, path = name.lower(), path.strip()
    if not sep or not path:
        return []
    if name == "npz":
        return [local_path(path)]
    if name == "mnist":
        return [_find(local_path(path), f, "mnist") for pair in _MNIST_FILES.values() for f in pair]
    if name == "cifar10":
        _, train, test = _cifar_files(local_path(path))
        return [*train, test]
    return []


def dataset_digest(dataset: str) -> str:
    """sha256 over the contents of the files ``dataset`` reads ("" when it reads none): a resumed run
    refuses data that changed under it."""
    files = dataset_files(dataset)
    if not files:
        return ""
    h = hashlib.sha256()
    for f in files:
        try:
            with open(f, "rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())
        except OSError as e:
            raise ConfigError(f"dataset {dataset!r}: cannot read {f}: {e.strerror or e}") from None
    return h.hexdigest()


def sample_shape(dataset: str) -> tuple[int, ...] | None:
    """The shape of one training sample of ``dataset`` as it is stored (None: it has none of its own, as
    ``synthetic``, or it cannot be read now, which :func:`for_model` then names). An ``.npz`` is read
    only as far as the header of ``x_train``."""
    name, sep, path = str(dataset).strip().partition(":")
    name = name.lower()
    if name == "digits" and not sep:
        return DIGITS_SHAPE
    if name == "mnist" and sep:
        return MNIST_SHAPE
    if name == "cifar10" and sep:
        return CIFAR10_SHAPE
    if name == "npz" and sep:
        try:
            return _npz_sample_shape(local_path(path))
        except ConfigError:
            return None
    return None


def _npz_integers(dataset: str, keys: tuple[str, str]) -> list[np.ndarray] | None:
    """Arrays ``keys`` of an ``npz:`` dataset if both hold integers; None otherwise (another dataset, float
    arrays, or a file that cannot be read now, which :func:`for_model` then names)."""
    name, sep, path = str(dataset).strip().partition(":")
    if name.lower() != "npz" or not sep:
        return None
    try:
        with _open_npz(local_path(path), keys) as f:
            arrays = [f[k] for k in keys]
    except ConfigError:
        return None
    if any(a.dtype.kind not in "iu" or a.size == 0 for a in arrays):
        return None
    return arrays


def sample_classes(dataset: str) -> int | None:
    """How many classes an ``.npz`` dataset's labels name (its largest label + 1, over ``y_train`` and
    ``y_test``); None for the named datasets (10 classes each, as every zoo model's default) and where every
    label is 0."""
    ys = _npz_integers(dataset, ("y_train", "y_test"))
    if ys is None:
        return None
    top, low = max(int(y.max()) for y in ys), min(int(y.min()) for y in ys)
    if low < 0 or top < 1:  # labels below 0 (read_npz refuses them, naming them); or every label 0 (a one-
        return None  # sample file, say): one output is no classifier, so the model keeps its own count
    name = str(dataset).strip()
    if top >= MAX_CLASSES:
        raise ConfigError(f"dataset {name}: label {top} would give the model {top + 1:,} outputs; splitfed "
                          f"builds at most {MAX_CLASSES:,} classes (relabel to 0..N-1)")
    _warn_unused_classes(name, ys, top + 1)
    return top + 1


def _warn_unused_classes(dataset: str, ys: list[np.ndarray], classes: int) -> None:
    """A label far above the rest (one stray 99 among 0..9) gives the model an output per class up to it;
    that is said once per dataset, with the classes no sample has."""
    seen = np.unique(np.concatenate([y.reshape(-1) for y in ys]))
    if len(seen) == classes or dataset in _WARNED:
        return
    _WARNED.add(dataset)
    unused = np.setdiff1d(np.arange(classes), seen)
    shown = ", ".join(str(int(c)) for c in unused[:5]) + (f" (+{len(unused) - 5} more)" if len(unused) > 5 else "")
    log.warning("%s: labels run to %d, so the model gets %d outputs, but no sample has class %s: "
                "relabel to 0..%d if those classes do not exist", dataset, classes - 1, classes, shown, len(seen) - 1)


def spec_for(model: str, dataset: str, vocab: int = 0, kwargs: Mapping[str, object] | None = None) -> ModelSpec:
    """A run's model, shaped for its dataset's samples: a zoo image model takes the dataset's
    ``(C, H, W)`` (``cnn`` on MNIST is 1x28x28, on CIFAR-10 3x32x32), a zoo vector model takes them
    flat, a token model keeps its own; a user's ``module:factory`` takes the samples as stored. Its
    classes are the dataset's: an ``.npz``'s labels (:func:`sample_classes`), else 10. ``vocab`` > 0: the
    model takes integer tokens below it (a zoo token model has its own; a float zoo model is refused);
    ``kwargs``: the factory's keyword arguments."""
    native = sample_shape(dataset)
    classes = sample_classes(dataset)
    if model not in ZOO:
        name, _, path = str(dataset).strip().partition(":")
        if native is None and name.lower() == "npz" and path.strip():
            native = _npz_sample_shape(local_path(path))  # none: refused as the reader refuses the file
        if native is None:
            why = ("'synthetic' has none of its own: use digits, mnist:PATH, cifar10:PATH or npz:FILE"
                   if str(dataset).strip().lower() == "synthetic" else
                   f"none can be read from {str(dataset).strip()!r} (an .npz needs x_train)")
            raise ConfigError(f"model {model!r} takes its input shape from the dataset's samples, and {why}")
        return resolve_spec(model, native, classes, vocab=vocab or None, options=kwargs)
    default = ZOO[model].input_shape
    if native is None or ZOO[model].vocab or vocab:
        return resolve_spec(model, num_classes=classes, vocab=vocab or None, options=kwargs)
    if len(default) == 3 and len(native) == 3:
        if native[-1] in (1, 3, 4) and native[0] not in (1, 3, 4) and native[0] > native[-1]:
            raise ConfigError(f"{str(dataset).strip()}: samples are {native}, which looks channel-last (H, W, C); "
                              f"model {model!r} takes (C, H, W) and would read {native[0]} channels of "
                              f"{native[1]}x{native[2]}: store x_train and x_test as x.transpose(0, 3, 1, 2) "
                              "(or train a module:factory model, which takes samples as stored)")
        return resolve_spec(model, native, classes, options=kwargs)
    if len(default) == 3 and len(native) == 2:  # (N, H, W), as Keras' MNIST: the zoo's own shape would be named
        raise ConfigError(f"{str(dataset).strip()}: samples are {native}, with no channel axis; model {model!r} "
                          f"takes (C, H, W), here (1, {native[0]}, {native[1]}): store x_train and x_test as "
                          f"x[:, None] (numpy), which makes (N, 1, {native[0]}, {native[1]}) "
                          "(or train a module:factory model, which takes samples as stored)")
    if len(default) == 1:
        return resolve_spec(model, (math.prod(native),), classes, options=kwargs)
    return resolve_spec(model, num_classes=classes, options=kwargs)


def dataset_form(dataset: object) -> tuple[str, str]:
    """``dataset``'s kind (lower case) and path, its form checked, no file read: what :func:`for_model` takes
    (a run's settings check it where they are read, naming where the value came from)."""
    if not isinstance(dataset, str):
        raise ConfigError(f"dataset must be a string ({_FORMS}), got {type(dataset).__name__}")
    name, sep, path = dataset.strip().partition(":")
    name = name.lower()
    if (name in ("synthetic", "digits") and not sep) or name in ("mnist", "cifar10", "npz"):
        return name, path
    raise ConfigError(f"unknown dataset {dataset!r}: use {_FORMS}")


def for_model(spec: ModelSpec, dataset: str, seed: int, n_synthetic: int = 2048) -> Split:
    """The (train, test) pair of ``dataset`` in the layout ``spec`` takes.

    ``digits`` becomes images, flat vectors or tokens by the model's input; ``synthetic``
    fits any spec (``n_synthetic`` train samples, a quarter as many test samples);
    ``mnist:PATH`` and ``cifar10:PATH`` read local files, ``npz:FILE`` your own arrays (:func:`read_npz`).
    """
    name, path = dataset_form(dataset)
    if name == "synthetic":
        return (synthetic(spec, n_synthetic, seed, part=0),
                synthetic(spec, max(1, n_synthetic // 4), seed, part=1))
    if name == "digits":
        _check_classes(spec, dataset, 10)
        want = tuple(spec.input_shape)
        if spec.vocab:
            if want != (64,) or spec.vocab < DIGITS_VOCAB:
                raise ConfigError(f"dataset 'digits' gives int64 tokens of shape (64,) with vocab "
                                  f"{DIGITS_VOCAB}; model {spec.name!r} wants tokens of shape "
                                  f"{want} with vocab {spec.vocab}")
            return digits(seed=seed, layout="tokens")
        flat = _must_flatten(DIGITS_SHAPE, spec, dataset)
        return digits(seed=seed, layout="flat" if flat else "image")
    if name in ("mnist", "cifar10"):
        if not path.strip():
            raise ConfigError(f"dataset {name!r} needs a local folder: '{name}:PATH'; {_NEVER}")
        _check_classes(spec, dataset, 10)
        load, native = (mnist, MNIST_SHAPE) if name == "mnist" else (cifar10, CIFAR10_SHAPE)
        flat = _must_flatten(native, spec, dataset)
        data = load(local_path(path))
        return _flatten(data) if flat else data
    if name == "npz":
        if not path.strip():
            raise ConfigError(f"dataset 'npz' needs a file: 'npz:FILE' with arrays {', '.join(NPZ_KEYS)}")
        train, test = read_npz(local_path(path), spec)
        return train, test
    raise AssertionError(f"dataset_form passed {dataset!r}")  # pragma: no cover - every form it passes is read
