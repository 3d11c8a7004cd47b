"""splitfed/data/partition.py, pinned where a mutation run found nothing watching: the partition cache's check (a
sound entry is used, a foreign one never), the repair's exact sizes, what a seed varies, and the refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from splitfed.data.partition import (
    Partition,
    _fill_to_min_size,
    kept_partition,
    parse_partition,
    partition,
)
from splitfed.errors import ConfigError


def _labels(n: int = 200, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def _lists(parts: list[np.ndarray]) -> list[list[int]]:
    return [p.tolist() for p in parts]


# ---------------------------------------------------------------- the cache's check

_SKEWED = dict(num_clients=6, scheme="dirichlet:0.05", seed=1, min_size=12)  # tiny alpha: some clients topped up


def _entry(folder: Path) -> Path:
    (entry,) = sorted((folder / "partitions").glob("*.npz"))
    return entry


def test_a_sound_entry_is_used_as_it_is(own_cache: Path) -> None:
    """A hit is read, not computed again (what the cache is for): an entry that keeps every law of a partition
    (here the kept one with two clients' samples swapped) is returned as it is, though ``partition`` gives
    another. The kept one has a client of exactly ``min_size`` and runs of consecutive indices: both sound."""
    y = _labels()
    want = partition(y, **_SKEWED)  # type: ignore[arg-type]
    assert _lists(kept_partition(y, **_SKEWED)) == _lists(want)  # type: ignore[arg-type]
    assert min(len(p) for p in want) == _SKEWED["min_size"]
    assert any((np.diff(p) == 1).any() for p in want)
    swapped = {f"p{i}": p for i, p in enumerate(want)}
    swapped["p0"], swapped["p1"] = want[1], want[0]
    assert len(want[0]) != len(want[1]) or _lists(want[:1]) != _lists(want[1:2])
    np.savez(_entry(own_cache), **swapped)
    got = kept_partition(y, **_SKEWED)  # type: ignore[arg-type]
    assert _lists(got) == [want[1].tolist(), want[0].tolist(), *_lists(want[2:])]


def _damage(parts: dict[str, np.ndarray], how: str) -> dict[str, np.ndarray]:
    p = dict(parts)
    if how == "a client missing":
        del p["p5"]
    elif how == "foreign keys":
        p = {f"x{k}": v for k, v in p.items()}
    elif how == "int32 indices":
        p["p2"] = p["p2"].astype(np.int32)
    elif how == "float indices":
        p["p2"] = p["p2"].astype(np.float64)
    elif how == "two-dimensional":
        p = {k: v.reshape(1, -1) for k, v in p.items()}
    elif how == "a client below min_size":  # still every sample, once: only the size law is broken
        p["p4"] = np.sort(np.concatenate([p["p4"], p["p0"][1:]]))
        p["p0"] = p["p0"][:1]
    elif how == "unsorted":
        p["p3"] = p["p3"][::-1].copy()
    elif how == "an index twice":
        p["p1"] = np.sort(np.concatenate([p["p1"], p["p1"][:1]]))
    elif how == "a sample nobody has":
        p["p1"] = p["p1"][1:]
    elif how == "an index past the end":
        p["p1"] = np.append(p["p1"], 10_000)
    return p


@pytest.mark.parametrize("how", ["a client missing", "foreign keys", "int32 indices", "float indices",
                                 "two-dimensional", "a client below min_size", "unsorted", "an index twice",
                                 "a sample nobody has", "an index past the end"])
def test_a_foreign_or_corrupt_entry_is_computed_again(own_cache: Path, how: str) -> None:
    y = _labels()
    want = partition(y, **_SKEWED)  # type: ignore[arg-type]
    kept_partition(y, **_SKEWED)  # type: ignore[arg-type]
    entry = _entry(own_cache)
    np.savez(entry, **_damage({k: v.copy() for k, v in np.load(entry).items()}, how))
    got = kept_partition(y, **_SKEWED)  # type: ignore[arg-type]
    assert _lists(got) == _lists(want) and all(p.dtype == np.int64 and p.ndim == 1 for p in got)
    assert sorted(np.load(entry).files) == [f"p{i}" for i in range(6)]  # replaced by a sound one


def test_numpy_integer_arguments_are_taken_as_plain_python_does(own_cache: Path) -> None:
    """A seed or min_size from a numpy array (np.int64) is accepted by partition; the kept form must not choke
    on it (it would not fit the cache key's JSON)."""
    y = _labels()
    want = partition(y, 4, "dirichlet:0.5", 7, 2)
    assert _lists(kept_partition(y, 4, "dirichlet:0.5", np.int64(7), 2)) == _lists(want)  # type: ignore[arg-type]
    assert _lists(kept_partition(y, 4, "dirichlet:0.5", 7, np.int64(2))) == _lists(want)  # type: ignore[arg-type]


def test_kept_partition_gives_each_client_one_sample_by_default() -> None:
    """min_size's default is 1 as in ``partition``: three samples go to three clients, one each."""
    assert _lists(kept_partition(np.array([0, 1, 0]), 3, "iid", 5)) == _lists(partition(np.array([0, 1, 0]), 3,
                                                                                          "iid", 5))
    assert sorted(len(p) for p in kept_partition(np.array([0, 1, 0]), 3, "iid", 5)) == [1, 1, 1]


# ---------------------------------------------------------------- the repair


def _expected_sizes(sizes: list[int], min_size: int) -> list[int]:
    """The repair's rule on sizes alone: each short client in id order takes what it lacks, as far as the
    largest client (lowest id on ties) can spare above min_size, until it has min_size."""
    s = list(sizes)
    for i in range(len(s)):
        while s[i] < min_size:
            d = max(range(len(s)), key=lambda j: (s[j], -j))
            take = min(min_size - s[i], s[d] - min_size)
            s[i] += take
            s[d] -= take
    return s


@pytest.mark.parametrize(("sizes", "min_size", "want"), [
    ([3, 50, 0], 10, [10, 33, 10]),  # a part-filled client takes only what it lacks
    ([0, 12, 11], 5, [5, 7, 11]),  # the largest gives all at once: the runner-up keeps its own
    ([1, 6, 6, 1], 3, [3, 4, 4, 3]),  # ties: the lowest id gives first
    ([0, 5, 5, 2], 3, [3, 3, 3, 3]),  # a donor gives only what it can spare, then the next largest
    ([4, 4], 4, [4, 4]),
])
def test_the_repair_moves_exactly_what_is_lacking(sizes: list[int], min_size: int, want: list[int]) -> None:
    assert _expected_sizes(sizes, min_size) == want
    for seed in range(12):
        starts = np.cumsum([0, *sizes])
        parts = [np.arange(a, b, dtype=np.int64) for a, b in zip(starts[:-1], starts[1:], strict=True)]
        before = [p.copy() for p in parts]
        _fill_to_min_size(parts, min_size, np.random.default_rng(seed))
        assert [len(p) for p in parts] == want
        every = np.concatenate(parts)
        assert sorted(every.tolist()) == list(range(sum(sizes)))  # nothing lost, nothing twice
        for p, b, n in zip(parts, before, sizes, strict=True):
            if n <= min_size:  # a short client keeps its own and only gains
                assert set(b.tolist()) <= set(p.tolist())
            else:  # a donor only gives
                assert set(p.tolist()) <= set(b.tolist())


@pytest.mark.parametrize("seed", range(6))
def test_a_partitions_repair_follows_the_rule_from_the_drawn_sizes(seed: int) -> None:
    """Through ``partition``: min_size 0 is the draw unrepaired; min_size m moves exactly what the rule says."""
    y = _labels(120, 6, seed)
    raw = partition(y, 8, "dirichlet:0.05", seed, 0)
    fixed = partition(y, 8, "dirichlet:0.05", seed, 9)
    assert [len(p) for p in fixed] == _expected_sizes([len(p) for p in raw], 9)
    assert sorted(np.concatenate(fixed).tolist()) == list(range(120))


# ---------------------------------------------------------------- what a seed varies


def _class_counts(y: np.ndarray, parts: list[np.ndarray]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(np.bincount(y[p], minlength=int(y.max()) + 1).tolist()) for p in parts)


def test_each_seed_draws_its_own_label_skew() -> None:
    """The seed varies which classes each client gets, not only which samples of them: 70 seeds, 70 skews (the
    partitioner's seed is the derived one cut to 32 bits; cut to a few bits, seeds would share skews)."""
    y = _labels(300, 5)
    skews = {_class_counts(y, partition(y, 4, "dirichlet:1", s, 0)) for s in range(70)}
    assert len(skews) == 70


def test_small_alpha_can_give_one_client_every_class() -> None:
    """Per-class Dirichlet shares, drawn independently (no self-balancing): with alpha tiny each class goes
    (nearly) whole to one of two clients, so over a few seeds one client gets all three classes. Flower's
    self-balancing would stop giving to a client past the average, capping it at two thirds."""
    y = np.repeat([0, 1, 2], 40)
    biggest = [max(len(p) for p in partition(y, 2, "dirichlet:0.01", s, 0)) for s in range(16)]
    assert max(biggest) >= 118


# ---------------------------------------------------------------- the scheme and the refusals


def test_an_iid_scheme_reads_iid_whatever_its_alpha() -> None:
    assert str(Partition("iid", 0.5)) == "iid"
    assert str(Partition("iid")) == "iid" and str(Partition("dirichlet", 0.5)) == "dirichlet:0.5"


def test_a_scheme_is_a_value() -> None:
    p = parse_partition("dirichlet:0.5")
    assert {p, parse_partition("Dirichlet:0.50")} == {Partition("dirichlet", 0.5)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.alpha = 2.0  # type: ignore[misc]
    assert p.alpha == 0.5


@pytest.mark.parametrize("bad", [0.5, 3, None, ["iid"]])
def test_a_partition_that_is_not_text_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match=f"partition must be a string.*got {type(bad).__name__}"):
        parse_partition(bad)  # type: ignore[arg-type]


def test_float_class_ids_are_labels_and_nan_is_refused() -> None:
    y = np.array([0.0, 1.0, 2.0, 0.0, 1.0, 2.0])
    assert sorted(np.concatenate(partition(y, 2, "iid", 0)).tolist()) == list(range(6))
    assert sorted(np.concatenate(partition(torch.tensor(y), 2, "dirichlet:1", 0, 0)).tolist()) == list(range(6))
    with pytest.raises(ConfigError, match="2 of 6 are NaN"):
        partition(np.array([0.0, np.nan, 1.0, np.nan, 1.0, 0.0]), 2, "dirichlet:1", 0)
