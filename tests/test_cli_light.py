"""The ``splitfed`` command's parser imports nothing heavy: building it, any help, and any command line argparse
itself refuses (a bad number or choice, a required flag left out, an unknown flag) take a fraction of a second,
not the seconds torch, scipy, Flower and Ray take to import. What the help and the refusals say still comes
from the constants of the modules that use them (the limits, the shipped fleets, the optimizer's). And a report
of a run folder imports no torch (its figures need numpy and matplotlib, nothing of the training)."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import splitfed
import splitfed.commands

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "scipy", "numpy", "flwr", "ray", "grpc", "sklearn", "matplotlib", "datasets", "pandas",
         "pyarrow")
REPORT_NEEDS = ("numpy", "matplotlib")  # the figures: what a report may import of HEAVY
COMMANDS = sorted(m.name for m in pkgutil.iter_modules(splitfed.commands.__path__) if not m.name.startswith("_"))

# command lines argparse refuses (exit 2): at least one per command
REFUSED = [
    ["blocks"],  # --model left out
    ["blocks", "--model", "cnn", "--vocab", "1"],
    ["blocks", "--model", "cnn", "--num-classes", "0"],
    ["optimize", "--model", "cnn"],  # --fleet left out
    ["optimize", "--model", "cnn", "--fleet", ""],
    ["optimize", "--model", "cnn", "--fleet", "small", "--tiers", "4"],
    ["optimize", "--model", "cnn", "--fleet", "small", "--exhaustive", "--greedy"],
    ["ping"],  # no address
    ["ping", "127.0.0.1:1", "--count", "0"],
    ["profile", "--model", "cnn", "--batch", "0"],
    ["profile", "--model", "cnn", "--optimizer-slots", "3"],
    ["report"],  # no run folder
    ["report", "runs/x", "--target", "2"],
    ["simulate", "--clients", "0"],
    ["simulate", "--mode", "x"],
    ["simulate", "--batch-size", "zero"],
    ["simulate", "--no-such-flag"],
    ["tier"],  # --listen left out
    ["tier", "--listen", "127.0.0.1:0", "--max-model-mb", "0"],
    ["verify", "--model", "cnn", "--cuts", "x"],
    ["verify", "--model", "cnn", "--cuts", "2,5", "--seed", "-1"],
    ["verify", "--model", "cnn", "--cuts", "2,5", "--mode", "x"],
    ["no-such-command"],
    ["--no-such-flag"],
]
HELP = [["--help"], *([c, "--help"] for c in COMMANDS)]
VERSION = ["--version"]

# one interpreter for every case (each start with splitfed costs time): the heavy modules a case imported are
# those in sys.modules after it and not before, so the first case that imports one is the one named
_SCRIPT = r"""
import contextlib, io, json, sys

heavy_names, cases = json.loads(sys.argv[1]), json.loads(sys.argv[2])


def heavy():
    return {name.split(".")[0] for name in sys.modules} & set(heavy_names)


results, seen = [], heavy()
from splitfed.cli import build_parser, main

results.append({"case": "import splitfed.cli", "heavy": sorted(heavy() - seen)})
seen = heavy()
build_parser()
results.append({"case": "build_parser()", "heavy": sorted(heavy() - seen)})
seen = heavy()
for argv in cases:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    now = heavy()
    results.append({"case": argv, "rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(),
                    "heavy": sorted(now - seen)})
    seen = now
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each case's result: ``cli``, the help and the refusals, in one interpreter; ``report``, a report, in another
    (what it imports would otherwise be what a case before had imported)."""
    from splitfed.report.runs import write_run

    folder = write_run(tmp_path_factory.mktemp("light") / "run", [
        {"round": r, "accuracy": 0.5 + r / 10, "loss": 1 / r, "sim_round_s": 2.0, "cuts": {"client0": [1, 3]}}
        for r in (1, 2)])
    env = {**os.environ, "COLUMNS": "100"}  # help wrapped as on a terminal of 100 columns, whatever runs the test
    started = {name: subprocess.Popen([sys.executable, "-c", _SCRIPT, json.dumps(HEAVY), json.dumps(cases)],
                                      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for name, cases in (("cli", [*HELP, VERSION, [], *REFUSED]), ("report", [["report", str(folder)]]))}
    results = {}
    for name, p in started.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results[name] = json.loads(out)
    return results


def _by_case(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {" ".join(r["case"]) if isinstance(r["case"], list) else r["case"]: r for r in runs}


def _label(case: str | list[str]) -> str:
    return case if isinstance(case, str) else " ".join(["splitfed", *(repr(a) if not a else a for a in case)])


def test_every_command_has_a_refused_command_line_here() -> None:
    assert sorted({argv[0] for argv in REFUSED} & set(COMMANDS)) == COMMANDS


def test_the_parser_its_help_and_its_refusals_import_nothing_heavy(runs: dict[str, list[dict[str, Any]]]) -> None:
    heavy = {_label(r["case"]): r["heavy"] for r in runs["cli"] if r["heavy"]}
    assert not heavy, f"heavy modules imported (by the first case that imported each): {heavy}"


def test_a_report_of_a_run_folder_imports_nothing_of_the_training(runs: dict[str, list[dict[str, Any]]]) -> None:
    imported = {m for r in runs["report"] for m in r["heavy"]}  # splitfed.cli, its parser, then the report
    report = runs["report"][-1]
    assert report["rc"] == 0, report
    assert imported <= set(REPORT_NEEDS), f"{_label(report['case'])} imported {sorted(imported)}"


def test_help_exits_0_and_refusals_exit_2_with_one_line(runs: dict[str, list[dict[str, Any]]]) -> None:
    by = _by_case(runs["cli"])
    for argv in HELP:
        r = by[" ".join(argv)]
        assert r["rc"] == 0 and r["stdout"].startswith("usage: splitfed") and not r["stderr"], (argv, r)
        assert "``" not in r["stdout"], (argv, r["stdout"])  # the docstring's reST literals, shown as text
    r = by[""]
    assert r["rc"] == 2 and r["stdout"].startswith("usage: splitfed"), r  # no command: the help, exit 2
    for argv in REFUSED:
        r = by[" ".join(argv)]
        prog = "splitfed" + (f" {argv[0]}" if argv[0] in COMMANDS else "")
        assert r["rc"] == 2 and not r["stdout"], (argv, r)
        assert r["stderr"].startswith(f"{prog}: error: ") and r["stderr"].count("\n") == 1, (argv, r)


def test_the_help_and_refusals_still_say_the_constants_of_the_modules_that_use_them(
        runs: dict[str, list[dict[str, Any]]]) -> None:
    from splitfed.commands.ping import SPEED_PASSES
    from splitfed.engine.limits import MAX_BATCH, MOST_MB
    from splitfed.engine.types import MODES
    from splitfed.flower.config import MAX_SEED
    from splitfed.models.zoo import MAX_CLASSES, MAX_VOCAB
    from splitfed.optimizer.defaults import EXHAUSTIVE_LIMIT
    from splitfed.profile.fleet import shipped_fleets

    by = _by_case(runs["cli"])

    def said(key: str, stream: str = "stdout") -> str:
        return " ".join(by[key][stream].split())  # as one line: help is wrapped to the terminal's width

    fleets = sorted(p.stem for p in (Path(splitfed.__file__).parent / "fleets").glob("*.toml"))
    assert fleets and shipped_fleets() == fleets
    assert f"a shipped fleet: {', '.join(fleets)}" in said("optimize --help")
    assert f"at most {EXHAUSTIVE_LIMIT:,} assignments" in said("optimize --help")
    assert f"the fastest of {SPEED_PASSES} passes" in said("ping --help")
    for command in ("simulate", "verify"):
        assert "{" + ",".join(MODES) + "}" in said(f"{command} --help")
    assert f"1..{MAX_BATCH:,}, got 0" in said("profile --model cnn --batch 0", "stderr")
    assert f"2..{MAX_VOCAB:,}, got 1" in said("blocks --model cnn --vocab 1", "stderr")
    assert f"1..{MAX_CLASSES:,}, got 0" in said("blocks --model cnn --num-classes 0", "stderr")
    assert f"0..{MAX_SEED:,}, got -1" in said("verify --model cnn --cuts 2,5 --seed -1", "stderr")
    assert f"1..{MOST_MB:,}, got 0" in said("tier --listen 127.0.0.1:0 --max-model-mb 0", "stderr")


def test_the_parsed_defaults_are_the_modules_constants() -> None:
    from splitfed.cli import build_parser
    from splitfed.engine.limits import DEFAULT_LIMITS, IDLE_RELEASE_S
    from splitfed.optimizer.defaults import DEFAULT_GAP

    parser = build_parser()
    assert parser.parse_args(["optimize", "--model", "cnn", "--fleet", "small"]).gap == DEFAULT_GAP
    tier = parser.parse_args(["tier", "--listen", "127.0.0.1:0"])
    assert tier.max_model_mb == DEFAULT_LIMITS.model_bytes >> 20 and tier.idle_release_s == IDLE_RELEASE_S


def test_the_optimizer_package_gives_its_names_when_first_asked_for() -> None:
    """``splitfed.optimizer`` imports its modules (numpy, scipy) when one of their names is first used."""
    import splitfed.optimizer as optimizer
    from splitfed.optimizer import adapt, assign, baselines, brute_force, defaults, solution

    homes = {m.__name__: m for m in (adapt, assign, baselines, brute_force, solution)}
    for name in set(optimizer.__all__) - {"DEFAULT_GAP", "EXHAUSTIVE_LIMIT"}:
        got = getattr(optimizer, name)
        assert getattr(homes[got.__module__], name) is got, name  # the object its own module defines
    assert (optimizer.DEFAULT_GAP, optimizer.EXHAUSTIVE_LIMIT) == (defaults.DEFAULT_GAP, defaults.EXHAUSTIVE_LIMIT)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        optimizer.no_such_name  # noqa: B018


def test_version_says_splitfeds_and_what_it_runs_on(runs: dict[str, list[dict[str, Any]]]) -> None:
    """What a bug report needs, read from the installed packages (nothing imported: checked with the rest)."""
    import platform
    from importlib import metadata

    r = _by_case(runs["cli"])["--version"]
    assert r["rc"] == 0 and not r["stderr"], r
    want = (f"splitfed {splitfed.__version__} (Python {platform.python_version()}; torch {metadata.version('torch')}, "
            f"flwr {metadata.version('flwr')}, ray {metadata.version('ray')}, grpcio {metadata.version('grpcio')}, "
            f"protobuf {metadata.version('protobuf')}, numpy {metadata.version('numpy')})\n")
    assert r["stdout"] == want
    assert splitfed.__version__ == metadata.version("splitfed")  # the package says what pyproject.toml does


def test_every_option_with_a_default_says_it_in_the_help() -> None:
    """``--batch BATCH  (default: 32)``: a user reads what an option is when left out, in each command's help (its
    own words, where they say it already: ``default 3600; 0: never``). Flags and values worked out later (None)
    show none."""
    import argparse
    import re

    from splitfed.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    shown = 0
    for name, command in commands.items():
        text = command.format_help()
        blocks = {b.split()[0].rstrip(","): " ".join(b.split()) for b in re.split(r"\n  (?=-)", text)[1:]}
        for a in command._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            block = blocks[a.option_strings[0]]
            if a.default is None or a.default is False or a.default in ("", []):
                assert not re.search(r"default: (None|False|\[\])?\)?$", block), (name, block)
                continue
            assert "default" in block, (name, block)
            said = re.search(r"\(?default: ([^)]*)\)", block)
            if said:
                assert said.group(1) == str(a.default), (name, block)
                shown += 1
    assert shown >= 20  # verify's --batch, --rounds, --mode, --seed; optimize's --tiers, --batch; tier's ...
