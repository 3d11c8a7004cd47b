"""``splitfed optimize --compare``: the optimizer, the best static cut, greedy and all-on-server side by side.

What a researcher asks of a fleet first (is the optimizer worth it here?), answered in one run by the same
function the optimizer benchmark judges its targets on (:func:`splitfed.optimizer.compare.compare`). Each
policy's makespan must be the one the policy's own flag prints; a refused policy keeps its reason, and a policy
that breaks a memory limit keeps its time, marked.
"""

from __future__ import annotations

import json

import pytest

from splitfed.cli import main
from splitfed.commands.optimize import COMPARE_KEYS, render_compare
from splitfed.optimizer.compare import POLICIES
from tests.test_optimize_why import fleet  # noqa: F401 - the straggler fleet file, a fixture

FLAGS = {"optimizer": [], "best_static": ["--best-static"], "greedy": ["--greedy"], "all_on_server": ["--all-on-server"]}


def _out(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> str:
    assert main(["optimize", "--model", "mlp", *argv]) == code
    return capsys.readouterr().out


def test_each_policy_s_makespan_is_what_its_own_flag_prints(fleet: str,  # noqa: F811
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    got = json.loads(_out(capsys, "--fleet", fleet, "--compare", "--json"))
    assert list(got) == list(COMPARE_KEYS) and list(got["policies"]) == list(POLICIES)
    assert (got["model"], got["tiers"], got["mode"]) == ("mlp", 3, "sflv1")
    alone = {k: json.loads(_out(capsys, "--fleet", fleet, *flag, "--json")) for k, flag in FLAGS.items()}
    opt = alone["optimizer"]["makespan_s"]
    for k in POLICIES:
        entry = got["policies"][k]
        assert entry["makespan_s"] == alone[k]["makespan_s"], k
        assert entry["feasible"] == alone[k]["feasible"] and entry["method"] == alone[k]["method"], k
        if k != "optimizer":
            assert entry["ratio_vs_optimizer"] == entry["makespan_s"] / opt, k
    assert got["why"] == got["policies"]["optimizer"]["why"] == alone["optimizer"]["why"]
    assert got["why"].startswith("straggler-bound: a slow client needs ")
    assert got["policies"]["optimizer"]["cuts_by_class"] == {
        kind: {cuts: n} for kind, cuts, n in _classes(alone["optimizer"]["clients"])}


def _classes(clients: list[dict]) -> list[tuple[str, str, int]]:
    """(fast, cuts, 2) and (slow, cuts, 1) from a solve's clients (named fast-0, fast-1, slow-0): each class
    takes one cut vector here."""
    kinds: dict[str, tuple[str, int]] = {}
    for c in clients:
        kind = c["name"].rsplit("-", 1)[0]
        cuts = ",".join(map(str, c["cuts"]))
        assert kinds.get(kind, (cuts, 0))[0] == cuts
        kinds[kind] = (cuts, kinds.get(kind, (cuts, 0))[1] + 1)
    return [(k, cuts, n) for k, (cuts, n) in kinds.items()]


def test_the_table_has_a_row_per_policy_and_ends_with_why(fleet: str,  # noqa: F811
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    got = json.loads(_out(capsys, "--fleet", fleet, "--compare", "--json"))["policies"]
    rows = _out(capsys, "--fleet", fleet, "--compare").rstrip("\n").splitlines()
    assert rows[0].startswith("mlp (") and rows[1].split() == ["policy", "makespan_s", "vs", "optimizer"]
    assert rows[2].split() == ["optimizer", f"{got['optimizer']['makespan_s']:.3f}", "1.00x"]
    assert rows[3].split()[:2] == ["best", "static"]
    assert rows[3].split()[-2:] == [f"{got['best_static']['makespan_s']:.3f}",
                                    f"{got['best_static']['ratio_vs_optimizer']:.2f}x"]
    assert rows[4].split() == ["greedy", f"{got['greedy']['makespan_s']:.3f}",
                               f"{got['greedy']['ratio_vs_optimizer']:.2f}x"]
    assert rows[5].split()[0] == "all-on-server" and len(rows) == 7
    assert rows[6] == f"why: {got['optimizer']['why']}"


def test_a_policy_the_fleet_refuses_keeps_its_reason(fleet: str,  # noqa: F811
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Raw data must stay on the devices: all on the server is refused, and said why; the others are priced."""
    got = json.loads(_out(capsys, "--fleet", fleet, "--compare", "--min-device-blocks", "1", "--json"))
    aos = got["policies"]["all_on_server"]
    assert aos == {"makespan_s": None, "ratio_vs_optimizer": None,
                   "note": "cuts 0,0 keep fewer than 1 leading block(s) on the device"}
    assert all(got["policies"][k]["makespan_s"] is not None for k in POLICIES[:3])
    row = _out(capsys, "--fleet", fleet, "--compare", "--min-device-blocks", "1").splitlines()[5]
    assert row.split()[:3] == ["all-on-server", "n/a", "n/a"]
    assert row.endswith("  refused: cuts 0,0 keep fewer than 1 leading block(s) on the device")


def test_compare_goes_with_no_single_policy(fleet: str, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--model", "mlp", "--fleet", fleet, "--compare", "--greedy"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def _entry(makespan: float | None, **kw: object) -> dict:
    return {"makespan_s": makespan, "feasible": True, "violations": [], "method": "m", "optimal": False, "note": "",
            **kw}


def test_render_marks_a_broken_memory_limit_and_an_optimum_not_proven() -> None:
    got = {"optimizer": _entry(2.0, method="milp", why=None, optimal=False),
           "best_static": {"makespan_s": None, "note": "no single cut vector fits", "ratio_vs_optimizer": None},
           "greedy": _entry(1.5, feasible=False, method="greedy", note="violates: cloud memory 3 MiB > 2 MiB",
                            violations=["cloud memory 3 MiB > 2 MiB"],
                            ratio_vs_optimizer=0.75),
           "all_on_server": _entry(4.0, method="all-on-server", ratio_vs_optimizer=2.0)}
    rows = render_compare(got, "h").splitlines()
    assert rows[2].endswith("  not proven optimal: the time limit ran out")  # a milp whose why is None
    assert rows[3].split()[:4] == ["best", "static", "n/a", "n/a"] and rows[3].endswith("refused: no single cut "
                                                                                         "vector fits")
    assert rows[4].split()[:3] == ["greedy", "1.500", "0.75x"]
    assert rows[4].endswith("  breaks memory: cloud memory 3 MiB > 2 MiB")
    assert rows[5].split() == ["all-on-server", "4.000", "2.00x"] and len(rows) == 6  # no why line


def test_a_policy_over_memory_with_no_note_still_names_the_limit() -> None:
    """All on the server priced over the servers' memory: its note is empty (only greedy writes its violations
    there), so the row read "breaks memory: " and nothing; it names the limit from the cost."""
    from splitfed.optimizer.compare import compare
    from tests.test_benchmark_optimizer_parts import _client, _fleet, _sc

    sc = _sc(_fleet((_client("s", "slow", 1e9, 1e7, memory=3.1e5),), edge_memory=1e3, cloud_memory=1e3))
    got = compare(sc)
    aos = got["all_on_server"]
    assert aos["feasible"] is False and aos["note"] == "" and aos["violations"]
    row = render_compare(got, "h").splitlines()[5]
    assert row.split()[0] == "all-on-server"
    assert row.endswith(f"  breaks memory: {'; '.join(aos['violations'])}") and aos["violations"][0] in row
