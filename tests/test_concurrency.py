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
