"""A model factory's keyword arguments from the command line and run configs (``--model-kwargs``,
``model-kwargs``). Before, only Python could pass them (``resolve_spec(..., width=32)``): a factory that needs
one could not run under ``splitfed simulate``, and a zoo model's width could not be changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import clients.app
import server.app
from splitfed.cli import main as cli
from splitfed.engine import template
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec
from tests.flower_fixtures import FakeGrid, inprocess_tiers

FACTORY = "tests.test_model_kwargs:sized"


def sized(hidden: int, num_classes: int = 10):  # type: ignore[no-untyped-def]
    """A user's factory that needs an option, and takes the classes too."""
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def _toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("given", ['{"width": 4}', '{ "width" : 4 }', {"width": 4}])
def test_the_options_are_kept_as_one_sorted_json_text(given: object) -> None:
    s = RunSettings.from_mapping({"model-kwargs": given})
    assert s.model_kwargs == '{"width": 4}' and s.kwargs == {"width": 4}
    assert s.spec.kwargs == {"width": 4}
    assert RunSettings.from_mapping({"model-kwargs": "{}"}).model_kwargs == ""  # none, as the default


def test_a_toml_table_of_options_is_read_as_they_are(tmp_path: Path) -> None:
    s = RunSettings.from_toml(_toml(tmp_path, 'model = "mlp"\nmodel-kwargs = { hidden = 8 }\n'))
    assert s.kwargs == {"hidden": 8}
    assert template.num_blocks(s.spec) == template.num_blocks(resolve_spec("mlp"))
    with pytest.raises(ConfigError, match=r"model-kwargs: .* is no JSON value"):
        RunSettings.from_toml(_toml(tmp_path, "model-kwargs = { when = 1979-05-27 }\n"))


@pytest.mark.parametrize(("given", "words"), [
    ("{width: 4}", "model-kwargs must be a JSON object of the model factory's keyword arguments"),
    ("[4]", "got a list"),
    ('{"widht": 4}', "model cnn takes no keyword argument 'widht': its options are width"),
    ('{"num_classes": 3}', "takes no keyword argument 'num_classes': its options are width (the input shape"),
])
def test_options_a_run_cannot_take_are_refused_naming_the_key_and_the_source(given: str, words: str) -> None:
    with pytest.raises(ConfigError, match="^command line: ") as e:
        RunSettings.layered([({"model-kwargs": given}, "command line")])
    assert words in str(e.value)


def test_a_zoo_models_option_changes_the_model_it_builds() -> None:
    from splitfed.engine.rounds import initial_state

    narrow = initial_state(resolve_spec("cnn", options={"width": 4}), 0)
    assert narrow["0.0.weight"].shape[0] == 4 and initial_state(resolve_spec("cnn"), 0)["0.0.weight"].shape[0] == 16


def test_a_user_factory_may_take_what_resolve_spec_calls_its_own() -> None:
    """``options`` may hold ``num_classes``: passed as keywords, it would collide with resolve_spec's own."""
    spec = resolve_spec(FACTORY, (64,), 3, options={"hidden": 5, "num_classes": 3})
    from splitfed.engine.rounds import initial_state

    assert {k: tuple(v.shape) for k, v in initial_state(spec, 0).items()}["3.weight"] == (3, 5)


def test_the_cli_takes_the_options_and_refuses_a_bad_one_as_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["blocks", "--model", "cnn", "--model-kwargs", '{"width": 4}', "--json"]) == 0
    narrow = json.loads(capsys.readouterr().out)
    assert cli(["blocks", "--model", "cnn", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert narrow != default
    with pytest.raises(SystemExit) as e:
        cli(["blocks", "--model", "cnn", "--model-kwargs", "[4]"])
    assert e.value.code == 2
    assert "argument --model-kwargs: must be a JSON object" in capsys.readouterr().err
    assert cli(["blocks", "--model", "cnn", "--model-kwargs", '{"input_shape": [1, 8, 8]}']) == 2  # was: TypeError
    assert "model cnn takes no keyword argument 'input_shape'" in capsys.readouterr().err


def test_a_run_trains_the_model_its_options_make_on_every_tier_and_node(monkeypatch, tmp_path: Path) -> None:
    """The nodes and the tiers build the model from the spec they are sent: every one of them got the options
    (a node or tier building the default width would not load the weights), and the checkpoint holds it."""
    s = RunSettings(rounds=1, clients=2, model=FACTORY, model_kwargs='{"hidden": 6}', dataset="digits",
                    cuts="static:1,3", node_wait_s=5.0, round_timeout_s=60.0, out=str(tmp_path / "run"))
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, 2), s, progress=lambda line: None)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert sorted(row["cuts"]) == ["client0", "client1"] and not row.get("failed")
    ckpt = checkpoint.load(tmp_path / "run")
    assert tuple(ckpt.state["1.weight"].shape) == (6, 64)
    assert ckpt.settings["model_kwargs"] == '{"hidden": 6}'
    with pytest.raises(ConfigError, match=r"cannot resume with different model-kwargs"):
        server.app.check_resume(s.with_(model_kwargs='{"hidden": 7}', resume=True))
