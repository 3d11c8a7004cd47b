"""A simulation without Flower or gRPC: the ServerApp's rounds with in-process tiers.

For smoke tests, experiments and quick looks: the same policy, simulated clock,
round bookkeeping, data, evaluation and metrics rows as ``splitfed simulate``,
in one process. A transport changes no number, so its models equal a Flower run's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from splitfed.errors import ConfigError


def check_inprocess(settings: Any) -> None:
    """What this backend refuses that a Flower run takes (named before anything trains)."""
    if settings.resume:
        raise ConfigError("the in-process backend does not resume: run it again (with overwrite)")
    if settings.fraction != 1.0:
        raise ConfigError("the in-process backend trains every client each round: fraction must be 1")
    if not settings.sim_clock:  # a Flower run reports measured times and the cost model's prediction instead
        raise ConfigError("the in-process backend times rounds on the simulated clock only: sim-clock must be "
                          "true (for measured times, run with Flower)")
    if settings.addresses:  # it would train on tiers of its own, never asking these
        raise ConfigError(f"the in-process backend runs its tiers in this process: remove tier-addresses "
                          f"({settings.tier_addresses}), or run with Flower to use them")
    from splitfed.engine.compute import torch_device

    torch_device(settings.tier_torch_device, "tier-torch-device")  # its tiers compute here: a GPU it has


def train_inprocess(settings: Any, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The ServerApp's rounds in this process: in-process tiers and links, no Flower, no gRPC.

    Built from the same pieces as the Flower run: the policy (:func:`make_policy`),
    the simulated clock (:func:`make_clock`), the round bookkeeping
    (:class:`SplitRound`), the clients' data and batches (``workload``), the
    evaluation, and the metrics writer, so its ``metrics.jsonl`` has the same
    fields. "A transport changes no number": its models equal the Flower run's;
    its byte counts are tensor payloads (gRPC adds message framing).
    Every client trains every round (``fraction`` must be 1). ``progress`` gets the line per round that a
    Flower run prints.
    """
    import torch

    from splitfed.flower import runfolder
    from splitfed.sim.clock import fleet_for
    from splitfed.sim.runner import one_sample_batches

    check_inprocess(settings)
    fleet = fleet_for(settings)
    clients = sim_clients(settings, fleet)  # once: each client's data is drawn to count its samples
    # as the runner's validate: a BatchNorm model's one-sample last batch would fail that client every round
    one_sample_batches(settings, clients)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every process of a Flower run: the same kernels, so the same numbers
    try:
        if not settings.out:  # no run folder: nothing written (before: the current folder was taken as one)
            return _train(settings, progress, fleet, clients)
        with runfolder.claim(settings.out, resume=False, overwrite=settings.overwrite):
            return _train(settings, progress, fleet, clients)
    finally:
        torch.set_num_threads(threads)


def _train(settings: Any, progress: Callable[[str], None] | None, fleet: Any = None,
           clients: list[Any] | None = None) -> dict[str, Any]:
    """The rounds of :func:`train_inprocess`. ``fleet`` and ``clients`` (:func:`sim_clients`): the run's, as the
    caller built them for its checks; built here when not given."""
    from server.app import metrics_row, progress_line, run_line
    from server.strategy import RoundRecord, moves, settle
    from splitfed.engine.rounds import (
        RoundConfig,
        SplitRound,
        drive,
        initial_state,
        inprocess_chain,
        local_trainer,
    )
    from splitfed.flower.metrics import MetricsWriter, summarise
    from splitfed.flower.policy import Measurement, make_policy
    from splitfed.flower.workload import (
        check_converging,
        client_data,
        evaluate,
        round_batches,
        test_data,
    )
    from splitfed.jsonio import dumps
    from splitfed.sim.clock import finished_time, fleet_for, make_clock
    from splitfed.sim.runner import draw_note, late_drift_note
    from splitfed.transport.compress import get as codec

    s = settings.with_(run_name=settings.run_id)  # its tiers are its own: no tag (cf. server.app.named)
    say = progress if progress is not None else (lambda line: None)
    spec = s.spec
    policy = make_policy(s)
    fleet = fleet if fleet is not None else fleet_for(s)
    clients = clients if clients is not None else sim_clients(s, fleet)
    clock = make_clock(s, fleet)
    data = {pid: client_data(spec, s.dataset, s.partition, s.clients, pid, s.seed) for pid in range(s.clients)}
    test_x, test_y = test_data(spec, s.dataset, s.seed)
    writer = MetricsWriter(s.out) if s.out else None  # empty out: none written, as a Flower run (RunSettings.out)
    if writer is not None:
        writer.truncate_after(0)
    rows: list[dict[str, Any]] = []  # as the metrics file holds them: the summary is the same with or without one
    chain = inprocess_chain(s.tiers - 1, links=[codec(c) for c in s.codecs], torch_device=s.tier_torch_device)
    state = initial_state(spec, s.seed)
    profiles = {c.client_id: c.profile for c in clients}
    previous: dict[str, tuple[int, ...]] = {}  # each client's cuts when it last trained (the clock prices moves)
    say(draw_note(s, fleet))  # as a Flower run says them
    if note := late_drift_note(s):
        say(note)
    say(f"{run_line(s, len(clients), 1)} (in-process)")
    initial = evaluate(spec, state, test_x, test_y)  # before any training: round 1's row keeps it
    for rnd in range(1, s.rounds + 1):
        t0 = time.perf_counter()
        assignment = {cid: tuple(int(k) for k in cuts) for cid, cuts in policy.assign(rnd, clients).items()}
        record = RoundRecord(rnd, assignment, sim_round_s=clock(rnd, assignment, clients, previous),
                             moved=moves(previous, assignment))
        batches = {f"client{pid}": round_batches(x, y, s.batch_size, s.seed, pid, rnd, s.local_epochs)
                   for pid, (x, y) in data.items()}
        cfg = RoundConfig(s.run_id, rnd, spec, s.mode, s.u_shape, s.optim, s.seed)
        split = SplitRound(cfg, chain.tiers, state, assignment, min_clients=min(s.min_clients, len(assignment)))
        errors: dict[str, str] = {}  # a client whose training raised is dropped, as a node's error reply is
        state = drive(split, local_trainer(chain, batches, failed=errors), lost=errors)
        record.failed, record.why_failed = list(split.failed), {**errors, **split.why}
        if record.failed and record.sim_round_s is not None:
            record.sim_round_s = finished_time(clock, rnd, assignment, clients, previous, record.failed)
        record.tier_weight_bytes = [list(b) for b in split.weight_bytes]
        record.device_weight_bytes = list(split.device_bytes)
        record.measurements = [Measurement(r.client_id, tuple(r.cuts), r.samples, r.compute_s, r.link_s,
                                           r.bytes_up, r.bytes_down) for r in split.results]
        total = sum(r.samples for r in split.results)
        record.train_loss = sum(r.loss * r.samples for r in split.results) / total if total else None
        settle(previous, record)
        record.decision = policy.observe(rnd, record.measurements)
        acc, loss = evaluate(spec, state, test_x, test_y)
        row = metrics_row(record, acc, loss, time.perf_counter() - t0, profiles, in_turn=s.in_turn,
                          initial=initial if rnd == 1 else None)
        rows.append(json.loads(dumps(row)))
        if writer is not None:
            writer.append(row)
        say(progress_line(row, s.rounds, profiles))
        check_converging(rnd, loss, s.lr)
    summary = summarise(rows, s.to_dict())
    if writer is not None:
        say(f"wrote {writer.path} and {writer.write_summary(summary)}")
    return summary


def sim_clients(settings: Any, fleet: Any) -> list[Any]:
    """The clients as the ServerApp registers simulated nodes: ``client<p>`` on the fleet's p-th device."""
    from splitfed.flower.policy import ClientInfo
    from splitfed.flower.workload import client_data

    s, spec = settings, settings.spec
    return [ClientInfo(f"client{p}", p, p, fleet.clients[p % len(fleet.clients)].name,
                       len(client_data(spec, s.dataset, s.partition, s.clients, p, s.seed)[0]))
            for p in range(s.clients)]
