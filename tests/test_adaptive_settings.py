"""The adaptive policy's knobs besides the hysteresis (tests/test_hysteresis_setting.py) are run settings:
``measurement-weight`` (how much of a round's measurement its beliefs take), ``regime-jump`` (how far off its
belief a measurement is believed at once) and ``solve-time-limit-s`` (how long each of its solves may take).
They were fixed inside the adapter (0.5, 3 and 30 s): a researcher could not compare smoothing rules, and a
large deployment could not give its solves more time. Each is set by a flag, a config key or a Flower run
config key, checked with its key named, and handed to the policy's adapter. A resume must keep the two that
change what is believed; the time limit may change (it changes cuts only where it runs out)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.app import RESUMABLE
from splitfed.cli import build_parser, main
from splitfed.commands.simulate import settings_from_args
from splitfed.errors import ConfigError
from splitfed.flower.adaptive import AdaptivePolicy
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import Measurement
from splitfed.jsonio import dumps
from splitfed.optimizer import Adapter
from splitfed.profile.speed import SpeedMeasure, measured_flops
from tests.test_speed_probe import INFO, SLOW

# setting -> (the Adapter's keyword, two values other than the default, the flag)
KNOBS = {"measurement_weight": ("alpha", (0.25, 1.0), "--measurement-weight"),
         "regime_jump": ("jump", (10.0, 2.0), "--regime-jump"),
         "solve_time_limit_s": ("time_limit", (7.5, 2.0), "--solve-time-limit-s")}


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_a_flag_a_config_key_and_a_run_config_key_set_it_and_its_default_is_the_adapter_s(
        name: str, tmp_path: Path) -> None:
    keyword, (value, other), flag = KNOBS[name]
    default = getattr(RunSettings(), name)
    assert default == Adapter.__init__.__kwdefaults__[keyword] and default not in (value, other)
    key = name.replace("_", "-")
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'cuts = "adaptive"\n{key} = {value}\n')
    parse = build_parser().parse_args
    assert getattr(settings_from_args(parse(["simulate", "--config", str(cfg)])), name) == value
    assert getattr(settings_from_args(parse(["simulate", "--config", str(cfg), flag, str(other)])), name) == other
    assert getattr(RunSettings.from_mapping({key: int(other)}, source="flwr run config"), name) == other


@pytest.mark.parametrize(("name", "value", "message"), [
    ("measurement_weight", 0.0, r"measurement-weight must be in \(0, 1\]"),
    ("measurement_weight", 1.01, r"measurement-weight must be in \(0, 1\]"),
    ("measurement_weight", -0.5, r"measurement-weight must be in \(0, 1\]"),
    ("measurement_weight", math.nan, r"measurement-weight must be in \(0, 1\]"),
    ("regime_jump", 1.0, "regime-jump must be a finite number > 1"),
    ("regime_jump", 0.5, "regime-jump must be a finite number > 1"),
    ("regime_jump", math.nan, "regime-jump must be a finite number > 1"),
    ("regime_jump", math.inf, "regime-jump must be a finite number > 1"),  # a run's JSON would record null
    ("solve_time_limit_s", 0.0, "solve-time-limit-s must be a positive number of seconds"),
    ("solve_time_limit_s", -3.0, "solve-time-limit-s must be a positive number of seconds"),
    ("solve_time_limit_s", math.nan, "solve-time-limit-s must be a positive number of seconds"),
    ("solve_time_limit_s", math.inf, "solve-time-limit-s must be a positive number of seconds"),
])
def test_a_value_out_of_its_range_is_refused_naming_the_key(name: str, value: float, message: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=message + r".*, got"):
        RunSettings(**{name: value})
    with pytest.raises(ConfigError, match="flwr run config: " + message):
        RunSettings.from_mapping({name.replace("_", "-"): value}, source="flwr run config")
    assert main(["simulate", "--out", "x", KNOBS[name][2], str(value)]) == 2
    assert message.replace("\\", "") in capsys.readouterr().err


def test_the_edges_of_each_range_are_taken() -> None:
    """1 believes the last round alone; a jump of 1e9 all but never believes a measurement at once."""
    s = RunSettings(measurement_weight=1.0, regime_jump=1e9, solve_time_limit_s=1e-3)
    assert (s.measurement_weight, s.regime_jump, s.solve_time_limit_s) == (1.0, 1e9, 1e-3)
    assert RunSettings(measurement_weight=1e-9, regime_jump=1.0 + 1e-9).regime_jump > 1


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(KNOBS)),
       value=st.floats() | st.floats(0, 2) | st.sampled_from([math.inf, 1e300, 5e-324, 1.0]))
def test_every_value_taken_is_read_back_from_the_run_s_json(name: str, value: float) -> None:
    """A run records its settings as JSON (summary.json), which writes an infinite or NaN float as null; the
    experiment scripts and ``report`` read them back. So every value a setting takes must come back as itself,
    and the rest is refused (an infinite jump, once taken, came back null and was refused then)."""
    try:
        run = RunSettings(**{name: value})
    except ConfigError:
        return
    assert RunSettings.from_mapping(json.loads(dumps(run.to_dict())), source="summary.json") == run


def test_a_resume_keeps_what_is_believed_and_may_change_the_time_limit() -> None:
    from splitfed.flower.config import ADAPTIVE_SETTINGS

    assert set(ADAPTIVE_SETTINGS) == {*KNOBS, "hysteresis"}  # what an experiment's policies entry may set
    assert "solve_time_limit_s" in RESUMABLE
    assert not {"measurement_weight", "regime_jump", "hysteresis"} & RESUMABLE


def _policy(tmp_path: Path, **settings: float) -> AdaptivePolicy:
    """A device believed at 1 MFLOP/s (the fleet file's) whose raw inputs go to the edge (cut 0): it times its
    training when asked (tests/test_speed_probe.py), and that timing is what it teaches."""
    fleet = tmp_path / "slow.toml"
    fleet.write_text(SLOW)
    policy = AdaptivePolicy(RunSettings(rounds=6, clients=1, fleet=str(fleet), cuts="adaptive", sim_clock=False,
                                        **settings))
    assert policy.assign(1, INFO)["client0"][0] == 0
    return policy


def _learn(policy: AdaptivePolicy, times: float) -> tuple[float, float]:
    """The device measured ``times`` x as fast as believed: (belief before, belief after)."""
    before = policy.adapter.belief.clients[0].device.flops
    profile = policy.adapter.belief.profile
    one = SpeedMeasure(1, 32, 1.0)
    seconds = measured_flops(profile, one) / (times * before)  # type: ignore[operator]
    timed = SpeedMeasure(1, 32, seconds)
    assert measured_flops(profile, timed) == pytest.approx(times * before)
    cuts = tuple(policy.adapter.assignment["client0"])
    policy.observe(1, [Measurement("client0", cuts, 150, 0.0, 0.0, 0, 0, None, timed)])
    return before, policy.adapter.belief.clients[0].device.flops


@pytest.mark.parametrize(("settings", "times", "believed"), [
    ({}, 2.0, 1.5),                                            # the defaults: half of it, within 3x
    ({"measurement_weight": 1.0}, 2.0, 2.0),                   # the last round alone
    ({"measurement_weight": 0.25}, 2.0, 1.25),
    ({}, 5.0, 5.0),                                            # 5x > 3x: a new regime, believed at once
    ({"regime_jump": 10.0}, 5.0, 3.0),                         # within 10x: smoothed
    ({"regime_jump": 1.5}, 2.0, 2.0),                          # 2x > 1.5x: believed at once
    ({"regime_jump": 1e9, "measurement_weight": 0.1}, 1000.0, 100.9),  # never at once
])
def test_the_policy_learns_by_the_run_s_weight_and_jump(tmp_path: Path, settings: dict[str, float],
                                                        times: float, believed: float) -> None:
    before, after = _learn(_policy(tmp_path, **settings), times)
    assert after / before == pytest.approx(believed)


def test_the_policy_s_solves_keep_to_the_run_s_time_limit(tmp_path: Path) -> None:
    """Its adapter solves with the run's limit: its first plan and each decision after a round."""
    assert _policy(tmp_path).adapter.time_limit == 30.0
    assert _policy(tmp_path, solve_time_limit_s=7.5).adapter.time_limit == 7.5


def test_a_first_plan_out_of_time_names_the_run_s_setting(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "raise it (--time-limit), or price a policy that needs no MILP: --greedy, --best-static",
    ``splitfed optimize``'s flags, none of them a run's. Refused before anything starts."""
    said = ("cuts adaptive's first plan: the time limit ran out before the MILP found any assignment for the 6 "
            "clients of cnn (1e-06 s): raise solve-time-limit-s, or use cuts greedy")
    assert main(["simulate", "--clients", "6", "--cuts", "adaptive", "--solve-time-limit-s", "1e-6", "--rounds", "1",
                 "--out", str(tmp_path / "run")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _six() -> tuple[object, dict[str, object]]:
    """The reference fleet's 6 clients a run deals (seed 0), and client0 (a Pi) measured 10x slower, compute and
    uplink: re-planning it needs MILPs (its cuts in force do not reach the lower bound)."""
    from splitfed.flower.adaptive import scenario
    from splitfed.optimizer import Measurement as Seen
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.inprocess import sim_clients

    s = RunSettings(clients=6, cuts="adaptive", rounds=5)
    sc = scenario(s, sim_clients(s, fleet_for(s)))
    c = sc.clients[0]
    slower = Seen(compute_flops=1e9, compute_s=1e9 / (c.device.flops / 10), up_bytes=1e6,
                  up_s=1e6 / (c.link.up / 10), down_bytes=0, down_s=0)
    return sc, {c.name: slower}


def test_an_adapter_out_of_time_says_so_in_its_own_words() -> None:
    """Its first plan: its own knob (time_limit), not a command's flag. A decision whose re-solve ran out: not
    "already optimal" (before: said of the cuts a solve out of time kept), but what is not ruled out."""
    from splitfed.optimizer import OutOfTime

    sc, slower = _six()
    with pytest.raises(OutOfTime, match=r"the time limit ran out before the MILP found any assignment for the 6 "
                                        r"clients of cnn \(1e-06 s\): raise the adapter's time_limit, or plan with "
                                        r"greedy$"):
        Adapter(sc, 5, time_limit=1e-6)  # type: ignore[arg-type]
    rushed = Adapter(sc, 5, time_limit=None)  # type: ignore[arg-type]
    rushed.time_limit = 1e-6
    d = rushed.observe(1, slower)  # type: ignore[arg-type]
    assert not d.moved
    assert d.reason.startswith("no faster plan found in the time limit (1e-06 s); one up to "), d.reason
    assert d.reason.endswith("% faster is not ruled out"), d.reason
    given = Adapter(sc, 5, time_limit=None).observe(1, slower)  # type: ignore[arg-type]
    assert "not ruled out" not in given.reason and "time limit" not in given.reason, given.reason


@pytest.mark.parametrize(("changes", "shown"), [
    ({}, "static:2,5"),
    ({"hysteresis": 0.5}, "static:2,5"),  # a static run does not adapt: its line says nothing of it
    ({"cuts": "adaptive"}, "adaptive"),
    ({"cuts": "adaptive", "hysteresis": 0.05, "regime_jump": 3.0}, "adaptive"),  # the defaults, written out
    ({"cuts": "adaptive", "solve_time_limit_s": 120.0, "hysteresis": 0.0},
     "adaptive hysteresis=0 solve-time-limit-s=120"),
    ({"cuts": "adaptive", "measurement_weight": 0.25, "regime_jump": 1e9},
     "adaptive measurement-weight=0.25 regime-jump=1e+09"),
])
def test_a_run_s_first_line_names_its_adaptive_settings_that_are_not_the_defaults(changes: dict[str, object],
                                                                                   shown: str) -> None:
    assert RunSettings(**changes).cuts_shown == shown  # type: ignore[arg-type]


def test_an_in_process_run_s_first_line_says_how_it_adapts(tmp_path: Path) -> None:
    from splitfed.sim.inprocess import train_inprocess

    lines: list[str] = []
    s = RunSettings(rounds=1, clients=2, cuts="adaptive", regime_jump=10.0, batch_size=64, seed=3)
    train_inprocess(s, progress=lines.append)
    assert lines[1] == ("run splitfed-3: sflv1, 3 tiers, cuts adaptive regime-jump=10, 2 client(s), rounds 1..1 "
                        "(in-process)"), lines
