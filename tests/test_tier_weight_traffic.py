"""The coordinator's own weight traffic. In sflv1 it stages the global model's server blocks once per tier
(the clients' loads copy them there) and takes back each tier's sample-weighted mean of its clients' replicas
(float32 for float32 weights, float64 for integer buffers): one copy of each tier's part each way, however many
clients, and as many bytes back as went out for a float32 model (protocol 3's float64 sums: twice). sflv2 and sl
hand the model on from client to client: one copy per client each way. The cost model does not price it (its
convention: the coordinator sits with the servers); the metrics say how large it is, so a deployment can see it."""

from __future__ import annotations

import json

import pytest
import torch

from splitfed.aggregate import aggregate, wire_dtype
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


def _union(state, assignment, itemsize=None, spec=SPEC):  # type: ignore[no-untyped-def]
    """One copy of the blocks any client trains on each tier (sflv1); ``itemsize``: as tensors of that width
    (8: protocol 3's float64 sums); "mean": as a tier's means travel (:func:`wire_dtype`)."""
    n = num_blocks(spec)
    out = []
    for t in range(2):
        blocks = {i for cuts in assignment.values() for i in range(*server_bounds(cuts, n, False)[t])}
        keys = {k: v for i in blocks for k, v in select(state, i, i + 1).items()}
        if itemsize == "mean":
            out.append(sum(v.numel() * wire_dtype(v.dtype).itemsize for v in keys.values()))
        else:
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
    assert [b[1] for b in rnd.weight_bytes] == _union(state, ASSIGNMENT, itemsize="mean")  # one mean
    assert [t.clients() for t in chain.tiers] == [0, 0]  # clients and base segments released


def test_sflv1_averages_what_every_replica_fetched_back_would_give() -> None:
    """The tiers' means, made sums again and added to the devices' weights, give the mean of every client's
    replicas, as fetching each replica did (to float32 rounding)."""
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
    """client3's training raises: its blocks were staged (sent), but its replica is in no tier's mean."""
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
    assert [b[1] for b in rnd.weight_bytes] == _union(state, rest, itemsize="mean")
    assert _union(state, rest) != _union(state, ASSIGNMENT)  # client3 alone trains some blocks: a real check


def test_the_metrics_and_summary_say_it(tmp_path) -> None:  # noqa: ANN001
    from splitfed.sim.inprocess import train_inprocess

    s = RunSettings(rounds=2, clients=4, tiers=3, cuts="static:1,3/2,5/0,4/3,7", batch_size=32, out=str(tmp_path))
    summary = train_inprocess(s)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    state = initial_state(s.spec, s.seed)
    assignment = dict(zip(ASSIGNMENT, [(1, 3), (2, 5), (0, 4), (3, 7)], strict=True))
    sent, back = _union(state, assignment), _union(state, assignment, itemsize="mean")
    for r in rows:
        assert r["tier_weight_bytes"] == [[w, b] for w, b in zip(sent, back, strict=True)]
    assert summary["tier_weight_bytes"] == [[2 * w, 2 * b] for w, b in zip(sent, back, strict=True)]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["tier_weight_bytes"] == summary["tier_weight_bytes"]


def test_sflv1_gets_back_half_the_bytes_of_float64_sums_for_a_float32_model() -> None:
    """mlp holds float32 weights only: each tier's mean comes back in the bytes of one float32 copy, what went
    out, and half what protocol 3's float64 sums took; over gRPC it is the same, as a real tier sends it."""
    spec = resolve_spec("mlp", num_classes=10)
    state = initial_state(spec, 0)
    assert all(v.dtype == torch.float32 for v in state.values())
    assignment = {"a": (1, 3), "b": (0, 4), "c": (2, 5)}
    g = torch.Generator().manual_seed(0)
    data = {c: [(torch.randn(4, *spec.input_shape, generator=g), torch.randint(0, 10, (4,), generator=g))]
            for c in assignment}
    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig("w", 1, spec, "sflv1"), chain.tiers, state, assignment)
    drive(rnd, local_trainer(chain, data))
    old = _union(state, assignment, itemsize=8, spec=spec)
    back = [b[1] for b in rnd.weight_bytes]
    assert all(b > 0 for b in back)
    assert back == [o // 2 for o in old] == [b[0] for b in rnd.weight_bytes]
    assert back == _union(state, assignment, spec=spec)


# cnn holds weights in blocks 0, 2, 5 and 6: block 0 on the devices only, block 2 on the edge only, block 6 on
# the cloud only, block 5 on the edge for b and on the cloud for a and c
ONE_TIER = {"a": (1, 5), "b": (2, 6), "c": (1, 5)}


@pytest.fixture(params=["in-process", "grpc"])
def a_chain(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    if request.param == "in-process":
        yield inprocess_chain(2)
        return
    from splitfed.transport.chain import close_chain, grpc_chain
    from splitfed.transport.server import serve_tier

    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        chain = grpc_chain([edge.address, cloud.address], retries=0, deadline_s=30.0)
        try:
            yield chain
        finally:
            close_chain(chain)


def test_sflv1_gives_bitwise_what_fetching_every_replica_gives_where_one_tier_holds_a_key(a_chain) -> None:  # noqa: ANN001
    """The old way: every trained replica fetched whole and averaged with the devices' weights. A key one tier
    alone holds (its mean, made a sum again with the weight behind it, is exactly its float64 sum) averages to
    the same bits; a key the tiers hold for different clients, or devices too, to float32 rounding. The tier's
    reply carries float32 for the float32 weights and float64 for the integer buffer, in-process and over
    gRPC."""
    state = initial_state(SPEC, 0)
    n = num_blocks(SPEC)
    means: list[dict[str, torch.dtype]] = []

    class Noted:
        def __init__(self, tier) -> None:  # type: ignore[no-untyped-def]
            self.tier = tier

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self.tier, name)

        def reduce(self, run_id, items):  # type: ignore[no-untyped-def]
            out = self.tier.reduce(run_id, items)
            means.append({k: v.dtype for k, v in out.means.items()})
            return out

    rnd = SplitRound(RoundConfig("w", 1, SPEC, "sflv1"), [Noted(t) for t in a_chain.tiers], state, ONE_TIER)
    weights = rnd.begin(rnd.groups()[0])
    data = {c: _batches(1 + i) for i, c in enumerate(ONE_TIER)}  # unequal samples: a weighted mean
    outcomes = local_trainer(a_chain, data)(rnd.cfg, ONE_TIER, weights)
    rnd.end(outcomes)
    contributions = []
    for c in ONE_TIER:
        contributions.append((outcomes[c].state, outcomes[c].result.samples))
        contributions += [(t.fetch("w", c, rnd.cfg.secret_of(c)), outcomes[c].result.samples)
                          for t in a_chain.tiers]
    want = aggregate(contributions, previous=state)
    got = rnd.finish()
    # where each key was trained: "device", or the server tier's index
    where = {k: {t for cuts in ONE_TIER.values()
                 for t, (a, z) in [("device", (0, cuts[0])), *enumerate(server_bounds(cuts, n, False))]
                 if a <= int(k.split(".")[0]) < z}
             for k in state}
    alone = {k for k, w in where.items() if len(w) == 1}
    assert {k.split(".")[0] for k in alone} == {"0", "2", "6"} and where["5.0.weight"] == {0, 1}
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        if k in alone or not want[k].is_floating_point():
            assert torch.equal(got[k], want[k]), k
        else:
            torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(got[k], state[k]) for k in alone - {k for k in alone if k.startswith("0.")})
    # the replies: float32 means of the float32 weights, a float64 mean of BatchNorm's num_batches_tracked
    assert len(means) == 2 and "2.1.num_batches_tracked" in means[0]
    for reply in means:
        assert reply and all(d == (torch.float32 if state[k].dtype == torch.float32 else torch.float64)
                             for k, d in reply.items())
    assert [b[1] for b in rnd.weight_bytes] == _union(state, ONE_TIER, itemsize="mean") == \
        [b[0] for b in rnd.weight_bytes]
