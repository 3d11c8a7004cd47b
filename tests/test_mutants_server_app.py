"""What the ServerApp (``server.app``) promises that the mutation run found unpinned.

- the app runs on the caller's settings, else on ``context.run_config``; a run stopped by its caller ends
  quietly, any other stop is raised; the run computes on one thread and gives the caller's count back;
- the edge is asked again at each round's start only when every tier is a gRPC tier the chain check saw;
- a resume that asks for no more rounds than its checkpoint holds is answered before the folder is claimed;
  a run that is no resume holds no checkpoint; a resume whose metrics file was lost puts its row back;
- a run in a folder: its progress lines, its rows (round 1 alone keeps the model before training, wall
  seconds as measured) and its binding key (128 bits, kept by a run resumed in place under its name, new
  for a copy), and the strategy is told the edge's instance;
- a name is "untagged" only by an 8-hex-digit tag;
- one round's metrics row (round trip in ms, the initial loss, no clients measured) and its progress line
  (the first failure's reason cut at 70 characters, "+N more", the moved cuts).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from flwr.app import Context, RecordDict

import clients.app
import server.app
from server.strategy import RoundRecord, RunStopped
from splitfed.engine.rounds import initial_state
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import METRICS, MetricsWriter
from splitfed.flower.policy import Measurement
from splitfed.sim.tiers import TierChain
from splitfed.transport.client import GrpcTierClient
from tests.flower_fixtures import FakeGrid, inprocess_tiers

SMALL = RunSettings(rounds=2, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=1, node_wait_s=5.0,
                    round_timeout_s=30.0)


def _context(run_config: dict[str, Any]) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


# --- the app: settings, stops, threads ---------------------------------------------------------------------


def test_the_app_runs_on_the_callers_settings_else_on_the_run_config(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``splitfed simulate`` hands its settings (the run config then says nothing); ``flwr run`` has only
    the run config."""
    seen: list[RunSettings] = []
    def run(grid: Any, s: RunSettings, *a: Any, **k: Any) -> dict[str, Any]:
        seen.append(s)
        return {}

    monkeypatch.setattr(server.app, "run", run)
    given = SMALL.with_(rounds=3)
    server.app.build_app(given)(None, _context({"rounds": 7}))  # type: ignore[arg-type]
    server.app.build_app()(None, _context({"rounds": 7}))  # type: ignore[arg-type]
    assert seen[0] is given and seen[1].rounds == 7


def test_a_stop_the_caller_did_not_ask_for_is_raised(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """RunStopped ends the app quietly only when the caller's ``stop`` is set (Ctrl-C in simulate)."""
    def stopped(*a: Any, **k: Any) -> dict[str, Any]:
        raise RunStopped("the run was stopped")

    monkeypatch.setattr(server.app, "run", stopped)
    summaries: list[dict[str, Any]] = []
    for stop in (None, threading.Event()):
        with pytest.raises(RunStopped, match="the run was stopped"):
            server.app.build_app(SMALL, stop=stop, on_summary=summaries.append)(None, _context({}))  # type: ignore[arg-type]
    asked = threading.Event()
    asked.set()
    server.app.build_app(SMALL, stop=asked, on_summary=summaries.append)(None, _context({}))  # type: ignore[arg-type]
    assert summaries == []


def test_a_run_computes_on_one_thread_and_gives_the_callers_count_back(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every process of a run uses one thread (the same kernels, so the same numbers)."""
    during: list[int] = []
    def inner(*a: Any) -> dict[str, Any]:
        during.append(torch.get_num_threads())
        return {}

    monkeypatch.setattr(server.app, "_run", inner)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        server.app.run(None, SMALL)  # type: ignore[arg-type]
        assert during == [1] and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


# --- the edge asked again at each round's start ------------------------------------------------------------


def test_the_edge_is_asked_again_only_when_every_tier_is_a_checked_grpc_tier(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[tuple[Any, ...]] = []
    def check_restarted(*a: Any) -> str:
        calls.append(a)
        return "edge-now"

    monkeypatch.setattr(server.app, "check_restarted", check_restarted)
    infos: list[Any] = [SimpleNamespace(instance="e"), SimpleNamespace(instance="c")]
    with GrpcTierClient("127.0.0.1:1", insecure=True) as edge, GrpcTierClient("127.0.0.1:2", insecure=True) as cloud:
        both = TierChain(["127.0.0.1:1", "127.0.0.1:2"], controls=[edge, cloud], infos=infos)
        ask = server.app._edge_now(both, SMALL)
        assert ask is not None and ask() == "edge-now"
        assert calls == [(SMALL, both, [edge, cloud])]
        mixed = TierChain(["127.0.0.1:1", "inproc"], controls=[edge, object()], infos=infos)  # type: ignore[list-item]
        unchecked = TierChain(["127.0.0.1:1", "127.0.0.1:2"], controls=[edge, cloud], infos=infos[:1])
        inproc = TierChain(["inproc-edge"], controls=[object(), object()])  # type: ignore[list-item]
        assert [server.app._edge_now(c, SMALL) for c in (mixed, unchecked, inproc)] == [None, None, None]


# --- resume: the checkpoint held, a resume asking for nothing, a lost metrics file --------------------------


def _checkpointed(folder: Path, s: RunSettings, rnd: int, rows: int) -> checkpoint.Checkpoint:
    """A checkpoint of round ``rnd`` of ``s`` as the run writes it (the model this run builds), and ``rows``
    rows before it in the metrics file."""
    def row(r: int) -> dict[str, Any]:
        return {"round": r, "accuracy": 0.5, "loss": 1.0}

    ckpt = checkpoint.Checkpoint(rnd, initial_state(s.spec, s.seed), s.to_dict(), row=row(rnd))
    checkpoint.save(folder, ckpt)
    writer = MetricsWriter(folder)
    for r in range(1, rows + 1):
        writer.append(row(r))
    return ckpt


def test_only_a_resume_holds_the_checkpoint_in_its_folder(tmp_path: Path) -> None:
    _checkpointed(tmp_path, SMALL, 1, 1)
    assert server.app._held(SMALL.with_(out=str(tmp_path))) is None
    held = server.app._held(SMALL.with_(out=str(tmp_path), resume=True))
    assert held is not None and held.round == 1


def test_a_resume_to_the_round_the_checkpoint_holds_is_answered_before_the_folder_is_claimed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to train: the run's summary, "nothing to do", and no tiers started, no round run."""
    s = SMALL.with_(out=str(tmp_path), resume=True)
    _checkpointed(tmp_path, SMALL, 2, 2)

    def no_run(*a: Any, **k: Any) -> None:
        raise AssertionError("a run with nothing to train was started")

    monkeypatch.setattr(server.app, "_run_in", no_run)
    summary = server.app.run(None, s)  # type: ignore[arg-type]
    assert summary["rounds"] == 2 and summary["final_accuracy"] == 0.5
    assert f"nothing to do: {tmp_path} already holds round 2 of 2" in capsys.readouterr().err


def test_a_resume_whose_metrics_file_was_lost_puts_the_checkpoints_row_back(tmp_path: Path) -> None:
    """Round 1's checkpoint written, the crash before its row made the file: the row is put back."""
    s = SMALL.with_(out=str(tmp_path), resume=True)
    ckpt = _checkpointed(tmp_path, SMALL, 1, 0)
    assert not (tmp_path / METRICS).exists()
    said: list[str] = []
    got = server.app._resume(s, say=said.append)
    assert got is not None and got.round == 1
    assert said == [checkpoint.row_put_back(ckpt)]
    assert MetricsWriter(tmp_path).rows() == [ckpt.row]


# --- a run in a folder, in this process (FakeGrid, in-process tiers) ----------------------------------------


def _run(monkeypatch: pytest.MonkeyPatch, s: RunSettings, lines: list[str]) -> None:
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, s.clients), s, progress=lines.append)


def test_a_run_its_resume_in_place_and_a_resumed_copy(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Round 1 then, resumed, round 2: the start lines name the rounds each run trains; only round 1's row
    keeps the model before training; each row's wall seconds lie within the run's; the clients' binding key
    is 128 random bits, kept by the resume in place (its loads replace the crashed run's) and new for a copy
    of the folder (another run, maybe resumed twice at once)."""
    here = tmp_path / "run"
    lines: list[str] = []
    t0 = time.perf_counter()
    _run(monkeypatch, SMALL.with_(rounds=1, out=str(here)), lines)
    first_took = time.perf_counter() - t0
    key = checkpoint.load(here).binding_key
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    _run(monkeypatch, SMALL.with_(rounds=2, out=str(here), resume=True), lines)
    assert checkpoint.load(here).binding_key == key
    name = checkpoint.load(here).settings["run_name"]
    starts = [x for x in lines if x.startswith(("run ", "nothing to do"))]
    assert starts == [f"run {name}: sflv1, 3 tiers, cuts static:1,3, 2 client(s), rounds 1..1",
                      f"run {name}: sflv1, 3 tiers, cuts static:1,3, 2 client(s), rounds 2..2"]
    rows = MetricsWriter(here).rows()
    assert [r["round"] for r in rows] == [1, 2]
    assert "initial_accuracy" in rows[0] and "initial_loss" in rows[0]
    assert "initial_accuracy" not in rows[1] and "initial_loss" not in rows[1]
    assert 0.0 <= rows[0]["wall_s"] <= first_took

    copy = tmp_path / "copy"
    shutil.copytree(here, copy)
    _run(monkeypatch, SMALL.with_(rounds=3, out=str(copy), resume=True), lines)
    other = checkpoint.load(copy).binding_key
    assert re.fullmatch(r"[0-9a-f]{32}", other) and other != key


def test_the_strategy_is_told_the_edges_instance(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Of the instances the chain check saw (edge first), the edge's: the one the nodes are told."""
    infos: list[Any] = [SimpleNamespace(instance="edge-1"), SimpleNamespace(instance="cloud-1")]
    controls: list[Any] = [object(), object()]

    @contextlib.contextmanager
    def chain(settings: RunSettings) -> Iterator[TierChain]:
        yield TierChain(["inproc-edge", "inproc-cloud"], controls=controls, infos=infos)

    told: list[str] = []

    class Stop(Exception):
        pass

    def strategy(*a: Any, **k: Any) -> None:
        told.append(k["edge_instance"])
        raise Stop

    monkeypatch.setattr(server.app, "tier_chain", chain)
    monkeypatch.setattr(server.app, "SplitFedAvg", strategy)
    with pytest.raises(Stop):
        server.app.run(None, SMALL.with_(out=str(tmp_path)))  # type: ignore[arg-type]
    assert told == ["edge-1"]


# --- names ----------------------------------------------------------------------------------------------------


def test_a_name_is_untagged_only_by_an_8_hex_digit_tag(tmp_path: Path) -> None:
    """``flwr run`` with ``run-name = "exp"`` continues "exp-0123abcd" in place, but not "exp-zzzzzzzz" nor
    "exp-ab": those are other names, and the run gets its own."""
    here = SMALL.with_(out=str(tmp_path), resume=True, run_name="exp")

    def ckpt(name: str) -> checkpoint.Checkpoint:
        return checkpoint.Checkpoint(1, {}, SMALL.with_(run_name=name).to_dict(), where=checkpoint.place(tmp_path))

    assert server.app.named(here, ckpt("exp-0123abcd")).run_id == "exp-0123abcd"
    for theirs in ("exp-zzzzzzzz", "exp-ab"):
        got = server.app.named(here, ckpt(theirs)).run_id
        assert got != theirs and re.fullmatch(r"exp-[0-9a-f]{8}", got), (theirs, got)


# --- one round's row and progress line -----------------------------------------------------------------------


def _row(failed: dict[str, str] | None = None, moved: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]
         | None = None, rtt_s: float | None = None) -> dict[str, Any]:
    ms = [Measurement("client0", (1, 3), 10, 0.5, 0.25, 2_000_000, 1_000_000, rtt_s=rtt_s)]
    rec = RoundRecord(2, {"client0": (1, 3), **{c: (1, 3) for c in failed or {}}}, measurements=ms,
                      failed=list(failed or {}), why_failed=dict(failed or {}), sim_round_s=1.5,
                      moved=dict(moved or {}))
    return server.app.metrics_row(rec, 0.5, 1.25, 3.0, {"client0": "phone-mid-0"})


def test_a_row_gives_the_round_trip_in_milliseconds_and_round_1_its_initial_loss() -> None:
    assert _row(rtt_s=0.25)["per_client"]["client0"]["rtt_ms"] == 250.0
    assert _row()["per_client"]["client0"]["rtt_ms"] is None
    rec = RoundRecord(1, {})
    row = server.app.metrics_row(rec, 0.5, 1.0, 2.0, {}, initial=(0.1, 2.3))
    assert (row["initial_accuracy"], row["initial_loss"]) == (0.1, 2.3)
    assert row["measured_round_s"] == 0.0 and row["clients"] == 0  # no client measured: no time measured


def test_a_progress_line_without_failures_or_moves_ends_with_the_clients() -> None:
    assert server.app.progress_line(_row(), 5, {"client0": "phone-mid-0"}) == (
        "round 2/5  acc 0.5000  loss 1.2500  wall 3.0s  sim 1.50s  up 2.00 MB  down 1.00 MB  clients 1")


@pytest.mark.parametrize(("reason", "shown"), [
    ("x" * 70, "x" * 70),
    ("y" * 71, "y" * 67 + "..."),
])
def test_the_first_failures_reason_is_cut_at_70_characters(reason: str, shown: str) -> None:
    line = server.app.progress_line(_row(failed={"client1": reason}), 5, {})
    assert line.endswith(f"clients 1  failed 1: client1 ({shown})")


def test_further_failures_are_counted() -> None:
    line = server.app.progress_line(_row(failed={"client1": "gone", "client2": "gone too"}), 5, {})
    assert line.endswith("clients 1  failed 2: client1 (gone), +1 more")


def test_the_moved_cuts_show_three_clients_then_a_count() -> None:
    three = {f"client{i}": ((1, 3), (2, 3)) for i in range(3)}
    line = server.app.progress_line(_row(moved=three), 5, {"client0": "phone-mid-0"})
    assert line.endswith("clients 1  moved 3: client0 (phone-mid-0) 1,3 -> 2,3, client1 1,3 -> 2,3, "
                         "client2 1,3 -> 2,3")
    four = {**three, "client3": ((2, 3), (1, 3))}
    assert server.app.progress_line(_row(moved=four), 5, {}).endswith("client2 1,3 -> 2,3, +1 more")


def test_an_adaptive_run_s_first_line_says_how_it_adapts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Its settings that are not the defaults follow its cuts, as an experiment's policies entry writes them
    (before: "cuts adaptive" whatever the hysteresis, smoothing or time limit)."""
    lines: list[str] = []
    s = SMALL.with_(rounds=1, cuts="adaptive", hysteresis=0.5, measurement_weight=1.0, out=str(tmp_path / "run"))
    _run(monkeypatch, s, lines)
    name = checkpoint.load(tmp_path / "run").settings["run_name"]
    assert f"run {name}: sflv1, 3 tiers, cuts adaptive hysteresis=0.5 measurement-weight=1, 2 client(s), " \
           "rounds 1..1" in lines, lines


def test_a_run_without_a_run_folder_sums_its_rounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``out`` empty (nothing written, as ``flwr run``'s default): its summary is still the rounds' (before: of
    no round, as the rows were read back from a file it had not written), the one a run folder's files give."""
    monkeypatch.chdir(tmp_path)
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        bare = server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(rounds=2), progress=lambda _: None)
    assert list(tmp_path.iterdir()) == []
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        kept = server.app.run(FakeGrid(clients.app.app, SMALL.clients), SMALL.with_(rounds=2, out=str(tmp_path / "r")),
                              progress=lambda _: None)
    assert bare["rounds"] == kept["rounds"] == 2 and bare["final_accuracy"] is not None
    drop = ("settings", "wall_s")
    assert {k: v for k, v in bare.items() if k not in drop} == {k: v for k, v in kept.items() if k not in drop}
