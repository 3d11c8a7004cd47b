"""The heterogeneity sweep's config checks and its figures' tied curves (no pricing beyond a tiny fleet)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulations import heterogeneity_sweep
from simulations.common import load_config
from splitfed.errors import ConfigError


@pytest.mark.parametrize("text, words", [
    ("spreads = [nan]", "spreads: nan is not a finite number >= 0"),  # before: IndexError in optimizer/assign.py
    ("spreads = [inf]", "spreads: inf is not a finite number >= 0"),  # before: ZeroDivisionError in _ratio
    ("spreads = [-0.5]", "spreads: -0.5 is not a finite number >= 0"),
    ("spreads = []", "spreads must list at least one spread factor"),
    ("policies = []", "policies must name at least one of optimizer, best-static, greedy, all-on-server"),
    ('policies = ["optimal"]', "policies: unknown 'optimal' (known: optimizer, best-static, greedy, all-on-server)"),
    ("solve_time_limit_s = -1.0", "solve_time_limit_s must be > 0 seconds, got -1.0"),  # before: run as 0.1 s
    ("solve_time_limit_s = 0.0", "solve_time_limit_s must be > 0 seconds, got 0.0"),
    ("solve_time_limit_s = nan", "solve_time_limit_s must be > 0 seconds, got nan"),
    ("clients = [0]", "clients: 0 is not a fleet size >= 1"),
    ("clients = []", "clients must list at least one fleet size"),
    ("clients = [20, 20]", "clients lists 20 twice"),  # before: computed and plotted twice
    ("spreads = [0, 0.0]", "spreads lists 0.0 twice"),
    ('policies = ["greedy", "greedy"]', "policies lists 'greedy' twice"),
])
def test_a_bad_config_is_refused_in_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            text: str, words: str) -> None:
    key, value = text.split(" = ")
    cfg = tmp_path / "c.toml"
    cfg.write_text("".join(f"{k} = {v}\n" for k, v in {"model": '"cnn"', "clients": "[20]", "spreads": "[0.0, 1.0]",
                                                        key: value}.items()))
    with pytest.raises(ConfigError, match="^" + re.escape(f"{cfg}: {words}") + "$"):
        load_config(cfg, heterogeneity_sweep.Config)
    assert heterogeneity_sweep.cli(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert err == f"simulations.heterogeneity_sweep: error: {cfg}: {words}\n"
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_spread_too_large_for_the_fleet_is_refused_before_any_pricing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finite, but the fleet's FLOP/s or bandwidths overflow or vanish at that spread (before: a traceback)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('model = "cnn"\nclients = [20]\nspreads = [0.0, 1000.0]\npolicies = ["greedy"]\n')
    assert heterogeneity_sweep.cli(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("simulations.heterogeneity_sweep: error: spreads: 1000 scales ") and err.count("\n") == 1
    assert "clients=" not in out  # nothing was priced


def test_tied_curves_get_distinct_styles_so_both_show(tmp_path: Path) -> None:
    from splitfed.report.plots import Series, line_plot

    same = ([0.0, 1.0, 2.0], [1.0, 1.0, 1.0])
    series = [Series("best-static", *same, {"color": "C0", "linestyle": "-"}),
              Series("greedy", *same, {"color": "C1", "linestyle": "-"}),
              Series("all-on-server", [0.0, 1.0, 2.0], [2.0, 3.0, 4.0], {"color": "C2", "linestyle": "-"})]
    styled = heterogeneity_sweep.untie(series)
    a, b, c = (s.style for s in styled)
    assert a["linestyle"] != b["linestyle"] and a.get("marker") != b.get("marker")
    assert (a["color"], b["color"]) == ("C0", "C1") and c == series[2].style  # a curve that ties nothing: as it was
    line_plot(styled, tmp_path / "p.png", title="t", xlabel="x", ylabel="y", hline=1.0)
    assert (tmp_path / "p.png").stat().st_size > 1000
