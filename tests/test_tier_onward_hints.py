"""A tier's own connection to its ``--next`` words its refusal hints for that tier, at their source.

The hints of a plaintext connection a TLS tier closed, and of a call without a token, name ping's and a run's
flags (``--tls-ca / tls-ca``, ``--token-file / token-file``). A tier's connection to its ``--next`` is fixed with
``splitfed tier`` flags instead; ping used to reword the hints inside an edge's ``next_error`` afterwards, so the
edge's own Describe answer, and the error a run got for a step the edge relayed, still told the run's user to fix
the run's flags, on a link that works. Real tiers on 127.0.0.1, certificates made by the test.
"""

from __future__ import annotations

import pytest
import torch

from splitfed.engine import template
from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.types import StepKey
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import Unauthenticated, Unavailable
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import SPEC, Certs, certs, labels  # noqa: F401 - fixture

EDGE_NO_TLS = ("Socket closed (its next tier serves TLS, and closes a plaintext connection this way: start tier edge "
               "with --tls-cert, --tls-key and, as --tls-ca, the CA that signed its next tier's certificate; or serve "
               "its next tier --insecure too, on a trusted loopback only)")
EDGE_NO_TOKEN = ("missing bearer token (authorization metadata) (tier edge sent no token: start it with --token-file, "
                 "a file holding its next tier's token)")
PING_NO_TLS = ("Socket closed (a tier that serves TLS closes a plaintext connection this way: connect with the CA "
               "that signed its certificate, e.g. --tls-ca / tls-ca)")
PING_NO_TOKEN = ("missing bearer token (authorization metadata) (this connection sent no token: give --token-file / "
                 "token-file, a file holding the tier's token)")


def _edge_loaded(edge: TierServer) -> torch.Tensor:
    """Client "a" bound on the edge (blocks [1, 3), forwarding the rest); the edge's input."""
    edge_load, _ = tier_loads(RoundConfig("run", 0, SPEC), "a", (1, 3), initial_state(SPEC, 0))
    edge.tier.load(edge_load)
    assert edge.next_link is not None
    edge.next_link.retries = 0  # the refusal at once, not after the edge's backoff
    shape, dtype = template.boundary(SPEC, 1)
    return torch.randn(4, *shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def test_a_step_relayed_by_a_plaintext_edge_to_a_tls_cloud_names_the_edges_flags(certs: Certs) -> None:  # noqa: F811
    with serve_tier("cloud", tls=certs.server_tls_only) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True, next_deadline_s=5) as edge:
        x = _edge_loaded(edge)
        with GrpcTierClient(edge.address, retries=0, deadline_s=10) as device, pytest.raises(Unavailable) as e:
            device.step(StepKey("run", "a", 0, 0), x, labels())
        said = str(e.value)  # gRPC's own words before "Socket closed" vary ("failed to connect ...: ")
        assert said.startswith(f"tier {edge.address}: step 0 of a: unavailable after 1 attempt(s): tier "
                               f"{cloud.address}: step 0 of a: unavailable after 1 attempt(s): "), said
        assert said.endswith(f": {EDGE_NO_TLS}") and "--tls-ca / tls-ca" not in said, said
        # the edge's own answer to Describe says it so: nobody rewords it on the way
        with GrpcTierClient(edge.address, retries=0, deadline_s=10) as c:
            said = c.describe().next_error
        assert said.startswith(f"UNAVAILABLE: tier {cloud.address}: describe: unavailable after 1 attempt(s): "), said
        assert said.endswith(f": {EDGE_NO_TLS}") and "--tls-ca / tls-ca" not in said, said
        # a device's (ping's, a run's) own plaintext connection to the cloud is still told its own flags
        with GrpcTierClient(cloud.address, retries=0, deadline_s=10) as device, pytest.raises(Unavailable) as e:
            device.describe()
        said = str(e.value)
        assert said.startswith(f"tier {cloud.address}: describe: unavailable after 1 attempt(s): "), said
        assert said.endswith(f": {PING_NO_TLS}") and "start tier" not in said, said


def test_a_step_relayed_by_an_edge_without_a_token_names_the_edges_token_file() -> None:
    with serve_tier("cloud", insecure=True, token="s3cret") as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        x = _edge_loaded(edge)
        with GrpcTierClient(edge.address, retries=0, deadline_s=10) as device, pytest.raises(Unauthenticated) as e:
            device.step(StepKey("run", "a", 0, 0), x, labels())
        assert str(e.value) == (f"tier {edge.address}: step 0 of a: tier {cloud.address}: step 0 of a: "
                                f"{EDGE_NO_TOKEN}")
        with GrpcTierClient(edge.address, retries=0, deadline_s=10) as c:
            assert c.describe().next_error == f"UNAUTHENTICATED: tier {cloud.address}: describe: {EDGE_NO_TOKEN}"
        with GrpcTierClient(cloud.address, retries=0, deadline_s=10) as device, \
                pytest.raises(Unauthenticated) as e:
            device.describe()
        assert str(e.value) == f"tier {cloud.address}: describe: {PING_NO_TOKEN}"


def test_the_hints_name_the_tier_by_its_own_name() -> None:
    with serve_tier("cloud", insecure=True, token="s3cret") as cloud, \
            serve_tier("gateway-7", next_address=cloud.address, insecure=True) as edge, \
            GrpcTierClient(edge.address, retries=0, deadline_s=10) as c:
        assert c.describe().next_error.endswith("(tier gateway-7 sent no token: start it with --token-file, a file "
                                                "holding its next tier's token)")
