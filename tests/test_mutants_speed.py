"""What the mutation run of splitfed/profile/speed.py found no test for: where the timing stops adding blocks
(a pass of exactly the budget is enough; blocks are added one at a time), the floor on a pass the clock
could not see, and that a measurement cannot be changed once made. Timed on a clock the test drives, so the
answers are exact, not timings of this machine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from splitfed.engine import template
from splitfed.models.zoo import resolve_spec
from splitfed.profile.speed import SpeedMeasure, measure_speed

SPEC = resolve_spec("cnn")  # 7 blocks


def _passes(durations: Sequence[float]) -> Callable[[], float]:
    """A clock under which the i-th timed pass takes ``durations[i]`` seconds (the last one from then on): each
    pass reads it twice, at its start and at its end. Binary fractions: the differences are exact."""
    state = {"now": 0.0, "reads": 0}

    def clock() -> float:
        if state["reads"] % 2:  # a pass ends
            i = state["reads"] // 2
            state["now"] += durations[min(i, len(durations) - 1)]
        state["reads"] += 1
        return state["now"]
    return clock


def test_a_pass_that_takes_exactly_the_budget_is_long_enough() -> None:
    m = measure_speed(SPEC, SPEC.example_input(4), budget_s=0.5, clock=_passes([0.5]))
    assert (m.blocks, m.samples, m.seconds) == (1, 4, 0.5)


def test_blocks_are_added_one_at_a_time_until_a_pass_takes_the_budget() -> None:
    """Passes of 0.25 s with 1 and 2 blocks, then 1 s: the third block is the first whose pass meets 0.5 s, and
    the median of the 3 timed passes after it is 1 s (adding two at a time would stop at block 5)."""
    m = measure_speed(SPEC, SPEC.example_input(4), budget_s=0.5, clock=_passes([0.25, 0.25, 1.0]))
    assert (m.blocks, m.seconds) == (3, 1.0)
    assert 3 < template.num_blocks(SPEC)


def test_a_pass_the_clock_could_not_see_is_one_nanosecond() -> None:
    """A clock too coarse to see the pass (0 s): every block is added, and the time is the 1 ns floor, not 0 (a
    measurement refuses 0 s), nor any other floor."""
    m = measure_speed(SPEC, SPEC.example_input(2), budget_s=0.5, clock=_passes([0.0]))
    assert (m.blocks, m.samples, m.seconds) == (template.num_blocks(SPEC), 2, 1e-9)


def test_a_measurement_cannot_be_changed_once_made() -> None:
    m = SpeedMeasure(2, 8, 0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.seconds = 0.2  # type: ignore[misc]
