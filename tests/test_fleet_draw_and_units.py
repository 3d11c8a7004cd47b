"""A need and a capacity printed side by side read apart; a run says which clients it dealt from its fleet.

Before: ``mib_text`` rounds to 3 significant figures, so a refusal near the limit read "they need 0.26 MiB of its
0.26 MiB" and ``splitfed optimize`` "edge memory 0.609 MiB > 0.609 MiB". And ``splitfed simulate --fleet F
--clients N`` said nowhere which of F's devices its N clients were: no line, help text or README sentence named
them. They are dealt from F's devices (tests/test_fleet_deal.py: N equal to F's size trains F as listed, as
``splitfed optimize --fleet F`` prices it; fewer, a subset drawn by the seed; more, each device N // size times
and a subset drawn by the seed for the rest); the run's first lines, the help and the README name them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

import clients.app
import server.app
from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.profile.fleet import parse_fleet
from splitfed.sim import runner
from splitfed.sim.clock import fleet_for
from splitfed.sim.inprocess import train_inprocess
from splitfed.sim.ray_start import RayStartError
from splitfed.units import MIB, mib_pair, mib_text
from tests.flower_fixtures import FakeGrid, inprocess_tiers

ROOT = Path(__file__).resolve().parent.parent

# the prober's fleet (/tmp/n58/e): device 'a' holds a hair less than cuts 2,5 need of it (0.259643555 MiB)
FLEET = """
name = "handcalc"
samples = 718
[edge]
flops = 1e10
memory_mb = 1024
up_mbps = 8
down_mbps = 16
rtt_ms = 40
[cloud]
flops = 1e11
memory_mb = 4096
[[device]]
name = "a"
flops = 1e8
memory_mb = 0.25964355
up_mbps = 1
down_mbps = 2
rtt_ms = 100
[[device]]
name = "b"
flops = 1e9
memory_mb = 64
up_mbps = 4
down_mbps = 8
rtt_ms = 20
samples = 719
"""
EDGE_SHORT = FLEET.replace("memory_mb = 0.25964355", "memory_mb = 64").replace("memory_mb = 1024",
                                                                                "memory_mb = 0.6086578")


def _fleet(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return str(path)


# --- 1. a need and a capacity side by side ----------------------------------------------------------------------


def test_a_pair_that_reads_alike_gets_the_digits_that_tell_it_apart() -> None:
    assert mib_text(0.2596435546875 * MIB) == mib_text(0.25964355 * MIB) == "0.26 MiB"
    assert mib_pair(0.2596435546875 * MIB, 0.25964355 * MIB) == ("0.259643555 MiB", "0.25964355 MiB")
    assert mib_pair(2048.3 * MIB, 2048.1 * MIB) == ("2,048.3 MiB", "2,048.1 MiB")  # whole MiB: decimals
    assert mib_pair(100.4, 100.2) == ("100.4 bytes", "100.2 bytes")  # whole bytes: decimals


def test_a_pair_that_reads_apart_or_is_equal_is_spelled_as_mib_text() -> None:
    assert mib_pair(0.58 * MIB, 0.25 * MIB) == ("0.58 MiB", "0.25 MiB")
    assert mib_pair(5 * MIB, 5 * MIB) == ("5 MiB", "5 MiB")
    assert mib_pair(1000, 0.5 * MIB) == ("1000 bytes", "0.5 MiB") == (mib_text(1000), mib_text(0.5 * MIB))


def test_optimize_static_names_a_device_need_that_reads_apart_from_its_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "--model", "cnn", "--fleet", _fleet(tmp_path, FLEET), "--static", "2,5"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "splitfed optimize: error: --static: cuts 2,5 do not fit device 'a': they need 0.259643555 MiB of its "
        "0.25964355 MiB"]


def test_optimize_names_an_edge_need_that_reads_apart_from_its_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "--model", "cnn", "--fleet", _fleet(tmp_path, EDGE_SHORT), "--static", "2,5"]) == 1
    out, err = capsys.readouterr()
    assert "INFEASIBLE: edge memory 0.60865784 MiB > 0.6086578 MiB" in out.splitlines()
    assert err.splitlines() == [
        "splitfed optimize: error: static 2,5 does not fit: edge memory 0.60865784 MiB > 0.6086578 MiB"]


def test_optimize_names_a_device_no_cut_fits_with_digits_that_read_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The smallest device share of cnn at batch 32 is 8,192 bytes (0.0078125 MiB): 0.00781 MiB is just short."""
    fleet = _fleet(tmp_path, FLEET.replace("memory_mb = 0.25964355", "memory_mb = 0.00781"))
    assert main(["optimize", "--model", "cnn", "--fleet", fleet]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "splitfed optimize: error: device 'a' cannot train any legal cut of cnn at batch 32: its memory is "
        "0.00781 MiB and the smallest device share needs 0.007812 MiB (cuts 0,0)"]


def test_simulate_refuses_static_cuts_a_device_cannot_hold_with_digits_that_read_apart(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        runner.validate(RunSettings(fleet=_fleet(tmp_path, FLEET), clients=2, rounds=1, cuts="static:2,5"))
    assert str(e.value) == (
        "cuts 2,5 do not fit fleet device 'a' (client0): they need 0.259643555 MiB of its 0.25964355 MiB; give it "
        "cuts that keep fewer blocks on the device (static:K1,K2/K1,K2 deals cut vectors out by client) or use "
        "--cuts adaptive")


def test_simulate_refuses_static_cuts_the_edge_cannot_hold_with_digits_that_read_apart(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        runner.validate(RunSettings(fleet=_fleet(tmp_path, EDGE_SHORT), clients=2, rounds=1, cuts="static:2,5"))
    assert str(e.value) == (
        "cuts 2,5 overflow the fleet's edge: its segments of the 2 clients need 0.60865784 MiB of its 0.6086578 "
        "MiB; give it cuts that keep more blocks on the devices, more memory in the fleet file, or use --cuts "
        "adaptive")


# --- 2. the run says which clients it dealt ------------------------------------------------------------------

IOT = RunSettings(fleet="iot", clients=10, seed=0, rounds=1)  # the main job: the fleet's 10 devices as listed
IOT_DRAW = "clients: the 10 devices of fleet 'iot': 3 mcu-ble, 2 mcu-eth, 2 pi-sat, 2 pi-home, 1 phone-mid"


def test_the_draw_line_names_the_classes_drawn_most_first() -> None:
    """iot lists 3 mcu-ble, 2 mcu-eth, 2 pi-sat, 2 pi-home, 1 phone-mid (most first already, so its 10 clients
    cannot tell "most first" from "in the file's order"); 7 of them by seed 4 are 1 mcu-ble, 2 mcu-eth, 1 pi-sat,
    2 pi-home, 1 phone-mid, said most first and a tie in the fleet file's order."""
    seven = IOT.with_(clients=7, seed=4)
    assert runner.draw_note(seven) == ("clients: 7 of the 10 devices of fleet 'iot', drawn by seed 4: 2 mcu-eth, "
                                       "2 pi-home, 1 mcu-ble, 1 pi-sat, 1 phone-mid")
    assert dict(fleet_for(seven).kinds) == {"mcu-ble": 1, "mcu-eth": 2, "pi-sat": 1, "pi-home": 2,
                                            "phone-mid": 1}  # the same draw
    assert runner.draw_note(IOT) == IOT_DRAW


def test_a_large_fleets_draw_line_names_its_first_8_classes_and_counts_the_rest(tmp_path: Path) -> None:
    entries = "".join(f'[[device]]\nname = "d{i}"\nprofile = "rpi4"\ncount = {i + 1}\n' for i in range(11))
    fleet = _fleet(tmp_path, f'[edge]\nprofile = "edge-server"\n{entries}')
    s = RunSettings(fleet=fleet, clients=500, seed=2)
    line = runner.draw_note(s)
    head, _, drawn = line.rpartition(": ")
    # 1 + 2 + ... + 11 = 66 devices; 500 = 7 * 66 + 38
    assert head == f"clients: 500 from fleet {fleet!r}: each of its 66 devices 7 times, and 38 more drawn by seed 2"
    kinds = sorted(fleet_for(s).kinds.items(), key=lambda kn: -kn[1])
    assert len(kinds) == 11
    assert drawn == ", ".join(f"{n} {k}" for k, n in kinds[:8]) + ", and 3 more"
    assert [n for _, n in kinds] == sorted((n for _, n in kinds), reverse=True)


def test_simulate_says_the_draw_before_ray_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def start_ray(init_args: dict[str, Any], log: Any = None, **kwargs: Any) -> None:
        raise RayStartError("not started in this test")

    monkeypatch.setattr(runner, "start_ray", start_ray)
    lines: list[str] = []
    with pytest.raises(runner.SimulationError, match="not started in this test"):
        runner.simulate(IOT.with_(rounds=6), progress=lines.append, cpus=1)
    assert lines == ["starting the simulation engine (Ray, 1 CPU(s)) and 2 tier process(es)...", IOT_DRAW]


IOT_TWO_DRAW = "clients: 2 of the 10 devices of fleet 'iot', drawn by seed 0: 1 pi-sat, 1 pi-home"


def test_an_in_process_run_says_the_draw_first(tmp_path: Path) -> None:
    lines: list[str] = []
    s = RunSettings(fleet="iot", clients=2, seed=0, rounds=1, cuts="static:1,3", batch_size=64)
    train_inprocess(s.with_(out=str(tmp_path / "run")), progress=lines.append)
    assert lines[0] == IOT_TWO_DRAW
    assert lines[1].startswith("run ") and lines[1].endswith("rounds 1..1 (in-process)")


def test_a_flwr_run_logs_the_draw_at_its_start(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                               tmp_path: Path) -> None:
    run_config = {"fleet": "iot", "clients": 2, "seed": 0, "num-server-rounds": 1, "cuts": "static:1,3",
                  "batch-size": 64, "out": str(tmp_path / "run")}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    with caplog.at_level(logging.INFO, logger="flwr"), inprocess_tiers(monkeypatch):
        server.app.build_app()(FakeGrid(clients.app.app, 2), context)
    lines = [r.getMessage() for r in caplog.records if r.name == "flwr" and r.levelno == logging.INFO]
    assert lines[0] == IOT_TWO_DRAW


def test_the_help_of_clients_and_fleet_says_how_clients_are_drawn(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("--clients CLIENTS virtual clients (default 4), dealt from the fleet's devices: as many as it lists "
            "train the fleet as listed (as splitfed optimize --fleet prices it), fewer a subset drawn by --seed, "
            "more each device as often as it goes in and a subset for the rest; the run's first lines name "
            "them") in text
    assert ("--fleet FLEET fleet file or shipped fleet name the --clients devices are dealt from "
            "(default reference)") in text
    assert "replacement" not in text


def test_the_readme_shows_the_main_jobs_draw_as_the_run_prints_it() -> None:
    settings = RunSettings.from_toml(ROOT / "simulations/configs/main.toml")
    line = runner.draw_note(settings)
    readme = (ROOT / "README.md").read_text()
    assert line == IOT_DRAW  # the main job trains the iot fleet's 10 devices, as its file lists them
    assert f"the run's second line names them:\n`{line}`" in readme
    listed = parse_fleet((ROOT / "splitfed/fleets/iot.toml").read_text()).kinds
    assert len(listed) == 5 and all(f"{n} {kind}" in line for kind, n in listed.items())  # mcu-eth included
