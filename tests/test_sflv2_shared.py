"""SplitFed v2 trains ONE server-side model, by the clients in turn, whichever server tier holds a block.

The reference below is plain torch (not :mod:`splitfed.engine.verify`): one shared model, a device copy
per client, every client's turn one optimizer over the whole model assembled from both; then each block
is the sample-weighted mean of the device copies and the shared copy (weighted by the samples that
trained it there). A client that fails mid-round leaves the round as if it had not taken part.
"""

from __future__ import annotations

import uuid

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from splitfed.engine.rounds import (
    RoundConfig,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    run_round,
)
from splitfed.engine.types import OptimConfig
from splitfed.models.zoo import resolve_spec

N_BLOCKS = 8
LR, MOMENTUM = 0.05, 0.9


def tiny() -> nn.Module:
    """Eight blocks, no dropout (so the reference needs no masks), a BatchNorm (buffers ride along)."""
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh(),
                         nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


SPEC = resolve_spec("tests.test_sflv2_shared:tiny", input_shape=(6,), num_classes=3)
OPTIM = OptimConfig("sgd", LR, MOMENTUM)


def _data(clients: list[str], steps: int = 2, batch: int = 4) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(7)
    out = {}
    for cid in clients:
        x, y = torch.randn(steps * batch, 6, generator=g), torch.randint(0, 3, (steps * batch,), generator=g)
        out[cid] = [(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch].clone()) for s in range(steps)]
    return out


def _split(assignment: dict[str, tuple[int, ...]], data, seed: int = 0):  # type: ignore[no-untyped-def]
    tiers = len(next(iter(assignment.values()))) + 1
    cfg = RoundConfig(f"t-{uuid.uuid4().hex[:6]}", 1, SPEC, "sflv2", optim=OPTIM, seed=seed)
    chain = inprocess_chain(tiers - 1)
    state, _ = run_round(cfg, chain, initial_state(SPEC, seed), assignment, data)
    assert [t.clients() for t in chain.tiers] == [0] * (tiers - 1)
    return state


def _reference(start: dict[str, torch.Tensor], assignment: dict[str, tuple[int, ...]], data):  # type: ignore[no-untyped-def]
    """One shared server-side model (plain torch); server blocks of a client: [its first cut, end)."""
    shared = tiny()
    shared.load_state_dict(start)
    devices, server_samples = [], [0] * N_BLOCKS
    for cid, cuts in assignment.items():
        own = tiny()
        own.load_state_dict(start)
        server = set(range(cuts[0], N_BLOCKS))
        whole = nn.Sequential(*[shared[i] if i in server else own[i] for i in range(N_BLOCKS)]).train()
        opt = torch.optim.SGD(whole.parameters(), lr=LR, momentum=MOMENTUM)
        n = 0
        for x, y in data[cid]:
            F.cross_entropy(whole(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            n += x.shape[0]
        devices.append(({k: v.detach().clone() for k, v in own.state_dict().items()
                         if int(k.split(".")[0]) not in server}, n))
        for i in server:
            server_samples[i] += n
    out = dict(start)
    for k, v in shared.state_dict().items():
        parts = [(s[k], w) for s, w in devices if k in s]
        if server_samples[int(k.split(".")[0])]:
            parts.append((v.detach(), server_samples[int(k.split(".")[0])]))
        if parts:
            mean = sum(p.double() * w for p, w in parts) / sum(w for _, w in parts)
            out[k] = mean.to(v.dtype) if v.dtype.is_floating_point else mean.round().to(v.dtype)
    return out


def _max_diff(a, b) -> float:  # type: ignore[no-untyped-def]
    assert set(a) == set(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.parametrize("assignment", [
    {"c0": (2, 4), "c1": (2, 6), "c2": (2, 8)},  # same device blocks, the edge/cloud cut moves
    {"c0": (3, 5), "c1": (1, 7), "c2": (2, 2)},  # block 1, 2 on a device for some, a server for others
])
def test_three_tiers_train_one_server_side_model(assignment):
    data = _data(list(assignment))
    got = _split(assignment, data)
    want = _reference(initial_state(SPEC, 0), assignment, data)
    assert _max_diff(got, want) <= 1e-6
    # the server tier a block lives on does not matter: equal server cuts, and 2 tiers, give the same model
    same_server_cut = {c: (k[0], 5) for c, k in assignment.items()}
    assert _max_diff(got, _split(same_server_cut, data)) <= 1e-6
    assert _max_diff(got, _split({c: (k[0],) for c, k in assignment.items()}, data)) <= 1e-6


def _round_with_failures(assignment, data):  # type: ignore[no-untyped-def]
    tiers = len(next(iter(assignment.values()))) + 1
    chain = inprocess_chain(tiers - 1)
    cfg = RoundConfig(f"t-{uuid.uuid4().hex[:6]}", 1, SPEC, "sflv2", optim=OPTIM)
    rnd = SplitRound(cfg, chain.tiers, initial_state(SPEC, 0), assignment, min_clients=1)
    errors: dict[str, str] = {}
    state = drive(rnd, local_trainer(chain, data, failed=errors), lost=errors)
    assert [t.clients() for t in chain.tiers] == [0] * (tiers - 1)
    return state, rnd


@pytest.mark.parametrize("victim, fail_at", [("c0", 0), ("c0", 1), ("c1", 1)])
def test_failed_client_leaves_no_trace(victim, fail_at):
    """The first or a middle client in turn fails (a label the tier refuses) after 0 or 1 applied steps:
    the round equals one trained without it."""
    assignment = {"c0": (2, 5), "c1": (2, 7), "c2": (1, 4)}
    data = _data(list(assignment))
    bad = {c: [(x, y.clone()) for x, y in b] for c, b in data.items()}
    bad[victim][fail_at][1][0] = 99
    got, rnd = _round_with_failures(assignment, bad)
    assert rnd.failed == [victim] and "labels must lie" in rnd.lost[victim]
    rest = {c: k for c, k in assignment.items() if c != victim}
    want = _split(rest, data)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert _max_diff(want, _reference(initial_state(SPEC, 0), rest, data)) <= 1e-6


def test_diverged_client_is_left_out_like_a_failed_one():
    """NaN in a middle client's server replica: it is dropped, the others train on the model before it."""
    assignment = {"c0": (2, 5), "c1": (2, 7), "c2": (1, 4)}
    data = _data(list(assignment))
    chain = inprocess_chain(2)
    inner = local_trainer(chain, data)

    def train(cfg, cuts, weights):  # type: ignore[no-untyped-def]
        out = inner(cfg, cuts, weights)
        if "c1" in out:
            with torch.no_grad():
                next(chain.tiers[1]._bindings[(cfg.run_id, "c1")].segment.parameters()).view(-1)[0] = float("nan")
        return out

    cfg = RoundConfig(f"t-{uuid.uuid4().hex[:6]}", 1, SPEC, "sflv2", optim=OPTIM)
    rnd = SplitRound(cfg, chain.tiers, initial_state(SPEC, 0), assignment, min_clients=1)
    got = drive(rnd, train)
    assert rnd.failed == ["c1"] and "NaN" in rnd.why["c1"]
    want = _split({c: k for c, k in assignment.items() if c != "c1"}, data)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_verify_without_cuts_is_refused_in_one_line() -> None:
    """Before: an IndexError from the Python API."""
    from splitfed.engine.verify import verify
    from splitfed.errors import ConfigError
    from splitfed.models.zoo import resolve_spec

    with pytest.raises(ConfigError, match=r"verify needs a cut vector per client"):
        verify(resolve_spec("mlp"), cuts=[])
