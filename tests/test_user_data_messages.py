"""What a user with their own data or model is told: every refusal names the real reason and a way out the
command at hand has.

- an ``npz:`` dataset is opened in one place (:func:`splitfed.data.datasets._open_npz`): a ``.npy`` given as one is
  refused as "not a .npz archive" on every path, never a TypeError;
- a ``module:factory`` model, which takes its input shape from the dataset, is told why the .npz gives none,
  in the words a zoo model's run is told;
- a model that outputs other than the classes expected is told how its factory gets them (``--model-kwargs``;
  a run has no ``--num-classes``);
- more clients than samples is refused with fewer clients or more samples (no run sets ``min_size``);
- :func:`splitfed.engine.verify.verify` refuses a ``transport`` its chain is not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch import nn

from splitfed.cli import main
from splitfed.data.datasets import for_model, read_npz, sample_classes, sample_shape, spec_for
from splitfed.data.partition import partition
from splitfed.engine.verify import verify
from splitfed.errors import ConfigError
from splitfed.models.zoo import model_blocks, resolve_spec

HERE = "tests.test_user_data_messages"
CNN = resolve_spec("cnn")


def fixed_net() -> nn.Module:
    """A factory with 10 outputs whatever the run's classes."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def sized_net(num_classes: int = 10) -> nn.Module:
    """A factory that takes its classes: 10 unless given through the model's keyword arguments."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, num_classes))


def _digits_npz(path: Path, *, labels_from: int = 0, **arrays: np.ndarray) -> Path:
    """10 train and 4 test samples shaped as digits; labels ``labels_from``.. (10 classes from 0)."""
    rng = np.random.default_rng(0)
    given = {"x_train": rng.random((10, 1, 8, 8), dtype=np.float32), "y_train": np.arange(10) + labels_from,
             "x_test": rng.random((4, 1, 8, 8), dtype=np.float32), "y_test": np.arange(4) + labels_from}
    np.savez(path, **{**given, **arrays})
    return path


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# ---------------------------------------------------------------- D1: a .npy given as an .npz


def test_a_npy_given_as_npz_is_refused_on_every_path_not_a_type_error(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``TypeError: 'numpy.ndarray' object does not support the context manager protocol`` out of
    ``sample_classes`` (np.load gives a .npy's array), a traceback and exit 1 from simulate."""
    arr = tmp_path / "arr.npy"
    np.save(arr, np.zeros((3, 64), np.float32))
    refusal = f"dataset npz:{arr}: not a .npz archive (a zip of arrays, as numpy.savez writes; a .npy file holds one array)"
    assert sample_classes(f"npz:{arr}") is None and sample_shape(f"npz:{arr}") is None  # named by the reader
    with pytest.raises(ConfigError) as e:
        read_npz(arr, CNN)
    assert str(e.value) == refusal
    for model in ("cnn", f"{HERE}:fixed_net"):
        line = _refused(capsys, ["simulate", "--dataset", f"npz:{arr}", "--model", model, "--clients", "2",
                                 "--rounds", "1", "--out", str(tmp_path / "run")])
        assert line == f"splitfed simulate: error: {refusal}"
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- D2: a factory told why the .npz has no samples


def _unreadable(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """An .npz no sample shape can be read from, and the words the reader refuses it with."""
    path = tmp_path / f"{kind}.npz"
    if kind == "nofile":
        return path, "no such file; splitfed never downloads: put the files there yourself"
    if kind == "object":
        _digits_npz(path, x_train=np.array([None] * 10, dtype=object))
        return path, ("cannot read it as a NumPy .npz without pickle: ValueError: Object arrays cannot be loaded "
                      "when allow_pickle=False")
    if kind == "flat":
        _digits_npz(path, x_train=np.zeros(10, np.float32))
        return path, "x_train: want one or more samples, shape (N, ...), got (10,)"
    rng = np.random.default_rng(0)
    np.savez(path, X_train=rng.random((8, 64), dtype=np.float32), y_train=np.arange(8),
             x_test=rng.random((4, 64), dtype=np.float32), y_test=np.arange(4))
    return path, ("missing array(s) x_train (it has X_train, y_train, x_test, y_test; want x_train, y_train, "
                  "x_test, y_test)")


@pytest.mark.parametrize("kind", ["nofile", "object", "flat", "misspelt"])
def test_a_factory_model_is_told_why_an_npz_gives_no_samples_as_a_zoo_model_is(tmp_path: Path, kind: str) -> None:
    """Before, a ``module:factory`` model was told only "none can be read from 'npz:...' (an .npz needs
    x_train)" for each of these, while ``cnn`` was told the reason."""
    path, words = _unreadable(tmp_path, kind)
    dataset = f"npz:{path}"
    with pytest.raises(ConfigError) as factory:
        spec_for(f"{HERE}:fixed_net", dataset)
    with pytest.raises(ConfigError) as zoo:
        for_model(spec_for("cnn", dataset), dataset, 0)
    assert str(factory.value) == str(zoo.value) == f"dataset {dataset}: {words}"
    assert sample_shape(dataset) is None  # and the zoo model's run is refused by the reader, as before


def test_a_factory_still_takes_an_npz_sample_shape_from_its_header(tmp_path: Path) -> None:
    path = _digits_npz(tmp_path / "d.npz", x_train=np.zeros((10, 64), np.float32), x_test=np.zeros((4, 64), np.float32))
    assert spec_for(f"{HERE}:fixed_net", f"npz:{path}") == resolve_spec(f"{HERE}:fixed_net", (64,), 10)


# ---------------------------------------------------------------- D3: classes a factory does not output


def test_a_class_mismatch_names_the_way_out_every_command_has() -> None:
    """Before: "(--num-classes, or as many as the run's dataset has)" alone, in simulate too, which has no
    --num-classes; a factory is never given the class count, so the way out is its keyword arguments."""
    said = "outputs 10 classes, and 11 are expected (--num-classes in verify, blocks, profile, optimize and ping; in " \
           "a run, as many as its dataset has): "
    with pytest.raises(ConfigError) as e:
        model_blocks(resolve_spec(f"{HERE}:sized_net", (1, 8, 8), 11))
    assert str(e.value) == (f"model {HERE}:sized_net {said}give its factory num_classes, which no command passes "
                            """it: --model-kwargs '{"num_classes": 11}'""")
    with pytest.raises(ConfigError) as e:
        model_blocks(resolve_spec(f"{HERE}:fixed_net", (1, 8, 8), 11))
    assert str(e.value) == (f"model {HERE}:fixed_net {said}make its factory build 11 outputs (or take num_classes, "
                            """given with --model-kwargs '{"num_classes": 11}')""")
    with pytest.raises(ConfigError) as e:
        model_blocks(resolve_spec(f"{HERE}:sized_net", (1, 8, 8), 10, options={"num_classes": 11}))
    assert str(e.value).endswith(": its factory is given num_classes 11 (--model-kwargs); give it 10")
    spec = resolve_spec(f"{HERE}:sized_net", (1, 8, 8), 11, options={"num_classes": 11})
    assert model_blocks(spec)[0][-1].out_features == 11  # the way out named works


def test_simulate_names_model_kwargs_for_labels_from_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _digits_npz(tmp_path / "lab1.npz", labels_from=1)  # labels 1..10: 11 classes
    argv = ["simulate", "--dataset", f"npz:{data}", "--model", f"{HERE}:sized_net", "--cuts", "static:1,3",
            "--clients", "2", "--rounds", "1", "--out", str(tmp_path / "run")]
    line = _refused(capsys, argv)
    assert line.startswith(f"splitfed simulate: error: model {HERE}:sized_net outputs 10 classes, and 11 are expected")
    assert line.endswith("""give its factory num_classes, which no command passes it: --model-kwargs '{"num_classes": 11}'""")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- D5: more clients than samples


def test_more_clients_than_samples_names_fewer_clients_or_more_samples() -> None:
    """Before: "(min_size 0 lets clients have none)", a setting no run has; and "1 samples"."""
    with pytest.raises(ConfigError) as e:
        partition(np.arange(5), 6, "iid", 0)
    assert str(e.value) == "6 clients but only 5 samples: each client needs at least one; use at most 5 clients, " \
                           "or more samples"
    with pytest.raises(ConfigError) as e:
        partition(np.arange(1), 2, "iid", 0)
    assert str(e.value) == "2 clients but only 1 sample: each client needs at least one; use at most 1 client, " \
                           "or more samples"
    with pytest.raises(ConfigError) as e:
        partition(np.arange(1), 2, "dirichlet:0.5", 0, min_size=0)
    assert str(e.value) == "2 clients but only 1 sample: a Dirichlet partition needs at least as many samples as " \
                           "clients"


# ---------------------------------------------------------------- D4: verify's transport


def test_verify_refuses_a_transport_its_chain_is_not() -> None:
    """Before: transport="grpc" without a chain trained in process and reported "grpc"; "bogus" was reported
    as it was given, ok True."""
    spec = resolve_spec(f"{HERE}:fixed_net", (64,), 10)
    with pytest.raises(ConfigError) as e:
        verify(spec, [(2, 3)], transport="bogus")
    assert str(e.value) == ("verify: transport must be one of 'inproc', 'grpc' (the kind of chain it trains on, as "
                            "the result reports it), got 'bogus'")
    with pytest.raises(ConfigError) as e:
        verify(spec, [(2, 3)], transport="grpc")
    assert str(e.value) == ("verify: transport 'grpc' needs the gRPC chain itself: chain=grpc_chain(addresses) of "
                            "running tiers (splitfed verify --transport grpc starts them); without one it trains in "
                            "process")
    result = verify(spec, [(2, 3)], steps=1)
    assert result.transport == "inproc" and result.ok


# ---------------------------------------------------------------- D6: complex inputs


def test_complex_inputs_are_refused_as_not_real_numbers(tmp_path: Path) -> None:
    path = _digits_npz(tmp_path / "c.npz", x_train=np.zeros((10, 1, 8, 8), np.complex64))
    with pytest.raises(ConfigError) as e:
        read_npz(path, CNN)
    assert str(e.value) == f"dataset npz:{path}: x_train: inputs must be real numbers, got dtype complex64"
