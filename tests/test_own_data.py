"""Your own data: a run on ``npz:FILE``, and a deployed node training on its own ``data-file``.

The laws: the same tensors train the same model whichever way they arrive (a
file of digits trains exactly as ``digits``; nodes reading their partitions from
their own files train exactly as partitions of the run's dataset), and every bad
file is refused with the file and the array named.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import clients.app
from splitfed.data.datasets import dataset_digest, dataset_files, for_model, read_npz
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.workload import client_data
from splitfed.models.zoo import resolve_spec
from tests.flower_fixtures import FakeGrid
from tests.test_flower_apps import BASE, _run

CNN = resolve_spec("cnn")  # digits-shaped: (1, 8, 8) images, 10 classes


def save(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def digits_npz(path: Path, seed: int = 0) -> Path:
    """The digits split ``for_model`` gives ``cnn`` for ``seed``, as a file."""
    (xtr, ytr), (xte, yte) = (d.tensors for d in for_model(CNN, "digits", seed))
    return save(path, x_train=xtr.numpy(), y_train=ytr.numpy(), x_test=xte.numpy(), y_test=yte.numpy())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), flat=st.booleans(), dtype=st.sampled_from(["float32", "float64", "uint8", "int16"]),
       seed=st.integers(0, 2**31 - 1))
def test_any_well_formed_file_loads_as_float32_inputs_and_int64_labels(tmp_path_factory, n, flat, dtype,
                                                                       seed) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, 64)) * 50).astype(dtype)
    y = rng.integers(0, 10, size=n).astype(rng.choice(["int64", "int32", "uint8"]))
    given_x = x if flat else x.reshape(n, 1, 8, 8)
    path = save(tmp_path_factory.mktemp("npz") / "d.npz", x_train=given_x, y_train=y, x_test=given_x[:1],
                y_test=y[:1])
    if flat:  # flat samples are never guessed into images (which axis is the channel?)
        with pytest.raises(ConfigError, match=r"x_train: model 'cnn' takes samples of shape \(1, 8, 8\), got \(64,\)"):
            read_npz(path, CNN)
    for spec in ([] if flat else [CNN]) + [resolve_spec("mlp", input_shape=(64,), num_classes=10)]:
        train, test = read_npz(path, spec)
        xt, yt = train.tensors
        assert xt.dtype == torch.float32 and xt.shape == (n, *spec.input_shape)
        assert torch.equal(xt.flatten(1), torch.from_numpy(x.astype(np.float32)))  # values as given, not normalised
        assert yt.dtype == torch.int64 and yt.tolist() == y.astype(np.int64).tolist()
        assert len(test) == 1


def test_a_digits_file_trains_exactly_as_digits(monkeypatch, tmp_path) -> None:
    """``npz:FILE`` holding the very tensors of ``digits``: the same partitions, batches and model."""
    path = digits_npz(tmp_path / "digits.npz")
    s = BASE.with_(model="cnn", rounds=1)
    _run(monkeypatch, s.with_(out=str(tmp_path / "a")))
    _run(monkeypatch, s.with_(out=str(tmp_path / "b"), dataset=f"npz:{path}"))
    a, b = checkpoint.load(tmp_path / "a").state, checkpoint.load(tmp_path / "b").state
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_nodes_with_their_own_files_train_exactly_as_partitions(monkeypatch, tmp_path) -> None:
    """Each node's ``data-file`` holds what its partition would be: the run ends bit-identical to the
    run without files, so a node's file is trained on, batched and averaged by its own size."""
    s = BASE.with_(model="cnn", rounds=2, partition="dirichlet:0.5")
    grid = FakeGrid(clients.app.app, s.clients)
    for i, ctx in enumerate(grid.contexts.values()):
        x, y = client_data(CNN, s.dataset, s.partition, s.clients, i, s.seed)
        ctx.node_config["data-file"] = str(save(tmp_path / f"node{i}.npz", x_train=x.numpy(), y_train=y.numpy()))
        del ctx.node_config["num-partitions"]  # its own data: the partition id only names the client
    _run(monkeypatch, s.with_(out=str(tmp_path / "files"), dataset="digits", partition="iid"), grid=grid)
    _run(monkeypatch, s.with_(out=str(tmp_path / "parts")))
    a, b = checkpoint.load(tmp_path / "files").state, checkpoint.load(tmp_path / "parts").state
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_node_whose_file_is_bad_is_left_out_with_its_reason(monkeypatch, tmp_path, caplog) -> None:
    s = BASE.with_(model="cnn", rounds=1, min_clients=3)
    grid = FakeGrid(clients.app.app, s.clients)
    bad = save(tmp_path / "bad.npz", x_train=np.zeros((3, 1, 8, 8), np.float32), y_train=np.array([0, 1, 99]))
    next(iter(grid.contexts.values())).node_config["data-file"] = str(bad)
    import logging

    with caplog.at_level(logging.WARNING, logger="flwr"):
        summary, _ = _run(monkeypatch, s.with_(out=str(tmp_path / "run")), grid=grid)
    assert summary["rounds"] == 1
    assert "did not answer the query round" in caplog.text and "labels must lie in 0..9" in caplog.text


@pytest.mark.parametrize(("arrays", "words"), [
    (None, r"missing array\(s\) x_train, y_train, x_test, y_test \(it has other"),
    ({"x_test": None, "y_test": None},  # None: left out
     r"missing array\(s\) x_test, y_test \(it has x_train, y_train"),
    ({"x_train": np.zeros((2, 3, 8, 8))}, r"x_train: model 'cnn' takes samples of shape \(1, 8, 8\), got \(3, 8, 8\)"),
    ({"x_train": np.zeros((0, 1, 8, 8))}, r"x_train: want one or more samples"),
    ({"x_train": np.full((2, 1, 8, 8), np.nan)}, "x_train: holds NaN or infinite values"),
    ({"x_train": np.full((2, 1, 8, 8), 1e300)}, "x_train: holds NaN or infinite values"),
    ({"x_train": np.array([["a"] * 64] * 2).reshape(2, 1, 8, 8)}, "x_train: inputs must be real numbers"),
    ({"y_train": np.zeros(2)}, r"y_train: want 2 integer class labels, shape \(2,\), got float64"),
    ({"y_train": np.zeros(3, np.int64)}, r"y_train: want 2 integer class labels"),
    ({"y_test": np.array([-1])}, r"y_test: labels must lie in 0..9 \(model 'cnn' has 10 outputs\), found -1..-1"),
])
def test_a_bad_file_is_refused_naming_file_and_array(tmp_path, arrays, words) -> None:  # type: ignore[no-untyped-def]
    good = {"x_train": np.zeros((2, 1, 8, 8), np.float32), "y_train": np.array([0, 1]),
            "x_test": np.zeros((1, 1, 8, 8), np.float32), "y_test": np.array([3])}
    given = {"other": np.zeros(1)} if arrays is None else {**good, **arrays}
    path = save(tmp_path / "d.npz", **{k: v for k, v in given.items() if v is not None})
    with pytest.raises(ConfigError, match=f"dataset npz:{path}: {words}"):
        read_npz(path, CNN)


def test_files_that_are_not_npz_or_need_pickle_are_refused(tmp_path) -> None:
    text = tmp_path / "t.npz"
    text.write_text("not a zip")
    with pytest.raises(ConfigError, match="not a .npz archive"):
        read_npz(text, CNN)
    pickled = save(tmp_path / "p.npz", x_train=np.array([object()] * 2), y_train=np.array([0, 1]),
                   x_test=np.zeros((1, 64)), y_test=np.array([0]))
    with pytest.raises(ConfigError, match="without pickle"):
        read_npz(pickled, CNN)
    with pytest.raises(ConfigError, match="no such file; splitfed never downloads"):
        read_npz(tmp_path / "missing.npz", CNN)
    with pytest.raises(ConfigError, match="'npz:FILE' with arrays x_train, y_train, x_test, y_test"):
        for_model(CNN, "npz:", 0)


def test_token_models_take_integer_tokens_within_their_vocab(tmp_path) -> None:
    spec = resolve_spec("transformer")
    shape, vocab = spec.input_shape, spec.vocab
    tokens = np.arange(2 * int(np.prod(shape))).reshape(2, *shape) % vocab
    ok = save(tmp_path / "ok.npz", x_train=tokens, y_train=np.array([0, 1]), x_test=tokens[:1], y_test=np.array([1]))
    (x, _), _ = (d.tensors for d in read_npz(ok, spec))
    assert x.dtype == torch.int64 and torch.equal(x, torch.from_numpy(tokens))
    bad = save(tmp_path / "bad.npz", x_train=tokens + vocab, y_train=np.array([0, 1]), x_test=tokens[:1],
               y_test=np.array([1]))
    with pytest.raises(ConfigError, match=f"x_train: tokens must lie in 0..{vocab - 1}"):
        read_npz(bad, spec)


def test_a_node_file_is_read_again_only_when_it_changes(tmp_path) -> None:
    from splitfed.flower.workload import node_data

    path = save(tmp_path / "n.npz", x_train=np.zeros((2, 1, 8, 8), np.float32), y_train=np.array([0, 1]))
    first = node_data(CNN, str(path))
    assert node_data(CNN, str(path))[0] is first[0]  # cached
    save(path, x_train=np.ones((3, 1, 8, 8), np.float32), y_train=np.array([0, 1, 2]))
    assert len(node_data(CNN, str(path))[0]) == 3
    with pytest.raises(ConfigError, match="data-file .*missing.npz: no such file on this node"):
        node_data(CNN, str(tmp_path / "missing.npz"))


def test_simulate_accepts_an_npz_dataset_from_the_command_line(tmp_path) -> None:
    from splitfed.sim.runner import validate

    path = digits_npz(tmp_path / "d.npz")
    validate(RunSettings(model="cnn", dataset=f"npz:{path}", clients=2))
    with pytest.raises(ConfigError, match="no such file"):
        validate(RunSettings(model="cnn", dataset=f"npz:{tmp_path / 'nope.npz'}", clients=2))


def test_a_run_does_not_resume_on_data_that_changed_under_it(monkeypatch, tmp_path) -> None:
    """The checkpoint keeps a digest of the dataset's files: the same file resumes, a changed one is refused
    (before, the run went on silently training on other data than its first rounds)."""
    path = digits_npz(tmp_path / "d.npz")
    s = BASE.with_(model="cnn", rounds=1, dataset=f"npz:{path}", out=str(tmp_path / "run"))
    _run(monkeypatch, s)
    assert checkpoint.load(tmp_path / "run").data.startswith(dataset_digest(s.dataset) + "+") and dataset_digest(s.dataset)
    _run(monkeypatch, s.with_(rounds=2, resume=True))  # the same file: resumes
    assert checkpoint.load(tmp_path / "run").round == 2
    with np.load(path) as f:
        arrays = dict(f)
    arrays["y_train"] = (arrays["y_train"] + 1) % 10
    save(path, **arrays)
    with pytest.raises(ConfigError, match=r"cannot resume: the files of dataset 'npz:.*d.npz' changed since the "
                                          r"checkpoint \(sha256 [0-9a-f]{12}\.\.\. then, [0-9a-f]{12}\.\.\. now\)"):
        _run(monkeypatch, s.with_(rounds=3, resume=True))
    assert checkpoint.load(tmp_path / "run").round == 2


def test_the_digest_covers_every_file_a_dataset_reads(tmp_path) -> None:
    from tests.test_data import _write_cifar, _write_mnist

    assert dataset_digest("digits") == dataset_digest("synthetic") == ""
    _write_mnist(tmp_path / "mnist", gz=True)
    _write_cifar(tmp_path / "cifar")
    for dataset, files in ((f"mnist:{tmp_path / 'mnist'}", 4), (f"cifar10:{tmp_path / 'cifar'}", 3)):
        found = dataset_files(dataset)
        assert len(found) == files and all(f.is_file() for f in found)
        before = dataset_digest(dataset)
        for f in found:  # any one file changing changes the digest
            data = f.read_bytes()
            f.write_bytes(data + b"\0")
            assert dataset_digest(dataset) != before
            f.write_bytes(data)
        assert dataset_digest(dataset) == before


def test_a_run_has_as_many_classes_as_its_npz_labels_name(tmp_path) -> None:
    """Before, every run had 10 classes: a user's 3-class model was refused ("--num-classes is 10", a flag
    simulate does not have) and a 100-class file could not be trained at all (labels beyond 9 refused)."""
    from splitfed.data.datasets import spec_for
    from splitfed.engine import template

    rng = np.random.default_rng(0)
    three = save(tmp_path / "three.npz", x_train=rng.normal(size=(30, 16)).astype(np.float32),
                 y_train=np.arange(30) % 3, x_test=rng.normal(size=(6, 16)).astype(np.float32),
                 y_test=np.arange(6) % 2)
    spec = spec_for("tests.own_models:reused_layer", f"npz:{three}")  # a user model with 3 outputs
    assert (spec.input_shape, spec.num_classes) == ((16,), 3)
    template.template(spec)  # its outputs fit: accepted
    assert spec_for("mlp", f"npz:{three}").num_classes == 3  # a zoo model's head follows the data too
    many = save(tmp_path / "many.npz", x_train=rng.normal(size=(40, 1, 8, 8)).astype(np.float32),
                y_train=np.arange(40), x_test=rng.normal(size=(4, 1, 8, 8)).astype(np.float32),
                y_test=np.arange(4))
    spec = spec_for("cnn", f"npz:{many}")
    assert spec.num_classes == 40
    (train, _test) = read_npz(many, spec)
    assert int(train.tensors[1].max()) == 39  # labels beyond 9 load
    assert spec_for("cnn", "digits").num_classes == 10


@pytest.mark.parametrize(("labels", "words"), [
    ([0, 1, 2, 2**40], r"label 1099511627776 would give the model 1,099,511,627,777 outputs; splitfed builds at "
                       r"most 1,000,000 classes"),
    ([0, 5_000_000], r"label 5000000 would give the model 5,000,001 outputs"),
])
def test_labels_that_give_no_buildable_classifier_are_refused_before_anything_starts(tmp_path, capsys, labels,
                                                                                    words) -> None:
    """Labels set the class count: 2**40 gave an 8 TiB allocation and a traceback, 5,000,000 started the engine
    and the tiers before a tier refused the model, and all-zero labels got a 10-class model without a word.
    ``splitfed simulate`` through ``splitfed.cli.main`` in this process (its words, code and files; a process
    cost ~3 s of imports): a refusal of simulate runs as a process in test_compute (--tier-torch-device cuda)."""
    from splitfed.cli import main as cli
    from splitfed.data.datasets import spec_for

    n = len(labels)
    path = save(tmp_path / "d.npz", x_train=np.zeros((n, 1, 8, 8), np.float32), y_train=np.array(labels),
                x_test=np.zeros((1, 1, 8, 8), np.float32), y_test=np.array([0]))
    with pytest.raises(ConfigError, match=f"dataset npz:{path}: {words}"):
        spec_for("cnn", f"npz:{path}")
    capsys.readouterr()
    code = cli(["simulate", "--dataset", f"npz:{path}", "--clients", "2", "--rounds", "1", "--out",
                str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and len(err.splitlines()) == 1, err  # nothing started
    assert not (tmp_path / "run").exists()


def test_negative_labels_are_refused_without_a_warning_about_unused_classes(tmp_path, caplog) -> None:
    from splitfed.data.datasets import spec_for

    path = save(tmp_path / "d.npz", x_train=np.zeros((4, 1, 8, 8), np.float32), y_train=np.array([0, -1, 2, 3]),
                x_test=np.zeros((1, 1, 8, 8), np.float32), y_test=np.array([0]))
    spec = spec_for("cnn", f"npz:{path}")
    with pytest.raises(ConfigError, match=r"y_train: labels must lie in 0\.\.9 .*found -1\.\.3"):
        read_npz(path, spec)
    assert "no sample has class" not in caplog.text


def test_a_class_count_beyond_what_splitfed_builds_is_refused_wherever_a_spec_is_made() -> None:
    for bad in (0, -3, 1_000_001):
        with pytest.raises(ConfigError, match=f"num_classes must be in 1..1,000,000, got {bad}"):
            resolve_spec("cnn", num_classes=bad)


def test_a_user_model_on_synthetic_data_is_refused_saying_why() -> None:
    from splitfed.data.datasets import spec_for

    with pytest.raises(ConfigError, match=r"takes its input shape from the dataset's samples, and 'synthetic' "
                                          r"has none of its own: use digits"):
        spec_for("tests.own_models:reused_layer", "synthetic")


@pytest.mark.parametrize("partition", ["iid", "dirichlet:0.5"])
def test_a_run_does_not_resume_on_samples_dealt_out_otherwise(monkeypatch, tmp_path, partition: str) -> None:
    """The same settings and files can be dealt out to the clients otherwise by another splitfed (its Dirichlet
    draws changed): the checkpoint keeps a digest of each client's samples, and a resume that would train on
    others is refused. A checkpoint from before the digest resumes an IID run (dealt as now), not a Dirichlet one."""
    from dataclasses import replace

    s = BASE.with_(model="cnn", rounds=1, partition=partition, out=str(tmp_path / "run"))
    _run(monkeypatch, s)
    kept = checkpoint.load(tmp_path / "run")
    files, sep, parts = kept.data.partition("+")
    assert sep and len(parts) == 64
    checkpoint.save(tmp_path / "run", replace(kept, data=f"{files}+{'0' * 64}"))  # dealt otherwise back then
    with pytest.raises(ConfigError, match=r"cannot resume: the clients would train on other samples than before "
                                          r"the checkpoint \(partition '.*' deals them out otherwise"):
        _run(monkeypatch, s.with_(rounds=2, resume=True))
    checkpoint.save(tmp_path / "run", replace(kept, data=files))  # a checkpoint written before the digest
    if partition == "iid":
        _run(monkeypatch, s.with_(rounds=2, resume=True))
        assert checkpoint.load(tmp_path / "run").round == 2
    else:
        with pytest.raises(ConfigError, match="cannot resume: the clients would train on other samples"):
            _run(monkeypatch, s.with_(rounds=2, resume=True))
