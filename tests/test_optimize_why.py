"""``splitfed optimize`` says what sets a proven optimum's makespan (``why:``; ``--json``: ``why``).

A user whose plan is no faster than a static cut asks why: on a straggler-bound fleet the answer is that one
device needs the makespan even alone. The line is the one the optimizer benchmark prints
(:func:`splitfed.optimizer.explain.explain`), and only for a proven optimum (the MILP's, brute force's): its
reasons say nothing of a policy priced as it is, nor of an answer cut short by the time limit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from splitfed.cli import main
from splitfed.commands.optimize import JSON_KEYS
from splitfed.cost import Scenario
from splitfed.models.zoo import resolve_spec
from splitfed.optimizer import exhaustive, greedy, solve
from splitfed.optimizer.compare import why
from splitfed.optimizer.explain import bound, explain, fastest_alone
from splitfed.profile.fleet import load_fleet
from splitfed.profile.profiler import default_cache_dir, profile_model

# two fast devices and one on a slow uplink, whose raw inputs take seconds to cross it whatever the cut
STRAGGLER = """
name = "straggler"
samples = 64
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "fast"
profile = "laptop"
count = 2
[[device]]
name = "slow"
profile = "rpi4"
up_mbps = 0.5
"""


@pytest.fixture()
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "straggler.toml"
    p.write_text(STRAGGLER)
    return str(p)


def _scenario(path: str) -> Scenario:
    prof = profile_model(resolve_spec("mlp", None, None), 32, reps=1, cache_dir=default_cache_dir())
    return Scenario.from_fleet(prof, load_fleet(path))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["optimize", "--model", "mlp", *argv]) == 0
    return capsys.readouterr().out


def test_a_straggler_bound_optimum_says_no_policy_can_be_faster(fleet: str, capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    out = _run(capsys, "--fleet", fleet)
    last = out.rstrip("\n").splitlines()[-1]
    assert last.startswith("why: straggler-bound: a slow client needs "), out
    assert last.endswith("; no policy can be faster") and "device->edge up at 0.5 Mbit/s is " in last, last
    # the seconds it quotes are the slow device's own best, which is the makespan
    sc = _scenario(fleet)
    alone, cuts = fastest_alone(sc, next(c for c in sc.clients if c.kind == "slow"))
    assert f"needs {alone:.1f} s even alone at its best cuts {','.join(map(str, cuts))} (" in last
    assert solve(sc).makespan_s == pytest.approx(alone, rel=1e-9)
    assert last == "why: " + explain(sc, solve(sc).cost)


def test_json_carries_the_same_line_and_names_the_key(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    got = json.loads(_run(capsys, "--fleet", fleet, "--json"))
    assert set(got) == set(JSON_KEYS) and "why" in JSON_KEYS
    assert got["why"].startswith("straggler-bound: a slow client needs ")
    assert "why" in " ".join(_help(capsys).split())


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    return capsys.readouterr().out


def test_brute_force_is_a_proven_optimum_too(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "--fleet", fleet, "--exhaustive")
    assert out.rstrip("\n").splitlines()[-1].startswith("why: straggler-bound: a slow client needs ")


@pytest.mark.parametrize("flag", [["--static", "1,2"], ["--greedy"], ["--best-static"], ["--all-on-server"]])
def test_a_priced_policy_gets_no_why(fleet: str, capsys: pytest.CaptureFixture[str], flag: list[str]) -> None:
    """A policy's makespan may be set by cuts it merely took: "its faster cuts would put more on the servers"
    would be false of it."""
    out = _run(capsys, "--fleet", fleet, *flag)
    assert "why:" not in out
    assert json.loads(_run(capsys, "--fleet", fleet, *flag, "--json"))["why"] is None


def test_an_answer_cut_short_or_infeasible_gets_no_why(fleet: str) -> None:
    sc = _scenario(fleet)
    best = solve(sc)
    assert why(sc, best) == explain(sc, best.cost)
    assert why(sc, exhaustive(sc)) is not None
    assert why(sc, dataclasses.replace(best, optimal=False)) is None  # the time limit ran out
    assert why(sc, greedy(sc)) is None
    tight = dataclasses.replace(best, cost=dataclasses.replace(best.cost, violations=("edge: 2 MiB over",)))
    assert why(sc, tight) is None


def test_bound_names_the_straggler_a_held_back_client_and_a_shared_resource(fleet: str) -> None:
    sc = _scenario(fleet)
    best = solve(sc).cost
    assert bound(sc, best) == "straggler"
    # the same client, a hair over its own best: held back by something else
    assert bound(sc, dataclasses.replace(best, makespan_s=best.makespan_s * (1 + 2e-9))) == "client"
    assert bound(sc, dataclasses.replace(best, bottleneck="edge compute")) == "shared"
