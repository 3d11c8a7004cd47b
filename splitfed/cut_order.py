"""The rule every cut vector keeps whatever its model: a cut counts the blocks before it, so none is negative and
none is below the one before. Needs no torch: a command line checks it before its imports
(:func:`splitfed.commands._args.cut_list`); :func:`splitfed.models.segment.validate_cuts` adds the model's range."""

from __future__ import annotations

from collections.abc import Sequence

from splitfed.errors import CutError


def check_order(cuts: Sequence[int]) -> tuple[int, ...]:
    """``cuts`` as a tuple, refused (:class:`CutError`) if a cut is negative or the vector decreases."""
    cuts = tuple(int(k) for k in cuts)
    text = ",".join(map(str, cuts))
    negative = [k for k in cuts if k < 0]
    if negative:
        raise CutError(f"cut {negative[0]} is out of range: a cut counts the blocks before it (0 or more), got {text}")
    if any(b < a for a, b in zip(cuts, cuts[1:], strict=False)):
        raise CutError(f"cuts must be non-decreasing, got {text}")
    return cuts
