"""A U-shape tail fed by the servers computes its input's gradient (it sends it back up), even when no block
before it trains: the profile measures each block's backward with an input gradient too
(``ModelProfile.grad_bwd_flops``, ``grad_act_bytes``) and the cost model prices such a tail with it.

The check is against the engine itself: every FLOP ``torch.utils.flop_counter`` sees in a real round through a
real 3-tier in-process chain (every tier runs in this process) is priced, for every cut vector, with and without
U-shape. Before, a tail after a frozen front (nothing before it trains) was priced without its input gradient.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from splitfed.cost import Scenario, client_cost
from splitfed.cost.model import cut_options
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, run_round
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile import Client, LinkProfile, TierProfile
from splitfed.profile.profiler import ModelProfile, profile_model

CLASSES = 3
EDGE, CLOUD = TierProfile(1e10, 1e12), TierProfile(1e11, 1e12)
LINK, EDGE_LINK = LinkProfile(1e6, 1e6, 0.01), LinkProfile(1e7, 1e7, 0.005)
INPUT = {"frozen_backbone": (1, 4, 4)}
# frozen fronts (nothing trains before block 2, 4 and 2), and controls where block 0 trains
MODELS = ("frozen_first", "frozen_backbone", "tied_frozen", "tied", "frozen_middle")


def _spec(model: str) -> ModelSpec:
    return resolve_spec(f"tests.test_frozen_params:{model}", input_shape=INPUT.get(model, (6,)),
                        num_classes=CLASSES)


def _batches(spec: ModelSpec, B: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x = spec.example_input(B + 2)
    y = torch.randint(0, CLASSES, (B + 2,), generator=torch.Generator().manual_seed(0))
    return [(x[:B], y[:B]), (x[B:], y[B:])]


@pytest.mark.parametrize("model", MODELS)
def test_every_flop_of_a_real_round_is_priced(model: str) -> None:
    spec, B = _spec(model), 4
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    state = initial_state(spec, 0)
    batches = _batches(spec, B)
    dev = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=B + 2)
    L = prof.n_blocks
    # once first: a process sizes a model's boundaries and tries one sample on it (cached forward passes)
    run_round(RoundConfig("r", 1, spec, "sflv1"), inprocess_chain(2), state, {"c": (0, 0)}, {"c": batches})
    fed_tails = 0
    for u in (False, True):
        sc = Scenario(prof, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B, u_shape=u)
        for cuts in (tuple(map(int, c)) for c in cut_options(L, 3, u_shape=u)):
            with FlopCounterMode(display=False) as fc:
                run_round(RoundConfig("r", 1, spec, "sflv1", u_shape=u), inprocess_chain(2), state, {"c": cuts},
                          {"c": batches})
            c = client_cost(sc, dev, cuts)
            assert sum(c.flops) == fc.get_total_flops(), (u, cuts)
            fed_tails += u and cuts[0] < cuts[-1] < L and sum(prof.train_bytes[:cuts[-1]]) == 0
    assert (fed_tails > 0) == model.startswith(("frozen_first", "frozen_backbone", "tied_frozen"))


def test_the_profile_keeps_the_backward_with_an_input_gradient_beside() -> None:
    """frozen_first (frozen Linear, ReLU, Linear, ReLU, Linear): blocks 0-2 have nothing trainable before them,
    so with an input gradient the frozen Linear computes one (2 x 6 x 8 FLOPs a sample) and the Linear of
    block 2 one more (2 x 8 x 8); ReLU counts no FLOPs but then keeps its output for backward. From block 3 on
    the two agree."""
    prof = profile_model(_spec("frozen_first"), batch=4, reps=1, use_cache=False)
    assert prof.bwd_flops[0] == 0 and prof.grad_bwd_flops[0] == 2 * 6 * 8
    assert prof.grad_bwd_flops[2] == prof.bwd_flops[2] + 2 * 8 * 8
    assert prof.act_bytes[1] == 0 < prof.grad_act_bytes[1]
    assert prof.grad_bwd_flops[3:] == prof.bwd_flops[3:] and prof.grad_act_bytes[3:] == prof.act_bytes[3:]
    syn = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800)
    assert syn.grad_bwd_flops == syn.bwd_flops and syn.grad_act_bytes == syn.act_bytes  # as it was priced


def test_a_fed_tail_is_priced_with_its_input_gradient_a_local_one_without() -> None:
    """Compute and memory of the device under U-shape cuts of frozen_first: a tail the servers feed (k_1 < u)
    costs the input-gradient figures; one the head feeds directly (k_1 = u: the device trains alone) does not
    (its input needs no gradient: nothing before it trains)."""
    spec, B = _spec("frozen_first"), 4
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    dev = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=B)
    sc = Scenario(prof, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B, u_shape=True)
    L = prof.n_blocks
    fed, local = client_cost(sc, dev, (0, 0, 1)), client_cost(sc, dev, (1, 1, 1))
    grad_work = sum(prof.fwd_flops[1:]) + sum(prof.grad_bwd_flops[1:])
    plain_work = sum(prof.fwd_flops[1:]) + sum(prof.bwd_flops[1:])
    assert grad_work > plain_work
    assert fed.flops[0] == pytest.approx(B * grad_work)
    assert local.flops[0] == pytest.approx(B * (plain_work + prof.fwd_flops[0] + prof.bwd_flops[0]))
    twice = sum(b for j, _, b in prof.grad_shared_act if j >= 1)  # kept by two of the tail's blocks: once
    assert twice > 0
    # the tail's blocks keep a clone of the tensor the servers send (it needs a gradient): held besides
    assert fed.act_memory[0] == pytest.approx(B * (sum(prof.grad_act_bytes[1:L]) - twice + prof.input_bytes
                                                   + prof.out_bytes[0]))


def inplace_front() -> torch.nn.Module:
    """An in-place ReLU first: measured with an input gradient it would write a leaf that needs one."""
    from torch import nn

    return nn.Sequential(nn.ReLU(inplace=True), nn.Linear(16, 8), nn.ReLU(inplace=True), nn.Linear(8, CLASSES))


@pytest.mark.parametrize("name", ["tests.own_models:inplace_first", "tests.test_tail_input_grad:inplace_front"])
def test_an_in_place_first_op_is_profiled_as_a_tier_runs_it(name: str) -> None:
    """A tier clones an input that needs a gradient before its first block (``Segment.forward``), so an in-place
    first op may run there; the profiler does the same (it failed on such a block with an input gradient), and
    what it measures prices every FLOP of a real round, U-shape tails included."""
    spec, B = resolve_spec(name, input_shape=(16,), num_classes=CLASSES), 4
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    state = initial_state(spec, 0)
    batches = _batches(spec, B)
    dev = Client("c", "c", TierProfile(1e9, 1e12), LINK, samples=B + 2)
    run_round(RoundConfig("r", 1, spec, "sflv1"), inprocess_chain(2), state, {"c": (0, 0)}, {"c": batches})
    for u in (False, True):
        sc = Scenario(prof, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B, u_shape=u)
        for cuts in (tuple(map(int, c)) for c in cut_options(prof.n_blocks, 3, u_shape=u)):
            with FlopCounterMode(display=False) as fc:
                run_round(RoundConfig("r", 1, spec, "sflv1", u_shape=u), inprocess_chain(2), state, {"c": cuts},
                          {"c": batches})
            assert sum(client_cost(sc, dev, cuts).flops) == fc.get_total_flops(), (u, cuts)
