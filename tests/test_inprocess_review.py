"""The in-process backend refuses the settings a Flower run honours and it would silently not.

Before, ``sim-clock = false`` trained and reported the simulated clock's times (a Flower run reports measured
times and the cost model's prediction: ``sim_round_s`` null), and ``tier-addresses`` trained on tiers of its
own, never asking the ones named; an experiment's rows then said something its config did not ask for.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulations import common
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.sim.inprocess import train_inprocess

BASE = RunSettings(rounds=1, clients=2, tiers=2, cuts="static:1")

REFUSED = [
    ({"sim_clock": False}, "sim-clock must be true"),
    ({"tier_addresses": "127.0.0.1:9"}, "remove tier-addresses (127.0.0.1:9)"),
]


@pytest.mark.parametrize(("change", "said"), REFUSED)
def test_the_inprocess_backend_refuses_what_it_would_not_do_before_anything_trains(tmp_path: Path, change, said):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=re.escape(said)):
        train_inprocess(BASE.with_(out=str(out), **change))
    assert not out.exists()  # refused before its folder was claimed


@pytest.mark.parametrize(("change", "said"), REFUSED)
def test_an_experiment_on_the_inprocess_backend_names_the_case_it_refuses(change, said):
    """As ``simulations`` checks every case before the first trains (no tier is asked for the addresses)."""
    with pytest.raises(ConfigError) as err:
        common.check_cases([("mine", BASE.with_(**change))], "inprocess")
    assert str(err.value).startswith("mine: the in-process backend") and said in str(err.value)
