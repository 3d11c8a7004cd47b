"""Defects an engine review reproduced: an error the in-process tier raised bare, or a client's own model raised,
ended the whole in-process round (over gRPC and Flower the same error drops only its client), and a client's
loss weighted a short last batch like a full one."""

from __future__ import annotations

import uuid

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from splitfed.engine.device import Device
from splitfed.engine.rounds import (
    Batches,
    Chain,
    RoundConfig,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    run_round,
)
from splitfed.engine.types import OptimConfig, State
from splitfed.errors import TierError
from splitfed.models.zoo import resolve_spec

MODEL = "tests.test_engine_review:tiny"


def tiny() -> nn.Module:
    """A BatchNorm at block 3: a batch of one sample cannot pass it in training (torch raises ValueError)."""
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh(),
                         nn.Linear(8, 3))


SPEC = resolve_spec(MODEL, input_shape=(6,), num_classes=3)


def _data(sizes: dict[str, list[int]]) -> dict[str, Batches]:
    g = torch.Generator().manual_seed(3)
    out: dict[str, Batches] = {}
    for cid, batches in sizes.items():
        out[cid] = [(torch.randn(b, 6, generator=g), torch.randint(0, 3, (b,), generator=g)) for b in batches]
    return out


def _round(chain: Chain, data: dict[str, Batches], assignment: dict[str, tuple[int, ...]]
           ) -> tuple[State, SplitRound, dict[str, str]]:
    cfg = RoundConfig(f"review-{uuid.uuid4().hex[:6]}", 1, SPEC, "sflv1", optim=OptimConfig(lr=0.1, momentum=0.5))
    rnd = SplitRound(cfg, chain.tiers, initial_state(SPEC, 0), assignment, min_clients=1)
    errors: dict[str, str] = {}
    state = drive(rnd, local_trainer(chain, data, failed=errors), lost=errors)
    return state, rnd, errors


def test_an_error_the_tier_raises_drops_its_client_in_process_as_over_grpc() -> None:
    """c1's last batch holds one sample and the BatchNorm lies on the tier. Over gRPC the tier answers INTERNAL
    and c1 alone is dropped; in process the ValueError came up bare and ended the round for every client."""
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.server import serve_tier

    data = _data({"c0": [4, 4], "c1": [4, 1], "c2": [4]})
    assignment: dict[str, tuple[int, ...]] = {c: (2,) for c in data}
    chain = inprocess_chain(1)
    here, rnd, errors = _round(chain, data, assignment)
    assert rnd.failed == ["c1"]
    assert errors["c1"].startswith("TierError: tier cloud: internal error in step: ValueError: Expected more than 1")
    assert chain.tiers[0].clients() == 0  # type: ignore[attr-defined]
    without = run_round(RoundConfig("ref", 1, SPEC, "sflv1", optim=OptimConfig(lr=0.1, momentum=0.5)),
                        inprocess_chain(1), initial_state(SPEC, 0), {c: assignment[c] for c in ("c0", "c2")},
                        {c: data[c] for c in ("c0", "c2")})[0]
    assert all(torch.equal(here[k], without[k]) for k in here)  # as if c1 had not taken part
    with serve_tier("cloud", insecure=True, allowed_models=[MODEL]) as srv, \
            GrpcTierClient(srv.address, insecure=True, retries=0) as tier:
        there, rnd, errors = _round(Chain([tier], tier), data, assignment)
    assert rnd.failed == ["c1"] and "internal error in step: ValueError" in errors["c1"]
    assert all(torch.equal(here[k], there[k]) for k in here)  # a transport changes no number


def test_an_error_a_clients_own_model_raises_drops_that_client_in_process(caplog: pytest.LogCaptureFixture) -> None:
    """The BatchNorm on c1's device this time: a Flower run drops a ClientApp that raises anything (its error
    reply); the in-process round let the ValueError end the run for every client."""
    data = _data({"c0": [4, 4], "c1": [4, 1], "c2": [4]})
    assignment: dict[str, tuple[int, ...]] = {c: (4,) for c in data}
    chain = inprocess_chain(1)
    with caplog.at_level("ERROR", logger="splitfed.engine.rounds"):
        got, rnd, errors = _round(chain, data, assignment)
    assert rnd.failed == ["c1"] and errors["c1"].startswith("ValueError: Expected more than 1 value per channel")
    assert "c1: training failed" in caplog.text and "Traceback" in caplog.text  # a bug's trace is kept
    assert chain.tiers[0].clients() == 0  # type: ignore[attr-defined]
    without = run_round(RoundConfig("ref", 1, SPEC, "sflv1", optim=OptimConfig(lr=0.1, momentum=0.5)),
                        inprocess_chain(1), initial_state(SPEC, 0), {c: assignment[c] for c in ("c0", "c2")},
                        {c: data[c] for c in ("c0", "c2")})[0]
    assert all(torch.equal(got[k], without[k]) for k in got)
    with pytest.raises(ValueError, match="Expected more than 1"):  # without ``failed``: it still ends the round
        run_round(RoundConfig("r", 1, SPEC, "sflv1"), inprocess_chain(1), initial_state(SPEC, 0), assignment, data)


@pytest.mark.parametrize("u_shape", [False, True])
def test_a_step_the_in_process_tier_fails_is_a_tier_error_and_leaves_nothing_held(u_shape: bool) -> None:
    """The device sees what a gRPC tier answers (a TierError, INTERNAL), in a step and a U-shape forward."""
    chain = inprocess_chain(1)
    cuts = (2, 5) if u_shape else (2,)
    state = initial_state(SPEC, 0)
    rnd = SplitRound(RoundConfig("r", 1, SPEC, "sflv1", u_shape), chain.tiers, state, {"c": cuts})
    weights = rnd.begin(["c"])
    dev = Device(SPEC, chain.link, run_id="r", client_id="c", round=1, cuts=cuts, state=weights["c"],
                 u_shape=u_shape, secret=rnd.cfg.secret_of("c"))
    x, y = _data({"c": [1]})["c"][0]
    with pytest.raises(TierError, match="internal error in (step|forward): ValueError"):
        dev.train_step(x, y)
    rnd.close()
    assert chain.tiers[0].clients() == 0 and chain.tiers[0].held == 0  # type: ignore[attr-defined]


def test_a_clients_loss_is_its_mean_over_samples() -> None:
    """Batches of 7 and 2 samples: the client's loss is what a round's train loss takes it for (its clients'
    losses weighted by their samples), the mean over its samples; it was the mean of its batches' means."""
    data = _data({"c": [7, 2]})
    cfg = RoundConfig("r", 1, SPEC, "sflv1", optim=OptimConfig())
    state = initial_state(SPEC, 0)
    _, results = run_round(cfg, inprocess_chain(1), state, {"c": (2,)}, data)
    # the same steps on the whole model, each batch's mean loss as it was trained on
    whole = tiny()
    whole.load_state_dict(state)  # a Sequential's keys are the blocks' keys: "<block>.<key>"
    opt = torch.optim.SGD(whole.parameters(), lr=cfg.optim.lr)
    per_batch = []
    for x, y in data["c"]:
        loss = F.cross_entropy(whole(x), y)
        per_batch.append((float(loss.detach()), x.shape[0]))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    want = sum(v * n for v, n in per_batch) / sum(n for _, n in per_batch)
    assert results[0].samples == 9
    assert results[0].loss == pytest.approx(want, rel=1e-6)
    assert results[0].loss != pytest.approx(sum(v for v, _ in per_batch) / 2, rel=1e-3)
