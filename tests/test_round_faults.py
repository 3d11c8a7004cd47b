"""Tier-side refusals and losses at random points of a round: the coordinator's bookkeeping holds.

Each server tier is wrapped (:class:`_Faulty`) so that the k-th ``load``, ``fetch``, ``release`` or ``reduce``
it gets in a round raises a :class:`~splitfed.errors.TierError` (RESOURCE_EXHAUSTED, NOT_FOUND, UNAVAILABLE,
INVALID_ARGUMENT, FAILED_PRECONDITION), either before the call reaches the tier or after it (the tier did it,
its reply was lost). Two such rounds run back to back, then a round without faults. After each round:

- it either returned a model or raised a :class:`RoundFailed` or :class:`TierError` (nothing else);
- every client that did not finish is in ``failed`` once, with a reason (``why`` or ``lost``);
- the model it returned is bitwise the one a round without faults, of the finished clients alone, returns;
- every segment still bound on a tier is one ``unreleased`` remembers, under the round that loaded it (the
  next round releases it with that round's secret);
- the weight bytes it counted are never negative;
- a round no fault reached finishes with every client (what earlier rounds left costs it nothing);

and after the round without faults, no tier holds anything and ``unreleased`` is empty.

By design (the module docstring of :mod:`splitfed.engine.rounds`, and ``SplitRound``'s), a round may fail as a
whole rather than drop clients: a tier that answers UNAVAILABLE to a load, fetch or holder check fails it
(``GONE``), as does a holder that cannot be checked or fetched (the server-side model's latest blocks are
nowhere else), and an sflv1 tier whose Reduce fails drops the clients of that call (every client if it says the
tier is not there: each has a segment there), so the round may fail its minimum. Those are accepted outcomes here; what is checked is that nothing leaks and nothing wrong is
averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitfed.engine import template
from splitfed.engine.rounds import (
    Batches,
    RoundConfig,
    RoundFailed,
    SplitRound,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import MODES, OptimConfig, Reduced, ReduceItem, SegmentLoad, State
from splitfed.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TierError,
    Unavailable,
)
from splitfed.models.zoo import resolve_spec

SPEC = resolve_spec("cnn", num_classes=10)  # 7 blocks; weights in blocks 0, 2, 5 and 6
N_BLOCKS = template.num_blocks(SPEC)
RUN = "faults"
KEY = "the run's binding key"  # one for the run's rounds, as ``unreleased`` needs
METHODS = ("load", "fetch", "release", "reduce")
ERRORS: tuple[type[TierError], ...] = (ResourceExhausted, NotFound, Unavailable, InvalidArgument,
                                       FailedPrecondition)
OPTIM = OptimConfig("sgd", 0.05, 0.5)


@dataclass(frozen=True)
class Fault:
    """The ``k``-th ``method`` call a round makes to tier ``tier`` (of those for client ``who``, if given)
    raises ``error`` (``sticky``: and every later one); ``after``: once the tier has done it (its reply lost on
    the way back)."""

    tier: int
    method: str
    k: int
    error: type[TierError]
    after: bool = False
    who: str | None = None
    sticky: bool = False


class _Faulty:
    """A tier whose control calls fail as the round's faults say (every other attribute is the tier's)."""

    def __init__(self, tier: Tier, index: int) -> None:
        self.tier, self.index = tier, index
        self.faults: Sequence[Fault] = ()
        self.calls: dict[tuple[str, str | None], int] = {}
        self.hit: list[Fault] = []

    def arm(self, faults: Sequence[Fault]) -> None:
        self.faults = [f for f in faults if f.tier == self.index]
        self.calls = {}
        self.hit = []

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.tier, name)

    def _call(self, method: str, who: str, do, *args):  # type: ignore[no-untyped-def]
        fault = None
        for key in ((method, None), (method, who)):
            k = self.calls.get(key, 0)
            self.calls[key] = k + 1
            fault = fault or next((f for f in self.faults if (f.method, f.who) == key
                                   and (f.k == k or f.sticky and k > f.k)), None)
        if fault is None:
            return do(*args)
        self.hit.append(fault)
        what = f"injected: {method} of {who} on tier {self.index}"
        if not fault.after:
            raise fault.error(f"{what} refused")
        do(*args)
        raise fault.error(f"{what} done, its reply lost")

    def load(self, spec: SegmentLoad) -> None:
        self._call("load", spec.client_id, self.tier.load, spec)

    def fetch(self, run_id: str, client_id: str, secret: str = "", blocks: tuple[int, int] | None = None) -> State:
        return self._call("fetch", client_id, self.tier.fetch, run_id, client_id, secret, blocks)  # type: ignore[no-any-return]

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        self._call("release", client_id, self.tier.release, run_id, client_id, secret)

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced:
        return self._call("reduce", ",".join(it.client_id for it in items), self.tier.reduce, run_id,
                          items)  # type: ignore[no-any-return]


def _data(clients: Sequence[str]) -> dict[str, Batches]:
    g = torch.Generator().manual_seed(11)
    return {c: [(torch.randn(4, *SPEC.input_shape, generator=g), torch.randint(0, 10, (4,), generator=g))
                for _ in range(2)] for c in clients}


def _cfg(mode: str, u_shape: bool, rnd: int) -> RoundConfig:
    return RoundConfig(RUN, rnd, SPEC, mode, u_shape, optim=OPTIM, seed=5, binding_key=KEY)


def _clean(mode: str, u_shape: bool, rnd: int, server_tiers: int, state: State,
           assignment: dict[str, tuple[int, ...]], data: dict[str, Batches]) -> State:
    """The round without faults, of ``assignment``'s clients alone, on fresh tiers."""
    chain = inprocess_chain(server_tiers)
    split = SplitRound(_cfg(mode, u_shape, rnd), chain.tiers, state, assignment)
    return drive(split, local_trainer(chain, data))


@dataclass
class Ran:
    """One round of :func:`_run`."""

    split: SplitRound
    state: State | None  # None: the round failed
    error: BaseException | None = None
    unreleased: dict[tuple[int, str], int] = field(default_factory=dict)  # as the round left it
    hit: list[Fault] = field(default_factory=list)  # the faults that happened


def _run(mode: str, u_shape: bool, server_tiers: int, assignment: dict[str, tuple[int, ...]],
         rounds: Sequence[Sequence[Fault]], check: bool = True) -> list[Ran]:
    """The rounds in turn, each with its faults, on one chain (the last: none); each checked as the module
    docstring says when ``check``."""
    chain = inprocess_chain(server_tiers)
    tiers = [t for t in chain.tiers if isinstance(t, Tier)]
    faulty = [_Faulty(t, i) for i, t in enumerate(tiers)]
    data = _data(list(assignment))
    state = initial_state(SPEC, 5)
    unreleased: dict[tuple[int, str], int] = {}
    ran = []
    for r, faults in enumerate(rounds, start=1):
        for f in faulty:
            f.arm(faults)
        split = SplitRound(_cfg(mode, u_shape, r), faulty, state, assignment, min_clients=1,
                           unreleased=unreleased)
        lost: dict[str, str] = {}
        try:
            new: State | None = drive(split, local_trainer(chain, data, failed=lost), lost=lost)
            one = Ran(split, new)
        except (RoundFailed, TierError) as e:  # anything else fails the test
            one = Ran(split, None, e)
        one.unreleased, one.hit = dict(unreleased), [h for f in faulty for h in f.hit]
        ran.append(one)
        if check:
            _check(mode, u_shape, server_tiers, tiers, state, assignment, data, one)
        if one.state is not None:
            state = one.state
    if check:
        assert unreleased == {}, f"after a round without faults, still unreleased: {unreleased}"
        assert [(t.clients(), t.held, len(t._replicas)) for t in tiers] == [(0, 0, 0)] * len(tiers)
    return ran


def _check(mode: str, u_shape: bool, server_tiers: int, tiers: list[Tier], before: State,
           assignment: dict[str, tuple[int, ...]], data: dict[str, Batches], out: Ran) -> None:
    split = out.split
    if not out.hit:  # what earlier rounds' faults left on the tiers costs this one nothing
        assert out.state is not None and not split.failed, (out.error, split.why)
    assert all(b >= 0 for pair in split.weight_bytes for b in pair) and min(split.device_bytes) >= 0
    assert len(split.failed) == len(set(split.failed)), f"a client failed twice: {split.failed}"
    for c in split.failed:
        assert split.why.get(c) or split.lost.get(c), f"{c} failed without a reason"
    # every binding left on a tier is one the coordinator will release, with the secret it was loaded with
    for t, tier in enumerate(tiers):
        for (run, cid), b in tier._bindings.items():
            assert run == RUN
            assert split.unreleased.get((t, cid)) == b.spec.round, \
                f"tier {t} holds {cid} of round {b.spec.round}; unreleased says {split.unreleased.get((t, cid))}"
    if out.state is None:
        return
    survivors = [c for c in assignment if c in split.done]
    assert survivors and set(survivors) | set(split.failed) == set(assignment), (survivors, split.failed)
    assert not set(survivors) & set(split.failed)
    want = _clean(mode, u_shape, split.cfg.round, server_tiers, before, {c: assignment[c] for c in survivors},
                  data)
    assert out.state.keys() == want.keys()
    diff = [k for k in want if not torch.equal(out.state[k], want[k])]
    assert not diff, f"the model is not the survivors' ({survivors}): {diff[:3]}"


# ---------------------------------------------------------------- the property


@st.composite
def plans(draw: st.DrawFn, max_tiers: int = 2, max_faults: int = 3, max_k: int = 12
          ) -> tuple[str, bool, int, dict[str, tuple[int, ...]], list[list[Fault]]]:
    mode = draw(st.sampled_from(MODES))
    u_shape = draw(st.booleans())
    server_tiers = draw(st.integers(1, max_tiers))
    width = server_tiers + (1 if u_shape else 0)
    clients = draw(st.integers(2, 5))
    assignment = {f"c{i}": tuple(sorted(draw(st.lists(st.integers(0, N_BLOCKS), min_size=width, max_size=width))))
                  for i in range(clients)}
    tier, method, error = st.integers(0, server_tiers - 1), st.sampled_from(METHODS), st.sampled_from(ERRORS)
    victim = draw(st.sampled_from(sorted(assignment)))  # one client's calls fail in both rounds: their faults meet
    fault = st.one_of(  # the k-th call of its kind in the round, or the k-th for the victim (k: 0 or 1)
        st.builds(Fault, tier, method, st.integers(0, max_k), error, st.booleans(), st.none(), st.booleans()),
        st.builds(Fault, tier, st.sampled_from(("load", "release", *METHODS)), st.integers(0, 1), error, st.booleans(),
                  st.just(victim), st.booleans()))
    rounds = [draw(st.lists(fault, min_size=1, max_size=max_faults)) for _ in range(2)]
    return mode, u_shape, server_tiers, assignment, [*rounds, []]


@settings(max_examples=50, deadline=None)
@given(plan=plans())
@example(plan=("sl", False, 1, {"c0": (0,), "c1": (0,)}, [[Fault(0, "release", 0, ResourceExhausted)],
                                                          [Fault(0, "load", 0, ResourceExhausted)], []]))
def test_tier_faults_leave_no_segment_and_no_failed_clients_weights(plan) -> None:  # type: ignore[no-untyped-def]
    mode, u_shape, server_tiers, assignment, rounds = plan
    _run(mode, u_shape, server_tiers, assignment, rounds)


# ---------------------------------------------------------------- the defect the property found, and its fix


def test_a_client_dropped_before_its_load_reaches_a_tier_keeps_the_older_binding_there_remembered() -> None:
    """Round 1's release of c0 does not reach the cloud (UNAVAILABLE): c0 stays bound there under round 1's
    secret, and ``unreleased`` says so. In round 2 the edge refuses c0's load (full), so c0's load never
    reaches the cloud, and c0 is dropped: its release there, with round 2's secret, is refused (the binding is
    round 1's). Before, that failed release overwrote the entry with round 2, so from round 3 on every load of
    c0 was refused (PERMISSION_DENIED: round 2's secret is not the binding's either) and c0 was dropped from
    every round until the cloud's idle release."""
    assignment = {"c0": (2, 5), "c1": (2, 5)}
    rounds = [[Fault(1, "release", 0, Unavailable, who="c0")], [Fault(0, "load", 0, ResourceExhausted, who="c0")],
              [], []]
    out = _run("sflv1", False, 2, assignment, rounds, check=False)
    assert [o.hit for o in out] == rounds
    assert [o.split.failed for o in out] == [[], ["c0"], [], []], [o.split.why for o in out]
    # round 1 left c0 and c1 on the cloud (not asked again that round); round 2 releases c1's binding as it
    # loads c1, and c0's as it drops c0 (with round 1's secret, once round 2's is refused)
    assert [o.unreleased for o in out] == [{(1, "c0"): 1, (1, "c1"): 1}, {}, {}, {}]
    _run("sflv1", False, 2, assignment, rounds[:2] + [[]])


def test_an_older_binding_noted_and_a_lost_load_reply_leave_the_binding_the_tier_holds_noted() -> None:
    """Round 1's release of c0 is done but its reply lost: ``unreleased`` notes a round-1 binding the edge no
    longer holds. In round 2, c0's load binds on the edge but its reply is lost (c0 is dropped), and c0's
    release there fails too: the edge holds round 2's binding, and that is the one to note (noting round 1's,
    as the noted binding that this round's load did not replace, every later load of c0 was refused). The
    code before the fix noted round 2's; a fix that only kept the older entry did not: a release refused with
    this round's secret or not done is tried with the older round's, and its refusal says which is left."""
    assignment = {"c0": (2,), "c1": (2,)}
    rounds = [[Fault(0, "release", 0, NotFound, after=True, who="c0")],
              [Fault(0, "load", 0, InvalidArgument, after=True, who="c0"),
               Fault(0, "release", 0, FailedPrecondition, who="c0")], [], []]
    out = _run("sflv1", False, 1, assignment, rounds, check=False)
    assert [o.hit for o in out] == rounds
    assert [o.split.failed for o in out] == [[], ["c0"], [], []], [o.split.why for o in out]
    _run("sflv1", False, 1, assignment, rounds[:2] + [[]])


def test_an_older_binding_noted_that_the_tier_no_longer_holds_is_forgotten_once_a_load_binds() -> None:
    """Round 1's release of c0 is done but its reply lost: ``unreleased`` notes a round-1 binding the edge no
    longer holds. Round 2 loads c0 there (nothing refuses it), then the edge answers a release UNAVAILABLE, so
    the round asks it nothing more: c0's round-2 binding is the one to note, not the stale round-1 one (a load
    under this round's secret binds only where no earlier binding is left, so it forgets the older entry)."""
    assignment = {"c0": (2,), "c1": (2,)}
    rounds = [[Fault(0, "release", 0, NotFound, after=True, who="c0")], [Fault(0, "release", 0, Unavailable)],
              [], []]
    out = _run("sflv1", False, 1, assignment, rounds, check=False)
    assert [o.hit for o in out] == rounds
    assert [o.split.failed for o in out] == [[], [], [], []], [o.split.why for o in out]
    assert [o.unreleased for o in out] == [{(0, "c0"): 1}, {(0, "@base.2.0"): 2, (0, "c0"): 2, (0, "c1"): 2}, {}, {}]
    _run("sflv1", False, 1, assignment, rounds[:2] + [[]])
