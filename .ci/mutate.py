"""Mutation testing of one module: which small changes to it does no test notice?

Not part of CI (a module takes tens of minutes on 2 cores); a maintainer runs it to find what the suite
leaves unpinned. Each mutant is one small change (an operator, a comparison, a constant, a returned value);
it is run against the tests that cover its lines, fastest first, within a time budget, and is *killed* when
one of them fails. What survives is either a gap in the tests or a change that makes no difference.

1. Coverage of the suite, per test (needs ``pip install pytest-cov``), in a clone of the repository::

       git clone -q . /tmp/m && cd /tmp/m && ln -s "$OLDPWD/.venv" .venv
       cp -r "$OLDPWD/splitfed/transport/proto/splitfed" splitfed/transport/proto/
       printf '[run]\\ninclude = */splitfed/transport/server.py\\n' > .covrc
       .venv/bin/python -m pytest -n 2 --dist loadgroup -q -m "not slow" -p no:cacheprovider \\
           --cov --cov-config=.covrc --cov-context=test --cov-report= --junitxml=junit.xml

2. The mutants (each worker copies the clone; the clone itself is never changed)::

       .venv/bin/python .ci/mutate.py run --root /tmp/m --module splitfed/transport/server.py \\
           --junit /tmp/m/junit.xml --out server.jsonl

3. ``list`` prints the mutants with their numbers; ``check --idx N -- TESTS`` runs named tests against one
   mutant (does a new test kill it, and pass on the real code?).

Tests run in processes of their own are not in the coverage, so they are never chosen for a line: a
mutant only they would notice is reported as surviving. Lines run only at import time have no test of
their own: such mutants are reported ``import`` and not run.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

SWAP_BIN: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                              ast.FloorDiv: ast.Div, ast.Mod: ast.Mult, ast.Pow: ast.Mult,
                              ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.LShift: ast.RShift,
                              ast.RShift: ast.LShift}
SWAP_CMP: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                              ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
                              ast.Is: ast.IsNot, ast.IsNot: ast.Is}
# what a test costs at least, whatever its junit time (0.0 for thousands of tiny ones): collecting and setting it
# up; it also bounds how many ids one budget picks (a module every test touches picked thousands, past the
# command line's limit)
MIN_TEST_S = 0.02
# a test id longer than this is left out: one argument of a command line holds at most 128 KiB on Linux
# (MAX_ARG_STRLEN), and a parametrized id that spells out its value may not fit
MAX_ID_CHARS = 4096


@dataclass
class Mutant:
    idx: int
    line: int
    end_line: int
    col: int
    end_col: int
    old: str
    new: str
    desc: str
    status: str = ""
    tests: list[str] = field(default_factory=list)
    secs: float = 0.0


def _skipped(tree: ast.Module) -> set[int]:
    """Ids of nodes whose change means nothing: docstrings, annotations, ``TYPE_CHECKING`` blocks."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            mark(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                mark(a.annotation)
            mark(node.args.vararg.annotation if node.args.vararg else None)
            mark(node.args.kwarg.annotation if node.args.kwarg else None)
        if isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            mark(node)
        if isinstance(node, ast.JoinedStr):
            mark(node)
    return skip


def _variants(node: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """The mutated copies of one node, each with a few words that say what changed."""
    if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
        m = copy.deepcopy(node)
        m.op = SWAP_BIN[type(node.op)]()
        yield m, f"{type(node.op).__name__} -> {type(m.op).__name__}"
    elif isinstance(node, ast.AugAssign) and type(node.op) in SWAP_BIN:
        m = copy.deepcopy(node)
        m.op = SWAP_BIN[type(node.op)]()
        yield m, f"{type(node.op).__name__}= -> {type(m.op).__name__}="
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in SWAP_CMP:
                m = copy.deepcopy(node)
                m.ops[i] = SWAP_CMP[type(op)]()
                yield m, f"{type(op).__name__} -> {type(m.ops[i]).__name__}"
    elif isinstance(node, ast.BoolOp):
        m = copy.deepcopy(node)
        m.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield m, f"{type(node.op).__name__} -> {type(m.op).__name__}"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield copy.deepcopy(node.operand), f"drop {type(node.op).__name__}"
    elif isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)) and node.value is not None:
        v = node.value
        if isinstance(v, bool):
            yield ast.Constant(not v), f"{v} -> {not v}"
        elif isinstance(v, int):
            for w in ((1,) if v == 0 else (v + 1, v - 1)):
                yield ast.Constant(w), f"{v} -> {w}"
        elif isinstance(v, float):
            w = v * 2 if v else 1.0
            yield ast.Constant(w), f"{v} -> {w}"
    elif isinstance(node, ast.Return) and node.value is not None \
            and not (isinstance(node.value, ast.Constant) and node.value.value is None):
        yield ast.Return(ast.Constant(None)), "return None"
    elif isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, ast.UnaryOp):
        m = copy.deepcopy(node)
        m.test = ast.UnaryOp(ast.Not(), m.test)
        yield m, f"negate {type(node).__name__.lower()} test"


def _segment(node: ast.AST) -> tuple[int, int, int, int]:
    """Where a node's text is: for an ``if`` or ``while``, only its test."""
    at = node.test if isinstance(node, (ast.If, ast.While)) else node
    return at.lineno, at.col_offset, at.end_lineno, at.end_col_offset  # type: ignore[attr-defined,return-value]


def mutants(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    skip = _skipped(tree)
    out: list[Mutant] = []
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        for new, desc in _variants(node):
            line, col, end_line, end_col = _segment(node)
            target = new.test if isinstance(new, (ast.If, ast.While)) else new
            text = ast.unparse(target)
            old = _text(lines, line, col, end_line, end_col)
            if isinstance(target, ast.expr) and not isinstance(target, (ast.Constant, ast.Name)):
                text = f"({text})"
            mutated = _replace(lines, line, col, end_line, end_col, text)
            try:
                compile(mutated, "<mutant>", "exec")
            except SyntaxError:
                continue
            out.append(Mutant(0, line, end_line, col, end_col, old, text, desc))
    out.sort(key=lambda m: (m.line, m.col, m.desc))
    for i, m in enumerate(out):
        m.idx = i
    return out


def _text(lines: list[str], line: int, col: int, end_line: int, end_col: int) -> str:
    """The text of a span (columns are UTF-8 byte offsets, as ``ast`` gives them)."""
    if line == end_line:
        return lines[line - 1].encode()[col:end_col].decode()
    return (lines[line - 1].encode()[col:].decode() + "".join(lines[line:end_line - 1])
            + lines[end_line - 1].encode()[:end_col].decode())


def _replace(lines: list[str], line: int, col: int, end_line: int, end_col: int, text: str) -> str:
    """The source with one span replaced (columns are UTF-8 byte offsets, as ``ast`` gives them)."""
    before = "".join(lines[:line - 1]) + lines[line - 1].encode()[:col].decode()
    after = lines[end_line - 1].encode()[end_col:].decode() + "".join(lines[end_line:])
    return before + text + after


def mutated_source(source: str, m: Mutant) -> str:
    return _replace(source.splitlines(keepends=True), m.line, m.col, m.end_line, m.end_col, m.new)


def covering_tests(coverage_file: Path, module: str) -> dict[int, set[str]]:
    """Line -> the test ids that ran it (pytest-cov's ``--cov-context=test``); '' is import time."""
    from coverage import CoverageData

    data = CoverageData(basename=str(coverage_file))
    data.read()
    found = [f for f in data.measured_files() if f.endswith("/" + module)]
    if not found:
        raise SystemExit(f"{coverage_file} has no coverage of {module} (add it to the .covrc include)")
    by_line = data.contexts_by_lineno(found[0])
    return {ln: {_test_id(c) for c in ctxs} for ln, ctxs in by_line.items()}


def _test_id(context: str) -> str:
    """A context's test id: without its phase (``|run``) and the xdist group pytest-xdist's loadgroup
    appends (``@flower-real``), which pytest would not find."""
    test = context.rsplit("|", 1)[0]
    if not test.endswith("]") and "@" in test.rsplit("::", 1)[-1]:
        test = test.rsplit("@", 1)[0]
    return test


def durations(junit: Path | None) -> dict[str, float]:
    """Test id -> seconds, from a JUnit XML file of the coverage run (fastest tests are tried first)."""
    if junit is None or not junit.exists():
        return {}
    out: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        parts = cls.split(".")
        # classname "tests.test_x" or "tests.test_x.TestClass"
        for k in range(len(parts), 0, -1):
            path = "/".join(parts[:k]) + ".py"
            rest = parts[k:]
            nodeid = "::".join([path, *rest, name])
            out[nodeid] = float(case.get("time", "0") or 0)
    return out


def chosen(m: Mutant, by_line: dict[int, set[str]], secs: dict[str, float], budget_s: float) -> list[str]:
    ids: set[str] = set()
    for ln in range(m.line, m.end_line + 1):
        ids |= by_line.get(ln, set())
    ids.discard("")
    ordered = sorted((t for t in ids if len(t) <= MAX_ID_CHARS), key=lambda t: (secs.get(t, 1.0), t))
    picked, spent = [], 0.0
    for t in ordered:
        cost = max(secs.get(t, 1.0), MIN_TEST_S)
        if picked and spent + cost > budget_s:
            break
        picked.append(t)
        spent += cost
    return picked


def run_one(work: Path, module: str, source: str, m: Mutant, tests: list[str], timeout_s: float) -> str:
    """Run ``tests`` against mutant ``m`` in the worker copy ``work``; the module is put back afterwards."""
    target = work / module
    target.write_text(mutated_source(source, m))
    t0 = time.monotonic()
    try:  # the ids as arguments, not an @file: pytest splits its lines at spaces, and an id may hold one
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p",
                               "no:randomly", "--no-header", "-o", "addopts=", "--", *tests],
                              cwd=work, capture_output=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        target.write_text(source)
        m.secs = round(time.monotonic() - t0, 2)
    if rc in (2, 4) and b"ERROR collecting" in proc.stdout:  # the mutant broke an import the tests make: noticed
        return "killed"
    return {0: "survived", 1: "killed", 5: "no-tests"}.get(rc, f"error-{rc}")


def _worker_copy(root: Path, i: int) -> Path:
    """A scratch copy of the checkout; its ``.venv`` is linked, not copied (gigabytes of torch, never mutated)."""
    work = Path(tempfile.mkdtemp(prefix=f"mutant{i}-"))
    shutil.copytree(root, work, dirs_exist_ok=True, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", "__pycache__", ".coverage*", "runs", ".hypothesis",
                                                  ".venv"))
    if (root / ".venv").exists():
        (work / ".venv").symlink_to((root / ".venv").resolve(), target_is_directory=True)
    return work


def cmd_run(a: argparse.Namespace) -> None:
    root = Path(a.root).resolve()
    source = (root / a.module).read_text()
    all_mutants = mutants(source)
    by_line = covering_tests(root / ".coverage", a.module)
    secs = durations(Path(a.junit) if a.junit else None)
    todo: list[Mutant] = []
    for m in all_mutants:
        lines = range(m.line, m.end_line + 1)
        if a.lines and not any(a.lines[0] <= ln <= a.lines[1] for ln in lines):
            continue
        m.tests = chosen(m, by_line, secs, a.budget_s)
        if not m.tests:
            m.status = "import" if any(ln in by_line for ln in lines) else "uncovered"
        else:
            todo.append(m)
    works = [_worker_copy(root, i) for i in range(a.workers)]
    free = list(works)
    out = open(a.out, "w")
    done = 0

    def job(m: Mutant) -> Mutant:
        work = free.pop()
        try:
            m.status = run_one(work, a.module, source, m, m.tests, a.timeout)
        finally:
            free.append(work)
        return m

    try:
        for m in all_mutants:
            if m.status:
                out.write(json.dumps(asdict(m)) + "\n")
        with ThreadPoolExecutor(a.workers) as pool:
            for m in pool.map(job, todo):
                done += 1
                out.write(json.dumps(asdict(m)) + "\n")
                out.flush()
                if m.status != "killed":
                    print(f"[{done}/{len(todo)}] #{m.idx} line {m.line} {m.desc}: {m.status}", flush=True)
    finally:
        out.close()
        for w in works:
            shutil.rmtree(w, ignore_errors=True)
    counts: dict[str, int] = {}
    for m in all_mutants:
        counts[m.status or "not run"] = counts.get(m.status or "not run", 0) + 1
    print(json.dumps({"module": a.module, "mutants": len(all_mutants), **counts}))


def cmd_list(a: argparse.Namespace) -> None:
    source = Path(a.module).read_text()
    for m in mutants(source):
        print(f"#{m.idx} {m.line}:{m.col} {m.desc}: {m.old!r} -> {m.new!r}")


def cmd_check(a: argparse.Namespace) -> None:
    """Run tests against one mutant in a scratch copy of this checkout: rc 1 (killed) is what a new test wants."""
    root = Path(".").resolve()
    source = (root / a.module).read_text()
    m = next(x for x in mutants(source) if x.idx == a.idx)
    if a.desc and a.desc not in m.desc:
        raise SystemExit(f"mutant #{a.idx} is {m.desc!r}, not {a.desc!r} (the module changed?)")
    work = _worker_copy(root, 0)
    try:
        print(f"#{m.idx} line {m.line} {m.desc}: {m.old!r} -> {m.new!r}: "
              f"{run_one(work, a.module, source, m, a.tests, a.timeout)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--root", required=True, help="a clone holding .coverage from the suite's coverage run")
    r.add_argument("--module", required=True, help="path inside the repository, e.g. splitfed/transport/server.py")
    r.add_argument("--junit", help="the coverage run's JUnit XML (test durations: fastest first)")
    r.add_argument("--out", required=True, help="JSON lines, one per mutant")
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--timeout", type=float, default=90.0, help="seconds per mutant (over it: 'timeout')")
    r.add_argument("--budget-s", type=float, default=6.0, help="seconds of covering tests per mutant")
    r.add_argument("--lines", type=lambda s: tuple(int(x) for x in s.split("-")), help="only lines A-B")
    r.set_defaults(fn=cmd_run)
    ls = sub.add_parser("list")
    ls.add_argument("--module", required=True)
    ls.set_defaults(fn=cmd_list)
    c = sub.add_parser("check")
    c.add_argument("--module", required=True)
    c.add_argument("--idx", type=int, required=True)
    c.add_argument("--desc", default="", help="what the mutant must be (guards against a changed module)")
    c.add_argument("--timeout", type=float, default=300.0)
    c.add_argument("tests", nargs="+")
    c.set_defaults(fn=cmd_check)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
