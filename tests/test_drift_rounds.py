"""A fleet drift whose round comes after a run's last round is never applied: the run says so.

Before: ``--fleet small --rounds 3`` (the laptop's uplink drops at round 5) ran as if the fleet had no drift,
and nothing said the drift was left out. It is said, not refused: a fleet serves runs of any length (the
shipped ``small`` drifts at round 5, a run's default is 3 rounds), so a short run of it is no mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitfed.flower.config import RunSettings
from splitfed.profile.fleet import load_fleet
from splitfed.sim import runner
from splitfed.sim.clock import fleet_for
from splitfed.sim.ray_start import RayStartError

FLEET = """
name = "drifting"
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "phone"
profile = "phone-mid"
count = 3
[[device.drift]]
round = 9
up_scale = 0.5
[[device.drift]]
round = 5
flops_scale = 0.5
[[device]]
name = "pi"
profile = "rpi4"
count = 3
[[device.drift]]
round = 2
up_scale = 0.1
[[device]]
name = "laptop"
profile = "laptop"
"""


@pytest.fixture
def fleet(tmp_path: Path) -> str:
    path = tmp_path / "drifting.toml"
    path.write_text(FLEET)
    return str(path)


def test_the_drifts_a_run_never_reaches_are_found_per_device_entry(fleet: str) -> None:
    f = load_fleet(fleet)
    assert list(f.drifts_after(1).items()) == [("pi", 2), ("phone", 5)]  # each entry's first one past the run
    assert f.drifts_after(4) == {"phone": 5}
    assert f.drifts_after(5) == {"phone": 9}  # round 5's is applied in the last round; round 9's never
    assert f.drifts_after(9) == {}


def test_a_run_shorter_than_its_fleet_s_drifts_names_each_device_and_round(fleet: str) -> None:
    s = RunSettings(fleet=fleet, clients=20, rounds=1)
    assert {c.kind for c in fleet_for(s).clients} == {"phone", "pi", "laptop"}  # every entry drawn
    assert runner.late_drift_note(s) == (
        f"note: fleet {fleet!r}: devices 'pi' (round 2), 'phone' (round 5) drift after the run's last round (1): "
        "never applied (a run of 5 or more rounds would apply them)")
    assert runner.late_drift_note(s.with_(rounds=4)) == (
        f"note: fleet {fleet!r}: device 'phone' drifts at round 5, after the run's last round (4): never applied "
        "(a run of 5 or more rounds would apply it)")
    assert runner.late_drift_note(s.with_(rounds=9)) == ""


def test_only_the_devices_the_run_drew_are_named(fleet: str) -> None:
    """A device entry no client of the run was drawn from drifts in no round of it: it is not named."""
    s = RunSettings(fleet=fleet, clients=2, rounds=1, seed=4)
    drawn = {c.kind for c in fleet_for(s).clients}
    assert drawn == {"pi", "laptop"}  # 2 of the 7 devices by this seed: no phone
    assert runner.late_drift_note(s) == (
        f"note: fleet {fleet!r}: device 'pi' drifts at round 2, after the run's last round (1): never applied "
        "(a run of 2 or more rounds would apply it)")


def test_the_shipped_small_fleet_s_drift_is_said_of_a_default_length_run() -> None:
    s = RunSettings(fleet="small", clients=5)
    assert s.rounds == 3
    assert runner.late_drift_note(s) == ("note: fleet 'small': device 'laptop' drifts at round 5, after the run's "
                                         "last round (3): never applied (a run of 5 or more rounds would apply it)")
    assert runner.late_drift_note(RunSettings(fleet="reference", clients=5)) == ""  # no drift at all


def test_simulate_says_it_before_ray_starts(fleet: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The note is the run's third line, after the first (said before the engine's imports) and the draw, before Ray is
    started (here Ray's start is a stand-in that fails, so nothing starts: Ray cannot start in a test's time)."""
    def start_ray(init_args: dict[str, Any], log: Any = None, **kwargs: Any) -> None:
        raise RayStartError("not started in this test")

    monkeypatch.setattr(runner, "start_ray", start_ray)
    lines: list[str] = []
    with pytest.raises(runner.SimulationError, match="not started in this test"):
        runner.simulate(RunSettings(fleet=fleet, clients=20, rounds=4), progress=lines.append, cpus=1)
    assert lines == ["starting the simulation engine (Ray, 1 CPU(s)) and 2 tier process(es)...",
                     runner.draw_note(RunSettings(fleet=fleet, clients=20)),
                     f"note: fleet {fleet!r}: device 'phone' drifts at round 5, after the run's last round (4): "
                     "never applied (a run of 5 or more rounds would apply it)"]
