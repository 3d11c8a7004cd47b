"""splitfed's cache (splitfed/cache.py): what it keeps is what computing again gives, bit for bit; a hit skips the
imports it exists for; a damaged, wrong or unwritable cache costs time, never a result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed import cache
from splitfed.data import datasets
from splitfed.data.datasets import digits
from splitfed.data.partition import kept_partition, partition
from splitfed.models.zoo import resolve_spec
from splitfed.profile import profiler

ROOT = Path(__file__).resolve().parents[1]


def _entries(folder: Path, kind: str) -> list[Path]:
    return sorted((folder / kind).glob("*.npz")) if (folder / kind).is_dir() else []


def _same_split(a: datasets.Split, b: datasets.Split) -> bool:
    return all(torch.equal(x, y) for da, db in zip(a, b, strict=True)
               for x, y in zip(da.tensors, db.tensors, strict=True))


def _labels(n: int = 300, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


# ---------------------------------------------------------------- where


def test_the_folder_is_the_variable_else_xdg_else_home_and_off_is_none(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cache.ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache.root() == tmp_path / "home" / ".cache" / "splitfed"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.root() == tmp_path / "xdg" / "splitfed"
    monkeypatch.setenv(cache.ENV, str(tmp_path / "mine"))
    assert cache.root() == tmp_path / "mine"
    assert profiler.default_cache_dir() == tmp_path / "mine" / "profiles"
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "p"))
    assert profiler.default_cache_dir() == tmp_path / "p"  # the profiles' own variable still wins
    monkeypatch.delenv("SPLITFED_PROFILE_CACHE")
    for off in ("off", " OFF "):
        monkeypatch.setenv(cache.ENV, off)
        assert cache.root() is None
        assert profiler.default_cache_dir() is None


def test_a_relative_or_home_folder_is_the_one_it_names_where_the_run_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's Ray actors and tier processes inherit the variables, and may work in another folder: ``pin`` (which
    ``simulate`` calls before they start) spells them absolute, so every process of a run keeps to one cache."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.ENV, "~/c")
    monkeypatch.setenv(cache.PROFILE_ENV, "p")
    assert cache.root() == tmp_path / "home" / "c"
    assert profiler.default_cache_dir() == tmp_path / "p"
    cache.pin()
    assert os.environ[cache.ENV] == str(tmp_path / "home" / "c")
    assert os.environ[cache.PROFILE_ENV] == str(tmp_path / "p")
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path / "home")  # another working folder: the same folders
    assert cache.root() == tmp_path / "home" / "c" and profiler.default_cache_dir() == tmp_path / "p"  # pinned
    monkeypatch.setenv(cache.ENV, "OFF")
    cache.pin()
    assert os.environ[cache.ENV] == "OFF" and cache.root() is None  # off stays off
    monkeypatch.delenv(cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG spec: ignored
    assert cache.root() == tmp_path / "home" / ".cache" / "splitfed"
    monkeypatch.setenv(cache.PROFILE_ENV, "~/profiles")  # read where a profile is kept, too: one reading of it
    monkeypatch.setattr(profiler, "_MEMORY", {})  # measured now, whatever this process measured before
    profiler.profile_model(resolve_spec("mlp"), batch=2, reps=1)
    assert len(list((tmp_path / "home" / "profiles").glob("mlp-*.json"))) == 1


def test_simulate_pins_the_cache_before_ray_and_the_tiers_start(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from splitfed.flower.config import RunSettings
    from splitfed.sim import runner
    from splitfed.sim.ray_start import RayStartError

    seen: list[str] = []

    def start_ray(*args: object, **kw: object) -> None:
        seen.append(os.environ[cache.ENV])
        raise RayStartError("not this time")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.ENV, "rel")
    monkeypatch.setattr(runner, "start_ray", start_ray)
    with pytest.raises(runner.SimulationError, match="not this time"):
        runner.simulate(RunSettings(rounds=1, clients=2), progress=lambda line: None)
    assert seen == [str(tmp_path / "rel")]


def test_off_computes_everything_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    y = _labels()
    assert [p.tolist() for p in kept_partition(y, 4, "dirichlet:0.5", 3)] == \
        [p.tolist() for p in partition(y, 4, "dirichlet:0.5", 3)]
    digits(seed=5)
    assert not any(tmp_path.rglob("*.npz"))


# ---------------------------------------------------------------- digits


def test_a_kept_digits_split_is_the_computed_one_in_every_layout(own_cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = {}
    monkeypatch.setenv(cache.ENV, "off")
    for layout in ("image", "flat", "tokens"):
        fresh[layout] = digits(seed=7, layout=layout)  # type: ignore[arg-type]
    monkeypatch.setenv(cache.ENV, str(own_cache))
    for layout in ("image", "flat", "tokens"):  # the first a miss that keeps the split, the others hits
        assert _same_split(digits(seed=7, layout=layout), fresh[layout])  # type: ignore[arg-type]
    assert len(_entries(own_cache, "digits")) == 1  # one split, whatever the layout
    assert _same_split(digits(seed=7), fresh["image"])
    digits(seed=8)
    digits(seed=7, test_fraction=0.3)
    assert len(_entries(own_cache, "digits")) == 3  # seed and fraction are in the key


def test_a_new_scikit_learn_or_edited_loader_is_a_new_entry(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digits(seed=1)
    real = cache.versions
    monkeypatch.setattr(cache, "versions", lambda *d: {k: v + ".post9" for k, v in real(*d).items()})
    digits(seed=1)
    assert len(_entries(own_cache, "digits")) == 2
    monkeypatch.setattr(cache, "versions", real)
    monkeypatch.setattr(cache, "source_digest", lambda *m: "another loader")
    digits(seed=1)
    assert len(_entries(own_cache, "digits")) == 3


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "a pixel of 17", "a sample short",
                                    "float pixels"])
def test_a_damaged_or_wrong_digits_entry_is_computed_again_and_replaced(own_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      damage: str) -> None:
    want = digits(seed=2)
    (entry,) = _entries(own_cache, "digits")
    kept = dict(np.load(entry))
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:200])
    elif damage == "garbage":
        entry.write_bytes(b"PK\x03\x04" + os.urandom(500))
    elif damage == "empty":
        entry.write_bytes(b"")
    else:
        if damage == "a pixel of 17":
            kept["x_train"][0, 0] = 17
        elif damage == "a sample short":
            kept = {k: v[:-1] if k.endswith("train") else v for k, v in kept.items()}
        else:
            kept["x_test"] = kept["x_test"].astype(np.float64)
        np.savez(entry, **kept)
    assert _same_split(digits(seed=2), want)
    assert cache.load("digits", entry.stem, datasets._whole_digits) is not None  # replaced by a sound one


def test_an_unwritable_cache_costs_time_not_a_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.ENV, "off")
    want_digits, want_parts = digits(seed=4), partition(_labels(), 5, "dirichlet:0.3", 4)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache.ENV, str(blocker))  # every entry's folder would be inside a file
    assert _same_split(digits(seed=4), want_digits)
    got = kept_partition(_labels(), 5, "dirichlet:0.3", 4)
    assert [p.tolist() for p in got] == [p.tolist() for p in want_parts]
    assert blocker.read_text() == "not a folder"


# ---------------------------------------------------------------- partitions


@settings(max_examples=25)
@given(n=st.integers(20, 400), classes=st.integers(1, 12), k=st.integers(1, 12),
       alpha=st.sampled_from([0.05, 0.3, 1.0, 10.0]), seed=st.integers(0, 2**31), min_size=st.integers(0, 1))
def test_a_kept_partition_is_what_partition_gives_on_a_miss_and_on_a_hit(
        tmp_path_factory: pytest.TempPathFactory, n: int, classes: int, k: int, alpha: float, seed: int,
        min_size: int) -> None:
    y = np.random.default_rng(seed).integers(0, classes, n)
    want = partition(y, k, f"dirichlet:{alpha}", seed, min_size)
    folder = tmp_path_factory.mktemp("cache")
    env = os.environ.get(cache.ENV)
    os.environ[cache.ENV] = str(folder)
    try:
        for _ in ("miss", "hit"):
            got = kept_partition(torch.from_numpy(y), k, f"dirichlet:{alpha}", seed, min_size)
            assert [p.tolist() for p in got] == [p.tolist() for p in want]
            assert all(p.dtype == np.int64 for p in got)
    finally:
        os.environ.pop(cache.ENV) if env is None else os.environ.__setitem__(cache.ENV, env)
    assert len(_entries(folder, "partitions")) == 1


def test_every_input_of_a_partition_is_in_its_key(own_cache: Path) -> None:
    y = _labels()
    base = dict(labels=y, num_clients=4, scheme="dirichlet:0.5", seed=1, min_size=1)
    kept_partition(**base)  # type: ignore[arg-type]
    others = [dict(base, labels=_labels(seed=1)), dict(base, num_clients=5), dict(base, scheme="dirichlet:0.6"),
              dict(base, seed=2), dict(base, min_size=0), dict(base, labels=y.astype(np.int32))]
    for i, kw in enumerate(others, start=2):
        got = kept_partition(**kw)  # type: ignore[arg-type]
        assert [p.tolist() for p in got] == [p.tolist() for p in partition(**kw)]  # type: ignore[arg-type]
        assert len(_entries(own_cache, "partitions")) == i
    kept_partition(y, 4, "iid", 1)  # cheap: never kept
    assert len(_entries(own_cache, "partitions")) == len(others) + 1


@pytest.mark.parametrize("damage", ["overlap", "a sample lost", "unsorted", "a client short", "a client more",
                                    "float indices", "truncated"])
def test_a_damaged_or_wrong_partition_entry_is_computed_again(own_cache: Path, damage: str) -> None:
    y = _labels(200)
    want = partition(y, 4, "dirichlet:1", 9)
    kept_partition(y, 4, "dirichlet:1", 9)
    (entry,) = _entries(own_cache, "partitions")
    parts = {k: v.copy() for k, v in np.load(entry).items()}
    if damage == "overlap":
        parts["p1"] = np.sort(np.concatenate([parts["p1"], parts["p0"][:1]]))
    elif damage == "a sample lost":
        parts["p0"] = parts["p0"][1:]
    elif damage == "unsorted":
        parts["p2"] = parts["p2"][::-1].copy()
    elif damage == "a client short":  # min_size 1: an empty client breaks the law
        parts["p3"] = np.sort(np.concatenate([parts["p3"], parts["p0"]]))
        parts["p0"] = parts["p0"][:0]
    elif damage == "a client more":
        parts["p4"] = np.zeros(0, np.int64)
    elif damage == "float indices":
        parts["p1"] = parts["p1"].astype(np.float64)
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:-40])
    else:
        np.savez(entry, **parts)
    got = kept_partition(y, 4, "dirichlet:1", 9)
    assert [p.tolist() for p in got] == [p.tolist() for p in want]


def test_a_hit_in_a_new_process_imports_neither_scikit_learn_nor_flwr_datasets(own_cache: Path) -> None:
    """What the cache is for: a process loading a client's data (a Ray actor, a deployed ClientApp) after the
    first pays none of those imports, and loads the same samples."""
    probe = (
        "import json, sys\n"
        "from splitfed.flower import workload\n"
        "from splitfed.models.zoo import resolve_spec\n"
        "x, y = workload.client_data(resolve_spec('cnn'), 'digits', 'dirichlet:0.5', 6, 2, 3)\n"
        "heavy = sorted(m for m in ('sklearn', 'flwr_datasets', 'datasets', 'pyarrow', 'pandas') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'x': x.sum().item(), 'y': y.tolist()}))\n"
    )
    env = {**os.environ, cache.ENV: str(own_cache), "PYTHONPATH": str(ROOT)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True,
                                      text=True, check=True, timeout=300).stdout) for _ in ("miss", "hit")]
    assert {"sklearn", "flwr_datasets"} <= set(runs[0]["heavy"])  # the miss computed them with those libraries
    assert runs[1]["heavy"] == []
    assert runs[1]["x"] == runs[0]["x"] and runs[1]["y"] == runs[0]["y"]
    assert len(_entries(own_cache, "digits")) == 1 and len(_entries(own_cache, "partitions")) == 1


# ---------------------------------------------------------------- profiles


def test_a_runs_profile_is_kept_on_disk_and_timed_once(own_cache: Path) -> None:
    from splitfed.flower.adaptive import run_profile
    from splitfed.flower.config import RunSettings

    s = RunSettings(model="mlp", batch_size=16)
    prof = run_profile(s)
    assert prof.reps == 1  # a run uses no measured times
    (kept,) = (own_cache / "profiles").glob("*.json")
    assert json.loads(kept.read_text())["fwd_flops"] == list(prof.fwd_flops)


def test_a_profile_under_another_default_dtype_is_not_the_float32_one(tmp_path: Path) -> None:
    spec = resolve_spec("mlp")
    f32 = profiler.profile_model(spec, 8, reps=1, cache_dir=tmp_path)
    torch.set_default_dtype(torch.float64)
    try:
        f64 = profiler.profile_model(spec, 8, reps=1, cache_dir=tmp_path)
    finally:
        torch.set_default_dtype(torch.float32)
    assert sum(f64.param_bytes) == 2 * sum(f32.param_bytes)  # measured anew, not the float32 one kept
    assert len(list(tmp_path.glob("*.json"))) == 2
    assert profiler.profile_model(spec, 8, reps=1, cache_dir=tmp_path).param_bytes == f32.param_bytes


def test_a_template_under_another_default_dtype_is_built_in_it() -> None:
    """The engine's template cache (in memory) is keyed by the default dtype too: a float32 template served a
    process that had switched to float64, whose tiers then trained float32 weights."""
    from splitfed.engine import template

    spec = resolve_spec("mlp")
    n = template.num_blocks(spec)
    f32 = torch.nn.ModuleList(template.copy_blocks(spec, 0, n).values())
    torch.set_default_dtype(torch.float64)
    try:
        f64 = torch.nn.ModuleList(template.copy_blocks(spec, 0, n).values())
        boundary = template.boundary(spec, 1)
    finally:
        torch.set_default_dtype(torch.float32)
    assert {p.dtype for p in f32.parameters()} == {torch.float32}
    assert {p.dtype for p in f64.parameters()} == {torch.float64}
    assert boundary[1] == torch.float64
    assert template.boundary(spec, 1)[1] == torch.float32
