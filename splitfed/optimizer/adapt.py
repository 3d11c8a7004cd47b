"""Online adaptation: after each round, learn the devices' real speeds and move cuts that pay off.

After round r the :class:`Adapter` takes what each client measured (FLOPs and
seconds on the device, bytes and seconds on its link, its round trip;
optionally the servers' FLOP/s) and updates its beliefs, one value at a time:

    belief <- measured                          if measured / belief > jump or < 1 / jump
    belief <- (1 - alpha) belief + alpha measured  otherwise (kept within [belief, measured])

(smoothing absorbs noise; a jump beyond ``jump``x is a change of regime and is
believed at once; a run sets them as ``measurement-weight`` and ``regime-jump``).
It then re-solves (exact, :func:`~splitfed.optimizer.assign.solve`) under the new
beliefs and prices, over the R rounds left:

    J(keep) = R * M(current)
    J(move) = M1(new) + (R - 1) * M(new)

where M1 is the makespan of the next round with each moving client's
:func:`~splitfed.cost.model.move_cost` added to its time. A move that does not
lower J is undone client by client (most expensive first), so only clients
whose move pays for itself move. The new cuts are adopted only if
J(keep) - J(move) > hysteresis * J(keep): small predicted gains (noise) move nothing
(cuts believed to take forever, J(keep) = inf, go for any finite J(move)). Cuts in force
that do not fit (memory: given ones, a resumed run's) have J(keep) = inf: they go at once.
Since J(move) >= R * M(new), nothing can be adopted unless some plan has M <= (1 - hysteresis) M(current):
the re-solve asks that first (``solve(..., below=)``, one MILP), and searches for the best plan only when
there is one. Beliefs that move a little every round (a deployment's) then cost one MILP a round, not a
whole bisection.

Ties: the re-solve prefers the current cuts (``solve(..., prefer=current)``): when
several assignments have the optimal predicted makespan (within a relative 1e-9),
the target is one of least total move cost, so clients whose cuts are already
optimal stay where they are and the current assignment is kept whenever it is
optimal; among those, one of least total client time (clients the cuts in force do
not name, a resumed run's new ones, get their fastest cuts the makespan allows).
Every price follows the scenario's variant (``Scenario.mode``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from numbers import Integral

import numpy as np

from splitfed.cost.model import (
    ClientCost,
    Cuts,
    Scenario,
    evaluate,
    move_cost,
    option_table,
    server_memory,
)
from splitfed.errors import ConfigError, did_you_mean
from splitfed.optimizer.assign import solve
from splitfed.optimizer.defaults import (
    ADAPT_TIME_LIMIT_S,
    DEFAULT_GAP,
    HYSTERESIS,
    MEASUREMENT_WEIGHT,
    REGIME_JUMP,
)
from splitfed.optimizer.solution import OutOfTime
from splitfed.profile.devices import LinkProfile, TierProfile
from splitfed.profile.fleet import Client

HISTORY = 256  # decisions an Adapter keeps


@dataclass(frozen=True)
class Measurement:
    """One client's round as measured: work done and the seconds it took, per resource.

    ``up_s``/``down_s`` are time on the wire (latency excluded); ``rtt_s`` the link's
    round trip (None: not measured). A resource with no work or no seconds teaches
    nothing and leaves the belief as it was.
    """

    compute_flops: float = 0.0
    compute_s: float = 0.0
    up_bytes: float = 0.0
    up_s: float = 0.0
    down_bytes: float = 0.0
    down_s: float = 0.0
    round_s: float | None = None
    rtt_s: float | None = None

    @classmethod
    def from_cost(cls, cost: ClientCost, true_client: Client, probe_flops: float = 0.0) -> Measurement:
        """What a client would measure if the world were ``true_client`` (the simulated clock). A device that
        computed nothing (cut 0) times ``probe_flops`` of training instead, as a deployed node at cut 0 is
        asked to (:mod:`splitfed.profile.speed`)."""
        up = cost.up_bytes[0] + cost.exchange_bytes
        down = cost.down_bytes[0] + cost.exchange_bytes
        work = cost.flops[0] if cost.flops[0] > 0 else probe_flops
        return cls(work, work / true_client.device.flops, up, up / true_client.link.up,
                   down, down / true_client.link.down, cost.round_s, true_client.link.rtt)


@dataclass(frozen=True)
class Decision:
    """What the adapter did after a round."""

    round: int
    assignment: dict[str, Cuts]
    moved: tuple[str, ...]
    before_s: float   # predicted makespan of the old cuts, under the updated beliefs
    after_s: float    # predicted makespan of the cuts now in force
    move_s: float     # predicted extra time of the next round (moving weights)
    reason: str


def _smooth(belief: float, work: float, seconds: float, alpha: float, jump: float) -> float:
    if not (0 < work < math.inf and 0 < seconds < math.inf):  # nothing done, NaN or inf: teaches nothing
        return belief  # (a NaN would stay in the belief for good; an infinite time would make it 0)
    rate = work / seconds
    if rate == 0:  # underflowed (5e-324 FLOPs in 2 s): a zero rate would price its cuts 0/0, NaN
        return belief
    return _toward(belief, rate, alpha, jump)


def _toward(belief: float, seen: float, alpha: float, jump: float) -> float:
    """The smoothing rule on one value (a rate, or a round trip). The blend is a convex combination, so it
    is clamped to [belief, seen]: rounding alone moved it out (0.7 * 0.005 + 0.3 * 0.005 = 0.004999...),
    so a measurement equal to the belief changed the belief."""
    if not math.isfinite(seen) or seen < 0:  # not a measurement: a NaN belief would price every cut NaN
        return belief
    if not belief > 0 or belief == math.inf:  # no belief yet, or a NaN/inf one (a checkpoint from before the
        return seen  # guards above may hold one): the measurement replaces it
    ratio = seen / belief
    if ratio > jump or ratio < 1 / jump:
        return seen
    blend = (1 - alpha) * belief + alpha * seen
    return min(max(blend, min(belief, seen)), max(belief, seen))


def _listed(names: set[str], most: int = 8) -> str:
    """The names, sorted; a large fleet's first ``most`` and a count (a message stays one readable line)."""
    shown = sorted(names)
    return ", ".join(shown[:most]) + (f" and {len(shown) - most} more" if len(shown) > most else "")


def _first(violations: Sequence[str], most: int = 3) -> str:
    """A large fleet's first ``most`` violations and a count: a decision's reason stays one readable line (every
    client of a resumed run's changed fleet may be over its device)."""
    return "; ".join(violations[:most]) + (f"; and {len(violations) - most} more" if len(violations) > most else "")


class Adapter:
    """Keeps the current assignment and the believed fleet; ``observe`` after every round."""

    def __init__(self, scenario: Scenario, rounds: int, *, alpha: float = MEASUREMENT_WEIGHT,
                 jump: float = REGIME_JUMP, hysteresis: float = HYSTERESIS, gap: float = DEFAULT_GAP,
                 time_limit: float | None = ADAPT_TIME_LIMIT_S,
                 assignment: Mapping[str, Cuts] | None = None) -> None:
        if not 0 < alpha <= 1:
            raise ConfigError(f"alpha must be in (0, 1], got {alpha}")
        whole = isinstance(rounds, Integral) and not isinstance(rounds, bool)  # 2.5 or True were taken as rounds
        for name, value, ok in (("jump", jump, jump > 1), ("hysteresis", hysteresis, hysteresis >= 0),
                                ("rounds", rounds, whole and rounds >= 1)):
            if not ok:  # written as what holds, so a NaN fails it: a NaN hysteresis never let a cut move
                raise ConfigError(f"jump must be > 1, hysteresis >= 0 and rounds >= 1 (an integer), "
                                  f"got {name}={value!r}")
        self.belief = scenario
        self.rounds = int(rounds)
        self.alpha, self.jump, self.hysteresis = alpha, jump, hysteresis
        self.gap, self.time_limit = gap, time_limit
        names = {c.name for c in scenario.clients}
        for name in assignment or {}:  # before: dropped unsaid, so a misspelt name's cuts were planned anew
            if name not in names:
                raise ConfigError(f"assignment: no client named {name!r}{did_you_mean(name, names)}; "
                                  f"clients: {_listed(names)}")
        if assignment is None or any(c.name not in assignment for c in scenario.clients):
            # none yet, or a resumed run's clients that it did not know: planned with the rest, which keep
            # their cuts where that is as good
            try:
                assignment = solve(scenario, gap=gap, time_limit=time_limit, prefer=assignment).assignment
            except OutOfTime as e:  # its own knob named: optimize's --time-limit is no flag of a library caller
                raise OutOfTime(f"{e.what} ({time_limit:g} s): raise the adapter's time_limit, or plan with greedy",
                                f"{e.what} ({time_limit:g} s)") from None
        self.assignment: dict[str, Cuts] = {c.name: scenario.check_cuts(assignment[c.name]) for c in scenario.clients}
        self.history: list[Decision] = []  # the last HISTORY decisions (each holds every client's cuts)

    # ------------------------------------------------------------ beliefs

    def update(self, measured: Mapping[str, Measurement],
               servers: Mapping[str, tuple[float, float]] | None = None) -> None:
        """Smooth measured rates into the believed profiles (``servers``: tier name -> (FLOPs, s))."""
        a, j = self.alpha, self.jump
        names = {c.name for c in self.belief.clients}
        for name in measured:  # as an unknown server tier is: a misspelt client's round was dropped unsaid
            if name not in names:
                raise ConfigError(f"no client named {name!r}{did_you_mean(name, names)}; clients: {_listed(names)}")
        clients = []
        for c in self.belief.clients:
            m = measured.get(c.name)
            if m is None:
                clients.append(c)
                continue
            dev = TierProfile(_smooth(c.device.flops, m.compute_flops, m.compute_s, a, j), c.device.memory)
            rtt = c.link.rtt if m.rtt_s is None or m.rtt_s < 0 else _toward(c.link.rtt, m.rtt_s, a, j)
            link = LinkProfile(_smooth(c.link.up, m.up_bytes, m.up_s, a, j),
                               _smooth(c.link.down, m.down_bytes, m.down_s, a, j), rtt)
            clients.append(replace(c, device=dev, link=link))
        srv = list(self.belief.servers)
        for name, (work, secs) in (servers or {}).items():
            if name not in self.belief.tier_names[1:]:
                raise ConfigError(f"no server tier named {name!r} (tiers: {', '.join(self.belief.tier_names[1:])})")
            t = self.belief.tier_names.index(name) - 1
            srv[t] = TierProfile(_smooth(srv[t].flops, work, secs, a, j), srv[t].memory)
        self.belief = replace(self.belief, clients=tuple(clients), servers=tuple(srv))

    # ------------------------------------------------------------ decisions

    def observe(self, round: int, measured: Mapping[str, Measurement],
                servers: Mapping[str, tuple[float, float]] | None = None) -> Decision:
        """After round ``round`` (1-based) of ``rounds``: update beliefs, maybe move cuts for the next."""
        # before: round 0 or -1 planned over more rounds than are left, one past ``rounds`` read as the last,
        # 2.5 or True slipped through as a round number; refused before anything is learned from it
        if not (isinstance(round, Integral) and not isinstance(round, bool) and 1 <= round <= self.rounds):
            raise ConfigError(f"round must be in 1..{self.rounds} (an integer), got round={round!r}")
        self.update(measured, servers)
        left = self.rounds - round
        sc = self.belief
        current = evaluate(sc, self.assignment)
        if left <= 0:
            return self._record(round, (), current.makespan_s, current.makespan_s, 0.0, "last round")
        # J(move) >= R * M(new), so only a plan of makespan <= (1 - hysteresis) M(current) can be adopted: the
        # re-solve looks for one (one MILP) before it looks for the best
        worth = current.feasible and 0 < current.makespan_s < math.inf and self.hysteresis > 0
        try:
            sol = solve(sc, gap=self.gap, time_limit=self.time_limit, prefer=self.assignment,
                        below=max(0.0, 1 - self.hysteresis) * current.makespan_s if worth else None)
        except ConfigError as e:  # beliefs that price every plan at inf (an absurd report): the cuts in force
            # still fit, and a sane measurement is believed at once (a jump); before, the run ended here
            why = f"{e.what} ({self.time_limit:g} s)" if isinstance(e, OutOfTime) else str(e)  # no CLI's flags
            return self._record(round, (), current.makespan_s, current.makespan_s, 0.0, f"no plan: {why}")
        if sol.kept:
            return self._record(round, (), current.makespan_s, current.makespan_s, 0.0,
                                f"every plan's makespan is within the hysteresis ({100 * self.hysteresis:.4g}%) "
                                "of that of the cuts in force")
        target = sol.assignment
        moves = {n: c for n, c in target.items() if c != self.assignment[n]}
        if not moves:  # "optimal" only where proven (before: said too of the cuts a solve out of time kept)
            limit = "" if self.time_limit is None else f" in the time limit ({self.time_limit:g} s)"
            why = ("already optimal" if sol.gap <= self.gap else
                   f"no faster plan found{limit}; one up to {100 * sol.gap:.3g}% faster is not ruled out")
            return self._record(round, (), current.makespan_s, current.makespan_s, 0.0, why)
        new, J_new, M_new, M1_new = self._pay_off(moves, left)
        # cuts that overflow a tier's memory cannot stay, whatever moving costs (given ones: a resumed run's,
        # whose nodes or pricing changed); before, the feasible optimum was rarely faster and they stayed for good
        J_keep = left * current.makespan_s if current.feasible else math.inf
        if not new:
            return self._record(round, (), current.makespan_s, current.makespan_s, 0.0,
                                "no move pays for moving its weights")
        if not (J_new < J_keep and (J_keep == math.inf or J_keep - J_new > self.hysteresis * J_keep)):
            # (cuts believed to take forever go: inf - J_new <= h * inf read as within the hysteresis)
            return self._record(round, (), current.makespan_s, current.makespan_s, 0.0,
                                f"gain {J_keep - J_new:.3g} s over {left} round(s) is within the hysteresis")
        self.assignment.update(new)
        why = (f"gain {J_keep - J_new:.3g} s over {left} round(s)" if current.feasible else
               f"the cuts in force do not fit: {_first(current.violations)}")
        return self._record(round, tuple(sorted(new)), current.makespan_s, M_new, M1_new - M_new, why)

    def _pay_off(self, moves: dict[str, Cuts], left: int) -> tuple[dict[str, Cuts], float, float, float]:
        """Undo moves that do not lower J = M1 + (left - 1) M; returns the moves kept and J, M, M1."""
        sc = self.belief
        n = len(sc.clients)
        idx = {c.name: i for i, c in enumerate(sc.clients)}
        R = len(sc.capacities)
        S = sc.tiers - 1
        T = np.zeros(n)
        mv = np.zeros(n)
        load = np.zeros((n, R))
        mem = np.zeros((n, S))
        act = np.zeros((n, S))
        cuts = np.zeros((n, S + sc.u_shape), dtype=np.int64)
        on_device = np.ones(n, dtype=bool)  # its device holds its share (current cuts may not: given ones)
        Row = tuple[float, float, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]
        rows: dict[tuple[str, Cuts], Row] = {}

        def row(name: str, c: Cuts) -> Row:
            if (name, c) not in rows:
                cl = sc.clients[idx[name]]
                t = option_table(sc, cl, np.asarray([c]))
                m = move_cost(sc, cl, self.assignment[name], c)
                rows[(name, c)] = (float(t.round_s[0]), m, t.shared_load[0] / sc.capacities, t.memory[0, 1:],
                                   t.act_memory[0, 1:], np.asarray(c), bool(t.fits_device[0]))
            return rows[(name, c)]

        def put(i: int, r: Row) -> None:
            T[i], mv[i], load[i], mem[i], act[i], cuts[i], on_device[i] = r

        plan = {c.name: moves.get(c.name, self.assignment[c.name]) for c in sc.clients}
        for name, c in plan.items():
            put(idx[name], row(name, c))
        serial = sc.serial_resource

        def J() -> tuple[float, float, float]:
            shared = load.sum(axis=0)
            M = max(float(T.max()), float(shared.max()) if R else 0.0)
            if sc.in_turn and serial is not None:  # clients in turn (sl, sflv2): a move delays all after it
                shared[serial] += mv.sum()
            M1 = max(float((T + mv).max()), float(shared.max()) if R else 0.0)
            fits = bool(on_device.all() and (server_memory(sc, cuts, mem, act) <= sc.memory_caps).all())
            return (M1 + (left - 1) * M if fits else np.inf), M, M1

        best = J()
        for name in sorted(moves, key=lambda k: -row(k, moves[k])[1]):
            i = idx[name]
            saved = (T[i], mv[i], load[i].copy(), mem[i].copy(), act[i].copy(), cuts[i].copy(), on_device[i])
            put(i, row(name, self.assignment[name]))
            trial = J()
            if trial[0] <= best[0]:
                best = trial
                plan[name] = self.assignment[name]
            else:
                put(i, saved)
        kept = {k: v for k, v in plan.items() if v != self.assignment[k]}
        if kept:  # price the kept plan with the cost model itself (exact sums)
            cost = evaluate(sc, plan)
            first = evaluate(sc, plan, extra_s={k: move_cost(sc, sc.clients[idx[k]], self.assignment[k], v)
                                                for k, v in kept.items()})
            if not cost.feasible:
                return {}, np.inf, np.inf, np.inf
            return kept, first.makespan_s + (left - 1) * cost.makespan_s, cost.makespan_s, first.makespan_s
        return {}, best[0], best[1], best[2]

    def _record(self, round: int, moved: tuple[str, ...], before: float, after: float, move_s: float,
                reason: str) -> Decision:
        d = Decision(round, dict(self.assignment), moved, before, after, move_s, reason)
        self.history.append(d)
        del self.history[:-HISTORY]  # a long run of a large fleet must not grow in memory round after round
        return d
