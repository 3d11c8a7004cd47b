"""A local chain of tier processes starts all its tiers at once (the ports chosen before they start), each
pointed at the next; a port taken meanwhile is chosen again; whatever fails, no tier is left running."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from splitfed import ports
from splitfed.transport import process
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.process import TierProcess, TierStartError, local_chain

pytestmark = pytest.mark.xdist_group("transport-processes")


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@contextmanager
def _watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """What the chain did, in order: ("spawn", name) and ("ready", name); a tier spawned with an address
    already (one it does not serve yet) is ("spawned with an address", name)."""
    events: list[tuple[str, str]] = []
    spawn, wait_ready = TierProcess.spawn, TierProcess.wait_ready

    def spy_spawn(name: str, *a, **k) -> TierProcess:  # type: ignore[no-untyped-def]
        tp = spawn(name, *a, **k)
        events.append(("spawn", name) if tp.address == "" else ("spawned with an address", name))
        return tp

    def spy_ready(self: TierProcess) -> None:
        wait_ready(self)
        events.append(("ready", self.name))

    monkeypatch.setattr(TierProcess, "spawn", spy_spawn)
    monkeypatch.setattr(TierProcess, "wait_ready", spy_ready)
    yield events


def test_a_chain_starts_every_tier_before_it_waits_for_any_and_each_forwards_to_the_next(monkeypatch) -> None:
    """Also what test_a_spawned_tier_has_no_address_until_it_serves asked with a process of its own: a spawned
    tier has no address (``_watched``) until it is ready, then serves (Describe) at it, and is gone once
    stopped."""
    with _watched(monkeypatch) as events, \
            local_chain(["edge", "tier2", "cloud"], ["fp16", "int8"], insecure=True) as procs:
        addresses = [p.address for p in procs]
        infos = []
        for address in addresses:
            with GrpcTierClient(address) as c:
                infos.append(c.describe())
        pids = [p.pid for p in procs]
    # before: the cloud was started and awaited, then tier2, then the edge (three starts' time, one after another)
    assert events == [("spawn", "cloud"), ("spawn", "tier2"), ("spawn", "edge"),
                      ("ready", "cloud"), ("ready", "tier2"), ("ready", "edge")]
    assert [i.name for i in infos] == ["edge", "tier2", "cloud"]
    assert [i.next_address for i in infos] == [*addresses[1:], ""]
    assert [i.next_instance for i in infos[:2]] == [i.instance for i in infos[1:]]  # reached, not just named
    assert [i.next_compress for i in infos] == ["fp16", "int8", ""]
    assert len(set(addresses)) == 3 and _gone(pids)


def test_a_port_taken_before_its_tier_binds_it_is_chosen_again(monkeypatch) -> None:
    """Another process takes the port chosen for the cloud before the cloud binds it: the chain is started
    again on other ports, and what the first try started is stopped."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        calls: list[list[int]] = []

        def choose(n: int) -> list[int]:
            calls.append([taken] * n if not calls else ports.free_ports(n))
            return calls[-1]

        monkeypatch.setattr(process, "free_ports", choose)
        spawned: list[TierProcess] = []
        spawn = TierProcess.spawn
        monkeypatch.setattr(TierProcess, "spawn", lambda *a, **k: spawned.append(spawn(*a, **k)) or spawned[-1])
        with local_chain(["edge", "cloud"], insecure=True) as (edge, cloud):
            assert cloud.port == calls[1][0] != taken
            with GrpcTierClient(edge.address) as c:
                assert c.describe().next_address == cloud.address
            pids = [p.pid for p in spawned]
            assert len(spawned) == 4 and _gone(pids[:2]) and not _gone(pids[2:])  # the first try's, stopped
        assert _gone(pids)


def test_a_port_still_taken_after_the_last_try_is_said_and_leaves_nothing(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(process, "free_ports", lambda n: [taken] * n)
        spawned: list[TierProcess] = []
        spawn = TierProcess.spawn
        monkeypatch.setattr(TierProcess, "spawn", lambda *a, **k: spawned.append(spawn(*a, **k)) or spawned[-1])
        with pytest.raises(TierStartError, match=f"cannot listen on 127.0.0.1:{taken}") as e, \
                local_chain(["edge", "cloud"], insecure=True, tries=2):
            pass
    assert e.value.port_taken and len(spawned) == 4 and _gone([p.pid for p in spawned])


def test_a_tier_that_fails_for_another_reason_is_not_started_again(monkeypatch) -> None:
    """A tier refusing its flags (plaintext without --insecure) fails the same way on any port: said at once,
    from the first try."""
    calls: list[int] = []
    monkeypatch.setattr(process, "free_ports", lambda n: calls.append(n) or ports.free_ports(n))
    with pytest.raises(TierStartError, match="(?s)exited with code 2 before serving.*refusing to serve without TLS") \
            as e, local_chain(["edge", "cloud"]):
        pass
    assert not e.value.port_taken and calls == [1]


def test_a_chain_left_by_an_error_or_ctrl_c_stops_every_tier() -> None:
    for stop in (RuntimeError("the run failed"), KeyboardInterrupt()):
        with pytest.raises(type(stop)), local_chain(["edge", "cloud"], insecure=True) as procs:
            pids = [p.pid for p in procs]
            assert not _gone(pids)
            raise stop
        assert _gone(pids)


def test_a_chain_is_given_one_codec_per_link() -> None:
    with pytest.raises(ValueError, match=r"a chain of 2 tier\(s\) has 1 link\(s\) between them, not 2 codec"):
        with local_chain(["edge", "cloud"], ["fp16", "fp16"], insecure=True):
            pass


@pytest.mark.parametrize("tries", [0, -1])
def test_a_chain_is_started_at_least_once(tries: int) -> None:
    """No tries would start nothing and leave the ``with`` block without its tiers: refused up front."""
    with pytest.raises(ValueError, match=rf"tries must be at least 1 \(one start of the chain\), not {tries}"):
        with local_chain(["edge", "cloud"], insecure=True, tries=tries):
            pass
