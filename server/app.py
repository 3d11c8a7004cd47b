"""The SplitFed ServerApp (``server.app:app``): registration, rounds, evaluation, checkpoints.

One run, in order:

1. settings from the run config (``flwr run``) or from the caller
   (``splitfed simulate`` builds the app with :func:`build_app`);
   with ``resume`` the checkpoint in ``out`` gives the model and the round to
   continue from (and the settings that decide the math must match it);
2. the tier servers: the addresses in ``tier-addresses``, or edge and cloud
   processes this app starts on 127.0.0.1 (and stops at the end);
3. the query round: every node says which partition and device it has;
4. rounds through :class:`~server.strategy.SplitFedAvg`; after each, the
   global model is evaluated on held-out data, a metrics row is appended to
   ``out/metrics.jsonl`` and the checkpoint is replaced atomically;
5. ``out/summary.json``.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from server.strategy import RoundRecord, RunStopped, SplitFedAvg
from splitfed.data.datasets import dataset_digest
from splitfed.data.partition import parse_partition
from splitfed.engine.rounds import initial_state
from splitfed.errors import ConfigError
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.adaptive import make_predictor
from splitfed.flower.config import RunSettings, absolute_paths
from splitfed.flower.metrics import METRICS, MetricsWriter, check_rounds, run_rows, summarise
from splitfed.flower.policy import make_policy
from splitfed.flower.records import record_to_state, state_to_record
from splitfed.flower.workload import (
    RunDiverged,
    check_converging,
    evaluate,
    partitions_digest,
    test_data,
)
from splitfed.jsonio import dumps
from splitfed.models import rng
from splitfed.profile.fleet import DEALT, dealt_digest, fleet_digest
from splitfed.report.runs import natural_key
from splitfed.sim.clock import fleet_for, make_clock
from splitfed.sim.tiers import TierChain, check_restarted, tier_chain
from splitfed.transport.client import GrpcTierClient

Progress = Callable[[str], None]

# settings that may change between a run and its resumption (they do not change the math; a solve's time limit
# changes cuts only where it runs out, and then as the machine's speed does)
RESUMABLE = {"rounds", "out", "resume", "overwrite", "tier_addresses", "tier_torch_device", "round_timeout_s",
             "call_timeout_s", "node_wait_s", "run_name", "solve_time_limit_s",
             "tls_ca", "tls_cert", "tls_key", "token_file", "coordinator_token_file", "sim_clock"}


def build_app(settings: RunSettings | None = None, progress: Progress | None = None,
              stop: threading.Event | None = None,
              on_summary: Callable[[dict[str, Any]], None] | None = None,
              recorded_as: RunSettings | None = None,
              resumed: checkpoint.Checkpoint | None = None,
              reservation: runfolder.Reservation | None = None) -> ServerApp:
    """A ServerApp for ``settings``; without them it reads ``context.run_config`` (``flwr run``).

    ``stop`` ends the run between polls (Ctrl-C in ``splitfed simulate``);
    ``on_summary`` receives the run's summary (``run_simulation`` returns nothing); ``recorded_as``: the
    settings the summary and checkpoint record, when ``settings`` carry what only this process knows (the
    addresses and temporary token of tiers ``splitfed simulate`` started for the run); ``resumed``: the
    checkpoint the caller read for a resume, used unless the file has changed since (:func:`run`);
    ``reservation``: the caller's hold of the run folder (:func:`runfolder.reserve`), which the run takes over.
    """
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        s = settings or RunSettings.from_mapping(dict(context.run_config), source="run config")
        if settings is None:  # flwr run: said once, at its start (splitfed simulate says them before Ray starts)
            _fleet_notes(s, progress or _log)
        try:
            summary = run(grid, s, progress, stop, recorded_as=recorded_as, resumed=resumed, reservation=reservation)
        except RunStopped:
            if stop is not None and stop.is_set():
                return  # stopped by its caller, who knows why: ending normally spares Flower's 3 s wait for it
            raise
        if on_summary is not None:
            on_summary(summary)

    return server_app


app = build_app()


def _log(line: str) -> None:
    """A progress line of a run without a caller to print it (``flwr run``): the ServerApp's log."""
    log(INFO, "%s", line)


def _fleet_notes(settings: RunSettings, say: Progress) -> None:
    """Say which clients the run drew from its fleet (:func:`~splitfed.sim.runner.draw_note`) and the fleet's
    drifts the run never reaches (:func:`~splitfed.sim.runner.late_drift_note`), if any."""
    from splitfed.sim.runner import draw_note, late_drift_note

    try:
        drawn, note = draw_note(settings), late_drift_note(settings)
    except ConfigError:  # a fleet it cannot draw: the run refuses it, as before, once it holds its folder
        return
    say(drawn)
    if note:
        say(note)


def run(grid: Grid, settings: RunSettings, progress: Progress | None = None,
        stop: threading.Event | None = None, recorded_as: RunSettings | None = None,
        resumed: checkpoint.Checkpoint | None = None, reservation: runfolder.Reservation | None = None
        ) -> dict[str, Any]:
    """The whole run (see the module docstring); returns the summary (see :func:`build_app`).

    A resume reads and checks its checkpoint (the sha256 of all it holds) once, here or by the caller
    (``resumed``), and hands it on; it is read again only if the file changed meanwhile
    (:func:`checkpoint.current`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every other process of a run: the same kernels, so the same numbers
    try:
        return _run(grid, settings, progress or _log, stop, recorded_as, resumed, reservation)
    finally:
        torch.set_num_threads(threads)  # the caller's process (a notebook, a test) gets its setting back


def _run(grid: Grid, settings: RunSettings, say: Progress, stop: threading.Event | None,
         recorded_as: RunSettings | None, resumed: checkpoint.Checkpoint | None = None,
         reservation: runfolder.Reservation | None = None) -> dict[str, Any]:
    if not settings.out:
        return _run_in(grid, settings, say, stop, recorded_as)
    held = _held(settings, resumed)
    if held is not None and held.round >= settings.rounds:
        # a resume that asks for nothing (``flwr run`` with resume=true, the Python API): answered as simulate
        # and server.deploy answer it, before the folder is claimed, whose end would record the run finished
        check_resume(settings, held)  # other math or data is refused, as with a round to train
        done = runfolder.nothing_to_do(settings.out, settings.rounds, settings.out, held, reservation)
        if done is not None:
            return done
    with runfolder.claim(settings.out, settings.resume, settings.overwrite, reservation), \
            runfolder.recording_stops():  # one run per folder, held to the end; a signal's stop is recorded at once
        return _run_in(grid, settings, say, stop, recorded_as, held)


def _edge_now(chain: TierChain, settings: RunSettings) -> Callable[[], str] | None:
    """The edge's instance as it is now, asked by the strategy at each round's start: the nodes are told that
    one, not the chain check's, which an edge restarted since no longer is. A tier restarted since (the edge,
    or one behind it: maybe with another ``--compress``, idle release or splitfed) is checked again as before
    round 1, and refused with a ConfigError naming it (:func:`~splitfed.sim.tiers.check_restarted`)."""
    clients = [c for c in chain.controls if isinstance(c, GrpcTierClient)]
    if not clients or len(clients) != len(chain.controls) or len(chain.infos) != len(clients):
        return None  # tiers in this process (no restart), or a chain not checked at the start
    return lambda: check_restarted(settings, chain, clients)


def _held(settings: RunSettings, resumed: checkpoint.Checkpoint | None = None) -> checkpoint.Checkpoint | None:
    """The checkpoint a resume continues from, read once (``resumed``, read by the caller, unless the file
    changed since) and handed on; None when the run is no resume, or :func:`checkpoint.load` refuses the file:
    the resume then refuses it where it always did, with the folder held."""
    if not settings.resume:
        return None
    try:
        return checkpoint.current(settings.out, resumed)
    except ConfigError:
        return None


def _run_in(grid: Grid, settings: RunSettings, say: Progress, stop: threading.Event | None,
            recorded_as: RunSettings | None = None, held: checkpoint.Checkpoint | None = None) -> dict[str, Any]:
    data = data_digest(settings)  # once: hashing a dataset's files each round would cost seconds
    fleet = fleet_for(settings)
    fleet_sha = dealt_digest(fleet)
    ckpt = _resume(settings, data, fleet_sha, held, say)
    settings = named(settings, ckpt)
    recorded = (recorded_as or settings).with_(run_name=settings.run_name).to_dict()
    # the key of the clients' binding secrets: a run resumed under its own name keeps it (its loads then
    # replace the segments the crashed run left on the tiers), any other run gets its own
    kept = ckpt is not None and ckpt.binding_key and ckpt.settings.get("run_name") == settings.run_name
    binding_key = ckpt.binding_key if ckpt is not None and kept else secrets.token_hex(16)
    spec = settings.spec
    writer = MetricsWriter(settings.out) if settings.out else None
    if writer is not None:
        upto = ckpt.round if ckpt else 0
        # rows after the checkpoint's: an older checkpoint of the run put back (a crash between a checkpoint
        # and its row leaves none: its row is put back above); the user is told, as they are trained again
        after = sorted(r["round"] for r in writer.rows() if r["round"] > upto)
        if after:
            which = f"row {after[0]} is" if len(after) == 1 else f"rows {after[0]}..{after[-1]} are"
            say(f"{METRICS}: {which} after the checkpoint's round {upto}: dropped, trained again")
        writer.truncate_after(upto)
    policy = make_policy(settings)
    if ckpt is not None:
        policy.load_state_dict(ckpt.policy)
        with rng.LOCK:  # the process-wide generator: see splitfed.models.rng
            torch.set_rng_state(ckpt.rng)
    test_x, test_y = test_data(spec, settings.dataset, settings.seed)

    with tier_chain(settings) as chain:
        clock = make_clock(settings, fleet) if settings.sim_clock else None
        strategy = SplitFedAvg(settings, chain.controls, policy, clock=clock, edge_address=chain.addresses[0],
                               edge_instance=chain.infos[0].instance if chain.infos else "",
                               edge_now=_edge_now(chain, settings), stop=stop,
                               binding_key=binding_key,
                               predict=None if settings.sim_clock else make_predictor(settings, policy), say=say)
        strategy.register(grid, profile_of=lambda info: fleet.clients[info.partition_id % len(fleet.clients)].name)
        if ckpt is not None:
            strategy.previous = dict(ckpt.assignment)
        state = ckpt.state if ckpt is not None else initial_state(spec, settings.seed)
        first = ckpt.round + 1 if ckpt is not None else 1
        if first > settings.rounds:
            say(f"nothing to do: the checkpoint already holds round {first - 1} of {settings.rounds}")
        else:
            say(run_line(settings, len(strategy.clients), first))
        # the model before any training, evaluated as each round's: round 1's row keeps it (a resume has it)
        initial = evaluate(spec, state, test_x, test_y) if first == 1 else None
        started = time.perf_counter()
        profiles = {c.client_id: c.profile for c in strategy.clients.values()}
        finished: list[dict[str, Any]] = []  # without a run folder, the rows the summary sums (as a file holds them)

        def on_round(rnd: int, arrays: ArrayRecord, rec: RoundRecord) -> None:
            nonlocal started
            state_now = record_to_state(arrays)
            acc, loss = evaluate(spec, state_now, test_x, test_y)
            row = metrics_row(rec, acc, loss, time.perf_counter() - started, profiles,
                              in_turn=settings.in_turn, initial=initial if rnd == 1 else None)
            if writer is None:
                finished.append(json.loads(dumps(row)))
            try:
                check_converging(rnd, loss, settings.lr)
            except RunDiverged:  # its row (loss null: the user sees where it went), and no checkpoint of it
                if writer is not None:
                    writer.append(row)
                say(progress_line(row, settings.rounds, profiles))
                raise
            if writer is not None:  # the checkpoint first, with its row: a crash between the two is mended
                checkpoint.save(settings.out, checkpoint.Checkpoint(
                    rnd, state_now, recorded, dict(strategy.previous), policy.state_dict(),
                    torch.get_rng_state(), data, fleet=fleet_sha, binding_key=binding_key, row=row))
                if rnd == first and (redone := getattr(policy, "redecided", None)) is not None:
                    # a finished run resumed for more rounds: its last row's decision ("last round") was made
                    # again for them (adaptive), and this round ran it. Amended only now, after this round's
                    # checkpoint: the last one's copy of that row must match the file for a resume from it
                    last, decision = redone
                    writer.amend(last, decision=decision)
                writer.append(row)
            say(progress_line(row, settings.rounds, profiles))
            started = time.perf_counter()

        strategy.start(grid, state_to_record(state), num_rounds=settings.rounds,
                       timeout=settings.round_timeout_s, first_round=first, on_round=on_round)

    rows = writer.rows() if writer is not None else finished  # before: [] without one, a summary of no round
    summary = summarise(rows, recorded)
    if writer is not None:
        path = writer.write_summary(summary)
        say(f"wrote {writer.path} and {path}")
    return summary


def data_digest(settings: RunSettings) -> str:
    """What a checkpoint keeps of the run's data: the digest of the dataset's files, then (after ``+``) that
    of the samples each client is dealt (:func:`~splitfed.flower.workload.partitions_digest`)."""
    return dataset_digest(settings.dataset) + "+" + partitions_digest(
        settings.spec, settings.dataset, settings.partition, settings.clients, settings.seed)


def _resume(settings: RunSettings, data: str = "", fleet: str = "",
            held: checkpoint.Checkpoint | None = None, say: Progress | None = None) -> checkpoint.Checkpoint | None:
    """The checkpoint to continue from, if it may be: the same math (settings) on the same data (``data``,
    :func:`data_digest` now) and the same clients' devices (``fleet``, the
    :func:`~splitfed.profile.fleet.dealt_digest` of the run's fleet now: they drive the simulated clock and the
    cuts). ``held``: the one the resume read before, not
    read again unless the file changed since (:func:`checkpoint.current`). Without ``say`` it only checks
    (:func:`check_resume`: the folder is not the run's yet, so nothing is written); with it, a metrics row a
    crash lost is put back, and ``say`` tells so."""
    if not settings.resume:
        return None
    ckpt = checkpoint.current(settings.out, held)
    before = RunSettings.from_mapping(ckpt.settings, source=f"{settings.out}/{checkpoint.FILENAME}")
    # like with like: a file named relative (a resume's flag, a run from before paths were recorded absolute)
    # is the same setting as that file named absolute
    then, now = absolute_paths(before).to_dict(), absolute_paths(settings).to_dict()
    changed = [k for k, v in now.items() if k not in RESUMABLE and then[k] != v]
    if changed:
        moved = [k for k in changed if _a_file(k, before.to_dict()[k])]  # a file moved since reads as another
        raise ConfigError("cannot resume with different " + ", ".join(
            f"{k.replace('_', '-')} ({before.to_dict()[k]!r} -> {settings.to_dict()[k]!r})" for k in changed)
            + "".join(f"; the run recorded {k} {before.to_dict()[k]!r}: give that path, or put the file back there "
                      "if it moved" for k in moved))
    files, has_digest, parts = ckpt.data.partition("+")
    now_files, _, now_parts = data.partition("+")
    if files and now_files != files:
        raise ConfigError(f"cannot resume: the files of dataset {settings.dataset!r} changed since the checkpoint "
                          f"(sha256 {files[:12]}... then, {now_files[:12] or 'none'}... now); put the old files "
                          "back or start a new run")
    if data and now_parts != parts and (has_digest or parse_partition(settings.partition).kind == "dirichlet"):
        # a checkpoint without the digest is from before Dirichlet draws changed: its IID deals are as now
        raise ConfigError(f"cannot resume: the clients would train on other samples than before the checkpoint "
                          f"(partition {settings.partition!r} deals them out otherwise in this splitfed version); "
                          "start the run over with --overwrite")
    if fleet and ckpt.fleet and fleet != ckpt.fleet:
        if not ckpt.fleet.startswith(DEALT) and ckpt.fleet == fleet_digest(settings.fleet):
            raise ConfigError(f"cannot resume: this splitfed deals the run's {settings.clients} client(s) out of "
                              f"fleet {settings.fleet!r} otherwise than the one that wrote the checkpoint (each "
                              "listed device in turn, no longer drawn with replacement), so they would be other "
                              "devices than the rounds before were simulated and cut on; start the run over with "
                              "--overwrite")
        raise ConfigError(f"cannot resume: the devices of fleet {settings.fleet!r} changed since the checkpoint "
                          f"(sha256 {ckpt.fleet[:12]}... then, {fleet[:12]}... now): the rounds before were "
                          "simulated and cut on the old ones; put the old fleet file back or start a new run")
    if (metrics := Path(settings.out) / METRICS).is_file():
        run_rows(metrics)  # a line that is no row is named, before the rows are counted by round below
    if checkpoint.restore_row(settings.out, ckpt, write=say is not None):  # a crash between the two
        if say is not None:
            say(checkpoint.row_put_back(ckpt))
    else:
        check_rounds(Path(settings.out) / METRICS, ckpt.round)  # a hole in the metrics is not continued
    _same_model(settings, ckpt)
    return ckpt


def _a_file(key: str, value: object) -> bool:
    """Whether a recorded ``fleet`` or ``dataset`` names a file or folder by its path (not a shipped fleet's
    name, nor a dataset splitfed makes: ``digits``)."""
    from splitfed.data.datasets import dataset_form

    if key == "fleet":
        return isinstance(value, str) and "/" in value
    if key != "dataset":
        return False
    try:
        return bool(dataset_form(value)[1].strip())
    except ConfigError:
        return False


def _same_model(settings: RunSettings, ckpt: checkpoint.Checkpoint) -> None:
    """The model these settings build must be the one the checkpoint holds, tensor by tensor: the same
    settings can size another model after an upgrade (a run on an .npz now has its labels' classes, where
    it had 10), and a mismatch would otherwise surface only when the tiers load the weights."""
    from splitfed.engine.rounds import initial_state

    here = initial_state(settings.spec, settings.seed)
    there = ckpt.state
    odd = sorted(set(here) ^ set(there))
    if not odd:
        odd = [k for k in here if (here[k].shape, here[k].dtype) != (there[k].shape, there[k].dtype)]
    if odd:
        k = odd[0]
        show = {n: (f"{str(t[k].dtype).removeprefix('torch.')} {list(t[k].shape)}" if k in t else "absent")
                for n, t in (("checkpoint", there), ("run", here))}
        raise ConfigError(f"cannot resume: the checkpoint holds another model than this run builds from its "
                          f"settings and data ({k!r}: {show['checkpoint']} in the checkpoint, {show['run']} "
                          f"here; {len(odd)} tensor(s) differ), as when a newer splitfed sizes the model "
                          "differently; start the run over with --overwrite")


def check_resume(settings: RunSettings, held: checkpoint.Checkpoint | None = None) -> None:
    """Refuse now, before anything starts, the resumption :func:`_resume` would refuse once the run has
    started: other math, or dataset files that changed since the checkpoint (``held``: the checkpoint the
    resume read, not read again)."""
    if settings.resume:
        _resume(settings, data_digest(settings), dealt_digest(fleet_for(settings)), held)


def named(settings: RunSettings, ckpt: checkpoint.Checkpoint | None = None) -> RunSettings:
    """The run's name on the tier servers: the name given (or ``splitfed-SEED``) and a fresh random tag.

    Tiers are long-lived services that many runs share; two runs under one name (both seed 0, or
    both given ``run-name = "exp"``) would load into each other's segments, so every run's name is
    its own. A run resumed in the folder it was written in keeps its name, so its loads replace
    what the crashed run left on the tiers; resumed from a copy (another folder or host, which may
    be resumed twice at once) it is another run and gets a new tag.
    """
    before = str(ckpt.settings.get("run_name", "")) if ckpt is not None else ""
    given = settings.run_name
    if (ckpt is not None and before and ckpt.where in ("", checkpoint.place(settings.out))
            and given in ("", before, _untagged(before))):
        return settings.with_(run_name=before)
    return settings.with_(run_name=f"{given or f'splitfed-{settings.seed}'}-{secrets.token_hex(4)}")


def _untagged(name: str) -> str:
    base, _, tag = name.rpartition("-")
    return base if len(tag) == 8 and all(c in "0123456789abcdef" for c in tag) else name


def metrics_row(rec: RoundRecord, acc: float, loss: float, wall_s: float, profiles: dict[str, str],
                in_turn: bool = False, initial: tuple[float, float] | None = None) -> dict[str, Any]:
    """One round's metrics row; ``initial`` (round 1): the test accuracy and loss of the model before any
    training, so curves can start where training did."""
    per_client = {m.client_id: {"profile": profiles.get(m.client_id, ""), "cuts": list(m.cuts),
                                "samples": m.samples, "compute_s": m.compute_s, "link_s": m.link_s,
                                "bytes_up": m.bytes_up, "bytes_down": m.bytes_down,
                                "rtt_ms": None if m.rtt_s is None else m.rtt_s * 1e3,
                                "predicted_s": rec.predicted.get(m.client_id)}
                  for m in rec.measurements}
    took = [m.compute_s + m.link_s for m in rec.measurements]  # clients in turn: one after another
    return {
        "round": rec.round,
        "accuracy": acc,
        "loss": loss,
        **({} if initial is None else {"initial_accuracy": initial[0], "initial_loss": initial[1]}),
        "train_loss": rec.train_loss,
        "wall_s": wall_s,
        "sim_round_s": rec.sim_round_s,
        "measured_round_s": (sum(took) if in_turn else max(took, default=0.0)),
        "predicted_round_s": rec.predicted_round_s,
        "bytes_up": rec.bytes_up,
        "bytes_down": rec.bytes_down,
        # the coordinator's weight traffic to each server tier and back (chain order): not in the cost model
        "tier_weight_bytes": [list(b) for b in rec.tier_weight_bytes],
        # the devices' weight exchange, [to the devices, back]: over their links, beside bytes_up/bytes_down
        # (activations and gradients); the cost model prices it (X in splitfed.cost.model)
        "device_weight_bytes": list(rec.device_weight_bytes),
        "cuts": {cid: list(c) for cid, c in rec.assignment.items()},
        "moved": {cid: [list(a), list(b)] for cid, (a, b) in rec.moved.items()},
        "decision": rec.decision,
        "clients": len(rec.measurements),
        "failed": rec.failed,
        "why_failed": rec.why_failed,
        "profiles": {cid: profiles[cid] for cid in rec.assignment if profiles.get(cid)},  # failed ones too
        "per_client": per_client,
    }


def run_line(settings: RunSettings, clients: int, first: int) -> str:
    """A run's first line: what it trains, how its cuts are chosen, and which rounds (one for every backend)."""
    return (f"run {settings.run_id}: {settings.mode}, {settings.tiers} tiers{', U-shape' if settings.u_shape else ''}, "
            f"cuts {settings.cuts_shown}, {clients} client(s), rounds {first}..{settings.rounds}")


def progress_line(row: dict[str, Any], rounds: int, profiles: dict[str, str]) -> str:
    predicted = row.get("predicted_round_s")
    sim = (f"  sim {row['sim_round_s']:.2f}s" if row["sim_round_s"] is not None
           else f"  measured {row['measured_round_s']:.2f}s"
                + (f" (predicted {predicted:.2f}s)" if predicted is not None else ""))
    failed = f"  failed {len(row['failed'])}{_why_failed(row)}" if row["failed"] else ""
    return (f"round {row['round']}/{rounds}  acc {row['accuracy']:.4f}  loss {row['loss']:.4f}  "
            f"wall {row['wall_s']:.1f}s{sim}  up {row['bytes_up'] / 1e6:.2f} MB  "
            f"down {row['bytes_down'] / 1e6:.2f} MB  clients {row['clients']}{failed}{_moved(row, profiles)}")


def _why_failed(row: dict[str, Any], width: int = 70) -> str:
    """``: client1 (its device weights '0.0.weight' hold NaN or ...)``: the first failure and why."""
    why = row.get("why_failed") or {}
    if not why:
        return ""
    cid, reason = next(iter(why.items()))
    reason = reason if len(reason) <= width else reason[:width - 3] + "..."
    more = f", +{len(why) - 1} more" if len(why) > 1 else ""
    return f": {cid} ({reason}){more}"


def _moved(row: dict[str, Any], profiles: dict[str, str], show: int = 3) -> str:
    """``  moved 2: client3 (phone-mid-0) 7,7 -> 0,7, ...``: the cuts the policy moved this round, the first
    ``show`` clients in natural order (client2 before client10), as the report's tables and heatmap list them."""
    moved = row.get("moved") or {}
    if not moved:
        return ""
    first = sorted(moved.items(), key=lambda kv: natural_key(kv[0]))[:show]
    parts = [f"{cid}{f' ({profiles[cid]})' if profiles.get(cid) else ''} "
             f"{','.join(map(str, a))} -> {','.join(map(str, b))}" for cid, (a, b) in first]
    more = f", +{len(moved) - show} more" if len(moved) > show else ""
    return f"  moved {len(moved)}: " + ", ".join(parts) + more
