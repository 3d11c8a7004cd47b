"""What a solve answers: an assignment priced by the cost model, or a refusal that says why there is none.

One place for the refusals every policy shares (a device no cut fits, server tiers no assignment fits, an
assignment that never ends as priced, a time limit spent), so ``solve``, brute force and the baselines word
them alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfed.cost.model import Cuts, RoundCost, Scenario
from splitfed.errors import ConfigError
from splitfed.units import mib_pair, mib_text


@dataclass(frozen=True)
class Solution:
    """An assignment, priced by the cost model, and how it was found."""

    method: str
    cost: RoundCost
    solve_s: float
    optimal: bool
    note: str = ""
    gap: float = 0.0  # proven relative optimality gap (0 for exhaustive; unknown -> 0 for policies)
    kept: bool = False  # solve(below=): no assignment is that fast; these are the preferred cuts, not searched

    @property
    def makespan_s(self) -> float:
        return self.cost.makespan_s

    @property
    def assignment(self) -> dict[str, Cuts]:
        return self.cost.assignment()

    def to_dict(self) -> dict:
        return {"method": self.method, "optimal": self.optimal, "gap": self.gap, "solve_s": self.solve_s,
                "note": self.note,
                **self.cost.to_dict()}


def device_infeasible(sc: Scenario, members: list[int], t_mem: np.ndarray, options: np.ndarray) -> ConfigError:
    """The first of ``members`` (devices no cut fits) named with its numbers, the others counted (named, if few)."""
    c = sc.clients[members[0]]
    best = int(np.argmin(t_mem))
    others = [sc.clients[i].name for i in members[1:]]
    more = "" if not others else (f" (and {', '.join(map(repr, others))})" if len(others) <= 3
                                  else f" (and {len(others)} more)")
    entry = f" (fleet entry {c.kind!r})" if c.kind and c.kind != c.name else ""  # simulate names clients by id
    has, need = mib_pair(c.device.memory, t_mem[best])
    return ConfigError(
        f"device {c.name!r}{entry}{more} cannot train any legal cut of {sc.profile.model} at batch {sc.batch}: "
        f"its memory is {has} and the smallest device share needs {need} (cuts {','.join(map(str, options[best]))})")


class OutOfTime(ConfigError):
    """A solve's time limit ran out before it had an answer. The message ends with what ``splitfed optimize``
    offers (its flags); ``what`` is what happened alone, for a caller that offers its own (the adaptive policy:
    its ``solve-time-limit-s``; before, a simulation was told to raise ``--time-limit``, a flag it has not)."""

    def __init__(self, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.what = what or message


class PricingOutOfTime(OutOfTime):
    """:func:`pricing_out_of_time`'s: a search after the makespan's (the tie that moves least) gives up on it alone."""


def pricing_out_of_time(sc: Scenario, done: str) -> ConfigError:
    """The refusal when the time limit runs out while the fleet's options are priced, before any MILP."""
    what = (f"the time limit ran out while pricing the cuts of the {len(sc.clients):,} clients of "
            f"{sc.profile.model} ({done}), before any MILP")
    return PricingOutOfTime(f"{what}: raise it (--time-limit), or price a policy that needs no MILP: --greedy", what)


def caps_text(sc: Scenario) -> str:
    return ", ".join(f"{n} {mib_text(m)}" for n, m in zip(sc.tier_names[1:], sc.memory_caps, strict=True))


def shared_infeasible(sc: Scenario, why: str = "") -> ConfigError:
    """The refusal when no assignment fits the server tiers; ``why``: the tiers that tell so, where some do."""
    return ConfigError(f"no assignment fits: the server tiers ({caps_text(sc)}) cannot hold the segments of "
                       + ("the 1 client" if len(sc.clients) == 1 else f"all {len(sc.clients)} clients")
                       + f" of {sc.profile.model} at batch {sc.batch}, whatever the cuts" + (f"; {why}" if why else ""))


def endless(sc: Scenario, stuck: list[int]) -> ConfigError:
    """Some assignment fits memory, but every one that does takes infinitely long as priced (beliefs of a
    rate near 0); ``stuck``: the clients every cut of which is priced infinite."""
    names = ", ".join(repr(sc.clients[i].name) for i in stuck[:3]) + \
        (f" and {len(stuck) - 3} more" if len(stuck) > 3 else "")
    why = f"every cut of client(s) {names} is priced infinite" if stuck else \
        "the cuts priced finite overflow those tiers"
    return ConfigError(f"no assignment ends: every assignment of the {len(sc.clients)} clients of "
                       f"{sc.profile.model} at batch {sc.batch} that fits the server tiers ({caps_text(sc)}) "
                       f"takes infinitely long as priced ({why})")


