"""A walk through the README and the benchmarks as a new user: what it found wrong in the benchmarks.

Every benchmark wrote its JSON only once it had measured everything, to whatever ``--out`` named: an
``--out`` naming a folder (``--out benchmarks/results``) or a path under a file measured for minutes and
then died with a traceback (IsADirectoryError, FileExistsError), its numbers lost. Now such an ``--out``
is refused in one line, exit 2, before anything is measured.

``engine.py`` and ``weights.py`` took ``--model module:factory`` and answered "give --input-shape", a flag
neither has (and a misspelt zoo name was told to try 'module.path:factory'): they take zoo models only, and
say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_benchmark_input import run_benchmark

ROOT = Path(__file__).resolve().parents[1]

# each at its smallest size, so that before the fix the test failed in seconds to a minute, not an hour
QUICK = {
    "engine": ["--model", "cnn", "--batch", "2", "--cuts", "2,4", "--reps", "1", "--steps", "1"],
    "weights": ["--model", "cnn", "--clients", "2", "--reps", "1"],
    "transport": ["--skip-a", "--reps-b", "1"],
    "optimizer": ["--no-scaling", "--sweep", ""],
    "simulation": ["--clients", "1", "--rounds", "1"],
}


def refused(name: str, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """The script's ``main`` in this process (a refusal is its words and files; each script's own process is
    run by test_benchmark_input's test_a_bad_flag_is_refused_before_torch_is_imported and the reader-gone tests
    below)."""
    code, stdout, stderr = run_benchmark(name, [*QUICK[name], "--out", str(out)], monkeypatch, capsys)
    assert code == 2, stdout[-1000:] + stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"benchmarks/{name}.py: error: argument --out: "), stderr[-2000:]
    assert stdout == ""
    return lines[0]


@pytest.mark.parametrize("name", sorted(QUICK))
def test_an_out_that_is_a_folder_is_refused_before_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str], name: str) -> None:
    line = refused(name, tmp_path, monkeypatch, capsys)
    assert f"{tmp_path} is a folder" in line and str(tmp_path / f"{name}.json") in line
    assert list(tmp_path.iterdir()) == []  # nothing written there, not even a temporary file


@pytest.mark.parametrize("name", sorted(QUICK))
def test_an_out_under_a_file_is_refused_before_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], name: str) -> None:
    (tmp_path / "old.json").write_text("{}")
    line = refused(name, tmp_path / "old.json" / "new.json", monkeypatch, capsys)
    assert f"{tmp_path / 'old.json'} is not a folder" in line
    assert (tmp_path / "old.json").read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["old.json"]


@pytest.mark.parametrize("name", ["engine", "weights"])
@pytest.mark.parametrize("model", ["mymodels:make_net", "vgg12"])
def test_a_model_the_benchmark_cannot_build_names_the_ones_it_can(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str], name: str,
                                                                 model: str) -> None:
    """In this process, as :func:`refused`."""
    code, stdout, stderr = run_benchmark(name, ["--model", model, "--out", str(tmp_path / "x.json")], monkeypatch,
                                         capsys)
    assert code == 2 and stdout == "", stderr[-2000:]
    (line,) = stderr.strip().splitlines()
    assert line.startswith(f"benchmarks/{name}.py: error: argument --model: unknown model {model!r}: ")
    assert "--input-shape" not in line and "module.path:factory" not in line
    assert "cnn, mlp, mobilenetv2, resnet18, transformer, vgg11" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("unbuffered", "name"), [(True, "engine"), (False, "weights")])
def test_a_benchmark_whose_reader_closes_early_ends_quietly(tmp_path: Path, unbuffered: bool, name: str) -> None:
    """``benchmarks/weights.py ... | head -1``: before, a BrokenPipeError traceback and rc 1 (or, buffered,
    a message at the interpreter's exit and rc 120); now the quiet 141 of a splitfed command. Unbuffered, on
    engine.py (cnn, in process): weights.py starts two tier processes before its first line, seconds for each
    case, and both scripts end through the same ``splitfed.cli.script``; weights.py, whose first line is
    written with its tiers running, is the buffered case."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    out = tmp_path / "o.json"
    try:
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *QUICK[name], "--out", str(out)],
                           stdout=write, stderr=subprocess.PIPE, text=True, timeout=600, env=env, cwd=ROOT)
    finally:
        os.close(write)
    assert (p.returncode, p.stderr) == (141, ""), p.stderr[-2000:]


def test_resume_refuses_the_results_of_another_experiment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m simulations.drift --out DIR --resume`` where DIR holds static_vs_adaptive's results: before,
    drift trained beside them and replaced their results.json; now refused before anything trains."""
    import json

    from simulations import drift
    from simulations.common import RESULTS, RUNS

    out = tmp_path / "exp"
    (out / RUNS).mkdir(parents=True)
    (out / RESULTS).write_text(json.dumps({"experiment": "static_vs_adaptive"}))
    assert drift.cli(["--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "holds the results of experiment 'static_vs_adaptive', not 'drift'" in err
    assert json.loads((out / RESULTS).read_text()) == {"experiment": "static_vs_adaptive"}
    assert sorted(p.name for p in (out / RUNS).iterdir()) == []


def test_resume_refuses_the_runs_of_another_experiment_stopped_part_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An experiment stopped part way has runs and no results.json yet: its runs are marked with its name as
    its first run starts, so another experiment's --resume is refused there too, and its own goes on."""
    import json

    import simulations.common as common
    from simulations import static_vs_adaptive, variants
    from simulations.common import MARK, RESULTS, RUNS

    out = tmp_path / "exp"
    cfg = ROOT / "simulations" / "configs" / "variants.tiny.toml"

    real = common._train_checked
    calls = []

    def stop_after_the_first(*a, **k):  # type: ignore[no-untyped-def]
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(common, "_train_checked", stop_after_the_first)
    try:
        assert variants.cli(["--config", str(cfg), "--out", str(out)]) == 130
    finally:
        mp.undo()
    assert not (out / RESULTS).exists() and json.loads((out / RUNS / MARK).read_text()) == {"experiment": "variants"}
    capsys.readouterr()
    assert static_vs_adaptive.cli(["--out", str(out), "--resume"]) == 2
    assert "holds the results of experiment 'variants', not 'static_vs_adaptive'" in capsys.readouterr().err
    assert variants.cli(["--config", str(cfg), "--out", str(out), "--resume"]) == 0
    assert json.loads((out / RESULTS).read_text())["experiment"] == "variants"
