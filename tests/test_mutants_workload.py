"""What the mutation run of ``splitfed/flower/workload.py`` found unpinned: a partition id one past the last is
refused in words (not an IndexError), and the centralised baseline's data is every partition's together."""

from __future__ import annotations

import pytest
import torch

from splitfed.errors import ConfigError
from splitfed.flower.workload import client_data, train_data
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("cnn")


@pytest.mark.parametrize("partition_id", [-1, 3, 4])
def test_a_partition_outside_the_deal_is_refused_naming_the_range(partition_id: int) -> None:
    with pytest.raises(ConfigError, match=rf"partition id {partition_id} is outside 0\.\.2"):
        client_data(SPEC, "digits", "iid", 3, partition_id, 0)


def test_the_baseline_trains_on_every_partitions_samples_together() -> None:
    x, y = train_data(SPEC, "digits", 0)
    parts = [client_data(SPEC, "digits", "dirichlet:0.5", 3, i, 0) for i in range(3)]
    assert len(x) == len(y) == sum(len(px) for px, _ in parts) > 0
    every = torch.cat([px for px, _ in parts])
    # the same samples, dealt out: each sample of a partition is one of the baseline's (sorted rows agree)
    assert torch.equal(torch.sort(every.flatten(1).sum(1)).values, torch.sort(x.flatten(1).sum(1)).values)
    assert torch.equal(torch.sort(torch.cat([py for _, py in parts])).values, torch.sort(y).values)
