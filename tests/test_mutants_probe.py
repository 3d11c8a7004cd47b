"""What measuring a link promises that the mutation run of ``splitfed/transport/probe.py`` found unpinned.

A round trip is reported in milliseconds; a failed health check's refusal names why it failed (and says
nothing more when nothing is known); the bandwidth probe's payload starts at 16 KiB and grows by 4 each time,
stopping at the first size whose probe takes ``target_s`` (exactly that is enough) or that fills one message;
a payload that took no measurable time beyond an empty probe reports the payload over 1 µs (finite, never a
division by zero or a negative rate); ``measure_link`` reports the upload as ``up_mbps`` and the download as
``down_mbps``.

A loopback link cannot be made slow or asymmetric here, so these use :class:`KnownLink`, a stand-in with the
interface ``round_trip_ms`` and ``bandwidth_mbps`` use (``limits.unary_bytes``, ``probe``, ``health``,
``health_failure``, ``address``) that simulates a link of known speed each way and known latency, on a clock
the test drives (no wall-clock timing). The real gRPC path is covered by tests/test_probe.py and
tests/test_transport_review.py.
"""

from __future__ import annotations

import pytest

from splitfed.errors import Unavailable
from splitfed.profile.devices import mbps
from splitfed.transport import probe
from splitfed.transport.probe import START_BYTES, bandwidth_mbps, measure_link, round_trip_ms
from splitfed.transport.wire import Limits
from tests.transport_fixtures import DrivenClock

MOST = Limits().unary_bytes  # 4 MiB: 16 KiB * 4**4, so growing by 4 lands on it exactly


class KnownLink:
    """A link of known speed: a probe takes ``latency + up_bytes / up + down_bytes / down`` seconds, a health
    check ``rtts`` in turn on ``clock``. A probe loop that never stops fails at once instead of hanging."""

    address = "127.0.0.1:9"

    def __init__(self, up_mbps: float = 1000.0, down_mbps: float = 1000.0, latency_s: float = 0.0, *,
                 unary_bytes: int = MOST, rtts: tuple[float, ...] = (0.01,), ok: bool = True,
                 why: Exception | None = None, clock: DrivenClock | None = None) -> None:
        self.limits = Limits(unary_bytes=unary_bytes)
        self.rates = (mbps(up_mbps), mbps(down_mbps))  # bytes/s
        self.latency = latency_s
        self.rtts, self.ok, self.why = rtts, ok, why
        self.clock = clock or DrivenClock()
        self.calls: list[tuple[int, int]] = []

    def probe(self, up_bytes: int, down_bytes: int) -> float:
        assert type(up_bytes) is int and type(down_bytes) is int, (up_bytes, down_bytes)
        assert len(self.calls) < 200, "the probe's payload never stopped growing"
        self.calls.append((up_bytes, down_bytes))
        return self.latency + up_bytes / self.rates[0] + down_bytes / self.rates[1]

    def health(self, timeout: float) -> bool:
        self.clock.now += self.rtts[len(self.calls) % len(self.rtts)]
        self.calls.append((-1, -1))  # a health check, counted to pick the next rtt
        return self.ok

    def health_failure(self) -> Exception | None:
        return self.why

    def sizes(self) -> list[int]:
        """The payloads probed, one per probe (the larger way; 0 for an empty probe)."""
        return [max(c) for c in self.calls if c != (-1, -1)]


# ---------------------------------------------------------------- the round trip


def test_the_round_trip_is_the_median_health_check_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks of 10, 30 and 20 ms: 20 ms (the fleet file's ``rtt_ms``), not 0.02 nor 40."""
    clock = DrivenClock()
    monkeypatch.setattr(probe, "time", clock)
    link = KnownLink(rtts=(0.010, 0.030, 0.020), clock=clock)
    assert round_trip_ms(link, 3, 1.0) == pytest.approx(20.0, rel=1e-9)  # type: ignore[arg-type]


def test_a_failed_health_check_says_why_when_it_is_known_and_nothing_more_when_not() -> None:
    """The refusal names the check's own error; with none known it neither adds ``(None)`` nor drops it."""
    link = KnownLink(ok=False, why=Unavailable("connection refused"))
    with pytest.raises(Unavailable) as e:
        round_trip_ms(link, 3, 1.0)  # type: ignore[arg-type]
    assert str(e.value) == ("tier 127.0.0.1:9: its health check failed, so no round trip was timed "
                            "(connection refused)")
    with pytest.raises(Unavailable) as e:
        round_trip_ms(KnownLink(ok=False, why=None), 3, 1.0)  # type: ignore[arg-type]
    assert str(e.value) == "tier 127.0.0.1:9: its health check failed, so no round trip was timed"


# ---------------------------------------------------------------- the probe's payload


@pytest.mark.parametrize("up", [True, False])
def test_a_fast_link_grows_the_payload_by_4_until_it_fills_one_message(up: bool) -> None:
    """1000 Mbit/s: even 4 MiB takes far under ``target_s``, so 16, 64, 256 KiB, 1 MiB, then one message
    (and no further: the loop stops there), each probed ``count`` times, then the empty probe."""
    link = KnownLink(1000.0, 1000.0)
    assert bandwidth_mbps(link, up=up) == pytest.approx(1000.0, rel=1e-9)  # type: ignore[arg-type]
    grown = [START_BYTES, 4 * START_BYTES, 16 * START_BYTES, 64 * START_BYTES, MOST]
    assert grown[-1] == 256 * START_BYTES
    assert link.sizes() == [s for s in grown for _ in range(3)] + [0, 0, 0]
    way = 0 if up else 1  # the payload goes the way asked, the other way carries nothing
    assert all(c[1 - way] == 0 for c in link.calls)


def test_the_payload_stops_growing_at_one_message_however_it_falls() -> None:
    """A message of 100 000 bytes: 16 KiB, 64 KiB, then 100 000 (not 256 KiB, and not again)."""
    link = KnownLink(1000.0, 1000.0, unary_bytes=100_000)
    bandwidth_mbps(link, up=True, count=1)  # type: ignore[arg-type]
    assert link.sizes() == [START_BYTES, 4 * START_BYTES, 100_000, 0]


def test_a_probe_that_takes_exactly_target_s_is_enough() -> None:
    """2 Mbit/s (262 144 B/s) and no latency: 16 KiB takes 0.0625 s, 64 KiB exactly 0.25 s, the target, so
    the measurement stops there: a slow link is not loaded with 256 KiB (a second more) for nothing."""
    link = KnownLink(up_mbps=262_144 * 8 / 1e6)
    got = bandwidth_mbps(link, up=True, target_s=0.25)  # type: ignore[arg-type]
    assert got == pytest.approx(262_144 * 8 / 1e6, rel=1e-9)
    assert link.sizes() == [START_BYTES] * 3 + [4 * START_BYTES] * 3 + [0] * 3


def test_a_slow_link_is_measured_with_the_first_payload() -> None:
    """0.1 Mbit/s (BLE): 16 KiB already takes over ``target_s``: no larger payload is sent."""
    link = KnownLink(up_mbps=0.1, down_mbps=0.1, latency_s=0.05)
    assert bandwidth_mbps(link, up=False, count=1) == pytest.approx(0.1, rel=1e-9)  # type: ignore[arg-type]
    assert link.sizes() == [START_BYTES, 0]


@pytest.mark.parametrize("extra_empty_s", [0.0, 0.002])
def test_a_payload_that_took_no_measurable_time_reports_it_over_one_microsecond(extra_empty_s: float) -> None:
    """A payload that cost nothing beyond an empty probe (or less: jitter made the empty one slower) is a rate
    beyond measuring: the payload over 1 µs (4 MiB: 33 554 432 Mbit/s), finite and positive, never a division
    by zero nor a negative rate."""

    class Free(KnownLink):
        def probe(self, up_bytes: int, down_bytes: int) -> float:
            super().probe(up_bytes, down_bytes)
            return 0.01 + (extra_empty_s if up_bytes == down_bytes == 0 else 0.0)

    got = bandwidth_mbps(Free(), up=True)  # type: ignore[arg-type]
    assert got == pytest.approx(MOST * 8 / 1e6 / 1e-6, rel=1e-9)


# ---------------------------------------------------------------- the link, each way


def test_measure_link_reports_the_upload_as_up_and_the_download_as_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 Mbit/s up and 8 down (a home line): swapped, the plan would send activations up a link 4x too fast."""
    clock = DrivenClock()
    monkeypatch.setattr(probe, "time", clock)
    link = KnownLink(up_mbps=2.0, down_mbps=8.0, latency_s=0.01, rtts=(0.04,), clock=clock)
    m = measure_link(link, count=3, bandwidth=True)  # type: ignore[arg-type]
    assert m.rtt_ms == pytest.approx(40.0, rel=1e-9)
    assert m.up_mbps == pytest.approx(2.0, rel=1e-9)
    assert m.down_mbps == pytest.approx(8.0, rel=1e-9)
