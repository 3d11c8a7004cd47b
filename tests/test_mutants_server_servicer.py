"""A tier server's servicer and lifetime (splitfed/transport/server.py, from ``TierServicer`` on): the deadline
a call passes on, the refusals a step and a load get and how long their words may be, what Describe reports
of a tier (its own and one given to ``serve_tier``), which addresses a tier checks before it serves, the
housekeeper's two timers, and how a server stops. From the mutation run of splitfed/transport/server.py:
each test fails on a mutant that the suite let through. Real tiers on 127.0.0.1, called as a client would
or with raw gRPC messages; timers are driven with short periods and waited on with generous bounds."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

import grpc
import pytest
import torch
from torch import nn

from splitfed.engine.types import Reduced, ReduceItem
from splitfed.errors import ConfigError
from splitfed.models.zoo import resolve_spec
from splitfed.transport import codec as tc
from splitfed.transport import server as server_mod
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import method, pb
from splitfed.transport.server import check_bindable, serve_tier
from tests.ray_fixtures import until
from tests.test_transport import raw_step
from tests.transport_fixtures import activation, fake_tier, labels, load_client

WAIT_S = 15.0  # a bound for a wait, never a measurement


def indefinite_whitening() -> nn.Module:
    """A user's model whose constructor factors a matrix that is not positive definite: it fails when built for
    real (a CPU Cholesky checks the values), not on the meta device, which holds no values."""
    torch.linalg.cholesky(-torch.eye(3))
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


WHITENING = f"{__name__}:indefinite_whitening"


class _Bare:
    """A tier given to ``serve_tier`` without the optional parts of :class:`Tier`: no ``holding``, no
    ``max_clients``, no ``idle_release_s``, no ``status``."""

    name = "bare"

    def __init__(self) -> None:
        self.reduced: list[int] = []

    def reduce(self, run_id: str, items: list[ReduceItem]) -> Reduced:
        self.reduced.append(len(items))
        return Reduced({"w": torch.zeros(2)}, {})


class _Sweeper:
    """A tier that only sweeps (every ``idle_release_s / 4``, at most 60 s)."""

    name = "edge"

    def __init__(self, idle_release_s: float | None) -> None:
        self.idle_release_s = idle_release_s
        self.sweeps = 0

    def sweep(self) -> list[tuple[str, str]]:
        self.sweeps += 1
        return []


class _Reporter(_Sweeper):
    """A tier that sweeps and reports its status; each status call notes how many sweeps came before it."""

    def __init__(self, idle_release_s: float | None) -> None:
        super().__init__(idle_release_s)
        self.seen: list[int] = []

    def status(self) -> str:
        self.seen.append(self.sweeps)
        return f"tier edge: status {len(self.seen)}"


def _step_frames(round_: int, seq: int) -> list[bytes]:
    h = pb.StepHeader(run_id="run", client_id="a", round=round_, seq=seq, phase=pb.PHASE_STEP)
    return wire.frames(h, [("", tc.encode(activation())), ("", tc.encode(labels()))], 1 << 20)


# ---------------------------------------------------------------- deadlines passed on


def test_the_next_tier_is_asked_within_the_callers_deadline_and_at_most_ten_seconds() -> None:
    """Describe asks the next tier with the shorter of 10 s and what is left of its own caller's deadline: a
    caller that must have its answer in 3 s does not wait 10 s on a next tier that never answers."""
    seen: list[float] = []

    def describe(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(context.time_remaining())
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not a tier")
        raise AssertionError("unreachable")

    with fake_tier({"Describe": grpc.unary_unary_rpc_method_handler(describe)}) as nxt, \
            serve_tier("edge", insecure=True, next_address=nxt, next_deadline_s=60.0) as edge:
        for timeout, most in ((30.0, 10.0), (3.0, 3.0)):
            info = _describe_raw(edge.address, timeout)
            assert info.next_error.startswith("FAILED_PRECONDITION"), info.next_error
            assert 0 < seen[-1] <= most + 0.5, (timeout, seen)  # + gRPC's rounding of a deadline on the wire


def _describe_raw(address: str, timeout: float) -> pb.TierInfo:
    with grpc.insecure_channel(address) as ch:
        raw = ch.unary_unary(method("Describe"))(pb.DescribeRequest().SerializeToString(), timeout=timeout)
    return pb.TierInfo.FromString(raw)


# ---------------------------------------------------------------- refusals of the data and control calls


def test_a_step_whose_reply_exactly_fills_one_message_runs_as_a_unary_call() -> None:
    """The float32 gradient of a 4x16x4x4 activation is 4096 bytes: a tier whose messages hold 4096 bytes sends
    it in one message (only a reply larger than that is refused toward StepStream)."""
    lim = wire.Limits(chunk_bytes=4096, unary_bytes=4096)
    with serve_tier("cloud", insecure=True, limits=lim) as srv:
        load_client(srv.tier, "a")
        h = pb.StepHeader(run_id="run", client_id="a", phase=pb.PHASE_STEP)
        frames = wire.frames(h, [("", tc.encode(activation(), "int8")), ("", tc.encode(labels()))], 4096)
        assert len(frames) == 1
        assert raw_step(srv.address, frames, unary=True) == (grpc.StatusCode.OK, "")


@pytest.mark.parametrize("round_, seq", [(0, -1), (-1, 0)])
def test_a_step_with_a_negative_round_or_seq_is_refused_naming_both(round_: int, seq: int) -> None:
    """Either one negative is refused before the tier sees the step, whatever the other is."""
    with serve_tier("cloud", insecure=True) as srv:
        load_client(srv.tier, "a")
        for unary in (True, False):
            code, details = raw_step(srv.address, _step_frames(round_, seq), unary=unary)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            assert f"round and seq must be >= 0, got {round_}, {seq}" in details
        assert srv.tier.holding()[2] == 0  # no step was served


def test_a_refusals_words_are_cut_at_2000_characters() -> None:
    """A refusal that names a 3000-character model is sent with its first 2000 characters exactly."""
    head = pb.LoadHeader(run_id="run", client_id="a", round=0, model=pb.ModelSpec(name="m" * 3000), start=2,
                         stop=7, replica="a", optim=pb.OptimConfig(name="sgd", lr=0.1), secret="s")
    with serve_tier("cloud", insecure=True) as srv, grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ch.stream_unary(method("Load"))(iter(wire.frames(head, [], 1 << 20)), timeout=20)
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert len(details) == 2000 and details.startswith("tier cloud does not serve model 'mmm"), details[:80]


def test_describe_builds_a_users_model_for_real_and_says_it_does_not_build() -> None:
    """A model not in the zoo is built for real when a Describe sizes it: one that builds on the meta device
    but not for real is reported as a load would find it, not as fine."""
    spec = resolve_spec(WHITENING, input_shape=(6,))
    with serve_tier("cloud", insecure=True, allowed_models=[WHITENING]) as srv, GrpcTierClient(srv.address) as c:
        info = c.describe(spec)
    assert info.model_error.startswith("INVALID_ARGUMENT: "), info.model_error
    assert "indefinite_whitening raised _LinAlgError" in info.model_error, info.model_error


# ---------------------------------------------------------------- what Describe reports


def test_describe_counts_the_segments_and_runs_a_tier_holds() -> None:
    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address) as c:
        assert (c.describe().segments, c.describe().runs) == (0, 0)
        load_client(srv.tier, "a")
        load_client(srv.tier, "b")
        info = c.describe()
    assert (info.segments, info.runs, info.steps_served) == (2, 1, 0)


def test_a_tier_given_to_serve_tier_without_counts_describes_none_and_takes_any_number_of_clients() -> None:
    """A tier without ``holding`` or ``max_clients`` holds nothing and has no client limit (0), as Describe
    says; a Reduce of two clients reaches it."""
    bare = _Bare()
    with serve_tier("bare", insecure=True, tier=bare) as srv, GrpcTierClient(srv.address) as c:
        info = c.describe()
        assert (info.segments, info.runs, info.steps_served, info.max_clients) == (0, 0, 0, 0)
        assert info.idle_release_s is None
        reduced = c.reduce("run", [ReduceItem("a", "s", 1.0), ReduceItem("b", "s", 2.0)])
    assert bare.reduced == [2] and set(reduced.means) == {"w"} and reduced.refused == {}


def test_a_tiers_uptime_is_the_time_since_it_started() -> None:
    before = time.monotonic()
    with serve_tier("cloud", insecure=True) as srv, GrpcTierClient(srv.address) as c:
        info = c.describe()
        assert 0.0 <= info.uptime_s <= time.monotonic() - before


# ---------------------------------------------------------------- addresses checked before serving


@pytest.mark.parametrize("error, words", [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "Name or service not known"),
    (OSError("no resolver here"), "no resolver here"),
])
def test_a_host_that_does_not_resolve_is_refused_with_the_systems_words_only(
        monkeypatch: pytest.MonkeyPatch, error: OSError, words: str) -> None:
    """The system's reason (its strerror, or the error itself when it has none), without "[Errno -2]"."""
    def getaddrinfo(*args: object, **kw: object) -> list[object]:
        raise error

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(ConfigError) as err:
        check_bindable("somehost:50051")
    assert str(err.value) == f"cannot listen on somehost:50051: {words}"


def test_a_port_whose_last_connection_waits_in_time_wait_is_served_at_once() -> None:
    """As gRPC binds (SO_REUSEADDR), so does the check: a tier restarted on its port is not refused while the
    last connection of the one before lingers in TIME_WAIT."""
    with socket.socket() as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the tier before (gRPC) listened
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        port = ls.getsockname()[1]
        cli = socket.create_connection(("127.0.0.1", port))
        conn, _ = ls.accept()
        conn.close()  # the listening side closes first: its end of the connection goes to TIME_WAIT
        assert cli.recv(1) == b""
        cli.close()
    with socket.socket() as probe:  # without SO_REUSEADDR the port is taken: the case is real
        with pytest.raises(OSError):
            probe.bind(("127.0.0.1", port))
    check_bindable(f"127.0.0.1:{port}")
    with serve_tier("edge", listen=f"127.0.0.1:{port}", insecure=True) as srv:
        assert srv.port == port


# ---------------------------------------------------------------- the housekeeper


def test_a_tier_that_only_sweeps_keeps_sweeping_without_a_failed_pass(caplog: pytest.LogCaptureFixture) -> None:
    """No status to log (the tier has none): the sweeps run on their own, and no pass fails for the lack of
    the other timer."""
    caplog.set_level("INFO", logger=server_mod.__name__)
    tier = _Sweeper(idle_release_s=0.2)  # sweeps every 0.05 s
    with serve_tier("edge", insecure=True, tier=tier, status_every_s=0.05):
        assert until(lambda: tier.sweeps >= 3, WAIT_S), "the tier was never swept"
    failed = [r.getMessage() for r in caplog.records if "housekeeping failed" in r.getMessage()]
    assert failed == []


def test_a_tier_that_never_releases_still_logs_its_status(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger=server_mod.__name__)
    tier = _Reporter(idle_release_s=None)
    with serve_tier("edge", insecure=True, tier=tier, status_every_s=0.05):
        assert until(lambda: len(tier.seen) >= 3, WAIT_S), "the status was never asked for"
    assert tier.sweeps == 0
    lines = [r.getMessage() for r in caplog.records if r.name == server_mod.__name__]
    assert "tier edge: status 1" in lines and not [x for x in lines if "housekeeping failed" in x], lines


def test_a_sweep_waits_for_its_own_period_not_the_status_ones() -> None:
    """Released segments are looked for every min(60, idle_release_s / 4) s: a tier that logs its status every
    0.05 s is not swept every 0.05 s (here the first sweep is a minute away)."""
    tier = _Reporter(idle_release_s=4000.0)
    with serve_tier("edge", insecure=True, tier=tier, status_every_s=0.05):
        assert until(lambda: len(tier.seen) >= 3, WAIT_S), "the status was never asked for"
    assert tier.sweeps == 0


def test_the_status_waits_for_its_own_period_not_the_sweeps_ones() -> None:
    tier = _Reporter(idle_release_s=0.2)
    with serve_tier("edge", insecure=True, tier=tier, status_every_s=1000.0):
        assert until(lambda: tier.sweeps >= 3, WAIT_S), "the tier was never swept"
    assert tier.seen == []


def test_a_sweep_and_a_status_of_the_same_period_both_run_on_every_pass() -> None:
    """With both every 0.05 s each pass sweeps, then asks for the status: the k-th status comes after the k-th
    sweep, neither timer skipping every other pass."""
    tier = _Reporter(idle_release_s=0.2)
    with serve_tier("edge", insecure=True, tier=tier, status_every_s=0.05):
        assert until(lambda: len(tier.seen) >= 6, WAIT_S), "the status was never asked for"
        seen = list(tier.seen)
    assert all(k <= s <= k + 1 for k, s in enumerate(seen, start=1)), seen


def test_the_status_line_says_how_many_calls_the_tier_refused(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger=server_mod.__name__)
    with serve_tier("edge", insecure=True, status_every_s=0.05) as srv, grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(method("Describe"))(b"\xff\xff", timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        def said() -> bool:
            return any(r.getMessage().startswith("tier edge: ")
                       and r.getMessage().endswith("; 1 call(s) refused (1 INVALID_ARGUMENT)")
                       for r in list(caplog.records))

        assert until(said, WAIT_S), [r.getMessage() for r in caplog.records]


def test_a_tier_left_running_does_not_keep_its_process_alive() -> None:
    """Its housekeeper is a daemon thread: a process that never stops its tier still exits."""
    with serve_tier("daemonic", insecure=True, status_every_s=30.0):
        keepers = [t for t in threading.enumerate() if t.name == "tier-daemonic-housekeeper"]
        assert len(keepers) == 1 and keepers[0].daemon


# ---------------------------------------------------------------- stopping


def test_a_stopped_tier_says_so_and_stops_once() -> None:
    srv = serve_tier("edge", insecure=True)
    assert not srv.stopped
    srv.stop(0)
    assert srv.stopped and srv.closing.is_set() and srv.wait(5.0)
    srv.stop(0)  # again: nothing left to do
    assert srv.stopped


class _GraceSpy:
    """The gRPC server of a tier, noting the grace each ``stop`` is given."""

    def __init__(self, server: grpc.Server) -> None:
        self.server = server
        self.graces: list[float | None] = []

    def stop(self, grace: float | None) -> threading.Event:
        self.graces.append(grace)
        return self.server.stop(grace)

    def __getattr__(self, name: str) -> object:
        return getattr(self.server, name)


def test_leaving_a_with_block_stops_the_tier_without_a_grace_period() -> None:
    """``with serve_tier(...)`` ends its calls at once when the block ends (``stop(0)``), not after a second."""
    with serve_tier("edge", insecure=True) as srv:
        spy = _GraceSpy(srv.server)
        srv.server = spy  # type: ignore[assignment]
    assert spy.graces == [0] and srv.stopped


def test_the_lowest_real_port_is_checked_before_grpc_tries_it() -> None:
    """Port 0 (any free port) is the only one left to gRPC: port 1, held by another process, is refused in the
    system's words, before gRPC's own bind. Needs the right to bind port 1 (root, as in the project's
    containers)."""
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", 1))
        except OSError as e:
            pytest.skip(f"cannot hold port 1 here: {e}")
        holder.listen(1)
        with pytest.raises(ConfigError) as err:
            serve_tier("edge", listen="127.0.0.1:1", insecure=True)
    assert str(err.value) == f"cannot listen on 127.0.0.1:1: {os.strerror(errno.EADDRINUSE)}"
