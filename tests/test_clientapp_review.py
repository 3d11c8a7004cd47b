"""The ClientApp as the boundary between a coordinator and a device (review).

Whatever a train or query message holds, the node answers with a one-line error reply naming the cause, which
the ServerApp logs as the round's ``why_failed``: never a traceback (Flower's reply would then read
``<class 'KeyError'>:<''config''>``), never a round trained on garbage. The runs are the real ServerApp and
ClientApp over in-process tiers (``FakeGrid``), one node's train message changed on its way.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from torch import nn

import clients.app
from splitfed.engine.rounds import initial_state
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint
from splitfed.flower.node import NodeConfig
from splitfed.flower.records import (
    ARRAYS,
    CONFIG,
    NODE,
    NodeInfo,
    TrainInstruction,
    record_to_state,
    state_to_record,
)
from tests.flower_fixtures import FakeGrid, inprocess_tiers
from tests.test_boundary_dtype import _To
from tests.test_node_replies import BASE, _run
from tests.test_node_replies import _instruction as _kept_instruction

Change = Callable[[RecordDict], None]


def _changing(change: Change, partition: int = 1) -> Callable[[Message, Any], Message]:
    """The ClientApp, except that ``partition``'s train message goes through ``change`` first."""
    def app(msg: Message, ctx: Any) -> Message:
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == partition:
            change(msg.content)
        return clients.app.app(msg, ctx)
    return app


def _why_client1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, change: Change, **settings: Any) -> str:
    """client1's ``why_failed`` in a one-round run whose train message to it went through ``change``; the
    others finished, and every tier let go of what it held."""
    rows, held = _run(monkeypatch, tmp_path, _changing(change), "run", settings=BASE.with_(**settings))
    (row,) = rows
    assert row["failed"] == ["client1"] and row["clients"] == 2, row["why_failed"]
    assert held == [0, 0]
    why = row["why_failed"]["client1"]
    assert "\n" not in why
    return str(why)


def _answer(monkeypatch: pytest.MonkeyPatch, msg: Message, ctx: Any, content: RecordDict) -> Message:
    """The ClientApp's reply to ``msg`` with ``content`` instead (its run is over: a message that decodes is
    refused by the edge, which holds no segment any more); what the ClientApp raises, the test raises."""
    with inprocess_tiers(monkeypatch, BASE.tiers - 1):
        return clients.app.app(Message(content, dst_node_id=msg.metadata.dst_node_id, message_type="train",
                                       group_id="1"), ctx)


def _copy(content: RecordDict) -> RecordDict:
    arrays = content.array_records[ARRAYS]
    return RecordDict({CONFIG: ConfigRecord(dict(content.config_records[CONFIG])),
                       ARRAYS: ArrayRecord({k: Array(a.numpy().copy()) for k, a in arrays.items()})})


# ------------------------------------------------------------------ a train message without its records

@pytest.mark.parametrize(("gone", "words"), [
    (CONFIG, "train message: no ConfigRecord 'config' (it holds ['arrays'])"),
    (ARRAYS, "train message: no ArrayRecord 'arrays' (it holds ['config'])"),
])
def test_a_train_message_without_its_config_or_weights_is_named(monkeypatch, tmp_path, gone, words) -> None:
    """Either record missing raised KeyError from the ClientApp: the round's why_failed was "KeyError: 'config'"
    (in a deployment, Flower's "<class 'KeyError'>:<''config''>"), naming neither what was missing nor where."""
    def drop(content: RecordDict) -> None:
        del content[gone]

    assert _why_client1(monkeypatch, tmp_path, drop).startswith(f"ConfigError: {words}")


# ------------------------------------------------------------------ weights that do not decode

def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _raw(key_data: bytes, stype: str = "numpy.ndarray") -> Change:
    def change(content: RecordDict) -> None:
        arrays = content.array_records[ARRAYS]
        k = sorted(arrays)[0]
        arrays[k] = Array(dtype="float32", shape=tuple(arrays[k].shape), stype=stype, data=key_data)
    return change


@pytest.mark.parametrize(("change", "words"), [
    (_raw(b""), "No data left in file (array '0.0.bias' does not decode)"),  # EOFError
    (_raw(b"PK\x03\x04" + b"\x00" * 40), "File is not a zip file (array '0.0.bias' does not decode)"),  # BadZipFile
    (_raw(_npy(np.array(["a", "b"]))), "can't convert np.ndarray of type numpy.str_"),  # torch's TypeError
    (_raw(_npy(np.zeros(16, np.float32)), stype="torch.Tensor"), "Unsupported serialization type"),  # TypeError
])
def test_weights_that_do_not_decode_are_named_with_their_key(monkeypatch, tmp_path, change, words) -> None:
    """np.load's EOFError and BadZipFile, torch's TypeError for a dtype it has not, Flower's for a serialization
    other than numpy's: each raised from the ClientApp, and the round's why_failed was the bare exception."""
    why = _why_client1(monkeypatch, tmp_path, change)
    assert why.startswith("ConfigError: train message: its weights: ") and words in why, why


@hsettings(max_examples=25)
@given(data=st.binary(max_size=300), head=st.sampled_from([b"", b"\x93NUMPY", b"PK\x03\x04"]))
def test_whatever_bytes_a_weight_holds_the_node_answers_with_an_error_reply(data: bytes, head: bytes) -> None:
    """Any bytes in place of a weight: a one-line error reply, never an exception out of the ClientApp."""
    ctx, msg = _one_node()
    content = RecordDict({CONFIG: _INSTRUCTION.to_record(),
                          ARRAYS: ArrayRecord({"0.0.bias": Array(dtype="float32", shape=(16,),
                                                                 stype="numpy.ndarray", data=head + data)})})
    reply = clients.app.app(Message(content, dst_node_id=msg, message_type="train", group_id="1"), ctx)
    assert reply.has_error() and "\n" not in reply.error.reason, reply.error.reason


# ------------------------------------------------------------------ weights that are not finite

def _not_finite(key: str, value: float) -> Change:
    def change(content: RecordDict) -> None:
        arrays = content.array_records[ARRAYS]
        x = arrays[key].numpy().copy()
        x.flat[0] = value
        arrays[key] = Array(x)
    return change


@pytest.mark.parametrize(("key", "value"), [
    # a BatchNorm's running variance: a forward in training mode does not read it, so the node trained the
    # round, returned it NaN, and was dropped as if its own weights had diverged
    ("2.1.running_var", float("nan")),
    # a convolution's weight: the edge refused the device's activations ("activation: contains NaN or
    # infinite values"), which named neither the weights nor the coordinator that sent them
    ("0.0.weight", float("-inf")),
])
def test_weights_sent_not_finite_are_refused_before_anything_trains(monkeypatch, tmp_path, key, value) -> None:
    why = _why_client1(monkeypatch, tmp_path, _not_finite(key, value), cuts="static:3,5")
    assert why == (f"ConfigError: train message: the weights sent for {key!r} hold NaN or infinite values: "
                   "nothing trained (the coordinator's model is not finite)")


# ------------------------------------------------------------------ JSON nested beyond the parser

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("key", ["model", "optim"])
def test_a_model_or_optim_nested_beyond_the_json_parser_is_a_refusal(monkeypatch, tmp_path, key) -> None:
    """json.loads raised RecursionError, which TrainInstruction.from_record did not catch: out of the ClientApp."""
    msg, ctx = _kept_instruction(monkeypatch, tmp_path)
    content = _copy(msg.content)
    content.config_records[CONFIG][key] = DEEP
    reply = _answer(monkeypatch, msg, ctx, content)
    assert reply.has_error()
    assert reply.error.reason.startswith("ConfigError: train instruction: malformed (RecursionError: ")


def test_a_query_whose_model_is_nested_beyond_the_json_parser_is_a_refusal() -> None:
    ctx, node = _one_node()
    ask = ConfigRecord({"model": DEEP, "dataset": "digits", "partition": "iid", "seed": 0})
    reply = clients.app.app(Message(RecordDict({CONFIG: ask}), dst_node_id=node, message_type="query",
                                    group_id="0"), ctx)
    assert reply.has_error() and reply.error.reason.startswith("ConfigError: query: malformed (RecursionError: ")
    # and a well-formed query is still answered
    ask["model"] = json.dumps(BASE.spec.to_dict())
    ok = clients.app.app(Message(RecordDict({CONFIG: ask}), dst_node_id=node, message_type="query", group_id="0"),
                         ctx)
    assert not ok.has_error() and NodeInfo.from_record(ok.content.config_records[NODE]).samples > 0


# ------------------------------------------------------------------ the binding secret is never shown

@pytest.mark.parametrize("secret", [b"s3cret-of-client0", 4242424242, ["s3cret-of-client0"]])
def test_a_secret_of_the_wrong_type_is_refused_without_showing_it(monkeypatch, tmp_path, secret) -> None:
    """The refusal printed the value (``got b's3cret...'``) into the node's log and the round's why_failed
    (metrics.jsonl): the secret that binds a client's steps is sent to its node only, never shown."""
    record = dict(_INSTRUCTION.to_record())
    with pytest.raises(ConfigError) as e:
        TrainInstruction.from_record({**record, "secret": secret})
    assert "secret must be a string, got a value of type" in str(e.value)
    why = _why_client1(monkeypatch, tmp_path, lambda c: c.config_records[CONFIG].__setitem__("secret", secret))
    assert "secret must be a string" in why
    shown = str(secret)
    assert shown not in why and shown.strip("[]'") not in why and "s3cret" not in why and "4242" not in why


# ------------------------------------------------------------------ one line, whatever was sent

@hsettings(max_examples=25)
@given(key=st.sampled_from(["client-id", "dataset"]),
       value=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
       brk=st.sampled_from(["\n", "\r\n", "\r", "\x0b", "\x1c", "\u2028"]))
def test_a_value_with_a_line_break_comes_back_in_a_one_line_refusal(key: str, value: str, brk: str) -> None:
    """An instruction for "client\n0" came back as "instruction for client" and, on a line of its own,
    "0 reached the node ...": a second line in the coordinator's log, written by whoever sent the value (a
    dataset "npz:" path did the same). The refusal stays one line."""
    ctx, node = _one_node()
    sent = f"{value}{brk}x" if key == "client-id" else f"npz:/no/such/{value}{brk}x.npz"
    record = _INSTRUCTION.to_record()
    record[key] = sent
    content = RecordDict({CONFIG: record, ARRAYS: ArrayRecord()})
    reply = clients.app.app(Message(content, dst_node_id=node, message_type="train", group_id="1"), ctx)
    assert reply.has_error()
    assert len(reply.error.reason.splitlines()) == 1, reply.error.reason


# ------------------------------------------------------------------ weights numpy has no dtype for

def bf16_net() -> nn.Module:
    """A digits model whose device blocks hold bfloat16 weights (block 2), the rest float32."""
    return nn.Sequential(nn.Flatten(), _To(torch.bfloat16), nn.Linear(64, 16, dtype=torch.bfloat16), nn.ReLU(),
                         _To(torch.float32), nn.Linear(16, 10))


@given(values=st.lists(st.floats(width=16, allow_nan=False), min_size=1, max_size=12),
       zero_d=st.booleans())
def test_bfloat16_weights_travel_in_a_record_bit_for_bit(values: list[float], zero_d: bool) -> None:
    """``.numpy()`` of a bfloat16 tensor raised TypeError: no bfloat16 state became a record."""
    t = torch.tensor(values[0] if zero_d else values, dtype=torch.bfloat16)
    back = record_to_state(state_to_record({"w": t, "f": t.float()}))
    assert back["w"].dtype == torch.bfloat16 and back["w"].shape == t.shape
    assert torch.equal(back["w"].view(torch.int16), t.view(torch.int16))
    assert back["f"].dtype == torch.float32 and torch.equal(back["f"], t.float())


def test_a_bfloat16_label_on_other_bits_is_refused() -> None:
    record = state_to_record({"w": torch.zeros(3, dtype=torch.bfloat16)})
    other = Array(np.zeros(3, np.float32))
    record["w"] = Array(dtype="bfloat16", shape=other.shape, stype=other.stype, data=other.data)
    with pytest.raises(ConfigError, match="bfloat16 travels as int16, not as torch.float32"):
        record_to_state(record)


def test_a_flower_run_trains_a_model_with_bfloat16_weights_on_its_devices(monkeypatch, tmp_path) -> None:
    """The engine and its tiers train a user's bfloat16 model; the Flower backend stopped at its start, a
    TypeError traceback (the global model not made into the start's ArrayRecord), and a node could not have
    replied with its device weights either."""
    s = BASE.with_(model="tests.test_clientapp_review:bf16_net", cuts="static:3,5")
    initial = initial_state(s.spec, s.seed)
    rows, held = _run(monkeypatch, tmp_path, clients.app.app, "bf16", settings=s)
    (row,) = rows
    assert row["failed"] == [] and row["clients"] == 3 and held == [0, 0]
    got = checkpoint.load(tmp_path / "bf16").state
    assert got["2.weight"].dtype == torch.bfloat16 and not torch.equal(got["2.weight"], initial["2.weight"])


# ------------------------------------------------------------------ a node's files that will not do

def test_a_node_whose_token_file_will_not_do_is_left_out_at_registration(tmp_path, caplog) -> None:
    """A token file the node cannot use (a space in the token) left its link unmeasured, "the profile's is
    used": the node registered, was planned for, and failed every round with the same ConfigError. A token
    the edge refuses was left out at registration already; one that cannot even be sent is now too."""
    import server.app
    from splitfed.flower.config import RunSettings
    from splitfed.transport.server import serve_tier

    (tmp_path / "tok").write_text("the-token\n")
    (tmp_path / "spaced").write_text("the token\n")
    with serve_tier("cloud", insecure=True, token="the-token") as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True, token="the-token") as edge:
        s = RunSettings(rounds=2, clients=3, min_clients=2, tiers=3, cuts="static:1,3", sim_clock=False,
                        token_file=str(tmp_path / "tok"), tier_addresses=f"{edge.address},{cloud.address}",
                        out=str(tmp_path / "run"), node_wait_s=5, round_timeout_s=30)
        grid = FakeGrid(clients.app.app, 3)
        node = grid.node_ids[0]
        grid.contexts[node].node_config["token-file"] = str(tmp_path / "spaced")
        with caplog.at_level("WARNING"):
            server.app.run(grid, s)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["failed"], sorted(r["per_client"])) for r in rows] == [([], ["client1", "client2"])] * 2
    assert (f"Node {node} did not answer the query round: ConfigError: token file {tmp_path / 'spaced'} must hold "
            "one token without spaces: this node could train no round so") in caplog.text


def test_a_node_whose_ca_file_is_no_certificate_says_so_when_asked_to_measure_its_link(tmp_path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    node = NodeConfig.parse({"partition-id": 0, "num-partitions": 1, "edge-address": "127.0.0.1:7000",
                             "tls-ca": str(garbage)})
    ask = ConfigRecord({"edge-address": "", "tls-ca": "", "tls-cert": "", "tls-key": "", "token-file": ""})
    with pytest.raises(ConfigError, match="is not a PEM certificate: this node could train no round so"):
        clients.app._measure_link(node, ask)
    # with no edge named at all there is nothing of the node's to fix: it says it could not measure
    link, why = clients.app._measure_link(NodeConfig.parse({"partition-id": 0, "num-partitions": 1}), ask)
    assert link is None and why.startswith("no edge address")


# ------------------------------------------------------------------ helpers

_INSTRUCTION = TrainInstruction(
    run_id="run", round=1, client_id="client0", cuts=(1, 3), mode="sflv1", u_shape=False, model=BASE.spec,
    optim=BASE.optim, seed=0, dataset="digits", partition="iid", batch_size=32, local_epochs=1,
    edge_address="127.0.0.1:1", secret="not-shown")


def _one_node() -> tuple[Context, int]:
    """A lone node's context (partition 0 of 1) and its node id."""
    grid = FakeGrid(clients.app.app, 1)
    (node,) = grid.node_ids
    return grid.contexts[node], node
