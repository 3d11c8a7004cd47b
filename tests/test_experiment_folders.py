"""An experiment's ``--out`` folder as the prober left it, and a benchmark's ``--out`` that cannot be written.

- a cost-model sweep stopped while drawing its figures leaves ``results.csv`` and figures, no ``results.json``:
  that folder is an experiment's (``--overwrite`` replaces it), not "what no experiment writes";
- a folder another experiment is writing is refused as in use (its lock), before its contents are judged, and
  the drafts a killed writer left (``.NAME.PID-TID.tmp``) are no one's results: never foreign, removed;
- the sweep, which keeps no runs, never offers ``--resume`` (its refusals, its stop line, its ``--help``);
- a benchmark's ``--out`` in a folder that takes no file is refused when the flags are read, and a result file
  that cannot be written is one line, not a traceback.

Folders are built by hand and :func:`simulations.common.output_folder` is called directly: nothing trains.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulations import common, heterogeneity_sweep
from splitfed.cli import script
from splitfed.commands._args import json_out
from splitfed.errors import ConfigError
from splitfed.flower import runfolder
from splitfed.jsonio import write_json

DRAFT = ".accuracy_per_round.png.9239-140000000000.tmp"  # jsonio.draft_of's name, its writer killed


def stopped_sweep(out: Path) -> Path:
    """What a sweep stopped while drawing left: its table and a first figure, no results.json."""
    out.mkdir()
    (out / "results.csv").write_text("clients,spread\n20,0.0\n")
    (out / "makespan_vs_spread_20.png").write_bytes(b"\x89PNG")
    return out


# ---------------------------------------------------------------- a sweep stopped while drawing


def test_a_sweep_stopped_while_drawing_is_replaced_with_overwrite(tmp_path: Path) -> None:
    """Before: "holds what no experiment writes (makespan_vs_spread_20.png)", with or without --overwrite."""
    out = stopped_sweep(tmp_path / "cc1")
    with common.output_folder(out, overwrite=True, name="heterogeneity_sweep"):
        assert [p.name for p in out.iterdir() if not p.name.startswith(common._ASIDE)] == [runfolder.LOCK]
        (out / "results.csv").write_text("new\n")
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"]
    assert (out / "results.csv").read_text() == "new\n"


def test_a_stopped_sweeps_folder_without_overwrite_names_overwrite_not_resume(tmp_path: Path) -> None:
    out = stopped_sweep(tmp_path / "cc1")
    with pytest.raises(ConfigError) as e, common.output_folder(out, overwrite=False, name="heterogeneity_sweep"):
        pass
    assert str(e.value) == (f"--out {out} already holds an experiment's results (makespan_vs_spread_20.png, "
                            "results.csv): replace them with --overwrite, or choose another --out")
    assert common._kept(out) == ("it keeps no runs to continue from (results.json comes at the end); to start "
                                 "again: the same command with --overwrite")
    assert common._kept(tmp_path / "nothing") == ("it keeps no runs to continue from (results.json comes at the "
                                                  "end); to start again: the same command")


def test_a_folder_with_runs_still_offers_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    with pytest.raises(ConfigError) as e, common.output_folder(out, overwrite=False, name="compression"):
        pass
    assert str(e.value) == (f"--out {out} already holds an experiment's results (runs): continue them with "
                            "--resume, replace them with --overwrite, or choose another --out")


def test_figures_beside_nothing_of_an_experiments_are_still_foreign(tmp_path: Path) -> None:
    out = tmp_path / "figures"
    out.mkdir()
    (out / "mine.png").write_bytes(b"\x89PNG")
    with pytest.raises(ConfigError) as e, common.output_folder(out, overwrite=True, name="heterogeneity_sweep"):
        pass
    assert str(e.value) == f"--out {out} holds what no experiment writes (mine.png): choose another --out"
    assert (out / "mine.png").read_bytes() == b"\x89PNG"


# ---------------------------------------------------------------- a folder being written


@pytest.mark.parametrize("contents", [["runs"], [DRAFT, "runs"], ["mine.txt"]])
def test_a_folder_in_use_is_refused_as_in_use_whatever_it_holds(tmp_path: Path, contents: list[str]) -> None:
    """Before: "already holds an experiment's results (runs): continue them with --resume", or a draft of the
    running experiment named as "what no experiment writes"."""
    out = tmp_path / "out"
    with runfolder.claim(out, resume=False, overwrite=False):  # another experiment's, writing now
        for name in contents:
            (out / name).mkdir() if name == "runs" else (out / name).write_text("x")
        for overwrite, resume in ((False, False), (True, False), (False, True)):
            with pytest.raises(ConfigError) as e, common.output_folder(out, overwrite, resume, "compression"):
                pass
            assert str(e.value).startswith(f"--out {out} is in use by another run or experiment (pid "), str(e.value)
            assert str(e.value).endswith("; wait for it to end or choose another --out"), str(e.value)
        assert sorted(p.name for p in out.iterdir()) == sorted([runfolder.LOCK, *contents])


def test_a_killed_writers_drafts_are_no_ones_and_are_removed(tmp_path: Path) -> None:
    """Before: a draft alone was "what no experiment writes", refused even with --overwrite."""
    out = tmp_path / "out"
    out.mkdir()
    (out / DRAFT).write_bytes(b"half a png")
    with common.output_folder(out, overwrite=False, name="compression"):  # nothing there: no --overwrite needed
        assert not (out / DRAFT).exists()
    (out / "results.json").write_text('{"experiment": "compression"}')
    (out / "runs").mkdir()
    (out / DRAFT).write_bytes(b"half a png")
    with common.output_folder(out, overwrite=False, resume=True, name="compression"):
        assert not (out / DRAFT).exists()
    (out / DRAFT).write_bytes(b"half a png")
    with common.output_folder(out, overwrite=True, name="compression"):
        assert not (out / DRAFT).exists()
        (out / "results.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


# ---------------------------------------------------------------- the sweep offers no --resume


def test_the_sweep_refuses_resume_up_front_and_does_not_offer_it(tmp_path: Path, capsys) -> None:
    """Before: its --help offered --resume, and --resume on its folder was "holds no experiment's runs"."""
    out = stopped_sweep(tmp_path / "cc1")
    with pytest.raises(SystemExit) as stop:
        heterogeneity_sweep.cli(["--out", str(out), "--resume"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m simulations.heterogeneity_sweep: error: --resume: heterogeneity_sweep trains no runs to "
        "continue (it prices the cost model): run it again, with --overwrite to replace what it wrote")
    assert sorted(p.name for p in out.iterdir()) == ["makespan_vs_spread_20.png", "results.csv"]
    with pytest.raises(SystemExit):
        heterogeneity_sweep.cli(["--help"])
    assert "--resume" not in capsys.readouterr().out


# ---------------------------------------------------------------- a benchmark's --out


def test_a_benchmarks_out_in_a_folder_that_takes_no_file_is_refused_with_the_flags(tmp_path: Path) -> None:
    """Before: accepted, and a FileNotFoundError traceback once the measuring was done."""
    with pytest.raises(argparse.ArgumentTypeError) as e:
        json_out("weights.json")("/proc/w.json")
    assert str(e.value) == "/proc takes no new file (No such file or directory), so /proc/w.json cannot be written"
    assert json_out("weights.json")(str(tmp_path / "new" / "w.json")) == str(tmp_path / "new" / "w.json")


def test_a_result_file_that_cannot_be_written_is_one_line(capsys) -> None:
    """Before: the FileNotFoundError's traceback, naming the draft (``/proc/.w.json.PID-TID.tmp``)."""
    def body() -> int:
        print("measured: 1.0 s")
        write_json("/proc/w.json", {"s": 1.0})
        return 0

    assert script("bench", body) == 1
    printed = capsys.readouterr()
    assert printed.out == "measured: 1.0 s\n"
    assert printed.err == "bench: error: /proc/w.json: No such file or directory\n"


@pytest.mark.parametrize(("name", "draft"), [(".results.json.123-456.tmp", True), (".a.b.png.1-2.tmp", True),
                                             ("results.json", False), (".x.1-2.tmp.bak", False),
                                             ("..1-2.tmp", False), (".x.1-a.tmp", False), (".x.12.tmp", False),
                                             ("x.1-2.tmp", False)])
def test_a_draft_of_any_process_is_told_from_other_names(name: str, draft: bool) -> None:
    """``jsonio.draft_of``'s names, whoever wrote them (a killed writer's pid is not ours)."""
    from splitfed import jsonio

    assert jsonio.is_draft(name) is draft
    assert jsonio.is_draft(jsonio.draft_of(f"/x/{name}").name)


@pytest.mark.parametrize(("returned", "code"), [(None, 0), (0, 0), (1, 1), (3, 3)])
def test_a_scripts_exit_code_is_what_its_body_returns(returned: int | None, code: int) -> None:
    """A benchmark's body returns its exit code (the simulation benchmark 1 when a size failed), and None is 0: a
    mutant that read ``body() and 0`` exited 0 after a failed benchmark."""
    assert script("bench", lambda: returned) == code
