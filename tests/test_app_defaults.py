"""The two ways to deploy a run on Flower compute the same with the same flags: ``flwr run .`` reads the
repository's ``[tool.flwr.app.config]``, ``server.deploy`` writes its app's from
:func:`splitfed.flower.config.app_config`. Before, deploy wrote RunSettings' defaults (IID data, static cuts
2,5) where ``flwr run .`` ran Dirichlet(0.5) data with adaptive cuts."""

from __future__ import annotations

import tomllib
from pathlib import Path

from server.deploy import Deployment
from splitfed.flower.config import APP_DEFAULTS, RunSettings, app_config

ROOT = Path(__file__).resolve().parent.parent


def _app_table(pyproject: Path) -> dict:
    return dict(tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"])


def test_the_repository_pyproject_lists_every_setting_at_the_apps_default() -> None:
    assert _app_table(ROOT / "pyproject.toml") == app_config()


def test_server_deploy_writes_the_same_defaults_as_flwr_run_reads(tmp_path: Path) -> None:
    dep = Deployment(2, tmp_path / "work", log=False)
    app = dep.write_app()
    written = _app_table(app / "pyproject.toml")
    assert written == _app_table(ROOT / "pyproject.toml")
    assert written["partition"] == "dirichlet:0.5" and written["cuts"] == "adaptive"


def test_the_app_defaults_are_settings_and_differ_from_runsettings_only_where_said() -> None:
    defaults = RunSettings().to_dict()
    cfg = app_config()
    settings = RunSettings.from_mapping(cfg, source="test")
    assert {k for k, v in settings.to_dict().items() if v != defaults[k]} == set(APP_DEFAULTS)
