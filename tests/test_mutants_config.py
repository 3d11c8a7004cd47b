"""Gaps a mutation run of ``splitfed/flower/config.py`` found: a run's settings at their exact bounds, the
typed reading of config values, and which variants' rounds last the sum of their clients' times."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.engine.limits import MAX_BATCH, MAX_VOCAB
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.sim.inprocess import train_inprocess

# written out here, not read from the engine: sl and sflv2 train their clients one after another
ONE_AFTER_ANOTHER = {"sl": True, "sflv1": False, "sflv2": True}


@pytest.mark.parametrize("mode", sorted(ONE_AFTER_ANOTHER))
def test_a_runs_measured_round_is_the_sum_of_its_clients_in_turn_and_the_longest_in_parallel(
        mode: str, tmp_path: Path) -> None:
    """What a user reads in metrics.jsonl: sl and sflv2 rounds last their clients' times together, sflv1's its
    slowest client's (each client's time: its compute plus its link time, as the row's per_client says)."""
    s = RunSettings(rounds=1, clients=3, tiers=2, cuts="static:1", mode=mode, out=str(tmp_path / "run"))
    train_inprocess(s)
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    took = [c["compute_s"] + c["link_s"] for c in row["per_client"].values()]
    assert len(took) == 3 and all(t > 0 for t in took)
    want = math.fsum(took) if ONE_AFTER_ANOTHER[mode] else max(took)
    assert row["measured_round_s"] == pytest.approx(want, rel=1e-12, abs=0)
    if ONE_AFTER_ANOTHER[mode]:  # three clients' times together outlast any one of them
        assert row["measured_round_s"] > max(took)
    assert s.in_turn is ONE_AFTER_ANOTHER[mode]


def test_the_largest_batch_is_taken_and_one_more_refused() -> None:
    """``--batch-size`` takes 1..MAX_BATCH on the command line; a config's batch-size the same range."""
    assert RunSettings(batch_size=MAX_BATCH).batch_size == MAX_BATCH
    with pytest.raises(ConfigError, match=f"batch-size must be at most {MAX_BATCH:,}, got {MAX_BATCH + 1}$"):
        RunSettings(batch_size=MAX_BATCH + 1)


@pytest.mark.parametrize("vocab", [0, 2, 3, MAX_VOCAB - 1, MAX_VOCAB])
def test_a_vocab_of_two_up_to_the_largest_is_taken(vocab: int) -> None:
    assert RunSettings(vocab=vocab).vocab == vocab


@pytest.mark.parametrize("vocab", [-1, 1, MAX_VOCAB + 1])
def test_a_vocab_outside_two_to_the_largest_is_refused(vocab: int) -> None:
    with pytest.raises(ConfigError, match=f"vocab must be 0 .* or in 2..{MAX_VOCAB:,}, got {vocab}$"):
        RunSettings(vocab=vocab)


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=1e-9, max_value=1.0), st.sampled_from(["round_timeout_s", "call_timeout_s", "node_wait_s"]))
def test_any_positive_number_of_seconds_is_a_wait_even_under_one(seconds: float, name: str) -> None:
    assert getattr(RunSettings(**{name: seconds}), name) == seconds


@pytest.mark.parametrize("seconds", [0.0, -0.5, math.inf, math.nan])
@pytest.mark.parametrize("name", ["round_timeout_s", "call_timeout_s", "node_wait_s"])
def test_a_wait_of_no_positive_finite_seconds_is_refused(name: str, seconds: float) -> None:
    with pytest.raises(ConfigError, match=f"{name.replace('_', '-')} must be a positive number of seconds"):
        RunSettings(**{name: seconds})


@pytest.mark.parametrize("value", [True, False, 2.5, -0.5])
def test_an_integer_setting_refuses_a_boolean_or_a_fraction(value: object) -> None:
    """``rounds = true`` or ``rounds = 2.5`` is no count of rounds: int() would make 1 or 2 of it unseen."""
    with pytest.raises(ConfigError, match=f"c.toml: rounds must be int, got {value!r}"):
        RunSettings.from_mapping({"rounds": value}, source="c.toml")


@pytest.mark.parametrize(("value", "want"), [(2.0, 2), ("7", 7), (5, 5)])
def test_an_integer_setting_takes_a_whole_float_a_numeral_or_an_int(value: object, want: int) -> None:
    got = RunSettings.from_mapping({"rounds": value}, source="c.toml").rounds
    assert got == want and type(got) is int


def test_one_layer_giving_the_same_options_in_both_spellings_and_any_key_order_is_one_value() -> None:
    """A TOML table's keys come in the file's order; the same options, ordered otherwise, are the same options
    (only different ones are two values)."""
    s = RunSettings.from_mapping({"model": "mine:make", "model_kwargs": {"width": 8, "depth": {"b": 1, "a": 2}},
                                  "model-kwargs": {"depth": {"a": 2, "b": 1}, "width": 8}}, source="c.toml")
    assert s.kwargs == {"width": 8, "depth": {"a": 2, "b": 1}}
    assert s.model_kwargs == '{"depth": {"a": 2, "b": 1}, "width": 8}'
    with pytest.raises(ConfigError, match="c.toml: model_kwargs = .* and model-kwargs = .* both set model-kwargs"):
        RunSettings.from_mapping({"model": "mine:make", "model_kwargs": {"width": 8},
                                  "model-kwargs": {"width": 9}}, source="c.toml")
