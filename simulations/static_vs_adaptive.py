"""Accuracy vs simulated wall-clock time: static cuts, per-device greedy, and adaptive cuts.

Every policy trains the same model on the same clients, data and seeds; cuts
do not change the math, so the accuracy per round is the same and what differs
is how long each round takes on the fleet's devices (the simulated clock, i.e.
the cost model's makespan). The headline is the simulated time until the
global model first reaches ``target_accuracy``, per policy, and the ratio
*best static / adaptive*: best static is the fastest of the static policies run
(``static:best`` is the single cut vector the cost model rates best for these
clients). That premise is checked, not assumed: the headline's ``accuracy_gap`` is
the largest difference in test accuracy between two policies in any round (0:
the same curve; a lossy ``compress`` acts at the cuts and makes it more; ``null``
where one policy's run diverged in a round another's did not), and the script
says which. A policy whose cuts turn out to be another's (``static:best`` is a
listed ``static:K1,K2`` for this fleet) trains once, recorded under both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulations.common import (
    TrainingConfig,
    check_target,
    main,
    policy_record,
    report_runs,
    resolve_policies,
    run_cases,
    shown_runs,
    trained_cases,
    write_results,
)


@dataclass(frozen=True)
class Config(TrainingConfig):
    policies: tuple[str, ...] = ("static:best", "static:2,5", "greedy", "adaptive")
    target_accuracy: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        check_target(self.target_accuracy)
        if not self.policies:
            raise ValueError("policies must name at least one --cuts value")


def run(cfg: Config, out: Path) -> dict[str, Any]:
    base = cfg.settings()
    entries = resolve_policies(cfg.policies, base)
    cases = trained_cases(entries)
    trained = dict(zip((label for label, _ in cases), run_cases(cases, out, cfg.backend), strict=True))
    runs = shown_runs(entries, trained)  # each run once: policies of the same cuts share one
    figures = report_runs(runs, out, cfg.target_accuracy, title="Static vs adaptive cuts")
    records = [policy_record(e, trained[e.trained_as], cfg.target_accuracy) for e in entries]
    write_results(out, records)
    static = [r for r in records if r["cuts"].startswith("static:") and r["time_to_target_s"] is not None]
    best = min(static, key=lambda r: r["time_to_target_s"]) if static else None
    # the adaptive policy as it ships, else the first adaptive entry ("adaptive hysteresis=0.2" alone)
    adaptive = next((r for r in records if r["policy"] == "adaptive"),
                    next((r for r in records if r["cuts"] == "adaptive"), None))
    ratio = None
    if best and adaptive and adaptive["time_to_target_s"]:
        ratio = best["time_to_target_s"] / adaptive["time_to_target_s"]
    gap = accuracy_gap(runs)
    headline = {
        "target_accuracy": cfg.target_accuracy,
        "best_static": best["label"] if best else None,
        "best_static_time_to_target_s": best["time_to_target_s"] if best else None,
        "adaptive": adaptive["label"] if adaptive else None,
        "adaptive_time_to_target_s": adaptive["time_to_target_s"] if adaptive else None,
        "ratio_best_static_over_adaptive": ratio,
        "accuracy_gap": gap,
    }
    wide = max([28, *(len(r["label"]) for r in records)])  # one column however long a label
    for r in records:
        t, n = r["time_to_target_s"], r["rounds_to_target"]
        reached = "never" if t is None else f"{t:.2f} s (round {n})"
        print(f"  {r['label']:<{wide}} time to {cfg.target_accuracy:g}: {reached}")
    if ratio is not None and best is not None and adaptive is not None:
        print(f"  best static / {adaptive['label']} = {ratio:.2f}x ({best['label']})")
    elif adaptive and any(r["cuts"].startswith("static:") for r in records):
        never = ("neither a static policy nor adaptive" if best is None and adaptive["time_to_target_s"] is None
                 else "no static policy" if best is None else "adaptive never")
        print(f"  best static / adaptive: none ({never} reached {cfg.target_accuracy:g} in {base.rounds} round(s))")
    if len(runs) > 1:
        why = "" if base.compress == "none" else f" (compress={base.compress} acts at the cuts)"
        differs = ("one policy's run diverged (no accuracy) in a round another's did not" if math.isinf(gap)
                   else f"by up to {gap:.4f} between policies")
        print("  accuracy per round: the same under every policy" if gap == 0 else
              f"  accuracy per round differs {differs}{why}: the times to target compare different curves")
    return {"headline": headline, "policies": records, "figures": figures}


def accuracy_gap(runs: Sequence[Any]) -> float:
    """The largest spread of test accuracy between the runs in any one round: 0 when the cuts left the math
    alone (the premise of comparing times), more when they did not (a lossy codec acts at the cuts)."""
    by_round: dict[int, list[float]] = {}
    for run in runs:
        for r in run.rounds:
            by_round.setdefault(r.round, []).append(r.accuracy)
    return max((_spread(a) for a in by_round.values()), default=0.0)


def _spread(accuracies: Sequence[float]) -> float:
    """One round's spread: inf where a run diverged (no accuracy: NaN) and another did not, which ``max`` and
    ``min`` skipped or returned by its place (the curves read as "the same", or the gap as nan)."""
    known = [a for a in accuracies if not math.isnan(a)]
    if len(known) < len(accuracies):
        return math.inf if known else 0.0
    return max(known) - min(known)


def cli(argv: list[str] | None = None) -> int:
    """``python -m simulations.static_vs_adaptive [--config FILE] [--out DIR]``."""
    return main("static_vs_adaptive", Config, run, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(cli())
