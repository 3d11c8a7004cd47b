"""Smoke tests of every experiment script with its tiny config, and of the shared config reader.

The tiny configs train in-process (2 clients, 1-3 rounds, seconds); one slow
test runs a tiny config through Flower's simulation engine, as the full
configs do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from simulations import (
    common,
    compression,
    drift,
    heterogeneity_sweep,
    static_vs_adaptive,
    variants,
)
from splitfed.errors import ConfigError

CONFIGS = Path(common.__file__).parent / "configs"
ROOT = Path(common.__file__).resolve().parents[1]


def run_tiny(module, name: str, out: Path, capsys: pytest.CaptureFixture[str], config: Path | None = None) -> dict:
    rc = module.cli(["--config", str(config or CONFIGS / f"{name}.tiny.toml"), "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert str(out.resolve()) in printed.out  # the script says where its results are
    results = json.loads((out / "results.json").read_text())
    assert results["experiment"] == name and "config" in results and "elapsed_s" in results
    return results


def check_pngs(paths) -> None:  # type: ignore[no-untyped-def]
    paths = [Path(p) for p in paths]
    assert paths
    for p in paths:
        assert p.is_file(), p
        with Image.open(p) as im:
            im.verify()
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200


def test_every_script_has_a_config_and_a_tiny_config() -> None:
    for name in ("static_vs_adaptive", "heterogeneity_sweep", "drift", "compression", "variants"):
        for cfg in (CONFIGS / f"{name}.toml", CONFIGS / f"{name}.tiny.toml"):
            assert cfg.is_file(), cfg
            module = globals()[name]
            common.load_config(cfg, module.Config)  # every shipped config parses


def test_heterogeneity_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # --out relative: results.json still names its figures from / (read elsewhere)
    res = run_tiny(heterogeneity_sweep, "heterogeneity_sweep", Path("rel"), capsys)
    tmp_path = tmp_path / "rel"
    assert res["figures"] and all(p == str(tmp_path / Path(p).name) for p in res["figures"].values())
    rows = res["rows"]
    assert {r["policy"] for r in rows} == set(heterogeneity_sweep.POLICIES)
    assert {r["spread"] for r in rows} == {0.0, 1.0}
    for r in rows:
        assert {"clients", "spread", "policy", "makespan_s", "solve_s", "bottleneck", "feasible"} <= set(r)
    for s in (0.0, 1.0):  # the exact optimizer is never beaten by a feasible policy
        here = [r for r in rows if r["spread"] == s and r["feasible"]]
        opt = next(r["makespan_s"] for r in here if r["policy"] == "optimizer")
        assert all(opt <= r["makespan_s"] * (1 + 1e-9) for r in here)
    assert res["speedups"] and (tmp_path / "results.csv").is_file()
    check_pngs(res["figures"].values())


def test_spread_fleet_scales_around_the_geometric_mean() -> None:
    from splitfed.profile import load_fleet

    fleet = load_fleet("reference").sample(30, seed=1)
    flat = heterogeneity_sweep.spread_fleet(fleet, 0.0)
    assert len({c.device.flops for c in flat.clients}) == 1 and len({c.link.up for c in flat.clients}) == 1
    same = heterogeneity_sweep.spread_fleet(fleet, 1.0)
    assert [c.device.flops for c in same.clients] == pytest.approx([c.device.flops for c in fleet.clients])
    wide = heterogeneity_sweep.spread_fleet(fleet, 2.0)
    ratio = max(c.device.flops for c in wide.clients) / min(c.device.flops for c in wide.clients)
    base = max(c.device.flops for c in fleet.clients) / min(c.device.flops for c in fleet.clients)
    assert ratio == pytest.approx(base ** 2)


def test_static_vs_adaptive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = run_tiny(static_vs_adaptive, "static_vs_adaptive", tmp_path, capsys)
    head = res["headline"]
    assert {"target_accuracy", "best_static", "best_static_time_to_target_s", "adaptive_time_to_target_s",
            "ratio_best_static_over_adaptive"} <= set(head)
    pols = res["policies"]
    assert [p["policy"] for p in pols] == ["static:best", "static:0,0"]
    assert pols[0]["cuts"].startswith("static:") and pols[0]["cuts"] != "static:best"
    for p in pols:
        assert {"time_to_target_s", "rounds_to_target", "final_accuracy", "sim_time_s", "accuracy"} <= set(p)
        assert (Path(p["path"]) / "metrics.jsonl").is_file()
    # the cost model's best static cut is at least as fast as any other static cut
    assert pols[0]["sim_time_s"] <= pols[1]["sim_time_s"] * (1 + 1e-9)
    # cuts do not change the math: every policy's accuracy curve is the same
    assert pols[0]["accuracy"] == pytest.approx(pols[1]["accuracy"], abs=1e-6)
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "results.csv").is_file()
    check_pngs(res["figures"].values())
    assert "accuracy vs simulated time" in res["figures"]


def test_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # --out relative: its figures (its own makespan one too) and runs named from /
    res = run_tiny(drift, "drift", Path("rel"), capsys)
    tmp_path = tmp_path / "rel"
    assert res["figures"]["makespan with drift"] == str(tmp_path / "makespan_drift.png")
    assert all(p == str(tmp_path / Path(p).name) for p in res["figures"].values())
    assert all(Path(p["path"]).is_absolute() for p in res["policies"])
    assert res["drift_round"] == 2 and res["drifting_clients"]
    (pol,) = res["policies"]
    assert {"makespan_before_s", "makespan_drift_round_s", "makespan_tail_s", "moves"} <= set(pol)
    assert pol["makespan_drift_round_s"] > pol["makespan_before_s"]  # the device did slow down
    assert pol["moves"] == []  # a static policy never moves
    check_pngs(res["figures"].values())
    assert any("cuts" in k for k in res["figures"]) and "makespan with drift" in res["figures"]


def test_drift_refuses_a_fleet_without_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "nodrift.toml"
    cfg.write_text('backend = "inprocess"\npolicies = ["static:2,5"]\n[simulate]\nclients = 2\nrounds = 2\n')
    assert drift.cli(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    assert "no client of this run drifts" in capsys.readouterr().err


def test_compression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = run_tiny(compression, "compression", tmp_path, capsys)
    recs = {r["codec"]: r for r in res["codecs"]}
    assert set(recs) == {"none", "int8"}
    for r in recs.values():
        assert {"bytes_total", "bytes_to_target", "bytes_vs_none", "final_accuracy"} <= set(r)
    assert recs["int8"]["bytes_total"] < 0.5 * recs["none"]["bytes_total"]
    check_pngs(res["figures"].values())
    assert "accuracy vs bytes" in res["figures"]


def test_variants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = run_tiny(variants, "variants", tmp_path, capsys)
    recs = {r["variant"]: r for r in res["variants"]}
    assert set(recs) == set(variants.VARIANTS)
    assert recs["fedavg"]["mode"] == "sflv1" and recs["fedavg"]["cuts"] == "static:7,7"
    assert [recs[v]["mode"] for v in ("sl", "sflv1", "sflv2")] == ["sl", "sflv1", "sflv2"]
    # SplitFed v1 is FedAvg of the unsplit model (the engine's law), whatever the cuts
    assert recs["sflv1"]["accuracy"] == pytest.approx(recs["fedavg"]["accuracy"], abs=1e-6)
    check_pngs(res["figures"].values())


# ---------------------------------------------------------------- the config reader


@dataclass(frozen=True)
class _Cfg:
    name: str = "x"
    sizes: tuple[int, ...] = (1,)
    rate: float = 0.5
    flag: bool = False
    table: dict | None = None


def test_config_reader_types_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('name = "y"\nsizes = [2, 3]\nrate = 1\nflag = true\n[table]\na = 1\n')
    assert common.load_config(p, _Cfg) == _Cfg("y", (2, 3), 1.0, True, {"a": 1})
    for text, match in [('nme = "y"', "unknown key 'nme'"), ("sizes = [1, 2.5]", r"sizes\[1\]: expected an integer"),
                        ('rate = "fast"', "rate: expected a number"), ("flag = 1", "flag: expected true or false"),
                        ("name = [", r"^config file .*c\.toml: not valid TOML"),
                        ("rounds = 1" + "0" * 5000, "not valid TOML: .*4300 digits")]:  # before: a ValueError
        p.write_text(text + "\n")
        with pytest.raises(ConfigError, match=match):
            common.load_config(p, _Cfg)
    with pytest.raises(ConfigError, match="does not exist"):
        common.load_config(tmp_path / "none.toml", _Cfg)


def test_training_config_checks_simulate_table_when_read(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('backend = "inprocess"\n[simulate]\nclient = 3\n')
    with pytest.raises(ConfigError, match=r"c.toml: \[simulate\]: unknown key 'client'"):
        common.load_config(p, variants.Config)


def test_fleet_paths_resolve_next_to_the_configs() -> None:
    s = common.base_settings({"fleet": "fleets/drift.toml"})
    assert Path(s.fleet) == CONFIGS / "fleets" / "drift.toml"
    assert common.base_settings({"fleet": "reference"}).fleet == "reference"


# ---------------------------------------------------------------- what a user gets wrong, refused up front


def _tiny(tmp_path: Path, name: str, change: dict[str, str]) -> Path:
    """The script's tiny config with lines replaced (``old -> new``), as a file."""
    text = (CONFIGS / f"{name}.tiny.toml").read_text()
    for old, new in change.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("module", "name", "change", "said"), [
    (static_vs_adaptive, "static_vs_adaptive",
     {'policies = ["static:best", "static:0,0"]': 'policies = ["static:best", "adaptve"]'},
     "adaptve: unknown cut policy 'adaptve'"),
    (static_vs_adaptive, "static_vs_adaptive",
     {'policies = ["static:best", "static:0,0"]': 'policies = ["static:0,0", "static:9,9"]'}, "static:9,9: "),
    (static_vs_adaptive, "static_vs_adaptive", {"seed = 0": "seed = 0\nfraction = 0.5"}, "fraction must be 1"),
    (compression, "compression", {'codecs = ["none", "int8"]': 'codecs = ["none", "none,int8"]'},
     "codecs entry 'none,int8': one codec per case"),  # the devices' bytes would not show the WAN's codec
    (compression, "compression", {'codecs = ["none", "int8"]': 'codecs = ["none", "int8", "none"]'},
     "'none' is given twice"),
    (variants, "variants", {'cuts = "static:2,5"': 'cuts = "static:2,5"\nu-shape = true'},
     "sl: cuts 'static:2,5': 3 tiers in U-shape need 3 cut(s), got 2"),
])
def test_a_case_that_would_fail_is_refused_before_any_trains(tmp_path, capsys, module, name, change, said) -> None:
    """Before: the cases before the bad one trained (minutes, at the shipped sizes), then it failed."""
    out = tmp_path / "out"
    assert module.cli(["--config", str(_tiny(tmp_path, name, change)), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert said in printed.err and f"simulations.{name}: error: " in printed.err, printed.err
    assert "] round 1/" not in printed.out and not (out / "runs").exists(), printed.out


def test_simulate_keys_an_experiment_sets_itself_are_refused(tmp_path) -> None:
    """Before: ``out`` in [simulate] was accepted and silently replaced by each run's own folder."""
    p = tmp_path / "c.toml"
    p.write_text('backend = "inprocess"\n[simulate]\nout = "runs/x"\n')
    with pytest.raises(ConfigError, match=r"\[simulate\] out: an experiment gives each run a folder"):
        common.load_config(p, variants.Config)


def test_a_run_that_fails_while_training_exits_1(tmp_path, capsys) -> None:
    """2 is for input refused before anything ran (before: 2 for this too, unlike splitfed simulate)."""
    cfg = _tiny(tmp_path, "static_vs_adaptive", {"seed = 0": "seed = 0\nlr = 1000.0"})
    assert static_vs_adaptive.cli(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 1
    assert "diverged" in capsys.readouterr().err


def test_in_process_runs_show_each_round(tmp_path, capsys) -> None:
    run_tiny(compression, "compression", tmp_path / "out", capsys)  # reads the output: printed again below
    cfg = CONFIGS / "compression.tiny.toml"
    assert compression.cli(["--config", str(cfg), "--out", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    for codec in ("none", "int8"):
        assert f"  [{codec}] round 1/" in out and f"  [{codec}] round 2/" in out, out


# ---------------------------------------------------------------- the output folder


def test_an_output_folder_that_holds_results_is_refused_then_replaced_with_overwrite(tmp_path, capsys) -> None:
    """Before: a second run into one --out mixed its runs with the first's, and a stopped one left the
    first's results.json and summary.md beside its own runs."""
    out = tmp_path / "out"
    cfg = CONFIGS / "compression.tiny.toml"
    run_tiny(compression, "compression", out, capsys)
    (out / "runs" / "topk_0_5").mkdir()  # a run of an earlier config that this one does not have
    earlier = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**earlier, "earlier": True}))  # to tell it from the new one
    (out / "old.png").write_bytes(b"")  # an earlier experiment's figure
    before = (out / "results.json").read_text()
    assert compression.cli(["--config", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} already holds an experiment's results" in err and "--overwrite" in err, err
    assert (out / "results.json").read_text() == before and (out / "runs" / "topk_0_5").is_dir()
    assert compression.cli(["--config", str(cfg), "--out", str(out), "--overwrite"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (out / "runs").iterdir() if not p.name.startswith(".")) == ["int8", "none"]
    assert "earlier" not in json.loads((out / "results.json").read_text()) and not (out / "old.png").exists()
    assert not (out / ".splitfed.lock").exists()


def test_overwrite_keeps_the_results_when_the_new_config_is_refused_before_anything_ran(tmp_path, capsys) -> None:
    """--overwrite removed the earlier results first; a codec typo then refused the run (exit 2, "before
    anything ran") and left the folder empty."""
    out = tmp_path / "out"
    run_tiny(compression, "compression", out, capsys)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    results = (out / "results.json").read_text()
    typo = _tiny(tmp_path, "compression", {'"int8"': '"int9"'})
    assert compression.cli(["--config", str(typo), "--out", str(out), "--overwrite"]) == 2
    assert "int9" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert (out / "results.json").read_text() == results


def test_results_a_killed_overwrite_left_aside_survive_the_next_refused_one(tmp_path) -> None:
    """A killed --overwrite leaves the results it replaced in its aside folder; the next --overwrite that
    failed before writing anything deleted that folder, the only copy."""
    from simulations.common import output_folder

    out = tmp_path / "exp"
    (out / "runs").mkdir(parents=True)
    (out / "results.json").write_text('{"old": 1}')
    pid = os.fork()
    if pid == 0:  # the experiment, killed while it runs
        with output_folder(out, True):
            os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    (left,) = [p.name for p in out.iterdir() if p.name.startswith(".replaced-")]
    with pytest.raises(ValueError), output_folder(out, True):
        raise ValueError("its config is refused")
    assert (out / left / "results.json").read_text() == '{"old": 1}' and (out / left / "runs").is_dir()


def test_resume_keeps_the_runs_that_finished_and_trains_the_rest(tmp_path, capsys) -> None:
    """An experiment stopped part way could only start over (--overwrite), training its finished runs again."""
    out = tmp_path / "out"
    cfg = str(CONFIGS / "compression.tiny.toml")
    whole = run_tiny(compression, "compression", out, capsys)
    (out / "results.json").unlink()  # as a stop during int8 leaves it: none finished, int8 not
    (out / "runs" / "int8" / "summary.json").unlink()
    assert compression.cli(["--config", cfg, "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"[none] kept: its 2 round(s) in {out / 'runs' / 'none'}" in printed, printed
    assert "[int8] inprocess: " in printed and "[none] inprocess: " not in printed, printed
    again = json.loads((out / "results.json").read_text())
    assert again["codecs"] == whole["codecs"]
    # nothing to continue, or both asked
    assert compression.cli(["--config", cfg, "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no experiment's runs to continue" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compression.cli(["--config", cfg, "--out", str(out), "--resume", "--overwrite"])
    assert "give one" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.xdist_group("flower-real")  # one Ray cluster at a time: two starting at once on 2 cores can time out
def test_a_flower_run_stopped_part_way_continues_from_its_checkpoint_on_resume(tmp_path) -> None:
    """The tiny static-vs-adaptive config through Flower's simulation engine and gRPC tiers, as the full configs
    run: stopped by Ctrl-C part way it says how to continue (exit 130); ``--resume`` continues its run from the
    run's checkpoint, not from round 1 (the ``backend = "flower"`` branch of ``common._train_checked``; the
    in-process test ``test_resume_keeps_the_runs_that_finished_and_trains_the_rest`` keeps finished runs); and
    the results are the in-process backend's for the same config: the same model (accuracy per round) and the
    same simulated clock. One experiment (two Ray starts) for all: ``test_static_vs_adaptive_through_flower``,
    a third Ray start for a fresh run's results and figures, is folded in here (the rounds before the stop are
    a fresh run's, and results.json and its figures are written by the same code at the end)."""
    cfg = _tiny(tmp_path, "static_vs_adaptive", {'backend = "inprocess"': 'backend = "flower"',
                                                 'policies = ["static:best", "static:0,0"]': 'policies = ["static:best"]',
                                                 "rounds = 2": "rounds = 4"})
    out = tmp_path / "out"
    command = [sys.executable, "-m", "simulations.static_vs_adaptive", "--config", str(cfg), "--out", str(out)]
    p = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "] round 2/4" in line:
                break
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=180)
    finally:
        p.kill()
    assert p.returncode == 130 and "to continue: the same command with --resume" in stderr, stderr[-2000:]
    from splitfed.flower import checkpoint

    (run,) = [r for r in (out / "runs").iterdir() if not r.name.startswith(".")]  # static:best's
    kept = checkpoint.load(run).round
    assert 2 <= kept < 4
    done = subprocess.run([*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"continues in {run}" in done.stdout, done.stdout
    assert f"round {kept + 1}/4" in done.stdout and "round 1/4" not in done.stdout, done.stdout
    assert f"results in {out.resolve()}" in done.stdout, done.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    res = json.loads((out / "results.json").read_text())
    assert res["experiment"] == "static_vs_adaptive" and "config" in res and "elapsed_s" in res
    (pol,) = res["policies"]
    assert pol["rounds"] == 4 and pol["final_accuracy"] > 0.3 and Path(pol["path"]) == run
    check_pngs(res["figures"].values())
    # the in-process backend computes the same run: same model (accuracy), same simulated clock
    settings = common.load_config(cfg, static_vs_adaptive.Config).settings().with_(cuts=pol["cuts"])
    local = common.train(settings, tmp_path / "local", "local", backend="inprocess")
    assert [r.accuracy for r in local.rounds] == pytest.approx(pol["accuracy"], abs=1e-6)
    assert [r.sim_round_s for r in local.rounds] == pytest.approx(pol["sim_round_s"], rel=1e-9)


def test_a_folder_of_figures_alone_is_no_experiments(tmp_path, capsys) -> None:
    """Any PNG counted as an experiment's: --overwrite into a folder of the user's own figures deleted them."""
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "mine.png").write_bytes(b"\x89PNG")
    cfg = str(CONFIGS / "compression.tiny.toml")
    assert compression.cli(["--config", cfg, "--out", str(figures), "--overwrite"]) == 2
    assert "holds what no experiment writes (mine.png)" in capsys.readouterr().err
    assert (figures / "mine.png").read_bytes() == b"\x89PNG"


def test_an_output_folder_of_something_else_is_refused_even_with_overwrite(tmp_path, capsys) -> None:
    run = tmp_path / "a-simulate-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    cfg = str(CONFIGS / "compression.tiny.toml")
    assert compression.cli(["--config", cfg, "--out", str(run), "--overwrite"]) == 2
    assert "holds what no experiment writes (metrics.jsonl)" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == '{"round": 1}\n'
    afile = tmp_path / "results.txt"
    afile.write_text("mine\n")
    assert compression.cli(["--config", cfg, "--out", str(afile)]) == 2  # before: a FileExistsError traceback
    assert f"--out {afile} is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        compression.cli(["--config", cfg, "--out", " "])  # before: the default folder, silently
    assert stop.value.code == 2 and "--out is empty" in capsys.readouterr().err


# ---------------------------------------------------------------- Ctrl-C and SIGTERM


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")])
def test_a_stopped_experiment_says_so_in_one_line(tmp_path, sig, code, said) -> None:
    """Before: a traceback, and SIGTERM (a batch system's stop) exited 1 from a Flower run and silently
    from an in-process one."""
    cfg = _tiny(tmp_path, "compression", {"rounds = 2": "rounds = 200"})
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "simulations.compression", "--config", str(cfg), "--out", str(out)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "] round 2/200" in line:
                break
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == code, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert f"simulations.compression: {said}; the runs that ended are in {out / 'runs'}" in stderr, stderr
