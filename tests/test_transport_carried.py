"""Items earlier transport reviews noted and left, each reproduced against real tiers on 127.0.0.1 and failing
before its fix:

1. ``splitfed tier --max-tensor-mb`` (and ``--max-model-mb``, ``--max-sample-mb``) had no upper bound: a value
   past 2**43 MiB started a tier whose every Describe failed ("Exception calling application: Value out of
   range"), and one above 65536 promised tensors no call's messages can carry;
2. a tier's cancel of an idle stream carried no mark of the tier's word (gRPC's cancel sends no trailing
   metadata), and its message named neither the tier nor idleness;
3. a malformed or oversize reply of a step (and of a reduce, and a malformed fetch) did not name the tier;
4. (no defect) a tier killed and restarted on its port with other limits: the client holds nothing of its
   Describe, so the next round meets the new limits themselves;
5. the in-process link took control calls the gRPC tier refuses (empty or overlong ids, replica, base and
   secrets) and raised a model's build failure as ConfigError where gRPC answers INVALID_ARGUMENT.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from splitfed.engine.link import InProcessLink
from splitfed.engine.rounds import Chain, RoundConfig, initial_state, run_round, tier_loads
from splitfed.engine.tier import Tier
from splitfed.engine.types import ReduceItem, StepKey, StepReply
from splitfed.errors import InvalidArgument, ResourceExhausted, SplitfedError, TierError
from splitfed.models.zoo import ModelSpec
from splitfed.transport import wire
from splitfed.transport.chain import close_chain, grpc_chain
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import sent_by_tier
from splitfed.transport.pb import method
from splitfed.transport.process import TierProcess
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import CUT, SPEC, activation, fake_tier, labels

# ---------------------------------------------------------------- 1. --max-tensor-mb has an upper bound

MOST_TENSOR_MB = wire.Limits().max_frames * wire.Limits().chunk_bytes >> 20  # 65536: 65,536 messages of 1 MiB


def _refusal(*args: str) -> str:
    """What ``splitfed tier`` with ``args`` says as it refuses to start; fails the test if it serves."""
    try:
        tier = TierProcess.start("cloud", insecure=True, extra_args=list(args), startup_timeout=60)
    except RuntimeError as e:
        return str(e)
    tier.stop()
    pytest.fail(f"the tier started with {' '.join(args)}")


@pytest.mark.slow
@pytest.mark.parametrize("mb", [MOST_TENSOR_MB + 1, 10**20])
def test_a_max_tensor_mb_no_call_could_carry_is_refused_naming_the_flag_and_the_largest(mb: int) -> None:
    """Before, the tier started; at 10**20 every Describe of it then failed (the chain check of every run)."""
    said = _refusal("--max-tensor-mb", str(mb))
    assert "exited with code 2 before serving" in said
    assert f"--max-tensor-mb must be at most {MOST_TENSOR_MB} (MiB: what one call's messages carry), got {mb}" in said


@pytest.mark.slow
def test_a_max_model_mb_past_describes_int64_is_refused_naming_the_flag_and_the_largest() -> None:
    said = _refusal("--max-model-mb", str(1 << 44))
    assert f"argument --max-model-mb: expected an integer in 1..{1 << 40:,}, got {1 << 44}" in said


@pytest.mark.slow
def test_the_largest_max_tensor_mb_serves_and_describes_itself() -> None:
    with TierProcess.start("cloud", insecure=True, extra_args=["--max-tensor-mb", str(MOST_TENSOR_MB)]) as tier, \
            GrpcTierClient(tier.address, retries=0) as c:
        assert c.describe().max_tensor_bytes == MOST_TENSOR_MB << 20


# ---------------------------------------------------------------- 2. an idle stream's cancel is the tier's word


class _Stall(grpc.StreamUnaryClientInterceptor):
    """Sends a call's first frame, then nothing until ``go`` is set: a caller whose link stalled."""

    def __init__(self, go: threading.Event) -> None:
        self.go = go

    def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        def stalled() -> Iterator[bytes]:
            frames = iter(request_iterator)
            yield next(frames)
            self.go.wait(60)
            yield from frames

        return continuation(details, stalled())


def _nothing(go: threading.Event) -> Iterator[bytes]:
    """A request stream that sends no frame until ``go`` is set."""
    go.wait(60)
    yield from ()


def test_a_tier_cancelling_an_idle_stream_is_taken_as_its_word_naming_it_and_idleness() -> None:
    """Before, the cancel was unmarked (gRPC's, to its caller) and said "Load request stream cancelled: it moved
    ..." without the tier's name or the word idle. Not retried either way: the caller stalled, not the tier."""
    go = threading.Event()
    with serve_tier("cloud", insecure=True, stream_idle_s=1.0, idle_release_s=None) as srv, \
            GrpcTierClient(srv.address, interceptors=[_Stall(go)]) as c, grpc.insecure_channel(srv.address) as ch:
        try:
            (load,) = tier_loads(RoundConfig("run", 0, SPEC), "a", (CUT,), initial_state(SPEC, 0))
            with pytest.raises(ResourceExhausted) as e:
                c.load(load)
            assert re.match(rf"tier {re.escape(srv.address)}: load of a: idle stream cancelled by tier cloud: Load "
                            r"request stream: it moved \d+ bytes in 1 frame\(s\)", str(e.value)), str(e.value)
            assert c.retried == 0
            # a raw call's status, as any caller of the tier sees it: marked as the tier's
            with pytest.raises(grpc.RpcError) as raw:
                list(ch.stream_stream(method("StepStream"))(_nothing(go), timeout=60))
            assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert sent_by_tier(raw.value)
        finally:
            go.set()


# ---------------------------------------------------------------- 3. a reply's read error names the tier


def test_a_reply_larger_than_this_side_takes_names_the_tier() -> None:
    """A U-shape forward whose output (the server segment widens 64 -> 1024 features) exceeds a client's limit.
    Before: "forward 0 of a reply: tensor 0: 16384 bytes exceed the limit of 4096", no tier."""
    mlp = ModelSpec("mlp", (64,), 10, kwargs={"hidden": 1024})
    (load,) = tier_loads(RoundConfig("run", 0, mlp, u_shape=True), "a", (1, 3), initial_state(mlp, 0))
    small = wire.Limits(max_tensor_bytes=4096, max_call_bytes=8192)
    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address, retries=0) as loader, \
            GrpcTierClient(srv.address, retries=0, limits=small) as c:
        loader.load(load)
        with pytest.raises(ResourceExhausted) as e:
            c.forward(StepKey("run", "a", 0, 0), torch.randn(4, 64))
    assert str(e.value) == (f"tier {srv.address}: forward 0 of a: reply: tensor 0: 16384 bytes exceed the limit "
                            "of 4096")


REPLY = [b""]  # what the tier below answers every data and control call with


@pytest.fixture(scope="module")
def garbling() -> Iterator[str]:
    """A gRPC service on 127.0.0.1 that answers Step, StepStream, Fetch and Reduce with ``REPLY[0]``."""
    with fake_tier({
        "Step": grpc.unary_unary_rpc_method_handler(lambda req, ctx: REPLY[0]),
        "StepStream": grpc.stream_stream_rpc_method_handler(lambda reqs, ctx: iter([REPLY[0]])),
        "Fetch": grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter([REPLY[0]])),
        "Reduce": grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter([REPLY[0]])),
    }, workers=4) as address:
        yield address


KEY = StepKey("run", "a", 0, 0)
CALLS: dict[str, Callable[[GrpcTierClient], object]] = {
    "step 0 of a": lambda c: c.step(KEY, activation(), labels()),
    "forward 0 of a": lambda c: c.forward(KEY, activation()),
    "backward 0 of a": lambda c: c.backward(KEY, activation()),
    "fetch of a": lambda c: c.fetch("run", "a"),
    "reduce of 1 client(s)": lambda c: c.reduce("run", [ReduceItem("a", "", 1.0)]),
}


@pytest.mark.parametrize("what", CALLS)
def test_a_malformed_reply_of_any_call_names_the_tier_and_the_call(garbling: str, what: str) -> None:
    """Before: "malformed frame: field number 0", for every one of them (the fetch too)."""
    REPLY[0] = b"\x00\x01"  # a field numbered 0
    with GrpcTierClient(garbling, retries=0) as c, pytest.raises(InvalidArgument) as e:
        CALLS[what](c)
    assert str(e.value) == f"tier {garbling}: {what}: reply: malformed frame: field number 0"


@given(reply=st.binary(max_size=96))
def test_whatever_a_step_reply_holds_it_is_taken_or_refused_naming_the_tier(garbling: str, reply: bytes) -> None:
    REPLY[0] = reply
    with GrpcTierClient(garbling, retries=0) as c:
        try:
            got = c.step(KEY, activation(), labels())
        except TierError as e:
            assert str(e).startswith(f"tier {garbling}: step 0 of a: "), str(e)
        else:
            assert isinstance(got, StepReply)


# ---------------------------------------------------------------- 4. a tier restarted with other limits

MLP = ModelSpec("mlp", (64,), 10, kwargs={"hidden": 1024})  # its largest tensor: 512 x 1024 float32, 2 MiB


def _round(chain: Chain, rnd: int) -> list[float]:
    g = torch.Generator().manual_seed(rnd)
    data: dict[str, Sequence[tuple[torch.Tensor, torch.Tensor]]] = {
        "c0": [(torch.randn(4, 64, generator=g), torch.arange(4) % 10)] * 2}
    _, results = run_round(RoundConfig("restart", rnd, MLP), chain, initial_state(MLP, 0), {"c0": (1,)}, data)
    return [r.loss for r in results]


@pytest.mark.slow
def test_a_tier_restarted_with_other_limits_answers_the_next_round_with_them() -> None:
    """Not a defect: the client keeps nothing a Describe said (its limits come from this side and from what it
    sent), so the first round after a restart with a smaller --max-tensor-mb is refused by the new tier itself,
    naming it and its limit, and one restarted with a larger limit trains as before. The tier with the smaller
    limit is a ``splitfed tier --max-tensor-mb 1`` process; the ones before and after it gRPC servers in this
    process on the same port (with the limits that command gives for 4 and 64 MiB): each a new tier."""
    def in_process(mb: int) -> Any:
        return serve_tier("cloud", address, insecure=True, limits=wire.Limits(
            max_tensor_bytes=mb << 20, max_call_bytes=max(1 << 30, 2 * (mb << 20))))

    address = "127.0.0.1:0"
    server = in_process(4)
    address = server.address
    chain = grpc_chain([address], retries=2, backoff_s=0.05, deadline_s=30)
    try:
        before = _round(chain, 0)
        server.stop(grace=0)
        with TierProcess.start("cloud", listen=address, insecure=True, extra_args=["--max-tensor-mb", "1"]):
            with pytest.raises(SplitfedError, match=rf"tier {re.escape(address)}: load of c0: load request: "
                                                    r"tensor 3\.0\.weight: 2097152 bytes exceed the limit of "
                                                    r"1048576"):
                _round(chain, 0)
        server = in_process(64)
        assert _round(chain, 0) == before
    finally:
        server.stop(grace=0)
        close_chain(chain)


# ---------------------------------------------------------------- 5. the in-process link answers as gRPC does


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[GrpcTierClient, InProcessLink]]:
    """The same client's segment loaded on a gRPC tier and on an in-process one."""
    with serve_tier("cloud", insecure=True, idle_release_s=None) as srv, \
            GrpcTierClient(srv.address, retries=0) as g:
        ip = InProcessLink(Tier("cloud", idle_release_s=None))
        (load,) = tier_loads(RoundConfig("run", 0, SPEC), "a", (CUT,), initial_state(SPEC, 0))
        g.load(load)
        ip.load(load)
        yield g, ip


def _answer(call: Callable[[Any], object], link: object) -> BaseException | None:
    try:
        call(link)
    except Exception as e:  # noqa: BLE001 - compared below, whatever it is
        return e
    return None


def _same_answer(g: BaseException | None, i: BaseException | None) -> None:
    """The in-process link's error is the gRPC client's: its class, and its message less the transport's prefix
    (``tier ADDRESS: CALL: ``)."""
    assert type(g) is type(i), (g, i)
    if g is not None:
        assert str(g) == str(i) or str(g).endswith(f": {i}"), (str(g), str(i))


LOAD = tier_loads(RoundConfig("run", 0, SPEC), "b", (CUT,), initial_state(SPEC, 0))[0]
LONG = "x" * 257
CONTROL: dict[str, Callable[[Any], object]] = {
    "load, empty run": lambda t: t.load(dataclasses.replace(LOAD, run_id="")),
    "load, long client": lambda t: t.load(dataclasses.replace(LOAD, client_id=LONG)),
    "load, long secret": lambda t: t.load(dataclasses.replace(LOAD, secret=LONG)),
    "load, empty replica": lambda t: t.load(dataclasses.replace(LOAD, replica="")),
    "load, long base": lambda t: t.load(dataclasses.replace(LOAD, base=LONG)),
    "load, long base secret": lambda t: t.load(dataclasses.replace(LOAD, base_secret=LONG)),
    "load, a model that does not build": lambda t: t.load(dataclasses.replace(
        LOAD, model=ModelSpec("cnn", (1, 8, 8), 10, kwargs={"bogus": 1}), state=None)),
    "fetch, empty client": lambda t: t.fetch("run", ""),
    "fetch, long secret": lambda t: t.fetch("run", "a", LONG),
    "fetch, blocks backwards": lambda t: t.fetch("run", "a", "", (5, 3)),
    "release, long client": lambda t: t.release("run", LONG),
    "reduce, empty run": lambda t: t.reduce("", [ReduceItem("a", "", 1.0)]),
    "reduce, empty client": lambda t: t.reduce("run", [ReduceItem("", "", 1.0)]),
    "reduce, long secret": lambda t: t.reduce("run", [ReduceItem("a", LONG, 1.0)]),
    "reduce, a client twice": lambda t: t.reduce(
        "run", [ReduceItem("a", "", 1.0), ReduceItem("a", "", 1.0)]),
    "reduce, a NaN weight": lambda t: t.reduce("run", [ReduceItem("a", "", math.nan)]),
}


@pytest.mark.parametrize("case", CONTROL)
def test_a_bad_control_call_gets_the_same_error_in_process_as_over_grpc(
        both: tuple[GrpcTierClient, InProcessLink], case: str) -> None:
    """Before, the in-process link took the bad ids (and reduced, fetched, released with them), and a model that
    does not build was a ConfigError there (not a TierError: it ended the round instead of failing its client)."""
    g, ip = both
    got = _answer(CONTROL[case], g)
    assert isinstance(got, TierError), got  # the gRPC tier refuses each one
    _same_answer(got, _answer(CONTROL[case], ip))


@given(run_id=st.text("ab", max_size=300), client_id=st.text("ab", max_size=300),
       secret=st.text("ab", max_size=300))
def test_a_release_is_refused_in_process_exactly_when_over_grpc(
        both: tuple[GrpcTierClient, InProcessLink], run_id: str, client_id: str, secret: str) -> None:
    """Ids of every length around the bounds (never the loaded client's: its run is "run")."""
    g, ip = both
    _same_answer(_answer(lambda t: t.release(run_id, client_id, secret), g),
                 _answer(lambda t: t.release(run_id, client_id, secret), ip))
