"""splitfed.data: offline datasets, client partitions and seeded batches."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.linear_model import LogisticRegression

from splitfed.data import (
    Partition,
    batches,
    cifar10,
    digits,
    for_model,
    mnist,
    parse_partition,
    partition,
    synthetic,
)
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec, build, resolve_spec
from tests.data_fixtures import idx_bytes

torch.set_num_threads(1)

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- partition strings


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("iid", Partition("iid")),
        (" IID ", Partition("iid")),
        ("dirichlet:0.5", Partition("dirichlet", 0.5)),
        ("dirichlet:1e-2", Partition("dirichlet", 0.01)),
        ("Dirichlet:3", Partition("dirichlet", 3.0)),
    ],
)
def test_parse_partition_accepts_the_two_forms(text: str, want: Partition) -> None:
    got = parse_partition(text)
    assert got == want
    assert parse_partition(str(got)) == got  # str() is canonical and round-trips
    assert parse_partition(got) is got


@pytest.mark.parametrize(
    "text",
    ["", "iid:2", "dirichlet", "dirichlet:", "dirichlet:0", "dirichlet:-1", "dirichlet:nan",
     "dirichlet:inf", "dirichlet:1e308", "dirichlet:1000001", "dirichlet:abc", "shards:2", "pathological", "dirichlet 0.5"],
)
def test_parse_partition_rejects_everything_else_and_says_what_works(text: str) -> None:
    with pytest.raises(ConfigError, match=r"'iid' or 'dirichlet:ALPHA'"):
        parse_partition(text)


# ---------------------------------------------------------------- partitions

schemes = st.one_of(
    st.just("iid"),
    st.floats(0.01, 100.0).map(lambda a: f"dirichlet:{a!r}"),
)


@st.composite
def partition_cases(draw: st.DrawFn) -> tuple[np.ndarray, int, str, int, int]:
    n_classes = draw(st.integers(1, 12))
    labels = np.array(draw(st.lists(st.integers(0, n_classes - 1), min_size=1, max_size=300)))
    num_clients = draw(st.integers(1, 15))  # more clients than samples only with min_size 0
    min_size = draw(st.integers(0, len(labels) // num_clients))
    scheme = draw(schemes if num_clients <= len(labels) else st.just("iid"))
    return labels, num_clients, scheme, draw(st.integers(0, 2**32)), min_size


@PROPS
@given(partition_cases())
def test_partition_is_disjoint_complete_deterministic_and_honours_min_size(
    case: tuple[np.ndarray, int, str, int, int],
) -> None:
    labels, num_clients, scheme, seed, min_size = case
    parts = partition(labels, num_clients, scheme, seed, min_size=min_size)
    assert len(parts) == num_clients
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    assert all((np.diff(p) > 0).all() for p in parts)  # sorted, no repeats within a client
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(len(labels)))  # disjoint and complete
    assert min(len(p) for p in parts) >= min_size
    again = partition(labels, num_clients, scheme, seed, min_size=min_size)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


@PROPS
@given(st.integers(1, 400), st.integers(1, 20), st.integers(0, 2**32))
def test_iid_sizes_differ_by_at_most_one(n: int, num_clients: int, seed: int) -> None:
    num_clients = min(num_clients, n)
    sizes = [len(p) for p in partition(np.zeros(n, dtype=np.int64), num_clients, "iid", seed)]
    assert max(sizes) - min(sizes) <= 1


def _skew(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean total-variation distance between each client's label mix and the global one."""
    k = labels.max() + 1
    glob = np.bincount(labels, minlength=k) / len(labels)
    return float(np.mean([0.5 * np.abs(np.bincount(labels[p], minlength=k) / len(p) - glob).sum()
                          for p in parts]))


@functools.cache
def _digit_labels() -> np.ndarray:
    return digits()[0].tensors[1].numpy()


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 10), st.integers(0, 10**6))
def test_small_alpha_dirichlet_is_more_skewed_than_iid_on_average(num_clients: int, seed: int) -> None:
    labels = _digit_labels()
    seeds = range(seed, seed + 3)
    iid = np.mean([_skew(labels, partition(labels, num_clients, "iid", s)) for s in seeds])
    small = np.mean([_skew(labels, partition(labels, num_clients, "dirichlet:0.1", s)) for s in seeds])
    large = np.mean([_skew(labels, partition(labels, num_clients, "dirichlet:1000", s)) for s in seeds])
    assert small > iid
    assert small > large


def test_partition_depends_on_seed_and_takes_tensors() -> None:
    labels = digits()[0].tensors[1]
    a = partition(labels, 4, "dirichlet:0.5", seed=1)
    b = partition(labels.numpy(), 4, Partition("dirichlet", 0.5), seed=1)
    c = partition(labels, 4, "dirichlet:0.5", seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_min_size_is_met_even_when_dirichlet_starves_clients() -> None:
    labels = np.repeat(np.arange(10), 20)  # 200 samples, 10 classes
    for seed in range(10):
        sizes = [len(p) for p in partition(labels, 20, "dirichlet:0.01", seed, min_size=10)]
        assert min(sizes) == 10 and sum(sizes) == 200


@pytest.mark.parametrize(
    ("labels", "num_clients", "min_size", "match"),
    [
        (np.arange(3), 4, 1, r"4 clients but only 3 samples"),
        (np.arange(10), 4, 3, r"min_size 3 = 12 samples needed, only 10"),
        (np.arange(10), 0, 1, r"num_clients must be a positive integer"),
        (np.zeros((4, 2)), 2, 1, r"one-dimensional"),
        (np.arange(10), 2, -1, r"min_size must be an integer >= 0, got -1"),
        (np.arange(10), 2, 1.5, r"min_size must be an integer >= 0, got 1.5"),
    ],
)
def test_partition_refuses_impossible_requests(labels: np.ndarray, num_clients: int,
                                               min_size: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        partition(labels, num_clients, "iid", 0, min_size=min_size)


def test_min_size_0_lets_clients_have_no_samples_and_more_clients_than_samples() -> None:
    """min_size 0 said a client may have none, yet 5 clients over 3 samples were refused for wanting one each."""
    parts = partition(np.arange(3), 5, "iid", 0, min_size=0)
    assert len(parts) == 5 and sorted(np.concatenate(parts).tolist()) == [0, 1, 2]
    assert sorted(len(p) for p in parts) == [0, 0, 1, 1, 1]
    with pytest.raises(ConfigError, match=r"5 clients but only 3 samples: a Dirichlet partition needs"):
        partition(np.arange(3), 5, "dirichlet:0.5", 0, min_size=0)
    assert [len(p) for p in partition(np.arange(4), 2, "iid", 0, min_size=np.int64(2))] == [2, 2]  # numpy ints too


def test_negative_seed_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="seed must be a non-negative integer"):
        partition(np.arange(10), 2, "iid", -1)


# ---------------------------------------------------------------- batches


def test_batches_are_a_seeded_shuffle_independent_of_global_rng() -> None:
    x, y = torch.arange(23).float().unsqueeze(1), torch.arange(23)
    torch.manual_seed(0)
    a = batches(x, y, 5, seed=3)
    state = torch.get_rng_state()
    torch.manual_seed(99)
    b = batches(x, y, 5, seed=3)
    torch.manual_seed(99)
    b_state = torch.get_rng_state()
    batches(x, y, 5, seed=3)
    assert torch.equal(torch.get_rng_state(), b_state)  # global RNG untouched
    assert not torch.equal(state, b_state)
    assert [len(bx) for bx, _ in a] == [5, 5, 5, 5, 3]
    for (ax, ay), (bx, by) in zip(a, b, strict=True):
        assert torch.equal(ax, bx) and torch.equal(ay, by)
        assert torch.equal(ax.squeeze(1).long(), ay)  # inputs stay paired with their labels
    order = torch.cat([by for _, by in a])
    assert sorted(order.tolist()) == list(range(23))
    assert order.tolist() != list(range(23))


def test_batches_change_with_epoch_and_seed_and_drop_last_drops_the_tail() -> None:
    x, y = torch.randn(40, 3), torch.arange(40)

    def order(**kw: int) -> list[int]:
        return torch.cat([b for _, b in batches(x, y, 8, **kw)]).tolist()

    assert order(seed=0, epoch=0) == order(seed=0, epoch=0)
    assert order(seed=0, epoch=0) != order(seed=0, epoch=1)
    assert order(seed=0, epoch=0) != order(seed=1, epoch=0)
    kept = batches(x, y, 16, seed=0, drop_last=True)
    assert [len(b) for _, b in kept] == [16, 16]
    assert batches(x[:0], y[:0], 4, seed=0) == []


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_batches_reject_bad_batch_size(bad: object) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        batches(torch.zeros(4, 1), torch.zeros(4), bad, seed=0)  # type: ignore[arg-type]


def test_batches_reject_mismatched_lengths() -> None:
    with pytest.raises(ConfigError, match="4 vs 3"):
        batches(torch.zeros(4, 1), torch.zeros(3), 2, seed=0)


# ---------------------------------------------------------------- digits


def test_digits_layouts_shapes_ranges_and_stratified_split() -> None:
    (itr, ite), (ftr, _), (ttr, _) = (digits(layout=lo) for lo in ("image", "flat", "tokens"))
    x, y = itr.tensors
    assert x.shape == (1437, 1, 8, 8) and x.dtype == torch.float32
    assert len(ite) == 360 and len(itr) + len(ite) == 1797
    assert x.min() >= 0 and x.max() <= 1 and x.max() == 1
    assert y.dtype == torch.int64 and set(y.tolist()) == set(range(10))
    assert ftr.tensors[0].shape == (1437, 64) and torch.equal(ftr.tensors[0], x.flatten(1))
    tok = ttr.tensors[0]
    assert tok.dtype == torch.int64 and tok.shape == (1437, 64)
    assert tok.min() == 0 and tok.max() == 16
    assert torch.equal(tok.float() / 16, ftr.tensors[0])
    assert torch.equal(ttr.tensors[1], y)  # same split whatever the layout
    # stratified: each class is ~20% in test
    total = np.bincount(np.concatenate([y.numpy(), ite.tensors[1].numpy()]))
    test_counts = np.bincount(ite.tensors[1].numpy())
    assert np.all(np.abs(test_counts - 0.2 * total) <= 1)


def test_digits_split_is_seeded() -> None:
    a, b, c = digits(seed=0)[1], digits(seed=0)[1], digits(seed=1)[1]
    assert torch.equal(a.tensors[0], b.tensors[0])
    assert not torch.equal(a.tensors[0], c.tensors[0])


@pytest.mark.parametrize(("kw", "match"), [({"layout": "rgb"}, "layout"),
                                           ({"test_fraction": 0.0}, "test_fraction"),
                                           ({"test_fraction": 1.5}, "test_fraction"),
                                           ({"test_fraction": 0.001}, "cannot split")])
def test_digits_bad_arguments(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        digits(**kw)


# ---------------------------------------------------------------- synthetic


def _features(x: torch.Tensor, vocab: int) -> np.ndarray:
    if vocab:
        return torch.nn.functional.one_hot(x, vocab).sum(1).float().numpy()
    return x.flatten(1).numpy()


@pytest.mark.parametrize("spec", [resolve_spec("mlp"), resolve_spec("transformer"),
                                  ModelSpec("custom", (3, 5), num_classes=4)])
def test_synthetic_is_seeded_shaped_and_learnable(spec: ModelSpec) -> None:
    train = synthetic(spec, 1024, seed=7)
    again = synthetic(spec, 1024, seed=7)
    other = synthetic(spec, 1024, seed=8)
    test = synthetic(spec, 512, seed=7, part=1)
    x, y = train.tensors
    assert x.shape == (1024, *spec.input_shape) and x.dtype == spec.input_dtype
    assert y.dtype == torch.int64 and 0 <= y.min() and y.max() < spec.num_classes
    if spec.vocab:
        assert 0 <= x.min() and x.max() < spec.vocab
    assert torch.equal(x, again.tensors[0]) and torch.equal(y, again.tensors[1])
    assert not torch.equal(x, other.tensors[0])
    assert not torch.equal(x[:512], test.tensors[0])
    # no class dominates, and a linear model learns the teacher from part 0 to part 1
    assert np.bincount(y.numpy()).max() < 0.3 * len(y)
    clf = LogisticRegression(max_iter=500).fit(_features(x, spec.vocab), y.numpy())
    acc = clf.score(_features(test.tensors[0], spec.vocab), test.tensors[1].numpy())
    assert acc > 0.7


def test_synthetic_rejects_bad_size() -> None:
    with pytest.raises(ConfigError, match="non-negative integer"):
        synthetic(resolve_spec("mlp"), -1, seed=0)


# ---------------------------------------------------------------- MNIST IDX files


def _write_mnist(root: Path, n_train: int = 5, n_test: int = 3, gz: bool = False) -> dict:
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        data = idx_bytes(a)
        (root / (name + ".gz")).write_bytes(gzip.compress(data)) if gz else (root / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_reads_idx_files(tmp_path: Path, gz: bool) -> None:
    arrays = _write_mnist(tmp_path, gz=gz)
    train, test = mnist(tmp_path)
    x, y = train.tensors
    assert x.shape == (5, 1, 28, 28) and x.dtype == torch.float32
    assert len(test) == 3 and y.dtype == torch.int64
    assert y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert test.tensors[1].tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    pixels = x[:, 0] * 0.3081 + 0.1307  # undo normalisation
    assert torch.allclose(pixels * 255, torch.from_numpy(arrays["train-images-idx3-ubyte"]).float(),
                          atol=1e-3)


def test_mnist_missing_file_names_the_path_and_never_downloads(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match=r"t10k-labels-idx1-ubyte\[\.gz\].*never downloads") as e:
        mnist(tmp_path)
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda b: b"\x01" + b[1:], "bad magic"),
        (lambda b: b[:2] + b"\x0d" + b[3:], "not unsigned byte"),
        (lambda b: b[:-7], "file holds"),
        # 65 dimensions, each 1, and one data byte: numpy's reshape raised a ValueError (a traceback)
        (lambda b: b[:3] + bytes([65]) + (1).to_bytes(4, "big") * 65 + b"\x00",
         r"IDX header says 65 dimensions; at most 8 are read \(MNIST files have 1 or 3\)"),
    ],
)
def test_mnist_rejects_malformed_idx(tmp_path: Path, corrupt, match: str) -> None:
    _write_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(ConfigError, match=match):
        mnist(tmp_path)


def test_mnist_rejects_label_count_mismatch(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(4)))
    with pytest.raises(ConfigError, match="do not match"):
        mnist(tmp_path)


# ---------------------------------------------------------------- CIFAR-10 binary files


def _cifar_records(labels: list[int], fill: list[tuple[int, int, int]]) -> bytes:
    out = bytearray()
    for label, (r, g, b) in zip(labels, fill, strict=True):
        out += bytes([label]) + bytes([r]) * 1024 + bytes([g]) * 1024 + bytes([b]) * 1024
    return bytes(out)


def _write_cifar(root: Path) -> Path:
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    (folder / "data_batch_1.bin").write_bytes(_cifar_records([3, 9], [(255, 0, 128), (0, 0, 0)]))
    (folder / "data_batch_2.bin").write_bytes(_cifar_records([0], [(10, 20, 30)]))
    (folder / "test_batch.bin").write_bytes(_cifar_records([7], [(255, 255, 255)]))
    return folder


def test_cifar10_reads_only_its_five_named_batches_and_says_which_are_missing(tmp_path: Path, caplog) -> None:
    """Any data_batch_*.bin was read: a stray data_batch_old.bin beside them was trained on, without a word."""
    folder = _write_cifar(tmp_path)
    (folder / "data_batch_old.bin").write_bytes(_cifar_records([5], [(1, 2, 3)]))
    with caplog.at_level("WARNING", logger="splitfed.data.datasets"):
        train, _ = cifar10(tmp_path)
    assert train.tensors[1].tolist() == [3, 9, 0]
    assert f"{folder} has no data_batch_3.bin, data_batch_4.bin, data_batch_5.bin: training on 2 of the 5" in caplog.text


def test_cifar10_reads_binary_batches_in_order_with_rgb_planes(tmp_path: Path) -> None:
    folder = _write_cifar(tmp_path)
    for root in (tmp_path, folder):  # the parent or the folder itself
        train, test = cifar10(root)
        x, y = train.tensors
        assert x.shape == (3, 3, 32, 32) and x.dtype == torch.float32
        assert y.tolist() == [3, 9, 0] and y.dtype == torch.int64
        assert test.tensors[1].tolist() == [7]
        mean = torch.tensor((0.4914, 0.4822, 0.4465)).view(3, 1, 1)
        std = torch.tensor((0.2470, 0.2435, 0.2616)).view(3, 1, 1)
        pixels = (x * std + mean) * 255
        assert torch.allclose(pixels[0].mean(dim=(1, 2)), torch.tensor([255.0, 0.0, 128.0]), atol=1e-3)
        assert torch.allclose(pixels[2].mean(dim=(1, 2)), torch.tensor([10.0, 20.0, 30.0]), atol=1e-3)


def test_cifar10_missing_files_name_the_path(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-batches-py").mkdir()  # the pickle version is never read
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"data_batch_1\.bin.*never downloads"):
        cifar10(tmp_path)
    folder = _write_cifar(tmp_path / "other")
    (folder / "test_batch.bin").unlink()
    with pytest.raises(ConfigError, match=r"test_batch\.bin.*never downloads"):
        cifar10(folder)


def test_cifar10_rejects_partial_records_and_bad_labels(tmp_path: Path) -> None:
    folder = _write_cifar(tmp_path)
    (folder / "data_batch_2.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(ConfigError, match="3073-byte"):
        cifar10(tmp_path)
    (folder / "data_batch_2.bin").write_bytes(_cifar_records([10], [(0, 0, 0)]))
    with pytest.raises(ConfigError, match="label 10 out of range"):
        cifar10(tmp_path)


# ---------------------------------------------------------------- for_model


@pytest.mark.parametrize(("name", "shape", "dtype"), [("cnn", (1, 8, 8), torch.float32),
                                                      ("mlp", (64,), torch.float32),
                                                      ("transformer", (64,), torch.int64)])
def test_for_model_picks_the_digits_layout(name: str, shape: tuple, dtype: torch.dtype) -> None:
    spec = resolve_spec(name)
    train, test = for_model(spec, "digits", seed=0)
    assert train.tensors[0].shape[1:] == shape and train.tensors[0].dtype == dtype
    assert test.tensors[0].shape[1:] == shape
    assert build(spec, seed=0).eval()(train.tensors[0][:4]).shape == (4, spec.num_classes)


@pytest.mark.parametrize("name", ["mlp", "cnn", "vgg11", "resnet18", "mobilenetv2", "transformer"])
def test_for_model_synthetic_fits_every_zoo_model(name: str) -> None:
    spec = resolve_spec(name)
    train, test = for_model(spec, "synthetic", seed=0, n_synthetic=8)
    assert train.tensors[0].shape == (8, *spec.input_shape)
    assert test.tensors[0].shape == (2, *spec.input_shape)
    assert train.tensors[0].dtype == spec.input_dtype


def test_for_model_reads_local_files_and_flattens_for_vector_models(tmp_path: Path) -> None:
    _write_mnist(tmp_path / "m")
    _write_cifar(tmp_path / "c")
    train, _ = for_model(resolve_spec("cnn", input_shape=(1, 28, 28)), f"mnist:{tmp_path / 'm'}", 0)
    assert train.tensors[0].shape == (5, 1, 28, 28)
    train, _ = for_model(resolve_spec("mlp", input_shape=(784,)), f"mnist:{tmp_path / 'm'}", 0)
    assert train.tensors[0].shape == (5, 784)
    train, _ = for_model(resolve_spec("vgg11"), f"cifar10:{tmp_path / 'c'}", 0)
    assert train.tensors[0].shape == (3, 3, 32, 32)


@pytest.mark.parametrize(
    ("model", "dataset", "match"),
    [
        ("vgg11", "digits", r"\(1, 8, 8\).*\(3, 32, 32\)"),
        ("cnn", "cifar10:{c}", r"\(3, 32, 32\).*\(1, 8, 8\)"),
        ("cnn", "mnist:{m}", r"\(1, 28, 28\).*\(1, 8, 8\)"),
        ("transformer", "mnist:{m}", r"int64 tokens"),
        ("mnist_no_path", "mnist", r"'mnist:PATH'.*never downloads"),
        ("cnn", "imagenet", r"unknown dataset 'imagenet'"),
        ("cnn", "digits:foo", r"unknown dataset"),
        ("few_classes", "digits", r"10 classes.*only 2 outputs"),
    ],
)
def test_for_model_refuses_datasets_that_do_not_fit(tmp_path: Path, model: str, dataset: str,
                                                    match: str) -> None:
    _write_mnist(tmp_path / "m")
    _write_cifar(tmp_path / "c")
    spec = {"mnist_no_path": resolve_spec("cnn"),
            "few_classes": resolve_spec("cnn", num_classes=2)}.get(model) or resolve_spec(model)
    with pytest.raises(ConfigError, match=match):
        for_model(spec, dataset.format(m=tmp_path / "m", c=tmp_path / "c"), seed=0)


def test_for_model_refuses_token_model_with_wrong_shape() -> None:
    spec = ModelSpec("transformer", (32,), 10, vocab=17)
    with pytest.raises(ConfigError, match=r"tokens of shape \(64,\).*\(32,\)"):
        for_model(spec, "digits", seed=0)


def test_for_model_checks_the_shape_before_reading_any_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gives inputs of shape \(3, 32, 32\)"):
        for_model(resolve_spec("cnn"), f"cifar10:{tmp_path / 'absent'}", seed=0)


@pytest.mark.parametrize("model, dataset, shape", [
    ("cnn", "digits", (1, 8, 8)),
    ("cnn", "mnist:/data/mnist", (1, 28, 28)),  # before: cnn wanted 1x8x8 whatever the data
    ("cnn", "cifar10:/data/cifar", (3, 32, 32)),
    ("mlp", "mnist:/data/mnist", (784,)),
    ("mlp", "digits", (64,)),
    ("vgg11", "cifar10:/data/cifar", (3, 32, 32)),
    ("transformer", "digits", (64,)),  # a token model keeps its own
    ("cnn", "synthetic", (1, 8, 8)),  # no shape of its own: the model's
])
def test_a_runs_model_takes_its_datasets_samples(model: str, dataset: str, shape: tuple[int, ...]) -> None:
    from splitfed.flower.config import RunSettings

    assert RunSettings(model=model, dataset=dataset).spec.input_shape == shape


def test_an_npz_gives_its_sample_shape_from_the_header(tmp_path: Path) -> None:
    from splitfed.data.datasets import sample_shape, spec_for

    path = tmp_path / "d.npz"
    np.savez(path, x_train=np.zeros((5, 3, 12, 12), np.float32), y_train=np.zeros(5, np.int64),
             x_test=np.zeros((2, 3, 12, 12), np.float32), y_test=np.zeros(2, np.int64))
    assert sample_shape(f"npz:{path}") == (3, 12, 12)
    assert spec_for("cnn", f"npz:{path}").input_shape == (3, 12, 12)
    assert sample_shape(f"npz:{tmp_path / 'missing.npz'}") is None  # named later, by the reader


@pytest.mark.parametrize("stored,refused", [((32, 32, 3), True), ((28, 28, 1), True), ((64, 64, 4), True),
                                             ((3, 32, 32), False), ((1, 28, 28), False), ((4, 4, 3), False)])
def test_channel_last_images_are_refused_for_a_zoo_image_model(tmp_path: Path, stored: tuple[int, ...],
                                                                refused: bool) -> None:
    """An .npz stored (N, H, W, C) built cnn for C = W channels of H x W... silently: a (32, 32, 3) input
    read as 32 channels of 32x3. It is refused with the transpose that fixes it; a module:factory model
    takes its samples as stored."""
    from splitfed.data.datasets import spec_for
    from splitfed.errors import ConfigError

    path = tmp_path / "d.npz"
    np.savez(path, x_train=np.zeros((5, *stored), np.float32), y_train=np.zeros(5, np.int64),
             x_test=np.zeros((2, *stored), np.float32), y_test=np.zeros(2, np.int64))
    if not refused:
        assert spec_for("cnn", f"npz:{path}").input_shape == stored
        return
    with pytest.raises(ConfigError, match=r"looks channel-last \(H, W, C\); model 'cnn' takes \(C, H, W\).*"
                                          r"x.transpose\(0, 3, 1, 2\)"):
        spec_for("cnn", f"npz:{path}")
    assert spec_for("mlp", f"npz:{path}").input_shape == (int(np.prod(stored)),)  # a vector model: flat


def test_mnist_files_train_a_cnn_sized_for_them(tmp_path: Path) -> None:
    """The README's ``mnist:PATH`` with the zoo's cnn: one in-process round, end to end."""
    from splitfed.flower.config import RunSettings
    from splitfed.sim.inprocess import train_inprocess
    from splitfed.sim.runner import validate

    _write_mnist(tmp_path / "mnist", n_train=16, n_test=4)
    s = RunSettings(rounds=1, clients=2, model="cnn", dataset=f"mnist:{tmp_path / 'mnist'}", cuts="static:1,3",
                    batch_size=8, out=str(tmp_path / "run"))
    validate(s)
    summary = train_inprocess(s)
    assert summary["rounds"] == 1 and summary["final_accuracy"] is not None
