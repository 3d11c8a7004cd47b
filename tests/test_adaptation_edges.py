"""Edges of online adaptation and of how its runs are shown: an Adapter observed at a round outside 1..rounds
(0, -1, one past the last, 2.5, True: taken); given cuts for a client its scenario lacks (dropped unsaid; a
resumed run's node that did not come back is now left out by ``AdaptivePolicy`` instead); the drift figure that
marked only the first of several drift rounds; the table of cuts per device class that showed the first and the
last round only (a move and its reversal read as no change)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulations import drift
from splitfed.cost import Scenario
from splitfed.errors import ConfigError
from splitfed.optimizer import Adapter, Measurement
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile
from splitfed.report import plots
from splitfed.report.runs import rows_to_run
from splitfed.report.table import class_table, end_of_run
from tests.plot_fixtures import saved_figures

# block 1: 100 MFLOP/sample and 1.5 MB of weights (as in tests/test_adapt_inputs.py)
PROF = ModelProfile.synthetic([1e6, 1e8], [1e3, 10], [1e3, 1.5e6], input_bytes=1e3)


def _fleet(*names: str) -> Scenario:
    devs = tuple(Client(n, "pi", TierProfile(1e9, 1e9), LinkProfile(1e8, 0.8e6, 0.0), samples=100) for n in names)
    return Scenario(PROF, devs, (TierProfile(5e9, 1e10),), (), batch=10)


# ---------------------------------------------------------------- the round observed


@pytest.mark.parametrize("bad", [0, -1, 6, 2.5, True, 1.0, "1"])
def test_an_adapter_refuses_to_observe_a_round_outside_its_rounds(bad: Any) -> None:
    """Round 0 or -1 planned over more rounds than the run has left; 6 of 5 read as the last; 2.5, True and
    1.0 were taken as round numbers. Refused before anything is learned from the round."""
    adapter = Adapter(_fleet("a", "b"), rounds=5, assignment={"a": (1,), "b": (1,)})
    with pytest.raises(ConfigError) as e:
        adapter.observe(bad, {"a": Measurement(1e9, 0.1)})
    assert str(e.value) == f"round must be in 1..5 (an integer), got round={bad!r}"
    assert [c.device.flops for c in adapter.belief.clients] == [1e9, 1e9]  # nothing learned
    assert adapter.history == []


def test_an_adapter_observes_its_first_and_last_round_and_a_numpy_round() -> None:
    adapter = Adapter(_fleet("a"), rounds=5, assignment={"a": (1,)})
    assert [adapter.observe(r, {}).round for r in (1, np.int64(3), 5)] == [1, 3, 5]
    assert adapter.history[-1].reason == "last round"


# ---------------------------------------------------------------- the cuts given


def test_an_adapter_refuses_cuts_given_for_a_client_it_lacks_with_the_nearest_name() -> None:
    """Before: dropped unsaid, so a misspelt name's cuts were lost and its client planned anew."""
    with pytest.raises(ConfigError) as e:
        Adapter(_fleet("pi-home-0", "pi-home-1"), rounds=5, assignment={"pi-home-0": (1,), "pi-hom-1": (0,)})
    assert str(e.value) == ("assignment: no client named 'pi-hom-1' (did you mean 'pi-home-1'?); "
                            "clients: pi-home-0, pi-home-1")
    with pytest.raises(ConfigError) as e:
        Adapter(_fleet("a", "b"), rounds=5, assignment={"a": (1,), "b": (1,), "gone": (0,)})
    assert str(e.value) == "assignment: no client named 'gone'; clients: a, b"


def test_a_resumed_adaptive_run_whose_node_did_not_come_back_resumes_with_the_rest() -> None:
    """The checkpoint names client3, whose node is gone: the policy hands the Adapter the saved cuts of the
    clients present only, which keep them (nothing was learned that would move them)."""
    from splitfed.flower.adaptive import AdaptivePolicy
    from splitfed.flower.config import RunSettings
    from splitfed.flower.policy import ClientInfo
    from splitfed.sim.clock import fleet_for

    settings = RunSettings(cuts="adaptive", fleet="small", clients=4, rounds=5)
    kinds = [c.name for c in fleet_for(settings).clients]
    first = [ClientInfo(f"client{i}", i + 1, i, kinds[i % len(kinds)], 100) for i in range(4)]
    before = AdaptivePolicy(settings)
    cuts = before.assign(1, first)
    saved = before.state_dict()
    assert set(saved["assignment"]) == {"client0", "client1", "client2", "client3"}
    after = AdaptivePolicy(settings)
    after.load_state_dict(saved)
    got = after.assign(2, first[:3])  # client3's node is gone
    assert got == {c.client_id: cuts[c.client_id] for c in first[:3]}
    assert set(after.adapter.assignment) == {"client0", "client1", "client2"}


# ---------------------------------------------------------------- the drift figure


def test_the_drift_figure_marks_every_drift_round_and_its_title_says_them(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A device that drifts at rounds 2 and 4 (and at 9, past the run): both rounds of the run are marked and
    named in the title; before, round 2 only."""
    fleet = tmp_path / "two.toml"
    fleet.write_text('[edge]\nprofile = "edge-server"\n[cloud]\nprofile = "cloud-gpu"\n[[device]]\nname = "pi"\n'
                     'profile = "rpi4"\n[[device.drift]]\nround = 2\nflops_scale = 0.5\n'
                     '[[device.drift]]\nround = 4\nup_scale = 0.5\n[[device.drift]]\nround = 9\nflops_scale = 2\n')
    cuts = {"client0": [2, 5], "client1": [2, 5]}
    rows = [{"round": r, "accuracy": 0.1 * r, "sim_round_s": 1.0, "cuts": cuts,
             "classes": dict.fromkeys(cuts, "rpi4")} for r in range(1, 7)]
    monkeypatch.setattr(drift, "run_cases", lambda cases, out, backend: [rows_to_run(rows, label=lb)
                                                                         for lb, _ in cases])
    monkeypatch.setattr(drift, "report_runs", lambda *a, **k: {})
    drawn: list[dict[str, Any]] = []
    monkeypatch.setattr(plots, "makespan_plot", lambda runs, path, **k: drawn.append(k) or path)
    cfg = drift.Config(simulate={"clients": 2, "rounds": 6, "model": "cnn", "dataset": "digits", "partition": "iid",
                                 "cuts": "static:2,5", "seed": 0, "fleet": str(fleet)},
                       backend="inprocess", policies=("static:2,5",), tail_rounds=1)
    res = drift.run(cfg, tmp_path / "out")
    assert res["drifting_clients"] == {"client0": [2, 4, 9], "client1": [2, 4, 9]}
    assert drawn == [{"mark_round": [2, 4],
                      "title": "Simulated round time; device(s) client0, client1 change at rounds 2, 4"}]


def test_makespan_plot_draws_a_line_before_each_marked_round(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """Several rounds: one line each, named by its round; one round as an int draws one line as before."""
    figs = saved_figures(monkeypatch)
    runs = [rows_to_run([{"round": r, "accuracy": 0.5, "sim_round_s": 1.0} for r in range(1, 7)], "a")]
    plots.makespan_plot(runs, tmp_path / "m.png", mark_round=[4, 2])
    plots.makespan_plot(runs, tmp_path / "n.png", mark_round=3)
    lines = [(str(x.get_label()), list(x.get_xdata())) for x in figs[0].axes[0].get_lines()]
    assert lines[1:] == [("change from round 2", [1.5, 1.5]), ("change from round 4", [3.5, 3.5])]
    assert [str(x.get_label()) for x in figs[1].axes[0].get_lines()] == ["a", "change from round 3"]


# ---------------------------------------------------------------- the table of cuts per device class


def _rows(cuts_per_round: list[dict[str, list[int]]]) -> list[dict[str, Any]]:
    classes = {"client0": "pi-0", "client1": "pi-1", "client2": "phone-0"}
    return [{"round": r, "accuracy": 0.5, "sim_round_s": 1.0, "cuts": cuts,
             "per_client": {c: {"profile": classes[c], "cuts": v} for c, v in cuts.items()}}
            for r, cuts in enumerate(cuts_per_round, start=1)]


def test_the_class_table_counts_each_move_a_reversal_included() -> None:
    """client0 moves to 2 and back (2 moves: the first and the last round alike); client1 is absent from round 3
    and back with other cuts in round 4 (no move: it was in no consecutive pair that changed); phone: none."""
    a, b = [1, 5], [2, 5]
    table = class_table(rows_to_run(_rows([{"client0": a, "client1": a, "client2": a},
                                           {"client0": b, "client1": a, "client2": a},
                                           {"client0": a, "client2": a},
                                           {"client0": a, "client1": b, "client2": a}]), "run"))
    assert table.split("\n") == [
        "run: cuts per device class",
        "device class  clients  cuts round 1  cuts round 4  moves",
        "------------  -------  ------------  ------------  -----",
        "phone               1  1,5           1,5               0",
        "pi                  2  1,5 x2        1,5; 2,5          2",
    ]


def test_a_run_of_one_round_has_no_moves_column() -> None:
    text = end_of_run(_rows([{"client0": [1, 5]}]))
    assert text.split("cuts per device class\n")[1].split("\n")[0] == "device class  clients  cuts round 1"


def test_cuts_in_force_that_do_not_fit_are_moved_with_a_short_reason() -> None:
    """A resumed run's cuts that its devices can no longer hold (block 1's 1.5 MB of weights on a 1 MB device)
    move at once, whatever moving costs; the reason names the first three clients over their device and counts
    the rest (it joined every client's violation: a line as long as the fleet)."""
    names = [f"d{i}" for i in range(12)]
    devs = tuple(Client(n, "pi", TierProfile(1e9, 1e6), LinkProfile(1e8, 0.8e6, 0.0), samples=100) for n in names)
    sc = Scenario(PROF, devs, (TierProfile(5e9, 1e10),), (), batch=10)
    adapter = Adapter(sc, rounds=5, assignment={n: (2,) for n in names})
    decision = adapter.observe(1, {})
    assert sorted(decision.moved) == sorted(names) and all(c == (1,) or c == (0,) for c in adapter.assignment.values())
    head, _, rest = decision.reason.partition(": ")
    assert head == "the cuts in force do not fit"
    assert [v.split(":")[0] for v in rest.split("; ")[:3]] == ["d0", "d1", "d2"]
    assert rest.endswith("; and 9 more") and rest.count("; ") == 3
