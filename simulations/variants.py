"""Split learning (sl) vs SplitFed v1 vs SplitFed v2 vs FedAvg of the unsplit model.

Same clients, data, cuts and seeds; per round the test accuracy and the
simulated round time. FedAvg is SplitFed v1 with every block on the device
(cuts at the model's end): by the engine's law it is the same computation as
FedAvg of the unsplit model, and its clock prices no activation traffic, only
the weight exchange.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulations.common import (
    TrainingConfig,
    check_target,
    main,
    report_runs,
    run_cases,
    run_record,
    write_results,
)

VARIANTS = ("sl", "sflv1", "sflv2", "fedavg")


@dataclass(frozen=True)
class Config(TrainingConfig):
    variants: tuple[str, ...] = VARIANTS
    target_accuracy: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise ValueError(f"variants must be some of {', '.join(VARIANTS)}, got {list(self.variants)}")
        check_target(self.target_accuracy)


def variant_settings(name: str, base: Any) -> Any:
    """The run settings of one variant (``fedavg``: sflv1 with all blocks on the device)."""
    if name != "fedavg":
        return base.with_(mode=name)
    from splitfed.engine import template

    n = template.num_blocks(base.spec)
    cuts = ",".join([str(n)] * (base.tiers - 1 + (1 if base.u_shape else 0)))
    return base.with_(mode="sflv1", cuts=f"static:{cuts}")


def run(cfg: Config, out: Path) -> dict[str, Any]:
    base = cfg.settings()
    cases = [(v, variant_settings(v, base)) for v in cfg.variants]
    runs = run_cases(cases, out, cfg.backend)
    figures = report_runs(runs, out, cfg.target_accuracy, title="Variants: sl, SplitFed v1/v2, FedAvg")
    records = [{**run_record(r, cfg.target_accuracy), "variant": v, "mode": s.mode, "cuts": s.cuts}
               for (v, s), r in zip(cases, runs, strict=True)]
    for rec in records:
        print(f"  {rec['variant']:<7} final accuracy {rec['final_accuracy']:.4f}  "
              f"simulated time {rec['sim_time_s']:.2f}s  activations {(rec['bytes_up'] + rec['bytes_down']) / 1e6:.2f} MB"
              f"  weights {rec['weight_bytes'] / 1e6:.2f} MB")
    write_results(out, records)
    return {"variants": records, "figures": figures}


def cli(argv: list[str] | None = None) -> int:
    """``python -m simulations.variants [--config FILE] [--out DIR]``."""
    return main("variants", Config, run, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(cli())
