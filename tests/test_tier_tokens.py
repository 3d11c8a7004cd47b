"""Two credentials on a tier: the devices' token steps, the coordinator's alone loads, fetches and releases.

Every device holds the tier's bearer token. With one token for every call a device could load a client id
before the coordinator did (a claim: the coordinator's load is then refused, its secret being another, and
the whole round fails), or load a segment without a secret that every token holder may use. A tier started
with ``--coordinator-token-file`` refuses both: Load, Fetch, Release and Reduce need the coordinator's token (the
devices' gets PERMISSION_DENIED, nothing changed), and a load without a binding secret is refused. Real gRPC
servers and real tier processes on 127.0.0.1.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from server.deploy import Deployment
from splitfed.cli import main
from splitfed.data import synthetic
from splitfed.engine.rounds import (
    Chain,
    RoundConfig,
    RoundFailed,
    SplitRound,
    initial_state,
    inprocess_chain,
    run_round,
    tier_loads,
)
from splitfed.engine.types import OptimConfig, StepKey
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.transport import connect
from splitfed.sim.tiers import tier_chain
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import PermissionDenied, Unauthenticated
from splitfed.transport.process import TierProcess
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import SPEC, Certs, activation, certs, labels, same  # noqa: F401

DEVICE = "devices-token-5b1e"
COORD = "coordinator-token-9c4d"
RUN = "run-tok"
CUTS = (2, 4)  # device [0, 2), edge [2, 4), cloud [4, 7)


@pytest.fixture
def chain(certs: Certs) -> Iterator[tuple[TierServer, TierServer]]:  # noqa: F811
    """Edge -> cloud, mutual TLS, each with the devices' token and the coordinator's."""
    with serve_tier("cloud", tls=certs.server, token=DEVICE, coordinator_token=COORD) as cloud, \
            serve_tier("edge", next_address=cloud.address, tls=certs.server, token=DEVICE,
                       coordinator_token=COORD) as edge:
        yield edge, cloud


def _client(certs: Certs, address: str, token: str | None) -> GrpcTierClient:  # noqa: F811
    return GrpcTierClient(address, tls=certs.client, token=token, retries=0, deadline_s=30.0)


def _denied(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(PermissionDenied) as e:
        call()
    msg = str(e.value)
    assert DEVICE not in msg and COORD not in msg  # no token is ever echoed
    return msg


def test_a_device_token_cannot_load_fetch_or_release_and_steps_its_own_segment(certs: Certs, chain) -> None:  # noqa: F811, ANN001
    """A device (its own certificate, the devices' token) that even knows the client's secret cannot load,
    fetch or release on either tier: PERMISSION_DENIED naming the coordinator token, and nothing changed.
    It steps its own segment (through the edge, which forwards with the devices' token), and the coordinator
    token fetches and releases what it loaded."""
    edge, cloud = chain
    coord = [_client(certs, edge.address, COORD), _client(certs, cloud.address, COORD)]
    device = [_client(certs, edge.address, DEVICE), _client(certs, cloud.address, DEVICE)]
    try:
        rnd = SplitRound(RoundConfig(RUN, 0, SPEC), coord, initial_state(SPEC, 0), {"client0": CUTS})
        rnd.begin(["client0"])  # the coordinator token loads
        secret = rnd.cfg.secret_of("client0")
        before = [t.tier.fetch(RUN, "client0", secret) for t in (edge, cloud)]
        loads = tier_loads(rnd.cfg, "client0", CUTS, initial_state(SPEC, 1))
        for t, c in enumerate(device):
            for load in (loads[t], replace(loads[t], client_id="client1"), replace(loads[t], secret="")):
                msg = _denied(lambda c=c, ld=load: c.load(ld))
                assert msg.endswith("Load needs the coordinator's token (this tier was started with "
                               "--coordinator-token-file): the devices' token allows steps only")
            assert "Fetch needs the coordinator's token" in _denied(lambda c=c: c.fetch(RUN, "client0", secret))
            assert "Release needs the coordinator's token" in _denied(lambda c=c: c.release(RUN, "client0", secret))
        assert edge.tier.clients() == cloud.tier.clients() == 1
        for t, srv in enumerate((edge, cloud)):
            assert same(srv.tier.fetch(RUN, "client0", secret), before[t])
        assert edge.servicer is not None and edge.servicer.refusals().endswith("PERMISSION_DENIED)")
        # its own step, over the edge and on to the cloud: the result of the same step on in-process tiers
        ref = inprocess_chain(2)
        for tier, load in zip(ref.tiers, tier_loads(rnd.cfg, "client0", CUTS, initial_state(SPEC, 0)), strict=True):
            tier.load(load)
        want = ref.link.step(StepKey(RUN, "client0", 0, 0, secret), activation(seed=0), labels())
        got = device[0].step(StepKey(RUN, "client0", 0, 0, secret), activation(seed=0), labels())
        assert got.grad is not None and want.grad is not None and torch.equal(got.grad, want.grad)
        assert got.loss == want.loss
        # the coordinator token fetches (the stepped weights) and releases
        assert same(coord[0].fetch(RUN, "client0", secret), ref.tiers[0].fetch(RUN, "client0", secret))
        assert same(coord[1].fetch(RUN, "client0", secret), ref.tiers[1].fetch(RUN, "client0", secret))
        rnd.close()
        assert edge.tier.clients() == cloud.tier.clients() == 0
        # a wrong token, or none, stays UNAUTHENTICATED on every call
        for token in ("wrong", None):
            with _client(certs, edge.address, token) as c:
                with pytest.raises(Unauthenticated):
                    c.load(loads[0])
                with pytest.raises(Unauthenticated):
                    c.step(StepKey(RUN, "client0", 0, 1, secret), activation(seed=0), labels())
    finally:
        for c in coord + device:
            c.close()


def test_a_load_without_a_secret_is_refused_when_the_tier_has_a_coordinator_token(certs: Certs, chain) -> None:  # noqa: F811, ANN001
    """A coordinator always sends a secret; a load without one would make a segment every token holder may
    step, fetch and release. Refused, even with the coordinator token; the same load with a secret works."""
    edge, _ = chain
    with _client(certs, edge.address, COORD) as coord:
        (load, _) = tier_loads(RoundConfig(RUN, 0, SPEC), "open", CUTS, initial_state(SPEC, 0))
        assert load.secret == ""
        msg = _denied(lambda: coord.load(load))
        assert msg.endswith("tier edge refuses a load without a binding secret: it has a coordinator token, and a "
                       "segment without a secret would be open to every device (load with the client's secret)")
        assert edge.tier.clients() == 0
        coord.load(replace(load, secret="s3cret"))
        assert edge.tier.clients() == 1
        coord.release(RUN, "open", "s3cret")
        assert edge.tier.clients() == 0


def _files(tmp_path: Path) -> tuple[Path, Path]:
    dev, coord = tmp_path / "token", tmp_path / "coord-token"
    dev.write_text(DEVICE + "\n")
    coord.write_text(COORD + "\n")
    return dev, coord


def _batches(steps: int = 2, batch: int = 8) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    out = {}
    for i in range(2):
        x, y = synthetic(SPEC, steps * batch, 300 + i).tensors
        out[f"client{i}"] = [(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]) for s in range(steps)]
    return out


@contextmanager
def _edge_and_cloud(dev: Path, coord_file: Path | None) -> Iterator[tuple[str, str]]:
    """Tier processes taking both token files, or (``coord_file`` None) in-process servers with the one token."""
    if coord_file is not None:
        with TierProcess.start("cloud", token_file=dev, coordinator_token_file=coord_file, insecure=True) as cloud, \
                TierProcess.start("edge", next_address=cloud.address, token_file=dev,
                                  coordinator_token_file=coord_file, insecure=True) as edge:
            yield edge.address, cloud.address
    else:
        with serve_tier("cloud", token=DEVICE, insecure=True) as srv_cloud, \
                serve_tier("edge", next_address=srv_cloud.address, token=DEVICE, insecure=True) as srv_edge:
            yield srv_edge.address, srv_cloud.address


@pytest.mark.parametrize("coordinator_flag", [True, False], ids=["coordinator-token", "one-token"])
def test_a_devices_claim_is_refused_and_the_coordinators_round_then_works(tmp_path: Path,
                                                                          coordinator_flag: bool) -> None:
    """Edge -> cloud. A device loads client0 before the coordinator, with a secret of its own. With
    --coordinator-token-file (real tier processes, ``splitfed tier --token-file --coordinator-token-file``) the
    claim is refused on both tiers, and the coordinator's round then trains exactly as on in-process tiers (the
    edge forwarding each step to the cloud with the devices' token). Without it, as before: one token allows
    everything, so the claim succeeds and the coordinator's load of client0 is refused (the denial the flag
    prevents); that case's tiers are gRPC servers in this process with the one token (both cases' claims and
    rounds are the tiers' own, whatever started them; a tier process started with ``--token-file`` alone is
    test_describe's test_ping_checks_a_chain_of_tier_processes_over_mutual_tls_with_a_token)."""
    dev, coord_file = _files(tmp_path)
    coord_token = COORD if coordinator_flag else DEVICE
    with _edge_and_cloud(dev, coord_file if coordinator_flag else None) as (edge_address, cloud_address):
        addrs = [edge_address, cloud_address]
        device = [GrpcTierClient(a, token=DEVICE, insecure=True, retries=0) for a in addrs]
        coord = [GrpcTierClient(a, token=coord_token, insecure=True, retries=0) for a in addrs]
        try:
            cfg = RoundConfig(f"claim-{uuid.uuid4().hex[:6]}", 1, SPEC, "sflv1", False, OptimConfig(lr=0.1), 0,
                              binding_key="k" * 32)
            claims = tier_loads(replace(cfg, binding_key="the-device's-own"), "client0", CUTS,
                                initial_state(SPEC, 5))
            if coordinator_flag:
                for c, load in zip(device, claims, strict=True):
                    assert "Load needs the coordinator's token" in _denied(lambda c=c, ld=load: c.load(ld))
            else:
                for c, load in zip(device, claims, strict=True):
                    c.load(load)  # the claim
            state0 = initial_state(SPEC, 0)
            assignment = {"client0": CUTS, "client1": (1, 5)}
            data = _batches()
            link = GrpcTierClient(edge_address, token=DEVICE, insecure=True)
            try:
                if not coordinator_flag:  # the claimed client is dropped, refused; too few clients are left
                    with pytest.raises(RoundFailed, match=r"failed: client0 \(its server segments could not be "
                                                          r"loaded: .*bound already, with another secret"):
                        run_round(cfg, Chain(list(coord), link), state0, assignment, data)
                    return
                got, results = run_round(cfg, Chain(list(coord), link), state0, assignment, data)
            finally:
                link.close()
            want, want_results = run_round(cfg, inprocess_chain(2), state0, assignment, data)
            assert same(got, want)
            assert [r.client_id for r in results] == [r.client_id for r in want_results] == ["client0", "client1"]
        finally:
            for c in device + coord:
                c.close()


def test_the_tier_command_refuses_the_devices_token_as_the_coordinators(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    dev, _ = _files(tmp_path)
    same_token = tmp_path / "same"
    same_token.write_text(DEVICE)
    assert main(["tier", "--insecure", "--listen", "127.0.0.1:0", "--token-file", str(dev),
                 "--coordinator-token-file", str(same_token)]) == 2
    err = capsys.readouterr().err
    assert "--coordinator-token-file" in err and "holds the same token as --token-file" in err
    assert DEVICE not in err
    assert main(["tier", "--insecure", "--listen", "127.0.0.1:0", "--coordinator-token-file",
                 str(tmp_path / "missing")]) == 2
    assert "--coordinator-token-file: cannot read token file" in capsys.readouterr().err  # named by its flag


def test_the_tiers_a_run_starts_take_control_calls_from_its_coordinator_only(tmp_path: Path) -> None:
    """``splitfed simulate``'s (and a ServerApp's) own tiers: a coordinator token is made for the run, its
    control clients present it, and a device with the run's token-file is refused a load."""
    dev, _ = _files(tmp_path)
    with tier_chain(RunSettings(tiers=2, token_file=str(dev))) as chain:
        made = Path(chain.coordinator_token_file)
        assert made.is_file() and made.read_text() not in ("", DEVICE)
        (load,) = tier_loads(RoundConfig(RUN, 0, SPEC, binding_key="k"), "client0", (2,), initial_state(SPEC, 0))
        with connect(chain.addresses[0], token_file=str(dev)) as device:
            assert "Load needs the coordinator's token" in _denied(lambda: device.load(load))
        chain.controls[0].load(load)
        chain.controls[0].release(RUN, "client0", load.secret)
    assert not made.exists()  # the run's own token goes with its tiers


def test_deploy_gives_the_coordinator_token_to_the_tiers_and_the_serverapp_only(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    spawned: dict[str, list[str]] = {}
    monkeypatch.setattr(Deployment, "_spawn", lambda self, name, cmd: spawned.__setitem__(name, cmd))
    monkeypatch.setattr(Deployment, "_wait_served", lambda self, name, address, timeout=180.0: None)
    dev, _ = _files(tmp_path)
    dep = Deployment(2, tmp_path / "work", token_file=str(dev))
    dep._start_tiers()
    made = Path(dep.coordinator_token_file)
    assert made.parent == dep.workdir and made.stat().st_mode & 0o077 == 0 and made.read_text() != DEVICE
    for cmd in spawned.values():  # edge and cloud
        assert cmd[cmd.index("--coordinator-token-file") + 1] == str(made)
        assert cmd[cmd.index("--token-file") + 1] == str(dev)
    assert dep.run_config({})["coordinator-token-file"] == str(made)
    spawned.clear()
    dep.start_supernode(0)
    node = spawned["supernode0"]
    assert str(made) not in " ".join(node) and str(dev) in " ".join(node)


def test_a_run_without_the_coordinators_token_is_refused_before_round_one(tmp_path: Path) -> None:
    """Tiers started with --coordinator-token-file say so in Describe: a run config without
    coordinator-token-file is refused when the chain is checked, naming the setting (before: the check
    passed and every Load of round 1 was refused). With the token the same chain is accepted, and a tier
    without a coordinator token is accepted either way."""
    dev, coord = _files(tmp_path)
    with serve_tier("cloud", token=DEVICE, coordinator_token=COORD, insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, token=DEVICE, coordinator_token=COORD,
                       insecure=True) as edge:
        addrs = f"{edge.address},{cloud.address}"
        with pytest.raises(ConfigError) as e, tier_chain(RunSettings(tier_addresses=addrs, token_file=str(dev))):
            pass
        msg = str(e.value)
        for srv in (edge, cloud):
            assert (f"tier {srv.tier.name} at {srv.address} takes Load, Fetch, Release and Reduce only "
                    "with the coordinator's token") in msg
        assert "give this run coordinator-token-file" in msg and DEVICE not in msg and COORD not in msg
        assert edge.tier.clients() == cloud.tier.clients() == 0
        with tier_chain(RunSettings(tier_addresses=addrs, token_file=str(dev),
                                    coordinator_token_file=str(coord))) as ok:
            assert [i.control_token for i in ok.infos] == [True, True]
    with serve_tier("cloud", token=DEVICE, insecure=True) as plain:
        with tier_chain(RunSettings(tiers=2, tier_addresses=plain.address, token_file=str(dev))) as ok:
            assert [i.control_token for i in ok.infos] == [False]


def test_ping_says_which_tiers_need_the_coordinators_token(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    dev, _ = _files(tmp_path)
    with serve_tier("cloud", token=DEVICE, coordinator_token=COORD, insecure=True) as cloud:
        assert main(["ping", cloud.address, "--token-file", str(dev), "--count", "1"]) == 0
        assert "takes Load, Fetch, Release and Reduce only with the coordinator's token" in capsys.readouterr().out


def test_two_authorization_headers_are_refused_whichever_comes_last() -> None:
    """A call carrying the tokens twice is refused, not decided by which header a proxy put last."""
    import grpc

    with serve_tier("cloud", token=DEVICE, coordinator_token=COORD, insecure=True) as cloud, \
            grpc.insecure_channel(cloud.address) as channel:
        describe = channel.unary_unary("/splitfed.v1.Tier/Describe")
        describe(b"", metadata=[("authorization", f"Bearer {DEVICE}")], timeout=10)  # one: allowed
        for pair in ((DEVICE, COORD), (COORD, DEVICE), ("wrong", DEVICE), (DEVICE, DEVICE)):
            with pytest.raises(grpc.RpcError) as e:
                describe(b"", metadata=[("authorization", f"Bearer {t}") for t in pair], timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "2 authorization headers: send exactly one bearer token" in (e.value.details() or "")
