"""Work the optimizer does once: under ``prefer`` the move-priced classes are built once for both tie searches, and
``--best-static``'s exact pricing of its best-ranked vectors stops at the time limit (on ~100,000 clients its eight
passes over the fleet took ~21 s whatever ``--time-limit`` said)."""

from __future__ import annotations

import json

import pytest

from splitfed.cli import main
from splitfed.cost import Scenario
from splitfed.optimizer import best_static, defaults, solve, static
from splitfed.optimizer import classes as opt_classes
from splitfed.optimizer import ties as opt_ties
from tests.test_optimizer_move_ties import reference  # noqa: F401  (a fixture)


def test_both_tie_searches_under_prefer_price_the_moves_once(reference: Scenario,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-solve with half the fleet's cuts known runs both searches (least move, then least time among those):
    the classes priced with move costs are built once, and the answer is the one each search builds its own for."""
    sc = reference
    known = {c.name: solve(sc).assignment[c.name] for c in sc.clients[::2]}
    plain = solve(sc)
    chosen, _ = opt_ties.closest(sc, plain.cost, known, 1e-9, defaults.DEFAULT_GAP, None)
    separate, _ = opt_ties.least_time_moving(sc, chosen, known, plain.makespan_s * (1 + 1e-9), None)
    built = []
    classes = opt_classes.price_classes

    def counted(sc: Scenario, prefer: dict | None = None, **rest: object) -> list:
        built.append(prefer is not None)
        return classes(sc, prefer=prefer, **rest)  # solve passes its deadline

    monkeypatch.setattr(opt_ties, "price_classes", counted)  # the tie searches' (solve's own has no prefer)
    got = solve(sc, prefer=known)
    assert built.count(True) == 1, built
    assert "least client time among those" in got.note, got.note  # the second search did run, on the same classes
    assert got.assignment == separate.assignment()


def test_a_re_solve_prices_each_distinct_device_once(reference: Scenario,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The makespan's search and the move-priced classes of the tie searches take the same option tables: before,
    a re-solve (every adaptive round's) priced each distinct device twice (0.35 s of a 24 s re-solve of 1,000
    distinct vgg11 devices, whose MILPs take the most). The answer is the same."""
    sc = reference
    known = {c.name: solve(sc).assignment[c.name] for c in sc.clients[::2]}
    before = solve(sc, prefer=known)
    priced: list[tuple] = []
    real = opt_classes.option_table

    def counted(sc: Scenario, c: object) -> object:
        priced.append(opt_classes.client_key(c))  # type: ignore[arg-type]
        return real(sc, c)  # type: ignore[arg-type]

    monkeypatch.setattr(opt_classes, "option_table", counted)
    got = solve(sc, prefer=known)
    assert "least move cost among ties" in got.note or "least client time among those" in got.note, got.note
    assert len(priced) == len(set(priced)) == len({opt_classes.client_key(c) for c in sc.clients}), priced  # each once
    assert got.assignment == before.assignment and got.makespan_s == before.makespan_s


def test_best_static_stops_pricing_when_its_time_runs_out(reference: Scenario) -> None:  # noqa: F811
    sc = reference
    full = best_static(sc)
    assert full.note == ""
    cut = best_static(sc, time_limit=0.0)
    assert cut.note == "the time limit ran out after pricing 1 of the 8 best-ranked vectors", cut.note
    vector = cut.assignment[sc.clients[0].name]
    assert set(map(tuple, cut.assignment.values())) == {tuple(vector)}  # one vector for all, priced exactly
    assert cut.makespan_s == static(sc, vector).makespan_s >= full.makespan_s
    assert best_static(sc, time_limit=3600.0).assignment == full.assignment


def test_optimize_best_static_takes_the_time_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "--model", "cnn", "--fleet", "reference", "--best-static", "--time-limit", "1e-9",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"].startswith("best static ") and out["note"].startswith("the time limit ran out after pricing 1 ")
    assert main(["optimize", "--model", "cnn", "--fleet", "reference", "--best-static"]) == 0
    assert "time limit" not in capsys.readouterr().out
