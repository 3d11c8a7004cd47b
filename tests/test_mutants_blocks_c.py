"""What a mutation run of ``splitfed.models.blocks`` (its last third, now ``models.check`` and ``models.trace``) found
unwatched: the names a Sequential's children go by, which ``splitfed blocks`` prints and an error names, are their
leaf modules, joined."""

from __future__ import annotations

from torch import nn

from splitfed.models.blocks import to_blocks


def test_a_sequential_child_is_named_by_its_leaf_modules() -> None:
    """A child that holds modules is named by the leaves inside it (not by its own type, nor with it); a leaf is
    named by its type; a child with no modules at all by its own type."""
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
                          nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Tanh()),
                          nn.Linear(4, 2), nn.Sequential())
    assert to_blocks(model).names == ["Linear+ReLU", "Linear+Tanh", "Linear", "Sequential"]
