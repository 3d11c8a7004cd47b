"""Authorization per segment: the tier token lets a caller in, the client's binding secret says which
segment is its own. Real gRPC tiers (edge -> cloud) on 127.0.0.1 with mutual TLS and a bearer token, as
deployed: every device holds the token, so one device must not read, step, release or reload another's
segment; and a retried step must be the request that was applied, not another one under the same seq."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from splitfed.engine.rounds import (
    RoundConfig,
    SplitRound,
    initial_state,
    inprocess_chain,
    tier_loads,
)
from splitfed.engine.types import StepKey
from splitfed.errors import FailedPrecondition
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import PermissionDenied
from splitfed.transport.server import TierServer, serve_tier
from tests.transport_fixtures import SPEC, Certs, activation, certs, labels, same  # noqa: F401

TOKEN = "shared-tier-token"
RUN = "run-7f3a"
CUTS = (2, 4)  # device [0, 2), edge [2, 4), cloud [4, 7)


@pytest.fixture
def chain(certs: Certs) -> Iterator[tuple[TierServer, TierServer]]:  # noqa: F811
    with serve_tier("cloud", tls=certs.server, token=TOKEN) as cloud, \
            serve_tier("edge", next_address=cloud.address, tls=certs.server, token=TOKEN) as edge:
        yield edge, cloud


def _client(certs: Certs, address: str) -> GrpcTierClient:  # noqa: F811
    """A device's or the coordinator's connection: its own certificate of the CA, and the shared token."""
    return GrpcTierClient(address, tls=certs.client, token=TOKEN, retries=0, deadline_s=30.0)


def _round(controls: list[GrpcTierClient]) -> SplitRound:
    """The coordinator's round: it loads victim and attacker on both tiers, each with its own secret."""
    rnd = SplitRound(RoundConfig(RUN, 0, SPEC), controls, initial_state(SPEC, 0),
                     {"victim": CUTS, "attacker": CUTS})
    rnd.begin(["victim", "attacker"])
    return rnd


def _reference_step0() -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What the victim's honest step 0 gives, and its weights after it, on in-process tiers."""
    ref = inprocess_chain(2)
    for tier, load in zip(ref.tiers, tier_loads(RoundConfig(RUN, 0, SPEC), "victim", CUTS,
                                                  initial_state(SPEC, 0)), strict=True):
        tier.load(load)
    reply = ref.link.step(StepKey(RUN, "victim", 0, 0), activation(seed=0), labels())
    assert reply.grad is not None
    return reply.grad, ref.tiers[0].fetch(RUN, "victim"), ref.tiers[1].fetch(RUN, "victim")


def _denied(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(PermissionDenied) as e:
        call()
    return str(e.value)


def test_a_token_holder_cannot_touch_another_clients_segment(certs: Certs, chain) -> None:  # noqa: F811, ANN001
    """The audit's attack: a device (its own cert, the shared token) fetches, steps, reloads and releases
    another client's segment, on the edge and directly on the cloud. Each is refused with PERMISSION_DENIED,
    the victim's segments are unchanged, and its own next step gives exactly the honest result."""
    edge, cloud = chain
    coord = [_client(certs, edge.address), _client(certs, cloud.address)]
    mallory = [_client(certs, edge.address), _client(certs, cloud.address)]  # the attacking device
    try:
        rnd = _round(coord)
        before = [t.tier.fetch(RUN, "victim", rnd.cfg.secret_of("victim")) for t in (edge, cloud)]
        own = rnd.cfg.secret_of("attacker")  # what the attacker was given: its own secret, not the victim's
        loads = tier_loads(RoundConfig(RUN, 0, SPEC), "victim", CUTS, initial_state(SPEC, 1))
        for t, c in enumerate(mallory):
            for secret in ("", own):
                assert "secret" in _denied(lambda c=c, s=secret: c.fetch(RUN, "victim", s))
                msg = _denied(lambda c=c, s=secret: c.step(StepKey(RUN, "victim", 0, 0, s),
                                                            activation(seed=123, batch=4) * 50,
                                                            torch.tensor([9, 9, 9, 9])))
                assert own not in msg and rnd.cfg.secret_of("victim") not in msg  # no secret is ever echoed
                assert "another secret" in msg or "no secret" in msg
                _denied(lambda c=c, s=secret: c.release(RUN, "victim", s))
                # rebinding the victim (new weights, or the replica's as they are), or binding to its replica
                for load in (replace(loads[t], secret=secret), replace(loads[t], state=None, secret=secret),
                             replace(loads[t], client_id="attacker2", state=None, secret=secret)):
                    assert "load of client" in _denied(lambda c=c, ld=load: c.load(ld))
        # nothing changed: the victim is bound, with its weights, and its steps work
        victim = rnd.cfg.secret_of("victim")
        assert edge.tier.clients() == cloud.tier.clients() == 2  # victim and attacker, on each tier
        for t, srv in enumerate((edge, cloud)):
            assert same(srv.tier.fetch(RUN, "victim", victim), before[t])
        grad, edge_after, cloud_after = _reference_step0()
        reply = coord[0].step(StepKey(RUN, "victim", 0, 0, victim), activation(seed=0), labels())
        assert reply.grad is not None and torch.equal(reply.grad, grad)
        assert same(coord[0].fetch(RUN, "victim", victim), edge_after)
        assert same(coord[1].fetch(RUN, "victim", victim), cloud_after)
        rnd.close()  # the coordinator releases what it loaded: its secrets are the right ones
        assert edge.tier.clients() == cloud.tier.clients() == 0
    finally:
        for c in coord + mallory:
            c.close()


def test_the_attackers_step_cannot_poison_the_victims_seq(certs: Certs, chain) -> None:  # noqa: F811, ANN001
    """Before: a junk step under the victim's seq 0 was applied and cached, and the victim's real step 0 then
    silently got the attacker's gradient back. Now the junk is refused and the real step is the honest one."""
    edge, _ = chain
    coord, mallory = _client(certs, edge.address), _client(certs, edge.address)
    try:
        rnd = _round([coord, _client(certs, chain[1].address)])
        _denied(lambda: mallory.step(StepKey(RUN, "victim", 0, 0), activation(seed=123) * 50,
                                     torch.tensor([9, 9, 9, 9])))
        grad, _, _ = _reference_step0()
        real = coord.step(StepKey(RUN, "victim", 0, 0, rnd.cfg.secret_of("victim")), activation(seed=0), labels())
        assert real.grad is not None and torch.equal(real.grad, grad)
        rnd.close()
    finally:
        coord.close()
        mallory.close()


def test_a_retry_must_be_the_request_that_was_applied(certs: Certs, chain) -> None:  # noqa: F811, ANN001
    """The same seq with another payload is refused (FAILED_PRECONDITION) and changes nothing; the same seq
    with the same payload (a retry after a lost reply) still gets the cached reply, applied once."""
    edge, cloud = chain
    coord = [_client(certs, edge.address), _client(certs, cloud.address)]
    try:
        rnd = _round(coord)
        s = rnd.cfg.secret_of("victim")
        key = StepKey(RUN, "victim", 0, 0, s)
        first = coord[0].step(key, activation(seed=0), labels())
        after = [c.fetch(RUN, "victim", s) for c in coord]
        for x, y in ((activation(seed=1), labels()), (activation(seed=0), torch.tensor([3, 3, 3, 3])),
                     (activation(seed=0, batch=2), labels(2))):
            with pytest.raises(FailedPrecondition, match="applied already with another request"):
                coord[0].step(key, x, y)
        again = coord[0].step(key, activation(seed=0), labels())  # the identical retry
        assert first.grad is not None and again.grad is not None and torch.equal(first.grad, again.grad)
        assert (first.loss, first.correct) == (again.loss, again.correct)
        assert all(same(c.fetch(RUN, "victim", s), a) for c, a in zip(coord, after, strict=True))  # applied once
        nxt = coord[0].step(replace(key, seq=1), activation(seed=1), labels())  # the next step goes on
        assert nxt.grad is not None
        rnd.close()
    finally:
        for c in coord:
            c.close()


def test_a_u_shape_retry_must_be_the_request_that_was_applied(certs: Certs, chain) -> None:  # noqa: F811, ANN001
    """U-shape: a forward or backward retried under its seq with another tensor is refused; the same one is
    answered from the cache, and the step completes."""
    edge, cloud = chain
    coord = [_client(certs, edge.address), _client(certs, cloud.address)]
    try:
        rnd = SplitRound(RoundConfig(RUN, 0, SPEC, u_shape=True), coord, initial_state(SPEC, 0),
                         {"victim": (2, 4, 6)})
        rnd.begin(["victim"])
        key = StepKey(RUN, "victim", 0, 0, rnd.cfg.secret_of("victim"))
        out = coord[0].forward(key, activation(seed=0))
        with pytest.raises(FailedPrecondition, match="applied already with another request"):
            coord[0].forward(key, activation(seed=1))
        assert torch.equal(coord[0].forward(key, activation(seed=0)), out)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
        gx = coord[0].backward(key, g)
        with pytest.raises(FailedPrecondition, match="applied already with another request"):
            coord[0].backward(key, g * 2)
        again = coord[0].backward(key, g)
        assert gx is not None and again is not None and torch.equal(gx, again)
        _denied(lambda: coord[0].forward(replace(key, seq=1, secret=""), activation(seed=2)))
        rnd.close()
    finally:
        for c in coord:
            c.close()


def test_the_coordinator_gives_each_client_its_own_secret() -> None:
    """Unguessable, one per client and round, the same on every tier; only its own client gets it."""
    from splitfed.flower.records import TrainInstruction

    a = SplitRound(RoundConfig(RUN, 3, SPEC), inprocess_chain(2).tiers, initial_state(SPEC, 0), {"c0": CUTS})
    b = SplitRound(RoundConfig(RUN, 3, SPEC), inprocess_chain(2).tiers, initial_state(SPEC, 0), {"c0": CUTS})
    secrets = {a.cfg.secret_of("c0"), a.cfg.secret_of("c1"), b.cfg.secret_of("c0"),
               replace(a.cfg, round=4).secret_of("c0")}
    assert len(secrets) == 4 and all(len(s) == 32 for s in secrets)
    assert {ld.secret for ld in tier_loads(a.cfg, "c0", CUTS, None)} == {a.cfg.secret_of("c0")}
    assert a.cfg.binding_key not in repr(a.cfg) and a.cfg.secret_of("c0") not in repr(StepKey(RUN, "c0", 3, 0,
                                                                                                a.cfg.secret_of("c0")))
    ins = TrainInstruction(RUN, 3, "c0", CUTS, "sflv1", False, SPEC, a.cfg.optim, 0, "digits", "iid", 8, 1,
                           "127.0.0.1:1", secret=a.cfg.secret_of("c0"))
    assert TrainInstruction.from_record(ins.to_record()).secret == a.cfg.secret_of("c0")
    assert a.cfg.secret_of("c0") not in repr(ins)


def test_a_run_resumed_under_its_own_name_can_reload_what_its_crashed_round_left(tmp_path) -> None:  # noqa: ANN001
    """A coordinator that crashed mid-round leaves its segments on the tiers; the run resumed in its folder
    keeps its name and (from the checkpoint) its binding key, so its loads replace them. Another key cannot."""
    from splitfed.engine.tier import Tier
    from splitfed.flower import checkpoint

    checkpoint.save(tmp_path, checkpoint.Checkpoint(1, {"w": torch.ones(2)}, {}, binding_key="k" * 32))
    key = checkpoint.load(tmp_path).binding_key
    assert key == "k" * 32 and key not in repr(checkpoint.load(tmp_path))
    tier = Tier("cloud", idle_release_s=None)
    crashed = RoundConfig(RUN, 2, SPEC, binding_key=key)
    (load,) = tier_loads(crashed, "c0", (2,), initial_state(SPEC, 0))
    tier.load(load)  # round 2's load; the coordinator dies before it releases
    (again,) = tier_loads(RoundConfig(RUN, 2, SPEC, binding_key=key), "c0", (2,), initial_state(SPEC, 0))
    tier.load(again)  # the resumed run's load of round 2
    (other,) = tier_loads(RoundConfig(RUN, 2, SPEC, binding_key="x" * 32), "c0", (2,), initial_state(SPEC, 0))
    with pytest.raises(PermissionDenied, match="bound already, with another secret"):
        tier.load(other)


class _ReleaseBlinks:
    """A tier whose first release does not reach it (UNAVAILABLE), while the tier stays up."""

    def __init__(self, tier) -> None:  # noqa: ANN001
        self.tier, self.blinked = tier, False

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.tier, name)

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        if not self.blinked:
            self.blinked = True
            from splitfed.errors import Unavailable

            raise Unavailable("tier edge: the network blinked")
        self.tier.release(run_id, client_id, secret)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 1, 8, 8, generator=g), labels()) for _ in range(2)]


def test_a_segment_an_earlier_rounds_release_did_not_reach_does_not_fail_the_next_round() -> None:
    """Round 1's release of c0 did not reach the edge (UNAVAILABLE; the edge stayed up), so c0 stayed bound
    there under round 1's secret. Before, round 2's load of c0 was refused (PERMISSION_DENIED: another
    secret), which failed the whole round (a Flower run ended) until the tier's idle release, an hour on.
    The coordinator derives every round's secret: it releases the old binding with its own and loads again."""
    from splitfed.engine.rounds import Chain, drive, local_trainer

    ref = inprocess_chain(2)
    edge = _ReleaseBlinks(ref.tiers[0])
    chain = Chain([edge, ref.tiers[1]], ref.link)
    key = "k" * 32
    state = initial_state(SPEC, 0)
    unreleased: dict[tuple[int, str], int] = {}  # what the coordinator keeps across rounds
    for r in (1, 2):
        rnd = SplitRound(RoundConfig(RUN, r, SPEC, binding_key=key), chain.tiers, state, {"c0": CUTS},
                         unreleased=unreleased)
        state = drive(rnd, local_trainer(chain, {"c0": _batches()}))
        assert [res.client_id for res in rnd.results] == ["c0"] and not rnd.failed
        assert ref.tiers[1].clients() == 0  # the cloud's release reached it
        # one client: no base segment is staged (it would send as many bytes), so the release that blinks is c0's
        assert unreleased == ({(0, "c0"): 1} if r == 1 else {})
    assert edge.blinked and ref.tiers[0].clients() == 0  # round 2 released round 1's binding, then its own


def test_a_binding_the_coordinator_did_not_leave_costs_one_refused_load_not_a_release_per_round() -> None:
    """A device's claim of c0 (its own secret; a tier without --coordinator-token-file allows it) is nothing
    the coordinator left: c0 is dropped after one refused load. (A first version tried every earlier round's
    secret on it: a release call per past round, every round.)"""
    from splitfed.engine.rounds import Chain, drive, local_trainer

    ref = inprocess_chain(2)
    calls: list[str] = []

    class Counting:
        def __init__(self, tier) -> None:  # noqa: ANN001
            self.tier = tier

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self.tier, name)

        def release(self, *a, **k) -> None:  # noqa: ANN002, ANN003
            calls.append("release")
            self.tier.release(*a, **k)

    (claim, _) = tier_loads(RoundConfig(RUN, 50, SPEC, binding_key="the-device's-own"), "c0", CUTS,
                            initial_state(SPEC, 0))
    ref.tiers[0].load(claim)
    chain = Chain([Counting(ref.tiers[0]), ref.tiers[1]], ref.link)
    rnd = SplitRound(RoundConfig(RUN, 100, SPEC, binding_key="k" * 32), chain.tiers, initial_state(SPEC, 0),
                     {"c0": CUTS, "c1": CUTS}, min_clients=1)
    drive(rnd, local_trainer(chain, {c: _batches() for c in ("c0", "c1")}))
    assert rnd.failed == ["c0"] and "bound already" in rnd.why["c0"]
    assert len(calls) <= 3  # c0's drop and c1's end: no search through 99 earlier rounds


def test_a_client_a_tier_refuses_to_load_is_dropped_alone() -> None:
    """A tier that refuses one client's segments (full, here) failed the whole round; now that client is
    dropped with the reason and the others train."""
    from splitfed.engine.rounds import Chain, drive, local_trainer
    from splitfed.engine.tier import Tier

    ref = inprocess_chain(2)
    ref.tiers[1].max_clients = 2  # the cloud serves two clients
    assert isinstance(ref.tiers[1], Tier)
    chain = Chain(ref.tiers, ref.link)
    rnd = SplitRound(RoundConfig(RUN, 1, SPEC), chain.tiers, initial_state(SPEC, 0),
                     {c: CUTS for c in ("c0", "c1", "c2")}, min_clients=2)
    drive(rnd, local_trainer(chain, {c: _batches() for c in ("c0", "c1", "c2")}))
    assert sorted(res.client_id for res in rnd.results) == ["c0", "c1"] and rnd.failed == ["c2"]
    assert "could not be loaded" in rnd.why["c2"] and "already serves 2 clients" in rnd.why["c2"]
    assert [t.clients() for t in ref.tiers] == [0, 0]
