"""The segment optimizer as assignment policies: ``--cuts adaptive`` and ``--cuts greedy``.

Both see the clients through the one cost model (:mod:`splitfed.cost`): a
:class:`~splitfed.cost.Scenario` of the model's block profile, the shared
tiers of the fleet, and one fleet client per registered node. A node's device
is the fleet client its ``profile`` names (simulation: drawn from the fleet
file) or a named device profile (deployment: ``--node-config
device-profile=rpi4``), with the node's real sample count and, where it
measured one at registration (deployment), its real link to the edge.

- :class:`GreedyPolicy`: every device picks its own fastest cuts, as if the
  shared tiers were its alone (:func:`splitfed.optimizer.greedy`); fixed for the run.
- :class:`AdaptivePolicy`: the exact optimizer picks the first assignment; after
  every round the :class:`~splitfed.optimizer.Adapter` learns the devices'
  speeds from what was measured and moves cuts that pay for moving their weights.

What "measured" means: in simulation (``sim-clock``) the world is the fleet
file with its drift applied for the round, and a client measures what the cost
model says it would take there; in deployment it is the node's own timings
(its compute seconds, and its link seconds split between the directions by
bytes: an approximation that also counts the server tiers' compute as link).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import ClientInfo, Cuts, Measurement

if TYPE_CHECKING:
    from splitfed.optimizer.adapt import Decision
    from splitfed.profile.speed import SpeedMeasure


def scenario(settings: RunSettings, clients: Sequence[ClientInfo]):  # type: ignore[no-untyped-def]
    """The cost model's view of the registered clients, named by client id, in round 1 (a fleet file's drift at
    round 1 included)."""
    from splitfed.cost import Scenario
    from splitfed.profile import (
        MIB,
        PROFILES,
        Client,
        LinkProfile,
        TierProfile,
        mbps,
    )
    from splitfed.sim.clock import fleet_for

    fleet = fleet_for(settings)
    names = fleet_devices(settings)
    refusal = profile_refusal(settings, names)
    picked = []
    for info in clients:
        if (why := refusal(info.profile)) is not None:
            raise ConfigError(f"{info.client_id}: {why}")
        if info.profile in names:  # as it is in round 1, the first round planned (the clock drifts it from there)
            base = names[info.profile].at_round(1)
        else:
            p = PROFILES[info.profile]
            assert p.up_mbps is not None  # profile_refusal: a device's profile
            base = Client(info.profile, info.profile, TierProfile(p.flops, p.memory_mb * MIB),
                          LinkProfile(mbps(p.up_mbps), mbps(p.down_mbps or p.up_mbps), (p.rtt_ms or 0) / 1e3),
                          info.samples or 1)
        if info.link is not None:  # what the device measured to its edge beats what its profile guessed
            base = replace(base, link=info.link)
        if (flops := measured_device_flops(settings, info.speed)) is not None:  # and so does its speed
            base = replace(base, device=TierProfile(flops, base.device.memory))
        picked.append(replace(base, name=info.client_id, samples=info.samples or base.samples))
    profile = run_profile(settings)
    return Scenario.from_fleet(profile, replace(fleet, clients=tuple(picked), kinds={}), tiers=settings.tiers,
                               batch=settings.batch_size, u_shape=settings.u_shape,
                               epochs=settings.local_epochs, mode=settings.mode, codec=settings.compress,
                               min_device_blocks=settings.min_device_blocks)


def make_predictor(settings: RunSettings, policy: Any) -> Callable[..., tuple[float, dict[str, float]] | None]:
    """In real time, what the cost model predicts of each round before it runs (``policy.Predictor``), reported
    beside what is measured: under the adaptive policy's beliefs (what it has learned so far), else under
    what registration said of each device (its profile, and what it measured of its link and speed)."""
    from splitfed.cost import evaluate

    said: dict[tuple[str, ...], Any] = {}

    def predict(assignment: Mapping[str, Cuts], clients: Sequence[ClientInfo]) -> tuple[float, dict[str, float]] | None:
        adapter = getattr(policy, "adapter", None)
        sc = getattr(adapter, "belief", None)
        if sc is None:
            key = tuple(c.client_id for c in clients)
            if key not in said:
                said.clear()  # one sample of clients at a time
                try:
                    said[key] = scenario(settings, clients)
                except ConfigError:  # a device the cost model cannot price: no prediction
                    said[key] = None
            sc = said[key]
        if sc is None:
            return None
        sc = sc.with_clients([c for c in sc.clients if c.name in assignment])
        cost = evaluate(sc, {c.name: assignment[c.name] for c in sc.clients})
        return cost.makespan_s, cost.times()

    return predict


def fleet_devices(settings: RunSettings) -> dict[str, Any]:
    """The devices of the run's fleet file a node's ``device-profile`` may name: an entry (``pi-home``), one of
    its numbered clients (``pi-home-3``), or a client the run drew from it (``fleet_for``: these win)."""
    from splitfed.profile import load_fleet
    from splitfed.sim.clock import fleet_for

    out: dict[str, Any] = {}
    for c in load_fleet(settings.fleet).clients:
        out.setdefault(c.kind, c)
        out.setdefault(c.name, c)
    out.update({c.name: c for c in fleet_for(settings).clients})
    return out


def profile_refusal(settings: RunSettings, devices: Mapping[str, Any] | None = None) -> Callable[[str], str | None]:
    """The check of a node's ``device-profile``: None for a name the cost model can price (a device of the run's
    fleet file, ``devices`` as :func:`fleet_devices` gives them, or a named device profile), else why not. The
    fleet is read once for every name checked."""
    from splitfed.profile import PROFILES, load_fleet

    fleet = load_fleet(settings.fleet)
    named = [n for n, p in PROFILES.items() if p.up_mbps is not None]
    known = set(fleet_devices(settings) if devices is None else devices) | set(named)

    def refusal(name: str) -> str | None:
        if name in known:
            return None
        kinds = ", ".join(dict.fromkeys(c.kind for c in fleet.clients))
        return (f"device profile {name!r} is neither a device of fleet {fleet.name!r} (an entry: {kinds}; or "
                f"one of its numbered clients) nor a named device profile ({', '.join(named)})")

    return refusal


def run_profile(settings: RunSettings):  # type: ignore[no-untyped-def]
    """The run's model profile: its FLOPs and bytes, kept on disk as ``optimize`` keeps them (a run uses no
    measured times, so one timed repetition: seconds of every run's start went to timing three)."""
    from splitfed.profile.profiler import default_cache_dir, profile_model

    return profile_model(settings.spec, batch=settings.batch_size, optimizer_slots=settings.optim.slots, reps=1,
                         cache_dir=default_cache_dir())


def device_work(settings: RunSettings, cuts: Sequence[int]) -> float:
    """FLOPs per sample of training the device's blocks under ``cuts`` (its head, and its U-shape tail): 0 when
    it computes nothing, as the cost model prices it."""
    return _work_of(settings, tuple(int(k) for k in cuts))


@functools.lru_cache(maxsize=1024)  # asked for every client every round: a fleet shares few cut vectors
def _work_of(settings: RunSettings, cuts: tuple[int, ...]) -> float:
    from splitfed.cost import Scenario, client_cost
    from splitfed.profile import Client, LinkProfile, TierProfile

    profile = run_profile(settings)
    me = Client("device", "device", TierProfile(1.0, math.inf), LinkProfile(1.0, 1.0, 0.0), 1)
    sc = Scenario(profile, (me,), tuple(TierProfile(1.0, math.inf) for _ in range(settings.tiers - 1)),
                  tuple(LinkProfile(1.0, 1.0, 0.0) for _ in range(settings.tiers - 2)), batch=settings.batch_size,
                  u_shape=settings.u_shape, mode=settings.mode, min_device_blocks=0)
    return client_cost(sc, me, cuts).flops[0]


def measured_device_flops(settings: RunSettings, speed: SpeedMeasure | None) -> float | None:
    """A device's FLOP/s from its registration's speed measurement, in the cost model's FLOPs (None: none)."""
    from splitfed.profile.speed import measured_flops

    return None if speed is None else measured_flops(run_profile(settings), speed)


def _check(settings: RunSettings, name: str) -> None:
    if settings.fraction < 1:
        raise ConfigError(f"cuts {name} plans for every client in every round: use fraction 1")  # --cuts, or a config's


class GreedyPolicy:
    """Each device's own fastest cuts, ignoring that the edge and cloud are shared."""

    def __init__(self, settings: RunSettings) -> None:
        _check(settings, "greedy")
        self.settings = settings
        self.assignment: dict[str, Cuts] = {}

    def assign(self, round: int, clients: Sequence[ClientInfo]) -> dict[str, Cuts]:
        if any(c.client_id not in self.assignment for c in clients):  # the first round, or a resumed run's new node
            from splitfed.optimizer import greedy

            # each device's pick is its own: those a resumed run kept stay
            self.assignment = {**greedy(scenario(self.settings, clients)).assignment, **self.assignment}
        return {c.client_id: self.assignment[c.client_id] for c in clients}

    def observe(self, round: int, measurements: Sequence[Measurement]) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"assignment": {k: list(v) for k, v in self.assignment.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.assignment = {k: tuple(v) for k, v in state.get("assignment", {}).items()}


class AdaptivePolicy:
    """The exact optimizer's cuts, re-planned between rounds from what the clients measured."""

    def __init__(self, settings: RunSettings) -> None:
        _check(settings, "adaptive")
        self.settings = settings
        self.adapter: Any = None
        self._saved: Mapping[str, Any] | None = None
        # each client's device in the fleet as it really is (simulation), by client id; None: its times are measured
        self._truth: dict[str, str] | None = None
        # a finished run resumed for more rounds: its last round, and the decision after it made again for the
        # rounds now left, which that round's metrics row is to say instead of "last round" (the run writes it)
        self.redecided: tuple[int, dict[str, Any]] | None = None

    def _start(self, clients: Sequence[ClientInfo]) -> None:
        from splitfed.optimizer import Adapter, OutOfTime

        sc = scenario(self.settings, clients)
        saved = self._saved
        if saved:  # a resumed run: what it had learned of each client it knew (a node new to it: its profile)
            beliefs = saved.get("beliefs", {})
            sc = replace(sc, clients=tuple(_with_belief(c, beliefs[c.name]) if c.name in beliefs else c
                                           for c in sc.clients))
        # the saved cuts of the clients here: a node that did not come back is no client of this scenario
        here = {c.name for c in sc.clients}
        run = self.settings
        try:
            self.adapter = Adapter(sc, run.rounds, hysteresis=run.hysteresis, alpha=run.measurement_weight,
                                   jump=run.regime_jump, time_limit=run.solve_time_limit_s,
                                   assignment={k: tuple(v) for k, v in saved["assignment"].items() if k in here}
                                   if saved else None)
        except OutOfTime as e:  # named as the run's setting (before: optimize's --time-limit, no flag of a run)
            raise ConfigError(f"cuts adaptive's first plan: {e.what}: raise solve-time-limit-s, or use cuts greedy"
                              ) from None
        self._truth = simulated_devices(self.settings, clients)

    def assign(self, round: int, clients: Sequence[ClientInfo]) -> dict[str, Cuts]:
        if self.adapter is None:
            self._start(clients)
            saved = self._saved or {}
            if saved.get("rounds") == round - 1 < self.settings.rounds:
                # a finished run resumed for more rounds: its last decision kept every cut ("last round", no
                # round left to repay a move); decided again for the rounds now left, from what it had learned
                assert self.adapter is not None
                self.redecided = (round - 1, _decision(self.adapter.observe(round - 1, {})))
        return {c.client_id: tuple(self.adapter.assignment[c.client_id]) for c in clients}

    def observe(self, round: int, measurements: Sequence[Measurement]) -> dict[str, Any]:
        from splitfed.cost import client_cost
        from splitfed.optimizer import Measurement as Seen

        sc = self.adapter.belief
        seen: dict[str, Seen] = {}
        if self._truth is not None:
            from splitfed.profile.speed import first_work
            from splitfed.sim.clock import fleet_for

            world = fleet_for(self.settings).at_round(round)
            for m in measurements:
                mine = sc.clients[sc.index(m.client_id)]
                true = replace(world.client(self._truth[m.client_id]), name=m.client_id, samples=mine.samples)
                truth_sc = sc.with_clients([true])
                seen[m.client_id] = Seen.from_cost(client_cost(truth_sc, true, m.cuts), true,
                                                   probe_flops=first_work(sc.profile, sc.batch))
        else:
            for m in measurements:
                seen[m.client_id] = _measured(sc, m)
        return _decision(self.adapter.observe(round, seen))

    def state_dict(self) -> dict[str, Any]:
        if self.adapter is None:
            return dict(self._saved or {})
        return {"assignment": {k: list(v) for k, v in self.adapter.assignment.items()},
                "beliefs": {c.name: [c.device.flops, c.link.up, c.link.down, c.link.rtt]
                            for c in self.adapter.belief.clients},
                "rounds": self.settings.rounds}  # the horizon its decisions were made for

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._saved = state if state.get("assignment") else None


def _decision(d: Decision) -> dict[str, Any]:
    """An :class:`~splitfed.optimizer.Adapter` decision as a metrics row's ``decision`` holds it."""
    return {"moved": list(d.moved), "reason": d.reason, "predicted_s": d.before_s,
            "predicted_after_s": d.after_s, "move_s": d.move_s}  # the metrics writer nulls inf


def simulated_devices(settings: RunSettings, clients: Sequence[ClientInfo]) -> dict[str, str] | None:
    """Each client's device in the run's drawn fleet, by client id, where the simulated clock times the round
    (``sim-clock``, every client one of the devices ``fleet_for`` drew, as :func:`splitfed.sim.clock.make_clock`
    requires); else None: the clock reports measured times, so the policy learns from them too. Before, a node
    naming another device (``rpi4``, or a fleet entry such as ``pi-home``: registration takes both) under
    ``sim-clock`` trained its first round and then stopped the run: the fleet has no client of that name."""
    if not settings.sim_clock:
        return None
    from splitfed.sim.clock import drawn_devices, fleet_for

    return drawn_devices(fleet_for(settings), clients)


def _measured(sc: Any, m: Measurement) -> Any:
    """What a deployed client's round teaches about its link. ``link_s`` is all its waiting on the chain: the
    wire both ways, each message's latency and the servers' compute; only the wire is its bandwidth's doing.
    So the latency and the servers' part (as now believed) come off first, and the rest is shared between
    the directions as the believed wire times share it. Nothing left (the servers ran slower than believed,
    say) teaches nothing about the link. A round trip the device measured this round prices the latency
    (else the believed one does: a longer round trip would be learned as a slower link), and is learned too.
    The round is priced at the samples the client reports training (every epoch counted in them), not those it
    registered: a device as believed that trained half of them was learned 1.5x faster (alpha 0.5)."""
    from splitfed.cost import client_cost
    from splitfed.optimizer import Measurement as Seen

    if m.samples <= 0:  # it trained nothing: its times teach nothing (a device at cut 0 still timed its speed)
        return Seen(*_device_work(sc, 0.0, m), rtt_s=m.rtt_s)
    me = sc.clients[sc.index(m.client_id)]
    me = replace(me, samples=max(1, round(m.samples / sc.epochs)))
    if m.rtt_s is not None:  # priced as this client alone: no new scenario of every client per measurement
        me = replace(me, link=replace(me.link, rtt=m.rtt_s))
    cc = client_cost(sc, me, m.cuts)
    work, secs = _device_work(sc, cc.flops[0], m)
    link = me.link
    wire_up, wire_down = cc.up_bytes[0] / link.up, cc.down_bytes[0] / link.down
    latency = cc.up_s[0] + cc.down_s[0] - wire_up - wire_down
    servers = sum(cc.compute_s[1:]) + sum(cc.up_s[1:]) + sum(cc.down_s[1:])
    wire = m.link_s - latency - servers
    if wire <= 0 or wire_up + wire_down <= 0:
        return Seen(work, secs, rtt_s=m.rtt_s)
    share = wire_up / (wire_up + wire_down)
    return Seen(work, secs, m.bytes_up, wire * share, m.bytes_down, wire * (1 - share), rtt_s=m.rtt_s)


def _device_work(sc: Any, flops: float, m: Measurement) -> tuple[float, float]:
    """The device's FLOPs and compute seconds this round; for a device that computed nothing, the training it
    timed instead when asked (``Measurement.speed``), in the cost model's FLOPs: (0, 0) teaches nothing."""
    from splitfed.profile.speed import measured_flops

    if flops > 0 or m.speed is None:
        return flops, m.compute_s
    rate = measured_flops(sc.profile, m.speed)
    return (rate * m.speed.seconds, m.speed.seconds) if rate is not None else (0.0, 0.0)


def _with_belief(client: Any, belief: Sequence[float]) -> Any:
    """``client`` as a checkpoint's beliefs say. A saved value that is no usable number (NaN, or a rate of 0:
    a checkpoint from before the guards on measurements) is the profile's again: it stayed, priced the client's
    cuts NaN, and ended the run (or hid the client from the makespan) while the client failed to report."""
    from splitfed.profile import LinkProfile, TierProfile

    def rate(saved: float, profile: float) -> float:
        return saved if 0 < saved < math.inf else profile

    flops, up, down, *rtt = belief  # a checkpoint from before round trips were learned has three
    trip = rtt[0] if rtt and 0 <= rtt[0] < math.inf else client.link.rtt
    return replace(client, device=TierProfile(rate(flops, client.device.flops), client.device.memory),
                   link=LinkProfile(rate(up, client.link.up), rate(down, client.link.down), trip))
