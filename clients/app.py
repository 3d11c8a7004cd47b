"""The device tier as a Flower ClientApp (``clients.app:app``).

A node holds one data partition (``partition-id`` / ``num-partitions`` from its
node config; Flower's simulation sets them) and, optionally, a device profile
and the address under which it reaches its edge tier (``device-profile``,
``edge-address``; deployment sets them with ``--node-config``). A deployed
node with data of its own names it with ``data-file`` (a ``.npz`` with
``x_train`` and ``y_train``) and trains on all of it instead of a partition.

- ``query``: answers the ServerApp's registration round with its partition,
  sample count, device profile and splitfed protocol, and (when the run keeps
  real time) its link to the edge and its training speed as it measures them then.
- ``train``: trains its device segment for one round through a gRPC link to the
  edge tier (a node with an ``edge-address`` of its own first checks, once, that
  it reaches the run's edge and not another tier), and returns the segment's
  weights with what the round cost (compute time, link time, bytes each way,
  samples).

Everything a node remembers between messages lives in ``context.state``: one
Ray actor serves many virtual nodes, so module globals would mix them up. The
only process-wide thing is a cache of the (read-only) dataset tensors.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from logging import WARNING
from typing import TYPE_CHECKING

import torch
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log
from flwr.common.constant import ErrorCode

import splitfed
from splitfed.engine.checks import all_finite
from splitfed.engine.rounds import Chain, RoundConfig, train_client
from splitfed.errors import ConfigError, SplitfedError, TierError
from splitfed.flower.node import NodeConfig
from splitfed.flower.records import (
    ARRAYS,
    CONFIG,
    METRICS,
    NODE,
    NodeInfo,
    TrainInstruction,
    TrainReport,
    record_to_state,
    state_to_record,
)
from splitfed.flower.transport import connect
from splitfed.flower.workload import client_data, node_data, round_batches
from splitfed.models.zoo import ModelSpec, first_line
from splitfed.transport.describe import PROTOCOL
from splitfed.transport.errors import TlsRefused

if TYPE_CHECKING:
    from splitfed.engine.types import State
    from splitfed.profile.speed import SpeedMeasure
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.probe import LinkMeasure

torch.set_num_threads(1)  # one CPU per virtual client

STATS = "splitfed-stats"  # MetricRecord in context.state: this node's running totals

app = ClientApp()


def _refusals_as_replies(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """A failure splitfed names (a tier's refusal, a diverged step, a bad node config) goes back as the
    reply's error, in one line: the coordinator logs it as the client's ``why_failed`` and drops the
    client from the round. Raised instead, it would come back wrapped in the engine's traceback. Any
    other exception is a bug, and still raises with its traceback. One line whatever the message holds: a
    value the coordinator sent with a line break in it (a client-id, a dataset path) is quoted back in it, and
    its second line read as a line of the coordinator's log."""
    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except SplitfedError as e:
            reason = " ".join(f"{type(e).__name__}: {e}".splitlines())
            log(WARNING, "%s: %s", handler.__name__, reason)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)
    return wrapped


@app.query()
@_refusals_as_replies
def query(msg: Message, context: Context) -> Message:
    """Registration: partition, local sample count, device profile, own edge address, protocol, link, speed."""
    node = NodeConfig.parse(context.node_config)
    ask = msg.content.config_records.get(CONFIG, ConfigRecord())
    samples = 0
    x = None
    if "model" in ask:
        try:
            spec = ModelSpec.from_dict(json.loads(str(ask["model"])))
            seed, dataset, partition = ask["seed"], str(ask["dataset"]), str(ask["partition"])
        # a coordinator of another make, or hostile (RecursionError: JSON nested deeper than json.loads goes)
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise ConfigError(f"query: malformed ({type(e).__name__}: {e})") from None
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"query: seed must be one integer, got {seed!r}")
        x, _ = _data(node, spec, dataset, partition, seed)
        samples = len(x)
    link, link_error = _measure_link(node, ask) if ask.get("measure-link") else (None, "")
    up, down, rtt = (link.up_mbps or 0.0, link.down_mbps or 0.0, link.rtt_ms) if link else (0.0, 0.0, 0.0)
    speed, speed_error = None, ""
    if ask.get("measure-speed") and x is not None:
        batch = ask.get("batch-size", 32)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"query: batch-size must be a positive integer, got {batch!r}")
        speed, speed_error = _measure_speed(node, spec, x, batch)
    info = NodeInfo(node.partition_id, node.num_partitions, samples, node.device_profile, node.edge_address,
                    up, down, rtt, PROTOCOL, splitfed.__version__, link_error,
                    *((speed.blocks, speed.samples, speed.seconds) if speed else (0, 0, 0.0)), speed_error,
                    own_data=bool(node.data_file))
    return Message(RecordDict({NODE: info.to_record()}), reply_to=msg)


def _measure_speed(node: NodeConfig, spec: ModelSpec, x: torch.Tensor,
                   batch: int) -> tuple[SpeedMeasure | None, str]:
    """How fast this node trains the model's first blocks on a batch of its data (where it computes), for the
    optimizer's plan; else None and why (what the coordinator believed stands)."""
    from splitfed.engine.compute import torch_device
    from splitfed.profile.speed import measure_speed

    if len(x) == 0:
        return None, "no local samples to time training on"
    try:
        return measure_speed(spec, x[:batch], torch_device(node.torch_device, "node config: torch-device")), ""
    except SplitfedError as e:
        log(WARNING, "client%d: could not measure its training speed (the coordinator keeps what it believed): "
            "%s", node.partition_id, e)
        return None, first_line(e)[:1000]


@app.train()
@_refusals_as_replies
def train(msg: Message, context: Context) -> Message:
    """One round of split training of this node's device segment."""
    from splitfed.transport.probe import round_trip_ms

    ins, weights = _received(msg.content)
    node = NodeConfig.parse(context.node_config)
    pid = node.partition_id
    if ins.client_id != f"client{pid}":
        raise ConfigError(f"instruction for {ins.client_id!r} reached the node holding partition {pid}")
    x, y = _data(node, ins.model, ins.dataset, ins.partition, ins.seed)
    # its device holds no block: its round will not show its speed, so it times its training as at registration
    speed = _measure_speed(node, ins.model, x, ins.batch_size)[0] if ins.measure_speed else None
    data = round_batches(x, y, ins.batch_size, ins.seed, pid, ins.round, ins.local_epochs)
    cfg = RoundConfig(ins.run_id, ins.round, ins.model, ins.mode, ins.u_shape, ins.optim, ins.seed)
    edge = node.edge_address or ins.edge_address
    ca, cert, key = node.tls_files(ins.tls_ca, ins.tls_cert, ins.tls_key)
    link = connect(edge, tls_ca=ca, tls_cert=cert, tls_key=key, token_file=node.token_file or ins.token_file,
                   compress=ins.compress, deadline_s=ins.deadline_s)
    try:
        if edge != ins.edge_address:
            _check_edge(context, link, ins)
        # this round's round trip: the adaptive policy learns it, and no longer takes a longer one for a slower link
        try:
            rtt_ms = round_trip_ms(link, 3, min(10.0, ins.deadline_s))
        except TierError:  # a check that failed timed nothing; the steps (which retry) may still go through
            rtt_ms = -1.0
        dev, res = train_client(cfg, Chain([], link), ins.client_id, ins.cuts, weights, data,
                                torch_device=node.torch_device, secret=ins.secret)
    finally:
        link.close()
    report = TrainReport(res.samples, len(data), res.loss, res.correct, res.compute_s, res.link_s,
                         res.bytes_up, res.bytes_down, rtt_ms,
                         *((speed.blocks, speed.samples, speed.seconds) if speed else (0, 0, 0.0)))
    _remember(context, report)
    reply = RecordDict({ARRAYS: state_to_record(dev.state()), METRICS: report.to_record()})
    return Message(reply, reply_to=msg)


def _received(content: RecordDict) -> tuple[TrainInstruction, State]:
    """A train message's instruction and weights, each checked. A message without either record raised
    KeyError from the ClientApp (Flower's reply: "<class 'KeyError'>:<''config''>"); a weight that is NaN or
    infinite was trained on: the edge refused the device's activations, or (a BatchNorm's running statistics,
    which a forward in training mode does not read) the node trained the round and was dropped for the
    non-finite weights it returned, blamed for the coordinator's."""
    for name, records, kind in ((CONFIG, content.config_records, "ConfigRecord"),
                                (ARRAYS, content.array_records, "ArrayRecord")):
        if name not in records:
            raise ConfigError(f"train message: no {kind} {name!r} (it holds {sorted(content) or 'nothing'}): a "
                              "coordinator of another splitfed version?")
    ins = TrainInstruction.from_record(content.config_records[CONFIG])
    try:
        weights = record_to_state(content.array_records[ARRAYS])
    except ConfigError as e:
        raise ConfigError(f"train message: its weights: {e}") from None
    bad = next((k for k, v in weights.items() if not all_finite(v)), None)
    if bad is not None:
        raise ConfigError(f"train message: the weights sent for {bad!r} hold NaN or infinite values: nothing "
                          "trained (the coordinator's model is not finite)")
    return ins, weights


def _measure_link(node: NodeConfig, ask: ConfigRecord) -> tuple[LinkMeasure | None, str]:
    """This node's real link to its edge, for the optimizer's first plan; else None and why (logged here
    and told to the coordinator, whose log is the one a user reads)."""
    from splitfed.transport.probe import measure_link

    edge = node.edge_address or _asked(ask, "edge-address")
    ca, cert, key = node.tls_files(_asked(ask, "tls-ca"), _asked(ask, "tls-cert"), _asked(ask, "tls-key"))
    try:
        link = connect(edge, tls_ca=ca, tls_cert=cert, tls_key=key,
                       token_file=node.token_file or _asked(ask, "token-file"), deadline_s=30.0)
    except ConfigError as e:
        if not edge:  # none named: nothing to measure, and nothing of this node's to fix
            return _unmeasured(node, e)
        # a file that will not do (a token with a space in it, a CA that is no PEM): no network blip, and each
        # round connects with the same files, so it would fail every round: left out now, as for a refused token
        raise ConfigError(f"{e}: this node could train no round so (node config tls-ca, tls-cert, tls-key and "
                          "token-file, or the run's, give the files)") from None
    try:
        with link:
            return measure_link(link, count=3, bandwidth=True), ""
    except TlsRefused as e:  # no network blip either: every step through the edge would be refused
        raise ConfigError(f"the edge refuses this node's TLS ({e}); node config tls-ca, tls-cert and tls-key "
                          "(or the run's) give the files") from None
    except TierError as e:
        if e.code != "UNAUTHENTICATED":
            return _unmeasured(node, e)
        # no network blip: this node's every step through its edge would be refused, so it is left out now
        which = (f"this node's token-file {node.token_file}" if node.token_file
                 else f"the run's token-file {_asked(ask, 'token-file')}")
        raise ConfigError(f"the edge refuses {which} (UNAUTHENTICATED): give the node the token the tiers hold "
                          "(node config token-file)") from None
    except SplitfedError as e:
        return _unmeasured(node, e)


def _asked(ask: ConfigRecord, key: str) -> str:
    """A path or address the coordinator sent ("": none, so the node's own or nothing)."""
    return str(ask.get(key, ""))


def _unmeasured(node: NodeConfig, e: SplitfedError) -> tuple[None, str]:
    log(WARNING, "client%d: could not measure its link to the edge (its profile's is used): %s",
        node.partition_id, e)
    return None, first_line(e)[:1000]  # the hint at its end included


EDGE_CHECKED = "splitfed-edge"  # ConfigRecord in context.state: the edge this node's own address was found to reach


def _check_edge(context: Context, link: GrpcTierClient, ins: TrainInstruction) -> None:
    """A node's own ``edge-address`` must reach the run's edge tier (the process the ServerApp checked), not
    another tier: there, every step would be refused with NOT_FOUND for a segment loaded elsewhere."""
    if not ins.edge_instance:
        return
    checked = context.state.config_records.get(EDGE_CHECKED, ConfigRecord())
    if checked.get("address") == link.address and checked.get("instance") == ins.edge_instance:
        return
    info = link.describe(deadline_s=min(10.0, ins.deadline_s))
    if info.instance != ins.edge_instance:
        raise ConfigError(f"{ins.client_id}: this node's edge-address {link.address} reaches tier {info.name!r} "
                          f"(instance {info.instance}), not this run's edge at {ins.edge_address} (instance "
                          f"{ins.edge_instance}): fix edge-address in the node's --node-config")
    context.state[EDGE_CHECKED] = ConfigRecord({"address": link.address, "instance": info.instance})


def _data(node: NodeConfig, spec: ModelSpec, dataset: str, scheme: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The node's own file if its node config names one (``data-file``), else its partition of the run's dataset."""
    if node.data_file:
        return node_data(spec, node.data_file)
    return client_data(spec, dataset, scheme, node.num_partitions, node.partition_id, seed)


def _remember(context: Context, report: TrainReport) -> None:
    """Running totals of this node, kept in its own context (not shared with other virtual nodes)."""
    old = context.state.metric_records.get(STATS, MetricRecord())
    stats = MetricRecord({
        "rounds": int(_total(old, "rounds")) + 1,
        "bytes-up": int(_total(old, "bytes-up")) + report.bytes_up,
        "bytes-down": int(_total(old, "bytes-down")) + report.bytes_down,
        "compute-s": float(_total(old, "compute-s")) + report.compute_s,
        "link-s": float(_total(old, "link-s")) + report.link_s,
        "throughput": report.throughput,
    })
    context.state[STATS] = stats


def _total(stats: MetricRecord, key: str) -> int | float:
    """One running total of :func:`_remember` (0 before the first round)."""
    v = stats.get(key, 0)
    assert not isinstance(v, list), key  # only _remember writes these records: one number per key
    return v
