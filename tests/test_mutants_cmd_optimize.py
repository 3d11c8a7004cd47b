"""``splitfed optimize``'s command line as a user relies on it (mutation testing of splitfed/commands/optimize.py).

Pins: the defaults of its flags (the run's own defaults: 3 tiers, batch 32, one local epoch, SGD with momentum's
one optimizer slot, no blocks forced onto a device, round 1, a 60 s time limit), each of them seen by the cost
model (a run without the flag prices what the same run given the default prices, and another value prices
something else); ``--optimizer-slots 0`` (plain SGD) taken; ``--gap``'s bounds [0, 1) and a ``--time-limit``
under a second taken; the table's columns (a client column at least as wide as its header); the "time limit
ran out" line only for a MILP cut short; the "[cloud] is not used" remark only on 2 tiers; and the one-rep
profile ``optimize`` keeps (it uses no measured times).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from splitfed.cli import build_parser, main
from splitfed.optimizer.defaults import DEFAULT_GAP

# two clients with short names (the table's client column is then its header's width); the Pi's uplink halves
# from round 1 on and again from round 2 on, so the round a run prices shows in its times
FLEET = """
name = "duo"
samples = 64
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "pi"
profile = "rpi4"
[[device.drift]]
round = 1
up_scale = 0.5
[[device.drift]]
round = 2
up_scale = 0.5
[[device]]
name = "tab"
profile = "phone-mid"
"""


@pytest.fixture()
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "duo.toml"
    p.write_text(FLEET)
    return str(p)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    """The command's ``--json`` object, less the solve time (a measurement, not a result)."""
    assert main(["optimize", "--model", "mlp", *argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    del out["solve_s"]
    return out


def _table(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    assert main(["optimize", "--model", "mlp", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_defaults_are_a_run_s_defaults() -> None:
    """``optimize`` plans what ``simulate`` runs when neither is told otherwise: 3 tiers, batch 32, one local
    epoch, SGD with momentum (one optimizer tensor per parameter, as ``--help`` says), no block forced onto a
    device; the fleet as it is in round 1 (rounds count from 1), and a minute for the exact solve."""
    from splitfed.flower.config import RunSettings

    args = build_parser().parse_args(["optimize", "--model", "mlp", "--fleet", "small"])
    run = RunSettings()
    assert (args.tiers, args.batch, args.epochs, args.min_device_blocks) == (
        run.tiers, run.batch_size, run.local_epochs, run.min_device_blocks) == (3, 32, 1, 0)
    assert run.optimizer == "sgd" and run.momentum > 0 and args.optimizer_slots == 1
    assert (args.mode, args.compress, args.u_shape) == (run.mode, run.compress, run.u_shape)
    assert args.round == 1 and args.time_limit == 60.0 and args.gap == DEFAULT_GAP


def test_a_run_without_the_flags_prices_what_their_defaults_say(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Leaving a flag out is giving its default: the same priced result; and each flag reaches the cost model
    (another value prices something else), so a wrong default could not hide."""
    base = ["--fleet", fleet, "--static", "2,3"]
    plain = _json(capsys, base)
    assert (plain["tiers"], plain["batch"]) == (3, 32)
    assert all(len(c["cuts"]) == 2 for c in plain["clients"])
    explicit = ["--tiers", "3", "--batch", "32", "--epochs", "1", "--optimizer-slots", "1",
                "--min-device-blocks", "0", "--round", "1"]
    assert _json(capsys, [*base, *explicit]) == plain
    for flag, other in (("--epochs", "2"), ("--optimizer-slots", "2"), ("--optimizer-slots", "0"), ("--round", "2")):
        assert _json(capsys, [*base, flag, other]) != plain, flag


def test_each_optimizer_slot_count_is_taken_and_prices_its_memory(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--optimizer-slots 0`` (plain SGD, as ``--help`` offers) is taken, and holds less than momentum's 1,
    which holds less than Adam's 2: on the device and on the server tier that trains."""
    mem = {}
    for slots in (0, 1, 2):
        out = _json(capsys, ["--fleet", fleet, "--static", "2,3", "--optimizer-slots", str(slots)])
        mem[slots] = (out["clients"][0]["device_memory_bytes"], out["shared_memory_bytes"]["cloud"])
    assert mem[0] < mem[1] < mem[2]


def test_the_round_default_prices_round_one_drift(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Rounds count from 1: a drift "from round 1 on" applies to the default run (the Pi's uplink halved),
    one from round 2 on does not."""
    times = {}
    for r in ("1", "2", "3"):
        out = _json(capsys, ["--fleet", fleet, "--static", "2,3", "--round", r])
        times[r] = out["clients"][0]["time_s"]
        assert out["clients"][1]["time_s"] == _json(capsys, ["--fleet", fleet, "--static", "2,3"])["clients"][1]["time_s"]
    default = _json(capsys, ["--fleet", fleet, "--static", "2,3"])["clients"][0]["time_s"]
    assert default == times["1"] < times["2"] == times["3"]


def test_the_gap_must_be_in_zero_to_one(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--gap 0`` (prove the optimum) is taken; 1 and more (any assignment "proven") are refused, named."""
    assert _json(capsys, ["--fleet", fleet, "--gap", "0"])["optimal"] is True
    for bad in ("1", "1.5"):
        assert main(["optimize", "--model", "mlp", "--fleet", fleet, "--gap", bad]) == 2
        out, err = capsys.readouterr()
        assert out == "" and f"splitfed optimize: error: --gap must be in [0, 1), got {float(bad)}" in err


def test_a_time_limit_under_a_second_is_taken(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Any finite positive number of seconds is a time limit (``--help``: "> 0"), not only whole ones."""
    assert main(["optimize", "--model", "mlp", "--fleet", fleet, "--static", "2,3", "--time-limit", "0.5"]) == 0
    assert "static 2,3" in capsys.readouterr().out


def test_the_solve_gets_the_default_gap_and_a_minute(fleet: str, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--gap`` and ``--time-limit``, the exact solve proves ``DEFAULT_GAP`` within 60 s; a MILP that
    ran out of time says so on its last line, marked not proven optimal."""
    import splitfed.optimizer as optimizer

    real, seen = optimizer.solve, []

    def cut_short(sc, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.append(kw)
        return replace(real(sc, **kw), optimal=False)

    monkeypatch.setattr(optimizer, "solve", cut_short)
    rows = _table(capsys, ["--fleet", fleet])
    assert seen == [{"gap": DEFAULT_GAP, "time_limit": 60.0}]
    assert rows[-1].startswith("milp: solved in ")
    assert rows[-1].endswith("; the time limit ran out: the best assignment found, not proven optimal")


def test_only_a_milp_cut_short_says_the_time_limit_ran_out(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A MILP that proved its gap, and a priced policy (never "optimal", never timed), say nothing of a time
    limit."""
    for policy in ([], ["--static", "2,3"], ["--greedy"], ["--best-static"], ["--all-on-server"]):
        rows = _table(capsys, ["--fleet", fleet, *policy])
        solved = [r for r in rows if ": solved in " in r]
        assert len(solved) == 1 and "time limit" not in solved[0], rows
    rows = _table(capsys, ["--fleet", fleet])
    assert rows[-2].startswith("milp: solved in ") and rows[-1].startswith("why: "), rows  # a proven optimum's why


def test_the_table_s_columns_line_up(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Names shorter than "client" get the header's width, then two spaces: each column starts under its
    header."""
    rows = _table(capsys, ["--fleet", fleet, "--static", "2,3"])
    assert rows[1] == "client  cuts           time_s   device memory"
    pi, tab = rows[2], rows[3]
    assert pi.startswith("pi      2,3        ") and tab.startswith("tab     2,3        ")
    assert len(pi) == len(tab) == len(rows[1])
    assert pi.index("2,3") == rows[1].index("cuts")


def test_three_tiers_do_not_say_the_cloud_is_unused(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The remark is for 2 tiers on a fleet with a [cloud]; on 3 tiers the cloud is used."""
    header = _table(capsys, ["--fleet", fleet, "--static", "2,3"])[0]
    assert header == "mlp (5 blocks) on fleet duo (2 clients), 3 tiers, batch 32"
    assert _table(capsys, ["--fleet", fleet, "--tiers", "2", "--static", "2"])[0].endswith(
        "batch 32 (the fleet's [cloud] is not used)")


def test_optimize_profiles_with_one_timed_rep(fleet: str, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``optimize`` uses no measured times (FLOPs and bytes only), so it times each block once; the profile
    it caches then gives way to the 3 reps ``profile`` asks for (``profile_model``'s contract)."""
    from splitfed.profile import profiler

    real, reps = profiler.profile_model, []

    def spy(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        reps.append(kw["reps"])
        return real(*a, **kw)

    monkeypatch.setattr(profiler, "profile_model", spy)
    assert main(["optimize", "--model", "mlp", "--fleet", fleet, "--static", "2,3"]) == 0
    capsys.readouterr()
    assert reps == [1]
