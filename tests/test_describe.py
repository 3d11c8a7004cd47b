"""A tier describes itself (``Describe``), and a run refuses a chain it could not train through before
anything is loaded: tiers wired to other tiers, in the wrong order, another protocol, a model they will
not build, an idle release shorter than a round. ``splitfed ping`` shows the same from the shell."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import splitfed.transport.server as tier_server
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.models.zoo import resolve_spec
from splitfed.sim.tiers import tier_chain
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.describe import PROTOCOL, TierInfo, check_chain
from splitfed.transport.errors import RpcFailed
from splitfed.transport.process import TierProcess
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import certs, fake_tier, load_client  # noqa: F401 - fixture

# ---------------------------------------------------------------- check_chain on descriptions


def chain_infos(n: int) -> tuple[list[str], list[TierInfo]]:
    """A well-formed chain of ``n`` tiers: each forwards to the next, the last ends it."""
    addrs = [f"host{i}:700{i}" for i in range(n)]
    infos = [TierInfo(PROTOCOL, "0.1.0", f"t{i}", f"inst{i}", next_address=addrs[i + 1] if i + 1 < n else "",
                      next_instance=f"inst{i + 1}" if i + 1 < n else "", idle_release_s=3600.0)
             for i in range(n)]
    return addrs, infos


def test_a_well_formed_chain_passes() -> None:
    for n in (1, 2, 3):
        check_chain(*chain_infos(n), model="cnn", round_timeout_s=600)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5).flatmap(lambda n: st.permutations(range(n))))
def test_any_other_order_of_the_tiers_is_refused(order) -> None:  # type: ignore[no-untyped-def]
    """A chain is one order of its tiers: listing them in any other is named, never trained through."""
    addrs, infos = chain_infos(len(order))
    shuffled = ([addrs[i] for i in order], [infos[i] for i in order])
    if list(order) == sorted(order):
        check_chain(*shuffled)
    else:
        with pytest.raises(ConfigError, match="cannot run: "):
            check_chain(*shuffled)


@pytest.mark.parametrize(("change", "words"), [
    (lambda i: [dataclasses.replace(i[0], protocol=PROTOCOL + 1, version="9.0"), i[1]],
     rf"tier t0 at host0:7000 runs splitfed 9.0 \(protocol {PROTOCOL + 1}\), this coordinator splitfed .* "
     rf"\(protocol {PROTOCOL}\): run one splitfed version on every machine"),
    (lambda i: [dataclasses.replace(i[0], next_address="", next_instance=""), i[1]],
     "tier t0 at host0:7000 ends the chain \\(no --next\\), but tier-addresses continue to host1:7001: "
     "start it with --next host1:7001"),
    (lambda i: [dataclasses.replace(i[0], next_address="other:1", next_instance="x"), i[1]],
     r"tier t0 at host0:7000 forwards to other:1, which is not the tier at host1:7001 \(t1\)"),
    (lambda i: [dataclasses.replace(i[0], next_instance="", next_error="UNAVAILABLE: refused"), i[1]],
     "tier t0 at host0:7000 cannot reach its next tier host1:7001: UNAVAILABLE: refused"),
    (lambda i: [i[0], dataclasses.replace(i[1], model_error="PERMISSION_DENIED: not served")],
     "tier t1 at host1:7001 will not build model 'cnn': PERMISSION_DENIED: not served"),
    (lambda i: [i[0], dataclasses.replace(i[1], idle_release_s=60.0)],
     "tier t1 at host1:7001 releases segments idle for 60 s, less than this run's round-timeout-s 600"),
])
def test_each_problem_is_named_with_its_tier_and_fix(change, words) -> None:  # type: ignore[no-untyped-def]
    addrs, infos = chain_infos(2)
    with pytest.raises(ConfigError, match=words):
        check_chain(addrs, change(infos), model="cnn", round_timeout_s=600)


def test_every_problem_is_named_at_once() -> None:
    addrs, infos = chain_infos(2)
    bad = [dataclasses.replace(infos[0], protocol=0), dataclasses.replace(infos[1], idle_release_s=1.0)]
    with pytest.raises(ConfigError) as err:
        check_chain(addrs, bad, round_timeout_s=600)
    assert "protocol 0" in str(err.value) and "idle for 1 s" in str(err.value)


@pytest.mark.parametrize("back_to", [0, 1])
def test_a_chain_wired_into_a_loop_is_refused(back_to) -> None:  # type: ignore[no-untyped-def]
    addrs, infos = chain_infos(2)
    looped = [infos[0], dataclasses.replace(infos[1], next_address=addrs[back_to], next_instance=f"inst{back_to}")]
    back = "itself" if back_to == 1 else "tier t0 at host0:7000"
    with pytest.raises(ConfigError, match=f"tier t1 at host1:7001 forwards back to {back} \\(host{back_to}:700"
                                          f"{back_to}\\): the chain is a loop"):
        check_chain(addrs, looped)


def test_a_tier_wired_to_itself_describes_one_hop_and_is_named() -> None:
    """Describe asks the next tier shallowly: a tier whose --next is its own address answers at once,
    instead of describing itself until the deadline with every worker thread."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    with serve_tier("edge", listen=addr, next_address=addr, insecure=True) as edge, GrpcTierClient(addr) as c:
        info = c.describe()
        assert info.next_instance == info.instance and not info.next_error
        with pytest.raises(ConfigError, match="forwards back to itself"):
            check_chain([edge.address], [info])


def test_the_same_tier_twice_is_refused() -> None:
    addrs, infos = chain_infos(2)
    with pytest.raises(ConfigError, match="host0:7000 and host0:7000 reach the same tier process"):
        check_chain([addrs[0], addrs[0]], [infos[0], infos[0]])


def test_a_never_releasing_tier_suits_any_round_timeout() -> None:
    addrs, infos = chain_infos(1)
    check_chain(addrs, [dataclasses.replace(infos[0], idle_release_s=None)], round_timeout_s=1e9)


def test_a_description_survives_its_message() -> None:
    _, (info, _) = chain_infos(2)
    info = dataclasses.replace(info, allowed_models=("a:b", "c:d"), model_error="x", threads=3)
    assert TierInfo.from_pb(info.to_pb()) == info
    assert TierInfo.from_pb(dataclasses.replace(info, idle_release_s=None).to_pb()).idle_release_s is None


# ---------------------------------------------------------------- real tiers over gRPC


def test_a_tier_describes_its_setup_its_next_tier_and_what_it_holds() -> None:
    with serve_tier("cloud", insecure=True, idle_release_s=120.0, allowed_models=["tests.models_for_tests:x"]) \
            as cloud, serve_tier("edge", next_address=cloud.address, insecure=True) as edge, \
            GrpcTierClient(cloud.address) as c, GrpcTierClient(edge.address) as e:
        load_client(c, "client0")
        info = c.describe()
        assert (info.protocol, info.name, info.next_address) == (PROTOCOL, "cloud", "")
        assert info.idle_release_s == 120.0 and info.allowed_models == ("tests.models_for_tests:x",)
        assert (info.segments, info.runs) == (1, 1)
        assert c.describe().instance == info.instance  # one process, one instance
        einfo = e.describe()
        assert einfo.next_address == cloud.address and einfo.next_instance == info.instance
        assert einfo.instance != info.instance and not einfo.next_error and einfo.segments == 0
        assert e.describe(resolve_spec("cnn")).model_error == ""
        refused = e.describe(resolve_spec("tests.models_for_tests:small_sequential", input_shape=(6,)))
        assert refused.model_error.startswith("PERMISSION_DENIED: tier edge does not serve model")
        cloud.stop(0)
        gone = e.describe()
        assert gone.next_instance == "" and gone.next_error.startswith("UNAVAILABLE")


def test_a_malformed_describe_request_is_invalid_argument() -> None:
    from splitfed.transport.pb import method

    with serve_tier("cloud", insecure=True) as srv, grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(method("Describe"))(b"\xff\xff", timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed DescribeRequest" in (err.value.details() or "")


def test_a_tier_without_describe_is_named_as_an_older_splitfed() -> None:
    """A tier of an older splitfed answers UNIMPLEMENTED; the coordinator says what that means (or that it is no
    splitfed tier: gRPC's "Method not found!" does not tell which)."""
    with fake_tier({"Release": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"")}) as address, \
            GrpcTierClient(address) as c, \
            pytest.raises(RpcFailed, match=f"does not answer Describe: it runs a splitfed older than protocol "
                                           f"{PROTOCOL} .*, or it is another gRPC service, not a splitfed tier"):
        c.describe()


def _settings(addresses: list[str], **kw) -> RunSettings:  # type: ignore[no-untyped-def]
    return RunSettings(model="cnn", tiers=len(addresses) + 1, tier_addresses=",".join(addresses), **kw)


def test_a_run_refuses_a_miswired_chain_before_loading_anything(monkeypatch) -> None:
    with serve_tier("cloud", insecure=True) as cloud, serve_tier("cloud2", insecure=True) as cloud2, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        with tier_chain(_settings([edge.address, cloud.address])) as chain:  # as wired: accepted
            assert len(chain.controls) == 2
        with pytest.raises(ConfigError, match=f"tier edge at {edge.address} forwards to {cloud.address}, which is "
                                              f"not the tier at {cloud2.address} \\(cloud2\\)"), \
                tier_chain(_settings([edge.address, cloud2.address])):
            pytest.fail("a miswired chain was accepted")
        with pytest.raises(ConfigError, match=f"cannot run: the tiers are listed out of chain order: their --next "
                                              f"wires them edge at {edge.address} -> cloud at {cloud.address}; give "
                                              "tier-addresses in that order$"), \
                tier_chain(_settings([cloud.address, edge.address])):
            pytest.fail("a reversed chain was accepted")
        with pytest.raises(ConfigError, match="releases segments idle for 3600 s, less than this run's "
                                              "round-timeout-s 7200"), \
                tier_chain(_settings([edge.address, cloud.address], round_timeout_s=7200)):
            pytest.fail("a round longer than the tiers' idle release was accepted")
        monkeypatch.setattr(tier_server, "PROTOCOL", PROTOCOL + 1)  # the tiers of another splitfed
        with pytest.raises(ConfigError, match=f"runs splitfed .* \\(protocol {PROTOCOL + 1}\\)"), \
                tier_chain(_settings([edge.address, cloud.address])):
            pytest.fail("a chain of another protocol was accepted")
        assert edge.tier.clients() == cloud.tier.clients() == cloud2.tier.clients() == 0


def test_simulate_names_a_broken_chain_before_anything_starts(tmp_path) -> None:
    """``splitfed simulate`` with tiers of its own: exit 2, the reason on stderr, Ray never started."""
    with serve_tier("cloud", insecure=True) as cloud:
        cfg = tmp_path / "run.toml"
        cfg.write_text(f'[simulate]\nmodel = "cnn"\nclients = 2\nrounds = 1\n'
                       f'tier-addresses = ["{cloud.address}", "{cloud.address}"]\n')
        p = subprocess.run([sys.executable, "-m", "splitfed.cli", "simulate", "--config", str(cfg),
                            "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "cannot run: " in p.stderr and "reach the same tier process" in p.stderr
    assert "ends the chain (no --next)" in p.stderr and "Ray" not in p.stderr + p.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("transport-processes")
def test_ping_checks_a_chain_of_tier_processes_over_mutual_tls_with_a_token(certs, tmp_path,  # noqa: F811
                                                                          capsys) -> None:
    """The edge describes its next tier with its own credentials; a wrong token or too small a tier
    is reported, exit 1; a well-formed chain exits 0 with every tier's description.

    The first ``splitfed ping`` is a process of its own (the command as a shell runs it: its exit code, its
    JSON on stdout); the others call the same ``main`` in this process (their output and exit code are
    the command's all the same), which spares a torch import per ping."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    creds = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client.cert), "--tls-key", str(certs.client.key)]

    def ping(*args: str) -> subprocess.CompletedProcess[str]:
        from splitfed.cli import main

        capsys.readouterr()
        code = main(["ping", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["splitfed", "ping", *args], code, out, err)

    with TierProcess.start("cloud", tls=certs.server, client_tls=certs.client, token_file=token,
                           extra_args=["--max-model-mb", "1"]) as cloud, \
            TierProcess.start("edge", next_address=cloud.address, tls=certs.server, client_tls=certs.client,
                              token_file=token) as edge:
        ok = subprocess.run([sys.executable, "-m", "splitfed.cli", "ping", edge.address, cloud.address, *creds,
                             "--token-file", str(token), "--model", "cnn", "--json", "--count", "2"],
                            capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0, ok.stderr
        out = json.loads(ok.stdout)
        assert out["ok"] and [t["name"] for t in out["tiers"]] == ["edge", "cloud"]
        assert out["tiers"][0]["next_instance"] == out["tiers"][1]["instance"]
        assert all(t["rtt_ms"] > 0 and t["protocol"] == PROTOCOL and t["compute"] == "cpu" for t in out["tiers"])

        text = ping(edge.address, cloud.address, *creds, "--token-file", str(token), "--count", "1")
        assert text.returncode == 0 and "chain: edge -> cloud ok" in text.stdout
        assert f"forwards to {cloud.address}, compressing with none: reached" in text.stdout
        other = ping(edge.address, cloud.address, *creds, "--token-file", str(token), "--count", "1",
                     "--compress", "int8")  # the codec a run with compress = "int8" would want: not this chain's
        assert other.returncode == 1 and "restart it with --compress int8" in other.stdout + other.stderr, other
        per_link = ping(edge.address, cloud.address, *creds, "--token-file", str(token), "--count", "1",
                        "--compress", "int8,none")  # compress the device's link only: this chain's edge fits
        assert per_link.returncode == 0 and "chain: edge -> cloud ok" in per_link.stdout, per_link
        assert text.stdout.count("computes on cpu with 1 thread(s)") == 2, text.stdout  # TierProcess: --threads 1

        big = ping(edge.address, cloud.address, *creds, "--token-file", str(token), "--model", "vgg11")
        assert big.returncode == 1
        assert "tier cloud at" in big.stderr and "will not build model 'vgg11': RESOURCE_EXHAUSTED" in big.stderr

        denied = ping(edge.address, *creds, "--token-file", str(wrong), "--count", "1")
        assert denied.returncode == 1 and "no answer: " in denied.stdout and "UNAUTHENTICATED" in denied.stdout


def test_a_node_whose_own_edge_address_reaches_another_tier_is_dropped_and_told(tmp_path) -> None:
    """Deployed nodes may name their edge themselves (node config ``edge-address``). One that reaches
    another tier fails with that said, not with NOT_FOUND on every step; one that reaches the run's edge
    under another name trains (and remembers the check in its state)."""
    import clients.app
    import server.app
    from tests.flower_fixtures import FakeGrid

    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge, \
            serve_tier("edge2", next_address=cloud.address, insecure=True) as other:
        s = RunSettings(model="cnn", rounds=2, clients=3, min_clients=2, tiers=3, cuts="static:1,3",
                        tier_addresses=f"{edge.address},{cloud.address}", out=str(tmp_path), node_wait_s=5,
                        round_timeout_s=30)
        grid = FakeGrid(clients.app.app, 3)
        ctx = list(grid.contexts.values())
        ctx[0].node_config["edge-address"] = other.address
        ctx[1].node_config["edge-address"] = edge.address.replace("127.0.0.1", "localhost")
        server.app.run(grid, s)
        assert other.tier.steps_served == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["failed"] == ["client0"] and sorted(row["per_client"]) == ["client1", "client2"]
        why = row["why_failed"]["client0"]
        assert f"edge-address {other.address} reaches tier 'edge2'" in why
        assert f"not this run's edge at {edge.address}" in why and "fix edge-address" in why
    checked = ctx[1].state.config_records[clients.app.EDGE_CHECKED]
    assert checked["address"] == edge.address.replace("127.0.0.1", "localhost")
