"""``hysteresis``: how much of the rounds left's time a move of cuts must save before ``--cuts adaptive`` makes it.
It was fixed at 5 % inside the adapter: a researcher comparing adaptation policies could not set it. Now a setting
(``--hysteresis H``, ``hysteresis = H`` in a config file or a Flower run config), checked like the rest, that a
resume must keep (it changes which cuts run, as ``cuts`` does), and that the adaptive policy hands its adapter."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from splitfed.cli import build_parser, main
from splitfed.commands.simulate import settings_from_args
from splitfed.errors import ConfigError
from splitfed.flower.adaptive import AdaptivePolicy
from splitfed.flower.config import RunSettings
from splitfed.optimizer.defaults import HYSTERESIS
from tests.test_mutants_adaptive_b import _settings as _slow_settings
from tests.test_speed_probe import INFO


def test_the_flag_and_the_config_key_set_it_and_its_default_is_the_adapter_s(tmp_path: Path) -> None:
    from splitfed.optimizer import Adapter

    assert RunSettings().hysteresis == HYSTERESIS == Adapter.__init__.__kwdefaults__["hysteresis"]
    cfg = tmp_path / "run.toml"
    cfg.write_text('cuts = "adaptive"\nhysteresis = 0.2\n')
    parse = build_parser().parse_args
    assert settings_from_args(parse(["simulate", "--config", str(cfg)])).hysteresis == 0.2
    assert settings_from_args(parse(["simulate", "--config", str(cfg), "--hysteresis", "0"])).hysteresis == 0.0
    assert RunSettings.from_mapping({"hysteresis": 1}, source="flwr run config").hysteresis == 1.0


@pytest.mark.parametrize("value", [-0.01, math.nan, math.inf])
def test_a_hysteresis_that_is_no_share_is_refused_naming_the_key(value: float,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"hysteresis must be a number >= 0 \(the share of the rounds left's time "
                                          r"a move of cuts must save; 0.05: 5%\), got"):
        RunSettings(hysteresis=value)
    assert main(["simulate", "--out", "x", "--hysteresis", str(value)]) == 2
    assert "hysteresis must be a number >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(("hysteresis", "moves"), [(HYSTERESIS, True), (0.7, False)])
def test_the_adaptive_policy_decides_with_the_run_s_hysteresis(tmp_path: Path, hysteresis: float,
                                                               moves: bool) -> None:
    """A run of 3 rounds resumed for 6 learned its device is fast: moving saves most of the 3 rounds left
    (test_mutants_adaptive_b): 64 % of their time, its move paid. At 5 % it moves; at 70 % the gain is within the hysteresis, and it says so."""
    fast = {"assignment": {"client0": [0, 7]}, "beliefs": {"client0": [1e13, 1.125e8, 1.125e8, 0.001]},
            "rounds": 3}
    settings = dataclasses.replace(_slow_settings(tmp_path, 6), hysteresis=hysteresis)
    policy = AdaptivePolicy(settings)
    policy.load_state_dict(fast)
    cuts = policy.assign(4, INFO)
    [d] = policy.adapter.history
    assert policy.adapter.hysteresis == hysteresis
    if moves:
        assert cuts == {"client0": (7, 7)} and d.moved == ("client0",), d
    else:
        assert cuts == {"client0": (0, 7)} and not d.moved, d
        assert "within the hysteresis (70%)" in d.reason, d.reason

