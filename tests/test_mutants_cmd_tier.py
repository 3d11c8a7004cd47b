"""What ``splitfed tier`` promises that the mutation run of ``splitfed/commands/tier.py`` found unpinned.

The other tests start the command as a child process (``TierProcess``, ``local_chain``); these run it in
process, in pytest's main thread (its signal handlers need it), with a thread beside it that asks the tier
what it is and then stops it (SIGTERM, or the end of stdin with ``--exit-with-stdin``).

Its help starts with the module's first line; ``--listen`` is required; ``--max-model-mb`` and
``--max-sample-mb`` take 1 and refuse 0, ``--max-held-mb`` takes 0; a ``--deadline`` of 0 is refused and one
under a second taken; only one of ``--tls-cert`` / ``--tls-key`` is refused as such; ``--max-tensor-mb`` takes
up to what one call's frames carry (65536 MiB) and refuses one more. A tier without flags serves as ``cloud``
with a deadline of 60 s, 32 workers, 512 MiB tensors in 1 GiB calls, the build limits' defaults, the idle,
status and stream defaults (128 kbit/s: 16 000 bytes/s), glibc's malloc left alone with ``--no-malloc-tuning``
and torch's threads unset; each flag reaches the tier as given (MiB as MiB, kbit/s as bytes/s, 0: never), a
call may carry twice the largest tensor (and at least 1 GiB). It prints ``listening on ADDRESS (computing on
cpu)`` and flushes it, takes SIGTERM and SIGINT (but a SIGINT that was ignored stays ignored), reads stdin only
with ``--exit-with-stdin`` (on a daemon thread), serves until stopped, gives in-flight calls 2 s and returns 0.
"""

from __future__ import annotations

import ctypes
import io
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from splitfed import cli
from splitfed.engine.limits import (
    DEFAULT_LIMITS,
    IDLE_RELEASE_S,
    STREAM_IDLE_S,
    STREAM_MIN_BYTES_S,
    BuildLimits,
    current_limits,
    set_limits,
)
from splitfed.ports import READY

BASE = ["tier", "--insecure", "--listen", "127.0.0.1:0"]


class _Unhandled(Exception):
    """Raised by the SIGTERM handler the test leaves in place: the tier did not take the signal."""


class _StillServing(Exception):
    """Raised in the main thread when the tier serves on 10 s after it was told to stop."""


class _NotServed(Exception):
    """Raised instead of serving, once the arguments to ``serve_tier`` are seen."""


def _unhandled(*_: object) -> None:
    raise _Unhandled("SIGTERM reached the test's handler: the tier installed none")


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[Any]]]:
    """What ``run`` changes for the whole process, put back; glibc's malloc and torch's threads are spied on,
    never changed."""
    import torch

    import splitfed.transport.memory as memory

    calls: dict[str, list[Any]] = {"malloc": [], "threads": []}
    monkeypatch.setattr(memory, "keep_freed_memory", lambda *a, **k: calls["malloc"].append(a) or True)
    monkeypatch.setattr(torch, "set_num_threads", calls["threads"].append)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    root, sf = logging.getLogger(), logging.getLogger("splitfed")
    saved = (list(root.handlers), root.level, sf.level, current_limits())
    try:
        yield calls
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        sf.setLevel(saved[2])
        set_limits(saved[3])


def _not_serving(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``serve_tier`` replaced by a spy that records its arguments and raises :class:`_NotServed`."""
    import splitfed.transport.server as server

    seen: dict[str, Any] = {}

    def spy(name: str, listen: str, next_address: str | None, **kw: Any) -> None:
        seen.update(kw, name=name, listen=listen, next_address=next_address, build=current_limits())
        raise _NotServed

    monkeypatch.setattr(server, "serve_tier", spy)
    return seen


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], want: str) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"splitfed tier: error: {want}\n"


# ---------------------------------------------------------------- the command line

def test_the_help_describes_the_command_with_the_modules_first_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["tier", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "splitfed tier: serve one tier (edge or cloud) of the chain over gRPC until stopped." in out
    assert "Prints listening on" not in out  # the docstring's second paragraph is not the help's


def test_listen_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own refusal (exit 2), not a traceback from an address of None."""
    with pytest.raises(SystemExit) as e:
        cli.main(["tier", "--insecure"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "the following arguments are required: --listen" in err


@pytest.mark.parametrize("flag", ["--max-model-mb", "--max-sample-mb"])
def test_build_limits_take_1_mib_and_refuse_0(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([*BASE, flag, "0"])
    assert e.value.code == 2
    assert f"argument {flag}: expected an integer in 1..1,099,511,627,776, got 0" in capsys.readouterr().err
    args = cli.build_parser().parse_args([*BASE, flag, "1"])
    assert getattr(args, flag[2:].replace("-", "_")) == 1


def test_max_held_mb_takes_0(capsys: pytest.CaptureFixture[str]) -> None:
    """0 is its documented "three quarters of the device's memory", not a refused value."""
    with pytest.raises(SystemExit):
        cli.main([*BASE, "--max-held-mb", "-1"])
    assert "argument --max-held-mb: expected an integer in 0..1,099,511,627,776, got -1" in capsys.readouterr().err
    assert cli.build_parser().parse_args([*BASE, "--max-held-mb", "0"]).max_held_mb == 0


def test_a_deadline_of_0_is_refused_and_one_under_a_second_taken(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, restored: dict[str, list[Any]]) -> None:
    seen = _not_serving(monkeypatch)
    _refused(capsys, [*BASE, "--deadline", "0"], "--deadline must be a positive, finite number of seconds, got 0.0")
    assert seen == {}
    with pytest.raises(_NotServed):
        cli.main([*BASE, "--deadline", "0.5", "--no-malloc-tuning"])
    assert seen["next_deadline_s"] == 0.5


@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key"])
def test_one_of_cert_and_key_is_refused_as_such(flag: str, capsys: pytest.CaptureFixture[str],
                                                tmp_path: Any) -> None:
    """Named as the missing half, not as whatever reading a certificate without its key says."""
    missing = str(tmp_path / "missing.pem")
    _refused(capsys, ["tier", "--listen", "127.0.0.1:0", flag, missing],
             "TLS needs --tls-cert and --tls-key (--tls-ca adds mutual TLS)")


def test_max_tensor_mb_is_at_most_what_one_calls_frames_carry(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, restored: dict[str, list[Any]]) -> None:
    """65536 frames of 1 MiB: 65536 MiB is taken (a call then carries up to twice that), 65537 refused."""
    seen = _not_serving(monkeypatch)
    _refused(capsys, [*BASE, "--max-tensor-mb", "65537"],
             "--max-tensor-mb must be at most 65536 (MiB: what one call's messages carry), got 65537")
    assert seen == {}
    with pytest.raises(_NotServed):
        cli.main([*BASE, "--max-tensor-mb", "65536", "--no-malloc-tuning"])
    assert (seen["limits"].max_tensor_bytes, seen["limits"].max_call_bytes) == (64 << 30, 128 << 30)


def test_a_call_carries_at_least_1_gib_whatever_the_largest_tensor(
        monkeypatch: pytest.MonkeyPatch, restored: dict[str, list[Any]]) -> None:
    seen = _not_serving(monkeypatch)
    with pytest.raises(_NotServed):
        cli.main([*BASE, "--max-tensor-mb", "1", "--no-malloc-tuning"])
    assert (seen["limits"].max_tensor_bytes, seen["limits"].max_call_bytes) == (1 << 20, 1 << 30)


# ---------------------------------------------------------------- serving, in process

class _Stdout(io.TextIOBase):
    """Where ``print`` writes: what was written, and what was flushed (what a parent reading a pipe sees)."""

    def __init__(self) -> None:
        self.pending, self.flushed = "", ""
        self.written, self.ready = threading.Event(), threading.Event()

    def write(self, s: str) -> int:
        self.pending += s
        if READY in self.pending:
            self.written.set()
        return len(s)

    def flush(self) -> None:
        self.flushed, self.pending = self.flushed + self.pending, ""
        if READY in self.flushed:
            self.ready.set()


class _Stdin:
    """A stdin that says when it is read and ends (EOF) when told to."""

    def __init__(self) -> None:
        self.read_by: list[threading.Thread] = []
        self.eof = threading.Event()
        self.buffer = self

    def read(self, *_: object) -> bytes:
        self.read_by.append(threading.current_thread())
        self.eof.wait()
        return b""


@dataclass
class Served:
    rc: Any = None
    kw: dict[str, Any] = field(default_factory=dict)
    info: Any = None
    error: BaseException | None = None
    flushed: str = ""
    ready_flushed: bool = False
    build: BuildLimits | None = None
    sigterm: Any = None
    sigint: Any = None
    stdin_daemon: list[bool] = field(default_factory=list)
    stopped_by_signal: bool = False
    grace: list[Any] = field(default_factory=list)


def _serve(monkeypatch: pytest.MonkeyPatch, *flags: str, end_stdin: bool = False,
           unasked_s: float = 0.0) -> tuple[Served, _Stdin]:
    """Run ``splitfed tier --insecure --listen 127.0.0.1:0 FLAGS`` in this (main) thread until a thread beside
    it has described the tier, waited ``unasked_s`` and stopped it: by ending stdin when ``end_stdin``, else by
    SIGTERM."""
    import splitfed.transport.server as server
    from splitfed.transport.client import GrpcTierClient

    got = Served()
    real = server.serve_tier

    def spy(name: str, listen: str, next_address: str | None, **kw: Any) -> Any:
        got.kw = dict(kw, name=name, listen=listen, next_address=next_address)
        srv = real(name, listen, next_address, **kw)
        stop = srv.stop

        def recorded_stop(grace: Any = 1.0) -> None:
            got.grace.append(grace)
            stop(grace)

        srv.stop = recorded_stop
        return srv

    monkeypatch.setattr(server, "serve_tier", spy)
    out, stdin = _Stdout(), _Stdin()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stdin", stdin)
    signal.signal(signal.SIGTERM, _unhandled)
    lock, done = threading.Lock(), threading.Event()

    def beside() -> None:
        try:
            if not out.written.wait(60):
                return
            got.ready_flushed = out.ready.wait(5)
            got.sigterm, got.sigint = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
            got.build = current_limits()
            address = (out.flushed + out.pending).split(READY, 1)[1].split()[0]
            with GrpcTierClient(address, retries=0, deadline_s=10) as c:
                got.info = c.describe(shallow=True)
        except Exception as e:  # noqa: BLE001 - the test says what went wrong
            got.error = e
        if done.wait(unasked_s):  # it returned before anyone asked it to stop
            return
        if end_stdin:
            stdin.eof.set()
        else:
            with lock:  # a signal only while it serves: once it returned, the test's own handler is back
                if not done.is_set():
                    got.stopped_by_signal = True
                    os.kill(os.getpid(), signal.SIGTERM)
        if not done.wait(10):  # it was told to stop and serves on: the test fails rather than hangs
            with lock:
                if not done.is_set():
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.main_thread().ident),
                                                               ctypes.py_object(_StillServing))

    t = threading.Thread(target=beside, daemon=True)
    t.start()
    try:
        args = cli.build_parser().parse_args([*BASE, *flags])
        got.rc = args.func(args)
    finally:
        with lock:
            done.set()
        stdin.eof.set()
        t.join(30)
    got.flushed = out.flushed
    got.stdin_daemon = [t.daemon for t in stdin.read_by]
    return got, stdin


def test_a_tier_without_flags_serves_the_documented_defaults(
        monkeypatch: pytest.MonkeyPatch, restored: dict[str, list[Any]]) -> None:
    """``--no-malloc-tuning`` only; SIGINT ignored beforehand (a background job's) stays ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    got, stdin = _serve(monkeypatch, "--no-malloc-tuning", unasked_s=1.5)  # a while: it serves on, unasked
    assert got.error is None
    assert got.rc == 0 and got.rc is not None
    kw = got.kw
    assert (kw["name"], kw["listen"], kw["next_address"]) == ("cloud", "127.0.0.1:0", None)
    assert (kw["next_deadline_s"], kw["max_workers"], kw["next_compress"]) == (60.0, 32, "none")
    assert (kw["limits"].max_tensor_bytes, kw["limits"].max_call_bytes) == (512 << 20, 1 << 30)
    assert (kw["idle_release_s"], kw["status_every_s"], kw["stream_idle_s"]) == (IDLE_RELEASE_S, 300.0, STREAM_IDLE_S)
    assert kw["stream_min_bytes_s"] == pytest.approx(STREAM_MIN_BYTES_S) == 16_000  # 128 kbit/s
    assert got.build == BuildLimits(DEFAULT_LIMITS.model_bytes, DEFAULT_LIMITS.sample_bytes, 0)
    info = got.info
    assert (info.name, info.max_tensor_bytes, info.idle_release_s) == ("cloud", 512 << 20, IDLE_RELEASE_S)
    assert (info.max_model_bytes, info.max_sample_bytes) == (DEFAULT_LIMITS.model_bytes, DEFAULT_LIMITS.sample_bytes)
    # the line a parent waits for, flushed at once (a pipe would hold it back otherwise)
    assert got.ready_flushed
    assert got.flushed.startswith(READY) and got.flushed.endswith(" (computing on cpu)\n")
    # it took SIGTERM (the test's own handler never ran), left the ignored SIGINT alone, and served until then
    assert got.sigterm is not _unhandled and callable(got.sigterm)
    assert got.sigint is signal.SIG_IGN
    assert got.stopped_by_signal
    assert got.grace == [2.0]
    assert restored == {"malloc": [], "threads": []}  # malloc left alone, torch's threads unset
    assert stdin.read_by == []  # stdin is not its to read without --exit-with-stdin


def test_each_flag_reaches_the_tier_as_given(monkeypatch: pytest.MonkeyPatch,
                                             restored: dict[str, list[Any]]) -> None:
    """MiB as MiB, kbit/s as bytes/s; malloc tuned without ``--no-malloc-tuning``; stopped by the end of stdin,
    read on a daemon thread (the tier's exit never waits on it)."""
    got, stdin = _serve(monkeypatch, "--name", "t1", "--max-model-mb", "3", "--max-sample-mb", "2",
                        "--max-held-mb", "5", "--threads", "2", "--max-tensor-mb", "1024", "--idle-release-s", "7",
                        "--status-every-s", "9", "--stream-idle-s", "11", "--stream-min-kbps", "80",
                        "--deadline", "0.5", "--exit-with-stdin", end_stdin=True)
    assert got.error is None
    assert got.rc == 0
    kw = got.kw
    assert kw["name"] == "t1" and kw["next_deadline_s"] == 0.5
    assert (kw["limits"].max_tensor_bytes, kw["limits"].max_call_bytes) == (1 << 30, 2 << 30)
    assert (kw["idle_release_s"], kw["status_every_s"], kw["stream_idle_s"]) == (7.0, 9.0, 11.0)
    assert kw["stream_min_bytes_s"] == 10_000.0
    assert got.build == BuildLimits(3 << 20, 2 << 20, 5 << 20)
    info = got.info
    assert (info.name, info.max_tensor_bytes, info.idle_release_s) == ("t1", 1 << 30, 7.0)
    assert (info.max_model_bytes, info.max_sample_bytes) == (3 << 20, 2 << 20)
    assert got.sigint is not signal.default_int_handler and callable(got.sigint)  # Ctrl-C stops it too
    assert len(stdin.read_by) == 1
    assert got.stdin_daemon == [True]
    assert len(restored["malloc"]) == 1 and restored["threads"] == [2]


def test_0_means_never_for_idle_status_and_stream_checks(
        monkeypatch: pytest.MonkeyPatch, restored: dict[str, list[Any]]) -> None:
    seen = _not_serving(monkeypatch)
    with pytest.raises(_NotServed):
        cli.main([*BASE, "--idle-release-s", "0", "--status-every-s", "0", "--stream-idle-s", "0",
                  "--no-malloc-tuning"])
    assert (seen["idle_release_s"], seen["status_every_s"], seen["stream_idle_s"]) == (None, None, None)
