"""What a newcomer following the README tripped on: the Makefile's Python, the default cuts of a small model,
simulate's --model help, the engine benchmark's cuts, and the optimizer benchmark's silence.

- ``make run`` built ``.venv`` with whatever ``python3`` was (3.12 on many machines: pip then refused the
  package, ``requires-python`` 3.11), and ``make run PYTHON=python3.11`` afterwards changed nothing: the 3.12
  ``.venv`` stayed. Now python3.11 is taken where one runs, and a ``.venv`` (or a PYTHON) of another version is
  refused in one line saying what to do. The Makefile runs here against fake interpreters (shell scripts that
  print a version and log their calls): no venv is built and nothing is installed.
- ``splitfed simulate --model pkg:factory`` of a 4-block model, no --cuts: "cut 5 is out of range" for cuts the
  user never gave.
- ``benchmarks/engine.py --model cnn``: "cut 10 is out of range: cnn has 7 blocks" (vgg11's 4,10 for any model).
- ``benchmarks/optimizer.py`` printed nothing for its 16 cases' minutes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from splitfed.errors import CutError
from tests.bench_fixtures import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")


def _load(name: str) -> ModuleType:
    """A benchmark under a name of its own (``optimizer`` is also splitfed's package)."""
    return load_benchmark(name, f"newcomer_bench_{name}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- 1. the Makefile's Python


def _fake_python(path: Path, version: str | None, log: Path) -> Path:
    """An interpreter answering ``-c`` (the Makefile's version query) with ``version`` (None: it does not run,
    as a pyenv shim of a version not selected) and logging every other call; ``-m venv DIR`` makes
    ``DIR/bin/python`` a copy of itself, as a venv's python is the interpreter that built it."""
    if version is None:
        body = 'echo "pyenv: $(basename "$0"): command not found" >&2\nexit 127\n'
    else:
        body = (f'[ "$1" = -c ] && {{ echo {version}; exit 0; }}\necho "$0 $*" >> {log}\n'
                '[ "$1 $2" = "-m venv" ] && mkdir -p "$3/bin" && cp "$0" "$3/bin/python"\nexit 0\n')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _checkout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A folder for ``make install`` (pyproject.toml is its prerequisite), a PATH of its own holding only the
    tools the recipe and the fakes run (no python of this machine), and the fakes' log."""
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("")
    bin_dir.mkdir()
    for tool in ("touch", "mkdir", "cp", "basename"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    return repo, bin_dir, tmp_path / "calls.log"


def _make_install(repo: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert MAKE is not None
    # nothing of a make this suite may run under (MAKEFLAGS carries its command line's PYTHON=...)
    env = {"PATH": str(bin_dir), "HOME": str(repo)}
    return subprocess.run([MAKE, "-f", str(ROOT / "Makefile"), "install", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _installed(python: str) -> list[str]:
    """The calls ``make install`` makes once ``.venv`` is built: pip, torch, the package, the gRPC code, the
    sources' bytecode."""
    return [f"{python} -m venv .venv"] * (python != "") + [
        ".venv/bin/python -m pip install -q --upgrade pip", ".venv/bin/python -m pip install -q torch==2.13.0",
        ".venv/bin/python -m pip install -q -e .[dev]", ".venv/bin/python -m splitfed.transport.protogen",
        ".venv/bin/python -m compileall -q splitfed server clients simulations benchmarks"]


needs_make = pytest.mark.skipif(MAKE is None, reason="no make on this machine")


def test_the_makefiles_python_version_is_pyprojects() -> None:
    """The Makefile's check and pyproject.toml's requires-python name one version."""
    version = re.search(r"^PYTHON_VERSION := (3\.\d+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version is not None
    minor = int(version.group(1).split(".")[1])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">=3.{minor},<3.{minor + 1}"


@needs_make
def test_make_install_builds_the_venv_with_python3_11_where_python3_is_another(tmp_path: Path) -> None:
    """Before: python3 (3.12 here) built .venv, and pip failed on it."""
    repo, bin_dir, log = _checkout(tmp_path)
    _fake_python(bin_dir / "python3", "3.12", log)
    _fake_python(bin_dir / "python3.11", "3.11", log)
    p = _make_install(repo, bin_dir)
    assert p.returncode == 0, p.stderr
    assert _calls(log) == _installed(f"{bin_dir}/python3.11")
    assert (repo / ".venv" / ".installed").is_file()


@needs_make
@pytest.mark.parametrize("python311", ["absent", "a shim that does not run"])
def test_make_install_takes_python3_where_no_python3_11_runs(tmp_path: Path, python311: str) -> None:
    """CI's case (python3 is 3.11), as before; a pyenv shim named python3.11 that does not run is passed over."""
    repo, bin_dir, log = _checkout(tmp_path)
    _fake_python(bin_dir / "python3", "3.11", log)
    if python311 != "absent":
        _fake_python(bin_dir / "python3.11", None, log)
    p = _make_install(repo, bin_dir)
    assert p.returncode == 0, p.stderr
    assert _calls(log) == _installed(f"{bin_dir}/python3")


@needs_make
def test_make_install_takes_the_python_given(tmp_path: Path) -> None:
    repo, bin_dir, log = _checkout(tmp_path)
    _fake_python(bin_dir / "python3.11", "3.11", log)
    mine = _fake_python(tmp_path / "opt" / "python", "3.11", log)
    p = _make_install(repo, bin_dir, f"PYTHON={mine}")
    assert p.returncode == 0, p.stderr
    assert _calls(log) == _installed(str(mine))


@needs_make
def test_make_install_installs_into_a_venv_of_python_3_11_without_rebuilding_it(tmp_path: Path) -> None:
    repo, bin_dir, log = _checkout(tmp_path)
    _fake_python(repo / ".venv" / "bin" / "python", "3.11", log)
    p = _make_install(repo, bin_dir)
    assert p.returncode == 0, p.stderr
    assert _calls(log) == _installed("")


@needs_make
@pytest.mark.parametrize("args", [(), ("PYTHON=python3.11",)])
def test_make_install_refuses_a_venv_of_another_python_and_keeps_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Before: pip ran in the 3.12 .venv (and failed on requires-python), PYTHON=python3.11 given afterwards
    too: the .venv was there, so it was never rebuilt."""
    repo, bin_dir, log = _checkout(tmp_path)
    _fake_python(bin_dir / "python3.11", "3.11", log)
    venv_python = _fake_python(repo / ".venv" / "bin" / "python", "3.12", log)
    p = _make_install(repo, bin_dir, *args)
    assert p.returncode == 2
    assert p.stderr.splitlines()[0] == ("splitfed needs Python 3.11 (pyproject.toml), and .venv/bin/python is "
                                        "Python 3.12: rm -rf .venv, then make install PYTHON=python3.11")
    assert _calls(log) == [] and venv_python.is_file() and not (repo / ".venv" / ".installed").exists()


@needs_make
@pytest.mark.parametrize(("version", "is_"), [("3.12", "Python 3.12"), (None, "not a Python that runs")])
def test_make_install_refuses_a_python_of_another_version_before_building_the_venv(
        tmp_path: Path, version: str | None, is_: str) -> None:
    repo, bin_dir, log = _checkout(tmp_path)
    other = _fake_python(bin_dir / "python3.12", version, log)
    p = _make_install(repo, bin_dir, f"PYTHON={other}")
    assert p.returncode == 2
    assert p.stderr.splitlines()[0] == (f"splitfed needs Python 3.11 (pyproject.toml), and PYTHON={other} is "
                                        f"{is_}: give make install PYTHON=python3.11 (or the path of a Python 3.11)")
    assert _calls(log) == [] and not (repo / ".venv").exists()


# ---------------------------------------------------------------- 2. the default cuts of a small model

FOUR_BLOCKS = """import torch.nn as nn


def make():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
"""


@pytest.fixture
def four_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "newcomer_four_blocks.py").write_text(FOUR_BLOCKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "newcomer_four_blocks:make"


def test_simulate_without_cuts_says_the_default_does_not_fit_and_what_to_give(
        four_blocks: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the line ended at "cuts lie in 0..4", about cuts the user never gave."""
    from splitfed.cli import main

    assert main(["simulate", "--model", four_blocks, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"splitfed simulate: error: cuts 'static:2,5': cut 5 is out of range: {four_blocks} has 4 blocks, cuts lie "
        "in 0..4 (static:2,5 is the default when no cuts are given): give --cuts (a config file's cuts) within "
        "0..4, or adaptive"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("changes", "words"), [
    ({"cuts": "static:1,7"}, "cuts 'static:1,7': cut 7 is out of range: {m} has 4 blocks, cuts lie in 0..4"),
    ({"tiers": 2, "cuts": "static:5"}, "cuts 'static:5': cut 5 is out of range: {m} has 4 blocks, cuts lie in 0..4"),
    ({"tiers": 2, "cuts": "static:2"}, None),  # the 2-tier default fits
])
def test_cuts_other_than_the_default_are_refused_as_before(four_blocks: str, changes: dict[str, Any],
                                                          words: str | None) -> None:
    from splitfed.flower.config import RunSettings
    from splitfed.sim.runner import validate

    settings = RunSettings(model=four_blocks, clients=2, rounds=1, **changes)
    if words is None:
        validate(settings)
        return
    with pytest.raises(CutError) as e:
        validate(settings)
    assert str(e.value) == words.format(m=four_blocks)


# ---------------------------------------------------------------- 3. simulate's --model help


def test_simulate_help_says_model_takes_a_factory_too(capsys: pytest.CaptureFixture[str]) -> None:
    from splitfed.cli import main

    with pytest.raises(SystemExit) as e:
        main(["simulate", "--help"])
    assert e.value.code == 0
    assert ("--model MODEL zoo name (mlp, cnn, vgg11, resnet18, mobilenetv2, transformer) or module.path:factory "
            "(default cnn)") in _one_line(capsys.readouterr().out)


# ---------------------------------------------------------------- 4. the engine benchmark's cuts


@pytest.mark.parametrize(("model", "cuts"), [("vgg11", (4, 10)), ("cnn", (2, 5)), ("mlp", (2, 3)),
                                             ("resnet18", (4, 7)), ("mobilenetv2", (16, 31)),
                                             ("transformer", (2, 4))])
def test_the_engine_benchmarks_default_cuts_fit_every_zoo_model(model: str, cuts: tuple[int, int]) -> None:
    """vgg11 keeps the recorded runs' 4,10; another model's blocks are split in thirds."""
    from splitfed.engine import template
    from splitfed.models.segment import validate_cuts
    from splitfed.models.zoo import resolve_spec

    n = template.num_blocks(resolve_spec(model))
    assert _load("engine").default_cuts(model, n) == cuts
    assert validate_cuts(cuts, n, tiers=3, model=model) == cuts


def test_the_engine_benchmark_on_cnn_without_cuts_runs_and_records_them(tmp_path: Path) -> None:
    """Before: "cut 10 is out of range: cnn has 7 blocks" (exit 2)."""
    import torch

    threads = torch.get_num_threads()
    try:  # the benchmark computes with one thread: the rest of the suite's process keeps its own
        assert _load("engine").main(["--model", "cnn", "--batch", "2", "--reps", "1", "--steps", "1",
                                     "--out", str(tmp_path / "engine.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads((tmp_path / "engine.json").read_text())
    assert res["cuts"] == [2, 5] and res["args"]["cuts"] == [2, 5] and res["blocks"] == 7


@pytest.mark.parametrize(("name", "shown"), [
    ("engine", ["--model MODEL a zoo model (default vgg11)", "--batch BATCH samples per step (default 64)",
                "--cuts CUTS device | edge | cloud cut points (default 4,10 on vgg11, another model's blocks in "
                "thirds: 2,5 on cnn)", "--reps REPS alternating rounds (default 5)",
                "--steps STEPS steps per round and side (default 3)",
                "on this device (e.g. cuda; default cpu: no third side)",
                "--out OUT the JSON written (default benchmarks/results/engine.json)"]),
    ("optimizer", ["--mode {sl,sflv1,sflv2} the split mode priced (default sflv1)",
                   "--compress CODEC compression of boundary tensors: none|fp16|int8|topk:F (default none)",
                   "--sweep SWEEP fleet sizes of the contention sweep (comma-separated; empty: none; default "
                   "60,125,250,500,1000,2000,5000)",
                   "--out OUT the JSON written (default benchmarks/results/optimizer.json)"]),
])
def test_a_benchmarks_help_shows_each_flags_default(name: str, shown: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _load(name).main(["--help"])
    assert e.value.code == 0
    out = _one_line(capsys.readouterr().out)
    assert [s for s in shown if s not in out] == []


# ---------------------------------------------------------------- 5. the optimizer benchmark's progress


def test_the_optimizer_benchmark_says_each_case_on_stderr_as_it_is_priced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: nothing for minutes, then the tables. Pricing the 16 cases takes those minutes (10,000 clients'
    solves, the models' profiles): here a synthetic profile and a canned price, which write a line of their own,
    show that each case's line comes as soon as it is priced, and stdout's tables stay as they were."""
    import torch

    import splitfed.profile.profiler as profiler
    from splitfed.profile import ModelProfile
    from splitfed.profile.fleet import load_fleet

    bench = _load("optimizer")
    profile = ModelProfile.synthetic([1e7, 2e7, 4e7], [4e4, 2e4, 1e4], [1e3, 1e3, 1e3], input_bytes=3e4)
    monkeypatch.setattr(profiler, "profile_model", lambda *a, **k: profile)

    def priced(sc: Any) -> dict[str, Any]:
        print(f"priced {len(sc.clients)} clients", file=sys.stderr)
        return {"optimizer": {"makespan_s": 2.0, "explanation": "canned"},
                "best_static": {"makespan_s": 3.0, "feasible": True, "ratio_vs_optimizer": 1.5},
                "greedy": {"makespan_s": None}, "all_on_server": {"makespan_s": None},
                "targets": {"vs_best_static": True, "not_slower_than_greedy": None}}

    monkeypatch.setattr(bench, "policies", priced)
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--no-scaling", "--sweep", "", "--out", str(tmp_path / "optimizer.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 32, lines
    cases = [re.fullmatch(r"case (\d+)/16: (\w+) (.+)/(\w+): optimizer 2\.00 s \(took \d+\.\d s\)", line)
             for line in lines[1::2]]
    assert all(cases), lines
    without = cases[6].group(3)  # type: ignore[union-attr]  # the fleet without its straggler class
    assert without.startswith("reference w/o ")
    fleets = [f for f in ("reference", "reference x1000", "reference x10000", without) for _ in range(2)]
    assert [c.groups() for c in cases] == [  # type: ignore[union-attr]
        (str(i + 1), model, fleet, setting) for i, (model, (fleet, setting)) in enumerate(
            (m, fs) for m in ("vgg11", "resnet18") for fs in zip(fleets, ["any_cut", "data_stays"] * 4, strict=True))]
    rest = sum(c.kind != without.removeprefix("reference w/o ") for c in load_fleet("reference").clients)
    clients = [n for n in (60, 1000, 10000, rest) for _ in range(2)] * 2
    assert lines[0::2] == [f"priced {n} clients" for n in clients]  # each case's line right after its pricing
    assert out.startswith("makespan s per round, sflv1, codec none, 3 tiers, batch 32;") and "case " not in out
    assert (tmp_path / "optimizer.json").is_file()
