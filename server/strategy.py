"""SplitFedAvg: Flower's FedAvg, with each client's model split across device, edge and cloud.

A Flower user sees the strategy they know: ``configure_train`` builds the
messages, ``aggregate_train`` turns replies into the new global ArrayRecord,
``start`` runs the rounds. What differs is inside:

- ``configure_train`` asks the assignment policy for each sampled client's cuts,
  loads the server-side segments onto the tier servers, and sends each node a
  fresh RecordDict holding only *its* device-segment weights and *its* config;
- ``aggregate_train`` averages every block layer-wise over all its copies
  (device or server), sample-weighted: each tier server sums its clients'
  replicas where they lie and sends the sum (SplitFed v1), or hands the
  server-side model on to the next client there (SL, SplitFed v2).

SplitFed v1 trains all sampled clients at once (one configure/aggregate pair
per round). Vanilla SL and SplitFed v2 train clients one after another on a
shared server-side model, so a round is one configure/aggregate pair per
client; ``aggregate_train`` returns ``None`` arrays until the round is complete.
Both are the same :class:`~splitfed.engine.rounds.SplitRound`.

Failures: a node that returns an error, times out, or sends a malformed reply
(weights other than its device segment's keys, shapes and dtypes), and a client whose weights (device or server replicas) are not finite, is
dropped from the round; the round completes with the others as long as at
least ``min_train_nodes`` finish, otherwise it raises ``RoundFailed`` and the
global model stays as it was. A tier that cannot load, sum or hand on the
round's weights (it is gone, or the server-side model's latest blocks are lost
with it) fails the round.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, NamedTuple

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.result import Result

from splitfed.data._seed import derive_seed
from splitfed.engine.link import TierControl
from splitfed.engine.rounds import ClientResult, Outcome, RoundConfig, SplitRound
from splitfed.engine.tier import weight_refusal
from splitfed.errors import ConfigError, SplitfedError
from splitfed.flower.adaptive import device_work, measured_device_flops, profile_refusal
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import (
    AssignmentPolicy,
    ClientInfo,
    Clock,
    Cuts,
    Measurement,
    Predictor,
    policy_name,
)
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
from splitfed.models.zoo import first_line
from splitfed.profile.devices import LinkProfile
from splitfed.profile.speed import SpeedMeasure
from splitfed.sim.clock import finished_time
from splitfed.transport.describe import PROTOCOL, this_version

_SAMPLE_STREAM = 211  # derive_seed purpose of client sampling
POLL_S = 0.2
WAITING_S = 30.0  # a round still waiting for its clients says how far it got this often (RoundProgress)
QUERY_EVERY_S = 10.0  # the query round says how many nodes answered this often (QueryProgress)
NO_REPLY = "no reply before the round timeout"  # why a client that never answered failed (rows, RoundFailed)


class RunStopped(SplitfedError):
    """The run was asked to stop (Ctrl-C) while waiting for nodes."""


class QueryRound(NamedTuple):
    """What a query round found: each admitted node's client, what its answer says of its link and speed (for
    the log), why each other node was left out, and how many answered at all (an error is no answer)."""

    clients: dict[int, ClientInfo]
    links: dict[int, str]
    left: dict[int, str]
    answered: int


@dataclass
class RoundRecord:
    """What happened in one round, for the metrics file and the policy."""

    round: int
    assignment: dict[str, Cuts]
    measurements: list[Measurement] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    why_failed: dict[str, str] = field(default_factory=dict)  # client -> what went wrong
    sim_round_s: float | None = None
    predicted_round_s: float | None = None  # real time: the cost model's makespan, predicted before the round
    predicted: dict[str, float] = field(default_factory=dict)  # and each client's time
    train_loss: float | None = None
    moved: dict[str, tuple[Cuts, Cuts]] = field(default_factory=dict)  # client -> (cuts it last trained at, now)
    decision: dict[str, Any] | None = None  # what the policy decided after this round (adaptive: moves and why)
    tier_weight_bytes: list[list[int]] = field(default_factory=list)  # per server tier: [sent, received] bytes
    device_weight_bytes: list[int] = field(default_factory=lambda: [0, 0])  # to the devices, and back

    @property
    def bytes_up(self) -> int:
        return sum(m.bytes_up for m in self.measurements)

    @property
    def bytes_down(self) -> int:
        return sum(m.bytes_down for m in self.measurements)


def moves(previous: Mapping[str, Cuts], assignment: Mapping[str, Cuts]) -> dict[str, tuple[Cuts, Cuts]]:
    """The clients whose cuts differ from those they last trained at (new clients did not move)."""
    return {cid: (tuple(previous[cid]), tuple(c)) for cid, c in assignment.items()
            if cid in previous and tuple(previous[cid]) != tuple(c)}


def settle(previous: dict[str, Cuts], record: RoundRecord) -> None:
    """Record in ``previous`` the cuts each client finished the round with, and keep in ``record.moved`` only
    their moves. A failed client keeps the cuts it last trained at: the round it next trains in pays its move
    (the clock's move cost) and lists it (taking its new cuts, no round ever did; listed in both, summing the
    rows' moves counted it twice). Both backends ask it, and the checkpoint keeps ``previous``."""
    gone = set(record.failed)
    previous.update({cid: tuple(c) for cid, c in record.assignment.items() if cid not in gone})
    record.moved = {cid: m for cid, m in record.moved.items() if cid not in gone}


RoundHook = Callable[[int, ArrayRecord, RoundRecord], None]


class RoundProgress:
    """How far a round that is still waiting for its clients got, said every ``every_s`` seconds: a round of
    a large fleet can take minutes, and a terminal silent that long looks hung. A round done sooner says
    nothing here (its own line follows)."""

    def __init__(self, say: Callable[[str], None], rnd: int, rounds: int, every_s: float) -> None:
        self.say, self.rnd, self.rounds, self.every_s = say, rnd, rounds, every_s
        self.began = self.said = time.monotonic()
        self.clients = 0  # the round's sampled clients, once its first group is out
        self.done = 0  # clients that answered in the round's earlier groups (sl, sflv2: one turn each)
        self.failed = 0  # of those, the ones whose reply is an error

    def answered(self, replies: Sequence[Message]) -> None:
        """A group's replies are all in (or its wait is over)."""
        self.done += len(replies)
        self.failed += _errors(replies)

    def waiting(self, replies: Sequence[Message]) -> None:
        """While an exchange waits; ``replies``: its clients' replies so far. A failed client is said apart:
        it is done with the round, but a watcher of a long round should not learn of it only at the end."""
        now = time.monotonic()
        if now - self.said >= self.every_s:
            self.said = now
            failed = self.failed + _errors(replies)
            self.say(f"round {self.rnd}/{self.rounds}  {self.done + len(replies)}/{self.clients} clients done"
                     + (f" ({failed} failed)" if failed else "") + f"  wall {now - self.began:.0f}s")


class QueryProgress:
    """The query round, said as it starts and then every ``every_s`` seconds while it waits. Its first answer
    waits for the ClientApps to start (in ``splitfed simulate``, Ray's workers importing torch and the app: 7 to
    30 s on 2 busy cores, then 200 answers in a second or two); ``simulate`` said nothing meanwhile (its Flower
    log is off) and looked hung."""

    def __init__(self, say: Callable[[str], None], nodes: int, every_s: float = QUERY_EVERY_S) -> None:
        self.say, self.nodes, self.every_s = say, nodes, every_s
        self.began = self.said = time.monotonic()
        say(f"query round: asking the {nodes} node(s) for their partition and device (the first answer waits for "
            "their ClientApps to start)...")

    def waiting(self, replies: Sequence[Message]) -> None:
        """While the query round waits; ``replies``: the answers so far (an error is a node left out)."""
        now = time.monotonic()
        if now - self.said >= self.every_s:
            self.said = now
            failed = _errors(replies)
            self.say(f"query round: {len(replies)}/{self.nodes} node(s) answered"
                     + (f" ({failed} failed)" if failed else "") + f"  wall {now - self.began:.0f}s")


def _errors(replies: Sequence[Message]) -> int:
    return sum(m.has_error() for m in replies)


class SplitFedAvg(FedAvg):
    """FedAvg over split models (see the module docstring)."""

    def __init__(self, settings: RunSettings, tiers: Sequence[TierControl], policy: AssignmentPolicy, *,
                 clock: Clock | None = None, edge_address: str = "", edge_instance: str = "",
                 edge_now: Callable[[], str] | None = None, stop: threading.Event | None = None,
                 binding_key: str = "", predict: Predictor | None = None,
                 say: Callable[[str], None] | None = None, waiting_s: float | None = None) -> None:
        super().__init__(fraction_train=settings.fraction, fraction_evaluate=0.0,
                         min_train_nodes=settings.min_clients, min_evaluate_nodes=0,
                         min_available_nodes=1)
        self.settings = settings
        self.spec = settings.spec
        self.tiers = list(tiers)
        self.policy = policy
        self.clock = clock
        self.predict = predict
        self.stop = stop
        # where and how often a round still waiting for its clients says how far it got
        self.say, self.waiting_s = say, WAITING_S if waiting_s is None else waiting_s
        # derives each client's binding secret per round (RoundConfig.secret_of); "": a random one per round
        self.binding_key = binding_key
        self.edge_address = edge_address or (settings.addresses[0] if settings.addresses else "")
        self.edge_instance = edge_instance  # from the chain check: who a node's own edge-address must reach
        self.edge_now = edge_now  # the edge's instance now (a Describe): asked again at each round's start
        self.clients: dict[int, ClientInfo] = {}  # node id -> client
        self._asked: dict[str, int] = {}  # message id -> the node it went to, of the last exchange
        self._profile_of: Callable[[NodeInfo], str] | None = None  # a node's profile when its config names none
        self._strangers: set[int] = set()  # nodes asked after registration that do not take a client's place
        self._waiting: dict[int, ClientInfo] = {}  # nodes for a partition whose registered node is still listed
        self.last: RoundRecord | None = None  # the round just done (metrics.jsonl keeps them all, not memory)
        self._unreleased: dict[tuple[int, str], int] = {}  # releases that did not reach a tier (SplitRound)
        self.previous: dict[str, Cuts] = {}  # each client's cuts when it last trained (the clock's moves)
        self._round: SplitRound | None = None
        self._record: RoundRecord | None = None
        self._groups: list[list[str]] = []
        self._node_of: dict[str, int] = {}
        self._expected: dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]] = {}  # cid -> key -> shape, dtype
        self._why: dict[str, str] = {}  # this round's node errors and malformed replies
        self._unanswered: dict[int, str] = {}  # node -> why the last exchange got no reply from it
        self._speeds: dict[str, SpeedMeasure | None] = {}  # this round's speeds of devices that hold no block
        self._sampled: list[ClientInfo] = []  # this round's clients, for predicting the round they finished

    def summary(self) -> None:
        s = self.settings
        log(INFO, "\t├──> SplitFed: mode %s, %d tiers, model %s, cuts %s", s.mode, s.tiers, s.model, s.cuts)
        log(INFO, "\t├──> Sampling: fraction %.2f, at least %d client(s) must finish a round",
            self.fraction_train, self.min_train_nodes)
        log(INFO, "\t└──> Data: %s, partition %s, batch %d x %d epoch(s)", s.dataset, s.partition,
            s.batch_size, s.local_epochs)

    # ------------------------------------------------------------ query round

    def register(self, grid: Grid, profile_of: Callable[[NodeInfo], str] | None = None) -> list[ClientInfo]:
        """Wait for the nodes (up to ``node_wait_s``), ask each for its partition and device profile."""
        s = self.settings
        deadline = time.monotonic() + s.node_wait_s
        # the count last said, and when: said when it changes, else as often as a round's progress (a line
        # each second filled the log: 119 for 120 s)
        said: tuple[int, float] | None = None
        while len(nodes := sorted(grid.get_node_ids())) < s.clients and (now := time.monotonic()) < deadline:
            self._check_stop()
            if said is None or said[0] != len(nodes) or now - said[1] >= self.waiting_s:
                self._tell(f"Waiting for nodes: {len(nodes)} of {s.clients} registered")
                said = (len(nodes), now)
            time.sleep(1.0)
        if said is not None and len(nodes) < s.clients:  # the wait ran out: where it ended
            self._tell(f"Waiting for nodes: {len(nodes)} of {s.clients} registered when node-wait-s "
                       f"({s.node_wait_s:g}s) ran out")
        need = s.min_clients
        if len(nodes) < need:
            raise ConfigError(f"only {len(nodes)} node(s) registered within {s.node_wait_s:.0f}s; "
                              f"at least {need} needed")
        self._profile_of = profile_of
        clients, links, left, answered = self._query(grid, nodes, QueryProgress(self._tell, len(nodes)).waiting)
        self._strangers = set(nodes) - set(clients)
        if len(clients) < need:  # said whole: nodes that answered and were left out are no network trouble
            raise ConfigError(f"only {len(clients)} node(s) admitted by the query round ({answered} of "
                              f"{len(nodes)} answered); at least {need} needed; left out: {_reasons(left)}")
        self.clients = dict(sorted(clients.items(), key=lambda kv: kv[1].partition_id))
        log(INFO, "Registered %d client(s): %s", len(self.clients),
            ", ".join(f"{c.client_id}={c.profile or '?'}{links[n]}" for n, c in self.clients.items()))
        return list(self.clients.values())

    def _tell(self, line: str) -> None:
        """A line of how registration goes: to the run's progress (``say``: ``splitfed simulate``'s terminal,
        the ServerApp's log under ``flwr run``), else to Flower's log."""
        if self.say is not None:
            self.say(line)
        else:
            log(INFO, "%s", line)

    def _query(self, grid: Grid, nodes: Sequence[int],
               waiting: Callable[[Sequence[Message]], None] | None = None) -> QueryRound:
        """The query round of ``nodes``: each one's client (by node id), and what its answer says of its link
        and speed for the log; a node whose answer does not do is left out, with why (logged and kept).
        ``waiting``: told the answers so far while it waits (:class:`QueryProgress`)."""
        s = self.settings
        ask = ConfigRecord({"model": json.dumps(self.spec.to_dict(), sort_keys=True), "dataset": s.dataset,
                            "partition": s.partition, "seed": s.seed})
        if not s.sim_clock and self.edge_address:  # real time: each node measures its real link to the edge
            ask.update({"measure-link": True, "edge-address": self.edge_address, "tls-ca": s.tls_ca,
                        "tls-cert": s.tls_cert, "tls-key": s.tls_key, "token-file": s.token_file})
        # and how fast it trains (splitfed.profile.speed), where the plan prices devices (cuts of the optimizer)
        speed_asked = asks_speed(s)
        if speed_asked:
            ask.update({"measure-speed": True, "batch-size": s.batch_size})
        msgs = [Message(RecordDict({CONFIG: ask}), dst_node_id=n, message_type=MessageType.QUERY)
                for n in nodes]
        replies = self.exchange(grid, msgs, s.node_wait_s, waiting)
        profile_of = self._profile_of
        clients: dict[int, ClientInfo] = {}
        left = {n: f"no reply within node-wait-s ({s.node_wait_s:g}s)" if why == NO_REPLY else why
                for n, why in self._unanswered.items()}  # node -> why it was left out, for register's refusal
        answered = 0
        refusal = profile_refusal(s)
        seen: dict[int, int] = {}
        twice: set[int] = set()  # partitions two nodes claimed
        links: dict[int, str] = {}  # what each node's registration says of its link, for the log
        for msg in replies:
            node = self._node_asked(msg)
            if msg.has_error():
                log(WARNING, "Node %d did not answer the query round: %s", node, msg.error.reason)
                left[node] = f"an error instead of an answer: {_first(msg.error.reason)}"
                continue
            answered += 1
            try:
                info = NodeInfo.from_record(msg.content.config_records[NODE])
            except Exception as e:  # noqa: BLE001 - whatever a node's record makes decoding raise leaves it out
                log(WARNING, "Node %d sent a malformed node record: %s", node, e)
                left[node] = "a malformed node record"
                continue
            if info.protocol != PROTOCOL:  # its device tier would talk to the edge in another protocol
                log(WARNING, "Node %d (partition %d) runs splitfed %s (protocol %d), this coordinator %s: left "
                    "out; run one splitfed version on every machine", node, info.partition_id,
                    info.version or "older than 0.1.0", info.protocol, this_version())
                left[node] = f"another splitfed version than {this_version()}: run one on every machine"
                continue
            if not info.own_data and info.num_partitions != s.clients:  # it would train on another split's slice
                log(WARNING, "Node %d (partition %d) left out: its node config's num-partitions is %d, the run "
                    "deals its data out to %d clients", node, info.partition_id, info.num_partitions, s.clients)
                left[node] = (f"its node config's num-partitions is {info.num_partitions}, the run deals its data "
                              f"out to {s.clients} clients")
                continue
            if info.partition_id in twice:  # asked before seen: a third node is no second one
                log(WARNING, "Node %d also holds partition %d: left out", node, info.partition_id)
                left[node] = f"partition {info.partition_id} held by more than one node"
                continue
            if info.partition_id in seen:  # which one is right cannot be told: neither trains
                log(WARNING, "Nodes %d and %d both hold partition %d: both left out; give each node its own "
                    "partition-id", seen[info.partition_id], node, info.partition_id)
                clients.pop(seen[info.partition_id], None)
                twice.add(info.partition_id)
                left[seen[info.partition_id]] = left[node] = (f"partition {info.partition_id} held by more than "
                                                              "one node")
                continue
            seen[info.partition_id] = node
            if info.profile and (why := refusal(info.profile)) is not None:  # a typo in its node config
                log(WARNING, "Node %d (partition %d) left out: its node config's %s", node, info.partition_id, why)
                left[node] = f"its node config's {why}"
                continue
            profile = info.profile or (profile_of(info) if profile_of else "")
            # only what was asked for: numbers a node sends unasked (in simulated time, say) are not its world
            link, speed = (info.link if "measure-link" in ask else None), (info.speed if speed_asked else None)
            clients[node] = ClientInfo(f"client{info.partition_id}", node, info.partition_id, profile,
                                       info.samples, link, speed)
            links[node] = _link_text(link) or (
                f" (link not measured: {info.link_error}; the profile's is used)" if info.link_error else "")
            links[node] += _speed_text(s, info) if speed_asked else ""
        return QueryRound(clients, links, left, answered)

    def _rejoin(self, grid: Grid) -> set[int]:
        """A node that took the place of a registered one that is gone (a SuperNode restarted: a new node id,
        the same partition) trains for that client from now on. Before, the run kept sending to the dead node
        id, and the partition's data was never trained again. A new node whose partition's node is still
        listed (the SuperLink keeps a dead node's id until its heartbeat times out) waits for it to go.
        Returns the nodes the grid lists now."""
        live = set(grid.get_node_ids())
        self._waiting = {n: info for n, info in self._waiting.items() if n in live}
        registered = {c.partition_id: n for n, c in self.clients.items()}
        gone = {p: n for p, n in registered.items() if n not in live}
        if not gone:
            return live
        new = sorted(live - set(self.clients) - self._strangers - set(self._waiting))
        if new:
            found = self._query(grid, new).clients
            self._strangers |= set(new) - set(found)  # refused: its answer does not change
            for node, info in found.items():
                if info.partition_id in registered:
                    self._waiting[node] = info
                else:
                    log(WARNING, "Node %d holds partition %d, which this run did not register: left out", node,
                        info.partition_id)
                    self._strangers.add(node)
        for node, info in sorted(self._waiting.items()):
            old = gone.pop(info.partition_id, None)
            if old is None:  # its partition's node is still listed: it waits
                continue
            del self._waiting[node]
            self.clients = {(node if n == old else n): (info if n == old else c) for n, c in self.clients.items()}
            log(INFO, "%s is back on node %d (node %d is gone)", info.client_id, node, old)
        return live

    def sample(self, server_round: int, live: set[int] | None = None) -> list[ClientInfo]:
        """This round's clients: the same for a (seed, round) and the same nodes listed, so resume is exact.

        As many as ``ceil(fraction * registered)``, at least ``min_train_nodes``, at most all. The product
        is rounded to 9 decimals before the ceiling, so that float error never adds a client (0.07 * 100 is
        7.000000000000001 in floats: 7 clients, not 8). Drawn among the clients whose node the grid lists
        (``live``), as Flower samples connected nodes, when they are enough: a node gone for good was drawn,
        failed, and a round that took ``min_train_nodes`` failed the run with idle nodes listed; too few
        listed, all are drawn from (the gone ones fail, saying why).
        """
        registered = list(self.clients.values())
        k = min(len(registered), max(math.ceil(round(self.fraction_train * len(registered), 9)),
                                     self.min_train_nodes))
        listed = registered if live is None else [c for c in registered if c.node_id in live]
        pool = listed if len(listed) >= k else registered
        rng = np.random.default_rng(derive_seed(self.settings.seed, _SAMPLE_STREAM, server_round))
        picked = sorted(rng.choice(len(pool), size=k, replace=False).tolist())
        return [pool[i] for i in picked]

    # ------------------------------------------------------------ Flower's hooks

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The messages of the round's next group (all sampled nodes in SplitFed v1)."""
        if self._round is None:
            self._open(server_round, arrays, self._rejoin(grid))
        assert self._round is not None
        group = self._groups.pop(0)
        weights = self._round.begin(group)  # a client whose segments a tier refused is dropped already
        msgs = []
        for cid in weights:
            self._expected[cid] = {k: (tuple(v.shape), v.dtype) for k, v in weights[cid].items()}
            content = RecordDict({ARRAYS: state_to_record(weights[cid]),
                                  CONFIG: self._instruction(server_round, cid, config)})
            msgs.append(Message(content, dst_node_id=self._node_of[cid], message_type=MessageType.TRAIN,
                                group_id=str(server_round)))
        return msgs

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Take a group's replies; after the round's last group, the new global model."""
        assert self._round is not None and self._record is not None
        outcomes = self._outcomes(replies)
        by_node = {n: c for c, n in self._node_of.items()}
        for node, why in self._unanswered.items():  # named in the round's row, and in its RoundFailed
            if (cid := by_node.get(node)) is not None and cid not in outcomes:
                self._why.setdefault(cid, why)
        self._round.end(outcomes, self._why)
        if self._groups:
            return None, None
        rnd, record = self._round, self._record
        self._round, self._record = None, None
        try:
            state = rnd.finish()  # RoundFailed below the minimum: nothing changes
        finally:
            for cid, why in rnd.why.items():  # what the round itself refused; node errors were logged above
                log(WARNING, "%s dropped from round %d: %s", cid, server_round, why)
        record.failed = list(rnd.failed)
        if record.failed and self.clock is not None and record.sim_round_s is not None:
            record.sim_round_s = finished_time(self.clock, server_round, record.assignment, self._sampled,
                                               self.previous, record.failed)
        record.tier_weight_bytes = [list(b) for b in rnd.weight_bytes]
        record.device_weight_bytes = list(rnd.device_bytes)
        reasons = {**self._why, **rnd.why}
        record.why_failed = {c: reasons.get(c, NO_REPLY) for c in rnd.failed}
        record.measurements = [_measurement(r, self._speeds.get(r.client_id)) for r in rnd.results]
        if record.failed and record.predicted_round_s is not None:
            self._predict_finished(record)
        total = sum(r.samples for r in rnd.results)
        record.train_loss = sum(r.loss * r.samples for r in rnd.results) / total if total else None
        record.decision = self.policy.observe(server_round, record.measurements)
        settle(self.previous, record)
        self.last = record
        metrics = MetricRecord({"num-examples": total, "clients": len(rnd.results), "failed": len(rnd.failed),
                                "train-loss": record.train_loss or 0.0, "bytes-up": record.bytes_up,
                                "bytes-down": record.bytes_down})
        return state_to_record(state), metrics

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None, *,
              first_round: int = 1, on_round: RoundHook | None = None) -> Result:
        """Flower's round loop, plus ``first_round`` (resume) and ``on_round`` (metrics, checkpoint).

        Federated evaluation is off (``fraction_evaluate = 0``): the server evaluates the
        global model on held-out data through ``evaluate_fn``.
        """
        self.summary()
        train_config = train_config or ConfigRecord()
        result = Result(arrays=initial_arrays)
        arrays = initial_arrays
        if evaluate_fn is not None and first_round == 1 and (res := evaluate_fn(0, arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = res
        for rnd in range(first_round, num_rounds + 1):
            log(INFO, "[ROUND %d/%d]", rnd, num_rounds)
            try:
                new = None
                watch = RoundProgress(self.say or (lambda line: None), rnd, num_rounds, self.waiting_s)
                while new is None:
                    self._check_stop()  # before the round's (or group's) messages go: nodes would train for nothing
                    msgs = list(self.configure_train(rnd, arrays, train_config, grid))
                    watch.clients = len(self._node_of)
                    replies = self.exchange(grid, msgs, timeout, watch.waiting)
                    watch.answered(replies)
                    new, metrics = self.aggregate_train(rnd, replies)
            finally:
                self._abort()
            arrays = result.arrays = new
            if metrics is not None:
                result.train_metrics_clientapp[rnd] = metrics
            if evaluate_fn is not None and (res := evaluate_fn(rnd, arrays)) is not None:
                result.evaluate_metrics_serverapp[rnd] = res
            if on_round is not None:
                assert self.last is not None and self.last.round == rnd
                on_round(rnd, arrays, self.last)
        return result

    def exchange(self, grid: Grid, msgs: Sequence[Message], timeout: float,
                 waiting: Callable[[Sequence[Message]], None] | None = None) -> list[Message]:
        """``grid.send_and_receive`` that polls every 0.2 s and gives up when ``stop`` is set; ``waiting``: told
        after each poll that leaves replies to wait for the replies that came so far.

        Flower's HTTP grid sleeps 3 s between pulls; a SplitFed round of quick
        clients (and every client turn of sl/sflv2) would mostly wait on that.
        """
        self._unanswered = {}
        if not msgs:  # every client of the group was dropped before training
            return []
        pushed = list(grid.push_messages(msgs))  # a grid gives None for a message it could not push (or none)
        ids = set(pushed) - {None}
        # a reply is the node's that was asked: the SuperLink answers for a node that is gone, from its own id
        self._asked = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs}
        for i, m in enumerate(msgs):
            if (pushed[i] if i < len(pushed) else None) is None:
                self._unanswered[m.metadata.dst_node_id] = ("its message could not be pushed to the SuperLink "
                                                            "(too large, or malformed: see the log)")
        end = time.monotonic() + timeout
        out: list[Message] = []
        while ids and time.monotonic() < end:
            self._check_stop()
            got = list(grid.pull_messages(ids))
            out += got
            ids -= {m.metadata.reply_to_message_id for m in got}
            if ids:
                if waiting is not None:
                    waiting(out)
                time.sleep(POLL_S)
        if ids:
            log(WARNING, "%d node(s) did not answer within %gs", len(ids), timeout)
            for node in {self._asked[m] for m in ids if m in self._asked}:
                self._unanswered[node] = NO_REPLY
        return out

    def _check_stop(self) -> None:
        """Raise RunStopped once ``stop`` is set (Ctrl-C, the runner): asked while waiting and between rounds."""
        if self.stop is not None and self.stop.is_set():
            raise RunStopped("the run was stopped")

    # ------------------------------------------------------------ internals

    def _open(self, server_round: int, arrays: ArrayRecord, live: set[int] | None = None) -> None:
        self._why, self._speeds = {}, {}
        self._describe_edge()
        s = self.settings
        sampled = self.sample(server_round, live)
        assignment = self.policy.assign(server_round, sampled)
        order = [c.client_id for c in sampled]
        assignment = {cid: tuple(int(k) for k in assignment[cid]) for cid in order}
        cfg = RoundConfig(s.run_id, server_round, self.spec, s.mode, s.u_shape, s.optim, s.seed, self.binding_key)
        self._node_of = {c.client_id: c.node_id for c in sampled}
        self._round = SplitRound(cfg, self.tiers, record_to_state(arrays), assignment,
                                 min_clients=min(self.min_train_nodes, len(order)), unreleased=self._unreleased)
        self._groups = self._round.groups()
        sim = self.clock(server_round, assignment, sampled, self.previous) if self.clock is not None else None
        self._record = RoundRecord(server_round, assignment, sim_round_s=sim,
                                   moved=moves(self.previous, assignment))
        self._sampled = sampled
        predicted = self.predict(assignment, sampled) if self.predict is not None else None
        if predicted is not None:
            self._record.predicted_round_s, self._record.predicted = predicted

    def _describe_edge(self) -> None:
        """The edge instance the nodes are told this round: a restarted edge (the same address, a new process)
        is a new instance, and a node naming it otherwise (``localhost`` for ``127.0.0.1``) was refused every
        round against the one of the chain check. An edge that does not answer keeps the last: the round's
        loads then fail and say why."""
        if self.edge_now is None or not self.edge_instance:
            return
        try:
            now = self.edge_now()
        except ConfigError:
            raise  # a restarted tier the chain check refuses (server.app._edge_now): the run stops, naming it
        except SplitfedError as e:
            log(WARNING, "the edge at %s did not describe itself (%s): nodes check against instance %s",
                self.edge_address, first_line(e), self.edge_instance)
            return
        if now != self.edge_instance:
            log(INFO, "the edge at %s is a new instance (%s, was %s): restarted", self.edge_address, now,
                self.edge_instance)
            self.edge_instance = now

    def _predict_finished(self, record: RoundRecord) -> None:
        """The prediction of the round its clients finished, beside what they measured: a dropped client's
        time is not measured, and counted in the prediction it would make the two disagree (the edge and cloud
        it no longer shares, too). Asked before the policy observes the round, so under the same beliefs."""
        assert self.predict is not None
        done = {m.client_id: record.assignment[m.client_id] for m in record.measurements}
        predicted = self.predict(done, self._sampled) if done else None  # the sample as asked: its pricing is cached
        record.predicted_round_s, record.predicted = predicted if predicted is not None else (None, {})

    def _abort(self) -> None:
        """Release the tiers of a round that did not finish (error or RoundFailed)."""
        if self._round is not None:
            self._round.close()
        self._round, self._record, self._groups = None, None, []

    def _instruction(self, server_round: int, cid: str, extra: ConfigRecord) -> ConfigRecord:
        s, rnd = self.settings, self._round
        assert rnd is not None
        rec = TrainInstruction(
            run_id=s.run_id, round=server_round, client_id=cid, cuts=rnd.assignment[cid], mode=s.mode,
            u_shape=s.u_shape, model=self.spec, optim=s.optim, seed=s.seed, dataset=s.dataset,
            partition=s.partition, batch_size=s.batch_size, local_epochs=s.local_epochs,
            edge_address=self.edge_address, tls_ca=s.tls_ca, tls_cert=s.tls_cert, tls_key=s.tls_key,
            token_file=s.token_file, compress=s.codecs[0], edge_instance=self.edge_instance,
            measure_speed=probes_speed(s, rnd.assignment[cid]), secret=rnd.cfg.secret_of(cid),
            deadline_s=s.call_deadline_s,
        ).to_record()
        for k, v in extra.items():
            rec.setdefault(k, v)
        rec["server-round"] = server_round
        return rec

    def _node_asked(self, msg: Message) -> int:
        """The node a reply answers for: the one its message went to (an error reply the SuperLink makes for
        a node that is gone comes from the SuperLink's own id, and was taken for no reply at all)."""
        return self._asked.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)

    def _check_samples(self, cid: str, samples: int) -> None:
        registered = self.clients[self._node_of[cid]].samples
        why = _samples_refusal(samples, registered, self.settings.local_epochs)
        if why is not None:
            raise ConfigError(why)

    def _outcomes(self, replies: Iterable[Message]) -> dict[str, Outcome]:
        assert self._round is not None
        by_node = {n: c for c, n in self._node_of.items()}
        out: dict[str, Outcome] = {}
        for msg in replies:
            cid = by_node.get(self._node_asked(msg))
            if cid is None or cid not in self._expected:
                continue
            if msg.has_error():
                # Flower's Error.reason is optional: a reply without one still says what failed
                reason = msg.error.reason or f"error reply with code {msg.error.code} and no reason"
                log(WARNING, "%s failed: %s", cid, reason)
                self._why[cid] = reason
                continue
            try:
                state = record_to_state(msg.content.array_records[ARRAYS])
                report = TrainReport.from_record(msg.content.metric_records[METRICS])
                _check_weights(state, self._expected[cid])
                self._check_samples(cid, report.samples)
            except Exception as e:  # noqa: BLE001 - a reply that does not decode (np.load of its bytes raises
                # EOFError, BadZipFile, ...) costs its own update, never the run
                log(WARNING, "%s sent a malformed reply, dropped: %s", cid, e)
                self._why[cid] = f"malformed reply: {e}"
                continue
            if not math.isfinite(report.loss):  # its weights may be finite yet: the round's loss would not be
                log(WARNING, "%s diverged (its loss is %s), dropped", cid, report.loss)
                self._why[cid] = f"its training diverged (its loss is {report.loss}): a lower lr may help"
                continue
            self._speeds[cid] = report.speed
            out[cid] = Outcome(state, ClientResult(
                cid, self._round.assignment[cid], report.samples, report.loss, report.correct,
                report.compute_s, report.link_s, report.bytes_up, report.bytes_down,
                report.rtt_ms / 1e3 if report.rtt_ms >= 0 else None))
        return out


def _reasons(left: Mapping[int, str], most: int = 3) -> str:
    """Why nodes were left out, each reason once with how many it left out, most first: the refusal's last
    words, which alone should say what to fix (the warnings above name each node)."""
    counts: dict[str, int] = {}
    for why in left.values():
        counts[why] = counts.get(why, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties keep the order the nodes were seen
    text = "; ".join(f"{why} ({n} node{'s' if n > 1 else ''})" for why, n in ranked[:most])
    more = len(ranked) - most
    return text + (f"; {more} other reason(s) in the warnings above" if more > 0 else "")


def _first(reason: str | None) -> str:
    """A node's error reason in one line (a ClientApp's may hold its traceback)."""
    lines = (reason or "").strip().splitlines()
    return lines[0] if lines else "no reason given"


def _samples_refusal(claimed: int, registered: int, epochs: int) -> str | None:
    """Why a node's count of the samples it trained on is refused (None: it is not). The count weighs its
    update in every average: a node claiming 10**9 made the global model its own alone, one claiming more
    than a tier's Reduce takes failed the round for every client."""
    if claimed > registered * epochs:
        return (f"it trained on {claimed} sample(s), more than the {registered} it registered x {epochs} "
                "local epoch(s)")
    return weight_refusal(claimed)


def _check_weights(state: Mapping[str, torch.Tensor],
                   expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """Refuse a node's weights unless they are its device segment: the keys it was sent, each tensor of the
    shape and dtype the global model has for that key (anything else would fail the whole round's average,
    or silently turn the global model's dtype)."""
    if set(state) != set(expected):
        raise ConfigError(f"returned weights for {sorted(set(state) ^ set(expected))[:3]} "
                          "instead of its device segment")
    for k, (shape, dtype) in expected.items():
        t = state[k]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ConfigError(f"returned {k!r} as {_kind(tuple(t.shape), t.dtype)}, but the global model's is "
                              f"{_kind(shape, dtype)}")


def _kind(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{str(dtype).removeprefix('torch.')} {list(shape)}"


def _measurement(r: ClientResult, speed: SpeedMeasure | None = None) -> Measurement:
    return Measurement(r.client_id, tuple(r.cuts), r.samples, r.compute_s, r.link_s, r.bytes_up, r.bytes_down,
                       r.rtt_s, speed)


def _link_text(link: LinkProfile | None) -> str:
    if link is None:
        return ""
    return (f" (measured up {_plain(link.up * 8 / 1e6)} Mbit/s, down {_plain(link.down * 8 / 1e6)} Mbit/s, "
            f"rtt {_plain(link.rtt * 1e3)} ms)")


def _speed_text(settings: RunSettings, info: NodeInfo) -> str:
    if info.speed_error:
        return f" (speed not measured: {info.speed_error[:200]}; the profile's is used)"
    if info.speed is None:
        return ""
    flops = measured_device_flops(settings, info.speed)
    return (f" (trains at {_plain(flops / 1e9)} GFLOP/s)" if flops else
            " (its speed measurement is not one of this model at this batch, or no device's: the profile's is used)")


PLANNED = ("adaptive", "greedy")  # the policies that price each device from its profile (splitfed.flower.adaptive)


def asks_speed(settings: RunSettings) -> bool:
    """Whether the nodes time their training at registration: in real time, for a policy that prices devices
    (``adaptive``, ``greedy``, also spelt with a colon as make_policy reads them)."""
    return not settings.sim_clock and policy_name(settings.cuts)[0] in PLANNED


def probes_speed(settings: RunSettings, cuts: Cuts) -> bool:
    """Whether a node times its training before this round: in real time, for the adaptive policy (which
    learns each device's speed), when its cuts give its device no work (no block, or only blocks that compute
    nothing: a flatten, an embedding lookup). Its round then teaches nothing of its speed
    (:mod:`splitfed.profile.speed`); the simulated clock times it by the same rule."""
    if settings.sim_clock or policy_name(settings.cuts)[0] != "adaptive":
        return False
    return device_work(settings, cuts) == 0


def _plain(x: float) -> str:
    """About three significant digits, never e-notation: ``1540``, ``82.4``, ``1.9``, ``0.0123``."""
    if not math.isfinite(x) or x <= 0 or x >= 100:
        return f"{x:.0f}"
    return f"{x:.{2 - math.floor(math.log10(x))}f}".rstrip("0").rstrip(".")
