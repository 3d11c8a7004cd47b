"""Data: offline datasets, client partitions and seeded batches."""

from splitfed.data.batches import batch_order, batches
from splitfed.data.datasets import cifar10, digits, for_model, mnist, read_idx, synthetic
from splitfed.data.partition import Partition, parse_partition, partition

__all__ = [
    "Partition",
    "batch_order",
    "batches",
    "cifar10",
    "digits",
    "for_model",
    "mnist",
    "parse_partition",
    "partition",
    "read_idx",
    "synthetic",
]
