"""Laws of ``splitfed optimize --compare`` (:func:`splitfed.optimizer.compare.compare`) over random scenarios
(every mode, 2 to 4 tiers, memory that binds or not): each entry is what its policy answers alone, and the
``why`` line tells the truth of the optimum it explains.

"straggler-bound … no policy can be faster" is a claim about every assignment: the named client's fastest
round alone is the makespan, so every policy priced beside it takes at least as long. "client-bound" says the
client sets the makespan slower than it could alone; "clients in turn" belongs to sl and sflv2; a
"shared-resource-bound" optimum is its busiest resource's time.
"""

from __future__ import annotations

import math

from hypothesis import given

from splitfed.cost import Scenario
from splitfed.errors import ConfigError
from splitfed.optimizer import all_on_server, best_static, greedy, solve
from splitfed.optimizer.compare import POLICIES, compare, ratio
from splitfed.optimizer.explain import fastest_alone
from tests.test_cost_laws import SOME, scenarios

ALONE = {"optimizer": lambda sc: solve(sc), "best_static": lambda sc: best_static(sc), "greedy": greedy,
         "all_on_server": all_on_server}
TIE = 1e-9


@SOME
@given(scenarios())
def test_each_entry_is_its_policy_alone_and_why_tells_the_truth(sc: Scenario) -> None:
    got = compare(sc)
    assert list(got) == list(POLICIES)
    for name in POLICIES:
        try:
            alone = ALONE[name](sc)
        except ConfigError as e:
            assert got[name]["makespan_s"] is None and got[name]["note"] == str(e), name
            continue
        assert got[name]["makespan_s"] == alone.makespan_s and got[name]["feasible"] == alone.cost.feasible, name
    opt = got["optimizer"]["makespan_s"]
    for name in POLICIES[1:]:
        m = got[name]["makespan_s"]
        want = None if m is None or opt is None else m / opt if opt > 0 else 1.0 if m == 0 else math.inf
        assert got[name]["ratio_vs_optimizer"] == want, name
    why = got["optimizer"]["why"]
    if opt is None:
        assert why is None
        return
    best = solve(sc)
    assert (why is not None) == best.optimal  # a proven optimum is explained, one cut short is not
    if why is None:
        return
    b = best.cost.bottleneck
    if why.startswith("straggler-bound: "):
        name = b.removeprefix("client ")
        alone_s, _ = fastest_alone(sc, sc.clients[sc.index(name)])
        assert opt <= alone_s * (1 + TIE)
        for other in POLICIES[1:]:  # no policy can be faster: the straggler takes its time under any cuts
            m = got[other]["makespan_s"]
            assert m is None or m >= alone_s * (1 - TIE), other
    elif why.startswith("client-bound: "):
        alone_s, _ = fastest_alone(sc, sc.clients[sc.index(b.removeprefix("client "))])
        assert opt > alone_s * (1 + TIE)
    elif why.startswith("clients in turn: "):
        assert sc.in_turn and b == "clients in turn"
    else:
        assert why.startswith("shared-resource-bound: ") and not b.startswith("client ")
        assert best.cost.shared_s[b] == opt


def test_a_makespan_of_zero_is_matched_only_by_zero() -> None:
    """A model of no work and no bytes takes 0 s: ratios to it divided by zero (ZeroDivisionError in compare,
    and in the benchmark's table before it; found by the law above)."""
    assert (ratio(3.0, 1.5), ratio(0.0, 0.0), ratio(2.0, 0.0)) == (2.0, 1.0, math.inf)
