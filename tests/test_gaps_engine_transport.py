"""Paths of the engine (rounds, tier, device) and the transport (codec, server, client, security) that no
other test ran: refusals a user meets, fallbacks, and the round's handling of tiers that fail in other ways
than the fault-injection property of ``test_round_faults`` happens to draw.

Tiers are real (:class:`~splitfed.engine.tier.Tier` in this process, gRPC tiers on 127.0.0.1, TLS with
certificates made here); a tier that misbehaves (a fetch reply with NaN, a release that raises what no tier
raises) is a real tier wrapped so that one control call does so, as ``test_round_faults`` does.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from torch import nn

from splitfed.engine import template
from splitfed.engine import tier as tier_mod
from splitfed.engine.device import Device
from splitfed.engine.rounds import (
    RoundConfig,
    RoundFailed,
    SplitRound,
    check_assignment,
    drive,
    initial_state,
    inprocess_chain,
    local_trainer,
    select,
    tier_loads,
)
from splitfed.engine.tier import Tier
from splitfed.engine.types import (
    BASE_PREFIX,
    OptimConfig,
    Reduced,
    ReduceItem,
    SegmentLoad,
    State,
    StepKey,
)
from splitfed.errors import (
    ConfigError,
    CutError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TierError,
    Unavailable,
)
from splitfed.models.zoo import resolve_spec
from splitfed.transport import client as client_mod
from splitfed.transport import codec as tc
from splitfed.transport import security, wire
from splitfed.transport import server as server_mod
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import SENT_BY_TIER, DeadlineExceeded, RpcFailed, TlsRefused
from splitfed.transport.pb import SERVICE, method, pb
from splitfed.transport.security import TlsConfig, TokenInterceptor
from splitfed.transport.server import TierServer, serve_tier
from tests.ray_fixtures import until
from tests.transport_fixtures import (  # noqa: F401
    Certs,
    certs,
    closed_port,
    fake_tier,
    make_ca,
    plain_server,
    tcp_server,
)

HERE = __name__  # the user models below are built from this module
SPEC = resolve_spec("cnn")  # 7 blocks; weights in blocks 0, 2, 5 and 6; boundary after block 2: 16x4x4
OPTIM = OptimConfig("sgd", 0.05)


def _act(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 16, 4, 4, generator=torch.Generator().manual_seed(seed))


def _data(clients: Sequence[str]) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(3)
    return {c: [(torch.randn(4, *SPEC.input_shape, generator=g), torch.randint(0, 10, (4,), generator=g))]
            for c in clients}


def _finite(state: State) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


# ---------------------------------------------------------------- engine/rounds.py: settings refused


def test_a_round_of_an_unknown_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(ConfigError, match=r"mode must be one of sl, sflv1, sflv2, got 'fedavg'"):
        RoundConfig("run", 0, SPEC, mode="fedavg")


def test_a_client_whose_cuts_do_not_fit_the_chain_is_named() -> None:
    """The cuts' own refusal (a CutError, still), prefixed with the client they belong to: of a fleet's
    clients, the one to fix. Before, the prefix was never added: ``check_assignment`` caught ConfigError, and
    ``validate_cuts`` raises CutError, which is not one."""
    with pytest.raises(CutError, match=r"^client c7: cut 9 is out of range: cnn has 7 blocks"):
        check_assignment(SPEC, {"c0": (2,), "c7": (9,)}, 2, False)
    chain = inprocess_chain(1)
    with pytest.raises(CutError, match=r"^client c1: 2 tiers need 1 cut\(s\), got 2: 2,5$"):
        SplitRound(RoundConfig("run", 0, SPEC), chain.tiers, initial_state(SPEC, 0), {"c0": (2,), "c1": (2, 5)})


def test_an_inprocess_chain_needs_a_server_tier_and_a_codec_pair_per_link() -> None:
    with pytest.raises(ConfigError, match=r"a chain needs at least one server tier"):
        inprocess_chain(0)
    with pytest.raises(ConfigError, match=r"2 link\(s\) need 2 codec pair\(s\), got 1"):
        inprocess_chain(2, links=[(None, None)])
    assert len(inprocess_chain(2, links=[(None, None), (None, None)]).tiers) == 2


# ---------------------------------------------------------------- engine/rounds.py: tiers that fail


class _Wrapped:
    """A real tier whose control calls go through ``hooks`` first (name -> callable taking the call's arguments:
    it raises, or returns None to let the tier answer, or (fetch) returns what to answer instead)."""

    def __init__(self, tier: Tier, **hooks: Callable[..., object]) -> None:
        self.tier, self.hooks = tier, hooks

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.tier, name)

    def _hooked(self, name: str, *args: object) -> object:
        hook = self.hooks.get(name)
        return None if hook is None else hook(*args)

    def load(self, spec: SegmentLoad) -> None:
        self._hooked("load", spec)
        self.tier.load(spec)

    def fetch(self, run_id: str, client_id: str, secret: str = "", blocks: tuple[int, int] | None = None) -> State:
        got = self.tier.fetch(run_id, client_id, secret, blocks)
        other = self._hooked("fetch", client_id, got)
        return got if other is None else other  # type: ignore[return-value]

    def release(self, run_id: str, client_id: str, secret: str = "") -> None:
        self._hooked("release", client_id)
        self.tier.release(run_id, client_id, secret)

    def reduce(self, run_id: str, items: Sequence[ReduceItem]) -> Reduced:
        self._hooked("reduce", items)
        return self.tier.reduce(run_id, items)


def _round(mode: str, tier: _Wrapped, clients: Sequence[str] = ("c0", "c1"), cut: int = 2,
           min_clients: int = 1) -> tuple[SplitRound, State | None, BaseException | None]:
    """One round of ``clients`` (each with ``cut``) through ``tier`` (one server tier); the round, its model
    (None if it failed) and what it raised."""
    chain = inprocess_chain(1)
    tier.tier = chain.tiers[0]  # type: ignore[assignment]
    split = SplitRound(RoundConfig("run", 1, SPEC, mode, optim=OPTIM, seed=1), [tier], initial_state(SPEC, 0),
                       {c: (cut,) for c in clients}, min_clients=min_clients)
    try:
        return split, drive(split, local_trainer(chain, _data(clients))), None
    except (RoundFailed, TierError) as e:
        return split, None, e


def _raise(error: BaseException, when: Callable[..., bool] = lambda *a: True) -> Callable[..., None]:
    def hook(*args: object) -> None:
        if when(*args):
            raise error
    return hook


def _holder(spec: SegmentLoad) -> bool:
    return spec.client_id.startswith(f"{BASE_PREFIX}held.")


def test_a_tier_that_is_not_there_at_a_clients_load_fails_the_round_at_once() -> None:
    """UNAVAILABLE says the tier is gone: every client would fail alike, so the round fails, not client by
    client (each dropped with the same reason, the round failing only at its minimum)."""
    tier = _Wrapped(Tier(), load=_raise(Unavailable("the edge went away"), lambda spec: spec.client_id == "c0"))
    split, state, error = _round("sflv1", tier)
    assert state is None and isinstance(error, Unavailable) and "the edge went away" in str(error)
    assert split.failed == [] and split.why == {}
    assert tier.tier.clients() == 0  # what the round had loaded (its base) is released


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_a_client_whose_segment_cannot_be_kept_nor_fetched_is_dropped_with_why(mode: str) -> None:
    """A tier refuses the holder's copy of c0's trained segment (full): its weights are fetched instead, and
    that fetch fails (NOT_FOUND): c0 is dropped, saying so; c1's copy is fetched the same way and kept."""
    tier = _Wrapped(Tier(), load=_raise(ResourceExhausted("no room for a holder"), _holder),
                    fetch=_raise(NotFound("c0's segment vanished"), lambda cid, got: cid == "c0"))
    split, state, error = _round(mode, tier)
    assert error is None and state is not None
    assert split.failed == ["c0"] and list(split.done) == ["c1"]
    assert split.why["c0"].startswith("fetch failed: ") and "c0's segment vanished" in split.why["c0"]
    assert tier.tier.clients() == 0


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_weights_a_tier_sends_back_with_nan_are_not_handed_on(mode: str) -> None:
    """The tier said c0's segment was finite (its Reduce check), then its fetch brings NaN (a corrupt reply):
    c0 is dropped and nothing of it reaches the model the round returns."""
    def corrupt(cid: str, got: State) -> State | None:
        return {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                for k, v in got.items()} if cid == "c0" else None

    tier = _Wrapped(Tier(), load=_raise(ResourceExhausted("no room for a holder"), _holder), fetch=corrupt)
    split, state, error = _round(mode, tier)
    assert error is None and state is not None
    assert split.failed == ["c0"] and "hold NaN or infinite values" in split.why["c0"]
    assert split.why["c0"].startswith("its edge weights ")
    assert _finite(state)


def test_a_holder_the_tier_cannot_be_asked_about_fails_the_round_naming_it() -> None:
    """sl: c0's trained segment is kept on the tier (a holder) for c1 to copy. Before c1 loads, the tier is
    asked whether it still holds it; a refusal of that question (not UNAVAILABLE) means the server-side model's
    latest blocks may be lost: the round fails, naming the holder and the tier's words."""
    def asked_about_holders(items: Sequence[ReduceItem]) -> bool:
        return any(it.client_id.startswith(f"{BASE_PREFIX}held.") for it in items)

    tier = _Wrapped(Tier(), reduce=_raise(FailedPrecondition("holders cannot be checked now"), asked_about_holders))
    split, state, error = _round("sl", tier)
    assert state is None and isinstance(error, RoundFailed)
    assert "the edge lost the server-side model's latest blocks" in str(error)
    assert f"({BASE_PREFIX}held.1.0: holders cannot be checked now)" in str(error)


def test_a_release_that_raises_what_no_tier_raises_does_not_mask_the_rounds_model() -> None:
    """A control link that breaks with an error of its own (not a TierError) at release: the round still
    returns its model, and remembers every release that did not reach the tier for a later round."""
    tier = _Wrapped(Tier(), release=_raise(ConnectionResetError("the socket went away")))
    split, state, error = _round("sflv1", tier)
    assert error is None and state is not None and not split.failed
    assert split.unreleased and all(r == 1 for r in split.unreleased.values())
    assert {c for _, c in split.unreleased} >= {"c0", "c1"}


# ---------------------------------------------------------------- engine/device.py


def test_device_weights_that_lack_a_block_are_refused_naming_the_keys() -> None:
    state = select(initial_state(SPEC, 0), 0, 2)
    lacking = {k: v for k, v in state.items() if not k.startswith("0.")}
    with pytest.raises(ConfigError, match=r"device weights lack \['0\.[^]]*\] for blocks \[0, 2\)"):
        Device(SPEC, inprocess_chain(1).link, run_id="run", client_id="c", round=0, cuts=(2,), state=lacking)
    Device(SPEC, inprocess_chain(1).link, run_id="run", client_id="c", round=0, cuts=(2,), state=state)


# ---------------------------------------------------------------- engine/tier.py


def _load(tier: Tier, cid: str, cuts: tuple[int, ...] = (2,), u_shape: bool = False, **change: object) -> SegmentLoad:
    cfg = RoundConfig("run", 0, SPEC, u_shape=u_shape, optim=OPTIM)
    (load,) = tier_loads(cfg, cid, cuts, initial_state(SPEC, 0))
    load = replace(load, **change)  # type: ignore[arg-type]
    tier.load(load)
    return load


def test_a_load_whose_base_is_its_own_replica_is_refused() -> None:
    tier = Tier()
    with pytest.raises(InvalidArgument, match=r"load of client 'a': replica 'R' cannot be its own base"):
        _load(tier, "a", replica="R", base="R", base_secret="s")
    assert tier.clients() == 0 and tier.held == 0


@pytest.mark.parametrize("change, error, words", [
    (lambda st: {**st, "0.0.bias": torch.zeros(8)}, InvalidArgument,
     r"state keys outside blocks \[2, 7\): \['0\.0\.bias'\]"),
    (lambda st: {k: v for k, v in st.items() if k != "2.0.bias"}, InvalidArgument,
     r"state of block 2 is partial: missing \['2\.0\.bias'\]"),
])
def test_a_load_writes_whole_blocks_of_its_segment_or_nothing(change, error, words) -> None:  # type: ignore[no-untyped-def]
    tier = Tier()
    state = select(initial_state(SPEC, 0), 2, 7)
    assert "2.0.bias" in state
    with pytest.raises(error, match=words):
        _load(tier, "a", state=change(state))
    assert tier.clients() == 0 and tier.held == 0 and not tier._replicas


def test_a_u_shape_step_waiting_for_its_backward_is_neither_fetched_nor_averaged() -> None:
    """Its segment's weights are in the middle of a step: a fetch is refused, a Reduce leaves that client out
    (saying why) and averages the others; once the backward came, both take it again."""
    tier = Tier()
    a = _load(tier, "a", (2, 5), u_shape=True, replica="A")
    _load(tier, "b", (2, 5), u_shape=True, replica="B")
    key = StepKey("run", "a", 0, 0, a.secret)
    out = tier.forward(key, _act())
    with pytest.raises(FailedPrecondition, match=r"fetch of client 'a' while its U-shape step 0 waits for its "
                                                 r"backward"):
        tier.fetch("run", "a", a.secret)
    got = tier.reduce("run", [ReduceItem("a", a.secret, 1.0), ReduceItem("b", a.secret, 1.0)])
    assert got.refused == {"a": "its U-shape step 0 waits for its backward"}
    b_state = tier.fetch("run", "b", a.secret)
    assert got.means.keys() == b_state.keys() and all(torch.equal(got.means[k], b_state[k].float()) for k in b_state)
    tier.backward(key, torch.ones_like(out))
    assert tier.fetch("run", "a", a.secret)
    assert tier.reduce("run", [ReduceItem("a", a.secret, 1.0)]).refused == {}


def test_a_u_shape_gradient_of_another_batch_than_its_forward_is_refused_and_changes_nothing() -> None:
    tier = Tier()
    a = _load(tier, "a", (2, 5), u_shape=True)
    key = StepKey("run", "a", 0, 0, a.secret)
    out = tier.forward(key, _act(4))
    assert out.shape == (4, 128)
    with pytest.raises(InvalidArgument, match=r"gradient batch 3 does not match the forward's 4"):
        tier.backward(key, torch.ones(3, 128))
    g = tier.backward(key, torch.ones(4, 128))  # the step still waits for its backward, and takes it
    assert g is not None and g.shape == (4, 16, 4, 4)


class _Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def double_mlp() -> nn.Module:
    """A model of float64 weights (its input cast to float64 first)."""
    return nn.Sequential(_Double(), nn.Linear(4, 8).double(), nn.Tanh(), nn.Linear(8, 3).double())


def test_a_mean_whose_weighted_sum_overflows_float64_is_refused() -> None:
    """Each client's float64 weights are finite (1e308), and their sum is not: the tier refuses the mean
    rather than send infinities for the coordinator to average into the model."""
    spec = resolve_spec(f"{HERE}:double_mlp", input_shape=(4,), num_classes=3)
    n = template.num_blocks(spec)
    tier = Tier()
    for cid in ("a", "b"):
        state = {k: torch.full_like(v, 1e308) for k, v in initial_state(spec, 0).items()}
        tier.load(SegmentLoad("run", cid, 0, spec, 0, n, cid, state, OPTIM, secret="s"))
    with pytest.raises(InvalidArgument, match=r"reduce: the mean of '[^']+' is not finite \(its weighted sum "
                                              r"overflows\)"):
        tier.reduce("run", [ReduceItem("a", "s", 1.0), ReduceItem("b", "s", 1.0)])
    one = tier.reduce("run", [ReduceItem("a", "s", 1.0)])
    assert one.means and all(bool(torch.all(v == 1e308)) for v in one.means.values())


def test_a_tier_remembers_why_the_last_released_segments_went_and_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GONE_KEPT`` (4096) is lowered to 2 to reach it: the oldest release is forgotten, the last two are not."""
    monkeypatch.setattr(tier_mod, "GONE_KEPT", 2)
    tier = Tier()
    for cid in ("a", "b", "c"):
        _load(tier, cid)
    for cid in ("a", "b", "c"):
        tier.release("run", cid)
    assert list(tier._gone) == [("run", "b"), ("run", "c")]
    for cid, said in (("a", False), ("b", True), ("c", True)):
        with pytest.raises(NotFound) as e:
            tier.fetch("run", cid)
        assert ("(released by its coordinator)" in str(e.value)) is said, str(e.value)


def test_a_tier_that_never_releases_and_is_not_young_says_only_that_the_segment_is_not_loaded() -> None:
    now = [0.0]
    tier = Tier("cloud", idle_release_s=None, clock=lambda: now[0])
    with pytest.raises(NotFound, match=r"\(this tier started 0 s ago"):
        tier.fetch("run", "x")
    now[0] = tier_mod.IDLE_RELEASE_S + 1.0
    with pytest.raises(NotFound) as e:
        tier.fetch("run", "x")
    assert str(e.value) == "tier cloud: no segment loaded for client 'x' in run 'run'"


class _Pausing(Tier):
    """A tier whose forward (after its segment ran) or backward (after its checks) waits at ``_onward`` while
    ``pause`` names that phase: another thread's call comes in between."""

    def __init__(self) -> None:
        super().__init__(idle_release_s=None)
        self.pause = ""
        self.inside, self.go_on = threading.Event(), threading.Event()

    def _onward(self, b):  # type: ignore[no-untyped-def]
        if self.pause and b.spec.client_id == "a":
            self.pause = ""
            self.inside.set()
            assert self.go_on.wait(10)
        return super()._onward(b)


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_segment_released_during_its_forward_lets_go_of_the_shared_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """a and b share replica R. a's U-shape forward is under way when its coordinator releases a: the forward
    is refused (NOT_FOUND, saying so), and R's lock, which a's forward held, is let go of: b steps at once
    (``SHARED_WAIT_S`` lowered to 1 s, so that a lock kept for good fails the test rather than hang it)."""
    monkeypatch.setattr(tier_mod, "SHARED_WAIT_S", 1.0)
    tier = _Pausing()
    a = _load(tier, "a", (2, 5), u_shape=True, replica="R", secret="s")
    _load(tier, "b", (2, 5), u_shape=True, replica="R", secret="s")
    tier.pause = "forward"
    t, out = _in_thread(lambda: tier.forward(StepKey("run", "a", 0, 0, a.secret), _act()))
    assert tier.inside.wait(10)
    tier.release("run", "a", "s")
    tier.go_on.set()
    t.join(10)
    assert isinstance(out.get("error"), NotFound), out
    assert "the segment of client 'a' was released during its forward 0" in str(out["error"])
    kb = StepKey("run", "b", 0, 0, "s")
    y = tier.forward(kb, _act())
    assert tier.backward(kb, torch.ones_like(y)) is not None


def test_a_second_backward_while_the_first_still_runs_is_refused_after_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two backwards of one step at once: the second waits ``SHARED_WAIT_S`` (lowered to 0.2 s) for the first,
    then is refused UNAVAILABLE, saying so; the first finishes and gives its gradient."""
    monkeypatch.setattr(tier_mod, "SHARED_WAIT_S", 0.2)
    tier = _Pausing()
    a = _load(tier, "a", (2, 5), u_shape=True)
    key = StepKey("run", "a", 0, 0, a.secret)
    out = tier.forward(key, _act())
    tier.pause = "backward"
    t, first = _in_thread(lambda: tier.backward(key, torch.ones_like(out)))
    assert tier.inside.wait(10)
    with pytest.raises(Unavailable, match=r"backward 0 of client 'a': another backward of it has run for 0s"):
        tier.backward(key, torch.ones_like(out))
    tier.go_on.set()
    t.join(10)
    assert isinstance(first.get("value"), torch.Tensor), first


# ---------------------------------------------------------------- transport/codec.py


def test_a_tensor_of_a_dtype_the_wire_has_no_code_for_is_refused_naming_the_ones_it_has() -> None:
    with pytest.raises(InvalidArgument, match=r"dtype torch\.complex64 cannot travel \(supported: .*float32"):
        tc.encode(torch.zeros(3, dtype=torch.complex64))


def test_a_payload_of_another_length_than_its_meta_says_is_refused() -> None:
    good = bytes(tc.encode(torch.arange(4, dtype=torch.float32)).payload)
    assert torch.equal(tc.decode(torch.float32, (4,), tc.NONE, good), torch.arange(4, dtype=torch.float32))
    with pytest.raises(InvalidArgument, match=r"payload is 15 bytes, expected 16"):
        tc.decode(torch.float32, (4,), tc.NONE, good[:15])


# ---------------------------------------------------------------- transport/security.py


def _record(kind: int, body: bytes) -> bytes:
    return bytes([kind, 3, 3]) + len(body).to_bytes(2, "big") + body


def _certificate_message(*ders: bytes) -> bytes:
    entries = b"".join(len(d).to_bytes(3, "big") + d for d in ders)
    body = len(entries).to_bytes(3, "big") + entries
    return bytes([11]) + len(body).to_bytes(3, "big") + body


@pytest.fixture(scope="module")
def der() -> bytes:
    return make_ca("a tier")[1].public_bytes(serialization.Encoding.DER)


def test_the_certificates_of_a_tls_first_flight_are_read_up_to_what_is_encrypted(der: bytes) -> None:
    """A Certificate message after a change_cipher_spec record is encrypted: nothing is read from it."""
    hello = bytes([2, 0, 0, 2, 3, 3])  # a (short) ServerHello: no certificate in it
    flight = _record(22, hello) + _record(22, _certificate_message(der))
    assert [c.public_bytes(serialization.Encoding.DER) for c in security._sent_certificates(flight)] == [der]
    assert security._sent_certificates(_record(20, b"\x01") + _record(22, _certificate_message(der))) == []
    assert security._sent_certificates(_record(22, hello)) == []  # no Certificate message at all


def test_a_certificate_that_does_not_parse_ends_the_list_read_from_a_flight(der: bytes) -> None:
    flight = _record(22, _certificate_message(der, b"\x30\x03not a certificate", der))
    got = security._sent_certificates(flight)
    assert [c.public_bytes(serialization.Encoding.DER) for c in got] == [der]


def test_a_certificate_file_that_cannot_be_read_gives_no_evidence(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n")
    assert security._file_certificates(tmp_path / "missing.pem") == []
    assert security._file_certificates(garbage) == []
    assert security._file_certificates(None) == []


def test_a_date_refusal_without_a_certificate_to_blame_says_the_chain_is_out_of_date(certs: Certs) -> None:  # noqa: F811
    """No certificate of the tier's flight can be read (none sent in plaintext) and the CA this side trusts is
    within its dates: the refusal says the chain is outside its dates and what to check."""
    e = ssl.SSLCertVerificationError(1, "certificate verify failed")
    e.reason, e.verify_message = "CERTIFICATE_VERIFY_FAILED", "certificate has expired"  # type: ignore[misc]
    said = security._dates_refusal(b"", certs.client, e)
    assert said == ("the tier's certificate chain is outside its validity dates (CERTIFICATE_VERIFY_FAILED: "
                    "certificate has expired): renew the tier's certificate, or check this machine's clock")


def test_a_key_file_under_a_passphrase_is_refused_saying_so(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "locked.key"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(ConfigError, match=rf"^TLS key {path} is encrypted: give the key without a passphrase$"):
        security._pem_key(path.read_bytes(), path, "TLS key")


@pytest.mark.parametrize("token, coordinator, words", [
    (None, None, "the bearer token is empty"),
    ("", "", "the bearer token is empty"),
    ("same", "same", "the coordinator token is the devices' token: every device would hold it"),
])
def test_token_checks_that_would_protect_nothing_are_refused(token, coordinator, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=words):
        TokenInterceptor(token, coordinator=coordinator)



def test_no_verdict_on_tls_when_the_files_cannot_be_used_or_nothing_listens(certs: Certs, tmp_path: Path) -> None:  # noqa: F811
    port = closed_port()  # nothing listens there: the connection is refused
    assert security.tls_refusal("127.0.0.1", port, certs.client, timeout_s=2.0) is None
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        at = listening.getsockname()[1]
        for ca in (tmp_path / "missing-ca.pem", Path(__file__)):  # not there; not a PEM file
            assert security.tls_refusal("127.0.0.1", at, TlsConfig(ca=ca), timeout_s=2.0) is None


def test_a_tls_diagnosis_out_of_time_gives_no_verdict_rather_than_fail() -> None:
    """Its time runs out once its ClientHello is sent: no verdict (before, ``settimeout`` of a negative number
    would raise ValueError out of the diagnosis of a failed call)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert security.tls_refusal("127.0.0.1", listening.getsockname()[1], TlsConfig(), timeout_s=1e-300) is None


@contextlib.contextmanager
def _tls_server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that runs ``answer`` on each connection (closed after, its errors kept in);
    its port."""
    def handle(conn: socket.socket) -> None:
        conn.settimeout(10.0)
        with conn, contextlib.suppress(OSError, ssl.SSLError):
            answer(conn)

    address, stop = tcp_server(handle)
    try:
        yield int(address.rsplit(":", 1)[1])
    finally:
        stop()


def test_a_tls_server_that_says_why_it_refuses_the_handshake_is_quoted(certs: Certs) -> None:  # noqa: F811
    """A TLS terminator (not gRPC's, which sends no alert) that requires a client certificate alerts a client
    that has none: the refusal quotes the alert."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert certs.server.cert is not None and certs.server.key is not None
    ctx.load_cert_chain(str(certs.server.cert), str(certs.server.key))
    ctx.load_verify_locations(cafile=str(certs.ca))
    ctx.verify_mode = ssl.CERT_REQUIRED

    def terminate(conn: socket.socket) -> None:
        with ctx.wrap_socket(conn, server_side=True) as s:
            s.recv(1)

    with _tls_server(terminate) as port:
        said = security.tls_refusal("127.0.0.1", port, certs.no_cert, timeout_s=5.0)
    assert said is not None and said.startswith("the tier refused the TLS handshake (") and "ALERT" in said, said


def test_a_malformed_tls_answer_that_is_no_alert_gives_no_verdict(certs: Certs) -> None:  # noqa: F811
    """A handshake record whose message does not parse: OpenSSL fails without an alert from the tier and
    without a sign of plaintext, so nothing TLS-specific can be said."""
    def garble(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(_record(22, bytes([2, 0, 0, 4, 3, 3, 0, 0])))  # a ServerHello too short to be one
        conn.recv(65536)

    with _tls_server(garble) as port:
        assert security.tls_refusal("127.0.0.1", port, certs.client, timeout_s=5.0) is None


def test_without_a_ca_the_tiers_certificate_is_not_checked_and_its_demand_for_one_is_named(certs: Certs) -> None:  # noqa: F811
    """TlsConfig() trusts gRPC's own roots: the diagnosis does not check the tier's certificate (gRPC's roots
    decide that), and a tier that requires a client certificate is named as such."""
    with serve_tier("edge", tls=certs.server, idle_release_s=None) as srv:
        said = security.tls_refusal("127.0.0.1", srv.port, TlsConfig(), timeout_s=5.0)
    assert said is not None and "it requires one (mutual TLS)" in said, said
    with serve_tier("edge", tls=certs.server_tls_only, idle_release_s=None) as srv:
        assert security.tls_refusal("127.0.0.1", srv.port, TlsConfig(), timeout_s=5.0) is None


# ---------------------------------------------------------------- transport/client.py


@pytest.mark.parametrize("kw, words", [
    ({"deadline_s": 0.0}, r"deadline_s must be a positive number of seconds, got 0\.0"),
    ({"deadline_s": float("inf")}, r"deadline_s must be a positive number of seconds, got inf"),
    ({"deadline_s": float("nan")}, r"deadline_s must be a positive number of seconds, got nan"),
    ({"insecure": True, "tls": TlsConfig()}, r"insecure=True contradicts a TLS config: choose one"),
])
def test_a_client_with_settings_that_contradict_or_cannot_work_is_refused(kw, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=words):
        GrpcTierClient("127.0.0.1:1", **kw)


@contextlib.contextmanager
def _counting_release(*answers: tuple[grpc.StatusCode, str, bool]) -> Iterator[tuple[str, list[int]]]:
    """A tier whose Release answers ``answers`` in turn (code, details, marked as the tier's own word), then
    OK; its address, and the calls it got."""
    calls: list[int] = []

    def release(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        calls.append(1)
        if len(calls) <= len(answers):
            code, details, mine = answers[len(calls) - 1]
            if mine:
                ctx.set_trailing_metadata((SENT_BY_TIER,))
            ctx.abort(code, details)
        return b""

    with fake_tier({"Release": grpc.unary_unary_rpc_method_handler(release)}) as address:
        yield address, calls


def test_a_call_whose_caller_has_no_time_left_is_not_sent() -> None:
    """A forwarding tier whose own caller's deadline passed: the call to the next tier is refused here."""
    with _counting_release() as (address, calls), GrpcTierClient(address, insecure=True) as c:
        token = client_mod.DEADLINE.set(time.monotonic() - 1.0)
        try:
            with pytest.raises(DeadlineExceeded, match=rf"^tier {address}: no time left for release of a \(the "
                                                       r"caller's deadline passed\)$"):
                c.release("run", "a")
        finally:
            client_mod.DEADLINE.reset(token)
        assert calls == []
        c.release("run", "a")
        assert calls == [1]


def test_a_call_whose_deadline_ends_before_an_attempt_is_not_sent() -> None:
    """A budget too small to be seen by the clock (1e-300 s) has ended by the time the attempt would start."""
    with _counting_release() as (address, calls), GrpcTierClient(address, deadline_s=1e-300) as c:
        with pytest.raises(DeadlineExceeded, match=rf"^tier {address}: release of a: deadline of 1e-300s exceeded$"):
            c.release("run", "a")
    assert calls == []


@pytest.mark.parametrize("mine", [True, False])
def test_a_segment_not_found_after_the_tier_was_unreachable_says_it_may_have_restarted(mine: bool) -> None:
    """NOT_FOUND after a retried UNAVAILABLE: the tier may have restarted meanwhile and lost the segment, said
    whether the tier marked its NOT_FOUND as its own word or not."""
    with _counting_release((grpc.StatusCode.UNAVAILABLE, "connection reset", False),
                           (grpc.StatusCode.NOT_FOUND, "no segment loaded for client 'a'", mine)) as (address, calls), \
            GrpcTierClient(address, backoff_s=0.01) as c:
        with pytest.raises(NotFound) as e:
            c.release("run", "a")
    assert calls == [1, 1]
    assert str(e.value) == (f"tier {address}: release of a: no segment loaded for client 'a' (the tier was "
                            "unreachable before: it may have restarted and lost this client's segment; load it "
                            "again)")


def test_a_not_found_at_the_first_attempt_is_the_tiers_answer_alone() -> None:
    with _counting_release((grpc.StatusCode.NOT_FOUND, "no segment loaded for client 'a'", True)) as (address, _), \
            GrpcTierClient(address) as c, pytest.raises(NotFound) as e:
        c.release("run", "a")
    assert str(e.value) == f"tier {address}: release of a: no segment loaded for client 'a'"


def test_a_tier_certificate_gRPCs_own_roots_do_not_trust_is_named_with_what_to_give(certs: Certs) -> None:  # noqa: F811
    """A client without a CA (gRPC's own roots) of a tier whose certificate a private CA signed: the
    diagnosis's handshake, which checks no certificate without a CA, completes; gRPC's words say which side
    refused, and the error says which CA to give."""
    with serve_tier("edge", tls=certs.server_tls_only, idle_release_s=None) as srv, \
            GrpcTierClient(srv.address, tls=TlsConfig(), retries=0, deadline_s=10.0) as c:
        with pytest.raises(TlsRefused) as e:
            c.release("run", "a")
    assert "TLS refused: this side does not trust the tier's certificate (" in str(e.value)
    assert str(e.value).endswith("): give the CA that signed it (--tls-ca / tls-ca)")


def _reply(head: object, tensors: dict[str, torch.Tensor] | None = None) -> list[bytes]:
    return wire.frames(head, [(k, tc.encode(v)) for k, v in (tensors or {}).items()], 1 << 20)  # type: ignore[arg-type]


def test_a_step_reply_that_says_it_carries_a_tensor_and_carries_none_is_refused() -> None:
    reply = _reply(pb.StepResult(has_tensor=True, loss=1.0))
    with fake_tier({"Step": grpc.unary_unary_rpc_method_handler(lambda req, ctx: reply[0])}) as address, \
            GrpcTierClient(address, retries=0) as c, pytest.raises(TierError) as e:
        c.step(StepKey("run", "a", 0, 0), _act(), torch.arange(4) % 10)
    assert str(e.value) == f"tier {address}: step 0 of a: reply carries 0 tensors"


def test_a_u_shape_forward_answered_without_a_tensor_is_refused() -> None:
    reply = _reply(pb.StepResult(has_tensor=False))
    with fake_tier({"StepStream": grpc.stream_stream_rpc_method_handler(lambda reqs, ctx: iter(reply))}) as address, \
            GrpcTierClient(address, retries=0) as c, pytest.raises(TierError) as e:
        c.forward(StepKey("run", "a", 0, 0), _act())
    assert str(e.value) == f"tier {address}: forward 0 returned no tensor"


def test_a_reduce_reply_that_refuses_one_client_twice_is_refused() -> None:
    reply = _reply(pb.ReduceResult(refused=["c0", "c0"], reasons=["gone", "gone again"]))
    with fake_tier({"Reduce": grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter(reply))}) as address, \
            GrpcTierClient(address, retries=0) as c, pytest.raises(TierError) as e:
        c.reduce("run", [ReduceItem("c0", "s", 1.0), ReduceItem("c1", "s", 1.0)])
    assert str(e.value) == f"tier {address}: reduce of 2 client(s): malformed reply: a refused client is named twice"


def test_a_describe_that_fails_otherwise_than_unimplemented_is_not_blamed_on_versions() -> None:
    def fail(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        ctx.abort(grpc.StatusCode.INTERNAL, "the tier broke")

    with fake_tier({"Describe": grpc.unary_unary_rpc_method_handler(fail)}) as address, \
            GrpcTierClient(address, retries=0) as c, pytest.raises(RpcFailed) as e:
        c.describe()
    assert e.value.code == "INTERNAL" and "the tier broke" in str(e.value)
    assert "older than" not in str(e.value)


@contextlib.contextmanager
def _health_only(status: int) -> Iterator[int]:
    """A gRPC server on 127.0.0.1 whose health service reports ``status`` for the tier's service; its port."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    hs.set(SERVICE, status)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(0)


def test_a_tier_that_reports_it_is_not_serving_fails_its_health_check_saying_so() -> None:
    with _health_only(health_pb2.HealthCheckResponse.NOT_SERVING) as port, \
            GrpcTierClient(f"127.0.0.1:{port}") as c:
        assert c.health(5.0) is False
        failure = c.health_failure()
    assert isinstance(failure, Unavailable)
    assert str(failure) == f"tier 127.0.0.1:{port}: health check: unavailable after 1 attempt(s): serving status 2"


def test_a_passed_health_check_leaves_no_failure_to_tell(plain_server: TierServer) -> None:  # noqa: F811
    with GrpcTierClient(plain_server.address) as c:
        assert c.health(5.0, wait=True) is True
        assert c.health_failure() is None


def test_another_address_of_a_name_is_asked_only_for_what_it_would_add() -> None:
    """gRPC reported a name's last address only: another address of it that answers and is healthy adds
    nothing (None); one that answers NOT_SERVING is the verdict."""
    with serve_tier("edge", insecure=True, idle_release_s=None) as srv, GrpcTierClient(srv.address) as c:
        assert c._answer_of_another_address("localhost", srv.port, 5.0) is None
    with _health_only(health_pb2.HealthCheckResponse.NOT_SERVING) as port, GrpcTierClient(f"127.0.0.1:{port}") as c:
        got = c._answer_of_another_address("localhost", port, 5.0)
    assert got == (f"127.0.0.1:{port}", "127.0.0.1", grpc.StatusCode.UNAVAILABLE, "serving status 2")


# ---------------------------------------------------------------- transport/server.py


@pytest.mark.parametrize("kw, words", [
    ({"stream_idle_s": 0.0}, r"stream_idle_s must be a positive number of seconds or None, got 0\.0"),
    ({"stream_idle_s": float("inf")}, r"stream_idle_s must be a positive number of seconds or None, got inf"),
    ({"stream_min_bytes_s": -1.0}, r"stream_min_bytes_s must be a number of bytes per second >= 0, got -1\.0"),
    ({"stream_min_bytes_s": float("nan")}, r"stream_min_bytes_s must be a number of bytes per second >= 0, got nan"),
])
def test_a_tier_with_stream_bounds_that_cannot_work_is_refused_before_it_serves(kw, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=words):
        serve_tier("edge", insecure=True, **kw)


def test_a_tier_that_never_cancels_idle_streams_still_serves_them() -> None:
    """``stream_idle_s=None``: request and reply streams pass through unwatched (a load, a U-shape forward and
    backward, a fetch), and nothing is ever cancelled."""
    with serve_tier("cloud", insecure=True, stream_idle_s=None, idle_release_s=None) as srv, \
            GrpcTierClient(srv.address) as c:
        load = _load(c, "a", (2, 5), u_shape=True)  # type: ignore[arg-type]
        key = StepKey("run", "a", 0, 0, load.secret)
        out = c.forward(key, _act())
        assert c.backward(key, torch.ones_like(out)) is not None
        assert set(c.fetch("run", "a", load.secret)) == set(select(initial_state(SPEC, 0), 2, 5))
        assert srv.servicer is not None and srv.servicer.idle_streams.cancelled == 0


class _Context:
    """A servicer context as the idle-stream watcher sees one: a call whose caller went away (``active``
    False), one whose state cannot be read any more (``broken``), or a live one of a gRPC without the internal
    call object the watcher cancels with a status of its own (it has ``cancel`` only). gRPC cannot be made to
    do these on cue: the first two are races of a call ending as it is cancelled, the last another version."""

    def __init__(self, active: bool = True, broken: bool = False) -> None:
        self.active, self.broken, self.cancelled = active, broken, 0

    def is_active(self) -> bool:
        if self.broken:
            raise RuntimeError("the call is gone")
        return self.active

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5"

    def cancel(self) -> None:
        self.cancelled += 1


@pytest.mark.parametrize("context, cancelled", [
    (_Context(active=False), 0), (_Context(broken=True), 0), (_Context(), 1),
])
def test_a_stalled_stream_is_cancelled_only_while_its_call_is_live(context: _Context, cancelled: int) -> None:
    streams = server_mod._IdleStreams(1.0, tier="edge")
    refused: list[grpc.StatusCode] = []
    streams.on_cancel = refused.append
    now = time.monotonic()
    streams._cancel(server_mod._Watched(context, "Fetch reply", 0.0, now - 2.0, now - 2.0), now)  # type: ignore[arg-type]
    assert (streams.cancelled, context.cancelled) == (cancelled, cancelled)
    assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * cancelled


def _raw_load(address: str, head: pb.LoadHeader, tensors: list[tuple[str, torch.Tensor]]) -> grpc.RpcError:
    """What a tier answers a Load of ``head`` and ``tensors`` sent as they are (no client checks them)."""
    frames = wire.frames(head, [(k, tc.encode(v)) for k, v in tensors], 1 << 20)
    with grpc.insecure_channel(address) as channel:
        try:
            channel.stream_unary(method("Load"))(iter(frames), timeout=20)
        except grpc.RpcError as e:
            return e
    raise AssertionError("the tier took the load")


@pytest.mark.parametrize("change, tensors, words", [
    ({"optim": pb.OptimConfig(name="rmsprop", lr=0.1)}, "state",
     "load: optimizer must be sgd or adam, got 'rmsprop'"),
    ({"optim": pb.OptimConfig(name="sgd", lr=0.0)}, "state", "load: learning rate must be a finite number > 0"),
    ({}, "twice", "load: state tensors need distinct, non-empty names"),
    ({}, "unnamed", "load: state tensors need distinct, non-empty names"),
    ({"has_state": False}, "state", "load: tensors sent but has_state is false"),
])
def test_a_load_the_client_would_not_send_is_refused_naming_what_is_wrong(
        plain_server: TierServer, change: dict[str, object], tensors: str, words: str) -> None:  # noqa: F811
    state = select(initial_state(SPEC, 0), 2, 7)
    head = pb.LoadHeader(run_id="run", client_id="a", round=0, model=wire.model_pb(SPEC), start=2, stop=7,
                         replica="a", optim=pb.OptimConfig(name="sgd", lr=0.1), has_state=True, secret="s",
                         loss_here=True)
    for k, v in change.items():
        if isinstance(v, pb.OptimConfig):
            head.optim.CopyFrom(v)
        else:
            setattr(head, k, v)
    items = sorted(state.items())
    sent = {"state": items, "twice": [items[0], items[0]], "unnamed": [("", items[0][1])]}[tensors]
    e = _raw_load(plain_server.address, head, sent)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and words in (e.details() or ""), e
    assert plain_server.tier.clients() == 0


def test_a_tier_with_no_refusals_has_none_to_report(plain_server: TierServer) -> None:  # noqa: F811
    assert plain_server.servicer is not None and plain_server.servicer.refusals() == ""
    with GrpcTierClient(plain_server.address) as c, pytest.raises(NotFound):
        c.fetch("run", "nobody")
    assert plain_server.servicer.refusals() == "1 call(s) refused (1 NOT_FOUND)"


@pytest.mark.parametrize("listen", ["no-such-host.invalid:50051", "192.0.2.1:0"])
def test_an_address_this_host_cannot_serve_on_is_refused_in_one_line(listen: str) -> None:
    """A name that does not resolve (checked before gRPC binds), and an address of another machine with port
    0 (no port to check first: gRPC's own refusal, said as the same one line)."""
    with pytest.raises(ConfigError, match=rf"^cannot listen on {listen}: \S"):
        serve_tier("edge", listen=listen, insecure=True)


class _FlakySweep(Tier):
    """A tier whose first sweep fails (a bug of a tier given to ``serve_tier``): housekeeping must go on."""

    def __init__(self) -> None:
        super().__init__("edge", idle_release_s=0.4)
        self.sweeps = 0

    def sweep(self) -> list[tuple[str, str]]:
        self.sweeps += 1
        if self.sweeps == 1:
            raise RuntimeError("the first sweep fails")
        return super().sweep()


def test_the_housekeeper_releases_idle_segments_and_logs_each_new_status_once(caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    """Every idle_release_s / 4 the tier sweeps, every status_every_s it logs its status when it changed; a
    pass that fails is logged and the next one runs."""
    caplog.set_level("INFO", logger=server_mod.__name__)
    tier = _FlakySweep()
    with serve_tier("edge", insecure=True, tier=tier, status_every_s=0.05) as srv, GrpcTierClient(srv.address) as c:
        _load(c, "a")  # type: ignore[arg-type]
        assert until(lambda: tier.clients() == 0 and tier.sweeps >= 3, 30.0), "the idle segment was never released"
        time.sleep(0.2)  # a few more passes: an idle tier's status does not change
        lines = [r.getMessage() for r in caplog.records if r.name == server_mod.__name__]
    assert "tier edge: housekeeping failed" in lines
    statuses = [line for line in lines if line.startswith("tier edge: ") and "segment(s)" in line]
    assert statuses and all(a != b for a, b in zip(statuses, statuses[1:], strict=False)), statuses
    assert statuses[-1].startswith("tier edge: 0 segment(s) of 0 run(s)"), statuses


def test_waiting_for_a_tier_says_whether_it_stopped(plain_server: TierServer) -> None:  # noqa: F811
    """As ``threading.Event.wait`` does. Before, it passed on gRPC's ``wait_for_termination``, which says the
    opposite (whether the timeout passed): True for a tier still serving."""
    assert plain_server.wait(0.05) is False
    plain_server.stop(0)
    assert plain_server.wait(5.0) is True
