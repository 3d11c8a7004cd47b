"""Measure a link to a tier from where this runs: round trip, and bandwidth each way.

What a fleet file says of a device's link (``up_mbps``, ``down_mbps``, ``rtt_ms``)
is what the optimizer plans with before the first round measures anything, so it
should come from the device's real network, not a guess. The round trip is a bare
call (the health check); bandwidth is a ``Probe`` call carrying a payload one way,
grown until a call takes ``target_s`` (or reaches one message), less the bare
call's time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from splitfed.errors import Unavailable
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.errors import TlsRefused

START_BYTES = 16 << 10  # 1.3 s at 0.1 Mbit/s (BLE): a slow link is measured quickly too


@dataclass(frozen=True)
class LinkMeasure:
    rtt_ms: float
    up_mbps: float | None = None  # None: not measured
    down_mbps: float | None = None


def round_trip_ms(client: GrpcTierClient, count: int, timeout: float) -> float:
    """Median round trip of the health check, a bare unary call (the connection is up by now). A check that
    fails is no round trip (its time is a refusal's, or the timeout's): Unavailable."""
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        ok = client.health(timeout)
        took = (time.perf_counter() - t0) * 1e3
        if not ok:
            why = client.health_failure()
            if isinstance(why, TlsRefused):  # a configuration to fix, not a link to measure later
                raise why
            raise Unavailable(f"tier {client.address}: its health check failed, so no round trip was timed"
                              + (f" ({why})" if why is not None else ""))
        times.append(took)
    return statistics.median(times)


def bandwidth_mbps(client: GrpcTierClient, up: bool, count: int = 3, target_s: float = 0.25) -> float:
    """Megabit/s one way: the median of ``count`` probes of the largest payload tried, less an empty probe."""
    most = client.limits.unary_bytes  # one message: Limits.head_room leaves room for its framing
    size = min(START_BYTES, most)
    while True:
        took = statistics.median(client.probe(size, 0) if up else client.probe(0, size) for _ in range(count))
        if took >= target_s or size >= most:
            break
        size = min(most, size * 4)
    empty = statistics.median(client.probe(0, 0) for _ in range(count))
    return size * 8 / 1e6 / max(took - empty, 1e-6)


def measure_link(client: GrpcTierClient, count: int = 5, timeout: float = 10.0,
                 bandwidth: bool = False) -> LinkMeasure:
    rtt = round_trip_ms(client, count, timeout)
    if not bandwidth:
        return LinkMeasure(rtt)
    return LinkMeasure(rtt, bandwidth_mbps(client, up=True), bandwidth_mbps(client, up=False))
