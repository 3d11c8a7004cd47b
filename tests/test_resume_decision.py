"""A finished adaptive run resumed for more rounds records why its cuts moved.

Its last round's decision kept every cut ("last round": no round left to repay a move); the resume decides
again for the rounds now added, and the first resumed round runs that decision. Before, it was written
nowhere: the last row still said "last round" and the next row showed clients moved under "already optimal".
Now the last row's ``decision`` is amended to the one made for the longer run, so ``metrics.jsonl`` reads as
the uninterrupted run's. In-process (FakeGrid, in-process tiers): a run takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import clients.app
import server.app
from splitfed.cli import main as cli
from splitfed.errors import RunFolderError
from splitfed.flower import checkpoint
from splitfed.flower.config import RunSettings
from splitfed.flower.metrics import MetricsWriter
from tests.flower_fixtures import FakeGrid, inprocess_tiers

FLEET = ('samples = 300\n[edge]\nprofile = "edge-server"\n[cloud]\nprofile = "cloud-gpu"\n'
         '[[device]]\nname = "phone"\nprofile = "phone-mid"\ncount = 2\n'
         '[[device.drift]]\nround = 2\nflops_scale = 0.01\n')


def _settings(tmp_path: Path) -> RunSettings:
    fleet = tmp_path / "drift.toml"
    fleet.write_text(FLEET)  # the phones 100x slower from round 2: one run moves their blocks after it
    return RunSettings(rounds=3, clients=2, tiers=2, cuts="adaptive", fleet=str(fleet), batch_size=32, lr=0.05,
                       seed=2, node_wait_s=5.0, round_timeout_s=30.0)


def _run(monkeypatch: pytest.MonkeyPatch, settings: RunSettings) -> None:
    with inprocess_tiers(monkeypatch, settings.tiers - 1):
        server.app.run(FakeGrid(clients.app.app, settings.clients), settings, progress=lambda line: None)


def _rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_records_the_decision_that_moved_its_cuts_as_one_run_does(monkeypatch, tmp_path) -> None:
    s = _settings(tmp_path)
    _run(monkeypatch, s.with_(out=str(tmp_path / "whole")))
    _run(monkeypatch, s.with_(out=str(tmp_path / "part"), rounds=2))
    before = _rows(tmp_path / "part")
    assert before[1]["decision"]["reason"] == "last round"  # true of a 2-round run
    _run(monkeypatch, s.with_(out=str(tmp_path / "part"), resume=True))
    whole, part = _rows(tmp_path / "whole"), _rows(tmp_path / "part")
    assert whole[2]["moved"] == part[2]["moved"] == {"client0": [[7], [0]], "client1": [[7], [0]]}
    assert part[1]["decision"]["moved"] == ["client0", "client1"]
    assert part[1]["decision"]["reason"].startswith("gain ") and part[1]["decision"]["reason"].endswith(
        " s over 1 round(s)")
    assert [r["decision"] for r in part] == [r["decision"] for r in whole]  # exactly: the same beliefs
    assert [r["round"] for r in part] == [1, 2, 3]
    # the amended row keeps the rest of it, in its order; the row before it is as it was
    assert list(part[1]) == list(before[1]) and part[0] == before[0]
    assert {**part[1], "decision": None} == {**before[1], "decision": None}
    # the report still reads the run, its moves included
    assert cli(["report", str(tmp_path / "part"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "rounds.csv").is_file()


def test_a_crash_in_the_first_resumed_round_leaves_a_run_that_resumes(monkeypatch, tmp_path) -> None:
    """The last row is amended after the first resumed round's checkpoint, before that round's row. A crash
    before that checkpoint leaves the row as the checkpoint before keeps a copy of it (amended, a resume from
    that checkpoint would be refused: the file's row is not its copy); a crash after it leaves the amended row,
    and the resume puts the lost row back."""
    s = _settings(tmp_path).with_(out=str(tmp_path / "part"))
    _run(monkeypatch, s.with_(rounds=2))

    real_save, real_append = checkpoint.save, MetricsWriter.append

    def save(folder: str, ckpt: checkpoint.Checkpoint) -> None:
        if ckpt.round == 3:
            raise RunFolderError("cannot write the checkpoint: no space left on device")
        real_save(folder, ckpt)

    def append(self: MetricsWriter, row: dict) -> None:
        if row["round"] == 3:
            raise RunFolderError("cannot write the row: no space left on device")
        real_append(self, row)

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "save", save)
        with pytest.raises(RunFolderError, match="checkpoint: no space left"):
            _run(monkeypatch, s.with_(resume=True))
    assert _rows(tmp_path / "part")[1]["decision"]["reason"] == "last round"  # as round 2's checkpoint has it
    with monkeypatch.context() as m:
        m.setattr(MetricsWriter, "append", append)
        with pytest.raises(RunFolderError, match="row: no space left"):
            _run(monkeypatch, s.with_(resume=True))
    rows = _rows(tmp_path / "part")
    assert [r["round"] for r in rows] == [1, 2] and rows[1]["decision"]["moved"] == ["client0", "client1"]
    assert checkpoint.load(tmp_path / "part").round == 3
    _run(monkeypatch, s.with_(resume=True, rounds=4))  # the checkpoint's row of round 3 is put back
    rows = _rows(tmp_path / "part")
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["decision"]["moved"] == ["client0", "client1"] and rows[2]["moved"]


def test_amend_sets_fields_of_one_row_and_keeps_the_others(tmp_path) -> None:
    writer = MetricsWriter(tmp_path)
    for r in (1, 2, 3):
        writer.append({"round": r, "decision": {"reason": "already optimal"}, "loss": float(r)})
    writer.amend(2, decision={"moved": ["client0"], "reason": "gain 3 s over 4 round(s)"})
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == [
        '{"round": 1, "decision": {"reason": "already optimal"}, "loss": 1.0}',
        '{"round": 2, "decision": {"moved": ["client0"], "reason": "gain 3 s over 4 round(s)"}, "loss": 2.0}',
        '{"round": 3, "decision": {"reason": "already optimal"}, "loss": 3.0}',
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary file left
