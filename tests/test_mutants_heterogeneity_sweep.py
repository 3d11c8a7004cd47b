"""The heterogeneity sweep (simulations/heterogeneity_sweep.py): what a mutation run found no test pinned.

The config's edges (a fleet of one client, a solver limit under a second), the spread that scales a device's
numbers to exactly 0 (refused) or to small positive ones (kept), each policy's row priced by its own function
(a policy that fails is a row marked infeasible, its speed-up None), the rows' spread ratios, the progress line
flushed as it is printed, which points and curves each figure draws with which style, and the exact dashes,
markers and sizes that keep tied curves apart.

The sweep is cheap here: the four policies are stand-ins returning marked solutions (the cost model itself is
tested elsewhere), and ``run``'s figures are checked by a recorder standing in for ``line_plot`` (no drawing):
it keeps the series and keywords each figure was given.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import splitfed.optimizer as optimizer
from simulations import heterogeneity_sweep as hs
from splitfed.errors import ConfigError
from splitfed.profile import TierProfile, load_fleet
from splitfed.report import plots
from splitfed.report.plots import Series

PRICES = {"optimizer": 1.0, "best-static": 2.0, "greedy": 3.0, "all-on-server": 4.0}


def _solution(makespan: float, feasible: bool = True) -> Any:
    return SimpleNamespace(makespan_s=makespan, solve_s=0.0, optimal=False,
                           cost=SimpleNamespace(bottleneck="b", feasible=feasible))


@pytest.fixture
def priced(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """The four policies as stand-ins, each pricing every scenario at its own makespan (``PRICES``); the calls
    each got (the solver's time limit for the optimizer) are kept."""
    calls: dict[str, list[Any]] = {p: [] for p in PRICES}

    def solve(sc: Any, time_limit: float) -> Any:
        calls["optimizer"].append(time_limit)
        return _solution(PRICES["optimizer"])

    def one(name: str) -> Any:
        def f(sc: Any) -> Any:
            calls[name].append(sc)
            return _solution(PRICES[name])
        return f

    monkeypatch.setattr(optimizer, "solve", solve)
    monkeypatch.setattr(optimizer, "best_static", one("best-static"))
    monkeypatch.setattr(optimizer, "greedy", one("greedy"))
    monkeypatch.setattr(optimizer, "all_on_server", one("all-on-server"))
    return calls


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[list[Any], dict[str, Any]]]:
    """A recorder standing in for ``line_plot``: file name -> (series, keywords); nothing is drawn."""
    got: dict[str, tuple[list[Any], dict[str, Any]]] = {}

    def line_plot(series: list[Any], path: Path, **kw: Any) -> Path:
        got[Path(path).name] = (list(series), kw)
        return Path(path)

    monkeypatch.setattr(plots, "line_plot", line_plot)
    return got


# ---------------------------------------------------------------- config edges


def test_a_fleet_of_one_client_is_a_fleet_size() -> None:
    """``clients >= 1``: one client is the smallest fleet, taken (0 is refused, see test_heterogeneity_sweep)."""
    assert hs.Config(clients=(1,)).clients == (1,)
    assert hs.Config(clients=(1, 2)).clients == (1, 2)
    with pytest.raises(ConfigError, match=r"^clients: 0 is not a fleet size >= 1$"):
        hs.Config(clients=(1, 0))


def test_a_solver_limit_under_a_second_is_taken_and_reaches_the_optimizer(priced: dict[str, list[Any]]) -> None:
    """Any limit > 0 is one: half a second is the optimizer's limit, not refused."""
    cfg = hs.Config(model="cnn", clients=(1,), spreads=(0.0,), policies=("optimizer",), solve_time_limit_s=0.5)
    rows = hs.sweep(cfg)
    assert priced["optimizer"] == [0.5] and [r["makespan_s"] for r in rows] == [1.0]
    hs.Config(solve_time_limit_s=1e-3)


# ---------------------------------------------------------------- spread_fleet: the numbers a float holds


def _lopsided() -> Any:
    """Three clients, FLOP/s 1, 1e6, 1e6: the geometric mean is 1e4, one device 1e4 below it, two 1e2 above."""
    fleet = load_fleet("reference").sample(3, seed=0)
    link = fleet.clients[0].link
    flops = (1.0, 1e6, 1e6)
    return replace(fleet, clients=tuple(replace(c, device=TierProfile(f, c.device.memory), link=link)
                                        for c, f in zip(fleet.clients, flops, strict=True)))


def test_a_spread_that_scales_a_device_to_zero_flops_is_refused() -> None:
    """s = 100: the slow device's FLOP/s is 1e4 * 1e-400, 0 in a float (no OverflowError: 1e204 is the top);
    a device of 0 FLOP/s is refused with the spread named, never priced."""
    with pytest.raises(ConfigError, match=r"^spreads: 100 scales a device's FLOP/s or bandwidth of this fleet out "
                                          r"of the numbers a float holds \(overflow or 0\); use a smaller spread$"):
        hs.spread_fleet(_lopsided(), 100.0)


def test_a_spread_to_small_positive_numbers_is_kept() -> None:
    """s = 2: the slow device's FLOP/s becomes 1e4 * (1e-4) ** 2 = 1e-4, a positive finite number: kept."""
    wide = hs.spread_fleet(_lopsided(), 2.0)
    assert [c.device.flops for c in wide.clients] == pytest.approx([1e-4, 1e8, 1e8], rel=1e-9)


# ---------------------------------------------------------------- sweep: each policy's row


def test_each_policy_row_is_priced_by_its_own_policy(priced: dict[str, list[Any]]) -> None:
    """best-static, greedy and all-on-server each by their function (a swapped dispatch priced one as another)."""
    cfg = hs.Config(model="cnn", clients=(2,), spreads=(0.0,), policies=("greedy", "best-static", "all-on-server",
                                                                          "optimizer"))
    rows = hs.sweep(cfg)
    assert [(r["policy"], r["makespan_s"]) for r in rows] == [
        ("greedy", 3.0), ("best-static", 2.0), ("all-on-server", 4.0), ("optimizer", 1.0)]
    assert [len(priced[p]) for p in PRICES] == [1, 1, 1, 1]


def test_a_policy_that_fails_is_an_infeasible_row_and_no_speedup(monkeypatch: pytest.MonkeyPatch,
                                                                 priced: dict[str, list[Any]],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """No single static cut fits every device: best-static's row says infeasible with the reason, the run goes on,
    and its speed-up over the optimizer is None (not a point)."""
    def refuse(sc: Any) -> Any:
        raise ConfigError("no single static cut fits every device")

    monkeypatch.setattr(optimizer, "best_static", refuse)
    cfg = hs.Config(model="cnn", clients=(2,), spreads=(0.0,), policies=("optimizer", "best-static", "greedy"))
    rows = hs.sweep(cfg)
    failed = rows[1]
    assert failed == {**{k: failed[k] for k in ("clients", "spread", "flops_ratio", "bandwidth_ratio")},
                      "policy": "best-static", "makespan_s": None, "feasible": False,
                      "error": "no single static cut fits every device"}
    assert rows[2]["feasible"] is True and rows[2]["makespan_s"] == 3.0
    assert hs._speedups(rows, cfg) == [{"clients": 2, "spread": 0.0, "best-static": None, "greedy": 3.0}]
    assert "best-static=n/a" in capsys.readouterr().out


def test_rows_carry_the_spread_fleets_flops_and_bandwidth_ratios(priced: dict[str, list[Any]]) -> None:
    """max / min over the drawn fleet at that spread: 1 on a homogeneous fleet, the drawn ratio ** s otherwise."""
    cfg = hs.Config(model="cnn", clients=(6,), spreads=(0.0, 1.0, 2.0), policies=("greedy",))
    rows = hs.sweep(cfg)
    drawn = load_fleet("reference").sample(6, seed=0)
    flops = max(c.device.flops for c in drawn.clients) / min(c.device.flops for c in drawn.clients)
    up = max(c.link.up for c in drawn.clients) / min(c.link.up for c in drawn.clients)
    assert flops > 2 and up > 2  # the draw is heterogeneous, or the check says nothing
    assert [r["flops_ratio"] for r in rows] == pytest.approx([1.0, flops, flops ** 2], rel=1e-9)
    assert [r["bandwidth_ratio"] for r in rows] == pytest.approx([1.0, up, up ** 2], rel=1e-9)


def test_each_progress_line_is_flushed_as_it_is_printed(monkeypatch: pytest.MonkeyPatch,
                                                        priced: dict[str, list[Any]]) -> None:
    """A sweep of 10,000 clients takes minutes a line: piped to a log, each line shows when it is done, not at
    the end (``print`` is recorded in place of writing)."""
    printed: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(hs, "print", lambda *a, **kw: printed.append((a, kw)), raising=False)
    hs.sweep(hs.Config(model="cnn", clients=(2,), spreads=(0.0, 1.0), policies=("optimizer", "greedy")))
    assert [kw for _, kw in printed] == [{"flush": True}] * 2
    assert printed[0][0][0] == "  clients=     2 spread=0     optimizer=1s  greedy=3s"


# ---------------------------------------------------------------- run: the figures' points, curves and styles

CLIENTS = (10, 20, 30, 40, 50)
SPREADS = (0.0, 1.0)


def _rows() -> list[dict[str, Any]]:
    """Optimizer 1 s everywhere; greedy 1 + n/8 + s/4 s, over a server's memory at (10 clients, s = 1);
    all-on-server 16 + n/8 + s/2 s. Every ratio is exact and no two curves tie."""
    rows = []
    for n in CLIENTS:
        for s in SPREADS:
            rows.append({"clients": n, "spread": s, "policy": "optimizer", "makespan_s": 1.0, "feasible": True})
            rows.append({"clients": n, "spread": s, "policy": "greedy", "makespan_s": 1 + n / 8 + s / 4,
                         "feasible": not (n == 10 and s == 1.0)})
            rows.append({"clients": n, "spread": s, "policy": "all-on-server", "makespan_s": 16 + n / 8 + s / 2,
                         "feasible": True})
    return rows


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, policies: tuple[str, ...] = ("optimizer", "greedy",
                                                                                         "all-on-server"),
         rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    got = _rows() if rows is None else rows
    monkeypatch.setattr(hs, "sweep", lambda cfg: [r for r in got if r["policy"] in cfg.policies])
    cfg = hs.Config(model="cnn", clients=CLIENTS, spreads=SPREADS, policies=policies)
    return hs.run(cfg, tmp_path)


def _points(s: Any) -> tuple[str, list[float], list[float]]:
    return s.label, list(s.x), list(s.y)


def test_the_makespan_figure_draws_that_fleet_sizes_feasible_points_on_a_log_axis(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, drawn: dict[str, Any]) -> None:
    """Points over a server's memory are left out, other fleet sizes' points too; makespans span decades."""
    res = _run(monkeypatch, tmp_path)
    series, kw = drawn["makespan_vs_spread_10.png"]
    assert [_points(s) for s in series] == [("optimizer", [0.0, 1.0], [1.0, 1.0]), ("greedy", [0.0], [2.25]),
                                            ("all-on-server", [0.0, 1.0], [17.25, 17.75])]
    assert kw["logy"] is True
    assert set(res["figures"]) == {f"makespan_{n}" for n in CLIENTS} | {"speedup"}


def test_the_speedup_figure_draws_each_policy_per_fleet_size_in_its_own_style(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, drawn: dict[str, Any]) -> None:
    """One curve per (fleet size, policy other than the optimizer), that size's points only, a point left out
    where the policy has no speed-up; dashes by fleet size in turn ("-", "--", ":", "-.", then "-" again),
    colour by policy; the reference line at 1 (no gain)."""
    res = _run(monkeypatch, tmp_path)
    series, kw = drawn["speedup_vs_spread.png"]
    want = []
    for i, n in enumerate(CLIENTS):
        for j, (p, base, slope) in enumerate((("greedy", 1, 0.25), ("all-on-server", 16, 0.5))):
            xs = [0.0] if (p, n) == ("greedy", 10) else [0.0, 1.0]
            want.append((f"{p} / optimizer, {n} clients", xs, [base + n / 8 + s * slope for s in xs],
                         {"linestyle": ["-", "--", ":", "-.", "-"][i], "color": f"C{j}"}))
    assert [(*_points(s), s.style) for s in series] == want
    assert kw["hline"] == 1.0 and kw["hline_label"] == "no gain"
    assert res["figures"]["speedup"] == str(tmp_path / "speedup_vs_spread.png")


@pytest.mark.parametrize("policies", [("greedy", "all-on-server"), ("optimizer",)])
def test_no_speedup_figure_without_the_optimizer_and_another_policy(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, drawn: dict[str, Any], policies: tuple[str, ...]) -> None:
    """Nothing to divide by, or nothing to divide: no empty speed-up figure."""
    res = _run(monkeypatch, tmp_path, policies)
    assert "speedup" not in res["figures"] and "speedup_vs_spread.png" not in drawn
    assert res["speedups"] == ([] if "optimizer" not in policies else [{"clients": n, "spread": s}
                                                                       for n in CLIENTS for s in SPREADS])


def test_speedups_are_each_policys_makespan_over_the_optimizers_at_that_size_and_spread(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, drawn: dict[str, Any]) -> None:
    """Exact ratios per (clients, spread), None where the policy is over memory; the optimizer is no key."""
    rows = [{**r, "makespan_s": r["makespan_s"] * 2} if r["policy"] == "optimizer" and r["spread"] == 1.0 else r
            for r in _rows()]  # the optimizer at 2 s where s = 1: a ratio divides, it does not multiply
    res = _run(monkeypatch, tmp_path, rows=rows)
    want = [{"clients": n, "spread": s,
             "greedy": None if (n, s) == (10, 1.0) else (1 + n / 8 + s / 4) / (1 + s),
             "all-on-server": (16 + n / 8 + s / 2) / (1 + s)} for n in CLIENTS for s in SPREADS]
    assert res["speedups"] == want
    assert hs._speedups(rows, hs.Config(clients=(20,), spreads=(1.0,), policies=("optimizer", "greedy"))) == [
        {"clients": 20, "spread": 1.0, "greedy": (1 + 20 / 8 + 1 / 4) / 2}]


# ---------------------------------------------------------------- untie: tied curves' exact styles


def test_three_tied_curves_take_turns_along_one_dash_pattern_with_growing_hollow_markers() -> None:
    """Dashes 4 long with gaps for the other two (8), offset 0, 4, 8; markers o, s, D of 4, 6.5, 9 points, all
    but the first hollow; the curves' own colours kept."""
    same = ([0.0, 1.0], [2.0, 3.0])
    series = [Series(p, *same, {"color": f"C{i}", "linestyle": "-"}) for i, p in enumerate(("a", "b", "c"))]
    styles = [s.style for s in hs.untie(series + [Series("d", [0.0, 1.0], [5.0, 6.0], {"color": "C3"})])]
    assert styles == [
        {"color": "C0", "linestyle": (0.0, (4.0, 8.0)), "marker": "o", "markersize": 4.0, "markerfacecolor": None},
        {"color": "C1", "linestyle": (4.0, (4.0, 8.0)), "marker": "s", "markersize": 6.5,
         "markerfacecolor": "none"},
        {"color": "C2", "linestyle": (8.0, (4.0, 8.0)), "marker": "D", "markersize": 9.0,
         "markerfacecolor": "none"},
        {"color": "C3"}]


def test_two_tied_curves_share_one_dash_pattern_half_each() -> None:
    """Two: dashes 4 and gaps 4, the second 4 along; markers 4 and 6.5 points."""
    a, b = hs.untie([Series("a", [0.0], [1.0]), Series("b", [0.0], [1.0])])
    assert (a.style["linestyle"], b.style["linestyle"]) == ((0.0, (4.0, 4.0)), (4.0, (4.0, 4.0)))
    assert (a.style["markersize"], b.style["markersize"]) == (4.0, 6.5)


def test_curves_the_eye_cannot_tell_apart_are_tied() -> None:
    """3e-10 s apart (one policy's sum in another order) draws as one line: both untied, so both show."""
    a, b = hs.untie([Series("a", [0.0, 1.0], [1.0, 2.0]), Series("b", [0.0, 1.0], [1.0 + 3e-10, 2.0])])
    assert a.style["marker"] == "o" and b.style["marker"] == "s"
    assert math.isclose(b.style["markersize"], 6.5)
