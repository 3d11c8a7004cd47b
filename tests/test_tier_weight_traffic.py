"""The coordinator's own weight traffic: each round it loads every client's server segments onto the tiers and
fetches them back (one copy per client each way). The cost model does not price it (its convention: the
coordinator sits with the servers); the metrics say how large it is, so a deployment can see it."""

from __future__ import annotations

import json

import pytest

from splitfed.engine.rounds import (
    RoundConfig,
    SplitRound,
    initial_state,
    inprocess_chain,
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
    per_tier = [0, 0]
    n = num_blocks(SPEC)
    for cuts in assignment.values():
        for t, (a, z) in enumerate(server_bounds(cuts, n, u_shape)):
            per_tier[t] += state_bytes(select(state, a, z))
    return per_tier


def _batches(n: int = 2):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, *SPEC.input_shape, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(n)]


@pytest.mark.parametrize("mode", ["sflv1", "sflv2", "sl"])
def test_a_round_counts_the_weights_it_sends_each_tier_and_gets_back(mode: str) -> None:
    state = initial_state(SPEC, 0)
    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig("w", 1, SPEC, mode), chain.tiers, state, ASSIGNMENT)
    from splitfed.engine.rounds import drive, local_trainer

    drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGNMENT}))
    want = _expected(state, ASSIGNMENT)
    assert [b[0] for b in rnd.weight_bytes] == want  # loaded: the global (or handed-on) weights, one per client
    assert [b[1] for b in rnd.weight_bytes] == want  # fetched: each client's trained copy (same shapes)
    assert all(w > 0 for w in want)


def test_a_client_that_fails_is_counted_for_what_was_sent_only() -> None:
    """client1's training raises: its segments were loaded (sent) but never fetched."""
    import torch

    state = initial_state(SPEC, 0)
    chain = inprocess_chain(2)
    data = {c: _batches() for c in ASSIGNMENT}
    x, _ = data["client1"][0]
    data["client1"] = [(x, torch.full((4,), 99))]  # labels the model has no class for: the tier refuses the step
    rnd = SplitRound(RoundConfig("w", 1, SPEC, "sflv1"), chain.tiers, state, ASSIGNMENT, min_clients=3)
    from splitfed.engine.rounds import drive, local_trainer

    failed: dict[str, str] = {}
    drive(rnd, local_trainer(chain, data, failed=failed))
    assert list(failed) == ["client1"]
    assert [b[0] for b in rnd.weight_bytes] == _expected(state, ASSIGNMENT)
    rest = {c: k for c, k in ASSIGNMENT.items() if c != "client1"}
    assert [b[1] for b in rnd.weight_bytes] == _expected(state, rest)


def test_the_metrics_and_summary_say_it(tmp_path) -> None:  # noqa: ANN001
    from splitfed.sim.inprocess import train_inprocess

    s = RunSettings(rounds=2, clients=4, tiers=3, cuts="static:1,3/2,5/0,4/3,7", batch_size=32, out=str(tmp_path))
    summary = train_inprocess(s)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    state = initial_state(s.spec, s.seed)
    want = _expected(state, dict(zip(ASSIGNMENT, [(1, 3), (2, 5), (0, 4), (3, 7)], strict=True)))
    for r in rows:
        assert r["tier_weight_bytes"] == [[w, w] for w in want]
    assert summary["tier_weight_bytes"] == [[2 * w, 2 * w] for w in want]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["tier_weight_bytes"] == summary["tier_weight_bytes"]

