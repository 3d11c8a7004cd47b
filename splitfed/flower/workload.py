"""Who trains on what: a client's partition, its batches in a round, and the held-out test.

The ClientApp, the ServerApp's evaluation and the tests' unsplit reference all
call these functions, so "the same client batches" is true by construction:
a client's data depends only on (model, dataset, partition scheme, number of
partitions, partition id, seed) and its batch order on (seed, partition id,
round, epoch), never on which process or node runs it. A deployed node may
instead train on its own file (:func:`node_data`), batched the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from splitfed.data import for_model
from splitfed.data._seed import derive_seed
from splitfed.data.batches import EpochBatches
from splitfed.data.datasets import local_path, read_npz
from splitfed.data.partition import kept_partition
from splitfed.engine import template
from splitfed.engine.rounds import Batches, RoundFailed
from splitfed.engine.types import State
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec

_BATCH_STREAM = 101  # derive_seed purpose of the per-client batch order


@lru_cache(maxsize=4)
def _split(spec_json: str, dataset: str,
           seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(train, test) tensors; cached because every virtual node of a process reads the same files."""
    train, test = for_model(ModelSpec.from_dict(json.loads(spec_json)), dataset, seed)
    (x_train, y_train), (x_test, y_test) = train.tensors, test.tensors  # each dataset is (inputs, labels)
    return (x_train, y_train), (x_test, y_test)


@lru_cache(maxsize=8)
def _parts(spec_json: str, dataset: str, scheme: str, num_partitions: int, seed: int) -> tuple[np.ndarray, ...]:
    (_, y), _ = _split(spec_json, dataset, seed)
    return tuple(kept_partition(y, num_partitions, scheme, seed))


def _key(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


def partitions_digest(spec: ModelSpec, dataset: str, scheme: str, num_partitions: int, seed: int) -> str:
    """sha256 of which samples each client trains on: a resume compares it, since the same settings and files
    can be dealt out otherwise by another splitfed (its Dirichlet draws changed once)."""
    h = hashlib.sha256()
    for part in _parts(_key(spec), dataset, scheme, num_partitions, seed):
        h.update(len(part).to_bytes(8, "little"))
        h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
    return h.hexdigest()


def client_data(spec: ModelSpec, dataset: str, scheme: str, num_partitions: int, partition_id: int,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training samples of one partition."""
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition id {partition_id} is outside 0..{num_partitions - 1}")
    (x, y), _ = _split(_key(spec), dataset, seed)
    idx = torch.from_numpy(_parts(_key(spec), dataset, scheme, num_partitions, seed)[partition_id])
    return x[idx], y[idx]


def node_data(spec: ModelSpec, data_file: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A node's own training samples: ``x_train`` and ``y_train`` of the ``.npz`` its node config names
    (``data-file``), all of them, whatever its partition; re-read only when the file changes."""
    path = local_path(data_file)  # ~ expanded, as a dataset spec's path is
    try:
        st = path.stat()
    except OSError:
        raise ConfigError(f"data-file {data_file}: no such file on this node") from None
    return _node_data(_key(spec), str(path.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=2)
def _node_data(spec_json: str, path: str, _mtime_ns: int, _size: int) -> tuple[torch.Tensor, torch.Tensor]:
    (train,) = read_npz(path, ModelSpec.from_dict(json.loads(spec_json)), keys=("x_train", "y_train"))
    x, y = train.tensors
    return x, y


def round_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int, partition_id: int,
                  round: int, epochs: int) -> Batches:
    """The batches a client trains on in ``round`` (1-based): ``epochs`` shuffled passes, each batch made as
    it is trained on."""
    for key, value in (("round (1-based)", round), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
    stream = derive_seed(seed, _BATCH_STREAM, partition_id)
    return EpochBatches(x, y, batch_size, stream, range((round - 1) * epochs, round * epochs))


def train_data(spec: ModelSpec, dataset: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All training samples (every partition together: the centralised baseline's data)."""
    (x, y), _ = _split(_key(spec), dataset, seed)
    return x, y


def test_data(spec: ModelSpec, dataset: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    _, (x, y) = _split(_key(spec), dataset, seed)
    return x, y


@torch.no_grad()
def evaluate(spec: ModelSpec, state: State, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 512) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of the global model on held-out data."""
    model = template.whole_model(spec, state).eval()
    correct, loss = 0, 0.0
    for i in range(0, len(x), batch_size):
        out = model(x[i:i + batch_size])
        loss += float(F.cross_entropy(out, y[i:i + batch_size], reduction="sum"))
        correct += int((out.argmax(1) == y[i:i + batch_size]).sum())
    n = max(1, len(x))
    return correct / n, loss / n


class RunDiverged(RoundFailed):
    """The global model's test loss is not finite: no later round can recover it."""


def check_converging(rnd: int, loss: float, lr: float) -> None:
    """Stop a run whose global model diverged, before its checkpoint replaces the last good one.

    Finite logits give a finite cross-entropy, so a non-finite test loss means logits that overflowed:
    every client of the next round would train on them and be dropped.
    """
    if not math.isfinite(loss):
        kept = (f"the checkpoint keeps round {rnd - 1}" if rnd > 1 else
                "no round is kept (start it again with --overwrite; flwr run: overwrite = true)")
        raise RunDiverged(f"round {rnd}: the global model diverged (its test loss is not finite); the run "
                          f"stops and {kept} (a learning rate below {lr:g}?)")

