"""What ``splitfed.sim.tiers`` promises that the mutation run found unpinned.

- a chain of three server tiers is ``edge``, ``tier2``, ``cloud``; the tiers a run starts (one chain, real
  processes on 127.0.0.1) get the run's mutual TLS (its CA: a client without a certificate is refused, and
  each tier reaches its next one), the devices' token (a call without it is refused), a coordinator token
  made for the run (the devices' token may not load), and each link's own codec; the made token file may
  vanish before the block ends without the block failing;
- at a round's start (``check_restarted``) every tier is asked for its instance with a shallow Describe: a
  silent tier behind the edge is left to the round's loads (and one that hangs does not hold the edge's
  answer), a silent edge raises; only the tiers restarted are named when the chain check refuses them, and
  after a restart that passes the check the edge's (new) instance is the answer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.tier import Tier
from splitfed.errors import ConfigError, TierError
from splitfed.flower.config import RunSettings
from splitfed.flower.transport import connect
from splitfed.sim import tiers
from splitfed.sim.tiers import check_restarted, tier_chain, tier_names
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import PermissionDenied, Unauthenticated
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import SPEC, Certs, certs  # noqa: F401

pytestmark = pytest.mark.xdist_group("transport-processes")

DEVICE = "devices-token-7f3a"
RUN = "run-tok"


def test_three_server_tiers_are_the_edge_tier2_and_the_cloud() -> None:
    assert tier_names(3) == ["edge", "tier2", "cloud"]
    assert tier_names(5) == ["edge", "tier2", "tier3", "tier4", "cloud"]


def test_a_started_chain_of_three_gets_the_runs_tls_tokens_and_codecs(tmp_path: Path, certs: Certs) -> None:  # noqa: F811
    """One chain, every setting at once: ``tiers=4`` starts three tier processes, each told its own link's
    codec, the run's certificate with its CA (mutual TLS, towards its next tier too), the devices' token and a
    coordinator token made for the run."""
    dev = tmp_path / "token"
    dev.write_text(DEVICE + "\n")
    tls = {"tls_cert": str(certs.server.cert), "tls_key": str(certs.server.key), "tls_ca": str(certs.ca)}
    s = RunSettings(tiers=4, cuts="static:1,3,5", compress="none,fp16,int8", token_file=str(dev), sim_clock=False,
                    **tls)  # (more tiers than a fleet's edge and cloud: timed as measured)
    with tier_chain(s) as chain:
        infos = chain.infos
        assert [i.name for i in infos] == ["edge", "tier2", "cloud"]
        assert [i.next_compress for i in infos] == ["fp16", "int8", ""]  # link 1 and link 2, not link 0's
        assert [i.next_instance for i in infos[:2]] == [infos[1].instance, infos[2].instance]  # TLS onward
        assert [i.control_token for i in infos] == [True, True, True]
        made = Path(chain.coordinator_token_file)
        assert made.is_file() and made.read_text() not in ("", DEVICE, DEVICE + "\n")
        edge = chain.addresses[0]
        # mutual TLS: the run's CA is the tiers' too, so a client presenting no certificate is refused
        with GrpcTierClient(edge, tls=certs.no_cert, token=DEVICE, retries=0, deadline_s=10.0) as c:
            with pytest.raises(TierError):
                c.describe(shallow=True)
        # the devices' token: none is refused; it describes, but may not load (the coordinator's may)
        with connect(edge, **tls) as c:
            with pytest.raises(Unauthenticated, match="missing bearer token"):
                c.describe(shallow=True)
        (load, _, _) = tier_loads(RoundConfig(RUN, 0, SPEC, binding_key="k"), "client0", (1, 3, 5),
                                  initial_state(SPEC, 0))
        with connect(edge, token_file=str(dev), **tls) as c:
            assert c.describe(shallow=True).instance == infos[0].instance
            with pytest.raises(PermissionDenied, match="Load needs the coordinator's token"):
                c.load(load)
        chain.controls[0].load(load)
        chain.controls[0].release(RUN, "client0", load.secret)
        made.unlink()  # gone before the block ends (a temp cleaner): the run ends as it would, no error
    assert not made.exists()


@contextmanager
def _in_process_chain() -> Iterator[tuple[RunSettings, dict[str, TierServer], ExitStack]]:
    """Edge -> cloud in this process, plaintext: the settings, the server serving at each name now, the stack."""
    with ExitStack() as stack:
        cloud = stack.enter_context(serve_tier("cloud", insecure=True))
        edge = stack.enter_context(serve_tier("edge", next_address=cloud.address, insecure=True))
        s = RunSettings(model="cnn", tiers=3, cuts="static:1,3", tier_addresses=f"{edge.address},{cloud.address}",
                        round_timeout_s=30)
        yield s, {"edge": edge, "cloud": cloud}, stack


class _Stuck(Tier):
    """A tier whose Describe does not answer until ``go_on`` is set; ``asked``: the Describes it got."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.go_on = threading.Event()
        self.asked = 0

    def holding(self) -> tuple[int, list[str], int]:
        self.asked += 1
        self.go_on.wait(20)
        return super().holding()


def _instance(srv: TierServer) -> str:
    assert srv.servicer is not None
    return srv.servicer.instance


def test_a_restarted_tier_is_named_alone_and_the_edges_instance_is_the_answer(monkeypatch) -> None:  # noqa: ANN001
    """Each tier restarted (stopped, and a new one served at its address): one refused by the chain check
    is named with its new instance, and no other tier is; one that passes it is taken, and the answer stays
    the edge's instance (the new one when the edge restarted). A cloud that is down or hangs is left to the
    loads (the edge is asked about itself only); an edge that is down raises."""
    with _in_process_chain() as (s, srv, stack), tier_chain(s) as chain:
        clients = list(chain.controls)
        for c in clients:  # a tier that is down is said to be after its retries: quick ones
            assert isinstance(c, GrpcTierClient)
            c.backoff_s = 0.01
        edge_addr, cloud_addr = chain.addresses
        first = _instance(srv["edge"])
        assert check_restarted(s, chain, clients) == first == chain.infos[0].instance

        def restart(name: str, **kw) -> str:  # type: ignore[no-untyped-def]
            srv[name].stop(0)
            srv[name] = stack.enter_context(serve_tier(name, listen=chain.addresses[name == "cloud"],
                                                       insecure=True, **kw))
            return _instance(srv[name])

        old_cloud = chain.infos[1].instance
        bad = restart("cloud", idle_release_s=1)
        with pytest.raises(ConfigError) as e:
            check_restarted(s, chain, clients)
        why = str(e.value)
        assert f"tier cloud at {cloud_addr} restarted (instance {old_cloud}, now {bad}) since" in why
        assert f"tier cloud at {cloud_addr} releases segments idle for 1 s" in why
        assert "tier edge" not in why.split(" since ")[0]  # the edge did not restart
        assert chain.infos[1].instance == old_cloud  # a refused tier is not taken for checked

        good = restart("cloud")
        assert check_restarted(s, chain, clients) == first  # the edge's, not the restarted cloud's
        assert chain.infos[1].instance == good != old_cloud

        srv["cloud"].stop(0)
        stuck = _Stuck("cloud")
        try:  # a cloud whose Describe hangs: left to the loads; the edge is asked about itself only
            srv["cloud"] = stack.enter_context(serve_tier("cloud", listen=cloud_addr, insecure=True, tier=stuck))
            monkeypatch.setattr(tiers, "INSTANCE_DESCRIBE_S", 1.0)
            assert check_restarted(s, chain, clients) == first
            assert stuck.asked == 1  # the coordinator's call alone: the edge's Describe did not go on to it
            monkeypatch.undo()
            srv["cloud"].stop(0)
        finally:
            stuck.go_on.set()
        assert check_restarted(s, chain, clients) == first  # down: the edge answers, the loads will say the rest
        restart("cloud")

        srv["edge"].stop(0)
        srv["edge"] = stack.enter_context(serve_tier("edge", listen=edge_addr, next_address=cloud_addr,
                                                     insecure=True))
        new = _instance(srv["edge"])
        assert check_restarted(s, chain, clients) == new == chain.infos[0].instance != first

        srv["edge"].stop(0)
        with pytest.raises(TierError):
            check_restarted(s, chain, clients)
