"""``splitfed simulate``'s settings as a user writes them, in a config file or as flags, that the checks before
Ray let through to fail later, or refused with words that sent the user elsewhere:

- a round or call timeout beyond what a gRPC deadline holds (``1e10``) passed, then every load failed with
  "Deadline Exceeded": refused in the settings (and by the gRPC client), naming the key and the most it takes;
- a shipped config's fleet (``fleets/drift.tiny.toml``) was looked for only in the current folder: a relative
  fleet path is looked up beside the config too (the experiment scripts' rule, one function for both), and one
  found nowhere is refused naming the config and the folders searched;
- ``tiers = 4`` was refused for its cuts' number first ("4 tiers need 3 cut(s)"), then, cuts added, with
  neither file nor key: refused naming both, before the cuts;
- ``--tiers 2`` or ``--u-shape`` alone was refused for the default's cuts ``static:2,5``, which the user never
  gave: a run that names no cuts takes a default that fits;
- ``cuts = "adaptive:1"`` in a config was refused as ``--cuts``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulations import common
from splitfed.cli import build_parser, main
from splitfed.commands.simulate import settings_from_args
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import make_policy
from splitfed.profile.fleet import load_fleet
from splitfed.transport.client import MAX_DEADLINE_S, GrpcTierClient
from tests.transport_fixtures import load_client, plain_server  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[1]
MOST = "at most 1,000,000,000 s (about 32 years, as good as no limit; a gRPC deadline beyond it overflows)"
SHIPPED = "(shipped: iot, reference, small)"
FLEET = '[edge]\nprofile = "edge-server"\n[[device]]\nname = "pi"\nprofile = "rpi4"\n'


def _settings(*argv: str) -> RunSettings:
    return settings_from_args(build_parser().parse_args(["simulate", *argv]))  # out: a name made, no folder


def _refusal(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    """The one line ``splitfed simulate ARGV`` is refused with (exit 2), Ray never started."""
    import splitfed.sim.runner

    monkeypatch.setattr(splitfed.sim.runner, "simulate", lambda *a, **k: pytest.fail("simulate started"))
    assert main(["simulate", "--out", "x", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------- timeouts a gRPC deadline cannot hold


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("round-timeout-s", 1e10, "1e+10"), ("round-timeout-s", 1e300, "1e+300"), ("call-timeout-s", 2e9, "2e+09")])
def test_a_timeout_beyond_a_grpc_deadline_is_refused_naming_the_key_and_the_most(key, value, shown) -> None:
    with pytest.raises(ConfigError) as e:
        RunSettings.from_mapping({key: value}, source="run.toml")
    assert str(e.value) == f"run.toml: {key} must be {MOST}, got {shown}"


def test_the_most_is_taken_and_a_flag_beyond_it_is_refused_before_anything_starts(capsys, monkeypatch) -> None:
    s = RunSettings.from_mapping({"round-timeout-s": MAX_DEADLINE_S, "call-timeout-s": MAX_DEADLINE_S})
    assert s.call_deadline_s == MAX_DEADLINE_S == 1e9
    assert RunSettings(node_wait_s=1e300).node_wait_s == 1e300  # a wait the ServerApp times itself: no deadline
    err = _refusal(capsys, monkeypatch, "--round-timeout-s", "1e10")
    assert err.endswith(f"command line: round-timeout-s must be {MOST}, got 1e+10")


def test_the_grpc_client_refuses_a_deadline_beyond_the_most_and_a_tier_answers_within_it(plain_server) -> None:  # noqa: F811
    """The bound is inside what gRPC holds: a load with the longest deadline is answered (1e10 s failed it)."""
    with pytest.raises(ConfigError) as e:
        GrpcTierClient("127.0.0.1:1", insecure=True, deadline_s=1e10)
    assert str(e.value) == f"deadline_s must be {MOST}, got 1e+10"
    with GrpcTierClient(plain_server.address, insecure=True, deadline_s=MAX_DEADLINE_S, retries=0) as c:
        load_client(c, "client0")


# ---------------------------------------------------------------- a config's fleet file beside it


def test_a_shipped_config_s_fleet_is_found_from_the_repository_root(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    s = _settings("--config", "simulations/configs/drift.tiny.toml")
    assert s.fleet == str(Path("simulations/configs/fleets/drift.tiny.toml").resolve())  # absolute: --resume anywhere
    assert load_fleet(s.fleet).name == "drift-tiny"


def test_a_relative_fleet_is_looked_up_here_first_then_beside_the_config(tmp_path, monkeypatch) -> None:
    (tmp_path / "cfg" / "fleets").mkdir(parents=True)
    (tmp_path / "cfg" / "fleets" / "mine.toml").write_text(f'name = "beside"\n{FLEET}')
    cfg = tmp_path / "cfg" / "run.toml"
    cfg.write_text('[simulate]\nfleet = "fleets/mine.toml"\n')
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert _settings("--config", str(cfg)).fleet == str(tmp_path / "cfg" / "fleets" / "mine.toml")
    assert _settings("--config", "../cfg/run.toml").fleet == str((tmp_path / "cfg" / "fleets" / "mine.toml").resolve())
    assert _settings("--config", str(cfg), "--fleet", "small").fleet == "small"  # the flag's: not the config's
    (here / "fleets").mkdir()
    (here / "fleets" / "mine.toml").write_text(f'name = "here"\n{FLEET}')
    assert _settings("--config", str(cfg)).fleet == str((here / "fleets" / "mine.toml").resolve())  # the current folder's
    cfg.write_text('[simulate]\nfleet = "small"\n')
    assert _settings("--config", str(cfg)).fleet == "small"  # a shipped fleet's name


def test_a_config_s_fleet_found_nowhere_is_refused_naming_the_config_and_the_folders(tmp_path, monkeypatch) -> None:
    cfg = tmp_path / "cfg" / "run.toml"
    cfg.parent.mkdir()
    cfg.write_text('[simulate]\nfleet = "fleets/nope.toml"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        _settings("--config", "cfg/run.toml")
    assert str(e.value) == (f"cfg/run.toml: fleet 'fleets/nope.toml': no such file from the current folder "
                            f"({tmp_path}) or from {tmp_path / 'cfg'}, and no shipped fleet of that name {SHIPPED}")
    cfg.rename(tmp_path / "run.toml")  # the config's folder is the current one: named once
    with pytest.raises(ConfigError) as e:
        _settings("--config", "run.toml")
    assert str(e.value) == (f"run.toml: fleet 'fleets/nope.toml': no such file from the current folder "
                            f"({tmp_path}), and no shipped fleet of that name {SHIPPED}")


def test_the_experiment_scripts_look_up_a_fleet_by_the_same_rule(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert common.base_settings({"fleet": "fleets/drift.tiny.toml"}).fleet == str(
        common.CONFIGS / "fleets" / "drift.tiny.toml")
    with pytest.raises(ConfigError) as e:
        common.base_settings({"fleet": "fleets/nope.toml"}, "exp.toml")
    assert str(e.value) == (f"exp.toml [simulate]: fleet 'fleets/nope.toml': no such file from the current folder "
                            f"({tmp_path}) or from {common.CONFIGS}, and no shipped fleet of that name {SHIPPED}")


# ---------------------------------------------------------------- tiers a fleet has no servers for


@pytest.mark.parametrize("cuts", ["", 'cuts = "static:1,3,5"\n'])
def test_four_tiers_are_refused_naming_the_file_and_key_before_the_cuts(tmp_path, cuts) -> None:
    cfg = tmp_path / "t4.toml"
    cfg.write_text(f"[simulate]\ntiers = 4\n{cuts}")
    with pytest.raises(ConfigError) as e:
        _settings("--config", str(cfg))
    assert str(e.value) == (f"{cfg}: tiers must be 2 or 3, got 4: the simulated clock (sim-clock) prices a "
                            "fleet's server tiers, an edge and a cloud")


def test_more_tiers_run_with_static_cuts_timed_as_measured_as_a_deployment_s_own_tiers() -> None:
    assert RunSettings(tiers=4, cuts="static:1,3,5", sim_clock=False).tiers == 4
    with pytest.raises(ConfigError) as e:
        RunSettings.from_mapping({"tiers": 4, "cuts": "adaptive", "sim-clock": False}, source="run config")
    assert str(e.value) == ("run config: tiers must be 2 or 3, got 4: cuts adaptive prices a fleet's server tiers, "
                            "an edge and a cloud")


# ---------------------------------------------------------------- the default cuts fit the tiers


def test_a_run_that_names_no_cuts_takes_a_default_that_fits_its_tiers(tmp_path, capsys, monkeypatch) -> None:
    from splitfed.sim.runner import validate

    for argv, cuts in ((["--tiers", "2"], "static:2"), (["--u-shape"], "static:2,5,6"),
                       (["--tiers", "2", "--u-shape"], "static:2,5"), ([], "static:2,5")):
        s = _settings(*argv, "--clients", "2")
        assert s.cuts == cuts, argv
        validate(s)  # all the checks before Ray: these cuts fit the model and every device of the fleet
    cfg = tmp_path / "run.toml"
    cfg.write_text("[simulate]\ntiers = 2\n")
    assert _settings("--config", str(cfg)).cuts == "static:2"
    cfg.write_text('[simulate]\ntiers = 2\ncuts = "static:3"\n')
    assert _settings("--config", str(cfg)).cuts == "static:3"  # given: kept
    assert _settings("--tiers", "2", "--cuts", "static:1").cuts == "static:1"
    err = _refusal(capsys, monkeypatch, "--tiers", "2", "--cuts", "static:2,5")  # the user's own: still refused
    assert err.endswith("cuts 'static:2,5': 2 tiers need 1 cut(s), got 2: 2,5")


# ---------------------------------------------------------------- a config's cuts named as cuts


def test_a_config_s_builtin_policy_with_an_argument_is_refused_naming_cuts_not_the_flag(tmp_path) -> None:
    """Refused as the file is read, naming it (before: it passed, and was refused only when the run built its
    policy); settings made in code are still refused then, naming cuts."""
    cfg = tmp_path / "run.toml"
    cfg.write_text('[simulate]\ncuts = "adaptive:1"\n')
    with pytest.raises(ConfigError) as e:
        RunSettings.from_toml(cfg)
    assert str(e.value) == f"{cfg}: cuts: adaptive takes no argument, got adaptive:1"
    with pytest.raises(ConfigError) as e:
        make_policy(RunSettings(cuts="adaptive:1"))
    assert str(e.value) == "cuts adaptive takes no argument, got adaptive:1"


def test_a_policy_registered_in_a_builtin_s_place_may_take_an_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    from splitfed.flower import policy

    monkeypatch.setitem(policy._FACTORIES, "greedy", lambda arg, settings: policy.StaticPolicy([(2, 5)]))
    assert RunSettings.from_mapping({"cuts": "greedy:mine"}).cuts == "greedy:mine"


@pytest.mark.parametrize("name", ["adaptive", "greedy"])
def test_a_planning_policy_with_a_fraction_below_1_is_refused_naming_cuts_not_the_flag(name: str) -> None:
    """The value may come from a config file's ``cuts``: the message names the setting, not ``--cuts``."""
    from splitfed.flower.adaptive import _check

    with pytest.raises(ConfigError, match=f"^cuts {name} plans for every client in every round: use fraction 1$"):
        _check(RunSettings(cuts=name, fraction=0.5, min_clients=1), name)


@pytest.mark.parametrize("argv", [["ping", "127.0.0.1:1", "--timeout", "1e10"],
                                  ["tier", "--insecure", "--listen", "127.0.0.1:0", "--deadline", "1e10"]],
                         ids=["ping --timeout", "tier --deadline"])
def test_a_flag_that_becomes_a_grpc_deadline_is_refused_beyond_the_most_naming_the_flag(argv: list[str]) -> None:
    """Before, ping's client refused naming its ``deadline_s`` argument, not the flag the user gave, and a tier
    served (its calls to a next tier would fail). Its own process, with a limit: a tier that serves never returns."""
    import subprocess
    import sys

    flag = argv[-2]
    done = subprocess.run([sys.executable, "-m", "splitfed.cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        f"splitfed {argv[0]}: error: {flag} must be at most 1,000,000,000 s (about 32 years, as good as no limit; a "
        "gRPC deadline beyond it overflows), got 1e+10")
