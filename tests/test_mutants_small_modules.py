"""Behaviour of four small modules that a mutation run found unpinned: the simulated clock charges a client's
weight move exactly when its cuts moved; ``torch_device`` and ``memory_bytes`` on a machine with CUDA GPUs (the
refusal of an index past the GPU count with its exact message, ``cuda`` taking the current GPU, the GPU's own
memory); the number of partitions a node with a data file of its own is given; and the cache's keys (the source
digest, a 32-digit key independent of keyword order), a check that raises counting as failed, and ``~`` with no
home to expand it to.

The CUDA cases cannot run on a machine without a GPU (CI has none): they stand torch's CUDA queries in with
``monkeypatch`` (``is_available``, ``device_count``, ``current_device``, ``get_device_properties``), which is all
``torch_device`` and ``memory_bytes`` ask of torch. tests/test_compute.py runs the real thing where a GPU is."""

from __future__ import annotations

import hashlib
import json
import os
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from splitfed import cache
from splitfed.engine import compute
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.node import NodeConfig
from splitfed.sim.clock import fleet_for, make_clock
from tests.data_fixtures import own_cache  # noqa: F401 (a fixture: a splitfed cache of the test's own)

# ---------------------------------------------------------------- the simulated clock charges a move


START = [(1, 3), (2, 5), (0, 4), (3, 7)]  # client p's cuts (tests/test_failed_move.py's: client0 is the straggler)
MOVED_FROM = (3, 7)  # client0's cuts of its previous round


def test_the_clock_charges_the_move_of_a_client_whose_cuts_moved_and_nothing_for_one_that_stayed() -> None:
    """A round's simulated time is the cost model's makespan with each moved client's ``move_cost`` added
    (exactly what ``evaluate`` gives with it as ``extra_s``); a client at the cuts of its previous round pays
    nothing, so a round where nobody moved costs what a first round does."""
    from splitfed.cost import Scenario, evaluate, move_cost
    from splitfed.flower.adaptive import run_profile
    from splitfed.sim.inprocess import sim_clients

    s = RunSettings(clients=4, tiers=3, batch_size=32, seed=1)  # client0: phone-mid-0, the straggler
    fleet = fleet_for(s)
    clients = sim_clients(s, fleet)
    assignment = {c.client_id: START[c.partition_id] for c in clients}
    clock = make_clock(s, fleet)
    # the scenario the clock prices (the run's profile on the fleet's devices of round 1)
    now = fleet.at_round(1)
    picked = [replace(now.client(c.profile), name=c.client_id, samples=c.samples or now.client(c.profile).samples)
              for c in clients]
    sc = Scenario.from_fleet(run_profile(s), fleet, tiers=s.tiers, batch=s.batch_size, u_shape=s.u_shape,
                             epochs=s.local_epochs, mode=s.mode, codec=s.compress,
                             min_device_blocks=s.min_device_blocks).with_clients(picked)
    c0 = next(c for c in sc.clients if c.name == "client0")
    move = move_cost(sc, c0, MOVED_FROM, assignment["client0"])
    assert move > 0
    assert evaluate(sc, assignment).bottleneck == "client client0"  # so its move shows in the makespan
    still = evaluate(sc, assignment).makespan_s
    assert clock(1, assignment, clients, {}) == still
    assert clock(1, assignment, clients, dict(assignment)) == still  # nobody moved: nothing charged
    moved = clock(1, assignment, clients, {**assignment, "client0": MOVED_FROM})
    assert moved == evaluate(sc, assignment, extra_s={"client0": move}).makespan_s
    assert moved > still


# ---------------------------------------------------------------- torch_device / memory_bytes with CUDA GPUs


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int, current: int = 0) -> None:
    """This machine as one with ``count`` CUDA GPUs, ``current`` the current one (torch's queries stood in)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


@pytest.mark.parametrize(("count", "text", "have"), [
    (1, "cuda:1", "1 CUDA GPU(s): cuda:0"),
    (1, "cuda:7", "1 CUDA GPU(s): cuda:0"),
    (2, "cuda:2", "2 CUDA GPU(s): cuda:0 .. cuda:1"),
    (3, "cuda:3", "3 CUDA GPU(s): cuda:0 .. cuda:2"),
    (8, "cuda:9", "8 CUDA GPU(s): cuda:0 .. cuda:7"),
])
def test_a_gpu_index_past_the_count_is_refused_naming_the_gpus_there_are(monkeypatch: pytest.MonkeyPatch, count: int,
                                                                         text: str, have: str) -> None:
    """``cuda:N`` with N GPUs (indices 0..N-1) is one too many; the refusal names them, one GPU as just cuda:0."""
    _gpus(monkeypatch, count)
    with pytest.raises(ConfigError) as e:
        compute.torch_device(text)
    assert str(e.value) == f"--torch-device {text}: this machine has {have}"
    with pytest.raises(ConfigError) as e:
        compute.torch_device(text, "node config: torch-device")
    assert str(e.value) == f"node config: torch-device {text}: this machine has {have}"


@pytest.mark.parametrize(("count", "current", "text", "index"), [
    (1, 0, "cuda:0", 0),
    (2, 0, "cuda:1", 1),
    (2, 1, "cuda:0", 0),
    (4, 0, "cuda:3", 3),
    (1, 0, "cuda", 0),
    (4, 2, "cuda", 2),
    (4, 3, " cuda ", 3),
])
def test_a_gpu_the_machine_has_is_that_gpu_and_cuda_alone_the_current_one(monkeypatch: pytest.MonkeyPatch, count: int,
                                                                          current: int, text: str, index: int) -> None:
    """An index below the count is taken as it is (not the current GPU); ``cuda`` with no index is the current."""
    _gpus(monkeypatch, count, current)
    dev = compute.torch_device(text)
    assert dev == torch.device("cuda", index) and dev.index == index


def test_a_gpus_memory_is_its_own_total_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier on a GPU shares that GPU's memory, not the machine's."""
    asked: list[torch.device] = []

    def props(dev: torch.device) -> types.SimpleNamespace:
        asked.append(dev)
        return types.SimpleNamespace(total_memory=80 * 2**30 + 5, name="NVIDIA H100")

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    got = compute.memory_bytes(torch.device("cuda", 1))
    assert got == 80 * 2**30 + 5 and type(got) is int
    assert asked == [torch.device("cuda", 1)]


# ---------------------------------------------------------------- a node with a data file of its own


@pytest.mark.parametrize(("pid", "num"), [(0, 1), (1, 2), (3, 4), (7, 8)])
def test_a_node_with_its_own_data_file_has_exactly_the_partitions_its_id_needs(tmp_path: Path, pid: int,
                                                                                num: int) -> None:
    """With a data file of its own and no num-partitions the id only names the client: partition-id + 1."""
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    node = NodeConfig.parse({"partition-id": pid, "data-file": str(data)})
    assert (node.partition_id, node.num_partitions) == (pid, num)


@pytest.mark.parametrize("pid", [-1, -5])
@pytest.mark.parametrize("partitions", [None, 4])
def test_a_negative_id_is_refused_as_negative(tmp_path: Path, pid: int, partitions: int | None) -> None:
    """A negative id is refused for being negative, with a data file of its own (no partitions: it said "outside
    0..0 (num-partitions 1)", a count the user never gave) or a partition to pick."""
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    cfg: dict[str, object] = {"partition-id": pid}
    cfg.update({"data-file": str(data)} if partitions is None else {"num-partitions": partitions})
    with pytest.raises(ConfigError) as e:
        NodeConfig.parse(cfg)
    assert str(e.value) == f"node config: partition-id must be >= 0, got {pid}"


# ---------------------------------------------------------------- the cache: keys, checks, a home-less ~


def test_the_source_digest_is_the_sha256_of_the_modules_source_and_an_edit_makes_a_new_one(tmp_path: Path) -> None:
    """An entry's key holds the digest of the code that computed it: an edit to that code is a new entry."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("X = 1\n")
    b.write_text("Y = 2\n")
    ma, mb = types.ModuleType("a"), types.ModuleType("b")
    ma.__file__, mb.__file__ = str(a), str(b)
    assert cache.source_digest(ma) == hashlib.sha256(b"X = 1\n").hexdigest()
    assert cache.source_digest(ma, mb) == hashlib.sha256(b"X = 1\nY = 2\n").hexdigest()
    before = cache.source_digest(ma)
    a.write_text("X = 2\n")
    assert cache.source_digest(ma) != before
    assert cache.source_digest(cache) == hashlib.sha256(Path(cache.__file__).read_bytes()).hexdigest()


def test_an_entry_key_is_32_hex_digits_whatever_the_order_of_its_parts() -> None:
    """The key names the file: the same parts, in any keyword order, are the same entry."""
    parts = {"n": 300, "alpha": 0.5, "versions": {"numpy": "2.0", "torch": "2.4"}, "digest": "ab"}
    key = cache.entry_key(**parts)
    want = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    assert key == want and len(key) == 32 and all(ch in "0123456789abcdef" for ch in key)
    assert cache.entry_key(**dict(reversed(list(parts.items())))) == key
    assert cache.entry_key(b=1, a=2) == cache.entry_key(a=2, b=1)
    assert cache.entry_key(n=301, alpha=0.5, versions=parts["versions"], digest="ab") != key


@pytest.mark.parametrize("error", [ValueError, TypeError, IndexError])
def test_a_check_that_raises_counts_as_failed(own_cache: Path, error: type[Exception]) -> None:  # noqa: F811
    """A check that cannot even look at an entry (of another shape, say) refuses it: it is computed again."""
    cache.store("k", "e1", {"x": np.arange(3)})
    assert cache.load("k", "e1", lambda arrays: True) is not None  # it is there, and readable

    def raising(arrays: cache.Arrays) -> bool:
        raise error("cannot look")

    assert cache.load("k", "e1", raising) is None
    got = cache.kept("k", "e1", raising, lambda: {"x": np.arange(4)})
    assert np.array_equal(got["x"], np.arange(4))


def test_a_tilde_with_no_home_is_taken_as_the_name_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~`` that cannot be expanded (no HOME and no password entry, or a user that does not exist) is not an
    error: it is a folder of that name where the run starts."""
    import pwd

    monkeypatch.chdir(tmp_path)
    assert cache.folder("~no-such-user-splitfed/c") == tmp_path / "~no-such-user-splitfed" / "c"
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid: int) -> object:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(RuntimeError):
        Path("~").expanduser()  # what folder() meets on this Python
    assert cache.folder("~/c") == tmp_path / "~" / "c"
    monkeypatch.setenv(cache.ENV, "~/c")
    assert cache.root() == tmp_path / "~" / "c"
    cache.pin()
    assert os.environ[cache.ENV] == str(tmp_path / "~" / "c")
