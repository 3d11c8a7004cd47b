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
