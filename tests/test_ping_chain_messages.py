"""What ``splitfed ping`` (and a run's chain check) says of a chain that cannot run, on real tiers on 127.0.0.1.

An edge pinged alone whose ``--next`` it cannot reach exits 1 with a line saying so (it exited 0); tiers listed
out of their chain order are told to be listed in it, not that their chain is a loop whose ``--next`` to drop;
a tier's own connection to its ``--next``, refused as plaintext by a TLS tier or for want of a token, names the
tier's flags (``--tls-cert``/``--tls-key``/``--tls-ca``, ``--token-file``), not ping's ``--tls-ca``; and a
connection that sent no token is told to give one, not that the tier holds another.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.describe import check_chain
from splitfed.transport.errors import Unauthenticated
from splitfed.transport.server import serve_tier
from tests.test_describe import chain_infos
from tests.transport_fixtures import Certs, certs, closed_port  # noqa: F401 - fixture

PING = ["--count", "1", "--timeout", "5"]
EDGE_NO_TLS = ("Socket closed (its next tier serves TLS, and closes a plaintext connection this way: start tier edge "
               "with --tls-cert, --tls-key and, as --tls-ca, the CA that signed its next tier's certificate; or serve "
               "its next tier --insecure too, on a trusted loopback only)")
EDGE_NO_TOKEN = ("missing bearer token (authorization metadata) (tier edge sent no token: start it with --token-file, "
                 "a file holding its next tier's token)")
PING_NO_TOKEN = ("missing bearer token (authorization metadata) (this connection sent no token: give --token-file / "
                 "token-file, a file holding the tier's token)")


def _unreached(edge: str, nxt: str) -> str:
    """The summary line's start for an edge that cannot reach ``nxt``."""
    return f"the tier chain {edge} cannot run: tier edge at {edge} cannot reach its next tier {nxt}: "


# ---------------------------------------------------------------- an edge pinged alone

def test_an_edge_pinged_alone_whose_next_tier_is_down_exits_1_and_says_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    nxt = f"127.0.0.1:{closed_port()}"
    with serve_tier("edge", next_address=nxt, insecure=True, next_deadline_s=0.5) as edge:
        assert main(["ping", edge.address, *PING]) == 1
        out, err = capsys.readouterr()
        assert f"  forwards to {nxt}, compressing with none: not reached: UNAVAILABLE: " in out
        assert err.startswith(_unreached(edge.address, nxt) + f"UNAVAILABLE: tier {nxt}: describe: unavailable "), err
        assert err.rstrip().endswith("Connection refused") and err.count("\n") == 1, err
        assert main(["ping", edge.address, *PING, "--json"]) == 1
        said = json.loads(capsys.readouterr().out)
        assert said["ok"] is False and said["problems"].startswith(_unreached(edge.address, nxt))


def test_an_edge_pinged_alone_whose_next_tier_answers_exits_0() -> None:
    with serve_tier("cloud", insecure=True) as cloud, serve_tier("edge", next_address=cloud.address,
                                                                 insecure=True) as edge:
        assert main(["ping", edge.address, *PING]) == 0


def test_a_run_whose_last_tier_cannot_reach_a_next_tier_is_not_refused_for_it() -> None:
    """A run's last tier computes the loss and forwards nothing: only ping asks for its ``--next`` (onward)."""
    addrs, (info,) = chain_infos(1)
    down = dataclasses.replace(info, next_address="host9:7009", next_error="UNAVAILABLE: refused")
    check_chain(addrs, [down])
    with pytest.raises(ConfigError, match="^the tier chain host0:7000 cannot run: tier t0 at host0:7000 cannot reach "
                                          "its next tier host9:7009: UNAVAILABLE: refused$"):
        check_chain(addrs, [down], onward=True)


# ---------------------------------------------------------------- tiers listed out of order

def test_tiers_pinged_in_reverse_order_are_told_the_chain_order_not_a_loop(
        capsys: pytest.CaptureFixture[str]) -> None:
    with serve_tier("cloud", insecure=True) as cloud, serve_tier("edge", next_address=cloud.address,
                                                                 insecure=True) as edge:
        assert main(["ping", cloud.address, edge.address, *PING]) == 1
        err = capsys.readouterr().err
        assert err == (f"the tier chain {cloud.address} -> {edge.address} cannot run: the tiers are listed out of "
                       f"chain order: their --next wires them edge at {edge.address} -> cloud at {cloud.address}; "
                       "give the addresses in that order\n")
        assert main(["ping", edge.address, cloud.address, *PING]) == 0


def test_three_tiers_out_of_order_are_named_in_their_wired_order_with_their_other_problems() -> None:
    addrs, infos = chain_infos(3)
    order = [2, 0, 1]
    old = dataclasses.replace(infos[1], protocol=0, version="0.0.1")
    with pytest.raises(ConfigError) as e:
        check_chain([addrs[j] for j in order], [infos[2], infos[0], old])
    assert str(e.value).startswith(
        "the tier chain host2:7002 -> host0:7000 -> host1:7001 cannot run: the tiers are listed out of chain order: "
        "their --next wires them t0 at host0:7000 -> t1 at host1:7001 -> t2 at host2:7002; give tier-addresses in "
        "that order; tier t1 at host1:7001 runs splitfed 0.0.1 (protocol 0)"), str(e.value)
    assert "loop" not in str(e.value) and "ends the chain" not in str(e.value)


def test_a_forward_to_a_tier_listed_before_it_is_no_loop_unless_it_comes_back() -> None:
    """The cloud ends the chain: the edge forwarding to it is no loop, even with another tier listed."""
    addrs, infos = chain_infos(3)
    cloud = dataclasses.replace(infos[1], next_address="", next_instance="")
    edge = dataclasses.replace(infos[2], next_address=addrs[1], next_instance="inst1")
    with pytest.raises(ConfigError) as e:
        check_chain(addrs, [infos[0], cloud, edge])
    assert "loop" not in str(e.value) and "tier t1 at host1:7001 ends the chain (no --next)" in str(e.value)
    looped = dataclasses.replace(cloud, next_address=addrs[2], next_instance="inst2")
    with pytest.raises(ConfigError, match=r"tier t2 at host2:7002 forwards back to tier t1 at host1:7001 "
                                          r"\(host1:7001\): the chain is a loop"):
        check_chain(addrs, [infos[0], looped, edge])


# ---------------------------------------------------------------- an edge's own connection to its next tier

def test_a_plaintext_edge_refused_by_a_tls_cloud_is_told_the_edges_tls_flags(
        certs: Certs, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    with serve_tier("cloud", tls=certs.server) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True, next_deadline_s=0.5) as edge:
        assert main(["ping", edge.address, *PING]) == 1
        out, err = capsys.readouterr()
        assert out.count(EDGE_NO_TLS) == 1 and err.count(EDGE_NO_TLS) == 1, (out, err)
        assert err.startswith(_unreached(edge.address, cloud.address)), err
        assert "--tls-ca / tls-ca" not in out + err


def test_an_edge_without_a_token_is_told_to_start_with_one_and_ping_without_one_to_give_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with serve_tier("cloud", insecure=True, token="s3cret") as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        assert main(["ping", edge.address, *PING]) == 1
        out, err = capsys.readouterr()
        assert f"not reached: UNAUTHENTICATED: tier {cloud.address}: describe: {EDGE_NO_TOKEN}\n" in out, out
        assert err == _unreached(edge.address, cloud.address) + (f"UNAUTHENTICATED: tier {cloud.address}: describe: "
                                                                 f"{EDGE_NO_TOKEN}\n")
        assert main(["ping", cloud.address, *PING]) == 1
        assert capsys.readouterr().out == (f"{cloud.address}: no answer: UNAUTHENTICATED: tier {cloud.address}: "
                                           f"describe: {PING_NO_TOKEN}\n")
        assert main(["ping", cloud.address, *PING, "--token-file", str(token)]) == 0


def test_a_wrong_token_is_still_another_token_than_the_tiers() -> None:
    with serve_tier("cloud", insecure=True, token="s3cret") as cloud, \
            GrpcTierClient(cloud.address, token="other", retries=0) as c, \
            pytest.raises(Unauthenticated, match=r"invalid bearer token \(the tier holds another token than this "
                                                 "connection's: check --token-file / token-file"):
        c.describe()
