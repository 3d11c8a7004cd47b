"""What a mutation run of the round's last third (``splitfed.engine.rounds``) found unwatched: the block ranges
a round stages on a tier and fetches from a replica are the maximal runs of its blocks, so each range is one call
and no two overlap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitfed.engine.rounds import _runs


def test_runs_of_blocks_with_gaps_are_maximal() -> None:
    assert _runs([]) == []
    assert _runs([2]) == [(2, 3)]
    assert _runs([0, 1, 3, 4]) == [(0, 2), (3, 5)]
    assert _runs([0, 2, 3, 4, 7]) == [(0, 1), (2, 5), (7, 8)]


@given(st.sets(st.integers(0, 40)))
def test_runs_cover_the_blocks_once_in_maximal_ranges(blocks: set[int]) -> None:
    runs = _runs(sorted(blocks))
    assert [i for a, z in runs for i in range(a, z)] == sorted(blocks)  # each block once, in order
    assert all(a < z for a, z in runs)
    assert all(z < a2 for (_, z), (a2, _) in zip(runs, runs[1:], strict=False))  # a gap between any two
