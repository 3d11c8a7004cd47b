"""Inputs the online adapter, a fleet's drift and ``--cuts`` took without a word: an Adapter's NaN jump or
hysteresis (a NaN hysteresis never let a cut move) and a round count of 2.5 or True; a measurement of a client
the adapter does not have (dropped unsaid, while an unknown server tier is refused); one drift table that both
sets and scales a field (set, then scaled, while two tables doing it are refused); a misspelt ``--cuts`` word
without the nearest known one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from splitfed.cli import main
from splitfed.cost import Scenario
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import make_policy
from splitfed.optimizer import Adapter, Measurement
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile, parse_fleet

# block 1: 100 MFLOP/sample and 1.5 MB of weights (as in tests/test_mutants_adapt.py)
PROF = ModelProfile.synthetic([1e6, 1e8], [1e3, 10], [1e3, 1.5e6], input_bytes=1e3)
OUT_OF_RANGE = "jump must be > 1, hysteresis >= 0 and rounds >= 1 (an integer), got "


def _fleet(*names: str) -> Scenario:
    devs = tuple(Client(n, "pi", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=100) for n in names)
    return Scenario(PROF, devs, (TierProfile(5e9, 1e10),), (), batch=10)


def _pinned(*names: str) -> Adapter:
    return Adapter(_fleet(*names), rounds=5, assignment={n: (1,) for n in names})


# ---------------------------------------------------------------- the adapter's settings


@pytest.mark.parametrize(("kw", "said"), [
    ({"jump": math.nan}, "jump=nan"),
    ({"hysteresis": math.nan}, "hysteresis=nan"),
    ({"rounds": 2.5}, "rounds=2.5"),
    ({"rounds": True}, "rounds=True"),
    ({"rounds": "5"}, "rounds='5'"),
    ({"jump": 1.0}, "jump=1.0"),      # the refusals that were there name the value too
    ({"hysteresis": -0.01}, "hysteresis=-0.01"),
    ({"rounds": 0}, "rounds=0"),
])
def test_an_adapter_refuses_a_nan_jump_or_hysteresis_and_a_round_count_that_is_no_whole_number(
        kw: dict, said: str) -> None:
    """A NaN passed ``jump <= 1`` and ``hysteresis < 0`` (every comparison with NaN is false): with a NaN
    hysteresis no gain was ever "beyond the hysteresis", so the cuts never moved."""
    args = {"rounds": 5, "assignment": {"d": (1,)}, **kw}
    with pytest.raises(ConfigError) as e:
        Adapter(_fleet("d"), args.pop("rounds"), **args)
    assert str(e.value) == OUT_OF_RANGE + said


def test_an_adapter_takes_an_infinite_jump_or_hysteresis_and_a_numpy_round_count() -> None:
    """inf is a choice (never believe a jump at once; move only cuts that do not fit), and a count from numpy
    is a whole number: kept as an int."""
    adapter = Adapter(_fleet("d"), np.int64(5), jump=math.inf, hysteresis=math.inf,  # type: ignore[arg-type]
                      assignment={"d": (1,)})
    assert (adapter.jump, adapter.hysteresis, adapter.rounds) == (math.inf, math.inf, 5)
    assert type(adapter.rounds) is int


# ---------------------------------------------------------------- the clients named


def test_a_measurement_of_no_client_of_the_adapter_is_refused_with_the_nearest_name() -> None:
    adapter = _pinned("pi-home-0", "pi-home-1")
    seen = Measurement(1e9, 0.1)  # 10 GFLOP/s: would move the belief
    with pytest.raises(ConfigError) as e:
        adapter.observe(1, {"pi-home-0": seen, "pi-hom-1": seen})
    assert str(e.value) == "no client named 'pi-hom-1' (did you mean 'pi-home-1'?); clients: pi-home-0, pi-home-1"
    assert [c.device.flops for c in adapter.belief.clients] == [1e9, 1e9]  # nothing learned from the round
    assert adapter.history == []
    with pytest.raises(ConfigError) as e:
        adapter.update({"nobody": seen})
    assert str(e.value) == "no client named 'nobody'; clients: pi-home-0, pi-home-1"


def test_the_refusal_of_an_unknown_client_lists_a_large_fleet_s_first_names_and_a_count() -> None:
    adapter = _pinned(*(f"c{i:02d}" for i in range(12)))
    with pytest.raises(ConfigError) as e:
        adapter.update({"zz": Measurement(1e9, 0.1)})
    assert str(e.value) == "no client named 'zz'; clients: c00, c01, c02, c03, c04, c05, c06, c07 and 4 more"


def test_clients_that_dropped_out_of_a_round_are_no_unknown_client() -> None:
    """Measured: the round's clients, a subset (a client that failed reports nothing). (Given cuts naming a
    client the scenario lacks are refused: tests/test_adaptation_edges.py; ``AdaptivePolicy`` leaves a resumed
    run's gone node out.)"""
    adapter = Adapter(_fleet("a", "b"), rounds=5, assignment={"a": (1,), "b": (1,)})
    assert adapter.assignment == {"a": (1,), "b": (1,)}
    adapter.observe(1, {"a": Measurement(1e9, 0.1)})
    assert [c.device.flops for c in adapter.belief.clients] == [1e10, 1e9]  # a 10x jump: believed at once


# ---------------------------------------------------------------- a drift table that sets and scales one field


FLEET = "[edge]\nprofile = 'edge-server'\n[[device]]\nname = 'pi'\nprofile = 'rpi4'\n"


@pytest.mark.parametrize(("set_", "scale"), [("up_mbps = 1", "up_scale = 0.1"), ("flops = 1e9", "flops_scale = 2"),
                                             ("down_mbps = 5", "down_scale = 0.5"), ("rtt_ms = 5", "rtt_scale = 2")])
def test_one_drift_table_that_sets_and_scales_one_field_is_refused(set_: str, scale: str) -> None:
    """Two tables of one round doing it were refused; one table set, then scaled (up_mbps = 1 and
    up_scale = 0.1 gave 0.1 Mbit/s)."""
    text = FLEET + f"[[device.drift]]\nround = 3\nup_scale = 2\n[[device.drift]]\nround = 5\n{scale}\n{set_}\n"
    field, key = set_.split(" = ")[0], scale.split(" = ")[0]
    with pytest.raises(ConfigError) as e:
        parse_fleet(text, "f.toml")
    assert str(e.value) == (f"f.toml: [[device]] #1 ('pi') drift #2: changes {field!r} twice in round 5 "
                            f"({field!r} and {key!r}): give one drift per field and round")


def test_one_drift_table_may_set_one_field_and_scale_another() -> None:
    fleet = parse_fleet(FLEET + "[[device.drift]]\nround = 5\nup_mbps = 1\ndown_scale = 0.5\n", "f.toml")
    pi = fleet.clients[0]
    assert pi.at_round(5).link.up == pytest.approx(1e6 / 8)
    assert pi.at_round(5).link.down == pytest.approx(pi.link.down * 0.5)


# ---------------------------------------------------------------- --cuts: the nearest policy word


USE = ": use static:K1,K2 | adaptive | greedy"


@pytest.mark.parametrize(("cuts", "meant"), [
    ("adaptiv", "adaptive"), ("Adaptive", "adaptive"), ("greedy2", "greedy"),
    ("statc:2,5", "static:2,5"), ("Static:1,3/2,5", "static:1,3/2,5"), ("statc", "static:K1,K2"),
    ("2,5", "static:2,5"), ("1,3/2,5", "static:1,3/2,5"),  # a bare vector, as verify --cuts takes it
])
def test_a_misspelt_cut_policy_gets_the_nearest_known_one(cuts: str, meant: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_policy(RunSettings(cuts=cuts))
    assert str(e.value) == f"unknown cut policy {cuts!r} (did you mean {meant!r}?){USE}"


@pytest.mark.parametrize("cuts", ["bogus", "optimal", "2,,5"])
def test_a_cut_policy_nothing_is_close_to_gets_no_suggestion(cuts: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_policy(RunSettings(cuts=cuts))
    assert str(e.value) == f"unknown cut policy {cuts!r}{USE}"


def test_simulate_suggests_adaptive_for_adaptiv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--cuts", "adaptiv", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("splitfed simulate: error: command line: cuts: unknown cut policy 'adaptiv' "
                                       f"(did you mean 'adaptive'?){USE}\n")
    assert not out.exists()
