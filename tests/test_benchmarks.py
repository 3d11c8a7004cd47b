"""Every benchmark runs end to end at a tiny size and writes the JSON its README section describes.

Nothing here looks at a speed: the numbers a benchmark measures are its own
business (and vary by machine). What is checked is that it runs, that its JSON
has the documented fields, and the facts that do not depend on the machine: the
exact optimizer is never beaten by the policies it is compared with, each
codec's bytes on the wire, that the two sides of the engine benchmark do the
same work, and that a JSON holds what its script prints and the run's context.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_fixtures import load_benchmark

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def bench(name: str, *args: str, out: Path) -> tuple[dict, str]:
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    strict = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{name}: non-standard JSON {c}"))
    return strict, p.stdout


def test_engine_sides_do_the_same_work_and_the_json_holds_the_printout(tmp_path: Path) -> None:
    """vgg11 has no dropout: the same steps from the same weights end with the same weights on both sides
    (a side that skipped work would not), and each printed round's steps/s is in the JSON with its context.
    Also what test_engine_benchmark asserted (it ran the benchmark a second time, on cnn): the cuts asked for,
    steps/s of both sides, their ratio and its line. cnn with dropout, run the same way in process, is
    test_experiment_outputs' test_the_engine_benchmark_compares_weights_trained_with_the_same_dropout_masks[cnn];
    cnn at its default cuts, test_newcomer_traps' test_the_engine_benchmark_on_cnn_without_cuts_runs_and_records_them."""
    res, out = bench("engine", "--batch", "2", "--cuts", "3,9", "--reps", "2", "--steps", "1",
                     out=tmp_path / "engine.json")
    assert res["model"] == "vgg11" and res["cuts"] == [3, 9]  # not the default 4,10: the cuts asked for
    assert res["max_abs_weight_diff_vs_monolithic"]["split"] <= 1e-6
    times = res["round_step_s"]
    assert set(times) == {"monolithic", "split"} and all(len(t) == 2 for t in times.values())
    printed = re.findall(r"round \d/2: monolithic ([\d.]+) steps/s, split ([\d.]+) steps/s", out)
    assert printed == [(f"{1 / m:.2f}", f"{1 / s:.2f}") for m, s in zip(times["monolithic"], times["split"],
                                                                          strict=True)]
    assert res["ratio"] == pytest.approx(statistics.median(times["monolithic"]) / statistics.median(times["split"]))
    assert res["monolithic_steps_per_s"] > 0 and res["split_steps_per_s"] > 0
    assert res["ratio"] == pytest.approx(res["split_steps_per_s"] / res["monolithic_steps_per_s"])
    assert f"split/monolithic steps/s ratio: {res['ratio']:.3f}" in out
    assert res["threads"] == 1 and res["reps"] == 2 and res["steps"] == 1 and res["args"]["batch"] == 2
    assert res["torch_version"] and res["host"] and res["python"]


def test_optimizer_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Run in this process: its pricing and profiling (vgg11 and resnet18 at batch 32) are what it costs; a
    subprocess added an interpreter, torch and scipy to start, seconds of it. ``--no-scaling``: the solve-time
    table times solves, nothing checked here. ``--sampled 1000``: the 10,000-client cases were most of its time
    and add nothing checked here that 1,000 clients do not (the same code, a larger fleet drawn the same way;
    the sweep's 500 is another contended size)."""
    bo = load_benchmark("optimizer")
    path = tmp_path / "optimizer.json"
    code = bo.main(["--no-scaling", "--sampled", "1000", "--sweep", "60,500", "--out", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-3000:]
    res = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"optimizer: non-standard JSON {c}"))
    assert set(res["models"]) == {"vgg11", "resnet18"} and res["clients"] >= 50
    for model, cases in res["models"].items():
        (slow,) = {c.rsplit("/", 1)[0].removeprefix("reference w/o ") for c in cases if "w/o" in c}
        assert set(cases) == {f"{f}/{s}" for f in ("reference", "reference x1000", f"reference w/o {slow}")
                              for s in ("any_cut", "data_stays")}, model  # the fleets --sampled asked for
        assert cases["reference x1000/any_cut"]["clients"] == 1000, model
        for case, c in cases.items():
            best = c["optimizer"]["makespan_s"]
            assert c["optimizer"]["feasible"] and best > 0, (model, case)
            # exact within the cost model: no compared policy is faster (a hair of float slack)
            for other in ("best_static", "greedy", "all_on_server"):
                if c[other]["makespan_s"] is not None and c[other]["feasible"]:  # else not applicable here
                    assert c[other]["makespan_s"] >= best * (1 - 1e-9), (model, case, other)
            assert c["targets"]["not_slower_than_greedy"] is not False, (model, case)  # None: greedy overflows memory
    assert "targets" in out
    for model, pts in res["contention_sweep"].items():  # the sweep: one point a size, exact against best static
        assert [p["clients"] for p in pts] == [60, 500], model
        for p in pts:
            assert p["ratio"] == pytest.approx(p["best_static_s"] / p["optimizer_s"]) and p["ratio"] >= 1 - 1e-9
            assert p["bound"] in ("straggler", "client", "shared")
    assert "contention sweep" in out
    assert res["args"]["sweep"] == [60, 500] and res["args"]["sampled"] == [1000] and res["args"]["no_scaling"]
    assert res["threads"] == 1
    assert res["scipy"] and res["numpy"] and res["torch_version"] and res["host"]


def test_transport_benchmark(tmp_path: Path) -> None:
    """``--sizes-mb 1,8``: the default's 32 MB activations were most of its time and add nothing checked here
    that 8 MB does not: with the default limits (``wire.Limits``: 4 MiB unary, 1 MiB chunks) 1 MB goes in one
    message and 8 MB streamed in chunks, as 32 MB does."""
    res, _ = bench("transport", "--batch", "2", "--reps", "1", "--steps", "1", "--reps-b", "1", "--sizes-mb", "1,8",
                   out=tmp_path / "transport.json")
    a = res["a_training"]
    assert a["steps_per_s"]["grpc"] > 0 and a["steps_per_s"]["inproc"] > 0
    assert a["threads"] == 1 and res["torch_threads"] == 1 and all(len(t) == 1 for t in a["step_s"].values())
    assert res["args"]["reps_b"] == 1 and res["args"]["batch"] == 2 and res["torch_version"] and res["host"]
    assert [r["activation_mb"] for r in res["b_step_rpc_vs_echo"]] == [1, 8] and res["args"]["sizes_mb"] == [1, 8]
    sweep = res["b_chunk_sweep"]  # every size with every (chunk, unary) pair, the default first
    assert sorted({r["activation_mb"] for r in sweep}) == [1, 8] and all(r["mb_per_s"] > 0 for r in sweep)
    assert len(sweep) == 2 * len({(r["chunk_bytes"], r["unary_bytes"]) for r in sweep})
    assert all(r["mb_per_s"]["step_rpc"] > 0 and r["copy_ceiling"] > 0 for r in res["b_step_rpc_vs_echo"])
    codecs = {r["codec"]: r for r in res["c_bytes_per_codec"]}
    assert codecs["none"]["max_abs_error"] == 0 and codecs["none"]["ratio_to_none"] == 1
    assert codecs["fp16"]["ratio_to_none"] == pytest.approx(0.5, abs=0.01)
    assert codecs["int8"]["ratio_to_none"] == pytest.approx(0.25, abs=0.01)
    assert codecs["topk:0.01"]["ratio_to_none"] < codecs["topk:0.1"]["ratio_to_none"] < 0.25


@pytest.mark.xdist_group("flower-real")  # one Ray cluster at a time
def test_simulation_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The script's own part run in this process (as test_optimizer_benchmark's): it only checks the flags and
    starts a process per fleet size, which does the run (Ray, tiers); a process of its own for it added an
    interpreter and torch to start. The other benchmarks here run as the user runs them, a process each."""
    bs = load_benchmark("simulation")
    path = tmp_path / "simulation.json"
    code = bs.main(["--clients", "2", "--rounds", "1", "--out", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-3000:]
    res = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"simulation: non-standard JSON {c}"))
    (row,) = res["results"]
    assert row["clients"] == 2 and row["rounds"] == 1 and len(row["round_s"]) == 1
    assert row["peak_pss_mb"] > 0 and 0 <= row["final_accuracy"] <= 1
    # one round is the first, which starts Ray's workers: no round's time to report as seconds per round
    assert row["seconds_per_round"] is None and row["first_round_s"] > 0
    # what the run took outside its one round (Ray, the tiers, the clients' processes, the shutdown): seconds
    assert row["start_stop_s"] == pytest.approx(row["total_s"] - row["round_s"][0]) and row["start_stop_s"] > 1
    assert f"2 clients: n/a s/round (first {row['first_round_s']:.1f} s, start and stop {row['start_stop_s']:.1f} s)" \
        in out, out
    assert res["rounds"] == 1 and res["args"]["clients"] == [2] and set(res["versions"]) == {"torch", "flwr", "ray"}


def test_weights_benchmark_sends_one_copy_per_tier_and_gets_the_same_model(tmp_path: Path) -> None:
    """The facts that do not depend on the machine: per client, one copy of each client's server blocks each
    way; base + Reduce, one copy of the blocks any client has on a tier out and its mean back (float32 for the
    float32 weights, float64 for the integer buffer: the bytes that went out); the same new model from both."""
    from splitfed.aggregate import wire_dtype
    from splitfed.engine.rounds import initial_state, select, server_bounds, state_bytes
    from splitfed.engine.template import num_blocks
    from splitfed.models.zoo import resolve_spec

    res, out = bench("weights", "--model", "cnn", "--clients", "4", "--reps", "1", out=tmp_path / "weights.json")
    spec = resolve_spec("cnn")
    state, n = initial_state(spec, 0), num_blocks(spec)
    bounds = [server_bounds(tuple(k), n, False) for k in res["assignment"].values()]
    assert len(bounds) == 4 and len({tuple(b) for b in bounds}) > 1
    for t in range(2):
        each = sum(state_bytes(select(state, *b[t])) for b in bounds)
        union = {k: v for b in bounds for k, v in select(state, *b[t]).items()}
        assert res["weight_bytes"]["per_client"][t] == [each, each]
        means = sum(v.numel() * wire_dtype(v.dtype).itemsize for v in union.values())
        assert res["weight_bytes"]["base_reduce"][t] == [state_bytes(union), means] == [means, means]
    assert res["max_abs_diff_of_new_models"] <= 1e-6
    assert all(len(v) == 1 for side in res["round_s"].values() for v in side.values())
    assert res["speedup"] == pytest.approx(res["exchange_s"]["per_client"] / res["exchange_s"]["base_reduce"])
    assert f"exchange {res['speedup']:.2f}x faster" in out and "round 1/1 base_reduce" in out
