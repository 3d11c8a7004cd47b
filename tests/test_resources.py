"""Long runs hold their resources flat: nothing a tier, a coordinator or a device holds grows with rounds.

A user runs hundreds of rounds with dozens of devices against long-lived tier services. These tests drive the
real code paths (in-process tiers, ``splitfed tier`` processes on 127.0.0.1, the in-process backend; a real
``splitfed simulate`` in tests/test_ray_session.py) for a few rounds and then some more, and compare what is held at an early and at a late
round: segments and replicas on the tiers, request streams a tier watches, open descriptors and threads of the
tier processes and of their caller, tensors and modules of the coordinator. Counts, never timings; the slack
absorbs a thread pool that grows to its load, not a leak of one thing per client per round.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import torch
from torch import nn

from splitfed.engine import template
from splitfed.engine.link import InProcessLink
from splitfed.engine.rounds import (
    Chain,
    Outcome,
    RoundConfig,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    train_client,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import MODES, State, StepKey
from splitfed.errors import NotFound
from splitfed.flower.config import RunSettings
from splitfed.flower.transport import connect
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.chain import close_chain, grpc_chain
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import method, pb
from splitfed.transport.process import TierProcess
from splitfed.transport.server import serve_tier
from tests.test_tier import FakeClock
from tests.transport_fixtures import SPEC

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc (Linux)")

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def _data(clients: int, batches: int = 2, batch: int = 8) -> dict[str, Batches]:
    g = torch.Generator().manual_seed(0)
    return {f"c{i}": [(torch.randn(batch, *SPEC.input_shape, generator=g),
                       torch.randint(0, SPEC.num_classes, (batch,), generator=g)) for _ in range(batches)]
            for i in range(clients)}


def _held(tiers: list[Tier]) -> list[tuple[int, int]]:
    """(segments bound, replicas kept) of each tier."""
    return [(len(t._bindings), len(t._replicas)) for t in tiers]


def _usage(pid: int | str = "self") -> tuple[int, int]:
    """(open file descriptors, threads) of a process, from /proc."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return fds, int(next(line.split()[1] for line in status if line.startswith("Threads:")))


# ---------------------------------------------------------------- a round leaves nothing on its tiers


@pytest.mark.parametrize("u_shape", [False, True], ids=["plain", "u-shape"])
@pytest.mark.parametrize("mode", MODES)
def test_no_segment_or_replica_outlives_its_round_whatever_its_clients_do(mode: str, u_shape: bool) -> None:
    """Each round, one client never answers, one returns NaN weights, one (U-shape) vanishes between its
    forward and its backward holding its replica's lock, and in the last round the coordinator itself fails
    mid-round: after every round both tiers hold no segment and no replica."""
    chain = inprocess_chain(2)
    tiers = [t for t in chain.tiers if isinstance(t, Tier)]
    state = initial_state(SPEC, 0)
    cuts = (1, 3, 6) if u_shape else (2, 4)
    data = _data(6)
    for rnd in range(1, 4):
        cfg = RoundConfig("run", rnd, SPEC, mode, u_shape)
        split = SplitRound(cfg, chain.tiers, state, {c: cuts for c in data}, min_clients=1)
        train = local_trainer(chain, data, failed={})

        def trainer(cfg: RoundConfig, group: Mapping[str, tuple[int, ...]], weights: Mapping[str, State],
                    rnd: int = rnd, train: Any = train) -> dict[str, Outcome]:
            out = dict(train(cfg, group, weights))
            out.pop("c1", None)  # never answers
            if "c2" in out:  # diverged on the device
                next(iter(out["c2"].state.values())).fill_(float("nan"))
            if u_shape and "c4" in out:  # its next forward reaches the tiers, its backward never does
                shape, dtype = template.boundary(SPEC, cuts[0])
                key = StepKey(cfg.run_id, "c4", cfg.round, len(data["c4"]), cfg.secret_of("c4"))
                chain.link.forward(key, torch.zeros(8, *shape, dtype=dtype))
                del out["c4"]
            if rnd == 3 and "c3" in group:
                raise RuntimeError("the coordinator fails mid-round")
            return out

        try:
            state = drive(split, trainer)
        except RuntimeError:
            assert rnd == 3
        assert _held(tiers) == [(0, 0), (0, 0)], f"round {rnd}"


def test_a_vanished_coordinators_segments_go_at_the_idle_release() -> None:
    """A coordinator that loads a round of 30 clients and vanishes (no end, no finish, no release) leaves its
    segments and replicas only until the tiers' idle release."""
    clock = FakeClock()
    cloud = Tier("cloud", idle_release_s=100.0, clock=clock)
    edge = Tier("edge", InProcessLink(cloud), idle_release_s=100.0, clock=clock)
    clients = {f"c{i}": (2, 4) for i in range(30)}
    split = SplitRound(RoundConfig("gone", 1, SPEC), [edge, cloud], initial_state(SPEC, 0), clients)
    split.begin(split.groups()[0])
    assert _held([edge, cloud]) == [(30, 30), (30, 30)]
    clock.now += 99.0
    assert edge.sweep() == [] and cloud.sweep() == []
    clock.now += 2.0
    assert len(edge.sweep()) == 30 and len(cloud.sweep()) == 30
    assert _held([edge, cloud]) == [(0, 0), (0, 0)]


# ---------------------------------------------------------------- request streams a tier watches


def test_a_tier_stops_watching_every_request_stream_once_it_ends() -> None:
    """Loads, U-shape forwards and backwards, malformed streams and refused calls: afterwards the tier
    watches no request stream (each watched one would keep an entry, and its watcher thread, alive)."""
    srv = serve_tier("cloud", insecure=True, max_workers=4)
    assert srv.servicer is not None
    watched = srv.servicer.idle_streams
    state = initial_state(SPEC, 0)
    cfg = RoundConfig("run", 0, SPEC, u_shape=True)
    raw = grpc.insecure_channel(srv.address)
    try:
        with GrpcTierClient(srv.address) as c:
            split = SplitRound(cfg, [c], state, {f"c{i}": (2, 5) for i in range(8)})
            split.begin(split.groups()[0])  # 8 Load streams
            for i in range(8):
                key = StepKey("run", f"c{i}", 0, 0, split.cfg.secret_of(f"c{i}"))
                out = c.forward(key, torch.randn(4, 16, 4, 4))  # StepStream
                c.backward(key, torch.randn(*out.shape))
                with pytest.raises(NotFound):
                    c.forward(StepKey("run", f"nobody{i}", 0, 0), torch.randn(4, 16, 4, 4))
            for call in (raw.stream_stream(method("StepStream")), raw.stream_unary(method("Load"))):
                for _ in range(4):
                    with pytest.raises(grpc.RpcError) as e:
                        reply = call(iter([b"\x07not a frame"] * 3), timeout=30)
                        if isinstance(reply, Iterator):
                            list(reply)
                    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            split.close()
        for _ in range(100):  # the last handler may still be ending as its caller reads the status
            gc.collect()  # a refused stream's generator ends when it is collected, as it would be anyway
            if not watched._open:
                break
            time.sleep(0.1)
        assert not watched._open, f"{len(watched._open)} request stream(s) still watched"
        assert srv.tier.holding()[0] == 0
    finally:
        raw.close()
        srv.stop(0)


# ---------------------------------------------------------------- tier processes and their callers


def _crash_mid_step(address: str, key: StepKey) -> None:
    """A device that opens a step's stream, sends its first frame, and vanishes."""
    head = pb.StepHeader(run_id=key.run_id, client_id=key.client_id, round=key.round, seq=key.seq,
                         phase=pb.PHASE_STEP, secret=key.secret)
    tensors = [("", tc.encode(torch.randn(4, 16, 4, 4), tc.NONE)), ("", tc.encode(torch.arange(4), tc.NONE))]
    first = next(iter(wire.iter_frames(head, tensors, 64)))
    gone = threading.Event()

    def frames() -> Iterator[bytes]:
        yield first
        gone.wait(30)

    channel = grpc.insecure_channel(address)
    try:
        call = channel.stream_stream(method("StepStream"))(frames(), timeout=30)
        call.cancel()
    finally:
        gone.set()
        channel.close()


@pytest.mark.slow
@pytest.mark.xdist_group("transport-processes")
def test_tier_processes_and_their_callers_hold_flat_descriptors_threads_and_segments() -> None:
    """Edge and cloud processes over 12 rounds of 6 clients, each client on a channel of its own per round
    (as the ClientApp connects), one of them crashing mid-step every round: the tiers' descriptors and threads,
    and the caller's descriptors and live gRPC channels, are at round 12 what they were at round 2, and no
    segment outlives a round."""
    clients, early, rounds = 6, 2, 12
    data = _data(clients, batches=1)
    with TierProcess.start("cloud", insecure=True) as cloud, \
            TierProcess.start("edge", next_address=cloud.address, insecure=True) as edge:
        chain = grpc_chain([edge.address, cloud.address])
        seen: dict[str, Any] = {}

        def devices(cfg: RoundConfig, cuts: Mapping[str, tuple[int, ...]],
                    weights: Mapping[str, State]) -> dict[str, Outcome]:
            out = {}
            for cid, w in weights.items():
                if cid == "c0":
                    _crash_mid_step(edge.address, StepKey(cfg.run_id, cid, cfg.round, 0, cfg.secret_of(cid)))
                    continue
                link = connect(edge.address)
                try:
                    dev, res = train_client(cfg, Chain([], link), cid, cuts[cid], w, data[cid])
                finally:
                    link.close()
                out[cid] = Outcome(dev.state(), res)
            return out

        try:
            state = initial_state(SPEC, 0)
            for rnd in range(1, rounds + 1):
                split = SplitRound(RoundConfig("res", rnd, SPEC), chain.tiers, state,
                                   {c: (2, 4) for c in data}, min_clients=1)
                state = drive(split, devices)
                assert split.failed == ["c0"]
                held = [t.describe().segments for t in chain.tiers if isinstance(t, GrpcTierClient)]
                assert held == [0, 0], f"round {rnd}"
                if rnd in (early, rounds):
                    gc.collect()
                    channels = sum(issubclass(type(o), grpc.Channel) for o in gc.get_objects())
                    seen[f"{rnd}"] = (_usage(edge.pid), _usage(cloud.pid), (_usage()[0], channels))
        finally:
            close_chain(chain)
    (e0, c0, me0), (e1, c1, me1) = seen[f"{early}"], seen[f"{rounds}"]
    grown = (f"round {early} -> {rounds}: edge {e0} -> {e1}, cloud {c0} -> {c1}, caller (fds, channels) "
             f"{me0} -> {me1}")
    assert e1[0] <= e0[0] + 3 and c1[0] <= c0[0] + 3, grown  # (fds, threads)
    assert e1[1] <= e0[1] + 8 and c1[1] <= c0[1] + 8, grown  # a pool grows to its load, not per client
    assert me1[0] <= me0[0] + 3 and me1[1] <= me0[1] + 2, grown  # channels to one address share a connection


# ---------------------------------------------------------------- the coordinator's process


def _torch_objects() -> tuple[int, int]:
    """(tensors, modules) alive in this process."""
    gc.collect()
    objs = gc.get_objects()
    return (sum(issubclass(type(o), torch.Tensor) for o in objs), sum(issubclass(type(o), nn.Module) for o in objs))


def test_the_inprocess_backend_holds_no_more_tensors_or_modules_after_more_rounds(tmp_path: Path) -> None:
    """The in-process backend (the ServerApp's rounds, its tiers, its clients and evaluation in one process):
    the tensors and modules alive after round 8 are those alive after round 2 (a client's weights kept per
    round would be dozens more)."""
    from splitfed.sim.inprocess import train_inprocess

    seen: dict[int, tuple[int, int]] = {}

    def progress(line: str) -> None:
        if line.startswith("round "):  # the run's own lines ("run ...", "wrote ...") come through here too
            rnd = int(line.split()[1].split("/")[0])
            if rnd in (2, 8):
                seen[rnd] = _torch_objects()

    train_inprocess(RunSettings(rounds=8, clients=2, tiers=3, cuts="static:2,5/1,4", dataset="synthetic",
                                out=str(tmp_path / "run")),
                    progress)
    (t2, m2), (t8, m8) = seen[2], seen[8]
    assert t8 <= t2 + 5 and m8 <= m2 + 2, f"tensors {t2} -> {t8}, modules {m2} -> {m8}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
