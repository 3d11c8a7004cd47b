"""The chain's input takes the dtype the model's template declares, whichever tier holds block 0.

int32 token ids worked when the device held block 0 (``nn.Embedding`` takes int32) but a server tier holding
it refused them (``dtype int32 does not match the segment's int64``). Now the device casts integer ids to the
template's integer dtype at the chain's entry, once, for both; another kind of input (floats to a token model,
integers to a float model) is refused there, naming the model and both dtypes, unless the device runs block 0
and that block takes it (a user's model that casts its own input keeps working, as before). Real in-process
chains and real gRPC tiers on 127.0.0.1.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from splitfed.data import synthetic
from splitfed.engine.rounds import (
    Batches,
    Chain,
    RoundConfig,
    initial_state,
    inprocess_chain,
    run_round,
)
from splitfed.engine.types import OptimConfig, State
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.server import serve_tier

TOKENS = resolve_spec("transformer")
DEVICE_HOLDS_0, TIER_HOLDS_0 = (2,), (0,)
INT_DTYPES = (torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32)  # ids < vocab 17 fit


def _cfg(spec: ModelSpec) -> RoundConfig:
    return RoundConfig(f"dt-{uuid.uuid4().hex[:6]}", 1, spec, "sflv1", False, OptimConfig(lr=0.1), 0)


def _data(spec: ModelSpec, cast: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Batches]:
    x, y = synthetic(spec, 16, 5).tensors
    return {"c0": [(cast(x[:8]), y[:8]), (cast(x[8:]), y[8:])]}


def _inprocess(spec: ModelSpec, cuts: tuple[int, ...], data: dict[str, Batches]) -> State:
    return run_round(_cfg(spec), inprocess_chain(1), initial_state(spec, 0), {"c0": cuts}, data)[0]


def _grpc(spec: ModelSpec, cuts: tuple[int, ...], data: dict[str, Batches]) -> State:
    with serve_tier("cloud", insecure=True) as cloud, GrpcTierClient(cloud.address, retries=0) as c:
        return run_round(_cfg(spec), Chain([c], c), initial_state(spec, 0), {"c0": cuts}, data)[0]


def _same(a: State, b: State) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


_REFERENCE: dict[tuple[int, ...], State] = {}


def _reference(cuts: tuple[int, ...]) -> State:
    """The round on the loaders' int64 ids (the same whichever tier holds block 0)."""
    if cuts not in _REFERENCE:
        _REFERENCE[cuts] = _inprocess(TOKENS, cuts, _data(TOKENS, lambda x: x))
    return _REFERENCE[cuts]


@settings(max_examples=8, deadline=None)
@given(dtype=st.sampled_from(INT_DTYPES), cuts=st.sampled_from([DEVICE_HOLDS_0, TIER_HOLDS_0]))
def test_integer_ids_of_any_integer_dtype_train_bitwise_as_int64_in_process(dtype: torch.dtype,
                                                                            cuts: tuple[int, ...]) -> None:
    assert _same(_inprocess(TOKENS, cuts, _data(TOKENS, lambda x: x.to(dtype))), _reference(cuts))


@pytest.mark.parametrize("cuts", [DEVICE_HOLDS_0, TIER_HOLDS_0], ids=["device-holds-0", "tier-holds-0"])
def test_int32_ids_train_bitwise_as_int64_over_grpc(cuts: tuple[int, ...]) -> None:
    int64 = _grpc(TOKENS, cuts, _data(TOKENS, lambda x: x))
    int32 = _grpc(TOKENS, cuts, _data(TOKENS, lambda x: x.to(torch.int32)))
    assert _same(int32, int64) and _same(int64, _reference(cuts))
    assert _same(_reference(DEVICE_HOLDS_0), _reference(TIER_HOLDS_0))  # where block 0 runs changes nothing


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
@pytest.mark.parametrize("cuts", [DEVICE_HOLDS_0, TIER_HOLDS_0], ids=["device-holds-0", "tier-holds-0"])
@pytest.mark.parametrize("chain", [_inprocess, _grpc], ids=["in-process", "grpc"])
def test_a_non_integer_input_to_the_token_model_is_refused_at_the_entry_naming_it(
        chain: Callable[..., State], cuts: tuple[int, ...], dtype: torch.dtype) -> None:
    """Not a RuntimeError from inside nn.Embedding (block 0 on the device), nor a tier's InvalidArgument."""
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ConfigError, match=rf"^model 'transformer' takes int64 inputs, got {name}: give it token "
                                          r"ids of an integer dtype \(they are cast to int64\)$"):
        chain(TOKENS, cuts, _data(TOKENS, lambda x: x.to(dtype)))


@pytest.mark.parametrize("cuts", [DEVICE_HOLDS_0, TIER_HOLDS_0], ids=["device-holds-0", "tier-holds-0"])
def test_uint64_ids_are_refused_not_wrapped(cuts: tuple[int, ...]) -> None:
    """int64 does not hold every uint64: a cast could wrap an id into another, so the dtype is refused (it was
    before too: nn.Embedding takes no uint64, nor does a tier's check)."""
    with pytest.raises(ConfigError, match=r"^model 'transformer' takes int64 inputs, got uint64: give it token ids "
                                          "of an integer dtype that int64 holds every value of$"):
        _inprocess(TOKENS, cuts, _data(TOKENS, lambda x: x.to(torch.uint64)))


@pytest.mark.parametrize("cuts", [DEVICE_HOLDS_0, TIER_HOLDS_0], ids=["device-holds-0", "tier-holds-0"])
def test_uint8_images_to_a_float_zoo_model_stay_refused_now_with_the_message(cuts: tuple[int, ...]) -> None:
    """Refused before too (a conv's RuntimeError, or the tier's dtype check): one refusal for both now."""
    cnn = resolve_spec("cnn")
    with pytest.raises(ConfigError, match=r"^model 'cnn' takes float32 inputs, got uint8: give it float32"):
        _inprocess(cnn, cuts, _data(cnn, lambda x: (x.abs() * 50).to(torch.uint8)))


class _Scale(nn.Module):
    """A user's first block that takes uint8 images itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() / 255


def bytes_net() -> nn.Module:
    return nn.Sequential(_Scale(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_a_first_block_that_takes_uint8_keeps_taking_it_on_the_device() -> None:
    """A working path kept: uint8 to a float model whose block 0 casts it, on the device, trains as its own
    float conversion does; with block 0 on a tier (refused before, by the tier) it is refused at the entry."""
    spec = resolve_spec("tests.test_token_dtype:bytes_net", (6,), 3)
    as_bytes = _data(spec, lambda x: (x.abs() * 50).clamp(max=255).to(torch.uint8))
    as_floats: dict[str, Batches] = {c: [(x.float(), y) for x, y in b] for c, b in as_bytes.items()}
    assert _same(_inprocess(spec, (1,), as_bytes), _inprocess(spec, (1,), as_floats))
    with pytest.raises(ConfigError, match=r"^model 'tests.test_token_dtype:bytes_net' takes float32 inputs, got "
                                          "uint8"):
        _inprocess(spec, (0,), as_bytes)
