"""The coordinator's own weight traffic. In sflv1 it stages the global model's server blocks once per tier
(the clients' loads copy them there) and takes back each tier's sample-weighted sum (float64) of its clients'
replicas: one copy of each tier's part each way, however many clients. sflv2 and sl hand the model on from
client to client: one copy per client each way. The cost model does not price it (its convention: the
coordinator sits with the servers); the metrics say how large it is, so a deployment can see it."""

from __future__ import annotations

import json

import pytest
import torch

from splitfed.aggregate import aggregate
from splitfed.engine.rounds import (
    RoundConfig,
    SplitRound,
    device_state,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    select,
    server_bounds,
    state_bytes,
)
from splitfed.engine.template import num_blocks
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("cnn", num_classes=10)
ASSIGNMENT = {"client0": (1, 3), "client1": (2, 5), "client2": (0, 4), "client3": (3, 7)}


def _expected(state, assignment, u_shape=False):  # type: ignore[no-untyped-def]
    """One copy per client (sflv2, sl)."""
    per_tier = [0, 0]
    n = num_blocks(SPEC)
    for cuts in assignment.values():
        for t, (a, z) in enumerate(server_bounds(cuts, n, u_shape)):
            per_tier[t] += state_bytes(select(state, a, z))
    return per_tier


def _union(state, assignment, itemsize=None):  # type: ignore[no-untyped-def]
    """One copy of the blocks any client trains on each tier (sflv1); ``itemsize``: as sums of that width."""
    n = num_blocks(SPEC)
    out = []
    for t in range(2):
        blocks = {i for cuts in assignment.values() for i in range(*server_bounds(cuts, n, False)[t])}
        keys = {k: v for i in blocks for k, v in select(state, i, i + 1).items()}
        out.append(state_bytes(keys) if itemsize is None else sum(v.numel() * itemsize for v in keys.values()))
    return out


def _batches(n: int = 2):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, *SPEC.input_shape, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(n)]


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_a_round_in_turns_hands_the_model_on_where_it_lies(mode: str) -> None:
    """Clients with the same cuts: each next client's load copies the server blocks from the replica before it,
    on its tier. The coordinator sends one copy (the first client's) and fetches one (at the end), however
    many clients; before, one copy per client each way."""
    state = initial_state(SPEC, 0)
    chain = inprocess_chain(2)
    same = {f"client{i}": (2, 5) for i in range(4)}
    rnd = SplitRound(RoundConfig("w", 1, SPEC, mode), chain.tiers, state, same)
    drive(rnd, local_trainer(chain, {c: _batches() for c in same}))
    one = _expected(state, {"client0": (2, 5)})
    assert [b[0] for b in rnd.weight_bytes] == one and [b[1] for b in rnd.weight_bytes] == one
    assert all(w > 0 for w in one)
    assert [t.clients() for t in chain.tiers] == [0, 0]


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_a_block_that_changes_tier_between_clients_is_fetched_and_sent_on(mode: str) -> None:
    """Cuts that differ by client: a block that was on the edge for one client and is on the cloud for the
    next travels through the coordinator, and only such blocks; never more than a copy per client each way."""
    state = initial_state(SPEC, 0)
    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig("w", 1, SPEC, mode), chain.tiers, state, ASSIGNMENT)
    drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGNMENT}))
    per_client = _expected(state, ASSIGNMENT)
    sent, back = [b[0] for b in rnd.weight_bytes], [b[1] for b in rnd.weight_bytes]
    assert all(0 < s <= p for s, p in zip(sent, per_client, strict=True))
    assert sum(sent) < sum(per_client) and sum(back) <= sum(per_client)
    assert [t.clients() for t in chain.tiers] == [0, 0]


@pytest.mark.parametrize("clients", [4, 12])
def test_sflv1_sends_each_tier_one_copy_whatever_the_clients(clients: int) -> None:
    """Before: one copy per client each way (12 clients: 12x the bytes of one)."""
    state = initial_state(SPEC, 0)
    chain = inprocess_chain(2)
    cuts = list(ASSIGNMENT.values())
    assignment = {f"client{i}": cuts[i % 4] for i in range(clients)}
    rnd = SplitRound(RoundConfig("w", 1, SPEC, "sflv1"), chain.tiers, state, assignment)
    drive(rnd, local_trainer(chain, {c: _batches() for c in assignment}))
    assert [b[0] for b in rnd.weight_bytes] == _union(state, ASSIGNMENT)  # the global blocks, once
    assert [b[1] for b in rnd.weight_bytes] == _union(state, ASSIGNMENT, itemsize=8)  # one float64 sum
    assert [t.clients() for t in chain.tiers] == [0, 0]  # clients and base segments released


def test_sflv1_averages_what_every_replica_fetched_back_would_give() -> None:
    """The tiers' sums, added to the devices' weights, give the mean of every client's replicas, as fetching
    each replica did (float64 sums in another order: equal to float32 rounding)."""
    state = initial_state(SPEC, 0)
    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig("w", 1, SPEC, "sflv1"), chain.tiers, state, ASSIGNMENT)
    group = rnd.groups()[0]
    weights = rnd.begin(group)
    data = {c: _batches(1 + i) for i, c in enumerate(ASSIGNMENT)}  # unequal samples: a weighted mean
    outcomes = local_trainer(chain, data)(rnd.cfg, ASSIGNMENT, weights)
    rnd.end(outcomes)
    contributions = []
    for c, out in outcomes.items():
        contributions.append((out.state, out.result.samples))
        contributions += [(t.fetch("w", c, rnd.cfg.secret_of(c)), out.result.samples) for t in chain.tiers]
    want = aggregate(contributions, previous=state)
    got = rnd.finish()
    assert set(got) == set(want)
    moved = 0.0
    for k in want:
        assert got[k].dtype == want[k].dtype
        if want[k].is_floating_point():
            torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)
            moved = max(moved, float((want[k] - state[k]).abs().max()))
        else:
            assert torch.equal(got[k], want[k])
    assert moved > 1e-4  # the round trained: the check compares trained weights
    # the devices started from the global model's blocks, and the servers from the same: nothing else
    for c, cuts in ASSIGNMENT.items():
        assert set(weights[c]) == set(device_state(state, cuts, num_blocks(SPEC), False))


def test_a_client_that_fails_is_counted_for_what_was_sent_only() -> None:
    """client3's training raises: its blocks were staged (sent), but its replica is in no tier's sum."""
    state = initial_state(SPEC, 0)
    chain = inprocess_chain(2)
    data = {c: _batches() for c in ASSIGNMENT}
    x, _ = data["client3"][0]
    data["client3"] = [(x, torch.full((4,), 99))]  # labels the model has no class for: the tier refuses the step
    rnd = SplitRound(RoundConfig("w", 1, SPEC, "sflv1"), chain.tiers, state, ASSIGNMENT, min_clients=3)
    failed: dict[str, str] = {}
    drive(rnd, local_trainer(chain, data, failed=failed))
    assert list(failed) == ["client3"]
    assert [b[0] for b in rnd.weight_bytes] == _union(state, ASSIGNMENT)
    rest = {c: k for c, k in ASSIGNMENT.items() if c != "client3"}
    assert [b[1] for b in rnd.weight_bytes] == _union(state, rest, itemsize=8)
    assert _union(state, rest) != _union(state, ASSIGNMENT)  # client3 alone trains some blocks: a real check


def test_the_metrics_and_summary_say_it(tmp_path) -> None:  # noqa: ANN001
    from splitfed.sim.inprocess import train_inprocess

    s = RunSettings(rounds=2, clients=4, tiers=3, cuts="static:1,3/2,5/0,4/3,7", batch_size=32, out=str(tmp_path))
    summary = train_inprocess(s)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    state = initial_state(s.spec, s.seed)
    assignment = dict(zip(ASSIGNMENT, [(1, 3), (2, 5), (0, 4), (3, 7)], strict=True))
    sent, back = _union(state, assignment), _union(state, assignment, itemsize=8)
    for r in rows:
        assert r["tier_weight_bytes"] == [[w, b] for w, b in zip(sent, back, strict=True)]
    assert summary["tier_weight_bytes"] == [[2 * w, 2 * b] for w, b in zip(sent, back, strict=True)]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["tier_weight_bytes"] == summary["tier_weight_bytes"]
