"""What a server tier holds between and during steps, measured with weak references (never with timing).

A tier caches each step's reply so that a retry gets the same one; once the next step is admitted that retry
is stale, so the reply's tensors (a relaying tier's input gradient) must not sit beside the next step's. A
U-shape forward keeps its output's graph until the backward, but not the output's bytes that no backward reads
(an op that reads them, a sigmoid or a ReLU, saved them itself). Models here are loaded by their path, as a
user's: a probe block reports what is alive while a tier runs it.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, tier_loads
from splitfed.engine.tier import Tier
from splitfed.engine.types import StepKey
from splitfed.engine.verify import verify
from splitfed.errors import FailedPrecondition, InvalidArgument
from splitfed.models.zoo import ZOO, ModelSpec, resolve_spec
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.server import serve_tier
from tests.test_invariance import spec_of

# ---------------------------------------------------------------- models (loaded by path, as a user's)

_WATCHED: list[weakref.ref[torch.Tensor]] = []  # what the probe looks at each time it runs
_ALIVE: list[bool] = []  # what it saw


class _Probe(nn.Module):
    """Passes its input on, noting whether the watched tensors are alive: it runs inside a tier's next step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _ALIVE.extend(w() is not None for w in _WATCHED)
        return x


def probed() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), _Probe(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


LAST_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # ops whose backward reads their output: autograd saves it, so it stays whatever the tier keeps
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "softmax": lambda h: h.softmax(-1),
    "relu": torch.relu, "relu_": torch.relu_,
    # ops whose backward does not: nothing but the tier itself held the output
    "linear": lambda h: h, "add": lambda h: h + 1, "view": lambda h: h.view(-1, 8),
}
SAVES_OUTPUT = {"sigmoid", "tanh", "exp", "softmax", "relu", "relu_"}
_SENT: list[StorageWeakRef] = []  # the bytes of each output of _Ends (expired: nothing holds them any more)


class _Ends(nn.Module):
    """A Linear and then ``last``: the whole of a tier's segment in the tests, so ``last`` is its last op."""

    def __init__(self, last: str) -> None:
        super().__init__()
        self.lin, self.last = nn.Linear(8, 8), last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = LAST_OPS[self.last](self.lin(x))
        _SENT.append(StorageWeakRef(out.untyped_storage()))
        return out


def ending(last: str) -> nn.Module:
    return nn.Sequential(nn.Linear(16, 8), _Ends(last), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _own(factory: str, **kwargs: object) -> ModelSpec:
    return resolve_spec(f"tests.test_tier_held_memory:{factory}", input_shape=(16,), num_classes=3, **kwargs)


# ---------------------------------------------------------------- the previous step's cached reply

LAYOUTS = {"relay": (False, (1, 4)), "ends": (False, (1,)), "u_shape": (True, (1, 4, 5))}  # probe: block 2


def _first_tier(layout: str) -> Tier:
    """The first server tier of ``layout``'s chain for client ``a``, its probe block in its segment."""
    u, cuts = LAYOUTS[layout]
    spec = _own("probed")
    loads = tier_loads(RoundConfig("run", 0, spec, u_shape=u), "a", cuts, initial_state(spec, 0))
    chain = inprocess_chain(len(loads))
    for tier, load in zip(chain.tiers, loads, strict=True):
        tier.load(load)
    assert isinstance(chain.tiers[0], Tier)
    return chain.tiers[0]


def _batch(seq: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seq)
    return torch.randn(batch, 8, generator=g), torch.randint(0, 3, (batch,), generator=g)


def _call(tier: Tier, layout: str, seq: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """Step ``seq`` as the device calls it; returns the tensor the tier caches for a retry (the input's gradient)."""
    key = StepKey("run", "a", 0, seq)
    if not LAYOUTS[layout][0]:
        return tier.step(key, x, y).grad
    out = tier.forward(key, x)
    return tier.backward(key, torch.ones_like(out))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=6)
@given(batch=st.integers(1, 5), steps=st.integers(2, 4))
def test_the_previous_reply_is_let_go_of_once_the_next_step_is_admitted(layout: str, batch: int,
                                                                         steps: int) -> None:
    tier = _first_tier(layout)
    _WATCHED.clear()
    _ALIVE.clear()
    held = []
    for seq in range(steps):
        reply = _call(tier, layout, seq, *_batch(seq, batch))
        assert reply is not None
        held.append(reply.numel() * reply.element_size())
        _WATCHED[:] = [weakref.ref(reply)]  # the probe looks at it while the next step runs on the tier
        del reply
    assert held == [batch * 8 * 4] * steps
    assert _ALIVE == [False] * (steps - 1), "the tier held its previous reply while the next step ran"
    _WATCHED.clear()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_retry_of_the_current_step_gets_its_reply_and_a_stale_one_is_refused(layout: str) -> None:
    tier = _first_tier(layout)
    (x0, y0), (x1, y1) = _batch(0, 4), _batch(1, 4)
    _call(tier, layout, 0, x0, y0)
    r1 = _call(tier, layout, 1, x1, y1)
    assert r1 is not None
    first = r1.numpy().tobytes()
    weights = tier.fetch("run", "a")
    if LAYOUTS[layout][0]:
        again = tier.backward(StepKey("run", "a", 0, 1), torch.ones(4, 8))  # the same request: its reply, bitwise
        assert again is not None and again.numpy().tobytes() == first
        with pytest.raises(FailedPrecondition, match="stale step 0"):
            tier.forward(StepKey("run", "a", 0, 0), x0)
        with pytest.raises(FailedPrecondition, match="without its forward"):
            tier.backward(StepKey("run", "a", 0, 0), torch.ones(4, 8))
        assert all(torch.equal(v, tier.fetch("run", "a")[k]) for k, v in weights.items())
        out = tier.forward(StepKey("run", "a", 0, 2), x0)  # a forward's reply: cached until its backward
        assert tier.forward(StepKey("run", "a", 0, 2), x0) is out
        assert tier.backward(StepKey("run", "a", 0, 2), torch.ones_like(out)) is not None
        return
    again = tier.step(StepKey("run", "a", 0, 1), x1, y1).grad  # the same request again: its reply, bitwise
    assert again is not None and again.numpy().tobytes() == first
    with pytest.raises(FailedPrecondition, match="another request"):
        tier.step(StepKey("run", "a", 0, 1), x0, y1)
    with pytest.raises(FailedPrecondition, match="stale step 0"):
        tier.step(StepKey("run", "a", 0, 0), x0, y0)
    assert all(torch.equal(v, tier.fetch("run", "a")[k]) for k, v in weights.items())  # nothing applied twice
    # a step admitted and then failing (its values overflow): the one before it is stale all the same, and the
    # failed one can be sent again
    with pytest.raises(InvalidArgument, match="not finite|NaN or infinite"):
        tier.step(StepKey("run", "a", 0, 2), torch.full((4, 8), 3e38), y0)
    with pytest.raises(FailedPrecondition, match="stale step 1"):
        tier.step(StepKey("run", "a", 0, 1), x1, y1)
    assert tier.step(StepKey("run", "a", 0, 2), x0, y0).grad is not None


# ---------------------------------------------------------------- a U-shape forward's output


@pytest.mark.parametrize("last", sorted(LAST_OPS))
def test_a_u_shape_forward_keeps_only_the_output_bytes_a_backward_reads(last: str) -> None:
    """Edge [1, 2) (the _Ends block) relays to the cloud over gRPC; while the client computes its tail, the edge
    holds its output's bytes only if its last op's backward reads them."""
    spec = _own("ending", last=last)
    edge_load, cloud_load = tier_loads(RoundConfig("run", 0, spec, u_shape=True), "a", (1, 2, 4),
                                       initial_state(spec, 0))
    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge, \
            GrpcTierClient(edge.address, retries=0) as device:
        edge.tier.load(edge_load)
        cloud.tier.load(cloud_load)
        for seq in range(2):
            _SENT.clear()
            x, _ = _batch(seq, 4)
            out = device.forward(StepKey("run", "a", 0, seq), x)
            # the young generations: what the forward made (nothing holds its output in a cycle: it passes with
            # no collection at all); a full collection walked a worker's whole heap, ~0.4 s twice a case
            gc.collect(1)
            (sent,) = _SENT
            assert sent.expired() is (last not in SAVES_OUTPUT), f"{last}: output held: {not sent.expired()}"
            assert device.backward(StepKey("run", "a", 0, seq), torch.ones_like(out)) is not None


def _u_cuts(n: int) -> st.SearchStrategy[tuple[int, ...]]:
    """U-shape cuts with two server tiers: each of them ends a forward somewhere in the model."""
    return st.tuples(st.integers(0, n), st.integers(0, n), st.integers(0, n)).map(lambda c: tuple(sorted(c)))


@pytest.mark.parametrize("last", sorted(LAST_OPS))
def test_u_shape_training_equals_the_unsplit_model_bitwise_whatever_a_tiers_last_op(last: str) -> None:
    r = verify(_own("ending", last=last), [(1, 2, 4), (0, 1, 2)], u_shape=True, steps=2, batch=3)
    assert r.max_abs_diff == 0.0


OWN = {"reused_activation": None, "reused_layer": None, "tied_sequential": None, "tied_traced": None,
       "tuple_between": None, "inplace_first": None, "batch_statistics": None, "tokens": 20}  # name: its vocab


@pytest.mark.parametrize("name", [*sorted(ZOO), *sorted(OWN)])
def test_u_shape_training_of_every_model_equals_the_unsplit_model_bitwise(name: str) -> None:
    spec = (spec_of(name) if name in ZOO else
            resolve_spec(f"tests.own_models:{name}", input_shape=(16,), num_classes=3, vocab=OWN[name]))
    n = template.num_blocks(spec)

    @settings(max_examples=8)
    @given(cuts=_u_cuts(n))
    def check(cuts: tuple[int, ...]) -> None:
        r = verify(spec, [cuts], u_shape=True, steps=2, batch=3)
        assert r.max_abs_diff == 0.0, f"{name} cuts {cuts}: {r.max_abs_diff}"

    check()
