"""A model must output logits in training mode too, and looking at it there must move nothing.

``check_input`` ran the model in eval mode only, so a model that returns an auxiliary head's logits beside its
own when training (GoogLeNet and Inception do; here a Sequential's child) passed every check and was profiled,
and the run failed in its first step on a tier with ``internal error in step: TypeError: cross_entropy_loss()``.
"""

from __future__ import annotations

import pytest
import torch

from splitfed.cli import main
from splitfed.engine import template
from splitfed.errors import ConfigError
from splitfed.models.zoo import ZOO, build, check_input, resolve_spec


def _spec(factory: str):  # type: ignore[no-untyped-def]
    return resolve_spec(f"tests.models_train_mode:{factory}", input_shape=(16,), num_classes=3)


def test_a_model_with_an_auxiliary_output_when_training_is_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match=r"outputs tuple in training mode for two samples of shape \(16,\); "
                                          r"expected logits of shape \[2, 3\] \(return them alone when training"):
        template.num_blocks(_spec("aux_head"))


def test_a_model_with_other_classes_when_training_is_refused_naming_the_mode() -> None:
    with pytest.raises(ConfigError, match="outputs 4 classes in training mode, and 3 are expected"):
        template.num_blocks(_spec("wide_when_training"))


def test_the_cli_says_it_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["blocks", "--model", "tests.models_train_mode:aux_head", "--input-shape", "16",
                 "--num-classes", "3"]) == 2
    err = capsys.readouterr().err
    assert "in training mode" in err and "Traceback" not in err


def test_the_look_in_training_mode_moves_no_statistic_no_mode_and_no_random_number() -> None:
    spec = _spec("dropout_and_stats")
    model = build(spec, 0)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    check_input(spec, model)
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training and all(m.training for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_zoo_model_outputs_logits_in_training_mode(name: str) -> None:
    spec = resolve_spec(name)
    check_input(spec, build(spec, 0))  # raises if not
