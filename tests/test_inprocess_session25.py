"""The in-process backend says what it runs and what it wrote, and names its run as a Flower run does;
a round number that is not 1-based is refused in its own words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.workload import round_batches


def test_inprocess_run_is_named_and_says_what_it_runs_and_wrote(tmp_path: Path) -> None:
    from splitfed.sim.inprocess import train_inprocess

    lines: list[str] = []
    s = RunSettings(rounds=2, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=3, out=str(tmp_path / "r"))
    summary = train_inprocess(s, progress=lines.append)
    assert summary["settings"]["run_name"] == "splitfed-3"  # the name its tiers used (RunSettings.run_id)
    written = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert written["settings"]["run_name"] == "splitfed-3"
    assert lines[0] == ("clients: 2 of the 60 devices of fleet 'reference', drawn by seed 3: 1 pi-home, "
                        "1 phone-flagship")  # the draw, then the run
    assert lines[1] == "run splitfed-3: sflv1, 3 tiers, cuts static:1,3, 2 client(s), rounds 1..2 (in-process)"
    assert [x.split()[1] for x in lines[2:4]] == ["1/2", "2/2"]
    assert lines[-1] == f"wrote {tmp_path / 'r' / 'metrics.jsonl'} and {tmp_path / 'r' / 'summary.json'}"
    named = train_inprocess(s.with_(run_name="exp", out=str(tmp_path / "n")))
    assert named["settings"]["run_name"] == "exp"  # a given name is kept as given


@pytest.mark.parametrize(("rnd", "epochs", "said"), [
    (0, 1, "round (1-based) must be an integer >= 1, got 0"),
    (-2, 1, "round (1-based) must be an integer >= 1, got -2"),
    (1, 0, "epochs must be an integer >= 1, got 0"),
    (True, 1, "round (1-based) must be an integer >= 1, got True"),
    (1.0, 1, "round (1-based) must be an integer >= 1, got 1.0"),
])
def test_round_batches_refuses_a_round_that_is_not_1_based(rnd: object, epochs: object, said: str) -> None:
    x, y = torch.zeros(10, 2), torch.zeros(10, dtype=torch.int64)
    with pytest.raises(ConfigError) as e:
        round_batches(x, y, 4, 0, 0, rnd, epochs)  # type: ignore[arg-type]
    assert str(e.value) == said
    assert len(round_batches(x, y, 4, 0, 0, 1, 2)) == 6  # two passes of 3 batches


def test_an_inprocess_run_without_a_run_folder_writes_nothing(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``out`` empty: none written (RunSettings.out), as a Flower run. Before, the current folder was taken as the
    run folder: its metrics.jsonl, summary.json and lock file were left there. The summary is the one a run
    folder's files give."""
    from splitfed.sim.inprocess import train_inprocess

    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    s = RunSettings(rounds=2, clients=2, tiers=3, cuts="static:1,3", batch_size=64, seed=3)
    lines: list[str] = []
    bare = train_inprocess(s, progress=lines.append)
    assert list(here.iterdir()) == []
    assert not any(x.startswith("wrote ") for x in lines)
    kept = train_inprocess(s.with_(out=str(tmp_path / "r")))
    assert bare["rounds"] == kept["rounds"] == 2
    assert {k: v for k, v in bare.items() if k not in ("settings", "wall_s")} == \
           {k: v for k, v in kept.items() if k not in ("settings", "wall_s")}
