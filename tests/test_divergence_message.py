"""A round that fails because training met NaN or infinite values says the training diverged, and what to lower.

Before: ``--weight-decay 1e30`` (or a huge ``--lr``) ended the run with "round 1: 0 of 2 clients finished ...
(failed: client0 (InvalidArgument: activation: contains NaN or infinite values), ...)": the edge's check of what
it is sent, naming the symptom, not that the run diverged nor what to do. The checks keep their words (a tier
still refuses a non-finite tensor it is sent, whoever sent it); the round's failure adds what they mean."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from splitfed.engine.rounds import (
    Outcome,
    RoundConfig,
    RoundFailed,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
)
from splitfed.engine.types import OptimConfig
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec
from splitfed.sim.inprocess import train_inprocess

SPEC = resolve_spec("cnn", num_classes=10)
NAN = "InvalidArgument: activation: contains NaN or infinite values"


def _batches(seed: int, n: int = 2, size: int = 4, shift: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, *SPEC.input_shape, generator=g), torch.randint(0, 10, (size,), generator=g) + shift)
            for _ in range(n)]


def _round(mode: str, optim: OptimConfig, clients: int = 2, shift: int = 0, poison: str = "") -> str:
    """One real round in this process through a 3-tier in-process chain; its RoundFailed message. ``shift``: added
    to every label (10: past the model's classes). ``poison``: a client whose trained device weights come back
    holding a NaN (as a diverged device's do)."""
    names = [f"c{i}" for i in range(clients)]
    chain = inprocess_chain()
    cfg = RoundConfig("div", 1, SPEC, mode, False, optim=optim, seed=5, binding_key="k")
    split = SplitRound(cfg, chain.tiers, initial_state(SPEC, 5), {c: (1, 3) for c in names})
    errors: dict[str, str] = {}  # why each client failed, as a ClientApp's error reply says
    train = local_trainer(chain, {c: _batches(i, shift=shift) for i, c in enumerate(names)}, failed=errors)

    def poisoned(cfg: RoundConfig, cuts: dict[str, tuple[int, ...]], weights: dict) -> dict[str, Outcome]:  # type: ignore[type-arg]
        out = train(cfg, cuts, weights)
        if poison in out:
            next(iter(out[poison].state.values())).view(-1)[0] = float("nan")
        return out

    with pytest.raises(RoundFailed) as e:
        drive(split, poisoned, lost=errors)
    return str(e.value)


def test_a_weight_decay_that_diverges_the_run_is_named_with_both_settings(tmp_path: Path) -> None:
    """The in-process engine, as ``splitfed simulate`` runs it: round 1's second step meets the activations of
    device weights the first step blew up."""
    s = RunSettings(clients=2, rounds=2, weight_decay=1e30, out=str(tmp_path / "run"))
    with pytest.raises(RoundFailed) as e:
        train_inprocess(s)
    assert str(e.value) == (f"round 1: 0 of 2 clients finished, fewer than the minimum 1 (failed: client0 ({NAN}), "
                            f"client1 ({NAN})); training diverged at round 1 (its loss or weights became NaN or "
                            "infinite): try a smaller lr (now 0.05) or weight-decay (now 1e+30)")


@pytest.mark.parametrize("mode", ["sflv1", "sflv2"])
def test_a_learning_rate_that_diverges_the_round_is_named_alone(mode: str) -> None:
    """Without weight decay, only the learning rate is there to lower."""
    msg = _round(mode, OptimConfig("sgd", 1e30))
    assert msg.startswith("round 1: 0 of 2 clients finished, fewer than the minimum 2 (failed: c0 (")
    assert msg.endswith("); training diverged at round 1 (its loss or weights became NaN or infinite): try a "
                        "smaller lr (now 1e+30)")


def test_device_weights_that_came_back_non_finite_are_a_divergence_too() -> None:
    msg = _round("sflv1", OptimConfig("sgd", 0.05, weight_decay=1e-4), poison="c1")
    assert msg.startswith("round 1: 1 of 2 clients finished, fewer than the minimum 2 (failed: c1 (its device "
                          "weights '")
    assert msg.endswith("' hold NaN or infinite values)); training diverged at round 1 (its loss or weights became "
                        "NaN or infinite): try a smaller lr (now 0.05) or weight-decay (now 0.0001)")


def test_a_round_that_fails_for_another_reason_does_not_say_diverged() -> None:
    """Labels past the model's classes are refused by the tier: nothing non-finite, so no advice about the lr."""
    msg = _round("sflv1", OptimConfig("sgd", 1e30), shift=10)
    bad = "InvalidArgument: labels must lie in 0..9"
    assert msg == f"round 1: 0 of 2 clients finished, fewer than the minimum 2 (failed: c0 ({bad}), c1 ({bad}))"
