"""A device slows down mid-training: do the cuts follow it, and does the round time recover?

The fleet file declares the drift (``[[device.drift]]``: from round r on, a
device class's FLOP/s or bandwidth is scaled or set). Each policy trains the
same run; the figures are the cuts over rounds (client x round heatmap, one per
policy) and the simulated makespan per round with each drift round marked. The
numbers: each policy's mean makespan before the drift, right after it, and over
the last rounds, and for the adaptive run which clients' cuts moved, and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from simulations.common import (
    TrainingConfig,
    main,
    policy_record,
    recorded,
    report_runs,
    resolve_policies,
    run_cases,
    shown_runs,
    trained_cases,
    write_results,
)
from splitfed.errors import ConfigError
from splitfed.sim.inprocess import sim_clients


@dataclass(frozen=True)
class Config(TrainingConfig):
    policies: tuple[str, ...] = ("static:best", "adaptive")
    tail_rounds: int = 3  # "after recovery": the mean makespan of the last this many rounds, all after the drift round

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.policies:
            raise ValueError("policies must name at least one --cuts value")
        if self.tail_rounds < 1:
            raise ValueError("tail_rounds must be >= 1")


def drift_rounds(settings: Any) -> dict[str, list[int]]:
    """Client id -> rounds at which its device drifts, for the devices this run draws."""
    from splitfed.sim.clock import fleet_for

    fleet = fleet_for(settings)
    out = {}
    for c in sim_clients(settings, fleet):
        rounds = sorted({d.round for d in fleet.client(c.profile).drift})
        if rounds:
            out[c.client_id] = rounds
    return out


def moves(run: Any) -> list[dict[str, Any]]:
    """Every change of a client's cuts between consecutive rounds."""
    out = []
    for prev, cur in zip(run.rounds, run.rounds[1:], strict=False):
        for cid, cuts in cur.cuts.items():
            if cid in prev.cuts and prev.cuts[cid] != cuts:
                out.append({"client": cid, "class": run.class_of(cid), "round": cur.round,
                            "from": list(prev.cuts[cid]), "to": list(cuts)})
    return out


def run(cfg: Config, out: Path) -> dict[str, Any]:
    from splitfed.report.plots import makespan_plot

    base = cfg.settings()
    drifting = drift_rounds(base)
    if not drifting:
        raise ConfigError(f"no client of this run drifts: fleet {base.fleet!r} declares no [[device.drift]] for "
                          f"the {base.clients} devices drawn with seed {base.seed} (add drift, raise clients, "
                          "or change the seed)")
    first = min(r for rs in drifting.values() for r in rs)
    if first > base.rounds:
        raise ConfigError(f"the drift starts at round {first}, after the run's {base.rounds} rounds")
    if cfg.tail_rounds > base.rounds - first:  # the tail would hold the drift round (or rounds before it)
        raise ConfigError(f"tail_rounds = {cfg.tail_rounds}: the run has {base.rounds - first} round(s) after the "
                          f"drift round {first} to average as 'after recovery'; lower tail_rounds or raise rounds")
    entries = resolve_policies(cfg.policies, base)
    cases = trained_cases(entries)
    trained = dict(zip((label for label, _ in cases), run_cases(cases, out, cfg.backend), strict=True))
    runs = shown_runs(entries, trained)  # each run once: policies of the same cuts share one
    figures = report_runs(runs, out, title="Drift: a device slows down mid-training")
    # every drift round the run reaches, of every drawn client (a fleet may declare several): before, only the first
    marked = sorted({r for rs in drifting.values() for r in rs if r <= base.rounds})
    figures["makespan with drift"] = recorded(makespan_plot(
        runs, out / "makespan_drift.png", mark_round=marked,
        title=f"Simulated round time; device(s) {', '.join(sorted(drifting))} change at round"
              f"{'s' if len(marked) > 1 else ''} {', '.join(map(str, marked))}"))
    records = []
    wide = max([24, *(len(e.label) for e in entries)])  # one column however long a label ("adaptive hysteresis=0.5")
    for e in entries:
        r = trained[e.trained_as]
        ms = {x.round: x.sim_round_s for x in r.rounds}
        before = [v for k, v in ms.items() if k < first]
        after = [v for k, v in ms.items() if k > first]
        rec = {**policy_record(e, r),
               "makespan_before_s": fmean(before) if before else None,
               "makespan_drift_round_s": ms.get(first),
               "makespan_tail_s": fmean(after[-cfg.tail_rounds:]) if after else None,
               "moves": moves(r)}
        records.append(rec)
        print(f"  {e.label:<{wide}} makespan before {_s(rec['makespan_before_s'])}, at drift {_s(rec['makespan_drift_round_s'])}, "
              f"last {cfg.tail_rounds} rounds {_s(rec['makespan_tail_s'])}; {len(rec['moves'])} cut move(s)"
              f"{_from(rec['moves'])}")
    write_results(out, records, series=("moves",))
    return {"drift_round": first, "drifting_clients": drifting, "policies": records, "figures": figures}


def _from(moved: list[dict[str, Any]]) -> str:
    """When the moved cuts took effect (", in force from round 7"; "" for none): how soon a policy followed."""
    rounds = sorted({m["round"] for m in moved})
    return f", in force from round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))}" if rounds else ""


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}s"


def cli(argv: list[str] | None = None) -> int:
    """``python -m simulations.drift [--config FILE] [--out DIR]``."""
    return main("drift", Config, run, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(cli())
