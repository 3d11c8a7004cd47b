"""The optimizer (splitfed/optimizer/), pinned where a mutation run found gaps: the brute-force size
limit and its message, which static cut wins and its refusal, the staged base of two clients, the tie that
moves least, the sl holder search and its limit, the proven gap, the solver staying quiet, the note's counts."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from splitfed.cost import Scenario, cut_options, evaluate
from splitfed.errors import ConfigError
from splitfed.optimizer import assign, best_static, exhaustive, solve, static
from splitfed.optimizer.brute_force import count_text
from splitfed.optimizer.classes import pareto, price_classes
from splitfed.optimizer.solver import run_milp
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

BIG = 1e15  # memory no option fills


def _model(L: int = 3) -> ModelProfile:
    return ModelProfile.synthetic([(i + 1) * 1e7 for i in range(L)], [(L - i) * 2e4 for i in range(L)],
                                  [(i + 2) * 1e5 for i in range(L)], input_bytes=3e4)


def _fleet(n: int, flops: float = 2e9, memory: float = BIG, kinds: int = 1) -> tuple[Client, ...]:
    devs = [TierProfile(flops * (k + 1), memory) for k in range(kinds)]
    return tuple(Client(f"c{i}", f"k{i % kinds}", devs[i % kinds], LinkProfile(4e6, 4e6, 0.01), 100)
                 for i in range(n))


def _scenario(n: int = 2, L: int = 3, tiers: int = 3, mode: str = "sflv1", server_flops: float = 5e10,
              server_memory: float = BIG, **kw: object) -> Scenario:
    servers = tuple(TierProfile(server_flops * (t + 1), server_memory) for t in range(tiers - 1))
    links = tuple(LinkProfile(2e7, 2e7, 0.005) for _ in range(tiers - 2))
    return Scenario(_model(L), _fleet(n, **kw), servers, links, batch=8, mode=mode)  # type: ignore[arg-type]


# ---------------------------------------------------------------- brute force: its size limit and messages


def test_exhaustive_limit_admits_exactly_the_limit() -> None:
    """limit = the number of assignments: checked (every one); one less: refused, with the exact count."""
    sc = _scenario(n=3, L=2)
    per = len(cut_options(2, 3))
    total = per ** 3
    sol = exhaustive(sc, limit=total)
    assert sol.note == f"{total:,} assignments checked"
    with pytest.raises(ConfigError, match=rf"would check {total:,} assignments \(limit {total - 1:,}\)"):
        exhaustive(sc, limit=total - 1)


def test_count_text_switches_to_the_log_form_at_1e15() -> None:
    assert count_text([10] * 14) == "100,000,000,000,000"
    assert count_text([10] * 15) == "~1e+15"
    assert count_text([7, 11]) == "77"


def test_exhaustive_and_static_report_no_gap_and_are_immutable() -> None:
    """Brute force and the policies claim no optimality gap (0 in their JSON); a Solution is a frozen value."""
    sc = _scenario(n=2, L=2)
    for sol in (exhaustive(sc), static(sc, (1, 2)), best_static(sc)):
        assert sol.gap == 0.0
        assert sol.to_dict()["gap"] == 0.0
    sol = exhaustive(sc)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sol.note = "changed"  # type: ignore[misc]


# ---------------------------------------------------------------- the best single cut vector


def test_best_static_is_the_best_of_every_static_when_the_server_is_shared() -> None:
    """50 clients share one edge: its load, not a client's own time, sets the makespan, so the best cut (all on
    the device) is the slowest for a client alone; it must still win (every legal cut vector priced)."""
    sc = _scenario(n=50, L=8, tiers=2, server_flops=2e10)
    truth = min(static(sc, o).makespan_s for o in sc.options)
    got = best_static(sc)
    assert got.makespan_s == truth
    assert got.method == "best static 8"


def test_best_static_refuses_when_the_cost_model_puts_every_fitting_cut_a_hair_over() -> None:
    """Devices that hold only cut 0, an edge a hair too small for it as the cost model adds it up: refused,
    naming the model (its screen lets memory within 1e-9 through; the exact price does not)."""
    base = _scenario(n=3, L=2, tiers=2, memory=1e6)
    need = evaluate(base, {c.name: (0,) for c in base.clients}).shared_memory["edge"]
    sc = dataclasses.replace(base, servers=(TierProfile(base.servers[0].flops, need / (1 + 5e-10)),))
    assert not evaluate(sc, {c.name: (0,) for c in sc.clients}).feasible
    with pytest.raises(ConfigError, match="no single cut vector fits every device and server of the fleet for "
                                          "synthetic"):
        best_static(sc)


# ---------------------------------------------------------------- the MILP: quiet, and its note's counts


def test_solve_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """HiGHS's log would corrupt the CLI's JSON on stdout."""
    solve(_scenario(n=3, L=3, kinds=2), gap=0.0)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_bisect_note_counts_a_class_options_once() -> None:
    """Identical clients are one class: its option count in the note does not grow with the clients (direct
    gives each client its own copy)."""
    one = solve(_scenario(n=1, L=3), gap=0.0)
    four = solve(_scenario(n=4, L=3), gap=0.0)
    direct = solve(_scenario(n=4, L=3), gap=0.0, method="direct")

    def options(note: str) -> int:
        return int(note.split(" non-dominated option(s)")[0].rsplit(" ", 1)[1])

    k = options(one.note)
    assert k >= 2
    assert "sflv1 bisect: 1 class(es)" in four.note and options(four.note) == k
    assert options(direct.note) == 4 * k
    assert four.makespan_s == direct.makespan_s


# ---------------------------------------------------------------- sflv1: the staged base with two clients


def test_two_clients_sharing_blocks_get_the_brute_force_optimum() -> None:
    """Two clients are enough to stage a base (the blocks both hold): with an edge too small for it beside
    their replicas, the MILP must model it, not find out from the cost model's refusals."""
    prof = ModelProfile.synthetic([3.7e8, 4.2e8], [3.1e4, 5e3], [5.4e5, 1.17e6], input_bytes=3e4)
    kind = (TierProfile(2.9e9, BIG), LinkProfile(4e5, 1.3e6, 0.01))
    clients = tuple(Client(f"c{i}", "k0", *kind, 100) for i in range(2))
    tot = 5.4e5 + 1.17e6
    sc = Scenario(prof, clients, (TierProfile(1e10, 4.7 * tot), TierProfile(3e10, 0.4 * tot)),
                  (LinkProfile(2e7, 2e7, 0.005),), batch=4, mode="sflv1")
    truth = exhaustive(sc)
    got = solve(sc, gap=0.0)
    assert got.makespan_s == pytest.approx(truth.makespan_s, rel=1e-9)
    assert evaluate(sc, got.assignment).feasible


# ---------------------------------------------------------------- the tie that moves least


def test_prefer_keeps_current_cuts_a_move_to_would_ship_nothing() -> None:
    """U-shape cuts (0,0), (1,1), (2,2) all leave every block on the device: among the optimal ties, clients
    already there keep their own label (moving ships nothing, but is still a change of cuts)."""
    prof = ModelProfile.synthetic([1e7, 1.2e8], [1.3e4, 3.3e4], [1.47e6, 6.3e5], input_bytes=3e4)
    kind = (TierProfile(6e8, BIG), LinkProfile(3.9e6, 2.2e6, 0.01))
    sc = Scenario(prof, tuple(Client(f"c{i}", "k0", *kind, 100) for i in range(4)), (TierProfile(7e9, 2.1e6),),
                  batch=4, u_shape=True, mode="sflv1")
    prefer = {"c0": (1, 1), "c1": (1, 2), "c2": (2, 2), "c3": (0, 0)}
    assert not evaluate(sc, prefer).feasible  # c1's cuts overflow the edge: someone must move
    plain = solve(sc, gap=0.0)
    got = solve(sc, gap=0.0, prefer=prefer)
    assert got.makespan_s == plain.makespan_s
    assert {n: got.assignment[n] for n in ("c0", "c2", "c3")} == {"c0": (1, 1), "c2": (2, 2), "c3": (0, 0)}
    assert got.assignment["c1"] != (1, 2)
    assert got.note.endswith("; least move cost among ties: 0.291 s")


# ---------------------------------------------------------------- sl: the holder search, and its limit


def _holder_scenario() -> Scenario:
    """sl, U-shape, an edge of 122 MB: device a (fast, too small for block 0's activations) is fastest with
    block 0 alone on the edge (120.27 MB with its turn, 10 kB held), b (slow) with both there (5.01 MB held):
    together they overflow the edge, so the fastest options are not an answer and the holder size decides."""
    prof = ModelProfile.synthetic([1e8, 1e8], [5e6, 1e4], [1e4, 5e6], input_bytes=3e4)
    clients = (Client("a", "a", TierProfile(1e11, 55.33e6), LinkProfile(1e10, 1e10, 0.01), 100),
               Client("b", "b", TierProfile(1e6, BIG), LinkProfile(1e7, 1e7, 0.01), 100))
    return Scenario(prof, clients, (TierProfile(1e8, 122e6),), batch=8, u_shape=True, mode="sl")


def test_sl_holder_search_matches_brute_force() -> None:
    sc = _holder_scenario()
    fastest = {"a": (0, 1), "b": (0, 2)}
    assert not evaluate(sc, fastest).feasible
    truth = exhaustive(sc)
    got = solve(sc, gap=0.0)
    assert got.note.startswith("sl sequential:")
    assert got.makespan_s == truth.makespan_s
    assert got.assignment == {"a": (0, 2), "b": (0, 2)}


@pytest.mark.parametrize(("limit", "method"), [(18, "sequential"), (17, "bisect"), (0, "bisect")])
def test_sl_past_the_holder_limit_the_milp_answers(monkeypatch: pytest.MonkeyPatch, limit: int, method: str) -> None:
    """The search tries 3 holder sizes (10 kB, 5 MB, 5.01 MB: every held value from the largest least one to
    the edge's memory) x 6 options (a: 2, b: 4) = 18: a limit of 18 still searches, past it the MILP (bisect)
    answers instead, with the same optimum."""
    monkeypatch.setattr(assign, "HOLDER_CANDIDATES", limit)
    sc = _holder_scenario()
    got = solve(sc, gap=0.0)
    assert got.note.startswith(f"sl {method}: 2 class(es), 6 non-dominated option(s)")
    assert got.makespan_s == pytest.approx(exhaustive(sc).makespan_s, rel=1e-9)
    assert got.optimal


# ---------------------------------------------------------------- the proven gap a loose MILP reports


def test_a_loose_gap_reports_a_true_proven_gap() -> None:
    """gap=0.9: HiGHS stops at an answer it only proves within some gap; that gap is reported (<= 0.9, in the
    note too) and is a true bound: the optimum (brute force) is no lower than makespan * (1 - gap), and a gap
    of 0 claims the optimum itself."""
    prof = ModelProfile.synthetic([1.2e8, 9e7, 4e8], [5.2e4, 3.5e4, 3e3], [3.8e5, 1.33e6, 1.73e6], input_bytes=3e4)
    fast = (TierProfile(8e8, BIG), LinkProfile(2.7e6, 2.9e6, 0.01))
    slow = (TierProfile(1e8, BIG), LinkProfile(1.8e6, 1.6e6, 0.01))
    clients = tuple(Client(f"c{i}", f"k{i % 2}", *(slow if i % 2 else fast), n)
                    for i, n in enumerate((138, 101, 92, 93, 116)))
    sc = Scenario(prof, clients, (TierProfile(5e8, BIG),), batch=12)
    got = solve(sc, gap=0.9, method="direct")
    truth = exhaustive(sc).makespan_s
    assert 0.0 <= got.gap <= 0.9
    assert got.note.endswith(f"proven gap {got.gap:.1e}")
    assert truth >= got.makespan_s * (1 - got.gap) * (1 - 1e-9)
    assert got.makespan_s >= truth
    assert got.gap > 0 or got.makespan_s == pytest.approx(truth, rel=1e-9)  # (this HiGHS stops above it)


def test_bisect_with_a_loose_gap_claims_no_proof_it_lacks() -> None:
    """bisect, gap=0.9: its last (optimising) MILP stops early, above the optimum; the reported gap must
    still bound the optimum (not 0 from the bisection's tau, which only bounds the answer from above)."""
    prof = ModelProfile.synthetic([2.6e8], [5.2e4], [2.7e6], input_bytes=3e4)
    kinds = [(TierProfile(3e8, 30.78e6), LinkProfile(2.1e6, 1.4e6, 0.01)),
             (TierProfile(1e8, 40.5e6), LinkProfile(1.9e6, 3.8e6, 0.01)),
             (TierProfile(2.8e9, 28.89e6), LinkProfile(2.1e6, 2.8e6, 0.01))]
    clients = tuple(Client(f"c{i}", f"k{i % 3}", *kinds[i % 3], n)
                    for i, n in enumerate((146, 132, 111, 93, 147, 83, 128)))
    sc = Scenario(prof, clients, (TierProfile(8e8, BIG), TierProfile(7e8, BIG)),
                  (LinkProfile(2.1e6, 2e7, 0.005),), batch=14)
    got = solve(sc, gap=0.9, method="bisect")
    truth = exhaustive(sc).makespan_s
    assert got.makespan_s >= truth
    assert truth >= got.makespan_s * (1 - got.gap) * (1 - 1e-9)
    assert 0.0 <= got.gap <= 0.9
    assert got.gap > 0 or got.makespan_s == pytest.approx(truth, rel=1e-9)


# ---------------------------------------------------------------- internals a user meets through them


def test_pareto_of_few_rows_with_many_columns() -> None:
    """sflv1's dominance columns include one per (staged tier, block): a big model's few options can have
    more than 256 columns; the front is still one flag per row."""
    V = np.zeros((3, 300))
    V[1] += 1.0  # dominated by row 0
    V[2, 0] = -1.0  # better than row 0 in one column, worse in another
    V[2, 299] = 2.0
    assert pareto(V).tolist() == [True, False, True]


def test_milp_stopped_by_its_time_limit_before_any_answer_is_unknown() -> None:
    """HiGHS out of time with no solution yet: "no answer, not proven" (the caller then says the time limit
    ran out), not an error."""
    prof = ModelProfile.synthetic([1.2e8, 9e7, 4e8], [5.2e4, 3.5e4, 3e3], [3.8e5, 1.33e6, 1.73e6], input_bytes=3e4)
    clients = tuple(Client(f"c{i}", f"k{i}", TierProfile(1e8 * (i + 1), BIG), LinkProfile(2e6, 2e6, 0.01), 100)
                    for i in range(5))
    sc = Scenario(prof, clients, (TierProfile(5e8, BIG),), batch=12)
    classes = price_classes(sc)
    r = run_milp(sc, classes, [np.arange(len(c.T)) for c in classes], time_rows=True, scale=1.0, gap=0.0,
              time_limit=1e-12, mem_rhs=np.ones(1))
    assert (r.counts, r.value, r.bound, r.optimal) == ([], math.inf, 0.0, False)
