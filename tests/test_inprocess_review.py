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


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_tier_torch_device_this_machine_lacks_is_refused_not_ignored(tmp_path: Path):
    """Its tiers compute in this process: on the device asked for (before, always on the CPU, whatever it
    said), so one this machine lacks is refused, naming it."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"tier-torch-device cuda: this machine has no CUDA GPU"):
        train_inprocess(BASE.with_(out=str(out), tier_torch_device="cuda"))
    assert not out.exists()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_the_inprocess_tiers_compute_on_the_tier_torch_device(tmp_path: Path, monkeypatch):
    import splitfed.engine.rounds as rounds

    made = []
    real = rounds.inprocess_chain

    def noted(*a, **k):  # type: ignore[no-untyped-def]  # noqa: ANN002, ANN003
        chain = real(*a, **k)
        made.append([t.torch_device.type for t in chain.tiers])
        return chain

    monkeypatch.setattr(rounds, "inprocess_chain", noted)
    train_inprocess(BASE.with_(out=str(tmp_path / "run"), tier_torch_device="cuda"))
    assert made == [["cuda"]]
