"""What one round's bookkeeping reports, pinned to values computed independently: a client's correct count
and link bytes (train_client), the round's device and weight bytes, the holder a handed-on load copies, and
where sl's server segments start."""

from __future__ import annotations

import pytest
import torch

import splitfed.engine.tier as tier_mod
from splitfed.engine.device import Device
from splitfed.engine.link import InProcessLink
from splitfed.engine.rounds import (
    BASE,
    Chain,
    ClientResult,
    RoundConfig,
    RoundFailed,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    tier_loads,
    train_client,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import OptimConfig
from splitfed.engine.verify import reference_round
from splitfed.errors import TierError
from splitfed.models.zoo import model_blocks, resolve_spec

SPEC = resolve_spec("cnn", num_classes=10)  # 7 blocks; weights in blocks 0, 2, 5 and 6
OPTIM = OptimConfig("sgd", 0.05, 0.5)
KEY = "a key"


def _cfg(mode: str, rnd: int = 1) -> RoundConfig:
    return RoundConfig("mut", rnd, SPEC, mode, False, optim=OPTIM, seed=5, binding_key=KEY)


def _batches(seed: int, n: int = 3, size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, *SPEC.input_shape, generator=g), torch.randint(0, 10, (size,), generator=g))
            for _ in range(n)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _blocks_bytes(state: dict[str, torch.Tensor], blocks: range) -> int:
    """The bytes of ``state``'s keys of ``blocks`` (a key's block: its first dotted part)."""
    return sum(_nbytes(v) for k, v in state.items() if int(k.split(".")[0]) in blocks)


def test_train_client_reports_its_correct_count_and_exact_link_bytes() -> None:
    """Bytes up: each batch's labels and the cut's activation; down: the activation's gradient. Counted as
    this client's alone on a link that already carried another client's traffic."""
    cfg, cuts = _cfg("sflv2"), (1, 3)
    state = initial_state(SPEC, 5)
    dev_state = {k: v for k, v in state.items() if k.startswith("0.")}
    data = _batches(3)
    # the correct count, summed from the same steps of a device of its own
    ref_chain = inprocess_chain(2)
    ref = Device(SPEC, ref_chain.link, run_id="mut", client_id="c", round=1, cuts=cuts, state=dev_state,
                 u_shape=False, optim=OPTIM, seed=5, secret=cfg.secret_of("c"))
    for t, load in zip(ref_chain.tiers, tier_loads(cfg, "c", cuts, state), strict=True):
        t.load(load)
    expected_correct = sum(ref.train_step(x, y)[1] for x, y in data)
    assert expected_correct > 0
    whole = model_blocks(SPEC, 5)[1].whole()
    act = sum(_nbytes(whole[0](x)) for x, _ in data)  # block 0's output crosses
    labels = sum(_nbytes(y) for _, y in data)

    chain = inprocess_chain(2)
    for cid in ("other", "c"):
        for t, load in zip(chain.tiers, tier_loads(cfg, cid, cuts, state), strict=True):
            t.load(load)
    train_client(cfg, chain, "other", cuts, dict(dev_state), _batches(9, n=2))  # the link is not fresh
    assert chain.bytes[0] > 0 and chain.bytes[1] > 0
    _, res = train_client(cfg, chain, "c", cuts, dict(dev_state), data)
    assert res.correct == expected_correct
    assert res.samples == 24
    assert (res.bytes_up, res.bytes_down) == (labels + act, act)


def test_a_rounds_device_and_weight_bytes_are_exact() -> None:
    """device_bytes: each client's device segment sent and its trained one received; weight_bytes: per tier,
    the server segments loaded and fetched back (sflv2, one client: nothing handed on)."""
    cuts = {"c": (3, 5)}
    state = initial_state(SPEC, 5)
    chain = inprocess_chain(2)
    split = SplitRound(_cfg("sflv2"), chain.tiers, state, cuts)
    drive(split, local_trainer(chain, {"c": _batches(1)}))
    dev = _blocks_bytes(state, range(0, 3))
    assert split.device_bytes == [dev, dev]
    edge, cloud = _blocks_bytes(state, range(3, 5)), _blocks_bytes(state, range(5, 7))
    assert edge == 0 and cloud > 0
    assert split.weight_bytes == [[edge, edge], [cloud, cloud]]


def test_sflv1_device_bytes_sum_over_its_clients() -> None:
    cuts = {"a": (1, 3), "b": (3, 5)}
    state = initial_state(SPEC, 5)
    chain = inprocess_chain(2)
    split = SplitRound(_cfg("sflv1"), chain.tiers, state, cuts)
    drive(split, local_trainer(chain, {"a": _batches(1), "b": _batches(2)}))
    sent = _blocks_bytes(state, range(0, 1)) + _blocks_bytes(state, range(0, 3))
    assert split.device_bytes == [sent, sent]


def test_a_handed_on_load_sends_only_the_blocks_its_base_does_not_hold() -> None:
    """sflv2: c's edge segment [1, 6) copies b's holder there (blocks 3-5); block 2, fetched back when b's
    holder took the edge (one holder per tier), travels with c's load: exactly its bytes."""
    cuts = {"a": (1, 3), "b": (3, 6), "c": (1, 6)}
    state = initial_state(SPEC, 5)
    chain = inprocess_chain(2)
    split = SplitRound(_cfg("sflv2"), chain.tiers, state, cuts)
    train = local_trainer(chain, {c: _batches(i) for i, c in enumerate(cuts)})
    try:
        for group in split.groups():
            before = split.weight_bytes[0][0]
            weights = split.begin(group)
            if group == ["c"]:
                assert split.weight_bytes[0][0] - before == _blocks_bytes(state, range(2, 3))
            split.end(train(split.cfg, {g: split.assignment[g] for g in weights}, weights))
        split.finish()
    finally:
        split.close()


def test_sl_server_segments_start_from_the_model_handed_on() -> None:
    """sl: a later client's server segment starts from the blocks the clients before trained (fetched back
    into the round's model), not the round's start: the round equals the whole-model reference."""
    cuts = {"a": (1, 3), "b": (3, 6), "c": (1, 3)}
    state = initial_state(SPEC, 5)
    data = {c: _batches(i) for i, c in enumerate(cuts)}
    chain = inprocess_chain(2)
    got = drive(SplitRound(_cfg("sl"), chain.tiers, state, cuts), local_trainer(chain, data))
    want = reference_round(_cfg("sl"), state, dict(cuts), data, 3)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_weights_fetched_back_when_a_tier_cannot_keep_them_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """sflv2, tiers that hold no base segment: a client's trained server segments are fetched back (not kept
    on the tiers), and each tier's weight_bytes counts them: [loaded, fetched]."""
    monkeypatch.setattr(tier_mod, "MAX_BASES", 0)
    cuts = {"c": (1, 3)}
    state = initial_state(SPEC, 5)
    chain = inprocess_chain(2)
    split = SplitRound(_cfg("sflv2"), chain.tiers, state, cuts)
    drive(split, local_trainer(chain, {"c": _batches(1)}))
    edge, cloud = _blocks_bytes(state, range(1, 3)), _blocks_bytes(state, range(3, 7))
    assert edge > 0 and cloud > 0
    assert split.weight_bytes == [[edge, edge], [cloud, cloud]]


def test_a_failed_load_releases_a_segment_an_earlier_round_left_with_that_rounds_secret() -> None:
    """Round 1 left c bound on the cloud (noted in ``unreleased``). In round 2 the full edge refuses c, so c
    is dropped and released: the cloud refuses round 2's secret, the one of round 1 releases it, and nothing
    is noted as left any more."""
    state = initial_state(SPEC, 5)
    cloud = Tier("cloud")
    edge = Tier("edge", next=InProcessLink(cloud), max_clients=1)
    cuts = {"d": (1, 3), "c": (1, 3)}
    cloud.load(tier_loads(_cfg("sflv1", rnd=1), "c", cuts["c"], state)[1])
    unreleased = {(1, "c"): 1}
    chain = Chain([edge, cloud], InProcessLink(edge))
    split = SplitRound(_cfg("sflv1", rnd=2), chain.tiers, state, cuts, min_clients=1, unreleased=unreleased)
    drive(split, local_trainer(chain, {"d": _batches(1)}))
    assert split.failed == ["c"] and "could not be loaded" in split.why["c"]
    assert (edge.clients(), cloud.clients()) == (0, 0)
    assert unreleased == {}


def test_a_round_sweeps_a_base_segment_an_earlier_round_left() -> None:
    """A base segment round 1 could not release (noted in ``unreleased``) is released by round 2, with round
    1's secret, and no longer noted."""
    state = initial_state(SPEC, 5)
    chain = inprocess_chain(2)
    edge = chain.tiers[0]
    assert isinstance(edge, Tier)
    edge.load(tier_loads(_cfg("sflv1", rnd=1), BASE, (1, 3), state, replica=BASE)[0])
    unreleased = {(0, BASE): 1}
    split = SplitRound(_cfg("sflv2", rnd=2), chain.tiers, state, {"d": (1, 3)}, unreleased=unreleased)
    drive(split, local_trainer(chain, {"d": _batches(1)}))
    assert unreleased == {}
    with pytest.raises(TierError):  # gone: nothing to release under round 1's secret any more
        edge.fetch("mut", BASE, _cfg("sflv1", rnd=1).secret_of(BASE))


def _failing_round(clients: int, failing: int) -> str:
    """An sflv2 round (default minimum: every client) whose first ``failing`` clients have no data."""
    names = [f"c{i}" for i in range(clients)]
    chain = inprocess_chain()
    split = SplitRound(_cfg("sflv2"), chain.tiers, initial_state(SPEC, 5), {c: (1, 3) for c in names})
    with pytest.raises(RoundFailed) as e:
        drive(split, local_trainer(chain, {c: _batches(1) for c in names[failing:]}, failed={}))
    return str(e.value)


def test_the_default_minimum_is_every_client_and_the_message_names_three_failures() -> None:
    msg = _failing_round(2, 1)
    assert "1 of 2 clients finished, fewer than the minimum 2" in msg
    assert "more" not in _failing_round(3, 3)
    msg = _failing_round(4, 4)
    assert "c0" in msg and "c2" in msg and "c3" not in msg and msg.endswith(", +1 more)")


def test_small_settings() -> None:
    """A failed round exits 1; a round's settings cannot change under it; results count no bytes unless told;
    a default chain has an edge and a cloud."""
    assert RoundFailed.exit_code == 1
    cfg = _cfg("sl")
    with pytest.raises(AttributeError):
        cfg.round = 2  # type: ignore[misc]
    res = ClientResult("c", (1, 3), 4, 0.5, 2, 0.1, 0.2)
    assert (res.bytes_up, res.bytes_down, res.rtt_s) == (0, 0, None)
    assert [t.name for t in inprocess_chain().tiers if isinstance(t, Tier)] == ["edge", "cloud"]
