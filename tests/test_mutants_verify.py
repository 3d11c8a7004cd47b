"""What the mutation run of splitfed/engine/verify.py found no test for: the comparison of two states (keys
that differ, empty tensors), the verdict at exactly the documented tolerance, and what a caller's own data
function is asked for (by default too): no test passed one."""

from __future__ import annotations

import pytest
import torch

from splitfed.data import synthetic
from splitfed.engine.verify import TOLERANCE, VerifyResult, max_abs_diff, verify
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("mlp")


def test_states_with_other_keys_are_refused_naming_the_first_five_that_differ() -> None:
    a = {f"k{i}": torch.zeros(1) for i in range(8)}
    b = {f"k{i}": torch.zeros(1) for i in range(2)} | {"extra": torch.zeros(1)}
    with pytest.raises(AssertionError, match=r"state keys differ: \['extra', 'k2', 'k3', 'k4', 'k5'\]$"):
        max_abs_diff(a, b)


def test_the_largest_difference_over_every_tensor_and_none_from_an_empty_one() -> None:
    a = {"w": torch.tensor([1.0, -2.0]), "empty": torch.zeros(0), "n": torch.tensor([3], dtype=torch.int64)}
    b = {"w": torch.tensor([1.25, -2.0]), "empty": torch.zeros(0), "n": torch.tensor([3], dtype=torch.int64)}
    assert max_abs_diff(a, b) == 0.25
    assert max_abs_diff({"empty": torch.zeros(0)}, {"empty": torch.zeros(0)}) == 0.0


def test_a_difference_of_exactly_the_tolerance_agrees() -> None:
    """README: verify exits 0 when split and whole training agree within 1e-5."""
    assert TOLERANCE == 1e-5

    def result(diff: float) -> VerifyResult:
        return VerifyResult("mlp", [[2]], "sflv1", 2, False, 1, 1, 2, diff, TOLERANCE, "inproc")

    assert result(1e-5).ok and result(0.0).ok and not result(1.0000001e-5).ok
    assert result(1e-5).to_dict()["ok"] is True and result(2e-5).to_dict()["ok"] is False


def test_a_data_function_is_asked_for_each_clients_samples_under_its_own_seed() -> None:
    """``data_fn(n, seed)``: steps x batch samples, seed ``seed * 1000 + i`` for client i; by default 2 steps of
    4 samples, seed 0, one round. What it gives is what both sides train on: split equals whole."""
    asked: list[tuple[int, int]] = []

    def data_fn(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        asked.append((n, seed))
        return synthetic(SPEC, n, seed).tensors

    got = verify(SPEC, [(2,), (1,)], data_fn=data_fn)
    assert asked == [(8, 0), (8, 1)]
    assert (got.steps, got.rounds, got.clients) == (2, 1, 2) and got.ok
    asked.clear()
    assert verify(SPEC, [(2,), (1,), (3,)], steps=3, batch=2, seed=7, data_fn=data_fn).ok
    assert asked == [(6, 7000), (6, 7001), (6, 7002)]
