"""How a tier's idle-stream watcher spends and credits a stream's time, pinned with exact values (mutation
survivors of splitfed/transport/server.py, its ``_IdleStreams``): a request stream is charged from its start, a
reply stream only while its caller does not read, a frame of n bytes buys n / ``min_bytes_s`` seconds up to
``idle_s``, a floor of 0 counts frames alone, the watcher looks at least every ``min(1 s, idle_s / 4)``, ends
with the last stream, and never keeps a process alive.

The class is driven directly, with a stand-in for the servicer context (a real one needs a call) and the
module's ``time`` replaced by a clock the test sets: the watcher thread sleeps until the test lets it make
one check, so every credit is exact and nothing depends on the machine's speed."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from splitfed.errors import ConfigError
from splitfed.transport import server as server_mod
from splitfed.transport.errors import IDLE_CANCELLED

ROOT = Path(__file__).resolve().parents[1]
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


class _Call:
    def __init__(self, context: _Context) -> None:
        self.context = context

    def cancel(self, code: int, details: str) -> None:
        self.context.cancels.append((code, details))
        self.context.active = False


class _Event:
    def __init__(self, context: _Context) -> None:
        self.call = _Call(context)


class _Context:
    """A live call as the watcher sees one: it cancels through gRPC's call object with a status and details."""

    def __init__(self) -> None:
        self.active = True
        self.cancels: list[tuple[int, str]] = []
        self._rpc_event = _Event(self)

    def is_active(self) -> bool:
        return self.active

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5"

    def cancel(self) -> None:  # pragma: no cover - the watcher cancels through the call object
        self.cancels.append((grpc.StatusCode.CANCELLED.value[0], ""))
        self.active = False


class _Clock:
    """The module's ``time``: ``monotonic`` is ``now``, which the test sets; ``sleep`` parks the watcher until
    :meth:`check` lets it make one check (``ticking``: the sleep then moves ``now`` on by what it slept)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.naps: list[float] = []
        self.ticking = False
        self._cond = threading.Condition()
        self._slept = self._woken = 0
        self._free = False
        self._made: list[server_mod._IdleStreams] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        with self._cond:
            if self._free:
                return
            self.naps.append(s)
            self._slept += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._free or self._woken >= self._slept, timeout=60)
            if self.ticking and not self._free:
                self.now += s

    def streams(self, idle_s: float = 2.0, min_bytes_s: float = 1024.0) -> server_mod._IdleStreams:
        made = server_mod._IdleStreams(idle_s, min_bytes_s, tier="edge")
        self._made.append(made)
        return made

    def _until(self, done: Callable[[], bool]) -> None:
        for _ in range(6000):  # 30 s at most: the watcher only has to reach its next sleep
            if done():
                return
            self._cond.wait(0.005)
        raise AssertionError("the watcher never went back to sleep")

    def check(self, streams: server_mod._IdleStreams) -> None:
        """Let the watcher of ``streams`` make one check; returns once it sleeps again or has ended."""
        thread = streams._watcher
        if thread is None:
            return
        with self._cond:
            self._until(lambda: self._slept > self._woken or not thread.is_alive())
            if not thread.is_alive():
                return
            self._woken += 1
            self._cond.notify_all()
            self._until(lambda: self._slept > self._woken or not thread.is_alive())

    def release(self) -> None:
        with self._cond:
            self._free = True
            self._cond.notify_all()
        for made in self._made:
            with made._lock:
                made._open.clear()
                thread = made._watcher
            if thread is not None:
                thread.join(5)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    c = _Clock()
    monkeypatch.setattr(server_mod, "time", c)
    yield c
    c.release()


def _details(ctx: _Context) -> str:
    assert [code for code, _ in ctx.cancels] == [EXHAUSTED], ctx.cancels
    return ctx.cancels[0][1]


def test_a_floor_of_zero_bytes_a_second_is_allowed_and_any_frame_restores_the_whole_idle_time(
        clock: _Clock) -> None:
    """``stream_min_bytes_s=0`` is documented (frames alone count): it is taken, and an empty frame then buys
    all of ``idle_s`` back, however long the caller waited for it."""
    streams = clock.streams(2.0, 0.0)
    ctx = _Context()

    def frames() -> Iterator[bytes]:
        clock.now += 1.5
        clock.check(streams)
        yield b""
        clock.now += 1.75  # 3.25 s since the start, 1.75 since the empty frame
        clock.check(streams)
        assert ctx.cancels == []
        clock.now += 0.5
        clock.check(streams)

    assert list(streams.watch(frames(), ctx, "Load request stream")) == [b""]
    assert "moved 0 bytes in 1 frame(s)" in _details(ctx)
    assert streams.cancelled == 1


def test_a_request_stream_whose_caller_never_sends_a_frame_is_cancelled_after_its_idle_time(
        clock: _Clock) -> None:
    """The wait for the first frame is charged: a caller that opens a Load and sends nothing holds a worker
    only ``idle_s``. Its cancel says so, as the tier's word, with RESOURCE_EXHAUSTED, and counts a refusal."""
    streams = clock.streams(2.0)
    refused: list[grpc.StatusCode] = []
    streams.on_cancel = refused.append
    ctx = _Context()

    def frames() -> Iterator[bytes]:
        clock.now += 1.75
        clock.check(streams)
        assert ctx.cancels == []
        clock.now += 0.5
        clock.check(streams)
        return
        yield b""  # pragma: no cover

    assert list(streams.watch(frames(), ctx, "Load request stream")) == []
    details = _details(ctx)
    assert details.startswith(f"{IDLE_CANCELLED}edge: Load request stream: it moved 0 bytes in 0 frame(s) in 2.2 s")
    assert "a frame at least every 2 s and 1024 bytes/s on average" in details
    assert (streams.cancelled, refused) == (1, [grpc.StatusCode.RESOURCE_EXHAUSTED])


def test_a_reply_stream_is_charged_only_while_its_caller_does_not_read(clock: _Clock) -> None:
    """Making a reply's frames (the tier computing) costs its caller nothing, however long it takes; once a
    frame is handed to gRPC, the time until gRPC takes it (the caller reads) is charged."""
    streams = clock.streams(2.0)
    ctx = _Context()

    def made() -> Iterator[bytes]:
        for _ in range(2):
            clock.now += 5.0  # the tier works on the next frame
            clock.check(streams)
            yield b"r" * 1024

    reply = streams.reply(made(), ctx, "Fetch reply")
    assert next(reply) == b"r" * 1024
    assert ctx.cancels == []
    clock.now += 1.75  # the caller reads, late but within its credit
    assert next(reply) == b"r" * 1024
    assert ctx.cancels == []
    clock.now += 2.25  # the caller stops reading
    clock.check(streams)
    assert "Fetch reply: it moved 1024 bytes in 1 frame(s)" in _details(ctx)
    reply.close()


def test_a_request_stream_that_drips_small_frames_runs_out_of_credit(clock: _Clock) -> None:
    """Each wait is charged and each frame of n bytes buys n / ``min_bytes_s`` seconds: 64-byte frames every
    0.75 s (1/16 s each) take a 2 s credit to 1.3125, 0.625, and the third wait overdraws it."""
    streams = clock.streams(2.0, 1024.0)
    ctx = _Context()
    checked: list[int] = []

    def frames() -> Iterator[bytes]:
        for _ in range(3):
            clock.now += 0.75
            clock.check(streams)
            checked.append(len(ctx.cancels))
            yield b"d" * 64

    got = []
    for f in streams.watch(frames(), ctx, "StepStream request stream"):
        got.append(f)
    assert checked == [0, 0, 1]
    assert "StepStream request stream: it moved 128 bytes in 2 frame(s) in 2.2 s" in _details(ctx)
    assert len(got) == 3  # the fake caller sends on regardless: the cancel is the call's end


def test_a_request_frame_that_arrives_at_once_keeps_the_credit_it_had(clock: _Clock) -> None:
    """A frame that comes without a wait costs nothing: the stream keeps its whole ``idle_s`` for the next wait
    (its small frame's bytes do not replace what it had)."""
    streams = clock.streams(2.0, 1024.0)
    ctx = _Context()

    def frames() -> Iterator[bytes]:
        yield b"x" * 16
        clock.now += 1.75
        clock.check(streams)
        yield b"y" * 16

    assert len(list(streams.watch(frames(), ctx, "Load request stream"))) == 2
    assert ctx.cancels == []


def test_a_large_frame_buys_back_the_whole_idle_time_and_no_more(clock: _Clock) -> None:
    """A 4 KiB frame at 1 KiB/s is worth 4 s: after a 1.5 s wait it fills the credit to ``idle_s`` (2 s), not
    beyond: a wait of 1.75 s is then fine, one of 2.25 s is not."""
    streams = clock.streams(2.0, 1024.0)
    ctx = _Context()

    def frames() -> Iterator[bytes]:
        clock.now += 1.5
        yield b"b" * 4096
        clock.now += 1.75
        clock.check(streams)
        assert ctx.cancels == []
        yield b"c"
        clock.now += 2.25
        clock.check(streams)

    assert len(list(streams.watch(frames(), ctx, "Load request stream"))) == 2
    assert "moved 4097 bytes in 2 frame(s)" in _details(ctx)


def test_a_frame_that_comes_after_the_credit_ran_out_buys_only_its_own_bytes(clock: _Clock) -> None:
    """A caller that overdraws between two looks of the watcher is not forgiven: its late 256-byte frame is
    worth 0.25 s, so a further half-second wait gets it cancelled."""
    streams = clock.streams(2.0, 1024.0)
    ctx = _Context()

    def frames() -> Iterator[bytes]:
        clock.now += 2.5  # past its 2 s, but the watcher has not looked
        yield b"l" * 256
        clock.now += 0.5
        clock.check(streams)

    assert len(list(streams.watch(frames(), ctx, "Load request stream"))) == 1
    assert "moved 256 bytes in 1 frame(s) in 3.0 s" in _details(ctx)


@pytest.mark.parametrize("idle_s, latest", [(2.0, 2.5), (8.0, 9.0)])
def test_a_stalled_stream_is_cancelled_within_a_quarter_of_its_idle_time_and_at_most_a_second_late(
        clock: _Clock, idle_s: float, latest: float) -> None:
    """The watcher looks every ``min(1 s, idle_s / 4)``: a stream that stops is cancelled after its ``idle_s``
    and no later than that much past it (how long a silent caller can hold a worker)."""
    streams = clock.streams(idle_s)
    ctx = _Context()
    clock.ticking = True
    start = clock.now

    def frames() -> Iterator[bytes]:
        for _ in range(50):
            if ctx.cancels:
                return
            clock.check(streams)
        yield b""  # pragma: no cover

    assert list(streams.watch(frames(), ctx, "StepStream request stream")) == []
    assert ctx.cancels, "never cancelled"
    assert idle_s < clock.now - start <= latest


def test_the_watcher_ends_with_the_last_stream_and_a_later_stream_gets_a_new_one(clock: _Clock) -> None:
    """One watcher thread, only while streams are open: the check after the last stream ended ends it, and a
    stream opened later is watched (and cancelled when it stalls) by a new one."""
    streams = clock.streams(2.0)
    first = streams.watch(iter([b"a"]), _Context(), "Load request stream")
    assert list(first) == [b"a"]
    thread = streams._watcher
    assert thread is not None
    clock.check(streams)
    thread.join(30)
    assert not thread.is_alive() and streams._watcher is None

    ctx = _Context()

    def frames() -> Iterator[bytes]:
        clock.now += 2.25
        clock.check(streams)
        return
        yield b""  # pragma: no cover

    assert list(streams.watch(frames(), ctx, "Load request stream")) == []
    assert _details(ctx)
    assert streams._watcher is not None and streams._watcher is not thread


_HELD_OPEN = """
from splitfed.transport import server

class Context:
    def is_active(self): return True
    def peer(self): return "ipv4:127.0.0.1:5"
    def cancel(self): pass

streams = server._IdleStreams(30.0)
held = streams.watch(iter([b"x", b"y"]), Context(), "Load request stream")
assert next(held) == b"x"  # the stream stays open, the tier working on its frame
print("open", flush=True)
"""


def test_a_stream_left_open_does_not_keep_the_process_from_exiting() -> None:
    """The watcher is a daemon thread: a process (a test, a CLI) that ends with a tier's stream still open
    exits rather than waiting forever on a watcher whose stream is never closed."""
    try:
        done = subprocess.run([sys.executable, "-c", _HELD_OPEN], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit with a stream open")
    assert (done.returncode, done.stdout) == (0, "open\n"), done.stderr


def test_a_negative_or_non_finite_floor_is_refused_and_a_fraction_of_a_byte_is_not() -> None:
    """The floor is any finite number of bytes a second >= 0: half a byte a second is a floor too."""
    assert server_mod._IdleStreams(2.0, 0.5).min_bytes_s == 0.5
    with pytest.raises(ConfigError, match="stream_min_bytes_s must be a number of bytes per second >= 0"):
        server_mod._IdleStreams(2.0, -0.5)
