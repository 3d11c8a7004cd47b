"""Boundary tensors of any dtype are priced as the codec sends them.

The cost model counted every boundary as float32 (4 bytes a value) and guessed which boundaries
were floating (all but a token model's input). A user's float64, bfloat16 or float16 model, or one
with an integer tensor past its input, was mispriced under every lossy codec. The profiler now
records each boundary's dtype, and the bytes priced for a message are checked here against what
:mod:`splitfed.transport.codec` encodes for the real tensor the model produces at that cut.

The models are defined here and loaded by ``module:factory`` path, as a user's would be.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from splitfed.cost import Scenario, client_cost, wire_bytes
from splitfed.cost.model import LABEL_BYTES
from splitfed.cost.wire import codec_rules
from splitfed.engine import template
from splitfed.errors import ConfigError
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from splitfed.profile.profiler import profile_model
from splitfed.transport import codec as tc

CODECS = ("none", "fp16", "int8", "topk:0.1")
CLASSES = 3
EDGE = TierProfile(1e10, 1e12)
LINK = LinkProfile(1e6, 1e6, 0.01)


# ---------------------------------------------------------------- the models


class _To(nn.Module):
    """Casts its input: where a model changes dtype (a parameter-free block)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


def _cast_net(dtype: torch.dtype, features: int, width: int) -> nn.Module:
    """float32 in, two ``dtype`` layers, float32 out: boundaries f32, dtype x4, f32, f32."""
    return nn.Sequential(_To(dtype), nn.Linear(features, width, dtype=dtype), nn.ReLU(),
                         nn.Linear(width, width, dtype=dtype), _To(torch.float32), nn.Linear(width, CLASSES))


def float64_net(features: int = 6, width: int = 5) -> nn.Module:
    return _cast_net(torch.float64, features, width)


def bfloat16_net(features: int = 6, width: int = 5) -> nn.Module:
    return _cast_net(torch.bfloat16, features, width)


def float16_net(features: int = 6, width: int = 5) -> nn.Module:
    return _cast_net(torch.float16, features, width)


class _Clamp(nn.Module):
    """Token ids in, token ids out: an integer boundary that is not the input."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(0, self.tokens - 1)


def token_net(tokens: int = 11, seq: int = 6, width: int = 5) -> nn.Module:
    """int64 ids in, int64 after the first block, then float32 embeddings."""
    return nn.Sequential(_Clamp(tokens), nn.Embedding(tokens, width), nn.Flatten(), nn.ReLU(),
                         nn.Linear(seq * width, CLASSES))


class _Ids(nn.Module):
    """A learned block whose output is token ids: an integer boundary after a block with parameters, so no
    gradient comes back through it (the cost model priced one)."""

    def __init__(self, features: int, tokens: int) -> None:
        super().__init__()
        self.lin = nn.Linear(features, features)
        self.tokens = tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).abs().long().clamp(0, self.tokens - 1)


def ids_net(features: int = 6, width: int = 5, tokens: int = 11) -> nn.Module:
    return nn.Sequential(_Ids(features, tokens), nn.Embedding(tokens, width), nn.Flatten(), nn.ReLU(),
                         nn.Linear(features * width, CLASSES))


MODELS = ("float64_net", "bfloat16_net", "float16_net", "token_net", "ids_net")
OWN = {"float64_net": "float64", "bfloat16_net": "bfloat16", "float16_net": "float16"}


def _spec(model: str, features: int, width: int) -> ModelSpec:
    path = f"tests.test_boundary_dtype:{model}"
    if model == "token_net":
        return resolve_spec(path, input_shape=(features,), num_classes=CLASSES, vocab=11,
                            tokens=11, seq=features, width=width)
    return resolve_spec(path, input_shape=(features,), num_classes=CLASSES, features=features, width=width)


def _boundaries(spec: ModelSpec, batch: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The real tensor at every boundary 0..L (the input, then each block's output) for one batch, and the
    gradient of the loss with respect to it (None where it is not floating), as the engine's blocks run."""
    blocks = template.copy_blocks(spec, 0, template.num_blocks(spec))
    x = spec.example_input(batch)
    y = torch.randint(0, CLASSES, (batch,), generator=torch.Generator().manual_seed(1))
    acts = [x]
    for i in range(len(blocks)):
        acts.append(blocks[i](acts[-1]).detach())
    out: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for k, a in enumerate(acts):
        if not a.is_floating_point():
            out.append((a, None))
            continue
        h = a.clone().requires_grad_(True)
        z = h
        for i in range(k, len(blocks)):
            z = blocks[i](z)
        F.cross_entropy(z.float(), y).backward()
        assert h.grad is None or h.grad.dtype == a.dtype  # None: no path back (through ids_net's token ids)
        out.append((a, h.grad))
    return out


def _sent(t: torch.Tensor, codec: str) -> int:
    n = tc.encode(t, codec).nbytes
    assert n == len(bytes(tc.encode(t, codec).payload))
    return n


def _check(model: str, features: int, width: int, batch: int) -> ModelProfile:
    """Profile the model and check, under every codec and at every cut, the priced bytes of one batch's
    messages (activation up, with its labels; gradient down) against what the codec encodes."""
    spec = _spec(model, features, width)
    prof = profile_model(spec, batch=batch, reps=1, use_cache=False)
    real = _boundaries(spec, batch)
    assert prof.dtypes == tuple(str(a.dtype).removeprefix("torch.") for a, _ in real)
    client = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=batch)  # one batch a round
    labels = torch.zeros(batch, dtype=torch.int64)
    bound = (prof.input_bytes, *prof.out_bytes)
    for codec in CODECS:
        sc = Scenario(prof, (client,), (EDGE,), batch=batch, codec=codec)
        for k, (act, grad) in enumerate(real):
            size = prof.float_itemsize[k]
            # the one pricing function, boundary by boundary (the last one: the model's output, which a
            # U-shape sends back down)
            assert float(wire_bytes(codec, bound[k], batch, itemsize=size)) == _sent(act, codec)
            if grad is not None:
                assert float(wire_bytes(codec, bound[k], batch, itemsize=size)) == _sent(grad, codec)
            if k == prof.n_blocks:
                continue  # everything on the device: nothing crosses
            c = client_cost(sc, client, (k,))
            assert c.up_bytes == (_sent(act, codec) + _sent(labels, codec),), (model, codec, k)
            assert batch * LABEL_BYTES == _sent(labels, codec)
            trains_before = sum(prof.param_bytes[:k]) > 0
            assert c.down_bytes == ((_sent(grad, codec) if trains_before and grad is not None else 0),), \
                (model, codec, k)
    return prof


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("model", MODELS)
@settings(max_examples=25)
@given(features=st.integers(1, 12), width=st.integers(1, 9), batch=st.integers(1, 9))
def test_priced_bytes_equal_the_encoded_boundary_tensors(model: str, features: int, width: int, batch: int) -> None:
    """float64, bfloat16, float16 and integer-token models, any shape and batch: under none, fp16, int8 and
    topk:0.1, the bytes the cost model prices for one batch's activation and gradient at each cut are the
    bytes the codec encodes for the real tensors there."""
    prof = _check(model, features, width, batch)
    if model in OWN:  # what the profiler saw: float32 in, the model's own dtype inside, float32 out
        assert prof.dtypes == ("float32", *[OWN[model]] * 4, "float32", "float32")
    elif model == "token_net":
        assert prof.dtypes[:3] == ("int64", "int64", "float32")
        assert prof.float_itemsize[:3] == (0.0, 0.0, 4.0)
    else:  # ids_net: float32 in, token ids after a block with parameters
        assert prof.dtypes[:3] == ("float32", "int64", "float32")
        assert prof.float_itemsize[:3] == (4.0, 0.0, 4.0)


@pytest.mark.parametrize("model", MODELS)
def test_priced_bytes_equal_what_the_in_process_link_counts(model: str) -> None:
    """The same models through a real 2-tier in-process chain (a full batch and a short one): what the link
    counts, activations, gradients and U-shape tails alike, is what the cost model prices, at every cut
    the cost model offers (a U-shape whose tail starts at an integer boundary is not one: see below)."""
    from splitfed.cost.model import cut_options
    from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
    from splitfed.transport import compress

    spec, B = _spec(model, 5, 4), 6
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    state = initial_state(spec, 0)
    x = spec.example_input(B + 2)
    y = torch.randint(0, CLASSES, (B + 2,), generator=torch.Generator().manual_seed(0))
    batches = [(x[:B], y[:B]), (x[B:], y[B:])]
    client = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=B + 2)
    L = prof.n_blocks
    every = [(False, tuple(map(int, c))) for c in cut_options(L, 2)]
    every += [(True, tuple(map(int, c)))
              for c in Scenario(prof, (client,), (EDGE,), batch=B, u_shape=True).options]
    for codec in CODECS:
        for u, cuts in every:
            chain = inprocess_chain(1, *compress.get(codec))
            _, res = run_round(RoundConfig("r", 1, spec, "sflv1", u_shape=u), chain, state, {"c": cuts},
                               {"c": batches})
            c = client_cost(Scenario(prof, (client,), (EDGE,), batch=B, u_shape=u, codec=codec), client, cuts)
            assert (c.up_bytes, c.down_bytes) == ((res[0].bytes_up,), (res[0].bytes_down,)), (codec, u, cuts)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("codec", [*CODECS, "topk:0.37", "topk:1", "topk:0.001"])
@settings(max_examples=15)
@given(shape=st.lists(st.integers(0, 9), min_size=1, max_size=3), samples=st.integers(1, 7))
def test_wire_bytes_prices_every_dtype_the_wire_carries(dtype: torch.dtype, codec: str, shape: list[int],
                                                        samples: int) -> None:
    """``wire_bytes`` with a tensor's element size (0 when not floating) is the length of its encoding (a
    message of one sample or more: 0 samples is no message, as a round without a short batch sends none)."""
    t = (torch.randn(samples, *shape) * 3).to(dtype)
    per_sample = float(np.prod(shape)) * t.element_size()
    size = float(t.element_size()) if dtype.is_floating_point else 0.0
    assert float(wire_bytes(codec, per_sample, samples, itemsize=size)) == _sent(t, codec)


def test_codec_rules_come_from_the_codec() -> None:
    """The per-value sizes are read off ``payload_size`` (no second table), one rule per element size."""
    for kind in ("none", "fp16", "int8", "topk"):
        rules = codec_rules(kind)
        assert sorted(rules) == [2.0, 4.0, 8.0]
        for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            head, per = rules[float(d.itemsize)]
            for n in (0, 1, 5, 1000):
                assert head + n * per == tc.payload_size(d, (n,), tc.Codec(kind))
    with pytest.raises(ConfigError, match="no floating dtype the wire carries has values of 3 bytes"):
        wire_bytes("fp16", 6.0, 2, itemsize=3.0)


def test_a_profile_without_dtypes_is_float32_and_token_ids_stay_exact() -> None:
    """Synthetic profiles, and a profile's JSON written before dtypes were recorded, price as before:
    float32 everywhere, but a token model's input (``spec.vocab``) is int64 ids, sent exactly."""
    syn = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800)
    assert syn.dtypes == ("float32",) * 3 and syn.float_itemsize == (4.0,) * 3
    tokens = dataclasses.replace(syn, spec={"name": "t", "vocab": 17})
    assert tokens.dtypes == ("int64", "float32", "float32") and tokens.float_itemsize[0] == 0.0
    old: dict[str, Any] = tokens.to_dict()
    del old["input_dtype"], old["out_dtype"]
    old["version"] = 2
    assert ModelProfile.from_dict(old) == tokens
    measured = dataclasses.replace(syn, input_dtype="float64", out_dtype=("bfloat16", "int32"))
    assert ModelProfile.from_dict(measured.to_dict()) == measured
    assert measured.float_itemsize == (8.0, 2.0, 0.0)
    with pytest.raises(ConfigError, match="'float33' is not a torch dtype"):
        dataclasses.replace(syn, out_dtype=("float32", "float33"))
    with pytest.raises(ConfigError, match="out_dtype has 1 entries for 2 blocks"):
        dataclasses.replace(syn, out_dtype=("float32",))


def test_a_u_shape_tail_cannot_start_at_an_integer_tensor_from_the_servers() -> None:
    """token_net's block 0 outputs token ids: a U-shape tail starting there (cuts 0,1) had the device ask an
    int64 tensor for a gradient, and torch's error failed the client in round 1. The cost model no longer
    offers that option (the optimizer never picks it), a static one is refused naming the boundary, and the
    engine says the same if given it; a tail at the model's input (all on the device) stays legal."""
    from splitfed.cost.model import cut_options
    from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
    from splitfed.errors import CutError

    spec, B = _spec("token_net", 5, 4), 6
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    assert prof.dtypes[1] == "int64"
    client = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=B)
    sc = Scenario(prof, (client,), (EDGE,), batch=B, u_shape=True)
    offered = {tuple(map(int, c)) for c in sc.options}
    every = {tuple(map(int, c)) for c in cut_options(prof.n_blocks, 2, u_shape=True)}
    assert every - offered == {(0, 1)}
    with pytest.raises(CutError, match="cuts 0,1: the U-shape tail starts at boundary 1, a int64 tensor: no "
                                       "gradient can go back to the servers' blocks"):
        sc.check_cuts((0, 1))
    assert sc.check_cuts((0, 0)) == (0, 0) and sc.check_cuts((1, 1)) == (1, 1)  # on the device alone
    x = spec.example_input(B)
    y = torch.randint(0, CLASSES, (B,), generator=torch.Generator().manual_seed(0))
    chain = inprocess_chain(1)
    with pytest.raises(CutError, match="c: the U-shape tail's input is a torch.int64 tensor"):
        run_round(RoundConfig("r", 1, spec, "sflv1", u_shape=True), chain, initial_state(spec, 0),
                  {"c": (0, 1)}, {"c": [(x, y)]})
    assert chain.tiers[0].clients() == 0  # nothing left held
