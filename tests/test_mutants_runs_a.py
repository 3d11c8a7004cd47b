"""What the run reader promises at its edges, pinned where a mutation run found nothing checking it.

``parse_row``: round 0 and accuracies of exactly 0 and 1 are accepted, and a round without ``bytes_up`` or
``bytes_down`` counts 0 bytes each way. ``parse_cuts``: a bare integer is one cut, and a cut of exactly
``MAX_CUT`` is accepted. The refusal of an out-of-range cut quotes the cuts whole up to 80 characters and cut to
77 plus ``...`` past that. ``Run.rounds_to_target`` counts a round that reaches the target exactly;
``Run.final`` is the last round. ``load_run`` of a path that does not exist says so and nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from splitfed.errors import ConfigError
from splitfed.report.runs import MAX_CUT, load_run, parse_cuts, parse_row, rows_to_run


def _row(**kw):
    return {"round": 1, "accuracy": 0.5, "sim_round_s": 2.0, **kw}


def test_round_zero_is_a_round():
    """Round 0 (the initial model's accuracy) is a non-negative integer, not a refusal."""
    assert parse_row(_row(round=0)).round == 0


def test_accuracy_bounds_are_inclusive():
    """An accuracy of exactly 0 or exactly 1 lies in [0, 1]."""
    assert parse_row(_row(accuracy=0)).accuracy == 0.0
    assert parse_row(_row(accuracy=1)).accuracy == 1.0
    with pytest.raises(ConfigError, match=r"'accuracy' must be in \[0, 1\], got 1.5"):
        parse_row(_row(accuracy=1.5))


def test_missing_bytes_count_zero():
    """A round that states no activation bytes moved none: not one byte each way."""
    r = parse_row(_row())
    assert (r.bytes_up, r.bytes_down, r.bytes_total) == (0, 0, 0)
    r = parse_row(_row(bytes_up=7))
    assert (r.bytes_up, r.bytes_down) == (7, 0)
    r = parse_row(_row(bytes_down=9))
    assert (r.bytes_up, r.bytes_down) == (0, 9)


def test_a_bare_integer_is_one_cut():
    """``{"c": 3}`` is client c cutting after block 3, as ``[3]`` is."""
    assert parse_cuts({"c": 3, "d": [1, 2]}) == {"c": (3,), "d": (1, 2)}
    assert parse_row(_row(cuts=[4])).cuts == {"0": (4,)}


def test_cut_at_max_cut_is_accepted():
    """``MAX_CUT`` itself is in 0..MAX_CUT; one past it is refused."""
    assert parse_cuts({"c": [0, MAX_CUT]}) == {"c": (0, MAX_CUT)}
    with pytest.raises(ConfigError, match=r"must lie in 0\.\.10,000"):
        parse_cuts({"c": [MAX_CUT + 1]})


def _refusal(cuts: list[int]) -> str:
    with pytest.raises(ConfigError) as e:
        parse_cuts({"c": cuts})
    return str(e.value).rsplit("got ", 1)[1]


def _cuts_of_repr_len(n: int) -> list[int]:
    """A list with a bad cut whose repr is exactly ``n`` characters."""
    # [20000, 1, 1, ..., 1]: "[20000" + ", 1" * k + "]" is 7 + 3k; pad the first value to hit n exactly
    k = (n - 7) // 3
    extra = (n - 7) - 3 * k  # 0..2 more digits on the first value
    first = int("2" + "0" * (4 + extra))
    cuts = [first] + [1] * k
    assert len(repr(cuts)) == n
    return cuts


@pytest.mark.parametrize("n", [78, 79, 80])
def test_short_cuts_quoted_whole(n):
    """Cuts whose text is at most 80 characters are quoted as they are."""
    cuts = _cuts_of_repr_len(n)
    assert _refusal(cuts) == repr(cuts)


@pytest.mark.parametrize("n", [81, 82, 200])
def test_long_cuts_cut_to_80(n):
    """Past 80 characters the cuts are cut to their first 77 and ``...``: 80 in all."""
    cuts = _cuts_of_repr_len(n)
    got = _refusal(cuts)
    assert got == repr(cuts)[:77] + "..."
    assert len(got) == 80


def test_long_weight_bytes_quoted_short():
    """``device_weight_bytes`` of the wrong length is quoted through the same 80-character cut."""
    wb = list(range(1000, 1040))
    with pytest.raises(ConfigError) as e:
        parse_row(_row(device_weight_bytes=wb))
    assert str(e.value).endswith("got " + repr(wb)[:77] + "...")


def test_rounds_to_target_counts_reaching_it_exactly():
    """A round whose accuracy equals the target reaches it."""
    run = rows_to_run([_row(round=1, accuracy=0.25), _row(round=2, accuracy=0.5), _row(round=3, accuracy=0.75)])
    assert run.rounds_to_target(0.5) == 2
    assert run.time_to_target(0.5) == 4.0
    assert run.rounds_to_target(0.8) is None


def test_final_is_the_last_round():
    """``final`` is the run's last round (in round order), not its first."""
    run = rows_to_run([_row(round=2, accuracy=0.75), _row(round=1, accuracy=0.25)])
    assert run.final.round == 2
    assert run.final.accuracy == 0.75


def test_missing_path_message(tmp_path: Path):
    """A path that does not exist: the refusal says so, with no hint (there is no folder to look below)."""
    p = tmp_path / "nope"
    with pytest.raises(ConfigError) as e:
        load_run(p)
    assert str(e.value) == f"{p} does not exist: no metrics.jsonl in it"
