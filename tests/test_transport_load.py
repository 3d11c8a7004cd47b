"""64 devices (threads, one channel each) train at once against one edge tier process on loopback."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from splitfed.engine.device import Device
from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.errors import NotFound
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.process import TierProcess
from tests.transport_fixtures import SPEC

pytestmark = pytest.mark.xdist_group("transport-processes")

CLIENTS = 64
STEPS = 5
BATCH = 8
CUT = 3


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the most resident memory the process ever had (Linux), else its current RSS."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def test_64_concurrent_devices_against_one_edge(record_property: pytest.RecordProperty) -> None:
    state = initial_state(SPEC, 0)
    errors: list[BaseException] = []
    steps_done = [0] * CLIENTS
    barrier = threading.Barrier(CLIENTS)
    with TierProcess.start("edge", insecure=True) as edge:
        idle_mib = peak_rss_mib(edge.pid)

        def device(i: int) -> None:
            cid = f"dev{i}"
            try:
                with GrpcTierClient(edge.address, deadline_s=120) as link:
                    cfg = RoundConfig("load", 0, SPEC, "sflv1")
                    (load,) = tier_loads(cfg, cid, (CUT,), state)
                    link.load(load)
                    dev = Device(SPEC, link, run_id="load", client_id=cid, round=0, cuts=(CUT,), state=state)
                    g = torch.Generator().manual_seed(i)
                    barrier.wait(60)  # all 64 train at the same time
                    for _ in range(STEPS):
                        x = torch.randn(BATCH, *SPEC.input_shape, generator=g)
                        dev.train_step(x, torch.randint(0, SPEC.num_classes, (BATCH,), generator=g))
                        steps_done[i] += 1
                    trained = link.fetch("load", cid)
                    assert trained.keys() == {k for k in state if int(k.split(".")[0]) >= CUT}
                    link.release("load", cid)
                    try:
                        link.fetch("load", cid)
                        raise AssertionError("released client still served")
                    except NotFound:
                        pass
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=device, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), "a device hung"
        peak = peak_rss_mib(edge.pid)
        assert edge.alive()
    record_property("edge_idle_rss_mib", round(idle_mib, 1))
    record_property("edge_peak_rss_mib", round(peak, 1))
    print(f"\nedge tier: idle RSS {idle_mib:.0f} MiB, peak RSS {peak:.0f} MiB with {CLIENTS} concurrent clients")
    assert not errors, errors[:3]
    assert steps_done == [STEPS] * CLIENTS
    assert peak < 2048, f"edge peak RSS {peak:.0f} MiB"
