"""sflv1's weights through the tiers: the round's global server blocks staged once per tier (base segments the
clients' loads copy there), and each tier's sample-weighted mean of its clients' replicas taken back (Reduce;
float32 for float32 weights) instead of every replica. In-process tiers here; tests/test_reduce_transport.py runs the calls over gRPC."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from splitfed.engine import template
from splitfed.engine.rounds import (
    RoundConfig,
    RoundFailed,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    select,
    server_bounds,
    state_bytes,
    tier_loads,
)
from splitfed.engine.tier import MAX_BASES, Tier
from splitfed.engine.types import ReduceItem, SegmentLoad, block_of
from splitfed.errors import (
    ConfigError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    TierError,
)
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("cnn", num_classes=10)
RUN = "base-run"
ASSIGN = {"c0": (1, 3), "c1": (2, 5), "c2": (3, 6)}


def _batches(n: int = 2, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, *SPEC.input_shape, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(n)]


class _Wrapped:
    """A tier seen through a wrapper that changes one call."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.tier, name)


class _Seen(_Wrapped):
    """A tier that notes every load it is asked for."""

    def __init__(self, tier: Tier, sent: list[SegmentLoad]) -> None:
        super().__init__(tier)
        self.sent = sent

    def load(self, spec: SegmentLoad) -> None:
        self.sent.append(spec)
        self.tier.load(spec)


def _load(client: str, start: int, stop: int, state=None, **kw) -> SegmentLoad:  # type: ignore[no-untyped-def]
    return SegmentLoad(RUN, client, 1, SPEC, start, stop, kw.pop("replica", client), state, secret=f"s-{client}", **kw)


def test_a_binding_keeps_no_copy_of_the_weights_it_was_loaded_with() -> None:
    """Before, the binding kept the load's tensors beside the segment's own weights: twice each client's
    weights on the tier."""
    tier = Tier("edge")
    state = {k: v.clone() for k, v in select(initial_state(SPEC, 0), 1, 4).items()}
    probe = weakref.ref(next(iter(state.values())))
    tier.load(_load("c0", 1, 4, state))
    del state
    gc.collect()
    assert probe() is None
    assert tier.fetch(RUN, "c0", "s-c0")  # the weights are in the segment


def test_a_load_from_a_base_copies_its_blocks_and_outlives_it() -> None:
    tier = Tier("edge")
    glob = initial_state(SPEC, 0)
    tier.load(_load("@base.1.0", 1, 5, select(glob, 1, 5), replica="@b"))
    tier.load(_load("c0", 2, 4, base="@b", base_secret="s-@base.1.0"))
    tier.release(RUN, "@base.1.0", "s-@base.1.0")
    got = tier.fetch(RUN, "c0", "s-c0")
    want = select(glob, 2, 4)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    with torch.no_grad():  # a copy: the client's training does not write into another's weights
        next(iter(tier._bindings[(RUN, "c0")].segment.parameters())).add_(1.0)
    tier.load(_load("@base.1.0", 1, 5, select(glob, 1, 5), replica="@b"))
    tier.load(_load("c1", 2, 4, base="@b", base_secret="s-@base.1.0"))
    got = tier.fetch(RUN, "c1", "s-c1")
    assert all(torch.equal(got[k], want[k]) for k in want)


def _peak_bytes(fn) -> int:  # type: ignore[no-untyped-def]
    """The most CPU memory torch held at once while ``fn`` ran, above what it held before (its allocator's
    own record of every allocation and free, in order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn()
    held = top = 0
    for e in sorted(p.events(), key=lambda e: e.time_range.start):
        held += e.self_cpu_memory_usage
        top = max(top, held)
    return top


def test_a_load_from_a_base_holds_the_new_segment_and_no_copy_beside_it() -> None:
    """The base's blocks are copied straight into the new segment: before, they were first cloned, and the
    clone sat beside the new segment (twice its weights on the tier for a moment, which the memory model
    does not price; for frozen weights nothing else covers it)."""
    spec = resolve_spec("vgg11", num_classes=10)
    glob = initial_state(spec, 0)
    n = template.num_blocks(spec)
    tier = Tier("edge")
    load = lambda c, state=None, **kw: SegmentLoad(RUN, c, 1, spec, 0, n, kw.pop("replica", c), state,  # noqa: E731
                                                    secret=f"s-{c}", **kw)
    tier.load(load("@base.1.0", select(glob, 0, n), replica="@b"))
    tier.load(load("c0", base="@b", base_secret="s-@base.1.0"))  # the template is built once, before
    size = sum(v.numel() * v.element_size() for v in glob.values())
    peak = _peak_bytes(lambda: tier.load(load("c1", base="@b", base_secret="s-@base.1.0")))
    assert size <= peak < 1.25 * size, (peak, size)
    got = tier.fetch(RUN, "c1", "s-c1")
    assert all(torch.equal(got[k], glob[k]) for k in glob)


def test_a_load_from_a_base_is_refused_without_its_secret_or_blocks() -> None:
    tier = Tier("edge")
    glob = initial_state(SPEC, 0)
    tier.load(_load("@base.1.0", 2, 6, select(glob, 2, 6), replica="@b"))  # cnn: blocks 2 and 5 hold weights
    with pytest.raises(PermissionDenied, match="held under another secret"):
        tier.load(_load("c0", 2, 4, base="@b", base_secret="guess"))
    with pytest.raises(TierError, match="holds no block 6"):
        tier.load(_load("c0", 2, 7, base="@b", base_secret="s-@base.1.0"))
    with pytest.raises(TierError, match="is not loaded here"):
        tier.load(_load("c0", 2, 4, base="@other", base_secret="s-@base.1.0"))
    assert tier.clients() == 1  # the refused loads bound nothing


def test_a_load_takes_the_blocks_its_state_holds_and_the_rest_from_its_base() -> None:
    """How a client in turn gets a block the client before left on another tier (sent) beside the blocks it
    left on this one (copied there)."""
    tier = Tier("edge")
    glob, other = initial_state(SPEC, 0), initial_state(SPEC, 1)
    tier.load(_load("@base.1.0", 2, 6, select(glob, 2, 6), replica="@b"))
    tier.load(_load("c0", 2, 7, select(other, 6, 7), base="@b", base_secret="s-@base.1.0"))
    got = tier.fetch(RUN, "c0", "s-c0")
    want = {**select(glob, 2, 6), **select(other, 6, 7)}
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert any(not torch.equal(glob[k], other[k]) for k in select(glob, 6, 7))  # the two sources differ


def test_base_segments_do_not_take_a_clients_place_but_are_bounded() -> None:
    tier = Tier("edge", max_clients=2)
    glob = initial_state(SPEC, 0)
    tier.load(_load("@base.1.0", 1, 3, select(glob, 1, 3), replica="@b"))
    for c in ("c0", "c1"):  # a tier for two clients serves two, while a coordinator's base is loaded
        tier.load(_load(c, 1, 3, base="@b", base_secret="s-@base.1.0"))
    with pytest.raises(ResourceExhausted, match="serves 2 clients"):
        tier.load(_load("c2", 1, 3, base="@b", base_secret="s-@base.1.0"))
    for i in range(1, MAX_BASES):
        tier.load(SegmentLoad(f"run{i}", f"@base.1.{i}", 1, SPEC, 1, 2, "@b", select(glob, 1, 2)))
    with pytest.raises(ResourceExhausted, match=f"{MAX_BASES} base segments"):
        tier.load(SegmentLoad("one-more", "@base.1.0", 1, SPEC, 1, 2, "@b", select(glob, 1, 2)))


def test_reduce_averages_the_finite_replicas_and_names_the_rest() -> None:
    """The mean is computed in float64 and sent as float32 for the float32 weights, float64 for the integer
    buffer (BatchNorm's num_batches_tracked in block 2): the bytes of one copy of the segment, not twice."""
    tier = Tier("edge")
    glob = initial_state(SPEC, 0)
    for c in ("c0", "c1", "c2"):
        tier.load(_load(c, 1, 3, select(glob, 1, 3)))
    w1 = tier._bindings[(RUN, "c1")].segment
    with torch.no_grad():
        next(iter(w1.parameters())).mul_(3.0)
        next(iter(tier._bindings[(RUN, "c2")].segment.parameters()))[0].fill_(float("nan"))
    items = [ReduceItem("c0", "s-c0", 2.0), ReduceItem("c1", "s-c1", 5.0), ReduceItem("c2", "s-c2", 1.0),
             ReduceItem("gone", "x", 1.0)]
    got = tier.reduce(RUN, items)
    assert set(got.refused) == {"c2", "gone"}
    assert "NaN" in got.refused["c2"] and "no segment" in got.refused["gone"]
    s0, s1 = tier.fetch(RUN, "c0", "s-c0"), tier.fetch(RUN, "c1", "s-c1")
    assert set(got.means) == set(s0)
    assert any(not v.is_floating_point() for v in s0.values())  # an integer buffer is among them
    for k, v in got.means.items():
        want = torch.float32 if s0[k].dtype == torch.float32 else torch.float64
        assert v.dtype == want and v.device.type == "cpu", k
        assert torch.equal(v, ((s0[k].double() * 2.0 + s1[k].double() * 5.0) / 7.0).to(want)), k
    assert state_bytes(got.means) == state_bytes(s0)  # before: float64 sums, twice a float32 segment's bytes
    wrong = tier.reduce(RUN, [ReduceItem("c0", "s-c0", 1.0), ReduceItem("c1", "guess", 1.0)])
    assert list(wrong.refused) == ["c1"] and "another secret" in wrong.refused["c1"]  # that client alone
    assert all(torch.equal(wrong.means[k], s0[k] if s0[k].is_floating_point() else s0[k].double()) for k in s0)
    with pytest.raises(InvalidArgument, match="listed twice"):
        tier.reduce(RUN, [ReduceItem("c0", "s-c0", 1.0), ReduceItem("c0", "s-c0", 1.0)])
    # a weight is a sample count: before, 1e308 overflowed the float64 sums and 5e-324 underflowed them, and
    # the wrong means came back OK
    for w in (float("inf"), float("nan"), -1.0, 1e308, 5e-324):
        with pytest.raises(InvalidArgument, match="must be 0 or in"):
            tier.reduce(RUN, [ReduceItem("c0", "s-c0", w), ReduceItem("c1", "s-c1", w)])


def test_a_client_ids_like_a_base_are_refused() -> None:
    chain = inprocess_chain(2)
    with pytest.raises(ConfigError, match="'@x'.*base"):
        SplitRound(RoundConfig(RUN, 1, SPEC), chain.tiers, initial_state(SPEC, 0), {"@x": (1, 3)})


def test_a_client_whose_cloud_weights_are_not_finite_is_dropped_from_every_tiers_mean() -> None:
    """The cloud leaves c1 out of its mean; the edge's mean, asked first, held c1, so it is asked again without
    it: the new model is what the round gives without c1 at all."""

    class Poisons(_Wrapped):  # the cloud, whose replica of c1 turns NaN when the round averages it
        def reduce(self, run_id, items):  # type: ignore[no-untyped-def]
            b = self.tier._bindings.get((run_id, "c1"))
            if b is not None:
                with torch.no_grad():
                    next(iter(b.segment.parameters())).fill_(float("nan"))
            return self.tier.reduce(run_id, items)

    state = initial_state(SPEC, 0)
    data = {c: _batches(seed=i) for i, c in enumerate(ASSIGN)}
    ref = inprocess_chain(2)
    want = drive(SplitRound(RoundConfig(RUN, 1, SPEC, binding_key="k"), ref.tiers, state,
                            {c: k for c, k in ASSIGN.items() if c != "c1"}),
                 local_trainer(ref, {c: d for c, d in data.items() if c != "c1"}))
    chain = inprocess_chain(2)
    tiers = [chain.tiers[0], Poisons(chain.tiers[1])]
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, binding_key="k"), tiers, state, ASSIGN, min_clients=2)
    got = drive(rnd, local_trainer(chain, data))
    assert rnd.failed == ["c1"] and "its cloud weights" in rnd.why["c1"] and "NaN" in rnd.why["c1"]
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(got[k], state[k]) for k in state)
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_a_tier_that_cannot_average_fails_the_round_with_its_reason() -> None:
    class Broken(_Wrapped):
        def reduce(self, run_id, items):  # type: ignore[no-untyped-def]
            raise ResourceExhausted("tier cloud: out of memory for the sums")

    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), [chain.tiers[0], Broken(chain.tiers[1])], initial_state(SPEC, 0),
                     ASSIGN)
    with pytest.raises(RoundFailed, match="could not be averaged.*out of memory"):
        drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGN}))
    assert [t.clients() for t in chain.tiers] == [0, 0]


@pytest.mark.parametrize("tamper,match", [
    ("extra key", r"holds other keys than their segments: \['0.0.weight'\]"),
    ("missing key", "holds other keys than their segments"),
    ("float64", r"'5.0.bias' is float64 \[64\], not a finite float32 \[64\]"),  # a sum's dtype, say
    ("shape", r"'5.0.bias' is float32 \[1\], not a finite float32 \[64\]"),
    ("nan", r"'5.0.bias' is float32 \[64\], not a finite float32 \[64\]"),
])
def test_a_tiers_mean_that_is_not_what_its_clients_hold_is_refused(tamper: str, match: str) -> None:
    class Lies(_Wrapped):
        def reduce(self, run_id, items):  # type: ignore[no-untyped-def]
            out = self.tier.reduce(run_id, items)
            k = sorted(out.means)[0]
            if tamper == "extra key":
                out.means["0.0.weight"] = torch.zeros(1, dtype=torch.float32)
            elif tamper == "missing key":
                del out.means[k]
            elif tamper == "float64":
                out.means[k] = out.means[k].double()
            elif tamper == "nan":
                out.means[k] = out.means[k].clone()
                out.means[k][0] = float("nan")
            else:
                out.means[k] = out.means[k].reshape(-1)[:1]
            return out

    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), [chain.tiers[0], Lies(chain.tiers[1])], initial_state(SPEC, 0),
                     ASSIGN)
    with pytest.raises(TierError, match="cloud: its mean of the clients' segments.*" + match):
        drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGN}))
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_a_tiers_integer_buffer_mean_must_come_as_float64() -> None:
    """BatchNorm's num_batches_tracked (int64, block 2, on the edge) travels as a float64 mean: the float32 a
    float weight's mean travels in is refused for it."""

    class Narrows(_Wrapped):
        def reduce(self, run_id, items):  # type: ignore[no-untyped-def]
            out = self.tier.reduce(run_id, items)
            out.means["2.1.num_batches_tracked"] = out.means["2.1.num_batches_tracked"].float()
            return out

    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), [Narrows(chain.tiers[0]), chain.tiers[1]], initial_state(SPEC, 0),
                     ASSIGN)
    with pytest.raises(TierError, match=r"edge: its mean of the clients' segments: '2.1.num_batches_tracked' is "
                                        r"float32 \[\], not a finite float64 \[\]"):
        drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGN}))
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_the_clients_server_loads_carry_only_the_blocks_no_other_client_holds_there_in_sflv1() -> None:
    """What the coordinator sends per client is the binding and the blocks it alone holds on that tier; the
    blocks two or more hold are sent once, as the tier's base, and copied there. Edge: c0 [1,3), c1 [2,5), c2
    [3,6), so blocks 2..4 are shared (of the cnn's blocks only 0, 2, 5 and 6 have weights: c2's block 5 is its
    own); cloud: c0 [3,7), c1 [5,7), c2 [6,7), so blocks 5, 6 are."""
    sent: list[SegmentLoad] = []

    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), [_Seen(t, sent) for t in chain.tiers], initial_state(SPEC, 0), ASSIGN)
    drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGN}))
    clients = [s for s in sent if not s.client_id.startswith("@")]
    bases = [s for s in sent if s.client_id.startswith("@")]
    assert [(s.start, s.stop) for s in bases] == [(2, 5), (5, 7)]  # the edge's shared blocks, then the cloud's
    own = {(s.client_id, s.start): sorted({block_of(k) for k in s.state or {}}) for s in clients}
    assert own == {("c0", 1): [], ("c1", 2): [], ("c2", 3): [5], ("c0", 3): [], ("c1", 5): [], ("c2", 6): []}
    assert all(s.base == "@base.1" for s in clients)
    # every client's loads still say what tier_loads says, bar the weights
    for s in clients:
        (want,) = [w for w in tier_loads(rnd.cfg, s.client_id, ASSIGN[s.client_id], None) if w.start == s.start]
        assert (want.stop, want.loss_here, want.secret) == (s.stop, s.loss_here, s.secret)


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_a_handed_on_block_that_cannot_be_fetched_fails_the_round_naming_it(mode: str) -> None:
    """c0 leaves blocks 5 and 6 on the cloud; c1 trains them on the edge, so they must come through the
    coordinator, and the cloud does not answer: those blocks' training is nowhere else."""
    from splitfed.errors import Unavailable

    class Gone(_Wrapped):
        def fetch(self, *a, **k):  # type: ignore[no-untyped-def]  # noqa: ANN002, ANN003
            raise Unavailable("tier cloud: unavailable after 3 attempt(s)")

    chain = inprocess_chain(2)
    assignment = {"c0": (2, 5), "c1": (2, 7)}
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, mode), [chain.tiers[0], Gone(chain.tiers[1])],
                     initial_state(SPEC, 0), assignment)
    with pytest.raises(RoundFailed, match=r"blocks \[5, 7\) could not be fetched from the cloud, where c0 left them"):
        drive(rnd, local_trainer(chain, {c: _batches() for c in assignment}))
    assert [t.clients() for t in chain.tiers] == [0, 0]


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_clients_in_turn_copy_the_blocks_before_them_on_the_tier(mode: str) -> None:
    """With the same cuts, each client after the first loads from the replica before it: no weights travel."""
    sent: list[SegmentLoad] = []

    chain = inprocess_chain(2)
    same = {f"c{i}": (2, 5) for i in range(3)}
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, mode), [_Seen(t, sent) for t in chain.tiers], initial_state(SPEC, 0), same)
    drive(rnd, local_trainer(chain, {c: _batches() for c in same}))
    # each client's trained segments are copied there into a holder only the coordinator can reach (@held...),
    # which the next client copies: its own binding, whose secret its node has, is released at once
    assert [(s.client_id, s.base, s.state is None) for s in sent] == [
        ("c0", "", False), ("c0", "", False), ("@held.1.0", "c0", True), ("@held.1.0", "c0", True),
        ("c1", "@held.1.0", True), ("c1", "@held.1.0", True), ("@held.1.1", "c1", True), ("@held.1.1", "c1", True),
        ("c2", "@held.1.1", True), ("c2", "@held.1.1", True), ("@held.1.2", "c2", True), ("@held.1.2", "c2", True)]
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_a_tier_full_of_base_segments_gets_the_weights_with_the_loads() -> None:
    """Base segments are a saving, not a need: a tier that refuses one (its MAX_BASES taken, e.g. by a device
    on a tier without a coordinator token) gets each client's weights with its load, and the round trains (a
    first version failed every sflv1 round on that tier)."""
    chain = inprocess_chain(2)
    edge = chain.tiers[0]
    glob = initial_state(SPEC, 0)
    for i in range(MAX_BASES):
        edge.load(SegmentLoad(f"squat{i}", f"@x{i}", 1, SPEC, 1, 2, "@x", select(glob, 1, 2)))
    state = initial_state(SPEC, 0)
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), chain.tiers, state, ASSIGN)
    drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGN}))
    assert not rnd.failed and len(rnd.results) == 3
    per_client = sum(state_bytes(select(state, *server_bounds(k, 7, False)[0])) for k in ASSIGN.values())
    assert rnd.weight_bytes[0][0] == per_client  # the edge: a copy per client
    assert rnd.weight_bytes[1][0] < sum(state_bytes(select(state, *server_bounds(k, 7, False)[1]))
                                        for k in ASSIGN.values())  # the cloud took its base
    assert edge.clients() == MAX_BASES and chain.tiers[1].clients() == 0


def test_a_base_is_staged_only_where_it_sends_fewer_bytes() -> None:
    """One client, or clients far apart on a tier (the base spans the blocks between): their own weights."""
    sent: list[SegmentLoad] = []

    chain = inprocess_chain(2)
    for assignment in ({"c0": (1, 3)}, {"c0": (0, 1), "c1": (6, 7)}, {"c0": (1, 3), "c1": (1, 3)}):
        sent.clear()
        rnd = SplitRound(RoundConfig(RUN, 1, SPEC), [_Seen(t, sent) for t in chain.tiers], initial_state(SPEC, 0),
                         assignment)
        drive(rnd, local_trainer(chain, {c: _batches() for c in assignment}))
        bases = [(s.start, s.stop) for s in sent if s.client_id.startswith("@")]
        # two clients with the same cuts: one base per tier; the others: none (on the edge c0's block 0 and
        # c1's block 6 lie apart, a base would send blocks 1..5 besides; on the cloud c0 alone has blocks)
        assert bases == ([(1, 3), (3, 7)] if len(assignment) == 2 and "c1" in assignment and
                         assignment["c1"] == (1, 3) else [])
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_a_base_whose_load_reply_is_lost_is_released() -> None:
    from splitfed.errors import Unavailable

    class LostReply(_Wrapped):
        def load(self, spec: SegmentLoad) -> None:
            self.tier.load(spec)
            if spec.client_id.startswith("@"):
                raise Unavailable("tier edge: the network blinked")

    chain = inprocess_chain(2)
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), [LostReply(chain.tiers[0]), chain.tiers[1]],
                     initial_state(SPEC, 0), ASSIGN)
    with pytest.raises(Unavailable):
        drive(rnd, local_trainer(chain, {c: _batches() for c in ASSIGN}))
    assert [t.clients() for t in chain.tiers] == [0, 0]  # before: the edge kept '@base.1.0' for an hour


def test_a_large_fleet_is_averaged_a_batch_of_clients_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Reduce call averages at most REDUCE_BATCH clients, so each is within one deadline however large
    the fleet; the batches' means, made sums again, give the round the one mean would (to float32 rounding)."""
    import splitfed.engine.rounds as rounds

    calls: list[int] = []

    class Counted(_Wrapped):
        def reduce(self, run_id, items):  # type: ignore[no-untyped-def]
            calls.append(len(items))
            return self.tier.reduce(run_id, items)

    assignment = {f"c{i}": ((1, 3), (2, 5), (3, 6))[i % 3] for i in range(5)}
    data = {c: _batches(seed=i) for i, c in enumerate(assignment)}
    state = initial_state(SPEC, 0)
    ref = inprocess_chain(2)
    want = drive(SplitRound(RoundConfig(RUN, 1, SPEC, binding_key="k"), ref.tiers, state, assignment),
                 local_trainer(ref, data))
    monkeypatch.setattr(rounds, "REDUCE_BATCH", 2)
    chain = inprocess_chain(2)
    got = drive(SplitRound(RoundConfig(RUN, 1, SPEC, binding_key="k"), [Counted(t) for t in chain.tiers], state,
                           assignment), local_trainer(chain, data))
    assert calls == [2, 2, 1, 2, 2, 1]
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)


def test_aggregate_leaves_the_partials_it_is_given_as_they_were() -> None:
    from splitfed.aggregate import Partial, aggregate

    p = Partial().add({"a": torch.tensor([1.0])}, 2.0)
    first = aggregate([({"a": torch.tensor([3.0])}, 1.0)], partials=[p])
    second = aggregate([({"a": torch.tensor([3.0])}, 1.0)], partials=[p])
    assert torch.equal(p.sums["a"], torch.tensor([2.0], dtype=torch.float64))  # before: 5.0, then 8.0
    assert torch.equal(first["a"], second["a"]) and torch.allclose(first["a"], torch.tensor([5.0 / 3.0]))


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_only_a_block_that_changes_tier_travels_between_clients(mode: str) -> None:
    """cnn's weights are in blocks 0, 2, 5 and 6. c0 trains 2..5 on the edge and 6 on the cloud; c1 has block
    5 on the cloud: it alone is fetched from the edge and sent on, the rest copied from c0's replicas; c2 has
    5 on the edge again: fetched from the cloud and sent, the rest copied from c1's. At the end each tier's
    latest blocks come back once."""
    state = initial_state(SPEC, 0)

    def b(*blocks: int) -> int:
        return sum(state_bytes(select(state, i, i + 1)) for i in blocks)

    chain = inprocess_chain(2)
    assignment = {"c0": (2, 6), "c1": (2, 5), "c2": (1, 6)}
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, mode), chain.tiers, state, assignment)
    drive(rnd, local_trainer(chain, {c: _batches() for c in assignment}))
    assert rnd.weight_bytes == [[b(2, 5) + b(5), b(5) + b(2, 5)], [b(6) + b(5), b(5) + b(6)]]
    per_client = [b(2, 5) + b(2) + b(2, 5), b(6) + b(5, 6) + b(6)]  # a copy per client, each way (before)
    assert all(s < p for (s, _), p in zip(rnd.weight_bytes, per_client, strict=True)) and b(5) > 0
    assert [t.clients() for t in chain.tiers] == [0, 0]


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_a_client_whose_turn_is_over_cannot_touch_what_it_handed_on(mode: str) -> None:
    """Its node holds its secret; before, its binding stayed as the next client's source: its device could
    still step it (or write NaN into it) after the finite check. Now its segments are copied into a holder of
    the coordinator's and its binding released: a late step finds nothing."""
    from splitfed.engine.types import StepKey
    from splitfed.errors import NotFound

    chain = inprocess_chain(2)
    assignment = {"c0": (2, 5), "c1": (2, 5)}
    data = {c: _batches(seed=i) for i, c in enumerate(assignment)}
    inner = local_trainer(chain, data)
    late: list[str] = []

    def train(cfg, cuts, weights):  # type: ignore[no-untyped-def]
        if "c1" in weights:  # c0's turn is over: its device tries once more
            x = torch.randn(4, *template.boundary(SPEC, 2)[0])
            try:
                chain.tiers[0].step(StepKey(RUN, "c0", 1, 2, cfg.secret_of("c0")), x, torch.zeros(4, dtype=torch.long))
            except NotFound as e:
                late.append(str(e))
        return inner(cfg, cuts, weights)

    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, mode), chain.tiers, initial_state(SPEC, 0), assignment)
    drive(rnd, train)
    assert len(late) == 1 and "no segment loaded for client 'c0'" in late[0]
    assert not rnd.failed and [t.clients() for t in chain.tiers] == [0, 0]


def test_a_base_in_a_u_shape_step_is_refused_at_once() -> None:
    """Waiting for its lock would end in UNAVAILABLE, which a round takes for a tier that is gone."""
    from splitfed.engine.types import StepKey
    from splitfed.errors import FailedPrecondition

    tier = Tier("edge")
    glob = initial_state(SPEC, 0)
    tier.load(_load("a", 2, 4, select(glob, 2, 4), loss_here=True))
    tier.forward(StepKey(RUN, "a", 1, 0, "s-a"), torch.randn(4, *template.boundary(SPEC, 2)[0]))
    with pytest.raises(FailedPrecondition, match="waiting for its backward"):
        tier.load(_load("b", 2, 4, base="a", base_secret="s-a"))


def test_copying_a_base_keeps_it_from_the_idle_release() -> None:
    now = [0.0]
    tier = Tier("edge", idle_release_s=100, clock=lambda: now[0])
    tier.load(_load("a", 2, 4, select(initial_state(SPEC, 0), 2, 4)))
    now[0] = 90
    tier.load(_load("b", 2, 4, base="a", base_secret="s-a"))
    now[0] = 150
    assert tier.sweep() == []  # before: 'a' went, 100 s after its own load
    now[0] = 250
    assert sorted(tier.sweep()) == [(RUN, "a"), (RUN, "b")]


def test_bases_are_staged_per_run_of_shared_blocks() -> None:
    """Three clients on the edge's block 2 and one on its block 6: a base of block 2 alone, not one over blocks
    2..6 (a first version sent block 5's weights besides); block 6 goes with c3's load (staged, it would sit on
    the edge twice for nothing)."""
    sent: list[SegmentLoad] = []

    chain = inprocess_chain(2)
    assignment = {"c0": (2, 3), "c1": (2, 3), "c2": (2, 3), "c3": (6, 7)}
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), [_Seen(chain.tiers[0], sent), chain.tiers[1]], initial_state(SPEC, 0),
                     assignment)
    drive(rnd, local_trainer(chain, {c: _batches() for c in assignment}))
    assert [(s.start, s.stop) for s in sent if s.client_id.startswith("@")] == [(2, 3)]
    assert [t.clients() for t in chain.tiers] == [0, 0]


@pytest.mark.parametrize("mode", ["sflv2", "sl"])
def test_a_tier_too_full_to_hold_a_clients_segments_sends_them_back(mode: str) -> None:
    """A tier whose MAX_BASES are taken refuses the holder: that client's trained segments are fetched, as
    before, and the round gives the model it gives without the squatters."""
    assignment = {"c0": (2, 5), "c1": (2, 5), "c2": (1, 6)}
    data = {c: _batches(seed=i) for i, c in enumerate(assignment)}
    state = initial_state(SPEC, 0)
    ref = inprocess_chain(2)
    want = drive(SplitRound(RoundConfig(RUN, 1, SPEC, mode, binding_key="k"), ref.tiers, state, assignment),
                 local_trainer(ref, data))
    chain = inprocess_chain(2)
    for i in range(MAX_BASES):
        chain.tiers[0].load(SegmentLoad(f"squat{i}", f"@x{i}", 1, SPEC, 1, 2, "@x", select(state, 1, 2)))
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, mode, binding_key="k"), chain.tiers, state, assignment)
    got = drive(rnd, local_trainer(chain, data))
    assert not rnd.failed and all(torch.equal(got[k], want[k]) for k in want)
    assert chain.tiers[0].clients() == MAX_BASES and chain.tiers[1].clients() == 0


def test_a_holder_the_tier_lost_fails_the_next_turn_naming_it() -> None:
    """The edge restarts between two turns (here: the holder is gone when the next turn asks after it): the
    next client's turn says so before it trains, rather than a fetch at the end."""

    class Restarted(_Wrapped):
        def reduce(self, run_id, items):  # type: ignore[no-untyped-def]
            for it in items:
                if it.client_id.startswith("@held"):
                    self.tier.release(run_id, it.client_id, it.secret)
            return self.tier.reduce(run_id, items)

    chain = inprocess_chain(2)
    assignment = {"c0": (2, 5), "c1": (2, 5)}
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, "sflv2"), [Restarted(chain.tiers[0]), chain.tiers[1]],
                     initial_state(SPEC, 0), assignment)
    with pytest.raises(RoundFailed, match=r"the edge lost the server-side model's latest blocks \(@held\.1\.0: "
                                          r"segment is missing: tier edge: no segment loaded for client '@held\.1\.0'"):
        drive(rnd, local_trainer(chain, {c: _batches(seed=i) for i, c in enumerate(assignment)}))
    assert [t.clients() for t in chain.tiers] == [0, 0]


def test_a_released_base_frees_its_place() -> None:
    tier = Tier("edge", max_clients=1)
    part = select(initial_state(SPEC, 0), 1, 2)
    for i in range(MAX_BASES):
        tier.load(SegmentLoad(f"run{i}", "@b", 1, SPEC, 1, 2, "@b", part, secret="s"))
    tier.load(SegmentLoad("run0", "@b", 1, SPEC, 1, 2, "@b", part, secret="s"))  # a reload takes no new place
    with pytest.raises(ResourceExhausted, match="base segments"):
        tier.load(SegmentLoad("one-more", "@b", 1, SPEC, 1, 2, "@b", part, secret="s"))
    tier.release("run3", "@b", "s")
    tier.load(SegmentLoad("one-more", "@b", 1, SPEC, 1, 2, "@b", part, secret="s"))
    tier.load(SegmentLoad("run0", "c0", 1, SPEC, 1, 2, "c0", part, secret="s"))  # the client's place is its own
    assert tier.clients() == MAX_BASES + 1


def test_a_tier_gone_while_its_client_is_fetched_fails_the_round() -> None:
    """As a tier gone while a client's segments are kept there does (the review found the two apart)."""
    from splitfed.errors import Unavailable

    class FullThenGone(_Wrapped):
        def load(self, spec: SegmentLoad) -> None:
            if spec.client_id.startswith("@held"):
                raise ResourceExhausted(f"tier edge already holds {MAX_BASES} base segments")
            self.tier.load(spec)

        def fetch(self, *a, **k):  # type: ignore[no-untyped-def]  # noqa: ANN002, ANN003
            raise Unavailable("tier edge: unavailable after 3 attempt(s)")

    chain = inprocess_chain(2)
    assignment = {"c0": (2, 5), "c1": (2, 5)}
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC, "sflv2"), [FullThenGone(chain.tiers[0]), chain.tiers[1]],
                     initial_state(SPEC, 0), assignment)
    with pytest.raises(Unavailable):
        drive(rnd, local_trainer(chain, {c: _batches() for c in assignment}))
    assert [t.clients() for t in chain.tiers] == [0, 0]
