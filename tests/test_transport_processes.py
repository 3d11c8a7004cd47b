"""Tiers as real OS processes on 127.0.0.1: device (this process) -> edge -> cloud.

A transport changes no number; mutual TLS and tokens through the command line;
a tier killed mid-round gives a clear error (never a hang) and a restarted one
serves again.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator

import grpc
import pytest
import torch

from splitfed.engine.rounds import Chain, RoundConfig, initial_state, inprocess_chain, run_round
from splitfed.engine.types import OptimConfig, StepKey
from splitfed.engine.verify import verify
from splitfed.errors import NotFound, TierError, Unavailable
from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.chain import close_chain, grpc_chain
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import method, pb
from splitfed.transport.process import TierProcess
from tests.sigint_ignored import ignoring_sigint
from tests.transport_fixtures import SPEC, Certs, activation, certs, labels, load_client, same  # noqa: F401

pytestmark = pytest.mark.xdist_group("transport-processes")

CUTS = {"client0": (2, 5), "client1": (3, 6)}  # heterogeneous: 3 tiers, cuts differ per client


@pytest.fixture(scope="module")
def tiers() -> Iterator[tuple[TierProcess, TierProcess]]:
    with TierProcess.start("cloud", insecure=True) as cloud, \
            TierProcess.start("edge", next_address=cloud.address, insecure=True) as edge:
        yield edge, cloud


def _data(steps: int = 3, batch: int = 4) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    from splitfed.data import synthetic

    out = {}
    for i, cid in enumerate(CUTS):
        x, y = synthetic(SPEC, steps * batch, 7 + i).tensors
        out[cid] = [(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]) for s in range(steps)]
    return out


def _rounds(chain: Chain, mode: str, run_id: str, rounds: int = 2) -> tuple[dict, list]:
    state = initial_state(SPEC, 0)
    data = _data()
    results = []
    for r in range(rounds):
        cfg = RoundConfig(run_id, r, SPEC, mode, optim=OptimConfig(lr=0.05, momentum=0.9), seed=3)
        state, res = run_round(cfg, chain, state, dict(CUTS), data)
        results.append([(x.loss, x.correct, x.bytes_up, x.bytes_down) for x in res])
    return state, results


@pytest.mark.parametrize("mode", ["sl", "sflv1", "sflv2"])
def test_three_processes_give_exactly_the_in_process_weights(tiers: tuple[TierProcess, TierProcess],
                                                             mode: str) -> None:
    edge, cloud = tiers
    chain = grpc_chain([edge.address, cloud.address])
    try:
        remote, remote_res = _rounds(chain, mode, f"eq-{mode}")
        local, local_res = _rounds(inprocess_chain(2), mode, f"eq-{mode}")
        assert same(remote, local)  # bit for bit, not within a tolerance
        assert remote_res == local_res  # losses, accuracies and bytes on each link too
        result = verify(SPEC, list(CUTS.values()), mode=mode, chain=chain, transport="grpc", steps=2, rounds=1)
        assert result.ok and result.max_abs_diff == 0.0, result
    finally:
        close_chain(chain)


def test_u_shape_over_processes(tiers: tuple[TierProcess, TierProcess]) -> None:
    edge, cloud = tiers
    chain = grpc_chain([edge.address, cloud.address])
    try:
        result = verify(SPEC, [(2, 4, 6), (1, 3, 7)], mode="sflv1", u_shape=True, chain=chain, transport="grpc")
        assert result.ok and result.max_abs_diff == 0.0, result
    finally:
        close_chain(chain)


def test_plaintext_needs_insecure_on_the_command_line() -> None:
    with pytest.raises(RuntimeError, match="refusing to serve without TLS"):
        TierProcess.start("cloud", startup_timeout=120)


def test_mutual_tls_and_token_through_the_command_line(certs: Certs) -> None:  # noqa: F811
    with TierProcess.start("cloud", tls=certs.server, token="tok", client_tls=certs.client) as cloud:
        with GrpcTierClient(cloud.address, tls=certs.client, token="tok") as c:
            load_client(c, "a")
            assert c.step(StepKey("run", "a", 0, 0), activation(), labels()).grad is not None
        with GrpcTierClient(cloud.address, tls=certs.rogue, token="tok", retries=0) as c:
            with pytest.raises(Unavailable):
                c.fetch("run", "a")
        with GrpcTierClient(cloud.address, tls=certs.client, token="nope", retries=0) as c:
            with pytest.raises(TierError, match="invalid bearer token"):
                c.fetch("run", "a")


def test_tier_killed_mid_round_gives_a_clear_error_and_a_restart_serves_again(
        tiers: tuple[TierProcess, TierProcess]) -> None:
    _, cloud = tiers
    edge = TierProcess.start("edge2", next_address=cloud.address, insecure=True)
    address = edge.address
    many = {cid: [(x, y)] * 100 for cid, (x, y) in ((c, d[0]) for c, d in _data(1).items())}
    chain = grpc_chain([address, cloud.address], retries=3, backoff_s=0.05, deadline_s=30)
    outcome: list[BaseException | None] = []
    started = threading.Event()

    def train() -> None:
        state = initial_state(SPEC, 0)
        try:
            started.set()
            run_round(RoundConfig("kill", 0, SPEC, "sflv1"), chain, state, dict(CUTS), many)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001
            outcome.append(e)

    t = threading.Thread(target=train)
    t.start()
    started.wait()
    while chain.tiers[0].bytes_up == 0 and t.is_alive():  # type: ignore[attr-defined]
        t.join(0.05)  # let some steps through
    edge.kill()
    t.join(60)
    assert not t.is_alive(), "the device hung on a dead tier"
    (err,) = outcome
    assert isinstance(err, Unavailable), err
    assert address in str(err) and "unavailable after 4 attempt" in str(err)
    # restarted on the same port: it serves, but it has lost the round's state
    edge = TierProcess.start("edge2", listen=address, next_address=cloud.address, insecure=True)
    try:
        with pytest.raises(NotFound, match="no segment loaded"):
            chain.link.step(StepKey("kill", "client0", 0, 50), activation(), labels())
        # the round runs again from its start
        state, _ = run_round(RoundConfig("kill", 1, SPEC, "sflv1"), chain, initial_state(SPEC, 0), dict(CUTS),
                             _data(1))
        assert state.keys() == initial_state(SPEC, 0).keys()
    finally:
        edge.kill()
        close_chain(chain)


def test_tier_killed_during_a_call_ends_the_call(tiers: tuple[TierProcess, TierProcess]) -> None:
    """The request is half sent when the tier dies: the call fails at once, with no deadline to wait out."""
    lone = TierProcess.start("cloud2", insecure=True)
    with GrpcTierClient(lone.address) as c:
        load_client(c, "a")
    go_on = threading.Event()
    head = pb.StepHeader(run_id="run", client_id="a", round=0, seq=0, phase=pb.PHASE_STEP)
    frames = wire.frames(head, [("", tc.encode(activation())), ("", tc.encode(labels()))], 64)

    def requests() -> Iterator[bytes]:
        yield frames[0]
        go_on.wait(60)  # the rest never comes before the kill
        yield from frames[1:]

    with grpc.insecure_channel(lone.address) as ch:
        call = ch.stream_stream(method("StepStream"))(requests(), timeout=120)
        threading.Timer(1.0, lone.kill).start()
        with pytest.raises(grpc.RpcError) as e:
            list(call)
        go_on.set()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value


def test_a_tier_process_releases_what_a_vanished_coordinator_left() -> None:
    """A real ``splitfed tier --idle-release-s 3``: a coordinator loads a segment and vanishes (its
    process would be gone; here its channel closes). The tier releases the segment on its own and
    says so; a client that keeps stepping keeps its segment."""
    import time

    with TierProcess.start("cloud-idle", insecure=True, extra_args=["--idle-release-s", "3"]) as cloud:
        gone = GrpcTierClient(cloud.address, deadline_s=10)
        load_client(gone, "vanished", run_id="crashed")
        gone.close()
        live = GrpcTierClient(cloud.address, deadline_s=10)
        try:
            load_client(live, "alive", run_id="ongoing")
            live.step(StepKey("ongoing", "alive", 0, 0), activation(), labels())
            seq, end = 1, time.monotonic() + 30
            while "released 1 segment(s)" not in cloud.output() and time.monotonic() < end:
                live.step(StepKey("ongoing", "alive", 0, seq), activation(), labels())  # in use: kept
                seq += 1
                time.sleep(0.1)
            assert "released 1 segment(s) unused for 3 s" in cloud.output() and "crashed" in cloud.output()
            with pytest.raises(NotFound, match=r"\(released unused for 3 s\)"):
                live.fetch("crashed", "vanished")
            assert live.fetch("ongoing", "alive")  # stepped all along: still there
        finally:
            live.close()


@pytest.mark.parametrize("timeout_s, idle", [(600.0, "3600"), (7200.0, "14400")])
def test_a_runs_own_tiers_never_release_a_segment_within_a_round(timeout_s: float, idle: str) -> None:
    """A segment idles at most one round (load to fetch): the tiers a run starts keep segments at
    least twice its round timeout, and the default hour otherwise (the flag each real process starts with;
    what the flag does is the test above)."""
    from splitfed.flower.config import RunSettings
    from splitfed.sim.tiers import start_tiers
    from splitfed.transport.process import TierProcess

    started: list[list[str]] = []
    real = TierProcess.spawn

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        started.append(list(k.get("extra_args", ())))
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TierProcess, "spawn", spy)
        with start_tiers(RunSettings(tiers=2, round_timeout_s=timeout_s)) as chain:
            assert len(chain.addresses) == 1
    assert started == [["--idle-release-s", idle, "--torch-device", "cpu"]]


def test_a_runs_own_tiers_serve_its_own_model_from_its_folder_and_its_runtime_sys_path(tmp_path, monkeypatch) -> None:
    """A run of a module:factory model in the user's folder: the tiers it starts serve that model
    (--allow-model) and build it, so the chain check passes (before: 'does not serve model'). The module
    imports another made importable by changing sys.path at run time (a notebook, a script that inserts its
    folder), neither in the working directory nor on PYTHONPATH: the tier processes the run starts get this
    process's import path, so they build the model too (before: 'cannot import'). One chain for both (they
    were two tests, a tier process each)."""
    from splitfed.flower.config import RunSettings
    from splitfed.importpath import child_pythonpath
    from splitfed.sim.tiers import tier_chain

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "runtime_path_models.py").write_text(
        "import torch.nn as nn\n\ndef make_net():\n    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), "
        "nn.ReLU(), nn.Linear(16, 10))\n")
    (tmp_path / "mymodels.py").write_text("from runtime_path_models import make_net  # noqa: F401\n")
    monkeypatch.chdir(tmp_path)  # the folder of mymodels, not of runtime_path_models
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.syspath_prepend(str(lib))
    assert str(lib) in child_pythonpath().split(os.pathsep)
    with tier_chain(RunSettings(model="mymodels:make_net", tiers=2)) as chain:
        assert chain.infos[0].allowed_models == ("mymodels:make_net",)
        assert not chain.infos[0].model_error, chain.infos[0].model_error


def test_the_child_import_path_keeps_the_environments_own_entries_after_this_process_s(monkeypatch) -> None:
    """sys.path first (its '' as the working directory), then the environment's PYTHONPATH, each once."""
    from splitfed.importpath import child_pythonpath

    monkeypatch.setattr(sys, "path", ["", "/a", "/b"])
    got = child_pythonpath({"PYTHONPATH": os.pathsep.join(["/b", "", "/c"])}).split(os.pathsep)
    assert got == [os.getcwd(), "/a", "/b", "/c"]


def test_two_runs_at_once_on_the_same_tier_processes_each_get_their_own_numbers(
        tiers: tuple[TierProcess, TierProcess]) -> None:
    """Tiers are shared services: two runs (other models, both with dropout) train through the same
    edge and cloud processes at the same time, the second starting while the first steps (the tiers
    build its model mid-way). Each run's weights equal the same run alone in this process, bit for bit.
    (The narrow race on torch's generator this could meet is pinned down deterministically in
    test_concurrency.py.)"""
    from splitfed.data import synthetic
    from splitfed.models.zoo import resolve_spec

    edge, cloud = tiers
    mlp = resolve_spec("mlp")  # built on these tiers for the first time here, mid-way through run a
    x, y = synthetic(mlp, 40 * 4, 5).tensors
    runs = {
        "a": (SPEC, {"client0": (2, 5), "client1": (3, 6)},
              {cid: [d[0]] * 40 for cid, d in _data(1).items()}, OptimConfig(lr=0.05, momentum=0.9)),
        "b": (mlp, {"client0": (1, 3), "client1": (2, 4)},
              {cid: [(x[4 * s:4 * s + 4], y[4 * s:4 * s + 4]) for s in range(40)] for cid in ("client0", "client1")},
              OptimConfig(lr=0.2)),
    }

    def train(name: str, chain: Chain) -> dict[str, torch.Tensor]:
        model, cuts, data, optim = runs[name]
        state = initial_state(model, 0)
        for r in range(2):
            state, _ = run_round(RoundConfig(f"shared-{name}", r, model, "sflv1", optim=optim, seed=3), chain,
                                 state, dict(cuts), data)
        return state

    alone = {name: train(name, inprocess_chain(2)) for name in runs}
    chains = {name: grpc_chain([edge.address, cloud.address]) for name in runs}
    got: dict[str, dict[str, torch.Tensor] | BaseException] = {}
    a_stepping = threading.Event()

    def run(name: str) -> None:
        try:
            if name == "b":
                a_stepping.wait(60)
            got[name] = train(name, chains[name])
        except BaseException as e:  # noqa: BLE001 - reported below
            got[name] = e

    threads = {name: threading.Thread(target=run, args=(name,)) for name in runs}
    try:
        threads["a"].start()
        while chains["a"].tiers[0].bytes_up == 0 and threads["a"].is_alive():  # type: ignore[attr-defined]
            threads["a"].join(0.01)
        a_stepping.set()
        threads["b"].start()
        for t in threads.values():
            t.join(120)
    finally:
        for c in chains.values():
            close_chain(c)
    for name in runs:
        assert not isinstance(got[name], BaseException), got[name]
        assert same(got[name], alone[name]), name  # type: ignore[arg-type]


def test_a_tier_process_reports_its_status_when_it_changes() -> None:
    """``splitfed tier --status-every-s 1``: an operator sees what a long-lived tier holds and has served,
    a line when that changed and no line while nothing does."""
    import time

    with TierProcess.start("cloud-status", insecure=True, extra_args=["--status-every-s", "1"]) as cloud:
        c = GrpcTierClient(cloud.address, deadline_s=10)
        try:
            load_client(c, "device0", run_id="watched")
            for seq in range(3):
                c.step(StepKey("watched", "device0", 0, seq), activation(), labels())
            want = "tier cloud-status: 1 segment(s) of 1 run(s) (watched), "
            end = time.monotonic() + 30
            while "3 step(s) served" not in cloud.output() and time.monotonic() < end:
                time.sleep(0.2)
            lines = [x for x in cloud.output().splitlines() if want in x]
            assert lines and lines[-1].endswith("MiB of weights held; 3 step(s) served"), cloud.output()
            assert " INFO " in lines[-1] and "refused" not in lines[-1]
            time.sleep(2.5)  # nothing changes: nothing more is said
            assert [x for x in cloud.output().splitlines() if want in x] == lines
            with pytest.raises(TierError):  # a misbehaving client: the operator sees it counted
                c.step(StepKey("watched", "device0", 0, 3), activation().double(), labels())
            with pytest.raises(NotFound):
                c.step(StepKey("watched", "nobody", 0, 0), activation(), labels())
            end = time.monotonic() + 30
            while "refused" not in cloud.output() and time.monotonic() < end:
                time.sleep(0.2)
            assert cloud.output().splitlines()[-1].endswith(
                "3 step(s) served; 2 call(s) refused (1 INVALID_ARGUMENT, 1 NOT_FOUND)"), cloud.output()
        finally:
            c.close()


def test_a_tier_counts_callers_it_did_not_authenticate() -> None:
    """A device with the wrong token is refused UNAUTHENTICATED before any tier code runs; the operator
    sees it counted in the tier's status line."""
    import time

    with TierProcess.start("cloud-auth", insecure=True, token="right-token",
                           extra_args=["--status-every-s", "1"]) as cloud:
        for token in ("wrong-token", None):
            c = GrpcTierClient(cloud.address, deadline_s=10, token=token)
            try:
                with pytest.raises(TierError, match="bearer token"):
                    c.step(StepKey("r", "device0", 0, 0), activation(), labels())
            finally:
                c.close()
        end = time.monotonic() + 30
        while "refused" not in cloud.output() and time.monotonic() < end:
            time.sleep(0.2)
        assert cloud.output().splitlines()[-1].endswith("0 step(s) served; 2 call(s) refused (2 UNAUTHENTICATED)"), \
            cloud.output()


def test_a_terminals_ctrl_c_reaches_the_run_not_the_tiers_it_started_which_still_end_with_it(tmp_path) -> None:
    """Ctrl-C in a terminal signals the whole foreground process group. A tier killed by it left the stopping
    run retrying its releases against a dead tier (a stop took 6 s, not 3): a tier runs in a session of its
    own, and the run stops it; a run that dies anyway still takes its tiers with it (their stdin)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    # the handler writes to the descriptor: a print there, met while the main thread was still inside the
    # print of the line before (its buffer's lock held: the test reads the line as the write ends, and signals
    # at once), raised "reentrant call inside <_io.BufferedWriter name='<stdout>'>"
    script = ("import os, signal, sys, time\n"
              "from splitfed.transport.process import TierProcess\n"
              "signal.signal(signal.SIGINT, lambda *a: os.write(1, b'run: stopping\\n'))\n"
              "tier = TierProcess.start('edge', insecure=True)\n"
              "print(tier.pid, tier.address, flush=True)\n"
              # short sleeps: the kernel may hand the signal to a thread reading the tier's output, and the
              # Python handler runs only once the main thread wakes (a 600 s sleep hung the test)
              "for _ in range(6000):\n    time.sleep(0.1)\n")
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid, address = run.stdout.readline().split()  # type: ignore[union-attr]
        tier = psutil.Process(int(pid))
        os.killpg(run.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        assert run.stdout.readline().strip() == "run: stopping"  # type: ignore[union-attr]
        client = GrpcTierClient(address, deadline_s=10)
        try:
            assert client.describe().name == "edge"  # still serving the run's last calls
        finally:
            client.close()
        run.kill()  # the run dies without a word: its tier follows
        end = time.monotonic() + 30
        while tier.is_running() and tier.status() != psutil.STATUS_ZOMBIE and time.monotonic() < end:
            time.sleep(0.1)
        assert not tier.is_running() or tier.status() == psutil.STATUS_ZOMBIE
    finally:
        run.kill()
        run.wait()


def test_a_path_object_on_sys_path_does_not_stop_the_child_import_path(monkeypatch) -> None:
    """A pathlib.Path in sys.path (import reads it) made child_pythonpath's join raise TypeError, and so every
    tier process failed to start; bytes entries import skips are skipped."""
    from pathlib import Path

    from splitfed.importpath import child_pythonpath

    monkeypatch.setattr(sys, "path", ["/a", Path("/p"), b"/bytes"])
    assert child_pythonpath({}).split(os.pathsep) == ["/a", "/p"]


def test_a_tier_on_a_port_another_process_holds_says_so_in_one_line() -> None:
    """Before, gRPC's C-core log line came first and its refusal said only "Failed to bind"."""
    import socket
    import subprocess

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "splitfed.cli", "tier", "--role", "cloud", "--listen",
                            f"127.0.0.1:{port}", "--insecure"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"splitfed tier: error: cannot listen on 127.0.0.1:{port}: "
                                     "Address already in use"]


def test_a_tier_on_an_address_that_is_not_this_hosts_is_refused_before_it_starts() -> None:
    from splitfed.errors import ConfigError
    from splitfed.transport.server import check_bindable, serve_tier

    check_bindable("127.0.0.1:0")  # any free port: nothing to check
    with pytest.raises(ConfigError, match=r"cannot listen on 192\.0\.2\.1:5000: Cannot assign requested address"):
        serve_tier("cloud", "192.0.2.1:5000", insecure=True)


def test_a_tier_started_ignoring_sigint_keeps_serving_through_it_and_stops_on_sigterm() -> None:
    """A background job (``splitfed tier ... &`` in a script) starts with SIGINT ignored: the shell means the
    user's Ctrl-C for the job in the foreground. The tier put its own handler in anyway and stopped."""
    import signal
    import subprocess
    import time

    from splitfed.transport.process import READY

    tier = subprocess.Popen(ignoring_sigint([sys.executable, "-m", "splitfed.cli", "tier", "--role", "cloud",
                                             "--listen", "127.0.0.1:0", "--insecure"]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert tier.stdout is not None
        address = next(line for line in tier.stdout if line.startswith(READY))[len(READY):].split()[0]
        with GrpcTierClient(address, deadline_s=10) as client:
            assert client.health(10, wait=True)
            tier.send_signal(signal.SIGINT)
            for _ in range(3):  # a stop takes its time: ask again over a second and a half
                time.sleep(0.5)
                assert tier.poll() is None and client.describe().name == "cloud"
        tier.send_signal(signal.SIGTERM)
        assert tier.wait(60) == 0
    finally:
        tier.kill()
        tier.wait()
