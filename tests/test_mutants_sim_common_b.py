"""What ``simulations/common.py`` promises from ``best_static_cuts`` on that the mutation run found unpinned.

- ``static:best`` resolves for a one-client fleet too (the best single cut vector is the first client's);
- :func:`check_cases` checks each case as a fresh run (an in-process case is no refused resume);
- :func:`report_runs` titles ``summary.md`` with the title given ("results" without one) and flushes the table
  it prints; :func:`run_record` counts the run's simulated time at its last round and its mean round time;
- :func:`main`: the default ``--out`` is ``runs/simulations/NAME``; ``elapsed_s`` is the experiment's own
  time; its first line is flushed before the experiment starts (a piped stdout without ``reconfigure``); a
  stopped experiment's line says where its runs are, or that it keeps none (Ctrl-C 130, SIGTERM 143);
- :func:`_experiment_of` reads the experiment's name, ``""`` where none can be read, and ``--resume`` refuses
  another experiment's runs naming it;
- :func:`output_folder`: ``--resume`` and ``--overwrite`` leave the figures beside the results as they were
  when the experiment fails before writing anything (the experiment folder is no run folder to tidy), and the
  results ``--overwrite`` replaced are not put back once the new experiment has written something.

Experiments here are tiny functions of the test's own with a dataclass config read from a TOML file in
``tmp_path``; runs for the report are built in memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from simulations import common
from splitfed.errors import ConfigError, Terminated
from splitfed.report.runs import RoundRow, Run
from tests.test_mutants_sim_common import BlockBuffered  # a stdout passing on only what was flushed

NAME = "toy"


@dataclasses.dataclass(frozen=True)
class Toy:
    n: int = 1


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    """main() sets torch's threads (``_threads``): put them back for the tests after these."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    p = tmp_path / "toy.toml"
    p.write_text("n = 2\n")
    return p


def main(cfg: Path, experiment: Any, *args: str) -> int:
    return common.main(NAME, Toy, experiment, ["--config", str(cfg), *args])


def writes_summary(c: Toy, out: Path) -> dict[str, Any]:
    (out / "summary.md").write_text("# new\n")
    return {"n": c.n}


def run(label: str, seconds: tuple[float, ...], accuracy: tuple[float, ...]) -> Run:
    return Run(label, tuple(RoundRow(i + 1, a, s, bytes_up=10, bytes_down=20)
                            for i, (s, a) in enumerate(zip(seconds, accuracy, strict=True))))


# ---------------------------------------------------------------- static:best, check_cases


def test_best_static_resolves_for_a_single_client() -> None:
    """The vector is read off the first client (the only one here): one client is a fleet too."""
    s = common.base_settings({"clients": 1, "rounds": 1, "model": "cnn", "dataset": "digits",
                              "partition": "iid", "seed": 0})
    cuts = common.best_static_cuts(s)
    assert len(cuts) == 2 and all(isinstance(c, int) for c in cuts)
    text = ",".join(map(str, cuts))
    assert common.resolve_policy("static:best", s) == (f"best static ({text})", f"static:{text}")


def test_an_in_process_case_is_checked_as_a_fresh_run() -> None:
    """check_cases checks each case as train() runs it (no resume): the in-process backend, which refuses a
    resume, accepts it; the case's own folder keys play no part."""
    s = common.base_settings({"clients": 2, "rounds": 1, "model": "cnn", "dataset": "digits",
                              "partition": "iid", "cuts": "static:2,5", "seed": 0})
    common.check_cases([("a", s), ("b", s.with_(resume=True, out="x"))], "inprocess")


# ---------------------------------------------------------------- report_runs, run_record


def test_report_runs_titles_its_summary_and_flushes_its_table(tmp_path: Path, monkeypatch) -> None:
    """The title given heads summary.md ("results" without one); the table printed is out at once."""
    runs = [run("a", (1.0, 2.0), (0.5, 0.75)), run("b", (3.0, 1.0), (0.25, 0.5))]
    stdout = BlockBuffered()
    monkeypatch.setattr("sys.stdout", stdout)
    images = common.report_runs(runs, tmp_path / "titled", 0.7, title="my sweep")
    assert stdout.pending == "" and "a" in stdout.flushed and "b" in stdout.flushed
    assert images and all(Path(p).is_file() for p in images.values())
    assert (tmp_path / "titled" / "summary.md").read_text().startswith("# my sweep\n")
    common.report_runs(runs, tmp_path / "plain")
    assert (tmp_path / "plain" / "summary.md").read_text().startswith("# results\n")


def test_run_record_counts_the_time_at_the_last_round_and_its_mean() -> None:
    """sim_time_s is the simulated time after the last round (not the first), mean_round_s that over the rounds."""
    rec = common.run_record(run("a", (1.5, 2.5, 4.0), (0.25, 0.5, 0.75)), target=0.5)
    assert rec["sim_time_s"] == 8.0 and rec["mean_round_s"] == 8.0 / 3
    assert rec["rounds"] == 3 and rec["bytes_up"] == 30 and rec["bytes_down"] == 60
    assert rec["time_to_target_s"] == 4.0 and rec["rounds_to_target"] == 2
    assert rec["accuracy"] == [0.25, 0.5, 0.75] and rec["sim_round_s"] == [1.5, 2.5, 4.0]


# ---------------------------------------------------------------- main(): its folder, its time, its lines


def test_the_default_out_is_runs_simulations_name(tmp_path: Path, cfg: Path, monkeypatch, capsys) -> None:
    """Without --out the experiment writes into runs/simulations/NAME under the working folder."""
    monkeypatch.chdir(tmp_path)
    seen: list[Path] = []

    def experiment(c: Toy, out: Path) -> dict[str, Any]:
        seen.append(out)
        return {"n": c.n}

    assert main(cfg, experiment) == 0
    assert seen == [Path("runs") / "simulations" / NAME]
    results = json.loads((tmp_path / "runs" / "simulations" / NAME / "results.json").read_text())
    assert results["experiment"] == NAME and results["config"] == {"n": 2} and results["n"] == 2
    assert f"results in {tmp_path / 'runs' / 'simulations' / NAME}" in capsys.readouterr().out


def test_elapsed_s_is_the_time_the_experiment_took(tmp_path: Path, cfg: Path, monkeypatch, capsys) -> None:
    """The clock read after the experiment, less the one before it."""
    ticks = iter([100.0, 102.5])
    monkeypatch.setattr(common, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    out = tmp_path / "out"
    assert main(cfg, writes_summary, "--out", str(out)) == 0
    assert json.loads((out / "results.json").read_text())["elapsed_s"] == 2.5


def test_the_first_line_is_out_before_the_experiment_starts(tmp_path: Path, cfg: Path, monkeypatch) -> None:
    """A stdout that cannot be made line-buffered (no ``reconfigure``) still shows the line at once."""
    stdout = BlockBuffered()
    monkeypatch.setattr("sys.stdout", stdout)
    out = tmp_path / "out"
    at_start: list[str] = []

    def experiment(c: Toy, o: Path) -> dict[str, Any]:
        at_start.append(stdout.flushed)
        return {}

    assert main(cfg, experiment, "--out", str(out)) == 0
    assert at_start == [f"{NAME}: config {cfg}; writing to {out}\n"]


@pytest.mark.parametrize(("stop", "code", "said"), [(KeyboardInterrupt, 130, "interrupted"),
                                                    (Terminated, 143, "terminated"),
                                                    ("sigterm", 143, "terminated")])
def test_a_stopped_experiment_says_where_its_runs_are(tmp_path: Path, cfg: Path, capsys, stop, code,
                                                      said) -> None:
    """With runs: where they are and how to continue; without: that there is nothing to continue from."""
    def experiment(c: Toy, out: Path) -> dict[str, Any]:
        if c.n == 2:
            (out / "runs" / "a").mkdir(parents=True)
        if stop == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # main's handler raises Terminated here (this is the main thread)
            raise AssertionError("the SIGTERM reached no handler")
        raise stop()

    out = tmp_path / "out"
    assert main(cfg, experiment, "--out", str(out)) == code
    assert capsys.readouterr().err == (f"simulations.{NAME}: {said}; the runs that ended are in {out / 'runs'}, "
                                       "without results.json; to continue: the same command with --resume\n")
    cfg.write_text("n = 1\n")
    empty = tmp_path / "empty"
    assert main(cfg, experiment, "--out", str(empty)) == code
    assert capsys.readouterr().err == (f"simulations.{NAME}: {said}; it keeps no runs to continue from "
                                       "(results.json comes at the end); to start again: the same command\n")


# ---------------------------------------------------------------- whose results: _experiment_of, --resume


def test_experiment_of_reads_the_name_or_says_none(tmp_path: Path) -> None:
    """A name read from the file; "" (a string, as the type says) for a missing, broken or nameless file."""
    p = tmp_path / "results.json"
    assert common._experiment_of(p) == "" and isinstance(common._experiment_of(p), str)
    p.write_text("{broken")
    assert common._experiment_of(p) == ""
    p.write_text('{"experiment": 3}')
    assert common._experiment_of(p) == ""
    p.write_text('{"experiment": "drift"}')
    assert common._experiment_of(p) == "drift"


def test_resume_refuses_another_experiments_runs_naming_it(tmp_path: Path, cfg: Path, capsys) -> None:
    """The mark beside the runs names the experiment: the wrong script's --resume is refused (exit 2)."""
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / common.MARK).write_text('{"experiment": "drift"}')
    assert main(cfg, writes_summary, "--out", str(out), "--resume") == 2
    err = capsys.readouterr().err
    assert f"holds the results of experiment 'drift', not '{NAME}'" in err, err
    assert not (out / "summary.md").exists()
    (out / "runs" / common.MARK).write_text(json.dumps({"experiment": NAME}))
    assert main(cfg, writes_summary, "--out", str(out), "--resume") == 0


# ---------------------------------------------------------------- output_folder: figures and replaced results


def refused(c: Toy, out: Path) -> dict[str, Any]:
    raise ConfigError("its last policy is a typo")


def test_a_refused_resume_leaves_the_figures_there(tmp_path: Path, cfg: Path, capsys) -> None:
    """The experiment folder is held, not replaced: a standard figure beside the runs stays."""
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "makespan.png").write_bytes(b"png")
    assert main(cfg, refused, "--out", str(out), "--resume") == 2
    assert "its last policy is a typo" in capsys.readouterr().err
    assert (out / "makespan.png").read_bytes() == b"png" and (out / "runs").is_dir()
    assert sorted(p.name for p in out.iterdir()) == ["makespan.png", "runs"]


def test_a_refused_overwrite_puts_back_the_results_and_their_figures(tmp_path: Path, cfg: Path, capsys) -> None:
    """Nothing written: everything replaced is as it was, the figures too."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"experiment": "toy", "old": 1}')
    (out / "makespan.png").write_bytes(b"png")
    (out / "summary.md").write_text("# old\n")
    assert main(cfg, refused, "--out", str(out), "--overwrite") == 2
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["makespan.png", "results.json", "summary.md"]
    assert (out / "makespan.png").read_bytes() == b"png" and (out / "summary.md").read_text() == "# old\n"


def test_replaced_results_are_not_put_back_once_the_new_experiment_wrote(tmp_path: Path, cfg: Path, capsys) -> None:
    """A failure after the new experiment wrote something leaves what it wrote, never the old results beside it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"experiment": "toy", "old": 1}')

    def fails_late(c: Toy, o: Path) -> dict[str, Any]:
        writes_summary(c, o)
        raise ConfigError("failed after writing")

    assert main(cfg, fails_late, "--out", str(out), "--overwrite") == 2
    assert "failed after writing" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["summary.md"]
    assert (out / "summary.md").read_text() == "# new\n"
