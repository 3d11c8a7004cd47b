"""Paths of the Flower apps, the run folder, the checkpoint, the settings and the simulate runner that no other
test took: registration that waits or is refused, a late node for a partition no one registered, a run stopped
mid-round or by its caller, a full disk mid-checkpoint, a lock file that changes under a claim, folders whose
records are odd, and the runner's ends (an engine failure's root cause, a refusal, a closed stdout).

The apps run for real over in-process tiers (``FakeGrid``); what cannot be made here (another Flower or Ray
version, a network whose health check fails, Ray's start) is replaced, and each such test says so."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from hypothesis import assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import clients.app
import server.app
from server.strategy import RunStopped, SplitFedAvg, _check_weights, _speed_text
from splitfed.engine.rounds import initial_state
from splitfed.errors import ConfigError, RunFolderError, Terminated, Unavailable
from splitfed.flower import checkpoint, runfolder, runstatus
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import METRICS, SUMMARY
from splitfed.flower.policy import make_policy
from splitfed.flower.records import CONFIG, NodeInfo, TrainInstruction, state_to_record
from splitfed.jsonio import write_atomic
from splitfed.sim import runner
from tests.flower_fixtures import FakeGrid, inprocess_tiers

SMALL = RunSettings(rounds=1, clients=2, tiers=3, cuts="static:1,3", batch_size=32, node_wait_s=5.0,
                    round_timeout_s=30.0)
ROW = '{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n'


def _strategy(settings: RunSettings, tiers: Iterable[Any] = (), **kw: Any) -> SplitFedAvg:
    return SplitFedAvg(settings, list(tiers), make_policy(settings), **kw)


def _queries_to(grid: FakeGrid, node: int) -> int:
    return sum(m.metadata.dst_node_id == node and m.metadata.message_type == "query" for m in grid.sent)


# ---------------------------------------------------------------- registration (server.strategy)


class _Late(FakeGrid):
    """Lists all but its last node until asked a second time (a SuperNode that connects a moment late)."""

    asked = 0

    def get_node_ids(self) -> Iterable[int]:
        self.asked += 1
        return self.node_ids[:-1] if self.asked == 1 else list(self.node_ids)


def test_registration_waits_for_a_late_node_and_registers_it(caplog) -> None:
    s = SMALL.with_(clients=3)
    grid = _Late(clients.app.app, 3)
    with caplog.at_level("INFO"):
        got = _strategy(s).register(grid)
    assert "Waiting for nodes: 2 of 3 registered" in caplog.text
    assert [c.client_id for c in got] == ["client0", "client1", "client2"]


def test_registration_stopped_while_waiting_for_nodes_asks_no_node() -> None:
    stop = threading.Event()
    stop.set()
    grid = FakeGrid(clients.app.app, 1)
    with pytest.raises(RunStopped, match="the run was stopped"):
        _strategy(SMALL.with_(clients=3, node_wait_s=3.0), stop=stop).register(grid)
    assert grid.sent == []


def test_too_few_nodes_within_the_wait_is_a_refusal_naming_both_counts() -> None:
    grid = FakeGrid(clients.app.app, 1)
    with pytest.raises(ConfigError, match=r"^only 1 node\(s\) registered within 1s; at least 2 needed$"):
        _strategy(SMALL.with_(clients=3, min_clients=2, node_wait_s=1.0)).register(grid)
    assert grid.sent == []  # refused before the query round


def test_too_few_answers_to_the_query_round_is_a_refusal() -> None:
    def app(msg: Message, ctx: Context) -> Message:
        if ctx.node_config["partition-id"] > 0:
            raise RuntimeError("this node's ClientApp crashed")  # FakeGrid, as Flower, replies with an error
        return clients.app.app(msg, ctx)

    with pytest.raises(ConfigError, match=r"^only 1 node\(s\) admitted by the query round \(1 of 3 answered\); at least "
                                          r"2 needed; left out: an error instead of an answer: RuntimeError: this "
                                          r"node's ClientApp crashed \(2 nodes\)$"):
        _strategy(SMALL.with_(clients=3, min_clients=2)).register(FakeGrid(app, 3))


def test_every_node_beyond_two_on_one_partition_is_left_out_too(caplog) -> None:
    """Two nodes on one partition leave both out, and a third on it too; it was said to be a second clash ("Nodes
    A and C both hold partition 0"), as the check for a partition already clashed came after the one for a
    partition seen, and never ran."""
    grid = FakeGrid(clients.app.app, 4)
    nodes = grid.node_ids
    for n, p in zip(nodes, (0, 0, 0, 1), strict=True):
        grid.contexts[n].node_config.update({"partition-id": p, "num-partitions": 2})
    with caplog.at_level("WARNING"):
        got = _strategy(SMALL.with_(clients=2, min_clients=1)).register(grid)
    assert [c.client_id for c in got] == ["client1"]
    # one line for the clash, one for the node beyond it (before: two "both left out" lines for three nodes)
    lines = caplog.text.splitlines()
    assert sum("both hold partition 0: both left out" in line for line in lines) == 1, caplog.text
    assert sum(any(f"Node {n} also holds partition 0: left out" in line for n in nodes[:3]) for line in lines) == 1


def test_a_late_node_for_a_partition_the_run_never_registered_is_left_out_and_asked_once(caplog) -> None:
    """Partition 2's node failed the query round; when another client's node is gone, a new node for partition
    2 takes no place (the run never registered it) and is not asked again at every later round."""
    failed_once: list[int] = []

    def app(msg: Message, ctx: Context) -> Message:
        if ctx.node_config["partition-id"] == 2 and not failed_once:
            failed_once.append(ctx.node_id)
            raise RuntimeError("not ready")
        return clients.app.app(msg, ctx)

    grid = FakeGrid(app, 3)
    a, b, c = grid.node_ids
    strategy = _strategy(SMALL.with_(clients=3, min_clients=2))
    strategy.register(grid)
    registered = dict(strategy.clients)
    assert sorted(registered) == [a, b]
    late = 5000
    grid.contexts[late] = Context(run_id=1, node_id=late, node_config={"partition-id": 2, "num-partitions": 3},
                                  state=RecordDict(), run_config={})
    grid.node_ids = [a, c, late]  # client1's node is gone
    with caplog.at_level("WARNING"):
        assert strategy._rejoin(grid) == {a, c, late}
        strategy._rejoin(grid)
    assert f"Node {late} holds partition 2, which this run did not register: left out" in caplog.text
    assert _queries_to(grid, late) == 1
    assert strategy.clients == registered


# ---------------------------------------------------------------- rounds (server.strategy)


def test_start_evaluates_the_model_before_training_and_after_each_round(monkeypatch) -> None:
    """Flower's ``evaluate_fn``: round 0 (the initial model) only when the run starts at round 1."""
    seen: list[int] = []

    def evaluate(rnd: int, arrays: Any) -> MetricRecord | None:
        seen.append(rnd)
        return MetricRecord({"round-seen": rnd}) if rnd != 3 else None

    with inprocess_tiers(monkeypatch, SMALL.tiers - 1) as chain:
        strategy = _strategy(SMALL, chain.controls)
        grid = FakeGrid(clients.app.app, SMALL.clients)
        strategy.register(grid)
        start = state_to_record(initial_state(SMALL.spec, SMALL.seed))
        result = strategy.start(grid, start, num_rounds=1, timeout=30, evaluate_fn=evaluate)
        assert seen == [0, 1]
        assert {r: m["round-seen"] for r, m in result.evaluate_metrics_serverapp.items()} == {0: 0, 1: 1}
        seen.clear()
        later = strategy.start(grid, result.arrays, num_rounds=3, timeout=30, evaluate_fn=evaluate, first_round=3)
    assert seen == [3] and dict(later.evaluate_metrics_serverapp) == {}  # no round 0; None is not kept


def test_a_run_stopped_while_its_clients_train_releases_the_tiers(monkeypatch) -> None:
    stop = threading.Event()

    def app(msg: Message, ctx: Context) -> Message:
        reply = clients.app.app(msg, ctx)
        if msg.metadata.message_type == "train":
            stop.set()  # Ctrl-C while the round's clients train
        return reply

    with inprocess_tiers(monkeypatch, SMALL.tiers - 1) as chain:
        strategy = _strategy(SMALL, chain.controls, stop=stop)
        grid = FakeGrid(app, SMALL.clients)
        strategy.register(grid)
        with pytest.raises(RunStopped):
            strategy.start(grid, state_to_record(initial_state(SMALL.spec, SMALL.seed)), num_rounds=1, timeout=30)
        assert [t.clients() for t in chain.controls] == [0, 0]


def test_a_train_config_adds_keys_to_the_instruction_but_never_changes_it(monkeypatch) -> None:
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1) as chain:
        strategy = _strategy(SMALL, chain.controls)
        grid = FakeGrid(clients.app.app, SMALL.clients)
        strategy.register(grid)
        extra = ConfigRecord({"user-note": "ablation 3", "cuts": [9, 9], "round": 7, "client-id": "client9"})
        try:
            msgs = list(strategy.configure_train(1, state_to_record(initial_state(SMALL.spec, SMALL.seed)), extra,
                                                 grid))
        finally:
            strategy._abort()
    assert len(msgs) == 2
    for m in msgs:
        cfg = m.content.config_records[CONFIG]
        ins = TrainInstruction.from_record(cfg)
        assert cfg["user-note"] == "ablation 3" and cfg["server-round"] == 1
        assert (ins.cuts, ins.round) == ((1, 3), 1) and ins.client_id in ("client0", "client1")


class _Counting(FakeGrid):
    pushes = 0

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self.pushes += 1
        return super().push_messages(messages)


def test_an_exchange_of_no_messages_pushes_nothing_and_forgets_the_last_ones_silence() -> None:
    """Every client of a group dropped before training: nothing is sent to the SuperLink."""
    strategy = _strategy(SMALL)
    strategy._unanswered = {1007: "no reply before the round timeout"}  # the last exchange's
    grid = _Counting(clients.app.app, 2)
    assert strategy.exchange(grid, [], timeout=5.0) == []
    assert grid.pushes == 0 and strategy._unanswered == {}


def test_an_edge_that_does_not_describe_itself_keeps_the_instance_the_nodes_check(caplog) -> None:
    def gone() -> str:
        raise Unavailable("tier 127.0.0.1:7000: describe: unavailable after 3 attempt(s)\nsecond line")

    strategy = _strategy(SMALL, edge_address="127.0.0.1:7000", edge_instance="inst-1", edge_now=gone)
    with caplog.at_level("WARNING"):
        strategy._describe_edge()
    assert strategy.edge_instance == "inst-1"
    assert ("the edge at 127.0.0.1:7000 did not describe itself (tier 127.0.0.1:7000: describe: unavailable after "
            "3 attempt(s)): nodes check against instance inst-1") in caplog.text


@hsettings(max_examples=60)
@given(sent=st.sets(st.sampled_from(["0.weight", "0.bias", "2.weight", "2.bias", "x", "y"]), max_size=6),
       asked=st.sets(st.sampled_from(["0.weight", "0.bias", "2.weight", "2.bias", "x", "y"]), max_size=6))
def test_weights_other_than_the_device_segment_are_refused_naming_the_keys(sent: set[str], asked: set[str]) -> None:
    assume(sent != asked)
    state = {k: torch.zeros(2) for k in sent}
    expected = {k: ((2,), torch.float32) for k in asked}
    with pytest.raises(ConfigError) as e:
        _check_weights(state, expected)
    assert str(e.value) == f"returned weights for {sorted(sent ^ asked)[:3]} instead of its device segment"


def test_a_node_asked_for_its_speed_that_says_nothing_of_it_adds_nothing_to_its_line() -> None:
    s = SMALL.with_(cuts="adaptive", sim_clock=False)
    assert _speed_text(s, NodeInfo(0, 2)) == ""
    assert _speed_text(s, NodeInfo(0, 2, speed_error="no GPU")) == " (speed not measured: no GPU; the profile's is used)"


# ---------------------------------------------------------------- the ServerApp (server.app)


def test_a_server_app_stopped_by_its_caller_ends_normally_without_a_summary(monkeypatch) -> None:
    """``splitfed simulate``'s Ctrl-C: the ServerApp returns (sparing Flower's wait for it), summarising nothing."""
    stop = threading.Event()
    stop.set()
    summaries: list[dict] = []
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        app = server.app.build_app(SMALL, progress=lambda line: None, stop=stop, on_summary=summaries.append)
        ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
        assert app(FakeGrid(clients.app.app, SMALL.clients), ctx) is None
    assert summaries == []


def test_a_resume_of_an_unreadable_checkpoint_is_refused_with_its_folder_held(tmp_path, monkeypatch) -> None:
    """The checkpoint is read before the folder is claimed only to answer a resume with nothing to do: one that
    cannot be read is refused once the folder is held (in use by another run: that is said first)."""
    folder = tmp_path / "run"
    with runfolder.claim(folder, resume=False, overwrite=False):
        (folder / METRICS).write_text(ROW)
    (folder / checkpoint.FILENAME).write_bytes(b"not a checkpoint")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    s = SMALL.with_(out=str(folder), resume=True)
    grid = FakeGrid(clients.app.app, SMALL.clients)
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        with runfolder.claim(folder, resume=True, overwrite=False):  # another run holds it
            with pytest.raises(ConfigError, match="is in use by another run"):
                server.app.run(grid, s)
        with pytest.raises(ConfigError, match=r"cannot read checkpoint .*checkpoint\.pt: it is corrupt"):
            server.app.run(grid, s)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# ---------------------------------------------------------------- the ClientApp (clients.app)


def _lone_node() -> tuple[Context, int]:
    grid = FakeGrid(clients.app.app, 1)
    (node,) = grid.node_ids
    return grid.contexts[node], node


@hsettings(max_examples=20, deadline=None)
@given(batch=st.one_of(st.booleans(), st.integers(-10**6, 0), st.floats(allow_nan=False), st.text(max_size=4)))
def test_a_speed_query_with_a_batch_size_no_batch_has_is_refused_in_one_line(batch: object) -> None:
    ctx, node = _lone_node()
    ask = ConfigRecord({"model": json.dumps(SMALL.spec.to_dict()), "dataset": "digits", "partition": "iid",
                        "seed": 0, "measure-speed": True, "batch-size": batch})  # type: ignore[dict-item]
    reply = clients.app.app(Message(RecordDict({CONFIG: ask}), dst_node_id=node, message_type="query",
                                    group_id="0"), ctx)
    assert reply.has_error()
    assert reply.error.reason == f"ConfigError: query: batch-size must be a positive integer, got {batch!r}"


class _Unhealthy:
    """An in-process link whose health check fails, as on a network that drops the checks' packets and not the
    steps' (retried): no such network can be made here."""

    address = "127.0.0.1:7000"  # the edge it stands for (an in-process link has none)

    def __init__(self, link: Any) -> None:
        self._link = link

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)

    def health(self, timeout: float = 5.0, *, wait: bool = False) -> bool:
        return False

    def health_failure(self) -> None:
        return None


def test_a_round_trip_that_cannot_be_timed_leaves_the_round_trained_and_its_rtt_unmeasured(monkeypatch,
                                                                                            tmp_path) -> None:
    s = SMALL.with_(out=str(tmp_path / "run"))
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        connected = clients.app.connect
        monkeypatch.setattr(clients.app, "connect", lambda *a, **k: _Unhealthy(connected(*a, **k)))
        server.app.run(FakeGrid(clients.app.app, s.clients), s, progress=lambda line: None)
    (row,) = [json.loads(x) for x in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert row["failed"] == [] and sorted(row["per_client"]) == ["client0", "client1"]
    assert [c["rtt_ms"] for c in row["per_client"].values()] == [None, None]


def test_a_nodes_own_edge_address_is_not_checked_when_the_run_names_no_edge_instance() -> None:
    """Tiers of the coordinator's own process (or an edge that did not describe itself): nothing to check
    against, so the node neither asks its edge nor remembers a check."""
    ctx, _ = _lone_node()
    ins = TrainInstruction("run", 1, "client0", (1, 3), "sflv1", False, SMALL.spec, SMALL.optim, 0, "digits", "iid",
                           32, 1, "127.0.0.1:7000", edge_instance="")
    clients.app._check_edge(ctx, None, ins)  # type: ignore[arg-type]  # a link would be asked: there is none
    assert clients.app.EDGE_CHECKED not in ctx.state.config_records


# ---------------------------------------------------------------- the checkpoint (splitfed.flower.checkpoint)


def test_a_disk_that_fills_while_a_checkpoint_is_written_is_named_and_the_last_one_kept(tmp_path) -> None:
    """A real write error (the kernel's file size limit, as a full disk refuses a write): torch's zip writer
    turns it into a RuntimeError of its own ("unexpected pos"); the disk's error is the one said."""
    checkpoint.save(tmp_path, checkpoint.Checkpoint(1, {"w": torch.zeros(3)}, {}))
    big = {"w": torch.zeros(1 << 20)}  # 4 MiB
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    was = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of ending the process
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, limits[1]))
        with pytest.raises(RunFolderError) as e:
            checkpoint.save(tmp_path, checkpoint.Checkpoint(2, big, {}))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, was)
    assert str(e.value) == (f"cannot write the checkpoint in {tmp_path}: File too large (the previous one is kept: "
                            f"free space or fix the folder, then continue with --resume {tmp_path})")
    assert checkpoint.load(tmp_path).round == 1
    assert os.listdir(tmp_path) == [checkpoint.FILENAME]


# ---------------------------------------------------------------- settings (splitfed.flower.config)


@pytest.mark.parametrize(("values", "words"), [
    ({"tiers": 1}, "tiers must be >= 2 (device + at least one server tier), got 1"),
    ({"min-clients": 0}, "min-clients must be >= 1, got 0"),
    ({"tls-cert": "c.pem"}, "tls-cert and tls-key go together"),
    ({"tls-key": "k.pem"}, "tls-cert and tls-key go together"),
    ({"tls-cert": "c.pem", "tls-key": "k.pem"}, "tls-cert needs tls-ca (the CA clients verify the tier servers with)"),
])
def test_settings_refuse_what_no_run_can_do(values: dict, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        RunSettings.from_mapping(values, source="run config")
    assert str(e.value) == f"run config: {words}"


def test_a_config_file_whose_simulate_is_no_table_is_refused(tmp_path) -> None:
    f = tmp_path / "run.toml"
    f.write_text("simulate = 3\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(f))}: \[simulate\] must be a table$"):
        RunSettings.from_toml(f)


_WORDS = ("true", "false", "1", "0", "yes", "no")


@given(key_value=st.one_of(
    st.tuples(st.just("u-shape"), st.one_of(st.text(max_size=6).filter(lambda t: t.strip().lower() not in _WORDS),
                                             st.integers(), st.floats())),
    st.tuples(st.just("clients"), st.one_of(st.booleans(), st.floats().filter(lambda f: not f.is_integer()))),
    st.tuples(st.just("lr"), st.booleans()),
))
def test_a_value_of_the_wrong_type_is_refused_naming_key_type_and_value(key_value: tuple[str, object]) -> None:
    """A bool is no number (``clients = true`` would be 1 client), 2.5 clients is no count, and only the usual words
    are booleans."""
    key, value = key_value
    typ = {"u-shape": "bool", "clients": "int", "lr": "float"}[key]
    with pytest.raises(ConfigError) as e:
        RunSettings.from_mapping({key: value}, source="run.toml")
    assert str(e.value) == f"run.toml: {key} must be {typ}, got {value!r}"


# ---------------------------------------------------------------- the run folder (splitfed.flower.runfolder)


def test_a_run_folder_that_cannot_be_made_is_a_refusal_naming_it() -> None:
    folder = Path("/proc/splitfed-no-such-folder/run")  # /proc takes no new folder, even from root
    with pytest.raises(ConfigError, match=rf"^cannot write run folder {folder}: No such file or directory$"):
        with runfolder.claim(folder, resume=False, overwrite=False):
            pytest.fail("claimed")


def test_a_lock_file_that_is_a_folder_is_a_refusal_naming_the_run_folder(tmp_path) -> None:
    (tmp_path / runfolder.LOCK).mkdir()
    lock = re.escape(str(tmp_path / runfolder.LOCK))
    with pytest.raises(ConfigError, match=rf"^cannot use run folder {re.escape(str(tmp_path))}: its lock file {lock} "
                                          r"is a folder \(splitfed makes a file there\); remove it, or choose another out$"):
        with runfolder.claim(tmp_path, resume=False, overwrite=False):
            pytest.fail("claimed")


def test_a_lock_file_removed_as_a_claim_locked_it_is_opened_again(tmp_path, monkeypatch) -> None:
    """The run that held the folder tidied it (removing its lock file) between this claim's open and its lock."""
    import fcntl

    real, calls = runfolder._lock, []

    def lock_after_a_removal(fd: int, where: Path) -> None:
        if not calls:
            (tmp_path / runfolder.LOCK).unlink()
        calls.append(fd)
        real(fd, where)

    monkeypatch.setattr(runfolder, "_lock", lock_after_a_removal)
    with runfolder.claim(tmp_path, resume=False, overwrite=False):
        assert len(calls) == 2 and runstatus.status(tmp_path).state == "running"
        fd = os.open(tmp_path / runfolder.LOCK, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # the file at the path is the one held
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_a_lock_file_that_keeps_changing_is_a_refusal_not_a_hang(tmp_path, monkeypatch) -> None:
    real, calls = runfolder._lock, []

    def lock_after_a_replace(fd: int, where: Path) -> None:
        write_atomic(tmp_path / runfolder.LOCK, '{"pid": 1}\n')
        calls.append(fd)
        real(fd, where)

    monkeypatch.setattr(runfolder, "_lock", lock_after_a_replace)
    with pytest.raises(ConfigError, match=r"is in use by another run \(its lock file keeps changing\)"):
        with runfolder.claim(tmp_path, resume=False, overwrite=False):
            pytest.fail("claimed")
    assert len(calls) == 100


def test_a_run_stopped_by_a_signal_python_has_no_name_for_records_its_number(tmp_path) -> None:
    rt = int(signal.SIGRTMIN) + 6  # a real-time signal: signal.Signals names only SIGRTMIN and SIGRTMAX
    with pytest.raises(RuntimeError, match="its end"), runfolder.claim(tmp_path, resume=False, overwrite=False):
        (tmp_path / METRICS).write_text(ROW)
        runfolder.stop_requested(rt)
        raise RuntimeError("its end")
    st_ = runstatus.status(tmp_path)
    assert (st_.state, st_.record["signal"]) == ("stopped", f"signal {rt}")


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _folder(folder: Path, *, lock: dict | None, summary: str | None, rows: int) -> Path:
    """A run folder as written: its lock record first, then its summary (newer), and ``rows`` metrics rows."""
    folder.mkdir()
    if lock is not None:
        (folder / runfolder.LOCK).write_text(json.dumps(lock))
        time.sleep(0.01)
    if rows:
        (folder / METRICS).write_text(ROW * rows)
    if summary is not None:
        (folder / SUMMARY).write_text(summary)
    return folder


def _started(**record: Any) -> dict[str, Any]:
    return {"host": socket.gethostname(), "since": "2999-01-01 00:00:00", **record}


@pytest.mark.parametrize(("lock", "summary", "rows", "state"), [
    # killed after writing its summary (written last), before it recorded its end: it finished
    (_started(pid=-1, process="another-boot:1"), '{"settings": {}, "rounds": 2}', 2, "finished"),
    # a summary that is no JSON, and no record: no run of splitfed wrote it
    (None, "{not json", 1, "hand-made"),
    # a failed run whose summary, written later, sums up no metrics file (gone): still failed
    (_started(pid=-1, process="x", state="failed", error="boom"), '{"settings": {}, "rounds": 0}', 0, "failed"),
    # an older splitfed's record (no process identity) whose pid is no pid: its process is not alive
    (_started(pid="1"), None, 1, "unfinished"),
    (_started(pid=True), None, 1, "unfinished"),
    (_started(pid=0), None, 1, "unfinished"),
    # an older record of this very process, whose start cannot be read: it cannot be told to be this one
    (_started(pid=os.getpid(), since="not a time"), None, 1, "unfinished"),
])
def test_odd_run_folders_read_with_a_sensible_status(tmp_path, lock, summary, rows, state) -> None:
    if lock is not None and lock.get("pid") == -1:
        lock = {**lock, "pid": _dead_pid()}
    folder = _folder(tmp_path / "run", lock=lock, summary=summary, rows=rows)
    assert runstatus.status(folder).state == state


# ---------------------------------------------------------------- splitfed simulate (splitfed.sim.runner)


def test_signal_handlers_are_installed_from_the_main_thread_only() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    got: list[dict] = []
    t = threading.Thread(target=lambda: got.append(runner._Signals(threading.Event()).install()))
    t.start()
    t.join()
    assert got == [{}]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_sigterm_exit_while_ray_starts_is_noted_as_the_stop_and_any_other_exit_passes(monkeypatch) -> None:
    """Ray's start may end the process with ``sys.exit(15)`` from its own SIGTERM handler: that is this stop.
    Ray's setter of that handler does nothing while Ray starts, and is given back after."""
    import ray._private.utils as ray_utils

    real = ray_utils.set_sigterm_handler
    signals = runner._Signals(threading.Event())
    with signals.starting():
        assert ray_utils.set_sigterm_handler is not real
        raise SystemExit(signal.SIGTERM)
    assert ray_utils.set_sigterm_handler is real and signals.received == signal.SIGTERM
    with pytest.raises(Terminated):
        signals.reraise()
    other = runner._Signals(threading.Event())
    with pytest.raises(SystemExit) as e, other.starting():
        raise SystemExit(3)
    assert e.value.code == 3 and other.received is None
    # a Ray without that setter (another version: cannot be installed here) is left without one
    monkeypatch.delattr(ray_utils, "set_sigterm_handler")
    third = runner._Signals(threading.Event())
    with third.starting():
        raise SystemExit(signal.SIGTERM)
    assert third.received == signal.SIGTERM and not hasattr(ray_utils, "set_sigterm_handler")


def test_the_engines_stop_and_backend_are_kept_when_flower_passes_them_by_keyword(monkeypatch) -> None:
    """Flower 1.42 calls ``run_api`` with positional arguments; a version that names them (cannot be installed
    here, so a stand-in ``run_api`` is called so) still has its stop event and its actor pool kept."""
    from flwr.server.superlink.fleet.vce import vce_api

    built: list[object] = []

    def run_api(app_fn, backend_fn, nodes_mapping, state_factory, node_info_stores, f_stop, metrics):  # type: ignore[no-untyped-def]
        built.append(backend_fn())

    monkeypatch.setattr(vce_api, "run_api", run_api)
    signals = runner._Signals(threading.Event())
    pool, f_stop = object(), threading.Event()
    with signals.engine():
        vce_api.run_api(app_fn=None, backend_fn=lambda: pool, nodes_mapping={}, state_factory=None,
                        node_info_stores={}, f_stop=f_stop, metrics=None)
    assert built == [pool] and signals.backend is pool and signals.flower_stop is f_stop
    assert vce_api.run_api is run_api


def _simulated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
               raised: BaseException | None) -> tuple[Path, list[str]]:
    """Run ``simulate`` with Ray's start skipped (a fake session folder stands for its own) and, when ``raised``
    is given, an engine that raises it: Ray's failures cannot be made to order. Returns the session folder and
    the progress lines."""
    import flwr.simulation

    session = tmp_path / "ray" / "session_2026-01-01_00-00-00_000000_1"
    (session / "logs").mkdir(parents=True)
    monkeypatch.setattr(runner, "start_ray", lambda *a, **k: None)
    monkeypatch.setattr(runner, "session_dir", lambda: session)

    def engine(*a: Any, **k: Any) -> None:
        assert raised is not None
        raise raised

    monkeypatch.setattr(flwr.simulation, "run_simulation", engine)
    lines: list[str] = []
    return session, lines


GIVEN = SMALL.with_(tier_addresses="127.0.0.1:7001,127.0.0.1:7002")  # given tiers: none is started


def test_an_engine_failure_names_its_root_cause_and_keeps_rays_logs(monkeypatch, tmp_path) -> None:
    try:
        raise OSError("the raylet died")
    except OSError as root:
        try:
            raise ValueError("actor pool") from root
        except ValueError as middle:
            wrapper = RuntimeError("Simulation engine crashed")
            wrapper.__cause__ = middle
    session, lines = _simulated(monkeypatch, tmp_path, wrapper)
    with pytest.raises(runner.SimulationError) as e:
        runner.simulate(GIVEN, progress=lines.append)
    assert str(e.value) == (f"the simulation engine failed: OSError: the raylet died (Ray's logs are kept in "
                            f"{session / 'logs'})")
    assert session.is_dir()


def test_a_bug_in_the_run_is_raised_as_itself_and_says_where_rays_logs_are(monkeypatch, tmp_path) -> None:
    session, lines = _simulated(monkeypatch, tmp_path, KeyError("a bug"))
    with pytest.raises(KeyError, match="a bug"):
        runner.simulate(GIVEN, progress=lines.append)
    assert lines[-1] == f"the run failed; Ray's logs are kept in {session / 'logs'}"
    assert session.is_dir()


def test_a_refusal_once_ray_is_up_removes_rays_session(monkeypatch, tmp_path) -> None:
    """Tiers to start on a GPU this machine lacks: refused before any tier starts; Ray's logs say nothing of it."""
    s = SMALL.with_(tier_torch_device="cuda:0")
    session, lines = _simulated(monkeypatch, tmp_path, None)
    with pytest.raises(ConfigError, match="tier-torch-device cuda:0: this machine has no CUDA GPU"):
        runner.simulate(s, progress=lines.append)
    assert not session.exists() and not any("the run failed" in line for line in lines)


def test_a_run_whose_stdout_reader_went_away_removes_rays_session_as_a_stopped_run(monkeypatch, tmp_path) -> None:
    read, write = os.pipe()
    os.close(read)  # ``| head`` has exited
    out = os.fdopen(write, "w")
    try:
        session, lines = _simulated(monkeypatch, tmp_path, BrokenPipeError(32, "Broken pipe"))
        monkeypatch.setattr(sys, "stdout", out)
        with pytest.raises(BrokenPipeError):
            runner.simulate(GIVEN, progress=lines.append)
        monkeypatch.undo()
    finally:
        try:
            out.close()
        except BrokenPipeError:
            pass
    assert not session.exists() and not any("the run failed" in line for line in lines)


def test_validate_checks_given_tiers_as_a_chain_before_anything_starts() -> None:
    from splitfed.transport.server import serve_tier

    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True, next_compress="fp16") as edge:
        s = SMALL.with_(tier_addresses=f"{edge.address},{cloud.address}")
        with pytest.raises(ConfigError, match=f"tier edge at {edge.address} sends to its next tier with --compress "
                                              "fp16, but this run compresses every link with none"):
            runner.validate(s)
        runner.validate(s.with_(compress="fp16"))  # the chain it forms is accepted
        assert edge.tier.clients() == cloud.tier.clients() == 0

