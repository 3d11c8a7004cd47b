"""A tier restarted mid-run is checked as the chain was before round 1.

The chain check (protocol, model, ``--compress``, idle release, ``--next``, token) ran once, at the start; at each
round's start the coordinator only asked the edge for its instance (``server.app._edge_now``). An edge restarted
with another ``--compress`` then sent every activation to the cloud top-k compressed while the run priced and
expected none, and one restarted with ``--idle-release-s 1`` (a cloud too) could release a slow round's segments:
the rounds went on, silently. Now a new instance of any tier gets the chain check again, and a refusal names the
tier, its address and the setting. The tiers are real: gRPC servers and tier processes on 127.0.0.1, restarted
on the same port (a new process: a new instance).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.process import TierProcess
from splitfed.transport.server import serve_tier

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("transport-processes")]


def _settings(edge: str, cloud: str) -> RunSettings:
    return RunSettings(model="cnn", tiers=3, cuts="static:1,3", tier_addresses=f"{edge},{cloud}", round_timeout_s=30)


def _instance(address: str) -> str:
    """The instance of the tier at ``address`` now, asked apart from the run's own clients."""
    with GrpcTierClient(address, insecure=True, deadline_s=10.0) as c:
        return c.describe(shallow=True).instance


def _refusal(edge_now: Callable[[], str]) -> str:
    with pytest.raises(ConfigError) as e:
        edge_now()
    return str(e.value)


def test_an_edge_restarted_with_a_conflicting_setting_is_refused_naming_it() -> None:
    """The edge is a gRPC server in this process, stopped and served again on its port (a new service: a new
    instance), as often as the case needs; a tier process restarted on its port is the edge of
    ``test_a_run_whose_edge_restarts_with_another_compress_stops_naming_it_and_keeps_its_rounds``."""
    from server.app import _edge_now
    from splitfed.sim.tiers import tier_chain

    with serve_tier("cloud", insecure=True) as cloud, serve_tier("cloud2", insecure=True) as other:
        edge = serve_tier("edge", next_address=cloud.address, insecure=True)
        address = edge.address

        def restart(next_address: str = cloud.address, compress: str = "none", **options: float) -> None:
            nonlocal edge
            edge.stop(grace=0)
            edge = serve_tier("edge", address, next_address, insecure=True, next_compress=compress,
                              **options)  # type: ignore[arg-type]

        try:
            settings = _settings(address, cloud.address)
            with tier_chain(settings) as chain:
                edge_now = _edge_now(chain, settings)
                assert edge_now is not None
                first = edge_now()
                assert first == chain.infos[0].instance  # nothing restarted: the instance of the chain check

                restart(cloud.address, "topk:0.1")
                why = _refusal(edge_now)
                assert f"tier edge at {address} restarted (instance {first}, now {_instance(address)})" in why
                assert "--compress topk:0.1" in why and "compresses every link with none" in why

                restart(other.address, "none", idle_release_s=1)
                why = _refusal(edge_now)  # every problem, in one error
                assert f"tier edge at {address} forwards to {other.address}" in why
                assert f"tier edge at {address} releases segments idle for 1 s" in why
                assert chain.infos[0].instance == first  # a refused tier is not taken for checked

                restart()  # as the run wants it: checked, and the one the nodes are told
                now = _instance(address)
                assert now != first
                assert edge_now() == now == chain.infos[0].instance
                assert edge_now() == now  # and not refused again
        finally:
            edge.stop(grace=0)


def test_a_cloud_restarted_behind_the_edge_is_checked_too() -> None:
    """The edge stays (its instance too): only the cloud's own instance says it restarted. The cloud is a gRPC
    server in this process served again on its port (a new instance), as in the test above."""
    from server.app import _edge_now
    from splitfed.sim.tiers import tier_chain

    cloud = serve_tier("cloud", insecure=True)
    address = cloud.address
    try:
        with serve_tier("edge", next_address=address, insecure=True) as edge:
            settings = _settings(edge.address, address)
            with tier_chain(settings) as chain:
                edge_now = _edge_now(chain, settings)
                assert edge_now is not None
                before = chain.infos[1].instance

                cloud.stop(grace=0)
                cloud = serve_tier("cloud", address, insecure=True, idle_release_s=1)
                why = _refusal(edge_now)
                assert f"tier cloud at {address} restarted (instance {before}, now {_instance(address)})" in why
                assert f"tier cloud at {address} releases segments idle for 1 s" in why
                assert "round-timeout-s 30" in why

                cloud.stop(grace=0)
                cloud = serve_tier("cloud", address, insecure=True)
                assert edge_now() == _instance(edge.address) == chain.infos[0].instance  # the edge the nodes are told has not changed
                assert chain.infos[1].instance == _instance(address) != before
                assert chain.infos[0].next_instance == chain.infos[1].instance  # the edge reaches the new one
    finally:
        cloud.stop(grace=0)


def test_a_run_whose_edge_restarts_with_another_compress_stops_naming_it_and_keeps_its_rounds(tmp_path) -> None:
    """The whole coordinator (``server.app.run``, real ClientApps on a FakeGrid): the edge restarted after round
    1 with ``--compress topk:0.1`` stops the run at round 2's start, naming the setting; round 1 is kept, and
    the folder records the run failed, resumable once the edge is right again."""
    import json

    import clients.app
    import server.app
    from splitfed.flower import runstatus
    from tests.flower_fixtures import FakeGrid

    with serve_tier("cloud", insecure=True) as cloud:
        edge = TierProcess.start("edge", next_address=cloud.address, insecure=True)
        address = edge.address

        def restart(line: str) -> None:
            nonlocal edge
            if line.startswith("round 1/"):
                edge.kill()
                edge = TierProcess.start("edge", listen=address, next_address=cloud.address, insecure=True,
                                         compress="topk:0.1")

        try:
            s = RunSettings(model="cnn", rounds=3, clients=2, min_clients=1, tiers=3, cuts="static:1,3",
                            tier_addresses=f"{address},{cloud.address}", out=str(tmp_path), node_wait_s=5,
                            round_timeout_s=30)
            with pytest.raises(ConfigError, match=r"tier edge at .* restarted .* --compress topk:0\.1"):
                server.app.run(FakeGrid(clients.app.app, 2), s, progress=restart)
        finally:
            edge.kill()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1]
    assert runstatus.status(tmp_path).state == "failed"
