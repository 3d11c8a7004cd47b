"""U-shape cuts (k_1, ..., u): the device holds [0, k_1) and the tail [u, L). ``--min-device-blocks`` counts the
blocks it runs on its raw inputs before anything leaves it (the head; every block when all cuts are equal and
no server is entered); that whole-model placement has one spelling, L,...,L; the run's first line and the
report say U-shape; the README says what a U-shape tail puts on the device's link."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from splitfed.cost import Scenario, client_cost, cut_options
from splitfed.errors import ConfigError, CutError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import make_policy
from splitfed.optimizer import assign, baselines, brute_force
from splitfed.profile.devices import LinkProfile, TierProfile
from splitfed.profile.fleet import Client
from splitfed.profile.profiler import ModelProfile
from splitfed.report.runs import load_run, write_run
from splitfed.report.summary import csv_texts, summary_markdown, summary_rows
from tests.test_report import make_rows

ROOT = Path(__file__).resolve().parent.parent


def _scenario(min_device_blocks: int = 0, fast_device: bool = True) -> Scenario:
    """3 tiers in U-shape, a 3-block model; a device far faster than a slow link: all on the device is best."""
    prof = ModelProfile.synthetic([1e6, 2e6, 1e6], [4e3, 4e3, 4e3], [1e3, 1e3, 1e3], input_bytes=4e3)
    dev = TierProfile(1e12 if fast_device else 1e6, 1e9)
    clients = (Client("c0", "c0", dev, LinkProfile(1e3, 1e3, 0.01), 64),)
    servers = (TierProfile(1e9, 1e10), TierProfile(1e9, 1e10))
    return Scenario(prof, clients, servers, (LinkProfile(1e6, 1e6, 0.01),), batch=32, u_shape=True,
                    min_device_blocks=min_device_blocks)


# ---------------------------------------------------------------- 1. min-device-blocks counts the leading blocks


def test_static_cuts_that_enter_no_server_keep_every_block_on_the_device() -> None:
    """0,0,0 in U-shape: the tail goes on from the (empty) head, the inputs never leave: not refused."""
    s = RunSettings(u_shape=True, cuts="static:0,0,0", min_device_blocks=1)
    assert make_policy(s).state_dict() == {"options": [[0, 0, 0]]}  # built, the cuts as given
    assert _scenario(min_device_blocks=1).check_cuts((0, 0, 0)) == (0, 0, 0)
    assert _scenario(min_device_blocks=3).check_cuts((2, 2, 2)) == (2, 2, 2)


def test_a_u_shape_tail_does_not_count_toward_min_device_blocks(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """2,5,6: the device holds 0, 1 and 6, but the inputs leave it after block 1: two leading blocks."""
    from splitfed.cli import main

    argv = ["simulate", "--u-shape", "--cuts", "static:2,5,6", "--min-device-blocks", "3", "--out",
            str(tmp_path / "r")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "splitfed simulate: error: command line: cuts: static cuts 2,5,6 keep 2 leading block(s) on the device; "
        "min-device-blocks is 3: give a first cut of at least 3")
    assert not (tmp_path / "r").exists()
    with pytest.raises(CutError) as e:
        _scenario(min_device_blocks=1).check_cuts((0, 1, 2))
    assert str(e.value) == "cuts 0,1,2 keep fewer than 1 leading block(s) on the device"


def test_cut_options_keep_the_leading_blocks_and_no_more_than_the_model_has() -> None:
    rows = {tuple(r) for r in cut_options(3, 3, u_shape=True, min_device_blocks=2).tolist()}
    assert (3, 3, 3) in rows and (2, 2, 3) in rows and (2, 3, 3) in rows
    assert all(r[0] >= 2 for r in rows)
    with pytest.raises(CutError) as e:
        cut_options(3, 3, u_shape=True, min_device_blocks=4)
    assert str(e.value) == "no legal cut keeps 4 leading block(s) on the device of a 3-block model"
    with pytest.raises(ConfigError, match=r"^static cuts 0,2 keep 0 leading block\(s\) on the device; "):
        make_policy(RunSettings(tiers=2, u_shape=True, cuts="static:0,2", min_device_blocks=1))


# ---------------------------------------------------------------- 2. the whole model on the device: L,...,L


def test_u_shape_options_spell_the_whole_model_on_the_device_once() -> None:
    """(k, k, k) for any k is one placement: the options hold it once, as 3,3,3 (fedavg's spelling)."""
    for m in (0, 1, 3):
        rows = [tuple(r) for r in cut_options(3, 3, u_shape=True, min_device_blocks=m).tolist()]
        assert [r for r in rows if r[0] == r[-1]] == [(3, 3, 3)]
    assert len(cut_options(3, 3, u_shape=True)) == 20 - 3  # C(3 + 3, 3), less 0,0,0 1,1,1 2,2,2
    assert len(cut_options(3, 3)) == 10  # no U-shape: k,k keeps k blocks, each its own placement


@pytest.mark.parametrize("min_device_blocks", [0, 1])
def test_the_optimizer_writes_the_whole_model_on_the_device_as_l_l_l(min_device_blocks: int) -> None:
    sc = _scenario(min_device_blocks)
    for sol in (assign.solve(sc), baselines.greedy(sc), brute_force.exhaustive(sc), baselines.best_static(sc)):
        assert sol.assignment == {"c0": (3, 3, 3)}, sol.method
        # the same makespan as any other spelling of it
        assert sol.makespan_s == client_cost(sc, "c0", (0, 0, 0)).round_s == client_cost(sc, "c0", (1, 1, 1)).round_s


# ---------------------------------------------------------------- 3. the run's first line and the report


def test_an_in_process_run_says_u_shape_in_its_first_line(tmp_path: Path) -> None:
    from splitfed.sim.inprocess import train_inprocess

    lines: list[str] = []
    s = RunSettings(rounds=1, clients=2, tiers=3, u_shape=True, cuts="static:1,3,6", batch_size=64, seed=3,
                    out=str(tmp_path / "r"))
    train_inprocess(s, progress=lines.append)
    assert "run splitfed-3: sflv1, 3 tiers, U-shape, cuts static:1,3,6, 2 client(s), rounds 1..1 (in-process)" in lines


def test_a_flower_run_says_u_shape_in_its_first_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import clients.app
    import server.app
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    s = RunSettings(rounds=1, clients=2, tiers=3, u_shape=True, cuts="static:1,3,6", batch_size=64, seed=1,
                    node_wait_s=5.0, out=str(tmp_path / "r"))
    lines: list[str] = []
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, s.clients), s, progress=lines.append)
    starts = [x for x in lines if x.startswith("run ")]
    assert len(starts) == 1
    assert starts[0].endswith(": sflv1, 3 tiers, U-shape, cuts static:1,3,6, 2 client(s), rounds 1..1")


def test_the_report_says_each_runs_mode_tiers_and_u_shape(tmp_path: Path) -> None:
    u = write_run(tmp_path / "u", make_rows(2), {"label": "u", "settings": {"mode": "sflv2", "tiers": 3,
                                                                            "u_shape": True}})
    plain = write_run(tmp_path / "p", make_rows(2), {"label": "p", "settings": {"mode": "sl", "tiers": 2,
                                                                                "u_shape": False}})
    bare = write_run(tmp_path / "b", make_rows(2), {"label": "b"})  # no settings: nothing to say
    runs = [load_run(p) for p in (u, plain, bare)]
    headers, rows = summary_rows(runs)
    assert headers[:5] == ["run", "mode", "tiers", "U-shape", "rounds"]
    assert [r[:5] for r in rows] == [["u", "sflv2", 3, "yes", 2], ["p", "sl", 2, "no", 2], ["b", None, None, None, 2]]
    md = summary_markdown(runs)
    assert "| u | sflv2 | 3 | yes | 2 |" in md and "| b | - | - | - | 2 |" in md
    table = list(csv.reader(io.StringIO(csv_texts(runs)[0])))
    assert [r[:5] for r in table] == [["run", "mode", "tiers", "U-shape", "rounds"], ["u", "sflv2", "3", "yes", "2"],
                                      ["p", "sl", "2", "no", "2"], ["b", "", "", "", "2"]]


# ---------------------------------------------------------------- 4. the README


def test_the_readme_says_what_a_u_shape_tail_puts_on_the_devices_link() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert ("activation MB the activations up and gradients down (with `--u-shape` also the tail's activations "
            "down and their gradients up)") in text
