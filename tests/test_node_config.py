"""A node's Flower node config is checked once, key by key: a misspelt key is refused with the nearest
known one (before, it was ignored and the node silently trained on something else)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import clients.app
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.node import NodeConfig
from splitfed.profile.fleet import parse_fleet
from tests.flower_fixtures import FakeGrid
from tests.test_flower_apps import BASE, _run
from tests.transport_fixtures import Certs, certs  # noqa: F401 - fixture

KNOWN = {"partition-id", "num-partitions", "device-profile", "edge-address", "data-file", "tls-ca", "tls-cert",
         "tls-key", "token-file", "torch-device"}


def test_every_key_is_read_with_its_type(tmp_path) -> None:
    files = {k: tmp_path / k for k in ("data-file", "tls-ca", "tls-cert", "tls-key", "token-file")}
    for f in files.values():
        f.write_text("x")
    node = NodeConfig.parse({"partition-id": 3, "num-partitions": "10", "device-profile": "rpi4",
                             "edge-address": "edge:7000", "torch-device": "cpu",
                             **{k: str(f) for k, f in files.items()}})
    assert (node.partition_id, node.num_partitions, node.device_profile, node.edge_address) == (3, 10, "rpi4",
                                                                                                 "edge:7000")
    assert node.data_file == str(files["data-file"]) and node.token_file == str(files["token-file"])
    assert node.torch_device == "cpu"
    assert {f.replace("_", "-") for f in NodeConfig.__dataclass_fields__} == KNOWN


@pytest.mark.parametrize(("cfg", "words"), [
    ({"edge_address": "e:1"}, r"node config: unknown key 'edge_address' \(did you mean 'edge-address'\?\); known: "
                              "data-file, device-profile, edge-address, num-partitions, partition-id"),
    ({"datafile": "d.npz"}, r"unknown key 'datafile' \(did you mean 'data-file'\?\)"),
    ({"colour": "red"}, r"unknown key 'colour'; known: "),
    ({"partition-id": "one"}, "partition-id must be an integer, got 'one'"),
    ({"num-partitions": True}, "num-partitions must be an integer, got True"),
    ({"edge-address": 7000}, r'edge-address must be a string \(quote it: edge-address="..."\), got 7000'),
    ({"partition-id": 4}, r"partition-id 4 is outside 0..3 \(num-partitions 4\)"),
    ({"partition-id": -1}, r"partition-id must be >= 0, got -1"),
    ({"data-file": "/nowhere/d.npz"}, "data-file /nowhere/d.npz: no such file on this node"),
    ({"tls-ca": "/nowhere/ca.pem"}, "tls-ca /nowhere/ca.pem: no such file on this node"),
])
def test_a_bad_node_config_is_refused_with_the_key_and_the_fix(cfg, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=words):
        NodeConfig.parse({"partition-id": 0, "num-partitions": 4, **cfg})


def test_partition_keys_are_required_and_a_data_file_needs_only_the_id(tmp_path) -> None:
    with pytest.raises(ConfigError, match="needs integer partition-id and num-partitions .*--node-config"):
        NodeConfig.parse({"partition-id": 0})
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    with pytest.raises(ConfigError, match="with a data-file of its own, partition-id alone"):
        NodeConfig.parse({"num-partitions": 2, "data-file": str(data)})
    node = NodeConfig.parse({"partition-id": 7, "data-file": str(data)})  # its own data: the id names the client
    assert node.partition_id == 7 and node.data_file == str(data)
    with pytest.raises(ConfigError, match="partition-id must be >= 0, got -1"):
        NodeConfig.parse({"partition-id": -1, "data-file": str(data)})


@given(st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=5), min_size=1, max_size=3))
def test_any_key_outside_the_known_ones_is_refused(extra) -> None:  # type: ignore[no-untyped-def]
    extra = {k: v for k, v in extra.items() if k not in KNOWN}
    cfg = {"partition-id": 0, "num-partitions": 1, **extra}
    if extra:
        with pytest.raises(ConfigError, match="unknown key"):
            NodeConfig.parse(cfg)
    else:
        assert NodeConfig.parse(cfg).partition_id == 0


def test_a_node_with_a_misspelt_key_is_left_out_and_the_coordinator_says_why(monkeypatch, tmp_path, caplog) -> None:
    s = BASE.with_(rounds=1, min_clients=3)
    grid = FakeGrid(clients.app.app, s.clients)
    next(iter(grid.contexts.values())).node_config["edge_address"] = "edge:7000"
    with caplog.at_level(logging.WARNING, logger="flwr"):
        summary, _ = _run(monkeypatch, s.with_(out=str(tmp_path)), grid=grid)
    assert summary["rounds"] == 1
    assert "did not answer the query round" in caplog.text and "did you mean 'edge-address'?" in caplog.text


def test_a_node_of_another_splitfed_protocol_is_left_out_and_named(monkeypatch, tmp_path, caplog) -> None:
    """A deployed node's splitfed library is installed apart from the coordinator's: one that speaks another
    wire protocol (or is too old to say which) would talk to the edge in it, so it is left out at
    registration, with both versions in the log."""
    from splitfed.flower.records import NODE, NodeInfo

    real = clients.app.app

    def app(msg, ctx):  # type: ignore[no-untyped-def]
        reply = real(msg, ctx)
        if msg.metadata.message_type == "query" and ctx.node_config["partition-id"] in (1, 2):
            rec = reply.content.config_records[NODE]
            if ctx.node_config["partition-id"] == 1:
                rec["protocol"], rec["version"] = 99, "9.9.9"
            else:  # a splitfed from before protocol 1 sent neither
                del rec["protocol"], rec["version"]
            assert NodeInfo.from_record(rec).protocol in (0, 99)
        return reply

    s = BASE.with_(rounds=1, min_clients=2)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _run(monkeypatch, s.with_(out=str(tmp_path)), grid=FakeGrid(app, s.clients))
    import json

    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert sorted(row["cuts"]) == ["client0", "client3"]
    assert "(partition 1) runs splitfed 9.9.9 (protocol 99), this coordinator splitfed" in caplog.text
    assert "(partition 2) runs splitfed older than 0.1.0 (protocol 0)" in caplog.text
    assert "run one splitfed version on every machine" in caplog.text


@pytest.mark.parametrize(("parse", "words"), [
    (lambda: RunSettings.from_mapping({"round": 3}),
     r"config: unknown key 'round' \(did you mean 'rounds'\?\); known: "),
    (lambda: parse_fleet(
        '[edge]\nflops = 1e12\nmemory_mb = 1\n[[device]]\nname = "d"\nprofile = "rpi4"\nupmbps = 3\n', "f.toml"),
     r"f.toml: \[\[device\]\] #1 \('d'\): unknown key 'upmbps' \(did you mean 'up_mbps'\?\)"),
    (lambda: NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "Edge-Address": "e:1"}),
     r"unknown key 'Edge-Address' \(did you mean 'edge-address'\?\)"),
    (lambda: NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "zzz": 1}), r"unknown key 'zzz'; known: "),
])
def test_every_kind_of_config_names_an_unknown_key_with_the_nearest_known_one(parse, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=words):
        parse()


def test_a_refusal_goes_back_as_a_one_line_error_reply_and_a_bug_still_raises(monkeypatch) -> None:  # noqa: ANN001
    """Raised, a refusal came back wrapped in the simulation engine's traceback (Ray's, three times over);
    as the reply's error it is the one line the coordinator logs and keeps in ``why_failed``."""
    from flwr.app import Message, RecordDict

    grid = FakeGrid(clients.app.app, 1)  # sets the task identity a message needs
    node, context = next(iter(grid.contexts.items()))
    context.node_config["edge_address"] = "edge:7000"
    ask = Message(RecordDict(), dst_node_id=node, message_type="query", group_id="1")
    reply = clients.app.app(ask, context)  # no exception
    assert reply.has_error()
    assert reply.error.reason.startswith("ConfigError: node config: unknown key 'edge_address' (did you mean")
    assert "\n" not in reply.error.reason and "Traceback" not in reply.error.reason

    del context.node_config["edge_address"]
    train = Message(RecordDict(), dst_node_id=node, message_type="train", group_id="1")  # no instruction: refused
    refused = clients.app.app(train, context)
    assert refused.has_error() and refused.error.reason.startswith("ConfigError: train message: no ConfigRecord")
    monkeypatch.setattr(clients.app, "_received", lambda content: 1 / 0)  # a bug still raises, with its traceback
    with pytest.raises(ZeroDivisionError):
        clients.app.app(train, context)


def test_a_node_whose_token_the_edge_refuses_is_left_out_at_registration(tmp_path) -> None:  # noqa: ANN001
    """A device with an old token registered (its link measurement's failure logged at INFO) and then failed
    every round it sent an activation to the edge; its query now fails, naming the file, so the coordinator
    leaves it out as it does a bad node config. Any other failure to measure still registers it."""
    import pytest
    from flwr.app import ConfigRecord

    from clients.app import _measure_link
    from splitfed.errors import ConfigError
    from splitfed.flower.node import NodeConfig
    from splitfed.transport.server import serve_tier

    old = tmp_path / "old-token"
    old.write_text("rotated-away\n")
    ask = ConfigRecord({"edge-address": "", "tls-ca": "", "tls-cert": "", "tls-key": "", "token-file": ""})
    with serve_tier("edge", insecure=True, token="current") as edge:
        node = NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "edge-address": edge.address,
                                "token-file": str(old)})
        with pytest.raises(ConfigError, match=f"the edge refuses this node's token-file {old} \\(UNAUTHENTICATED\\)"):
            _measure_link(node, ask)
    gone = NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "edge-address": edge.address,
                                "token-file": str(old)})
    link, why = _measure_link(gone, ask)  # the edge is down now: a network failure, not this node's config
    assert link is None and why


def test_a_node_connects_with_its_own_tls_files_as_a_whole(tmp_path, certs: Certs) -> None:  # noqa: F811
    """A node that names a tls-ca alone (its tier asks for no client certificate) connects with that CA and
    presents nothing. Before, each file fell back to the run's on its own, so it also took the coordinator's
    certificate and key, paths that only the coordinator's host has: its link went unmeasured ("cannot read
    --tls-cert") and each of its rounds failed the same way."""
    from flwr.app import ConfigRecord

    from clients.app import _measure_link
    from splitfed.transport.server import serve_tier

    run = {"tls-ca": "/coordinator/ca.pem", "tls-cert": "/coordinator/coord.pem", "tls-key": "/coordinator/coord.key"}
    with serve_tier("edge", tls=certs.server_tls_only) as edge:
        node = NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "edge-address": edge.address,
                                 "tls-ca": str(certs.ca)})
        assert node.tls_files(*run.values()) == (str(certs.ca), "", "")
        link, why = _measure_link(node, ConfigRecord({"edge-address": "", "token-file": "", **run}))
        assert link is not None and not why, why
    plain = NodeConfig.parse({"partition-id": 0, "num-partitions": 1})
    assert plain.tls_files(*run.values()) == tuple(run.values())  # none of its own: the run's (one host)
    (tmp_path / "device.pem").write_text("x")
    with pytest.raises(ConfigError, match="node config: tls-cert and tls-key go together"):
        NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "tls-cert": str(tmp_path / "device.pem")})


def test_a_node_certificate_without_its_own_ca_is_refused_at_parse(tmp_path: Path) -> None:
    """A node's tls-* files are a set (``NodeConfig.tls_files``): one naming tls-cert and tls-key but no tls-ca
    connected with no CA at all (gRPC's default roots), not the run's CA as before the set, so its edge's
    certificate, signed by the run's own CA, was refused at registration ("this side does not trust the tier's
    certificate") and at each round. The run config refuses a tls-cert without tls-ca; a node's is refused the
    same way, where it is read."""
    cert, key, ca = (tmp_path / n for n in ("device.pem", "device.key", "ca.pem"))
    for f in (cert, key, ca):
        f.write_text("x")
    with pytest.raises(ConfigError, match="node config: tls-cert needs tls-ca"):
        NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "tls-cert": str(cert), "tls-key": str(key)})
    whole = NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "tls-cert": str(cert), "tls-key": str(key),
                              "tls-ca": str(ca)})
    assert whole.tls_files("/run/ca.pem", "/run/c.pem", "/run/c.key") == (str(ca), str(cert), str(key))
    alone = NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "tls-ca": str(ca)})  # no certificate: taken
    assert alone.tls_files("/run/ca.pem", "/run/c.pem", "/run/c.key") == (str(ca), "", "")
