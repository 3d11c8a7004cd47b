"""Leftovers of the settings' checks: refusals that name their key and source, tier limits that fit the wire's
int64, and one owner of the rule for which rounds the simulated clock times."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.cli import main
from splitfed.engine.limits import MOST_MB, BuildLimits, set_limits
from splitfed.errors import ConfigError
from splitfed.flower.adaptive import simulated_devices
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo
from splitfed.sim.clock import drawn_devices, fleet_for, make_clock

CONFIG = Path(__file__).resolve().parents[1] / "simulations" / "configs" / "main.toml"


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--cuts", "bogus", "unknown cut policy 'bogus'"),
    ("--dataset", "nope", "unknown dataset 'nope'"),
    ("--model", "nosuch", "unknown model 'nosuch'"),
    ("--partition", "zzz", "unknown partition 'zzz'"),
])
def test_simulate_names_the_setting_and_source_of_a_bad_value(flag: str, value: str, says: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The real command: one line, exit 2, naming the key (as ``compress`` and ``tier-torch-device`` are) and
    the layers it came from; before, it said only "unknown cut policy 'bogus'", once the run was set up."""
    rc = main(["simulate", "--config", str(CONFIG), "--out", str(tmp_path / "run"), "--overwrite", flag, value])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{CONFIG} + command line: {flag[2:]}: {says}" in err
    assert not (tmp_path / "run").exists()


def test_a_config_file_s_bad_value_names_the_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[simulate]\ndataset = "nope"\n')
    with pytest.raises(ConfigError, match=rf"^{cfg}: dataset: unknown dataset 'nope'"):
        RunSettings.from_toml(cfg)


@given(st.sampled_from(["digits", " Synthetic ", "mnist", "mnist:/x", "cifar10:/y", "npz:f.npz"]),
       st.sampled_from(["static:2,5", "static:1,3/2,5", "adaptive", "greedy"]),
       st.sampled_from(["cnn", "mlp", "pkg.mod:factory"]))
def test_forms_a_run_takes_are_not_refused(dataset: str, cuts: str, model: str) -> None:
    """Only forms are checked: no dataset file is read, no module:factory imported (a checkpoint's settings
    are read anywhere)."""
    s = RunSettings.from_mapping({"dataset": dataset, "cuts": cuts, "model": model})
    assert (s.dataset, s.cuts, s.model) == (dataset, cuts, model)


# ---------------------------------------------------------------- limits


@given(st.sampled_from(["model_bytes", "sample_bytes", "held_bytes"]), st.integers(1, 2**70))
def test_build_limits_beyond_the_bound_are_refused(name: str, over: int) -> None:
    """Before, 2**63 bytes was taken and broke every Describe of the tier (int64: "Value out of range")."""
    most = MOST_MB << 20
    assert most <= 2**63 - 1
    assert getattr(BuildLimits(**{name: most}), name) == most
    with pytest.raises(ConfigError, match=rf"{name} must be at most {most:,}"):
        BuildLimits(**{name: most + over})


def test_a_tier_at_the_largest_limits_still_answers_describe() -> None:
    from splitfed.engine.limits import DEFAULT_LIMITS
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.server import serve_tier

    most = MOST_MB << 20
    set_limits(BuildLimits(most, most, most))
    try:
        with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address, deadline_s=20, retries=0) as c:
            assert c.describe() is not None
    finally:
        set_limits(DEFAULT_LIMITS)


def test_the_tier_command_takes_its_bound_from_the_limits() -> None:
    import splitfed.commands.tier as tier_cmd

    assert tier_cmd.MOST_MB is MOST_MB


# ---------------------------------------------------------------- simulated clock


_SETTINGS = RunSettings(clients=3, model="mlp", dataset="synthetic")
_FLEET = fleet_for(_SETTINGS)
_CLOCK = make_clock(_SETTINGS, _FLEET)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([c.name for c in _FLEET.clients] + ["rpi4", "pi-home", ""]), min_size=1,
                max_size=4), st.booleans())
def test_the_policy_and_the_clock_agree_on_which_rounds_are_simulated(profiles: list[str], sim: bool) -> None:
    """One rule (:func:`drawn_devices`): the policy learns from simulated times exactly when the clock gives
    them."""
    clients = [ClientInfo(f"client{i}", i, i, profile=p, samples=8) for i, p in enumerate(profiles)]
    cuts = {c.client_id: (1, 2) for c in clients}
    timed = _CLOCK(1, cuts, clients, {}) is not None
    assert (drawn_devices(_FLEET, clients) is not None) == timed
    assert (simulated_devices(_SETTINGS.with_(sim_clock=sim), clients) is not None) == (sim and timed)
    if sim and timed:
        assert simulated_devices(_SETTINGS, clients) == {c.client_id: c.profile for c in clients}


def test_layered_here_names_the_source_of_a_tier_device_this_machine_lacks() -> None:
    """``here=True`` (for ``splitfed simulate``, whose tiers start on this machine): a GPU it does not have is
    refused with the layers that named it; before, the run's validation said only "tier-torch-device cuda:
    ...". Without ``here`` only the form is checked (a checkpoint from a GPU machine is read anywhere)."""
    import torch

    layers = [({"tier-torch-device": "cuda:7"}, "run.toml")]
    assert RunSettings.layered(layers).tier_torch_device == "cuda:7"
    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(ConfigError, match=r"^run.toml: tier-torch-device cuda:7: this machine has"):
        RunSettings.layered(layers, here=True)
    assert RunSettings.layered([({"tier-torch-device": "cpu"}, "run.toml")], here=True).tier_torch_device == "cpu"
