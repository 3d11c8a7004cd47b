"""``splitfed simulate``: a heterogeneous fleet of virtual clients trained split across device, edge and cloud.

Settings come from defaults, then ``--config FILE.toml`` (keys as in
``RunSettings``, hyphens or underscores, optionally under ``[simulate]``), then
the flags given here. ``--resume DIR`` continues the run in DIR from its last
checkpoint with that run's settings (flags may only change the number of rounds
and other settings that do not change the math).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitfed.commands._args import batch_size, positive_int
from splitfed.engine.modes import MODES
from splitfed.errors import SplitfedError
from splitfed.jsonio import dumps

if TYPE_CHECKING:
    from splitfed.flower.checkpoint import Checkpoint
    from splitfed.flower.config import RunSettings

# flag -> RunSettings field (flags left out keep the config file's or default value)
_FIELDS = ("clients", "rounds", "mode", "tiers", "cuts", "hysteresis", "measurement_weight", "regime_jump",
           "solve_time_limit_s", "dataset", "partition", "seed", "model", "fleet",
           "batch_size", "local_epochs", "optimizer", "lr", "momentum", "weight_decay", "u_shape", "compress",
           "min_clients", "fraction", "min_device_blocks", "vocab", "model_kwargs", "round_timeout_s",
           "call_timeout_s", "tier_torch_device", "out", "overwrite")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run a fleet of virtual clients in Flower's simulation engine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE.toml", help="settings file")
    p.add_argument("--clients", type=positive_int,
                   help="virtual clients (default 4), dealt from the fleet's devices: as many as it lists train "
                        "the fleet as listed (as splitfed optimize --fleet prices it), fewer a subset drawn by "
                        "--seed, more each device as often as it goes in and a subset for the rest; the run's "
                        "first lines name them")
    p.add_argument("--rounds", type=positive_int, help="federated rounds (default 3)")
    p.add_argument("--mode", choices=MODES, help="sl | sflv1 | sflv2 (default sflv1)")
    p.add_argument("--tiers", type=int, choices=(2, 3), help="device + 1 or 2 server tiers (default 3)")
    p.add_argument("--cuts", help="static:K1,K2 (several: static:1,3/2,5 dealt out by client) | adaptive | "
                                  "greedy (default static:2,5; on 2 tiers static:2; in U-shape on 3 tiers "
                                  "static:2,5,6)")
    p.add_argument("--hysteresis", type=float, metavar="H",
                   help="--cuts adaptive moves cuts only when the predicted gain over the rounds left, moving the "
                        "weights paid, is more than H of their time (default 0.05; 0: any gain)")
    p.add_argument("--measurement-weight", type=float, metavar="W",
                   help="--cuts adaptive believes W of each round's measured speed, bandwidth and round trip, and "
                        "keeps 1-W of what it believed (default 0.5; 1: the last round alone)")
    p.add_argument("--regime-jump", type=float, metavar="X",
                   help="--cuts adaptive believes at once a measurement more than X times above or below its "
                        "belief: a new regime, not noise (default 3; 1e9: all but never)")
    p.add_argument("--solve-time-limit-s", type=float, metavar="S",
                   help="how long each of --cuts adaptive's solves may take, its first plan and each decision "
                        "between rounds; past it, the best plan found (default 30)")
    p.add_argument("--dataset", help="digits | synthetic | mnist:PATH | cifar10:PATH | npz:FILE (default digits)")
    p.add_argument("--partition", help="iid | dirichlet:ALPHA (default iid)")
    p.add_argument("--seed", type=int)
    p.add_argument("--model", help="zoo name (mlp, cnn, vgg11, resnet18, mobilenetv2, transformer) or "
                                   "module.path:factory (default cnn)")
    p.add_argument("--fleet", help="fleet file or shipped fleet name the --clients devices are dealt from "
                                   "(default reference)")
    p.add_argument("--batch-size", type=batch_size)
    p.add_argument("--local-epochs", type=positive_int)
    p.add_argument("--optimizer", choices=("sgd", "adam"), help="every tier's optimizer (default sgd)")
    p.add_argument("--lr", type=float, help="learning rate (default 0.05)")
    p.add_argument("--momentum", type=float, help="SGD momentum (default 0.9; Adam keeps its own betas, 0.9 and 0.999)")
    p.add_argument("--weight-decay", type=float, help="(default 0)")
    p.add_argument("--u-shape", action=argparse.BooleanOptionalAction, default=None,
                   help="the device also holds the last blocks and the loss: labels never leave it (a static cut "
                        "vector then ends with the cut where the device's tail starts: static:1,3,6 on 3 tiers)")
    p.add_argument("--compress", metavar="CODEC", help="activations and gradients on the wire: none | fp16 | "
                                                        "int8 | topk:F (F >= 0.001) for every link (default none), or one per "
                                                        "link, the device's first: none,int8 compresses only "
                                                        "edge -> cloud")
    p.add_argument("--min-clients", type=int, help="fewest clients that must finish a round (default 1)")
    p.add_argument("--fraction", type=float,
                   help="share of clients sampled per round (default 1; --cuts greedy and adaptive plan for every "
                        "client in every round and refuse one below 1)")
    p.add_argument("--min-device-blocks", type=int, metavar="K",
                   help="leading blocks every device keeps, whatever the policy (default 0; 1 or more: raw inputs "
                        "never leave a device)")
    p.add_argument("--vocab", type=int, metavar="N",
                   help="a module:factory model takes integer tokens below N (an nn.Embedding first; default 0: "
                        "floats, integer inputs are read as numbers)")
    p.add_argument("--model-kwargs", metavar="JSON",
                   help='the model factory\'s keyword arguments, a JSON object (e.g. \'{"width": 32}\'; in a config '
                        'file, a table: model-kwargs = { width = 32 })')
    p.add_argument("--round-timeout-s", type=float, metavar="S",
                   help="how long a round waits for its clients (default 600)")
    p.add_argument("--call-timeout-s", type=float, metavar="S",
                   help="how long one call of a device to its edge may take, retries included (default 60; "
                        "at most the round timeout)")
    p.add_argument("--tier-torch-device", metavar="DEV", help="where the edge and cloud tiers it starts compute: "
                                                               "cpu | cuda | cuda:N (default cpu)")
    p.add_argument("--out", metavar="DIR", help="run folder (default runs/sim-<time>)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    again.add_argument("--overwrite", action="store_true", default=None,
                       help="replace the run the --out folder holds (without it, such a folder is refused)")
    p.add_argument("--verbose", action="store_true", help="show Flower's and Ray's logs")
    p.add_argument("--json", action="store_true",
                   help="print only the summary, one JSON object, on stdout; the progress lines go to stderr")
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Defaults <- checkpoint (--resume) <- config file <- flags. A default out is a name, no folder: the run
    that uses it makes it."""
    from splitfed.flower import runfolder

    settings = _settings_and_checkpoint(args)[0]
    runfolder.unmake(settings.out)
    return settings


def _settings_and_checkpoint(args: argparse.Namespace) -> tuple[RunSettings, Checkpoint | None]:
    """:func:`settings_from_args`, and the checkpoint ``--resume`` read for them (None without): the resume
    hands it on rather than read and check it again."""
    from splitfed.errors import ConfigError
    from splitfed.flower import checkpoint, runfolder
    from splitfed.flower.config import (
        RunSettings,
        absolute_paths,
        dataset_beside,
        default_cuts,
        flag,
        fleet_beside,
        toml_table,
        unknown_model,
    )

    if getattr(args, "out", None) is not None and not args.out.strip():
        raise ConfigError("--out must name a folder (a run writes its metrics and checkpoint there)")
    layers: list[tuple[dict[str, Any], str | None]] = []
    made = ""  # the default folder made for this run
    if args.resume:  # a folder another run holds is in use, whatever its checkpoint says (a run still starting has none)
        runfolder.check_free(args.resume)
    held = checkpoint.resumed(args.resume, getattr(args, "out", None)) if args.resume else None
    if held is not None:
        # the stopped run's tier processes are gone: this run starts its own (or --config names them)
        saved = {**held.settings, "tier_addresses": "", "coordinator_token_file": "", "overwrite": False}
        layers.append((saved, args.resume))
    if args.config:
        table = toml_table(args.config)
        if flag(table, "resume", args.config):  # --resume takes its settings from the run
            raise ConfigError(f"{args.config}: resume is for a run config (flwr run); to continue a run here, drop "
                              "resume and give --resume FOLDER")
        layers.append((table, args.config))
    flags = {f: getattr(args, f) for f in _FIELDS if getattr(args, f, None) is not None}
    unknown_model([*layers, (flags, "command line")])  # at once: what checks the rest imports torch (seconds)
    if args.config:
        if isinstance(table.get("fleet"), str) and getattr(args, "fleet", None) is None:  # a fleet file beside it
            table = {**table, "fleet": fleet_beside(table["fleet"], Path(args.config).parent, args.config)}
        if "dataset" in table and getattr(args, "dataset", None) is None:  # so is a dataset's file or folder
            table = {**table, "dataset": dataset_beside(table["dataset"], Path(args.config).parent)}
        layers[-1] = (table, args.config)
    layers.append((flags, "command line"))
    if args.resume:
        layers.append(({"out": args.resume, "resume": True}, None))
    elif not any(values.get("out") for values, _ in layers):
        made = _fresh_folder(Path("runs") / time.strftime("sim-%Y%m%d-%H%M%S"))
        layers.append(({"out": made}, None))
    try:
        settings = RunSettings.layered(layers, here=True)  # checked as a whole: a flag may make right what the file alone is not
        cuts = default_cuts(settings.tiers, settings.u_shape)  # the default's are for 3 tiers: 2, or a U-shape, take theirs
        if cuts != settings.cuts and not any("cuts" in values for values, _ in layers):
            settings = settings.with_(cuts=cuts)
        # a new run records where its files are, for a --resume from any folder; a resume's given paths are made
        # absolute alike, so that the same file named relative or absolute is the same setting
        return absolute_paths(settings), held
    except BaseException:
        runfolder.unmake(made)  # refused: the default folder made for it goes
        raise


def _fresh_folder(stem: Path) -> str:
    """``stem``, or ``stem-2``, ``stem-3``..., made now (:func:`~splitfed.flower.runfolder.fresh`): two runs
    started within one second get folders of their own."""
    from splitfed.flower import runfolder

    return str(runfolder.fresh(stem))


def run(args: argparse.Namespace) -> int:
    from splitfed.sim.ray_start import check_socket_room

    if not args.resume:  # a run Ray cannot start for is refused first, not after seconds of imports (torch, Ray)
        check_socket_room()  # (a resume may train nothing, needing no Ray: the runner checks it before Ray's start)
    from splitfed.flower import runfolder

    settings, held = _settings_and_checkpoint(args)  # a resume reads and checks its checkpoint here, once
    try:  # the runner imports torch: after the settings, so that a bad --model is refused at once
        from splitfed.sim.runner import simulate, validate

        validate(settings, held)
        # --json: stdout is the summary alone (``| jq``); the run's lines, and any a library prints, go to stderr
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            try:
                summary = _finished(settings, held) or simulate(settings, verbose=args.verbose, resumed=held)
            except (SplitfedError, KeyboardInterrupt) as e:  # the run had started: say what is kept and how to go on
                e.hint = _continue_hint(settings, stopped=isinstance(e, KeyboardInterrupt))  # type: ignore[union-attr]
                raise
    finally:  # a default folder made for a run refused before it held it goes (one it held, it tidied itself)
        runfolder.unmake(settings.out)
    if args.json:
        print(dumps(summary, indent=2, sort_keys=True))
        return 0
    try:
        figures, undrawn = _report(settings.out), ""
    except OSError as e:  # a full disk: the figures are not the run, which is done; they can be drawn later
        figures, undrawn = 0, _undrawn(settings.out, e)
    acc = summary.get("final_accuracy")
    acc_text = f"{acc:.4f}" if acc is not None else "n/a"
    print(f"\ndone: {summary.get('rounds', 0)} round(s), final accuracy {acc_text}")
    print(f"run folder: {settings.out} ({', '.join(_kept(settings.out, figures))})")
    if undrawn:
        print(undrawn, file=sys.stderr)
    return 0


def _kept(out: str, figures: int) -> list[str]:
    """What the run folder holds now (a resume that trained nothing wrote no summary): the line's list."""
    from splitfed.flower.checkpoint import FILENAME
    from splitfed.flower.metrics import METRICS, SUMMARY

    there = [name for name in (METRICS, SUMMARY) if (Path(out) / name).is_file()]
    return [*there, *(["checkpoint"] if (Path(out) / FILENAME).is_file() else []), f"{figures} figure(s)"]


def _undrawn(out: str, error: OSError) -> str:
    """What a run whose end-of-run figures could not be drawn says. A failed drawing leaves the folder as it
    was (:func:`~splitfed.report.plots.standard_plots`): the figures there are of an earlier part of the run
    (a resume's), removed rather than shown as this run's."""
    from splitfed.report.plots import standard_plot_files
    from splitfed.report.runs import load_run

    removed = 0
    with contextlib.suppress(OSError):
        for p in standard_plot_files([load_run(Path(out), label="run")], out):
            if p.is_file():
                p.unlink()
                removed += 1
    gone = f"; the {removed} figure(s) drawn there before are removed" if removed else ""
    return (f"the figures were not drawn ({error}){gone}; draw them with: splitfed report "
            f"{shlex.quote(out)}")


def _finished(settings: RunSettings, held: Checkpoint | None = None) -> dict[str, Any] | None:
    """A resumed run whose checkpoint already holds what is asked: its summary, with nothing started."""
    from splitfed.flower import runfolder

    return runfolder.nothing_to_do(settings.out, settings.rounds, settings.out, held) if settings.resume else None


def _continue_hint(settings: RunSettings, stopped: bool = False) -> str:
    """How to continue a run that ended before its last round ("": nothing to say). A run ``stopped`` (Ctrl-C,
    SIGTERM) before any round was kept is started again; one that failed then would only fail again. One that
    kept its last round ended after it: stopped as it wound down (a signal that came late), it is whole; without
    its summary, a resume writes it and trains nothing."""
    from pathlib import Path

    from splitfed.flower import checkpoint
    from splitfed.flower.metrics import SUMMARY

    try:
        done, rounds = checkpoint.resume_point(settings.out, settings.rounds) if settings.out else (0, "")
    except SplitfedError:
        return ""
    if not done:
        return f"no round was kept in {settings.out}: run the same command again to start over" if stopped else ""
    if done >= settings.rounds:
        if not (Path(settings.out) / SUMMARY).is_file():
            return (f"all {done} round(s) are kept in {settings.out}, without its summary; write it with: "
                    f"splitfed simulate --resume {shlex.quote(settings.out)}{rounds}")
        return (f"the run had finished: its {done} round(s) are in {settings.out} (see: splitfed report "
                f"{shlex.quote(settings.out)})") if stopped else ""
    return (f"round {done} of {settings.rounds} is kept in {settings.out}; continue with: "
            f"splitfed simulate --resume {shlex.quote(settings.out)}{rounds}")


def _report(out: str) -> int:
    """The end-of-run table in the terminal and the standard figures in the run folder: said before they are
    drawn, which takes seconds (matplotlib's import, then the figures), after the tables, which take none."""
    from pathlib import Path

    from splitfed.report.runs import load_run
    from splitfed.report.table import class_table, round_table

    run = load_run(Path(out), label="run")
    if not run.rounds:
        return 0
    print()
    print(round_table(run))
    if run.clients:
        print()
        print(class_table(run))
    print("\ndrawing the figures...")
    from splitfed.report.plots import standard_plots

    return len(standard_plots([run], Path(out)))
