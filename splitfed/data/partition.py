"""Split a labelled dataset among clients: ``iid`` or ``dirichlet:ALPHA`` label skew."""

from __future__ import annotations

import hashlib
import math
import numbers
import sys
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from splitfed import cache
from splitfed.data import _seed
from splitfed.data._seed import derive_seed
from splitfed.errors import ConfigError

MAX_ALPHA = 1e6  # beyond it every client's class shares are within 0.1% of IID; near the float maximum numpy's
# draw is all zeros, and the partitioner then gave every sample but a few to one client
_FORMS = f"'iid' or 'dirichlet:ALPHA' with 0 < ALPHA <= {MAX_ALPHA:g} (e.g. 'dirichlet:0.5'; 'iid' for an even split)"


@dataclass(frozen=True)
class Partition:
    """A parsed partition scheme; ``str()`` gives back the canonical text."""

    kind: Literal["iid", "dirichlet"]
    alpha: float | None = None

    def __str__(self) -> str:
        if self.kind == "iid" or self.alpha is None:
            return "iid"
        short = f"{self.alpha:g}"  # '0.5', '3', '1e-06'; repr where ':g' would round (0.123456789)
        return f"dirichlet:{short if float(short) == self.alpha else repr(self.alpha)}"


def parse_partition(text: str | Partition) -> Partition:
    """Parse a partition string from a config or the command line."""
    if isinstance(text, Partition):
        return text
    if not isinstance(text, str):
        raise ConfigError(f"partition must be a string ({_FORMS}), got {type(text).__name__}")
    s = text.strip().lower()
    if s == "iid":
        return Partition("iid")
    name, sep, arg = s.partition(":")
    if name == "dirichlet" and sep:
        try:
            alpha = float(arg)
        except ValueError:
            alpha = math.nan
        if 0 < alpha <= MAX_ALPHA:
            return Partition("dirichlet", alpha)
        raise ConfigError(f"bad Dirichlet alpha {arg.strip()!r} in partition {text!r}: use {_FORMS}")
    raise ConfigError(f"unknown partition {text!r}: use {_FORMS}")


def partition(labels: np.ndarray | torch.Tensor, num_clients: int, scheme: str | Partition,
              seed: int, min_size: int = 1) -> list[np.ndarray]:
    """Disjoint, sorted int64 index arrays, one per client, covering every sample.

    The result depends only on (labels, num_clients, scheme, seed, min_size). Every client
    gets at least ``min_size`` samples (0: a client may get none, so there may be more clients than samples): Dirichlet draws that leave a client short are fixed
    by moving randomly chosen samples from the largest client, so no draw is ever refused.
    """
    scheme = parse_partition(scheme)
    y = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if y.ndim != 1:
        raise ConfigError(f"labels must be one-dimensional, got shape {tuple(y.shape)}")
    n = len(y)
    if y.dtype.kind in "fc" and np.isnan(y).any():  # no class: the Dirichlet split dropped those samples
        raise ConfigError(f"labels must be class ids: {int(np.isnan(y).sum())} of {n} are NaN")
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ConfigError(f"num_clients must be a positive integer, got {num_clients!r}")
    if isinstance(min_size, bool) or not isinstance(min_size, numbers.Integral) or min_size < 0:
        raise ConfigError(f"min_size must be an integer >= 0, got {min_size!r}")
    samples, clients = (f"{n} sample", f"{n} client") if n == 1 else (f"{n} samples", f"{n} clients")
    if num_clients > n and min_size > 0:  # min_size is no run setting: the way out is fewer clients or more data
        raise ConfigError(f"{num_clients} clients but only {samples}: each client needs at least one; use at most "
                          f"{clients}, or more samples")
    if num_clients * min_size > n:
        raise ConfigError(
            f"{num_clients} clients x min_size {min_size} = {num_clients * min_size} samples "
            f"needed, only {n} available"
        )
    if scheme.kind != "iid" and num_clients > n:  # flwr-datasets' partitioner refuses it
        raise ConfigError(f"{num_clients} clients but only {samples}: a Dirichlet partition needs at least as "
                          "many samples as clients")
    rng = np.random.default_rng(derive_seed(seed, 0))
    if scheme.kind == "iid":
        # Not flwr-datasets' IidPartitioner: it cuts *contiguous* shards without shuffling,
        # which on label-sorted data is the opposite of IID. Permute, then shard.
        parts = np.array_split(rng.permutation(n), num_clients)
    else:
        assert scheme.alpha is not None
        order = np.random.default_rng(derive_seed(seed, 2)).permutation(n)
        parts = _dirichlet(y, num_clients, scheme.alpha, derive_seed(seed, 1), order)
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    _fill_to_min_size(parts, min_size, rng)
    return [np.sort(p) for p in parts]


def kept_partition(labels: np.ndarray | torch.Tensor, num_clients: int, scheme: str | Partition,
                   seed: int, min_size: int = 1) -> list[np.ndarray]:
    """:func:`partition`, kept in the cache (:mod:`splitfed.cache`) where it needs flwr-datasets (Dirichlet):
    a hit imports none of it, which every process loading a client's data would otherwise (seconds each).

    The key holds the labels' digest, every argument, this module's code and the versions of flwr-datasets,
    datasets and numpy (whose draws the partitioner makes), so a hit is what :func:`partition` returns now."""
    scheme = parse_partition(scheme)
    if scheme.kind == "iid" or type(seed) is not int or type(min_size) is not int or type(num_clients) is not int:
        return partition(labels, num_clients, scheme, seed, min_size)  # cheap, or refused there
    y = np.ascontiguousarray(labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else labels)
    digest = hashlib.sha256(f"{y.dtype.str}{y.shape}".encode() + y.tobytes()).hexdigest()
    key = cache.entry_key(kind="partition", labels=digest, clients=num_clients, scheme=str(scheme), seed=seed,
                          min_size=min_size, code=cache.source_digest(sys.modules[__name__], _seed),
                          **cache.versions("flwr-datasets", "datasets", "numpy"))

    def covers(a: cache.Arrays) -> bool:  # the partition's laws: disjoint, sorted, every sample, none short
        if sorted(a) != sorted(f"p{i}" for i in range(num_clients)):
            return False
        parts = [a[f"p{i}"] for i in range(num_clients)]
        if any(p.dtype != np.int64 or p.ndim != 1 or len(p) < min_size or (np.diff(p) <= 0).any() for p in parts):
            return False
        return bool(np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(y))))

    def computed() -> dict[str, np.ndarray]:
        return {f"p{i}": p for i, p in enumerate(partition(y, num_clients, scheme, seed, min_size))}

    kept = cache.kept("partitions", key, covers, computed)
    return [kept[f"p{i}"] for i in range(num_clients)]


def _dirichlet(y: np.ndarray, num_clients: int, alpha: float, seed: int,
               order: np.ndarray) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) shares over clients, via flwr-datasets' DirichletPartitioner.

    It runs offline on an in-memory ``datasets.Dataset``. ``min_partition_size=0`` because its
    own minimum handling redraws up to 10 times and then raises; we fix sizes afterwards.
    It cuts each class into *contiguous* runs in row order (client 0 the first samples of every
    class), so it is handed the rows in the random ``order``: which samples of a class a client
    gets is then random, and only the labels are skewed, never the file's order (its sources, dates).
    Imported lazily: ``flwr_datasets`` costs seconds to import and IID does not need it.
    """
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    p = DirichletPartitioner(num_partitions=num_clients, partition_by="label", alpha=float(alpha),
                             min_partition_size=0, self_balancing=False, shuffle=False,
                             seed=seed % 2**32)
    # Arrow format: in datasets 4.x the default (and the numpy) format hands the partitioner a
    # lazy Column that np.array() reads row by row: seconds for MNIST-sized label arrays.
    rows = {"label": y[order], "_row": np.asarray(order, dtype=np.int64)}
    p.dataset = Dataset.from_dict(rows).with_format("arrow")
    return [p.load_partition(i)["_row"].to_numpy().astype(np.int64) for i in range(num_clients)]


def _fill_to_min_size(parts: list[np.ndarray], min_size: int, rng: np.random.Generator) -> None:
    """Top up short clients from the currently largest one (lowest id on ties); in place.

    Feasible whenever ``len(parts) * min_size <= total``: while a client is short, some other
    client holds more than ``min_size``, so the largest can always give at least one sample.
    """
    for i in range(len(parts)):
        while len(parts[i]) < min_size:
            donor = int(np.argmax([len(p) for p in parts]))
            take = min(min_size - len(parts[i]), len(parts[donor]) - min_size)
            pick = np.zeros(len(parts[donor]), dtype=bool)
            pick[rng.choice(len(parts[donor]), size=take, replace=False)] = True
            parts[i] = np.concatenate([parts[i], parts[donor][pick]])
            parts[donor] = parts[donor][~pick]
