"""Pins what a mutation run of engine/device.py and engine/link.py found unpinned: the device's measured
compute and link seconds (exact, from a scripted clock), its training-accuracy count, its weight checks, and
the link's id and dimension limits at their edges."""

from __future__ import annotations

import math

import pytest
import torch

from splitfed.engine.device import Device, entry_input
from splitfed.engine.limits import MAX_DIMS
from splitfed.engine.link import (
    MAX_ID,
    InProcessLink,
    check_ids,
    check_reduce,
    check_replica,
    nbytes,
)
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, tier_loads
from splitfed.engine.types import StepKey, StepReply
from splitfed.errors import ConfigError, InvalidArgument
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("mlp")  # 5 blocks; block 4 is the classifier (4.weight, 4.bias)
CLASS = 3


class Script:
    """A clock that answers the given times in turn and says if the device asked more or fewer times."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


class NoLink:
    """A link a step that never leaves the device must not use."""

    def step(self, key: StepKey, activation: torch.Tensor, labels: torch.Tensor) -> StepReply:
        raise AssertionError("a local step called the link")

    def forward(self, key: StepKey, activation: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a local step called the link")

    def backward(self, key: StepKey, grad: torch.Tensor | None) -> torch.Tensor | None:
        raise AssertionError("a local step called the link")


def _fixed_classifier() -> dict[str, torch.Tensor]:
    """Weights whose logits are the same for every input: class CLASS wins, by a known margin."""
    state = initial_state(SPEC, 0)
    state["4.weight"] = torch.zeros_like(state["4.weight"])
    bias = torch.zeros_like(state["4.bias"])
    bias[CLASS] = 2.0
    state["4.bias"] = bias
    return state


def _labels(n: int, k: int) -> torch.Tensor:
    """n labels, exactly k of them CLASS."""
    return torch.tensor([CLASS] * k + [(CLASS + 1) % 10] * (n - k))


def _expected_loss(n: int, k: int) -> float:
    """Cross-entropy of logits (0, .., 2 at CLASS, .., 0) over n labels, k of them CLASS."""
    z = math.log(9 + math.exp(2.0))
    return (k * (z - 2.0) + (n - k) * z) / n


def _served(u_shape: bool, cuts: tuple[int, ...], state: dict[str, torch.Tensor]) -> Device:
    chain = inprocess_chain(1)
    cfg = RoundConfig("run", 0, SPEC, u_shape=u_shape)
    (load,) = tier_loads(cfg, "c", cuts, state)
    chain.tiers[0].load(load)
    return Device(SPEC, chain.link, run_id="run", client_id="c", round=0, cuts=cuts, state=state,
                  u_shape=u_shape)


def _x(n: int) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(n))


def test_plain_step_splits_its_time_into_compute_and_link(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _served(False, (2,), initial_state(SPEC, 0))
    assert (dev.compute_s, dev.link_s) == (0.0, 0.0)
    # t0 (start), t1 (head done), t2 (link answered), t4 (optimizer done)
    clock = Script(0.0, 1.0, 4.0, 10.0, 20.0, 22.0, 27.0, 28.0)
    monkeypatch.setattr(dev, "_now", clock)
    dev.train_step(_x(4), _labels(4, 1))
    assert (dev.compute_s, dev.link_s) == (7.0, 3.0)
    dev.train_step(_x(4), _labels(4, 1))
    assert (dev.compute_s, dev.link_s) == (7.0 + 3.0, 3.0 + 5.0)
    assert clock.times == []


def test_u_shape_step_counts_both_link_calls_and_the_tail_as_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _served(True, (2, 3), _fixed_classifier())
    # t0, t1 (head), t2 (forward answered), t3 (tail done), backward answered, t4 (optimizer done)
    clock = Script(0.0, 1.0, 3.0, 6.0, 10.0, 15.0)
    monkeypatch.setattr(dev, "_now", clock)
    loss, correct = dev.train_step(_x(5), _labels(5, 2))
    # link: (3 - 1) forward + (10 - 6) backward; compute: the rest of 15
    assert (dev.compute_s, dev.link_s) == (9.0, 6.0)
    assert clock.times == []
    assert correct == 2
    assert loss == pytest.approx(_expected_loss(5, 2), rel=1e-5)


@pytest.mark.parametrize("u_shape, cuts", [(False, (5,)), (True, (2, 2))])
def test_local_step_is_all_compute_and_counts_its_correct_predictions(
        monkeypatch: pytest.MonkeyPatch, u_shape: bool, cuts: tuple[int, ...]) -> None:
    dev = Device(SPEC, NoLink(), run_id="run", client_id="c", round=0, cuts=cuts, state=_fixed_classifier(),
                 u_shape=u_shape)
    assert dev.local
    clock = Script(2.0, 3.5, 7.0)  # t0, t1 (head done), t4 (optimizer done)
    monkeypatch.setattr(dev, "_now", clock)
    loss, correct = dev.train_step(_x(5), _labels(5, 1))
    assert (dev.compute_s, dev.link_s) == (5.0, 0.0)
    assert correct == 1
    assert loss == pytest.approx(_expected_loss(5, 1), rel=1e-5)


def test_state_is_a_copy_and_a_step_leaves_no_gradient_behind() -> None:
    dev = Device(SPEC, NoLink(), run_id="run", client_id="c", round=0, cuts=(5,), state=initial_state(SPEC, 0))
    before = dev.state()
    kept = {k: v.clone() for k, v in before.items()}
    dev.train_step(_x(4), _labels(4, 2))
    after = dev.state()
    assert all(torch.equal(before[k], kept[k]) for k in kept)  # what state() returned did not move
    assert not torch.equal(before["1.0.weight"], after["1.0.weight"])  # the step did move the weights
    assert all(p.grad is None for p in dev.head.parameters())  # zero_grad(set_to_none=True)


def test_default_seed_is_zero() -> None:
    """The device's dropout masks draw from its seed: omitted, it is 0, as a round's default."""
    runs = []
    for kw in ({}, {"seed": 0}):
        dev = Device(SPEC, NoLink(), run_id="run", client_id="c", round=0, cuts=(5,),
                     state=initial_state(SPEC, 0), **kw)  # type: ignore[arg-type]
        dev.train_step(_x(8), _labels(8, 3))
        runs.append(dev.state())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


@pytest.mark.parametrize("bad, words", [
    (torch.zeros(10, 63), "device weights '4.weight': float32 [10, 63], but model 'mlp' has float32 [10, 64]"),
    (torch.zeros(10, 64, dtype=torch.float64), "'4.weight': float64 [10, 64], but model 'mlp' has float32"),
])
def test_device_names_a_weight_of_another_shape_or_dtype(bad: torch.Tensor, words: str) -> None:
    state = initial_state(SPEC, 0)
    state["4.weight"] = bad
    with pytest.raises(ConfigError) as e:
        Device(SPEC, NoLink(), run_id="run", client_id="c", round=0, cuts=(5,), state=state)
    assert words in str(e.value)


def test_token_ids_of_another_integer_dtype_are_cast_to_the_first_blocks() -> None:
    spec = resolve_spec("transformer")
    ids = torch.randint(0, 17, (2, 64), dtype=torch.int32)
    out = entry_input(spec, ids, first_block_here=False)
    assert out.dtype == torch.int64
    assert torch.equal(out, ids.long())


# ---------------------------------------------------------------- link.py


IDS = {"run_id": "r", "client_id": "c", "secret": "s"}
REPLICA = {"replica": "r", "base": "", "base_secret": ""}


@pytest.mark.parametrize("check, given, field, words", [
    *((check_ids, IDS, f, f"{f} must have .*{MAX_ID} characters, got {MAX_ID + 1}") for f in IDS),
    *((check_replica, REPLICA, f, f"{f} must have") for f in REPLICA)])
def test_id_fields_take_max_id_characters_and_refuse_one_more(check, given, field, words):  # type: ignore[no-untyped-def]
    check(**{**given, field: "x" * MAX_ID})
    with pytest.raises(InvalidArgument, match=words):
        check(**{**given, field: "x" * (MAX_ID + 1)})


def test_reduce_run_id_edges() -> None:
    check_reduce("x" * MAX_ID, [], "cloud", 0)
    for bad in ("", "x" * (MAX_ID + 1)):
        with pytest.raises(InvalidArgument,
                           match=f"^reduce: run_id must have 1..{MAX_ID} characters, got {len(bad)}$"):
            check_reduce(bad, [], "cloud", 0)


def test_nbytes_and_dims_that_cross() -> None:
    assert nbytes(None) == 0
    assert nbytes(torch.zeros(3, 5, dtype=torch.float16)) == 30
    InProcessLink._crossing(torch.zeros([1] * MAX_DIMS))
    with pytest.raises(InvalidArgument, match=f"{MAX_DIMS + 1} dimensions cannot travel"):
        InProcessLink._crossing(torch.zeros([1] * (MAX_DIMS + 1)))


def test_inprocess_fetch_returns_the_tiers_weights() -> None:
    state = initial_state(SPEC, 0)
    dev = _served(False, (2,), state)
    assert isinstance(dev.link, InProcessLink)
    got = dev.link.fetch("run", "c")
    assert set(got) == {k for k in state if not k.startswith(("0.", "1."))}
    assert all(torch.equal(got[k], state[k]) for k in got)
