"""``splitfed optimize``'s table for a large fleet, and its solver note when no MILP ran.

Up to ``PER_CLIENT_MAX`` (20) clients the table lists each client; above that, one row per (device class, cuts):
the class (the fleet's ``[[device]]`` entry), how many clients, the cuts, time_s and device memory (the largest of
the row's clients, said so when they differ), then a line saying what the rows are. ``--per-client`` lists each
client whatever the size; ``--json`` always does. ``sl`` and ``sflv2`` are solved without a MILP (each client's
fastest option that fits, the clients in turn): the note says so instead of "0 MILP(s)".
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from splitfed.cli import main
from splitfed.commands.optimize import PER_CLIENT_MAX, render
from splitfed.units import mib_text


def _fleet(pis: int, tabs: int) -> str:
    return f"""
name = "mix"
samples = 64
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "pi"
profile = "rpi4"
count = {pis}
[[device]]
name = "tab-with-a-long-name"
profile = "phone-mid"
count = {tabs}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")  # one mlp profile for the module's runs


@pytest.fixture()
def fleets(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """Fleet files of 20, 21 and 25 clients (pi first, then tab-with-a-long-name)."""
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(cache))
    out = {}
    for pis, tabs in ((10, 10), (10, 11), (15, 10)):
        p = tmp_path / f"mix{pis + tabs}.toml"
        p.write_text(_fleet(pis, tabs))
        out[pis + tabs] = str(p)
    return out


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(["optimize", "--model", "mlp", *argv]) == 0
    return capsys.readouterr().out


def test_a_fleet_above_twenty_clients_prints_a_row_per_class_and_cuts(fleets: dict[int, str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """25 clients in 2 classes, one cut vector for all: 2 rows (count, cuts, the class's time and memory, as
    ``--json`` gives them per client), a line naming the rule, then the makespan and solve lines as before."""
    argv = ["--fleet", fleets[25], "--static", "2,3"]
    rows = _out(capsys, argv).splitlines()
    clients = json.loads(_out(capsys, [*argv, "--json"]))["clients"]  # --json: still one entry per client
    assert [c["name"] for c in clients] == [f"pi-{i}" for i in range(15)] + [f"tab-with-a-long-name-{i}"
                                                                               for i in range(10)]
    pi, tab = clients[0], clients[-1]
    assert rows[0] == "mlp (5 blocks) on fleet mix (25 clients), 3 tiers, batch 32"
    assert rows[1] == "class                 clients  cuts           time_s   device memory"
    assert rows[2] == (f"pi                         15  2,3        {pi['time_s']:10.3f} "
                       f"{mib_text(pi['device_memory_bytes']):>15}")
    assert rows[3] == (f"tab-with-a-long-name       10  2,3        {tab['time_s']:10.3f} "
                       f"{mib_text(tab['device_memory_bytes']):>15}")
    assert rows[4] == ("25 clients in 2 rows, one per device class and cuts (--per-client lists each client; "
                       "--json too)")
    assert rows[5].startswith("makespan ") and rows[6].startswith("static 2,3")
    assert len(rows) == 7


def test_per_client_lists_every_client_of_a_large_fleet(fleets: dict[int, str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rows = _out(capsys, ["--fleet", fleets[25], "--static", "2,3", "--per-client"]).splitlines()
    assert rows[1].startswith("client ") and rows[1].endswith("device memory")
    assert [r.split()[0] for r in rows[2:27]] == [f"pi-{i}" for i in range(15)] + [f"tab-with-a-long-name-{i}"
                                                                                     for i in range(10)]
    assert rows[27].startswith("makespan ")


def test_twenty_clients_are_listed_and_twenty_one_grouped(fleets: dict[int, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert PER_CLIENT_MAX == 20
    rows = _out(capsys, ["--fleet", fleets[20], "--static", "2,3"]).splitlines()
    assert rows[1].startswith("client ") and len(rows) == 2 + 20 + 2
    rows = _out(capsys, ["--fleet", fleets[21], "--static", "2,3"]).splitlines()
    assert rows[1].startswith("class ") and [r.split()[:2] for r in rows[2:4]] == [["pi", "10"],
                                                                                   ["tab-with-a-long-name", "11"]]


def test_a_row_whose_clients_differ_shows_the_largest_and_says_so(fleets: dict[int, str]) -> None:
    """Clients of one class with different samples (not a fleet file's doing, a Scenario's) take different
    times: the row shows the largest, and the line below says time_s and device memory are the largest."""
    from splitfed.cost.model import Scenario
    from splitfed.models.zoo import resolve_spec
    from splitfed.optimizer import baselines
    from splitfed.profile.fleet import load_fleet
    from splitfed.profile.profiler import default_cache_dir, profile_model

    fleet = load_fleet(fleets[21])
    more = tuple(replace(c, samples=640) if c.name == "pi-3" else c for c in fleet.clients)
    prof = profile_model(resolve_spec("mlp", None, None), 32, reps=1, cache_dir=default_cache_dir())
    sc = Scenario.from_fleet(prof, replace(fleet, clients=more))
    sol = baselines.static(sc, [2, 3])
    times = {c.name: c.round_s for c in sol.cost.clients}
    assert times["pi-3"] > times["pi-0"]
    rows = render(sc, sol, "h", per_client=False).splitlines()
    assert rows[2].split()[:3] == ["pi", "10", "2,3"] and float(rows[2].split()[3]) == round(times["pi-3"], 3)
    assert rows[4] == ("21 clients in 2 rows, one per device class and cuts; time_s and device memory: the "
                       "largest of the row's clients (--per-client lists each client; --json too)")
    pis = sc.with_clients(sc.clients[:10])
    assert render(pis, baselines.static(pis, [2, 3]), "h", per_client=False).splitlines()[3] == (
        "10 clients in 1 row, one per device class and cuts; time_s and device memory: the largest of the row's "
        "clients (--per-client lists each client; --json too)")


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_an_in_turn_solve_says_it_ran_no_milp(mode: str, fleets: dict[int, str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """sl and sflv2 are solved by each client's fastest option (the clients in turn): the note says that, not
    "0 MILP(s)"; sflv1's bisection still counts its MILPs."""
    note = json.loads(_out(capsys, ["--fleet", fleets[21], "--mode", mode, "--json"]))["note"]
    assert note.startswith(f"{mode} sequential: 2 class(es), ") and "MILP(s)" not in note
    assert ", no MILP (clients in turn: each takes its fastest option that fits), proven gap " in note
    note = json.loads(_out(capsys, ["--fleet", fleets[21], "--json"]))["note"]
    assert note.startswith("sflv1 bisect: 2 class(es), ") and " 0 MILP(s)" not in note and " MILP(s), " in note
