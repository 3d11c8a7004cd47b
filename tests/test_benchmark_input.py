"""A benchmark refuses a bad flag in one line, exit 2, before it measures or writes anything.

Before, each of these cases was a traceback (ZeroDivisionError, StatisticsError,
ValueError, a tier's InvalidArgument), `simulation.py --rounds 0` wrote its JSON and
exited 0, and `simulation.py --clients 0` started the whole default benchmark again
in its child (``--one 0`` read as "no --one").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_fixtures import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
_LOADED: dict[str, ModuleType] = {}


def run_benchmark(name: str, args: list[str], monkeypatch: pytest.MonkeyPatch,
                  capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``python benchmarks/NAME.py ARGS`` in this process (its ``main`` as the script runs it, from sys.argv):
    its exit code, stdout and stderr. A refusal is about the words and the files, not the process; each
    script's own process is run by :func:`test_a_bad_flag_is_refused_before_torch_is_imported` (and
    test_walkthrough_review's reader-gone tests), which a refusal there passes through the same ``main``."""
    if name not in _LOADED:
        _LOADED[name] = load_benchmark(name)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / f"{name}.py"), *args])
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    try:
        code = _LOADED[name].main()
    except SystemExit as e:  # argparse's refusal
        code = e.code
    out, err = capsys.readouterr()
    assert isinstance(code, int)
    return code, out, err

CASES = [
    ("engine", ["--batch", "0"], "argument --batch: expected an integer in 1..1,048,576, got 0"),
    ("engine", ["--steps", "0"], "argument --steps: expected a positive integer, got 0"),
    ("engine", ["--reps", "-1"], "argument --reps: expected a positive integer, got -1"),
    ("engine", ["--cuts", "junk"], "argument --cuts: expected comma-separated integers, got 'junk'"),
    ("engine", ["--cuts", "5,2"], "argument --cuts: cuts must be non-decreasing, got 5,2"),
    ("engine", ["--cuts=-1,4"], "argument --cuts: cut -1 is out of range: a cut counts the blocks before it"),
    ("engine", ["--model", "cnn", "--cuts", "2,99"], "cut 99 is out of range: cnn has"),
    ("engine", ["--model", "nope"], "argument --model: unknown model 'nope': this benchmark takes a zoo model: cnn, "),
    ("engine", ["--model", "pkg.mod:factory"],
     "argument --model: unknown model 'pkg.mod:factory': this benchmark takes a zoo model (a module:factory model "
     "needs an input shape it has no flag for)"),
    ("optimizer", ["--codec", "junk"], "argument --codec: unknown codec 'junk'"),
    ("optimizer", ["--sweep", "60,x"], "argument --sweep: expected comma-separated integers, got '60,x'"),
    ("optimizer", ["--sweep", "0"], "argument --sweep: fleet sizes must lie in 1..100,000, got '0'"),
    ("optimizer", ["--sampled", "1000,200000"],
     "argument --sampled: fleet sizes must lie in 1..100,000, got '1000,200000'"),
    ("simulation", ["--clients", "0"], "clients must be >= 1, got 0"),
    ("simulation", ["--clients", "2,-1"], "clients must be >= 1, got -1"),
    ("simulation", ["--rounds", "0"], "argument --rounds: expected a positive integer, got 0"),
    ("weights", ["--clients", "0"], "argument --clients: expected a positive integer, got 0"),
    ("weights", ["--model", "nope"], "argument --model: unknown model 'nope': this benchmark takes a zoo model: cnn, "),
    ("startup", ["--reps", "0"], "argument --reps: expected a positive integer, got 0"),
    ("startup", ["--model", "vgg"], "argument --model: unknown model 'vgg': this benchmark takes a zoo model: cnn, "),
    ("transport", ["--batch", "0", "--skip-a"], "argument --batch: expected an integer in 1..1,048,576, got 0"),
    ("transport", ["--reps-b", "0", "--skip-a"], "argument --reps-b: expected a positive integer, got 0"),
]


@pytest.mark.parametrize(("name", "args", "message"), CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_flag_is_one_line_and_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], name: str,
                                                       args: list[str], message: str) -> None:
    """In this process (:func:`run_benchmark`): the refusal is the script's ``main``'s; a process per case
    cost ~3 s of imports each. Each script refuses a flag in a process of its own in
    :func:`test_a_bad_flag_is_refused_before_torch_is_imported`."""
    out = tmp_path / "result.json"
    code, stdout, stderr = run_benchmark(name, [*args, "--out", str(out)], monkeypatch, capsys)
    assert code == 2, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"benchmarks/{name}.py: error: "), stderr[-2000:]
    assert message in lines[0]
    assert stdout == "" and not out.exists() and not list(tmp_path.iterdir())


def test_the_accuracy_check_writes_the_file_out_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--accuracy wrote accuracy.json beside the file --out named, whatever its name (over one there)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import simulation  # type: ignore[import-not-found]

    written: list[Path] = []
    monkeypatch.setattr(simulation, "accuracy", written.append)  # the check itself takes minutes
    assert simulation.main(["--accuracy", "--out", str(tmp_path / "mine.json")]) == 0
    assert simulation.main(["--accuracy"]) == 0
    assert written == [tmp_path / "mine.json", ROOT / "benchmarks" / "results" / "accuracy.json"]


# engine's and weights' --model and engine's --cuts syntax: checked against the zoo's names and the rules of every
# cut vector before torch is imported, where they were checked after (a module of the zoo, the model's blocks)
FAST = [("engine", ["--model", "nope"]), ("engine", ["--cuts", "5,2"]), ("optimizer", ["--sweep", "0"]),
        ("simulation", ["--rounds", "0"]), ("transport", ["--reps-b", "0", "--skip-a"]), ("weights", ["--model", "nope"]),
        ("startup", ["--model", "nope"])]


def test_the_model_names_known_before_torch_are_the_zoos() -> None:
    """Each name the zoo has, and only those (the benchmarks' --model is checked against them before torch is
    imported): a model added to the zoo and not to the list would be refused."""
    from splitfed.models.zoo import ZOO
    from splitfed.zoo_names import ZOO_NAMES

    assert sorted(ZOO_NAMES) == sorted(ZOO)


@pytest.mark.parametrize(("name", "args"), FAST, ids=[f"{n} {' '.join(a)}" for n, a in FAST])
def test_a_bad_flag_is_refused_before_torch_is_imported(tmp_path: Path, name: str, args: list[str]) -> None:
    """Before, every benchmark but simulation.py imported torch (and numpy, scipy, grpc, the engine) at its top:
    a mistyped flag was refused after about 2 s of imports, not at once."""
    p = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "benchmarks" / f"{name}.py"), *args,
                        "--out", str(tmp_path / "result.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.splitlines()
    imported = [line.split("|")[-1].strip() for line in lines if line.startswith("import time:")]
    assert "splitfed.cli" in imported  # -X importtime did report the imports
    assert "torch" not in imported
    assert lines[-1].startswith(f"benchmarks/{name}.py: error: argument {args[0]}: ")
