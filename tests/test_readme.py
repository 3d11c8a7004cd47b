"""The README's promises: its two commands exist in the Makefile, and its Python example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_two_commands_are_make_targets_and_ci_calls_the_test_one() -> None:
    block = re.search(r"## Quickstart: two commands\n\n```bash\n(.*?)```", README, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: install$", makefile, re.M) and re.search(r"^test: install$", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_python_example_runs(tmp_path: Path) -> None:
    code = re.search(r"## Use it from Python with your own model\n\n```python\n(.*?)```", README, re.S)
    assert code is not None
    (tmp_path / "mymodels.py").write_text(code.group(1))
    p = subprocess.run([sys.executable, "mymodels.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0.0", "True"]


def test_flower_run_config_in_pyproject_is_valid() -> None:
    """`flwr run .` reads [tool.flwr.app.config]: every key there must be a setting the ServerApp accepts."""
    import tomllib

    from splitfed.flower.config import ALIASES, RunSettings

    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    settings = RunSettings.from_mapping(dict(app["config"]), source="pyproject.toml")
    assert settings.cuts == "adaptive" and settings.tiers == 3
    # `flwr run --run-config` can only set keys listed there: every setting must be, or deployment lacks it
    import dataclasses

    listed = {ALIASES.get(k.replace("-", "_"), k.replace("-", "_")) for k in app["config"]}
    assert listed == {f.name for f in dataclasses.fields(RunSettings)}
    assert app["components"] == {"serverapp": "server.app:app", "clientapp": "clients.app:app"}
    assert set(app["fab-include"]) == {"server/**/*.py", "clients/**/*.py"}


def _deploy_block() -> str:
    """The section's shell block, one command per line (continuations and quoted line breaks joined)."""
    block = re.search(r"## Deploy on real devices\n.*?```bash\n(.*?)```", README, re.S)
    assert block is not None
    lines: list[str] = []
    for line in block.group(1).replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#"):
            continue
        if lines and lines[-1].count("'") % 2:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return "\n".join(lines)


def test_deploy_commands_use_options_that_exist(tmp_path: Path, monkeypatch) -> None:
    """A user pastes these on real machines: every flag must exist in the installed Flower and splitfed,
    and every --node-config / --run-config key must be one the apps accept (a typo is refused there, but
    only once the run is up)."""
    import shlex

    from flwr.common.config import parse_config_args

    from splitfed.flower.config import RunSettings
    from splitfed.flower.node import NodeConfig

    text = _deploy_block()
    bin_dir = Path(sys.executable).parent
    helps: dict[tuple[str, ...], str] = {}  # one process per command (the edge and the cloud are both `splitfed tier`)
    for tool in ("flower-superlink", "flower-supernode", "flwr", "splitfed"):
        lines = [ln for ln in text.splitlines() if ln.strip().startswith(tool + " ")]
        assert lines or tool == "flwr", tool
        for line in lines:
            words = shlex.split(line.split(" #")[0])
            cmd = (str(bin_dir / tool), *([words[1]] if tool in ("flwr", "splitfed") else []), "--help")
            if cmd not in helps:
                helps[cmd] = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
            helptext = helps[cmd]
            for flag in (w.split("=")[0] for w in words if w.startswith("--")):
                assert re.search(rf"(^|\s|,){re.escape(flag)}\b", helptext), f"{tool}: {flag} is not an option"
    # Flower 1.42's SuperLink serves nodes on its one --port; without the flag, `flwr run` installs CUDA torch on it
    link = re.search(r"^flower-superlink .*--port (\d+).*--disable-runtime-dependency-installation", text, re.M)
    assert link and re.search(rf"^flower-supernode --superlink \S+:{link.group(1)} ", text, re.M)
    node = re.search(r"--node-config '(.*?)'", text, re.S)
    run = re.search(r"--run-config '(.*?)'", text, re.S)
    assert node and run
    monkeypatch.chdir(tmp_path)
    node_cfg = parse_config_args([" ".join(node.group(1).split())])
    for key in ("tls-ca", "tls-cert", "tls-key", "token-file"):  # the node's files, which it must have
        (tmp_path / node_cfg[key]).write_text("x")
    assert NodeConfig.parse(node_cfg).edge_address == "edge.example:7000"
    run_cfg = parse_config_args([" ".join(run.group(1).split())])
    settings = RunSettings.from_mapping(run_cfg, source="README")
    assert settings.tier_addresses and not settings.sim_clock and settings.token_file == "/etc/splitfed/token"
    assert settings.out and Path(settings.out).is_absolute()  # a run with nothing kept, or kept where the SuperLink runs


def test_make_bench_runs_every_benchmark_the_readme_lists() -> None:
    """``make bench`` ran four of the five benchmarks in ``benchmarks/`` and the README's list (not weights.py)."""
    ran = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), "bench", "VENV=.venv-none"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    benched = set(re.findall(r"benchmarks/(\w+\.py)", ran.stdout))
    listed = set(re.findall(r"^\.venv/bin/python benchmarks/(\w+\.py)", README, re.M))
    on_disk = {p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")}
    assert benched == listed == on_disk, (benched, listed, on_disk)


def test_the_compare_example_is_what_the_command_prints(capsys, monkeypatch, tmp_path: Path) -> None:
    """The README's ``splitfed optimize --compare`` block is the command's output, line for line (the cost model
    prices FLOPs and bytes: no timing enters it)."""
    from splitfed.cli import main

    block = re.search(r"```\n\$ (splitfed optimize [^\n]*--compare)\n(.*?)```", README, re.S)
    assert block is not None
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    assert main(block.group(1).split()[1:]) == 0
    assert capsys.readouterr().out == block.group(2)
