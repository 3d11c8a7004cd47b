"""Items a transport review left open, each reproduced against a real tier on 127.0.0.1 and failing before its fix:

1. gRPC's own RESOURCE_EXHAUSTED of a tier at its ``maximum_concurrent_rpcs`` was not retried (only UNAVAILABLE
   was); one the tier sends itself, and gRPC's message-size one, still are not;
2. a tier whose limits took a tensor larger than its caller's own limit sent it back (a fetch, a step's gradient)
   to a caller that refused it, after the training (``splitfed tier --max-tensor-mb`` above 512);
3. ``Limits`` bounds other than chunk and unary bytes, and the counts and limits a tier describes, were not
   checked: a zero bound refused every call for its own reasons, a negative idle release read as "never";
4. a bool tensor's payload bytes other than 0 and 1 were decoded, and kept;
5. tier.proto said a top-k fraction lies in (0, 1]; every receiver refuses one below MIN_TOPK_FRACTION;
6. a first frame's head counted in no budget: a Load whose model options filled ``head_room`` made a frame gRPC
   refused to send, and a Reduce reply listing many refused clients failed with gRPC's "Sent message larger
   than max".
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from torch import nn

from splitfed.engine.rounds import RoundConfig, initial_state, tier_loads
from splitfed.engine.types import ReduceItem, StepKey
from splitfed.errors import ConfigError, InvalidArgument, ResourceExhausted, TierError
from splitfed.models.zoo import resolve_spec
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.describe import PROTOCOL, TierInfo
from splitfed.transport.pb import method, pb
from splitfed.transport.protogen import stale_reason
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import CUT, SPEC, activation, fake_tier, labels, load_client, same

HERE = __name__  # "tests.test_transport_leftovers": the tiers below build the factories of this module


# ---------------------------------------------------------------- model factories the tiers build (--allow-model)


class _Masked(nn.Module):
    """A linear layer behind a bool mask buffer: a bool tensor in a segment's state."""

    keep: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("keep", torch.ones(4, dtype=torch.bool))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.keep)


def masked() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), _Masked())


def noted(note: str = "") -> nn.Module:
    """A small model with an option of any length (a user's factory may take a long one)."""
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 256), nn.Tanh(), nn.Linear(256, 3))


def _load(client: GrpcTierClient, spec: object, cut: int, client_id: str = "a") -> dict[str, torch.Tensor]:
    """Load ``client_id``'s server segment of ``spec`` (blocks from ``cut``) through ``client``; its state."""
    (load,) = tier_loads(RoundConfig("run", 0, spec), client_id, (cut,), initial_state(spec, 0))  # type: ignore[arg-type]
    client.load(load)
    assert load.state is not None
    return load.state


# ---------------------------------------------------------------- 1. gRPC's overload refusal is retried


@contextlib.contextmanager
def _busy(srv: TierServer) -> Iterator[threading.Event]:
    """The tier's only call slot (``max_concurrent_rpcs=1``) held by a StepStream that sends nothing until the
    event is set; yields once another call is refused for it."""
    release = threading.Event()

    def nothing() -> Iterator[bytes]:
        release.wait(20)
        yield from ()

    with grpc.insecure_channel(srv.address) as ch:
        hold = ch.stream_stream(method("StepStream"))
        describe = ch.unary_unary(method("Describe"))
        held = hold(nothing(), timeout=30)
        try:
            for _ in range(200):
                threading.Event().wait(0.02)
                if held.done():  # refused itself: a probe took the slot first
                    held = hold(nothing(), timeout=30)
                    continue
                try:
                    describe(b"", timeout=5)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not held.done():
                        break
            else:
                pytest.fail("no stream kept the tier's call slot")
            yield release
        finally:
            release.set()
            with contextlib.suppress(grpc.RpcError):
                list(held)


def test_grpcs_own_overload_refusal_is_retried_until_the_tier_has_room() -> None:
    """Before, the first "Concurrent RPC limit exceeded!" was the call's answer; now it is retried with the same
    backoff and budget as UNAVAILABLE (nothing of a refused call ran: the tier never saw it)."""
    with serve_tier("cloud", insecure=True, max_workers=4, max_concurrent_rpcs=1) as srv, \
            GrpcTierClient(srv.address, retries=8, backoff_s=0.05, deadline_s=30) as c:
        with _busy(srv) as release:
            threading.Timer(0.3, release.set).start()
            assert c.describe().name == "cloud"
        assert c.retried >= 1


def test_a_tier_busy_through_every_retry_says_so() -> None:
    with serve_tier("cloud", insecure=True, max_workers=4, max_concurrent_rpcs=1) as srv, \
            GrpcTierClient(srv.address, retries=2, backoff_s=0.01, deadline_s=30) as c, _busy(srv):
        with pytest.raises(ResourceExhausted, match=r": describe: busy after 3 attempt\(s\): Concurrent RPC limit "
                                                    r"exceeded! \(the tier takes only so many calls at once"):
            c.describe()
        assert c.retried == 2


def test_a_resource_exhausted_of_the_tier_itself_or_of_a_message_size_is_not_retried() -> None:
    """The tier's own refusal (a tensor above its limit: marked sent-by-tier) and gRPC's refusal of a message
    above the size limit would come back the same: one attempt each."""
    with serve_tier("cloud", insecure=True, limits=wire.Limits(max_tensor_bytes=1024)) as srv, \
            GrpcTierClient(srv.address, retries=5, backoff_s=0.05,
                           limits=wire.Limits(unary_bytes=16 << 20)) as c:
        with pytest.raises(ResourceExhausted, match="exceed the limit of 1024"):
            load_client(c, "a")
        big = dataclasses.replace(SPEC, kwargs={"note": "x" * (6 << 20)})  # a 6 MiB request: over the tier's 4 MiB
        with pytest.raises(ResourceExhausted, match="Received message larger than max"):
            c.describe(big)
        assert c.retried == 0


# ---------------------------------------------------------------- 2. a client takes back what it sent


SMALL = wire.Limits(max_tensor_bytes=512, max_call_bytes=1024)  # below the cnn's segment: the tier's are above


def test_a_fetch_brings_back_the_tensors_a_tier_took_above_this_sides_limit() -> None:
    """A tier with larger limits (``--max-tensor-mb 1024``) takes a segment; before, its fetch was refused by the
    client that had sent it ("fetch reply: tensor 2.0.weight: 18432 bytes exceed the limit of 512"), at the end
    of the round, after the training."""
    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address, retries=0, limits=SMALL) as c:
        sent = _load(c, SPEC, CUT)
        assert max(v.numel() * v.element_size() for v in sent.values()) > SMALL.max_tensor_bytes
        assert same(c.fetch("run", "a"), sent)
        reduced = c.reduce("run", [ReduceItem("a", "", 1.0)])
        assert not reduced.refused and reduced.means.keys() == sent.keys()


def test_a_steps_gradient_comes_back_as_large_as_the_activation_sent() -> None:
    """Before, the tier applied the step and its reply was refused: the client could never get the gradient of a
    step the tier had taken (a retry returns the same cached reply)."""
    x = activation()
    assert x.numel() * x.element_size() > SMALL.max_tensor_bytes
    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address, retries=0, limits=SMALL) as c:
        _load(c, SPEC, CUT)
        reply = c.step(StepKey("run", "a", 0, 0), x, labels())
        assert reply.grad is not None and reply.grad.shape == x.shape and math.isfinite(reply.loss)


def test_a_tier_cannot_make_a_client_take_more_than_it_sent() -> None:
    """Another client (one that sent nothing this large) still refuses the same segment, naming the tier."""
    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address, retries=0) as loader, \
            GrpcTierClient(srv.address, retries=0, limits=SMALL) as other:
        _load(loader, SPEC, CUT)
        with pytest.raises(ResourceExhausted, match=rf"^tier {srv.address}: fetch of a: reply: tensor \S+: \d+ bytes "
                                                    "exceed the limit of 512$"):
            other.fetch("run", "a")


# ---------------------------------------------------------------- 3. limits are checked, set here or described


@pytest.mark.parametrize("field, value", [("max_tensor_bytes", -1), ("max_call_bytes", 0), ("max_tensors", 0),
                                          ("max_frames", 0), ("max_frames", 2.5), ("head_room", -(1 << 20)),
                                          ("head_room", 1024), ("max_tensors", True)])
def test_limits_no_call_could_meet_are_refused_naming_the_field(field: str, value: object) -> None:
    """Before, ``max_frames=0`` refused every call ("call: more than 0 messages") and a negative ``head_room``
    passed, making gRPC refuse the sender's own frames."""
    with pytest.raises(ConfigError, match=rf"^{field} must be a whole number"):
        wire.Limits(**{field: value})  # type: ignore[arg-type]


@contextlib.contextmanager
def _describing(info: pb.TierInfo) -> Iterator[str]:
    """A tier that answers Describe with ``info``; its address."""
    with fake_tier({"Describe": grpc.unary_unary_rpc_method_handler(lambda req, ctx: info.SerializeToString())}) \
            as address:
        yield address


@pytest.mark.parametrize("field, value, words", [
    ("idle_release_s", -5.0, "a finite number of seconds >= 0 (0: never), got -5.0"),
    ("idle_release_s", math.nan, "a finite number of seconds >= 0 (0: never), got nan"),
    ("max_tensor_bytes", -1, ">= 0, got -1"),
    ("max_clients", -3, ">= 0, got -3")])
def test_a_description_with_an_impossible_limit_is_refused_naming_field_and_tier(field: str, value: float,
                                                                                 words: str) -> None:
    """Before, it was taken: a negative or NaN idle release read as "never releases", which skipped the check of
    the round timeout against it; a negative limit was printed by ``splitfed ping`` as the tier's."""
    m = TierInfo(PROTOCOL, "0.1.0", "cloud", "i1", idle_release_s=3600.0).to_pb()
    setattr(m, field, value)
    with _describing(m) as address, GrpcTierClient(address, retries=0) as c:
        with pytest.raises(TierError) as e:
            c.describe()
    assert str(e.value) == f"tier {address}: describe: malformed reply: {field} must be {words}"


# ---------------------------------------------------------------- 4. bool bytes are 0 or 1


def test_a_bool_tensor_with_a_byte_other_than_0_or_1_is_refused() -> None:
    """Before, the load was taken and the tier kept the byte (decoded in place): a fetch sent it back as is."""
    spec = resolve_spec(f"{HERE}:masked", input_shape=(4,), num_classes=3)
    with serve_tier("cloud", insecure=True, allowed_models=[spec.name]) as srv, \
            GrpcTierClient(srv.address, retries=0) as c:
        (load,) = tier_loads(RoundConfig("run", 0, spec), "a", (1,), initial_state(spec, 0))
        assert load.state is not None and load.state["1.keep"].dtype == torch.bool
        bad = torch.tensor([1, 2, 1, 0], dtype=torch.uint8).view(torch.bool)  # byte 2 "is" True
        with pytest.raises(InvalidArgument, match=r"load request: tensor 1\.keep: bool payload byte 1 is 2: bool "
                                                  r"values travel as bytes 0 and 1 only"):
            c.load(dataclasses.replace(load, state={**load.state, "1.keep": bad}))
        c.load(dataclasses.replace(load, state={**load.state, "1.keep": bad.to(torch.uint8).bool()}))  # 1 0
        assert c.fetch("run", "a")["1.keep"].view(torch.uint8).tolist() == [1, 1, 1, 0]


@pytest.mark.parametrize("raw", [b"\x00\x01\x00", b"\x01\x01\x01", b""])
def test_bool_bytes_0_and_1_decode(raw: bytes) -> None:
    t = tc.decode(torch.bool, (len(raw),), tc.NONE, raw)
    assert t.view(torch.uint8).tolist() == list(raw)


# ---------------------------------------------------------------- 5. the proto says the codec's top-k range


def test_the_proto_states_the_top_k_fraction_every_receiver_takes() -> None:
    """Before, tier.proto said (0, 1]; a peer written from it sending 0.0005 was refused."""
    text = (Path(__file__).resolve().parents[1] / "proto" / "splitfed" / "v1" / "tier.proto").read_text()
    comment = text[:text.index("double topk_fraction")].rpartition("CodecKind kind = 1;")[2]
    assert f"in [{tc.MIN_TOPK_FRACTION:g}, 1]" in comment and "(0, 1]" not in comment, comment
    assert stale_reason() is None  # the generated code is of this proto


def test_a_tier_refuses_a_top_k_fraction_below_the_protos_range() -> None:
    """What the comment says, of a real tier: a step asking for a top-k reply of 0.0005 is refused."""
    head = pb.StepHeader(run_id="run", client_id="a", seq=0, phase=pb.PHASE_STEP,
                         reply_codec=pb.Codec(kind=pb.CODEC_TOPK, topk_fraction=tc.MIN_TOPK_FRACTION / 2))
    frame = wire.frames(head, [("", tc.encode(activation())), ("", tc.encode(labels()))], 1 << 20)
    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address, retries=0) as c, \
            grpc.insecure_channel(srv.address) as ch:
        load_client(c, "a")
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(method("Step"))(frame[0], timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"top-k fraction must lie in [{tc.MIN_TOPK_FRACTION:g}, 1]" in (e.value.details() or "")


# ---------------------------------------------------------------- 6. a first frame's head has a budget


TIGHT = wire.Limits(chunk_bytes=4096, unary_bytes=4096)  # gRPC's message limit: 4096 + head_room (64 KiB)


def test_a_load_whose_model_options_fill_the_head_room_is_sent() -> None:
    """Model options of 65,480 characters (the tier takes up to 64 KiB) and a full chunk of weights: before, the
    first frame was 69,712 bytes, and the client's own gRPC refused it ("Sent message larger than max (69712 vs.
    69632)"). Now a head over the frame's meta budget travels alone."""
    spec = resolve_spec(f"{HERE}:noted", input_shape=(6,), num_classes=3, note="x" * 65_480)
    assert len(wire.model_pb(spec).kwargs_json) <= wire.MAX_KWARGS_JSON
    with serve_tier("cloud", insecure=True, limits=TIGHT, allowed_models=[spec.name]) as srv, \
            GrpcTierClient(srv.address, retries=0, limits=TIGHT) as c:
        sent = _load(c, spec, 1)
        assert same(c.fetch("run", "a"), sent)


def test_every_frame_fits_the_message_limit_whatever_its_head() -> None:
    tensors = [(f"t{i}", tc.encode(torch.ones(300 + i))) for i in range(40)]
    for size in (0, 100, wire.META_BYTES - 50, wire.META_BYTES + 1, 65_500):  # the last failed before
        head = pb.LoadHeader(run_id="r", model=pb.ModelSpec(kwargs_json="x" * size))
        frames = wire.frames(head, tensors, TIGHT.chunk_bytes)
        assert max(map(len, frames)) <= TIGHT.max_message_bytes, size
        got, items = wire.read_all(frames, wire.F_LOAD, TIGHT)
        assert got == head and [r.name for r in items] == [n for n, _ in tensors]


def test_a_reduce_reply_too_large_for_one_message_is_refused_clearly() -> None:
    """300 clients that are not loaded: their ids and reasons (~100 kB) do not fit a message of the tier's limits.
    Before, gRPC refused to send the reply ("SERVER: Sent message larger than max"), which the tier did not count
    as a refusal and the caller could not act on."""
    items = [ReduceItem(f"client-{i:04d}-" + "x" * 180, "", 1.0) for i in range(300)]
    with serve_tier("cloud", insecure=True, limits=TIGHT) as srv, GrpcTierClient(srv.address, retries=0) as c:
        with pytest.raises(ResourceExhausted, match=r"reduce: the reply would leave out 300 of the 300 client\(s\), "
                                                    r"and their ids and reasons \(\d+ bytes\) do not fit one message "
                                                    rf"\({TIGHT.max_message_bytes} bytes\): ask about fewer clients"):
            c.reduce("run", items)
        assert srv.servicer is not None and srv.servicer.refusals() == "1 call(s) refused (1 RESOURCE_EXHAUSTED)"
        assert not c.reduce("run", items[:100]).means  # fewer at once: answered (all left out, nothing loaded)
