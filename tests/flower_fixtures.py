"""Flower without Ray or gRPC, for fast tests of the apps' logic.

:class:`FakeGrid` is a Flower ``Grid`` that delivers each message to the real
ClientApp in this process (one ``Context`` per node, as Flower keeps them), and
:func:`inprocess_tiers` swaps the tier servers for in-process tiers. The apps'
code runs unchanged; only the transports are replaced. The tests that use real
Flower simulation, real SuperLink/SuperNodes and real tier processes are in
``test_flower_sim.py`` and ``test_flower_deploy.py``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from types import SimpleNamespace

import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

import server.strategy
from splitfed.engine.link import InProcessLink
from splitfed.engine.rounds import inprocess_chain
from splitfed.sim.tiers import TierChain


class FakeGrid(Grid):
    """Delivers messages synchronously to ``client_app``; ``drop`` decides which never answer."""

    def __init__(self, client_app: Callable[[Message, Context], Message], num_nodes: int,
                 drop: Callable[[int, Message], bool] | None = None) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # as a runtime would
        self.client_app = client_app
        self.node_ids = [1000 + 7 * i for i in range(num_nodes)]
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config={"partition-id": i, "num-partitions": num_nodes},
                       state=RecordDict(), run_config={})
            for i, n in enumerate(self.node_ids)
        }
        self.drop = drop
        self.replies: dict[str, Message] = {}
        self.sent: list[Message] = []

    def set_run(self, run):  # type: ignore[no-untyped-def]
        self._run = run

    @property
    def run(self):  # type: ignore[no-untyped-def]
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # type: ignore[no-untyped-def]
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.append(msg)
            ids.append(mid)
            node = msg.metadata.dst_node_id
            if self.drop is not None and self.drop(node, msg):
                continue
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as e:  # noqa: BLE001 - as Flower does: an exception becomes an error reply
                reply = Message(Error(code=0, reason=f"{type(e).__name__}: {e}"), reply_to=msg)
            self.replies[mid] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(m) for m in list(message_ids) if m in self.replies]

    def send_and_receive(self, messages, *, timeout=None):  # type: ignore[no-untyped-def]
        return list(self.pull_messages(self.push_messages(messages)))


class _ClosableLink:
    def __init__(self, link):  # type: ignore[no-untyped-def]
        self._link = link

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._link, name)

    def close(self) -> None:
        pass

    def health(self, timeout: float = 5.0, *, wait: bool = False) -> bool:  # a call to the chain and back
        return True


@contextlib.contextmanager
def inprocess_tiers(monkeypatch, server_tiers: int = 2) -> Iterator[TierChain]:  # type: ignore[no-untyped-def]
    """Patch the ServerApp's tiers and the ClientApp's link to one in-process chain."""
    import clients.app
    import server.app

    chain = inprocess_chain(server_tiers)
    tc = TierChain(["inproc-edge"], controls=list(chain.tiers))

    @contextlib.contextmanager
    def fake_chain(settings):  # type: ignore[no-untyped-def]
        yield tc

    monkeypatch.setattr(server.app, "tier_chain", fake_chain)
    first = chain.link  # each node's own link to the first tier, as its own channel: its bytes are its own
    monkeypatch.setattr(clients.app, "connect", lambda *a, **k: _ClosableLink(
        InProcessLink(first.tier, first.compress_up, first.compress_down)))
    yield tc


@contextlib.contextmanager
def kept_rounds() -> Iterator[dict[int, dict]]:
    """Each round's global model as the run in this process checkpoints it (round -> state)."""
    from splitfed.flower import checkpoint

    kept: dict[int, dict] = {}
    real = checkpoint.save

    def save(folder, ckpt):  # type: ignore[no-untyped-def]
        kept[ckpt.round] = {k: v.detach().clone() for k, v in ckpt.state.items()}
        return real(folder, ckpt)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "save", save)
        yield kept


def assert_rounds_are_the_reference(settings, kept: dict[int, dict]) -> None:  # type: ignore[no-untyped-def]
    """Round by round, the run's global model equals the unsplit reference's round (:func:`reference_run`)
    from the run's own model before it, within float tolerance. Comparing only after the last round would
    compare training's amplification of float rounding instead: a tier sends its means in float32, within one
    ulp of the exact mean where a block also lies on another tier, and a round of SGD with momentum grows
    that 1e-7 to 6e-5 on some CPUs (AVX-512), above the tolerance, on others not."""
    from splitfed.engine.rounds import initial_state
    from splitfed.engine.verify import TOLERANCE, max_abs_diff
    from splitfed.models.zoo import resolve_spec

    assert sorted(kept) == list(range(1, len(kept) + 1)), sorted(kept)
    for r in sorted(kept):
        before = kept[r - 1] if r > 1 else initial_state(resolve_spec(settings.model), settings.seed)
        diff = max_abs_diff(kept[r], reference_run(settings, first=r, state=before))
        assert diff <= TOLERANCE, (r, diff)


def reference_run(settings, rounds: int | None = None, *, first: int = 1, state=None):  # type: ignore[no-untyped-def]
    """The global model after rounds ``first..rounds`` computed on whole models (no split, no Flower), from
    ``state`` (None: the run's initial model) before round ``first`` (one round, with ``first`` alone).

    Every client trains an unsplit copy on exactly the batches its node trains on
    (:mod:`splitfed.flower.workload`), and the copies are combined as the mode does
    (FedAvg for sflv1): the law "cuts are invisible to the math" for a Flower run.
    """
    from splitfed.engine.rounds import RoundConfig, initial_state
    from splitfed.engine.verify import reference_round
    from splitfed.flower.policy import ClientInfo, make_policy
    from splitfed.flower.workload import client_data, round_batches
    from splitfed.models.zoo import resolve_spec

    s = settings
    spec = resolve_spec(s.model)
    clients = [ClientInfo(f"client{p}", p, p) for p in range(s.clients)]
    assignment = make_policy(s).assign(1, clients)
    data = {c.client_id: client_data(spec, s.dataset, s.partition, s.clients, c.partition_id, s.seed)
            for c in clients}
    last = rounds or (first if state is not None else s.rounds)  # a state given: one round from it
    state = initial_state(spec, s.seed) if state is None else state
    for r in range(first, last + 1):
        cfg = RoundConfig(s.run_id, r, spec, s.mode, s.u_shape, s.optim, s.seed)
        batches = {c.client_id: round_batches(*data[c.client_id], s.batch_size, s.seed, c.partition_id, r,
                                              s.local_epochs) for c in clients}
        state = reference_round(cfg, state, assignment, batches, s.tiers)
    return state


class StrategyClock:
    """``server.strategy``'s ``time``: a monotonic clock that only ``sleep`` moves (and the test); ``slept``: each
    sleep asked for."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


@pytest.fixture
def strategy_clock(monkeypatch: pytest.MonkeyPatch) -> StrategyClock:
    """A :class:`StrategyClock` in place of ``server.strategy``'s ``time`` (every test's: tests/conftest.py)."""
    c = StrategyClock()
    monkeypatch.setattr(server.strategy, "time", SimpleNamespace(monotonic=c.monotonic, sleep=c.sleep))
    return c
