"""The main job (``simulations/configs/main.toml``): its story, and the in-process backend's equality with it.

The README's first command, shortened (the main job's config with 2 clients, a real ``splitfed simulate``: its
progress, end-of-run table, run folder, no noise, rows, summary and figures), is checked on the ``--resume`` run
of tests/test_signals.py's ``test_a_signal_stops_the_run_cleanly_resumably_and_tidily[ctrl-c]``
(``_ends_as_the_main_job``), which finishes that very run: one Ray start fewer than a test of its own here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # in-process (no Ray): not in the group "flower-real", so either worker takes them
ROOT = Path(__file__).resolve().parents[1]


def test_main_job_moves_the_slowed_phones_and_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The main job's story (README, iot fleet): its phone slows down 100x at round 5; the adaptive
    policy moves its blocks to the edge for round 6, and the round time comes back from round 7 (round 6 also
    pays for the move).

    The whole config through the ServerApp's ``run`` (FakeGrid, in-process tiers: the same strategy,
    policy, clock, metrics and progress lines as ``make run``, without Ray and tier processes).
    """
    import clients.app
    import server.app
    from splitfed.flower.config import RunSettings
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    s = RunSettings.from_toml(ROOT / "simulations/configs/main.toml").with_(out=str(tmp_path), node_wait_s=5.0)
    lines: list[str] = []
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, s.clients), s, progress=lines.append)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == s.rounds == 12
    phones = {cid for cid, c in rows[0]["per_client"].items() if c["profile"].startswith("phone-mid")}
    assert phones, "the drawn fleet has no phone-mid: the config or the fleet changed"
    sim = [r["sim_round_s"] for r in rows]
    assert sim[4] > 1.5 * sim[3]  # round 5: the phones train slowly where they are
    assert [r["moved"] for r in rows[:5]] == [{}] * 5
    assert set(rows[5]["moved"]) == phones  # the adapter saw round 5 and moved them, nobody else
    for cid in phones:
        old, new = rows[5]["moved"][cid]
        assert old == rows[4]["cuts"][cid] and new == rows[5]["cuts"][cid]
        assert new[0] < old[0]  # fewer blocks on the slowed device
    assert [r["moved"] for r in rows[6:]] == [{}] * 6
    assert sim[6:] == pytest.approx([sim[3]] * 6)  # recovered: as fast as before the slowdown
    # each row says what the adapter decided after that round, and why
    decisions = [r["decision"] for r in rows]
    assert [d["moved"] for d in decisions[:4]] == [[]] * 4 and decisions[0]["reason"] == "already optimal"
    assert set(decisions[4]["moved"]) == phones and decisions[4]["reason"].startswith("gain ")
    assert decisions[4]["predicted_s"] == pytest.approx(sim[4]) and decisions[4]["predicted_after_s"] < sim[4]
    # what the move adds to round 6, as the adapter predicted it, is what the clock charged (the phone's moved
    # round, weights included, ends after the slowest other device's: README's 0.85 s against 0.79 s)
    assert decisions[4]["predicted_after_s"] == pytest.approx(sim[6])
    assert decisions[4]["move_s"] == pytest.approx(sim[5] - sim[6], abs=1e-12) and decisions[4]["move_s"] > 0
    assert decisions[-1]["reason"] == "last round"
    # the progress line of round 6 names the moves; the others name none
    line = next(x for x in lines if x.startswith("round 6/12"))
    assert f"moved {len(phones)}: " in line
    for cid in phones:
        old, new = rows[5]["moved"][cid]
        assert f"{cid} ({rows[0]['per_client'][cid]['profile']}) {','.join(map(str, old))} -> " \
               f"{','.join(map(str, new))}" in line
    assert not any("moved" in x for x in lines if x.startswith("round ") and not x.startswith("round 6/"))


def test_only_the_expected_flower_warnings_are_dropped() -> None:
    import logging

    from splitfed.sim.runner import ExpectedWarnings

    def record(msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.WARNING, __file__, 1, msg, args, None)

    f = ExpectedWarnings()
    assert not f.filter(record("DEPRECATED FEATURE: %s", "The `run_simulation` function is deprecated and will go"))
    assert not f.filter(record("fraction_evaluate is set to 0.0. Federated evaluation will be skipped."))
    assert f.filter(record("Node %d did not answer the query round: %s", 7, "timeout"))
    assert f.filter(record("DEPRECATED FEATURE: %s", "something else"))


def test_inprocess_backend_computes_the_main_job_exactly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The in-process backend (experiments' quick path) gives the ServerApp run's numbers bit for bit,
    whatever torch's thread count in the calling process (a Flower run computes with one thread
    everywhere; two threads sum some gradients in another order)."""
    import torch

    import clients.app
    import server.app
    from splitfed.flower.config import RunSettings
    from splitfed.sim.inprocess import train_inprocess
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    s = RunSettings.from_toml(ROOT / "simulations/configs/main.toml").with_(rounds=4, node_wait_s=5.0)
    with inprocess_tiers(monkeypatch, s.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, s.clients), s.with_(out=str(tmp_path / "flower")),
                       progress=lambda line: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train_inprocess(s.with_(out=str(tmp_path / "local")))
        assert torch.get_num_threads() == 2  # the caller's setting is given back
    finally:
        torch.set_num_threads(threads)

    def rows(name: str) -> list[dict]:
        return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    keys = ("round", "accuracy", "loss", "train_loss", "sim_round_s", "bytes_up", "bytes_down", "cuts", "moved",
            "decision", "tier_weight_bytes")
    assert [{k: r[k] for k in keys} for r in rows("local")] == [{k: r[k] for k in keys} for r in rows("flower")]
