"""A run's edge tier restarted between rounds (the same port, a new process: a new instance id).

The coordinator told each node the edge instance it found before round 1, and a node whose own
``edge-address`` names the edge otherwise (``localhost`` for ``127.0.0.1``) compared the edge it reaches
now with that old instance: it was refused every round after the restart, though both names reach the
same, new, edge. The edge is a real gRPC server in this process, stopped and served again on its port (a new
service: a new instance, as a new process has), the nodes the real ClientApp on a FakeGrid; an edge restarted
as a new process in a run is test_restarted_tier_check's
test_a_run_whose_edge_restarts_with_another_compress_stops_naming_it_and_keeps_its_rounds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitfed.flower.config import RunSettings
from splitfed.transport.server import serve_tier

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("transport-processes")]


def test_a_node_naming_the_edge_otherwise_trains_after_the_edge_restarts(tmp_path: Path) -> None:
    import clients.app
    import server.app
    from tests.flower_fixtures import FakeGrid

    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge2", next_address=cloud.address, insecure=True) as other:
        edge = serve_tier("edge", next_address=cloud.address, insecure=True)
        address = edge.address
        instances = [_instance(address)]

        def restart(line: str) -> None:
            """The edge restarts after the chain check and registration (the ``run ...`` line: no node has
            checked its edge yet) and again between rounds 1 and 2 (each node has, against the old one)."""
            nonlocal edge
            if line.startswith(("run ", "round 1/")):
                edge.stop(grace=0)
                edge = serve_tier("edge", address, cloud.address, insecure=True)
                instances.append(_instance(address))

        try:
            s = RunSettings(model="cnn", rounds=2, clients=3, min_clients=2, tiers=3, cuts="static:1,3",
                            tier_addresses=f"{address},{cloud.address}", out=str(tmp_path), node_wait_s=5,
                            round_timeout_s=30)
            grid = FakeGrid(clients.app.app, 3)
            ctx = list(grid.contexts.values())
            ctx[0].node_config["edge-address"] = other.address  # truly another edge: refused every round
            ctx[1].node_config["edge-address"] = address.replace("127.0.0.1", "localhost")
            server.app.run(grid, s, progress=restart)
        finally:
            edge.stop(grace=0)
        assert other.tier.steps_served == 0
    assert len(set(instances)) == 3, instances  # each start its own instance
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["failed"] == ["client0"], row["why_failed"]
        assert sorted(row["per_client"]) == ["client1", "client2"]
        assert "reaches tier 'edge2'" in row["why_failed"]["client0"]
    checked = ctx[1].state.config_records[clients.app.EDGE_CHECKED]
    assert checked["instance"] == instances[-1]  # it checked the new edge, under its own name


def _instance(address: str) -> str:
    """The instance id of the tier at ``address`` (Describe), as the coordinator's chain check reads it."""
    from splitfed.transport.client import GrpcTierClient

    with GrpcTierClient(address, insecure=True, deadline_s=10.0) as c:
        return c.describe(shallow=True).instance
