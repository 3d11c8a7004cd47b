"""Many clients' steps at once on one tier give the same numbers as one at a time."""

from __future__ import annotations

import threading

import torch

from splitfed.data import synthetic
from splitfed.engine.device import Device
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, tier_loads
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("mlp")  # dropout on the device side and on the server side of cut 1
CLIENTS = 6


def _train(concurrent: bool) -> dict[str, dict[str, torch.Tensor]]:
    chain = inprocess_chain(1)
    cfg = RoundConfig("run", 0, SPEC, seed=3)
    state = initial_state(SPEC, 3)
    devices = []
    for i in range(CLIENTS):
        cid = f"c{i}"
        (load,) = tier_loads(cfg, cid, (1,), state)
        chain.tiers[0].load(load)
        devices.append(Device(SPEC, chain.link, run_id="run", client_id=cid, round=0, cuts=(1,), state=state,
                              seed=3))
    data = [synthetic(SPEC, 24, i).tensors for i in range(CLIENTS)]
    barrier = threading.Barrier(CLIENTS)

    def work(i: int) -> None:
        x, y = data[i]
        if concurrent:
            barrier.wait()
        for s in range(6):
            devices[i].train_step(x[4 * s:4 * s + 4], y[4 * s:4 * s + 4])

    if concurrent:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(CLIENTS):
            work(i)
    return {f"c{i}": {**devices[i].state(), **chain.tiers[0].fetch("run", f"c{i}")} for i in range(CLIENTS)}


def test_concurrent_clients_with_dropout_match_sequential() -> None:
    import sys

    seq = _train(concurrent=False)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up at once
    try:
        runs = [_train(concurrent=True) for _ in range(3)]
    finally:
        sys.setswitchinterval(old)
    for par in runs:
        for cid in seq:
            for k in seq[cid]:
                assert torch.equal(seq[cid][k], par[cid][k]), f"{cid} {k}"


def test_building_models_while_others_train_changes_no_mask_and_no_weight() -> None:
    """A tier builds a new model's template (seeded initial weights) while other clients' steps draw
    dropout masks; a ServerApp builds its initial model while another run in the process trains.
    Both use torch's one generator: each must get it whole (splitfed.models.rng), or a mask or an
    initial weight silently comes from the other's seed."""
    import sys

    from splitfed.models.segment import Segment
    from splitfed.models.zoo import build

    mlp = resolve_spec("mlp")
    cnn = resolve_spec("cnn")
    seg = Segment({"2": torch.nn.Dropout(0.5)}, 2, 3)
    x = torch.ones(64, 128)
    masks_alone = [seg(x, rng=r) for r in range(50)]
    weights_alone = [build(cnn, seed=s).state_dict() for s in range(5)]
    masks: list[torch.Tensor] = []
    weights: list[dict[str, torch.Tensor]] = []
    start = threading.Barrier(2)

    def draw() -> None:
        start.wait()
        masks.extend(seg(x, rng=r) for r in range(50))

    def build_models() -> None:
        start.wait()
        for s in range(5):
            weights.append(build(cnn, seed=s).state_dict())
            initial_state(mlp, s)  # the ServerApp's initial model: another seeded build

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=draw), threading.Thread(target=build_models)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert len(masks) == 50 and all(torch.equal(a, b) for a, b in zip(masks_alone, masks, strict=True))
    for alone, got in zip(weights_alone, weights, strict=True):
        assert all(torch.equal(alone[k], got[k]) for k in alone)


def test_seeded_gives_the_generator_back() -> None:
    from splitfed.models import rng

    torch.default_generator.manual_seed(123)
    expected = torch.rand(3)
    torch.default_generator.manual_seed(123)
    with rng.seeded(7):
        inside = torch.rand(3)
    with rng.seeded():
        torch.rand(10)  # drawing without a seed is given back too
    assert torch.equal(torch.rand(3), expected)  # as if nothing had drawn
    torch.default_generator.manual_seed(7)
    assert torch.equal(torch.rand(3), inside)
