"""Accuracy vs bytes on the wire, for each link codec (none, fp16, int8, top-k).

Compression acts on the boundary activations going up and their gradients
coming down, on every link of the chain (:mod:`splitfed.transport.compress`),
so it trades bytes for noise in training. A case is one codec for every link:
the bytes counted are the devices' (a codec per link, ``none,int8``, would
show only its first). Each codec trains the same run; the
figure is test accuracy against the cumulative megabytes the devices sent and
received, and the numbers are each codec's bytes, accuracy, and bytes until
``target_accuracy`` (also relative to no compression).
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


@dataclass(frozen=True)
class Config(TrainingConfig):
    codecs: tuple[str, ...] = ("none", "fp16", "int8", "topk:0.1")
    target_accuracy: float = 0.9

    def __post_init__(self) -> None:
        if "compress" in self.simulate:  # run() sets each case's codec: one here would be dropped unseen
            raise ValueError("[simulate] compress: this experiment trains one run per entry of codecs, each with "
                             "its codec; list the codecs in codecs and remove the key")
        super().__post_init__()
        if not self.codecs:
            raise ValueError("codecs must name at least one codec")
        check_target(self.target_accuracy)


def bytes_to_target(run: Any, target: float) -> int | None:
    """Bytes on the wire (up + down) until the global model first reaches ``target``."""
    for b, r in zip(run.cum_bytes, run.rounds, strict=True):
        if r.accuracy >= target:
            return int(b)
    return None


def run(cfg: Config, out: Path) -> dict[str, Any]:
    from splitfed.cost.wire import link_codecs
    from splitfed.errors import ConfigError

    base = cfg.settings()
    seen: dict[str, str] = {}  # each codec as the run spells it ("INT8" is "int8") -> the entry that gave it
    for c in cfg.codecs:  # a bad codec name fails before any training
        link_codecs(c, base.tiers - 1, what="codecs entry")
        if "," in c:
            raise ConfigError(f"codecs entry {c!r}: one codec per case, for every link: this experiment counts the "
                              "devices' bytes, which a codec per link would show only the first of")
        codec = base.with_(compress=c).compress
        if codec in seen:  # named as written: the runs' labels, both "int8", would not say which entry it is
            was = f" (as {seen[codec]!r})" if seen[codec] != c else ""
            raise ConfigError(f"codecs entry {c!r} is given twice{was}: list it once")
        seen[codec] = c
    codecs = list(seen)
    runs = run_cases([(c, base.with_(compress=c)) for c in codecs], out, cfg.backend)
    figures = report_runs(runs, out, cfg.target_accuracy, title="Link compression: accuracy vs bytes")
    records = []
    ref = None
    for c, r in zip(codecs, runs, strict=True):
        total = sum(x.bytes_total for x in r.rounds)
        rec = {**run_record(r, cfg.target_accuracy), "codec": c, "bytes_total": total,
               "bytes_to_target": bytes_to_target(r, cfg.target_accuracy)}
        if c == "none":
            ref = rec
        records.append(rec)
    for rec in records:
        rec["bytes_vs_none"] = rec["bytes_total"] / ref["bytes_total"] if ref and ref["bytes_total"] else None
        rec["accuracy_vs_none"] = rec["final_accuracy"] - ref["final_accuracy"] if ref else None
        print(f"  {rec['codec']:<10} {rec['bytes_total'] / 1e6:8.2f} MB"
              + (f" ({rec['bytes_vs_none']:.2f}x of none)" if rec["bytes_vs_none"] is not None else "")
              + f"  final accuracy {rec['final_accuracy']:.4f}")
    write_results(out, records)
    return {"codecs": records, "figures": figures}


def cli(argv: list[str] | None = None) -> int:
    """``python -m simulations.compression [--config FILE] [--out DIR]``."""
    return main("compression", Config, run, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(cli())
