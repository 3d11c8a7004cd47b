"""Less weight traffic over gRPC: a Load may copy its weights from a base replica the tier holds already
(``LoadHeader.base``), and ``Reduce`` averages the clients' trained segments on the tier, so that one copy
(float32 means of float32 weights, float64 of integer buffers) leaves it instead of every client's replica. Real gRPC tier servers on 127.0.0.1: what travels is what
the in-process :class:`~splitfed.engine.tier.Tier` gives, and what the servicer refuses it refuses with a
clear status before the tier is asked."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest
import torch

from splitfed.aggregate import wire_dtype
from splitfed.engine import template
from splitfed.engine.rounds import (
    Chain,
    RoundConfig,
    device_state,
    initial_state,
    select,
    state_bytes,
    tier_loads,
    train_client,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import Reduced, ReduceItem, SegmentLoad
from splitfed.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, TierError
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.describe import PROTOCOL
from splitfed.transport.errors import PermissionDenied, Unauthenticated
from splitfed.transport.pb import SERVICE, pb
from splitfed.transport.server import CONTROL, MAX_ID, TierServer, serve_tier
from tests.transport_fixtures import CUT, SPEC, fake_tier, same

RUN = "run-reduce"
BASE, BASE_CID, BASE_SECRET = "@base.1", "@base.1.0", "base-secret-7f3a"
N_BLOCKS = template.num_blocks(SPEC)
GLOBAL = initial_state(SPEC, 7)  # the round's global model: not what a tier builds from the load's seed
CFG = RoundConfig(RUN, 1, SPEC, binding_key="k" * 32)
SMALL = wire.Limits(chunk_bytes=4096)  # replies of many frames
DEVICE, COORD = "devices-token-31c8", "coordinator-token-e07b"


@pytest.fixture
def tier() -> Iterator[TierServer]:
    with serve_tier("cloud", insecure=True, limits=SMALL) as srv:
        yield srv


def _client(srv: TierServer, token: str | None = None) -> GrpcTierClient:
    return GrpcTierClient(srv.address, token=token, retries=0, deadline_s=30.0, limits=SMALL)


def _base_load(secret: str = BASE_SECRET) -> SegmentLoad:
    """The base replica of [CUT, N_BLOCKS): the global model's server blocks, loaded once."""
    return SegmentLoad(run_id=RUN, client_id=BASE_CID, round=CFG.round, model=SPEC, start=CUT, stop=N_BLOCKS,
                       replica=BASE, state=select(GLOBAL, CUT, N_BLOCKS), optim=CFG.optim, secret=secret)


def _client_load(cid: str, base_secret: str = BASE_SECRET) -> SegmentLoad:
    (load,) = tier_loads(CFG, cid, (CUT,), None)
    return replace(load, base=BASE, base_secret=base_secret)


def _batches(seed: int, n: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 1, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)]


def _train(c: GrpcTierClient, cids: list[str]) -> None:
    """Load each client from the base and train it a couple of steps on its own data (over gRPC)."""
    c.load(_base_load())
    for cid in cids:
        c.load(_client_load(cid))
    c.release(RUN, BASE_CID, BASE_SECRET)  # copied: the clients need the base no more
    for i, cid in enumerate(cids):
        train_client(CFG, Chain([c], c), cid, (CUT,), device_state(GLOBAL, (CUT,), N_BLOCKS, False),
                     _batches(i))


def _same_reduced(a: Reduced, b: Reduced) -> None:
    assert a.refused == b.refused
    assert a.means.keys() == b.means.keys()
    for k in a.means:
        assert a.means[k].dtype == b.means[k].dtype == wire_dtype(GLOBAL[k].dtype), k
        assert torch.equal(a.means[k], b.means[k]), k


# ---------------------------------------------------------------- Load with a base


def test_a_load_with_a_base_gives_the_client_the_bases_weights(tier: TierServer) -> None:
    with _client(tier) as c:
        c.load(_base_load())
        c.load(_client_load("c0"))  # no state travels: the tier copies the base's blocks
        base = c.fetch(RUN, BASE_CID, BASE_SECRET)
        assert same(base, select(GLOBAL, CUT, N_BLOCKS))
        secret = CFG.secret_of("c0")
        assert same(c.fetch(RUN, "c0", secret), base)
        # the client's own replica: a copy, which outlives the base
        c.release(RUN, BASE_CID, BASE_SECRET)
        assert same(c.fetch(RUN, "c0", secret), base)
        assert not same(base, select(initial_state(SPEC, CFG.seed), CUT, N_BLOCKS))  # not what the tier builds
        # without a base (nor state) a new replica has no weights to start from
        with pytest.raises(FailedPrecondition, match="the load must carry its state"):
            c.load(replace(_client_load("c1"), base="", base_secret=""))


def test_a_load_with_a_wrong_base_secret_is_refused_and_binds_nothing(tier: TierServer) -> None:
    with _client(tier) as c:
        c.load(_base_load())
        for wrong in ("another-secret", ""):
            with pytest.raises(PermissionDenied) as e:
                c.load(_client_load("c0", base_secret=wrong))
            assert "another-secret" not in str(e.value) and BASE_SECRET not in str(e.value)
        assert tier.tier.clients() == 1  # the base alone
        c.load(_client_load("c0"))
        assert tier.tier.clients() == 2


def test_a_load_with_state_and_base_takes_each_block_from_one_of_them(tier: TierServer) -> None:
    """Over gRPC: the blocks the state holds from it, the rest copied from the base on the tier."""
    other = initial_state(SPEC, 8)
    with _client(tier) as c:
        c.load(_base_load())
        c.load(replace(_client_load("c0"), state=select(other, N_BLOCKS - 1, N_BLOCKS)))
        got = c.fetch(RUN, "c0", CFG.secret_of("c0"))
    want = {**select(GLOBAL, CUT, N_BLOCKS - 1), **select(other, N_BLOCKS - 1, N_BLOCKS)}
    assert select(other, N_BLOCKS - 1, N_BLOCKS) and set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("field,value,match", [
    ("base", "b" * (MAX_ID + 1), f"base must have at most {MAX_ID} characters"),
    ("base_secret", "s" * (MAX_ID + 1), f"base_secret must have at most {MAX_ID} characters"),
])
def test_an_overlong_base_or_base_secret_is_refused(tier: TierServer, field: str, value: str, match: str) -> None:
    with _client(tier) as c:
        c.load(_base_load())
        with pytest.raises(InvalidArgument, match=match) as e:
            c.load(replace(_client_load("c0"), **{field: value}))
        assert "s" * (MAX_ID + 1) not in str(e.value)  # a secret is never echoed
        assert tier.tier.clients() == 1


def test_a_load_whose_base_is_not_on_the_tier_is_refused(tier: TierServer) -> None:
    with _client(tier) as c, pytest.raises(FailedPrecondition, match="is not loaded here"):
        c.load(_client_load("c0"))
    assert tier.tier.clients() == 0


# ---------------------------------------------------------------- Reduce


def test_reduce_over_grpc_is_what_the_tier_reduces_in_process(tier: TierServer) -> None:
    """Three clients trained apart (their weights differ): the means over gRPC (replies of many frames)
    equal, bit for bit, what the serving Tier's own reduce gives, and are the weighted means of their weights
    (computed in float64, sent as float32 for the float32 weights and float64 for the integer buffer)."""
    cids = ["c0", "c1", "c2"]
    weights = {"c0": 8.0, "c1": 3.0, "c2": 0.5}
    with _client(tier) as c:
        _train(c, cids)
        fetched = {cid: c.fetch(RUN, cid, CFG.secret_of(cid)) for cid in cids}
        assert not same(fetched["c0"], fetched["c1"]) and not same(fetched["c1"], fetched["c2"])
        assert not same(fetched["c0"], select(GLOBAL, CUT, N_BLOCKS))
        items = [ReduceItem(cid, CFG.secret_of(cid), weights[cid]) for cid in cids]
        got = c.reduce(RUN, items)
        want = tier.tier.reduce(RUN, items)
        _same_reduced(got, want)
        assert got.refused == {}
        assert got.means.keys() == fetched["c0"].keys()
        assert {str(v.dtype) for v in fetched["c0"].values()} == {"torch.float32", "torch.int64"}
        for k, v in got.means.items():
            assert v.dtype == (torch.float32 if fetched["c0"][k].dtype == torch.float32 else torch.float64), k
            manual = sum(weights[cid] * fetched[cid][k].to(torch.float64) for cid in cids) / sum(weights.values())
            torch.testing.assert_close(v, manual.to(v.dtype), rtol=1e-12, atol=1e-12)
        assert state_bytes(got.means) == state_bytes(fetched["c0"])  # one copy: before, float64 sums, twice
        # a subset, and the order of the items, change nothing but what is summed
        sub = [items[2], items[0]]
        _same_reduced(c.reduce(RUN, sub), tier.tier.reduce(RUN, sub))
        # read-only: the clients keep their weights and still step
        assert all(same(c.fetch(RUN, cid, CFG.secret_of(cid)), fetched[cid]) for cid in cids)
        assert tier.tier.clients() == 3


def test_reduce_names_the_clients_it_left_out(tier: TierServer) -> None:
    with _client(tier) as c:
        _train(c, ["c0", "c1"])
        items = [ReduceItem("c0", CFG.secret_of("c0"), 2.0), ReduceItem("ghost", "whatever", 1.0),
                 ReduceItem("c1", CFG.secret_of("c1"), 1.0), ReduceItem("gone", "", 5.0)]
        got = c.reduce(RUN, items)
        assert set(got.refused) == {"ghost", "gone"}
        assert all("no segment" in why for why in got.refused.values()), got.refused
        _same_reduced(got, tier.tier.reduce(RUN, items))
        _same_reduced(replace(got, refused={}), c.reduce(RUN, [items[0], items[2]]))
        # another run holds none of them
        other = c.reduce("another-run", items[:1])
        assert other.means == {} and set(other.refused) == {"c0"}
        assert c.reduce(RUN, []) == Reduced({}, {})


def test_reduce_leaves_out_a_client_whose_weights_are_not_finite(tier: TierServer) -> None:
    with _client(tier) as c:
        _train(c, ["c0", "c1"])
        # the tier's own copy of c1's weights goes bad (as a diverging step would leave them)
        with torch.no_grad():
            next(iter(tier.tier._bindings[(RUN, "c1")].segment.parameters())).fill_(math.nan)  # noqa: SLF001
        items = [ReduceItem("c0", CFG.secret_of("c0"), 1.0), ReduceItem("c1", CFG.secret_of("c1"), 1.0)]
        got = c.reduce(RUN, items)
        assert set(got.refused) == {"c1"} and "NaN" in got.refused["c1"]
        _same_reduced(got, tier.tier.reduce(RUN, items))
        assert all(torch.isfinite(v).all() for v in got.means.values())


def test_reduce_leaves_out_a_client_with_a_wrong_secret_alone(tier: TierServer) -> None:
    """As its own Fetch would be refused: the others are summed (a first version refused the whole call, so
    one client a tier had released and another caller had reloaded dropped every client of the round)."""
    with _client(tier) as c:
        _train(c, ["c0", "c1"])
        items = [ReduceItem("c0", CFG.secret_of("c0"), 1.0), ReduceItem("c1", "not-c1s-secret", 1.0)]
        got = c.reduce(RUN, items)
        assert list(got.refused) == ["c1"] and "another secret" in got.refused["c1"]
        assert "not-c1s-secret" not in got.refused["c1"] and CFG.secret_of("c1") not in got.refused["c1"]
        alone = c.reduce(RUN, items[:1])
        assert set(got.means) == set(alone.means) and all(torch.equal(got.means[k], alone.means[k]) for k in got.means)


@pytest.mark.parametrize("items,match", [
    ([ReduceItem("c0", "s", -1.0)], r"item 0 \(client 'c0'\): its weight must be 0 or in 1e-06\.\.1e\+15 \(its samples\), got -1"),
    ([ReduceItem("c0", "s", 1.0), ReduceItem("c1", "s", math.nan)], r"item 1 \(client 'c1'\): its weight .* nan"),
    ([ReduceItem("c0", "s", math.inf)], r"item 0 \(client 'c0'\): its weight .* inf"),
    ([ReduceItem("c0", "s", 1.0), ReduceItem("c0", "s", 2.0)], r"item 1 \(client 'c0'\): the client is listed twice"),
    ([ReduceItem("", "s", 1.0)], r"item 0 \(client ''\): client_id must have 1\.\.256 characters"),
    ([ReduceItem("c" * (MAX_ID + 1), "s", 1.0)], r"item 0 .*client_id must have 1\.\.256 characters, got 257"),
    ([ReduceItem("c0", "s" * (MAX_ID + 1), 1.0)], r"item 0 \(client 'c0'\): secret must have at most 256"),
])
def test_reduce_refuses_malformed_items_naming_them(tier: TierServer, items: list[ReduceItem], match: str) -> None:
    with _client(tier) as c:
        with pytest.raises(InvalidArgument, match=match) as e:
            c.reduce(RUN, items)
        assert "s" * (MAX_ID + 1) not in str(e.value)


@pytest.mark.parametrize("run_id", ["", "r" * (MAX_ID + 1)])
def test_reduce_refuses_a_malformed_run_id(tier: TierServer, run_id: str) -> None:
    with _client(tier) as c, pytest.raises(InvalidArgument, match="run_id must have 1..256 characters"):
        c.reduce(run_id, [ReduceItem("c0", "s", 1.0)])


def test_reduce_lists_at_most_the_tiers_max_clients() -> None:
    with serve_tier("cloud", insecure=True, tier=Tier("cloud", max_clients=2)) as srv, _client(srv) as c:
        ok = [ReduceItem(f"c{i}", "s", 1.0) for i in range(2)]
        assert set(c.reduce(RUN, ok).refused) == {"c0", "c1"}
        with pytest.raises(ResourceExhausted, match="3 clients listed, but tier cloud serves at most 2"):
            c.reduce(RUN, [*ok, ReduceItem("c2", "s", 1.0)])


def test_a_malformed_reduce_request_is_invalid_argument(tier: TierServer) -> None:
    with grpc.insecure_channel(tier.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(ch.unary_stream(f"/{SERVICE}/Reduce")(b"\xff\xff", timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed ReduceRequest" in (e.value.details() or "")


# ---------------------------------------------------------------- tokens


def test_reduce_is_the_coordinators_call() -> None:
    """With a coordinator token, a caller with the devices' token cannot Reduce (it would read every client's
    trained weights, averaged), nor load from a base; the coordinator can."""
    assert "Reduce" in CONTROL
    with serve_tier("cloud", insecure=True, token=DEVICE, coordinator_token=COORD, limits=SMALL) as srv, \
            _client(srv, COORD) as coord, _client(srv, DEVICE) as device, _client(srv) as nobody:
        assert coord.describe().control_token
        coord.load(_base_load())
        with pytest.raises(PermissionDenied, match="Load needs the coordinator's token"):
            device.load(_client_load("c0"))
        _train(coord, ["c0"])
        items = [ReduceItem("c0", CFG.secret_of("c0"), 2.0)]
        with pytest.raises(PermissionDenied) as e:
            device.reduce(RUN, items)
        msg = str(e.value)
        assert msg.endswith("Reduce needs the coordinator's token (this tier was started with "
                            "--coordinator-token-file): the devices' token allows steps only")
        assert DEVICE not in msg and COORD not in msg
        with pytest.raises(Unauthenticated):
            nobody.reduce(RUN, items)
        got = coord.reduce(RUN, items)
        assert got.refused == {} and got.means
        _same_reduced(got, srv.tier.reduce(RUN, items))


# ---------------------------------------------------------------- the wire and the reply's checks


def test_the_protocol_says_reduce_and_base() -> None:
    assert PROTOCOL >= 4  # 4: a Reduce reply holds means (float32 for float32 weights), not float64 sums
    fields = pb.LoadHeader.DESCRIPTOR.fields_by_name
    assert (fields["base"].number, fields["base_secret"].number) == (13, 14)
    assert pb.Frame.DESCRIPTOR.fields_by_name["reduced"].number == wire.F_REDUCE
    method = pb.DESCRIPTOR.services_by_name["Tier"].methods_by_name["Reduce"]
    assert (method.client_streaming, method.server_streaming) == (False, True)


def test_a_reduce_reply_round_trips_through_frames() -> None:
    head = pb.ReduceResult(refused=["ghost"], reasons=["no segment"])
    means = {"2.weight": torch.randn(16, 8), "2.bias": torch.randn(16), "2.n": torch.tensor(3.0, dtype=torch.float64)}
    enc = [(k, tc.encode(v)) for k, v in sorted(means.items())]
    frames = wire.frames(head, enc, 256)
    assert len(frames) > 1
    assert pb.Frame.FromString(frames[0]).reduced == head  # what the generated code reads
    got, items = wire.read_all(frames, wire.F_REDUCE, wire.Limits(), writable=True)
    assert got == head
    assert {r.name: r.tensor for r in items}.keys() == means.keys()
    assert all(torch.equal(r.tensor, means[r.name]) and r.tensor.dtype == means[r.name].dtype for r in items)
    # an empty result still travels as a head
    got, items = wire.read_all(wire.frames(pb.ReduceResult(), [], 256), wire.F_REDUCE, wire.Limits())
    assert got == pb.ReduceResult() and items == []
    # a reply of another kind is refused
    with pytest.raises(InvalidArgument, match="unexpected header"):
        wire.read_all(wire.frames(pb.StepResult(), [], 256), wire.F_REDUCE, wire.Limits(), what="reduce reply")


def _fake_reply(head: pb.ReduceResult | None, tensors: dict[str, torch.Tensor]) -> list[bytes]:
    return wire.frames(head, [(k, tc.encode(v)) for k, v in tensors.items()], 1 << 20)


F64 = torch.zeros(3, dtype=torch.float64)


@pytest.mark.parametrize("reply,error,match", [
    (_fake_reply(None, {"a": F64}), InvalidArgument, "the first frame carries no header"),
    (_fake_reply(pb.ReduceResult(refused=["c0", "c1"], reasons=["x"]), {}), TierError,
     "2 refused client.* but 1 reason"),
    (_fake_reply(pb.ReduceResult(refused=["stranger"], reasons=["x"]), {}), TierError,
     "refuses client 'stranger', which was not listed"),
    (_fake_reply(pb.ReduceResult(), {"a": torch.zeros(3, dtype=torch.float16)}), TierError,
     "mean 'a' is torch.float16, not float32 or float64"),
    (_fake_reply(pb.ReduceResult(), {"a": torch.zeros(3, dtype=torch.int64)}), TierError,
     "mean 'a' is torch.int64, not float32 or float64"),
    (_fake_reply(pb.ReduceResult(), {"a": F64, "": F64}), TierError, "distinct, non-empty names"),
    (_fake_reply(pb.ReduceResult(), {"a": F64}) + _fake_reply(None, {"a": F64})[:1], TierError,
     "distinct, non-empty names"),
])
def test_the_client_refuses_a_malformed_reduce_reply(reply: list[bytes], error: type[Exception], match: str) -> None:
    with fake_tier({"Reduce": grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter(reply))}) as address, \
            GrpcTierClient(address, retries=0, deadline_s=10.0) as c, pytest.raises(error, match=match):
        c.reduce(RUN, [ReduceItem("c0", "s", 1.0), ReduceItem("c1", "s", 1.0)])



def test_a_fetch_of_a_range_of_blocks_gets_those_blocks_only(tier: TierServer) -> None:
    """sl and sflv2 hand the model on from replica to replica on the tiers; a block that moves to another
    tier is fetched alone (before: the whole segment, other blocks that were stale or another's included)."""
    c = _client(tier)
    try:
        _train(c, ["c0"])
        whole = c.fetch(RUN, "c0", CFG.secret_of("c0"))
        part = c.fetch(RUN, "c0", CFG.secret_of("c0"), (CUT, CUT + 4))  # blocks 2 and 5 hold weights, 6 not
        want = select(whole, CUT, CUT + 4)
        assert want and set(want) < set(whole) and set(part) == set(want)
        assert all(torch.equal(part[k], want[k]) for k in want)
        for bad in ((0, CUT + 1), (CUT, N_BLOCKS + 1)):  # outside its segment [CUT, N_BLOCKS)
            with pytest.raises(InvalidArgument, match="not a range inside its segment"):
                c.fetch(RUN, "c0", CFG.secret_of("c0"), bad)
        with pytest.raises(TierError, match="start < stop"):
            c.fetch(RUN, "c0", CFG.secret_of("c0"), (CUT + 2, CUT + 2))
    finally:
        c.close()


def test_a_reduce_reply_of_a_tensor_at_the_limit_comes_back() -> None:
    """A tensor at the transport's limit came in with a load, so its mean must come back: float32, the bytes of
    the load's (a reply may hold twice a load's bytes, as float32 means of float16 weights would; protocol 3's
    float64 sums of float32 weights needed it: before that, every sflv1 round failed for a model with a
    tensor above half the limit)."""
    largest = max(v.numel() * v.element_size() for v in select(GLOBAL, CUT, N_BLOCKS).values())
    limits = wire.Limits(chunk_bytes=4096, max_tensor_bytes=largest, max_call_bytes=4 * largest)
    with serve_tier("cloud", insecure=True, limits=limits) as srv, \
            GrpcTierClient(srv.address, retries=0, deadline_s=30.0, limits=limits) as c:
        _train(c, ["c0"])
        got = c.reduce(RUN, [ReduceItem("c0", CFG.secret_of("c0"), 3.0)])
        whole = c.fetch(RUN, "c0", CFG.secret_of("c0"))
        assert not got.refused and max(v.numel() * v.element_size() for v in got.means.values()) == largest
        # one client: its float32 weights, exactly (x * 3 / 3 in float64), and its integer buffer as float64
        assert all(torch.equal(got.means[k], whole[k].to(wire_dtype(whole[k].dtype))) for k in whole)
        assert all(got.means[k].dtype == wire_dtype(whole[k].dtype) for k in whole)
