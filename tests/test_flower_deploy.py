"""Real deployment on 127.0.0.1: flower-superlink, flower-supernodes, edge and cloud tier processes.

One ``python -m server.deploy`` (a process of its own, as the user runs it; 2 SuperNodes, insecure on loopback:
TLS of each hop is tested by the transport's tests) of 2 rounds serves the three slow tests; Flower 1.42 starts a
ClientApp process for every message, so each run costs a minute or more here:

- round 1, with both clients: a real deployment trains a round (metrics, checkpoint,
  measured times, the device profiles named in ``--profile``, each node's
  link to the edge measured when it registered);
- round 2: one SuperNode and its ClientApp process are SIGKILLed while they work on
  the round's message; the round completes with the other client (min-clients 1)
  after the round timeout, and the run goes on to its end: no hang;
- its end: its summary cannot be written (a folder holds its name), so the ServerApp fails after its last
  round is kept, the real ``flwr run`` exits 0, and deploy exits 1 saying why (the run folder's record decides
  deploy's exit code, not ``flwr run``'s). This was test_deploy_session25's own deployment (1 node, 1 round,
  ~50 s); a summary the ServerApp writes is test_flower_sim's (test_simulation_trains_and_equals_unsplit_fedavg:
  the same ServerApp code, in a real Flower simulation).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from server import deploy, processes
from server.deploy import Deployment, main
from splitfed.engine.rounds import initial_state
from splitfed.flower import checkpoint, runfolder, runstatus
from splitfed.flower.config import RunSettings

pytestmark = pytest.mark.xdist_group("flower-deploy")  # real deployments (no Ray: beside flower-real); also slow


def _rows(out: Path) -> list[dict]:
    if not (out / "metrics.jsonl").is_file():
        return []
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _clientapps(pid: int) -> set[int]:
    found = set()
    for p in processes.tree(pid):
        try:
            if any("flwr-clientapp" in part for part in p.cmdline()):
                found.add(p.pid)
        except psutil.Error:
            pass
    return found


ROOT = Path(__file__).resolve().parent.parent
# covers a round's ClientApp processes (one per message: start, torch import, training; round 1's two took ~17 s
# on CI's 2 busy cores, over 30 s on a more loaded host); round 2 waits it out for the killed client
ROUND_TIMEOUT_S = 45.0


def _victim(deploy_pid: int) -> psutil.Process | None:
    """supernode1 (partition 1) among deploy's children."""
    for p in processes.tree(deploy_pid):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.cmdline())
            if "flower-supernode" in cmd and "partition-id=1 " in cmd:
                return p
    return None


def _killed(victim: psutil.Process) -> None:
    """SIGKILL ``victim``, its process group (it leads one: deploy starts each so) and everything under it (a
    machine that dies, as ``Deployment.kill`` does)."""
    tree = processes.tree(victim.pid)
    with contextlib.suppress(OSError):
        os.killpg(victim.pid, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(tree, timeout=10)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Deploy 2 rounds into a run folder whose summary cannot be written; kill supernode1 once its round-2
    ClientApp process exists."""
    tmp = tmp_path_factory.mktemp("deploy")
    out, work, shown = tmp / "run", tmp / "work", tmp / "deploy.out"
    (out / "summary.json").mkdir(parents=True)  # the ServerApp fails after its last round
    with open(shown, "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "server.deploy", "--clients", "2", "--rounds", "2", "--out",
                              str(out), "--workdir", str(work), "--profile", "rpi4", "--profile", "laptop",
                              "--set", "min-clients=1", "--set", f"round-timeout-s={ROUND_TIMEOUT_S}",
                              "--set", "cuts=static:1,3/2,5", "--set", "lr=0.1"],
                             cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = time.monotonic()
        while not _rows(out) and p.poll() is None and time.monotonic() - started < 400:
            time.sleep(0.2)  # round 1, both clients
        victim = _victim(p.pid)
        before = _clientapps(victim.pid) if victim is not None else set()  # round 1's may still be exiting
        while (victim is not None and p.poll() is None and not (_clientapps(victim.pid) - before)
               and time.monotonic() - started < 400):
            time.sleep(0.1)  # round 2's message reached the victim: it starts a ClientApp process
        killed_alive = victim is not None and p.poll() is None
        if victim is not None:
            _killed(victim)
        try:
            code: int | None = p.wait(300)
        except subprocess.TimeoutExpired:
            code = None
        yield {"out": out, "work": work, "code": code, "hung": code is None, "killed_mid_run": killed_alive,
               "shown": shown.read_text(), "log": (work / "superlink.log").read_text(errors="replace")[-3000:]
               if (work / "superlink.log").is_file() else ""}
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # a hung deploy: its guard then stops the rest
            p.wait(10)


@pytest.mark.slow
def test_deployment_runs_a_round(run):
    rows = _rows(run["out"])
    assert rows, run["shown"][-3000:] + run["log"]
    row = rows[0]
    assert row["round"] == 1 and row["clients"] == 2 and row["failed"] == [] and row["accuracy"] > 0.2
    assert row["cuts"] == {"client0": [1, 3], "client1": [2, 5]}
    assert row["sim_round_s"] is None and row["measured_round_s"] > 0  # deployment: times are measured
    assert {c["profile"] for c in row["per_client"].values()} == {"rpi4", "laptop"}
    streamed = run["shown"]  # the ServerApp's log, streamed by flwr run through deploy
    assert streamed.count("(measured up ") == 2, streamed[-3000:]  # each node measured its link to the edge
    assert (run["out"] / "checkpoint.pt").is_file()


@pytest.mark.slow
def test_killed_client_does_not_stop_the_round(run):
    assert run["killed_mid_run"], "the run ended before the victim could be killed"
    assert not run["hung"], "deploy (flwr run) hangs after a client was killed"
    rows = _rows(run["out"])
    assert [r["round"] for r in rows] == [1, 2], run["shown"][-3000:] + run["log"]
    assert rows[1]["clients"] == 1 and rows[1]["failed"] == ["client1"]


@pytest.mark.slow
def test_a_run_that_failed_after_its_last_round_exits_1_saying_why(run):
    """Its summary cannot be written (a folder holds its name): the ServerApp fails after round 2 is kept, and
    the real ``flwr run`` exits 0. Before, deploy exited with ``flwr run``'s code: 0 (moved here from
    test_deploy_session25, which ran a deployment of its own for it)."""
    out, work, text = run["out"].resolve(), run["work"].resolve(), run["shown"]
    st = runstatus.status(out)
    assert st.state == "failed" and checkpoint.load(out).round == 2, (st, text[-3000:])
    assert run["code"] == 1, text[-3000:]
    said = re.findall(r"^deploy: error: .*$", text, re.M)
    assert said == [f"deploy: error: the run kept every round but did not finish: it failed: cannot write "
                    f"{out / 'summary.json'}: Is a directory (the rounds before it are kept: free space or "
                    f"fix the folder, then continue with --resume {out}) (see {work / 'flwr-run.log'} and "
                    f"{work / 'superlink.log'}); write its summary with: python -m server.deploy --resume "
                    f"{out} --workdir {work} --profile rpi4 --profile laptop"], text[-3000:]


def _claim(out: Path, overrides: dict):  # type: ignore[no-untyped-def]
    """The claim of ``out`` a ServerApp makes for the run config deploy gives it."""
    return runfolder.claim(out, resume=overrides.get("resume", False), overwrite=overrides.get("overwrite", False))


def _dies(out: Path):  # type: ignore[no-untyped-def]
    """``Deployment.run`` of a ServerApp that claims ``out`` and dies before it keeps a round: its claim
    records the failure (deploy tells a ServerApp that never claimed the folder from one that did by that
    record), and ``flwr run`` exits 0, as it does."""

    def run(self, overrides, timeout=None):  # type: ignore[no-untyped-def]
        with contextlib.suppress(RuntimeError), _claim(out, overrides):
            raise RuntimeError("the ServerApp died")
        return subprocess.CompletedProcess([], 0, "", "")

    return run


def _held_run(folder: Path, rounds: int = 1, clients: int = 2) -> None:
    """What a finished deployment of ``rounds`` rounds leaves in its run folder."""
    settings = RunSettings(clients=clients, rounds=rounds, lr=0.2, sim_clock=False, out=str(folder),
                           tier_addresses="127.0.0.1:1,127.0.0.1:2")
    state = initial_state(settings.spec, settings.seed)  # the run's own model: a resume checks it is
    checkpoint.save(folder, checkpoint.Checkpoint(rounds, state, settings.to_dict()))
    rows = [{"round": r, "loss": 0.5, "accuracy": 0.8} for r in range(1, rounds + 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_deploy_again_into_a_run_folder_takes_the_flags_its_refusal_names(tmp_path, monkeypatch, capsys):
    """The second ``python -m server.deploy`` into one folder is refused, before anything starts, naming
    --resume and --overwrite; deploy has both (before: it had neither, only --set)."""
    out = tmp_path / "run"
    _held_run(out)
    runs: list[dict] = []

    def fake_run(self, overrides, timeout=None):  # type: ignore[no-untyped-def]
        runs.append(self.run_config(overrides))
        with _claim(out, overrides):
            _held_run(out, overrides["num-server-rounds"])  # the run finishes every round
        return subprocess.CompletedProcess([], 0, "", "")

    monkeypatch.setattr(Deployment, "start", lambda self: self)  # nothing really starts here
    monkeypatch.setattr(Deployment, "run", fake_run)
    work = ["--workdir", str(tmp_path / "work")]
    assert main(["--clients", "2", "--rounds", "1", "--out", str(out), *work]) == 2
    err = capsys.readouterr().err
    assert f"continue it with --resume {out.resolve()}, replace it with --overwrite" in err and not runs, err

    assert not (out / "summary.json").exists()
    assert main(["--resume", str(out), "--rounds", "1", *work]) == 0  # round 1 is done: nothing starts
    assert "nothing to do" in capsys.readouterr().err and not runs
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1  # written again from the rows
    assert main(["--resume", str(out), "--clients", "3", "--rounds", "2", *work]) == 2
    assert "cannot resume with different clients (2 -> 3)" in capsys.readouterr().err and not runs

    assert main(["--resume", str(out), "--rounds", "2", *work]) == 0  # the run's own settings, resumed
    assert runs[-1]["resume"] is True and runs[-1]["lr"] == 0.2 and runs[-1]["clients"] == 2
    assert runs[-1]["num-server-rounds"] == 2 and runs[-1]["out"] == str(out.resolve())
    assert main(["--out", str(out), "--overwrite", *work]) == 0
    assert runs[-1]["overwrite"] is True and "resume" not in runs[-1]


def test_deploy_fails_when_the_run_stops_before_its_last_round(tmp_path, monkeypatch, capsys):
    """``flwr run`` returns 0 when the ServerApp dies mid-run: deploy reads the run folder's checkpoint and
    exits 1, naming the round it stopped after and the command that continues it (before: exit 0)."""
    out = tmp_path / "run"
    _held_run(out)

    monkeypatch.setattr(Deployment, "start", lambda self: self)
    monkeypatch.setattr(Deployment, "run", _dies(out))
    work = tmp_path / "work"
    assert main(["--resume", str(out), "--rounds", "4", "--workdir", str(work)]) == 1
    err = capsys.readouterr().err
    assert (f"deploy: error: the run stopped after round 1 of 4 (see {work.resolve() / 'flwr-run.log'} and "
            f"{work.resolve() / 'superlink.log'}); continue it with: python -m server.deploy --resume "
            f"{out.resolve()}") in err, err
    replaced = tmp_path / "replaced"
    _held_run(replaced)
    monkeypatch.setattr(Deployment, "run", _dies(replaced))  # it removes that run, then dies
    assert main(["--out", str(replaced), "--overwrite", "--rounds", "2", "--workdir", str(work)]) == 1
    assert "the run stopped before round 1 of 2 ended" in capsys.readouterr().err
    monkeypatch.setattr(Deployment, "run", _dies(tmp_path / "fresh"))
    assert main(["--out", str(tmp_path / "fresh"), "--rounds", "2", "--workdir", str(work)]) == 1
    assert "the run left no trace" in capsys.readouterr().err  # it tidies its folder away


def test_the_command_that_continues_a_deployment_repeats_its_own_flags(tmp_path, monkeypatch, capsys):
    """The checkpoint keeps the run's settings, not the deployment's: the printed --resume command repeats
    --workdir, the token, the node profiles and where the tiers compute, so pasting it continues the same
    deployment (before: a bare --resume, which would have started it without its token)."""
    out = tmp_path / "my run"  # a space: the command is quoted as a shell reads it
    _held_run(out)
    monkeypatch.setattr(Deployment, "start", lambda self: self)
    monkeypatch.setattr(Deployment, "run", _dies(out))
    from splitfed.engine import compute

    form_only = compute.torch_device  # no GPU here: only the name's form is checked
    monkeypatch.setattr(compute, "torch_device", lambda text, what="", here=True: form_only(text, what, here=False))
    token = tmp_path / "token"
    token.write_text("secret\n")
    work = tmp_path / "work"
    assert main(["--resume", str(out), "--rounds", "4", "--workdir", str(work), "--token-file", str(token),
                 "--profile", "rpi4", "--profile", "phone-mid", "--tier-torch-device", "cuda:1"]) == 1
    err = capsys.readouterr().err
    said = re.search(r"continue it with: (.+)$", err, re.M)
    assert said, err
    assert shlex.split(said[1]) == ["python", "-m", "server.deploy", "--resume", str(out.resolve()),
                                    "--rounds", "4", "--workdir", str(work.resolve()), "--token-file",
                                    str(token.resolve()), "--profile", "rpi4", "--profile", "phone-mid",
                                    "--tier-torch-device", "cuda:1"], said[1]


def _fake_flwr(folder: Path, body: str) -> None:
    """A ``flwr`` command in ``folder`` (what ``Deployment.run`` starts, from its BIN) running ``body``."""
    script = folder / "flwr"
    script.write_text(f"#!{sys.executable}\nimport sys, time, pathlib\n{textwrap.dedent(body)}")
    script.chmod(0o755)


def test_flwr_run_output_is_shown_and_logged_as_it_comes(tmp_path, monkeypatch, capsys):
    """Before: ``flwr run``'s output was captured and shown only once the run had ended (hours later)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go_on = tmp_path / "go-on"
    _fake_flwr(bin_dir, f"""
        print("round 1/2 ...", flush=True)
        print("a warning", file=sys.stderr, flush=True)
        end = time.monotonic() + 30
        while not pathlib.Path({str(go_on)!r}).exists() and time.monotonic() < end:
            time.sleep(0.05)
        print("round 2/2 ...", flush=True)
        sys.exit(3)
    """)
    monkeypatch.setattr(deploy, "BIN", bin_dir)
    result: dict = {}
    with Deployment(2, tmp_path / "work") as dep:
        runner = threading.Thread(target=lambda: result.update(res=dep.run({"num-server-rounds": 2})))
        runner.start()
        log = tmp_path / "work" / "flwr-run.log"
        shown = ""
        end = time.monotonic() + 20
        while time.monotonic() < end and not ("a warning" in shown and log.is_file()
                                              and "a warning" in log.read_text()):
            shown += capsys.readouterr().out
            time.sleep(0.05)
        live = runner.is_alive()
        go_on.touch()
        runner.join(60)
    assert live, "flwr run ended before its output was seen"
    assert "round 1/2 ..." in shown and "a warning" in shown and "round 2/2" not in shown, shown
    res = result["res"]
    assert res.returncode == 3
    assert res.stdout.splitlines() == ["round 1/2 ...", "a warning", "round 2/2 ..."] == log.read_text().splitlines()
    assert "round 2/2 ..." in capsys.readouterr().out
    with Deployment(2, tmp_path / "work", log=False) as dep:  # a resume in the same workdir: the log goes on
        again = dep.run({"num-server-rounds": 2})
    lines = log.read_text().splitlines()
    assert lines[:3] == res.stdout.splitlines() and lines[4].startswith("--- flwr run again, ")
    assert lines[5:] == again.stdout.splitlines() == ["round 1/2 ...", "a warning", "round 2/2 ..."]


def test_flwr_run_output_loses_its_colours_off_a_terminal_and_is_kept_in_bounds(tmp_path, monkeypatch, capsys):
    """Flower colours its log lines even into a pipe: flwr-run.log, the result and piped output get them
    plain (before: escape codes in each). The result keeps the last KEPT_LINES lines, the log all of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_flwr(bin_dir, """
        print("\\x1b[92mINFO \\x1b[0m:      [ROUND 1]", flush=True)
        print("\\x1b[1;31mERROR\\x1b[0m : it broke", flush=True)
        for i in range(25):
            print(f"line {i}")
    """)
    monkeypatch.setattr(deploy, "BIN", bin_dir)
    monkeypatch.setattr(deploy, "KEPT_LINES", 20)
    with Deployment(2, tmp_path / "work") as dep:
        res = dep.run({"num-server-rounds": 1})
    logged = (tmp_path / "work" / "flwr-run.log").read_text().splitlines()
    assert logged[:3] == ["INFO :      [ROUND 1]", "ERROR : it broke", "line 0"] and len(logged) == 27, logged
    assert capsys.readouterr().out.splitlines() == logged  # pytest's capture is no terminal
    assert res.stdout.splitlines() == logged[-20:]


def test_flwr_run_has_no_time_limit_unless_given(tmp_path, monkeypatch):
    """Before: ``timeout=1800``: a run over 30 minutes died with a TimeoutExpired traceback."""
    assert inspect.signature(Deployment.run).parameters["timeout"].default is None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_flwr(bin_dir, f"""
        pathlib.Path({str(tmp_path / "pid")!r}).write_text(str(__import__("os").getpid()))
        time.sleep(60)
    """)
    monkeypatch.setattr(deploy, "BIN", bin_dir)
    with Deployment(2, tmp_path / "work", log=False) as dep, pytest.raises(subprocess.TimeoutExpired):
        dep.run({"num-server-rounds": 1}, timeout=2)
    assert not psutil.pid_exists(int((tmp_path / "pid").read_text()))  # the timed-out flwr run is stopped


def test_deploy_starts_its_tiers_where_it_is_told_and_refuses_a_gpu_the_machine_lacks(tmp_path, monkeypatch, capsys):
    import torch

    spawned: list[list[str]] = []
    monkeypatch.setattr(Deployment, "_spawn", lambda self, name, cmd: spawned.append(cmd))
    monkeypatch.setattr(Deployment, "_wait_served", lambda self, name, address, timeout=180.0: None)
    Deployment(2, tmp_path / "work", torch_device="cuda:1")._start_tiers()
    assert len(spawned) == 2 and all(cmd[cmd.index("--torch-device") + 1] == "cuda:1" for cmd in spawned)
    if not torch.cuda.is_available():
        monkeypatch.setattr(Deployment, "start", lambda self: pytest.fail("a deployment started"))
        assert main(["--clients", "2", "--out", str(tmp_path / "run"), "--tier-torch-device", "cuda"]) == 2
        assert "deploy: error: --tier-torch-device cuda: this machine has no CUDA GPU" in capsys.readouterr().err
        assert not (tmp_path / "run").exists()
