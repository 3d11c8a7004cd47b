"""What the gRPC tier client does on a step's call kind, a reply's size, a probe and an error's diagnosis.

Pinned from the mutation run of ``splitfed/transport/client.py`` (its lines from 240 on): which call kind a step
whose reply exactly fills one message takes, what bytes a reply without a tensor counts, how much larger than
this side's limits a ``Reduce`` reply may be, what a failed probe says and what a probe times, and how the
diagnosis of a host name's other addresses keeps within its time (a clock driven here, never the wall's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import grpc
import pytest
import torch
from torch import nn

from splitfed.engine.types import ReduceItem, StepKey
from splitfed.errors import ResourceExhausted, Unavailable
from splitfed.transport import client as client_mod
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import pb
from tests.transport_fixtures import DrivenClock, closed_port, fake_tier

KEY = StepKey("run", "a", 0, 0)
REFUSED_AT_V6 = ("failed to connect to all addresses; last error: UNKNOWN: ipv6:%5B::1%5D:{port}: Failed to "
                 "connect to remote host: Connection refused")


def _reply(head: object, tensors: dict[str, torch.Tensor] | None = None) -> list[bytes]:
    return wire.frames(head, [(k, tc.encode(v)) for k, v in (tensors or {}).items()], 1 << 20)  # type: ignore[arg-type]



# ---------------------------------------------------------------- a step: its call kind, its bytes


def _step_tier(calls: list[str], reply: list[bytes]) -> dict[str, grpc.RpcMethodHandler]:
    def unary(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        calls.append("Step")
        return reply[0]

    def stream(reqs: Iterator[bytes], ctx: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in reqs:
            pass
        calls.append("StepStream")
        return iter(reply)

    return {"Step": grpc.unary_unary_rpc_method_handler(unary),
            "StepStream": grpc.stream_stream_rpc_method_handler(stream)}


@pytest.mark.parametrize("floats,kind", [(8, "Step"), (5, "Step"), (9, "StepStream")])
def test_a_step_whose_gradient_exactly_fills_one_message_goes_as_a_unary_call(floats: int, kind: str) -> None:
    """The reply's check counts the gradient as it travels (padded to 16 bytes): one that fills ``unary_bytes``
    exactly still fits one message. Only a step without labels sends no more than its reply, so only then does
    this check decide."""
    limits = wire.Limits(unary_bytes=32)
    assert wire.padded(tc.payload_size(torch.float32, (floats,), tc.NONE)) == (32 if floats <= 8 else 48)
    calls: list[str] = []
    with fake_tier(_step_tier(calls, _reply(pb.StepResult(has_tensor=False, loss=1.0)))) as address, \
            GrpcTierClient(address, retries=0, limits=limits) as c:
        c.step(KEY, torch.ones(floats), torch.zeros(0, dtype=torch.int64))
    assert calls == [kind]


def test_a_step_answered_without_a_tensor_counts_no_byte_down() -> None:
    """``bytes_down`` counts tensor payload bytes exactly as the in-process link does: none came, none counted."""
    calls: list[str] = []
    with fake_tier(_step_tier(calls, _reply(pb.StepResult(has_tensor=False, loss=0.5, correct=1)))) as address, \
            GrpcTierClient(address, retries=0) as c:
        got = c.step(KEY, torch.ones(4, 3), torch.arange(4))
        assert got.grad is None and got.loss == 0.5 and got.correct == 1
        assert (c.bytes_up, c.bytes_down) == (4 * 3 * 4 + 4 * 8, 0)
        c.backward(KEY, None)
        assert (c.bytes_up, c.bytes_down) == (4 * 3 * 4 + 4 * 8, 0)
    assert calls == ["Step", "StepStream"]


# ---------------------------------------------------------------- a reduce reply: up to twice this side's limits

LIMIT = 64  # bytes: this client's max_tensor_bytes


@pytest.mark.parametrize("floats,taken", [(2 * LIMIT // 4, True), (2 * LIMIT // 4 + 1, False),
                                          (5 * LIMIT // 8, False)])
def test_a_reduce_reply_may_hold_twice_this_sides_tensor_limit_and_no_more(floats: int, taken: bool) -> None:
    """Float32 means of float16 weights take twice the bytes a load of them did: a reply up to twice the limit is
    taken, one byte more (or 2.5 times) is refused, naming the tier and the call."""
    limits = wire.Limits(max_tensor_bytes=LIMIT)
    reply = _reply(pb.ReduceResult(), {"w": torch.ones(floats)})
    with fake_tier({"Reduce": grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter(reply))}) as address, \
            GrpcTierClient(address, retries=0, limits=limits) as c:
        if taken:
            got = c.reduce("run", [ReduceItem("a", "", 1.0)])
            assert torch.equal(got.means["w"], torch.ones(floats)) and not got.refused
        else:
            with pytest.raises(ResourceExhausted, match=rf"^tier {address}: reduce of 1 client\(s\): reply: tensor w: "
                                                        rf"{4 * floats} bytes exceed the limit of {2 * LIMIT}$"):
                c.reduce("run", [ReduceItem("a", "", 1.0)])


class _Masked(nn.Module):
    """A block holding a uint8 buffer of exactly LIMIT bytes (a mask, a quantized table) and no weight."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.ones(LIMIT, dtype=torch.uint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def masked_mlp() -> nn.Module:
    return nn.Sequential(_Masked(), nn.Linear(2, 2))


def test_the_mean_of_a_byte_buffer_this_side_loaded_comes_back_from_a_reduce() -> None:
    """A uint8 buffer at this side's tensor limit loaded (and would fetch back); its mean, float64 as
    :func:`splitfed.aggregate.wire_dtype` says, is 8 times its bytes."""
    from splitfed.engine import template
    from splitfed.engine.rounds import initial_state
    from splitfed.engine.types import OptimConfig, SegmentLoad
    from splitfed.models.zoo import resolve_spec
    from splitfed.transport.server import serve_tier

    spec = resolve_spec(f"{__name__}:masked_mlp", input_shape=(2,), num_classes=2)
    n = template.num_blocks(spec)
    state = initial_state(spec, 0)
    assert state["0.mask"].nbytes == LIMIT
    with serve_tier("cloud", insecure=True, allowed_models=[f"{__name__}:masked_mlp"]) as srv, \
            GrpcTierClient(srv.address, retries=0, limits=wire.Limits(max_tensor_bytes=LIMIT)) as c:
        c.load(SegmentLoad("run", "a", 0, spec, 0, n, "a", state, OptimConfig("sgd", 0.1), secret="s"))
        assert torch.equal(c.fetch("run", "a", "s")["0.mask"], state["0.mask"])
        got = c.reduce("run", [ReduceItem("a", "s", 1.0)])
    assert torch.equal(got.means["0.mask"], torch.ones(LIMIT, dtype=torch.float64))


# ---------------------------------------------------------------- a probe


def test_a_probe_of_a_tier_that_is_down_says_it_was_tried_once() -> None:
    """A probe is a timing: never retried, and its error says one attempt."""
    port = closed_port()
    with GrpcTierClient(f"127.0.0.1:{port}", retries=3, deadline_s=5.0) as c, pytest.raises(Unavailable) as e:
        c.probe(16, 16)
    assert str(e.value).startswith(f"tier 127.0.0.1:{port}: probe: unavailable after 1 attempt(s): "), e.value
    assert c.retried == 0


def test_a_probe_times_its_one_call() -> None:
    """The seconds a probe reports lie within the time the call took from here."""
    from splitfed.transport.server import serve_tier

    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address, retries=0) as c:
        c.probe(1, 1)  # the connection is made
        t0 = time.perf_counter()
        took = c.probe(1000, 1000)
        outer = time.perf_counter() - t0
    assert 0 < took <= outer


# ---------------------------------------------------------------- the diagnosis of a host name's other addresses


@dataclass
class Diagnosis:
    error: str
    connects: list[tuple[str, float]] = field(default_factory=list)  # (ip, its timeout)
    checks: list[tuple[str, float]] = field(default_factory=list)  # (target, its timeout)
    looked_up: list[str] = field(default_factory=list)
    answer: object = None  # what the asking of the other addresses found (``whole=False``)


def _diagnose(monkeypatch: pytest.MonkeyPatch, *, budget: float, details: str | None = None,
              ips: tuple[str, ...] = ("127.0.0.1",), lookup_s: float = 0.0, connect_s: float = 0.0,
              health: Callable[[str], tuple[grpc.StatusCode, str] | None] = lambda t: (
                  grpc.StatusCode.UNAVAILABLE, "Socket closed"), whole: bool = True) -> Diagnosis:
    """The diagnosis of an UNAVAILABLE call to ``localhost:PORT`` with ``budget`` seconds left; the name resolves
    to ``ips`` (taking ``lookup_s``), each takes a connection (``connect_s``) and its health check says ``health``.
    ``whole``: the call's error (which asks the other addresses only with more than 0.05 s left); else only the
    asking of the other addresses, for ``budget`` seconds (its ``answer``)."""
    port = 7777
    clock = DrivenClock()
    monkeypatch.setattr(client_mod, "time", clock)
    d = Diagnosis("")

    def look_up(name: str, p: int, timeout_s: float) -> list[str]:
        d.looked_up.append(name)
        clock.now += lookup_s
        return list(ips)

    def connect(address: tuple[str, int], timeout: float) -> SimpleNamespace:
        d.connects.append((address[0], timeout))
        clock.now += connect_s
        return SimpleNamespace(close=lambda: None)

    monkeypatch.setattr(client_mod, "look_up", look_up)
    monkeypatch.setattr(client_mod, "socket", SimpleNamespace(create_connection=connect))
    with GrpcTierClient(f"localhost:{port}", insecure=True, retries=0, deadline_s=10) as c:
        def health_of(target: str, name: str, timeout_s: float) -> tuple[grpc.StatusCode, str] | None:
            d.checks.append((target, timeout_s))
            return health(target)

        monkeypatch.setattr(c, "_health_of", health_of)
        if whole:
            text = REFUSED_AT_V6.format(port=port) if details is None else details
            d.error = str(c._error(grpc.StatusCode.UNAVAILABLE, text, "describe", 0, 10.0, left=budget))
        else:
            d.answer = c._answer_of_another_address("localhost", port, budget)
    return d


@pytest.mark.parametrize("lookup_s,budget,connects", [(0.01, 0.02, []), (0.015, 0.03, [0.015]),
                                                      (0.0, 0.5, [0.5]), (0.0, 1.5, [1.0])])
def test_an_address_is_tried_only_with_time_left_and_never_longer_than_it_or_a_second(
        monkeypatch: pytest.MonkeyPatch, lookup_s: float, budget: float, connects: list[float]) -> None:
    """With 0.01 s or less left once the name resolved, no address is tried and gRPC's error stands; else the
    connection waits what is left, at most a second."""
    assert budget - lookup_s in (0.01, 0.015, 0.5, 1.5)  # exact: the boundaries are met, not straddled
    d = _diagnose(monkeypatch, budget=budget, lookup_s=lookup_s, whole=False)
    assert [t for _, t in d.connects] == connects
    assert d.answer == (("127.0.0.1:7777", "127.0.0.1", grpc.StatusCode.UNAVAILABLE, "Socket closed") if connects
                        else None)


@pytest.mark.parametrize("connect_s,budget,checks", [(0.01, 0.02, []), (0.015, 0.03, [0.015]),
                                                     (0.25, 1.0, [0.75])])
def test_an_address_that_took_the_connection_is_asked_only_with_time_left_and_for_no_longer(
        monkeypatch: pytest.MonkeyPatch, connect_s: float, budget: float, checks: list[float]) -> None:
    """The health check gets what is left of the diagnosis's time, and none with 0.01 s or less left."""
    assert budget - connect_s in (0.01, 0.015, 0.75)
    d = _diagnose(monkeypatch, budget=budget, connect_s=connect_s, whole=False)
    assert d.checks == [("127.0.0.1:7777", t) for t in checks]
    assert (d.answer is not None) == bool(checks), d.answer


def test_a_name_is_diagnosed_at_the_address_that_answered_within_the_calls_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The call's error with 0.75 s left: the address is tried and asked within them, and the error says which."""
    d = _diagnose(monkeypatch, budget=0.75, connect_s=0.25)
    assert d.connects == [("127.0.0.1", 0.75)] and d.checks == [("127.0.0.1:7777", 0.5)]
    assert "(said by 127.0.0.1:7777, an address of localhost;" in d.error, d.error


def test_a_silent_address_gives_no_verdict_and_the_next_one_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that takes a connection and never answers (its check's deadline passes) says nothing: the next
    address's refusal is the diagnosis."""
    def health(target: str) -> tuple[grpc.StatusCode, str]:
        if target.startswith("127.0.0.2"):
            return grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        return grpc.StatusCode.UNAVAILABLE, "Socket closed"

    d = _diagnose(monkeypatch, budget=2.0, ips=("127.0.0.2", "127.0.0.1"), health=health)
    assert [t for t, _ in d.checks] == ["127.0.0.2:7777", "127.0.0.1:7777"]
    assert d.error.startswith("tier localhost:7777: describe: unavailable after 1 attempt(s): Socket closed"), d.error
    assert "(said by 127.0.0.1:7777, an address of localhost;" in d.error, d.error


def test_only_a_last_address_that_took_no_connection_sends_the_diagnosis_to_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed socket is the answer of the address gRPC reached (a TLS tier, in plaintext): the name is not
    looked up again and the error keeps gRPC's words, with the hint about TLS."""
    d = _diagnose(monkeypatch, budget=2.0, details="Socket closed")
    assert d.looked_up == [] and d.connects == [] and "said by" not in d.error, d.error
    assert d.error.startswith("tier localhost:7777: describe: unavailable after 1 attempt(s): Socket closed (a tier "
                              "that serves TLS closes a plaintext connection"), d.error
    d = _diagnose(monkeypatch, budget=2.0)  # the last address refused the connection: the others are asked
    assert d.looked_up == ["localhost"] and "said by 127.0.0.1:7777" in d.error, d.error
