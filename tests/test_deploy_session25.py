"""``python -m server.deploy``'s exit code, and its check of the two tokens. Before:

- once the checkpoint held every round, deploy exited with ``flwr run``'s code: a run that failed after its last
  round (its summary could not be written) exited 0, as ``flwr run`` exits after a failed ServerApp, and a run
  that finished exited non-zero when ``flwr run`` did (a wrapper that runs the real ``flwr``, then exits 3).
  Now the run folder's own record of the run (:func:`runfolder.status`) decides: 0 iff it finished;
- the devices' token given as the coordinator's was refused by the edge tier once the tiers had started (exit 1,
  the workdir and the tiers' logs left behind). Now it is refused before anything starts (exit 2, one line).

The real deployment (slow: 1 SuperNode, 1 round of the app's tiny digits data, about a minute on 2 cores) runs
deploy as the user does, in a process of its own; the others stand in for Flower's processes. (A second real one,
a finished run whose ``flwr run`` wrapper exits 3, checked nothing the stand-ins do not: the exit code is the run
folder's, whoever wrote it, and a real run's finish is the deployment fixture's.)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from server import deploy
from server.deploy import Deployment, main
from splitfed.errors import RunFolderError
from splitfed.flower import checkpoint, runfolder
from splitfed.flower.metrics import summary_again
from tests.test_flower_deploy import _held_run

pytestmark = pytest.mark.xdist_group("flower-deploy")  # real deployments, one at a time (no Ray: beside flower-real)

ROOT = Path(__file__).resolve().parent.parent
BIN = deploy.BIN  # the environment's own Flower and splitfed commands


def _deploy(tmp: Path, bin_dir: Path, *args: str) -> tuple[int, Path, str]:
    """Deploy in a process of its own, starting its commands from ``bin_dir``: its exit code, run folder and
    output."""
    out, log = tmp / "run", tmp / "deploy.out"
    script = ("import sys\nfrom pathlib import Path\nfrom server import deploy\n"
              f"deploy.BIN = Path({str(bin_dir)!r})\nsys.exit(deploy.main(sys.argv[1:]))\n")
    with open(log, "w") as f:
        code = subprocess.run([sys.executable, "-c", script, "--clients", "1", "--rounds", "1", "--out", str(out),
                               "--workdir", str(tmp / "work"), *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              start_new_session=True, timeout=480).returncode
    return code, out, log.read_text()


# --------------------------------------------------------------- the exit code, with real deployments

@pytest.mark.slow
def test_a_run_that_failed_after_its_last_round_exits_1_saying_why(tmp_path: Path) -> None:
    """Its summary cannot be written (a folder holds its name): the ServerApp fails after round 1 is kept,
    and the real ``flwr run`` exits 0."""
    out = tmp_path / "run"
    (out / "summary.json").mkdir(parents=True)
    code, _, text = _deploy(tmp_path, BIN)
    st = runfolder.status(out)
    assert st.state == "failed" and checkpoint.load(out).round == 1, (st, text[-3000:])
    assert code == 1, text[-3000:]
    work = (tmp_path / "work").resolve()
    said = re.findall(r"^deploy: error: .*$", text, re.M)
    assert said == [f"deploy: error: the run kept every round but did not finish: it failed: cannot write "
                    f"{out.resolve() / 'summary.json'}: Is a directory (the rounds before it are kept: free space or "
                    f"fix the folder, then continue with --resume {out.resolve()}) (see {work / 'flwr-run.log'} and "
                    f"{work / 'superlink.log'}); write its summary with: python -m server.deploy --resume "
                    f"{out.resolve()} --workdir {work}"], text[-3000:]


# --------------------------------------------------------------- the exit code, with the run folder's real record

def _claimed(out: Path, fail: bool) -> None:
    """What a ServerApp leaves in ``out``: round 1 kept under its claim of the folder, then its summary, or
    the failure to write it (recorded by the claim)."""
    with runfolder.claim(out, resume=False, overwrite=False):
        _held_run(out, 1)
        if fail:
            raise RunFolderError(f"cannot write {out / 'summary.json'}: No space left on device")
        summary_again(out, 1, checkpoint.load(out).settings)


@pytest.mark.parametrize(("fail", "flwr_code", "expected"), [(False, 3, 0), (True, 0, 1)])
def test_the_exit_code_is_the_run_folders_not_flwr_runs(tmp_path, monkeypatch, capsys, fail, flwr_code,  # type: ignore[no-untyped-def]
                                                        expected) -> None:
    out = tmp_path / "run"

    def ran(self, overrides, timeout=None):  # type: ignore[no-untyped-def]
        try:
            _claimed(out, fail)
        except RunFolderError:  # the ServerApp's failure, recorded: flwr run says nothing of it
            assert fail
        return subprocess.CompletedProcess([], flwr_code, "", "")

    monkeypatch.setattr(Deployment, "start", lambda self: self)  # nothing starts: the slow tests start it
    monkeypatch.setattr(Deployment, "run", ran)
    assert main(["--out", str(out), "--rounds", "1", "--workdir", str(tmp_path / "work")]) == expected
    err = capsys.readouterr().err
    if fail:
        assert ("deploy: error: the run kept every round but did not finish: it failed: cannot write "
                f"{out / 'summary.json'}: No space left on device (see ") in err, err
    else:
        assert err.strip() == "deploy: flwr run exited with code 3 after the run finished", err


def test_a_serverapp_that_never_claims_the_folder_is_no_finished_run(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """``--overwrite`` over a finished run, and the ServerApp dies before it claims the folder (``flwr run``
    exits 0, as it does): before, the old run's "finished" was read as this run's, and deploy exited 0."""
    out = tmp_path / "run"
    _claimed(out, fail=False)
    assert runfolder.status(out).state == "finished"
    monkeypatch.setattr(Deployment, "start", lambda self: self)
    monkeypatch.setattr(Deployment, "run", lambda self, overrides, timeout=None: subprocess.CompletedProcess([], 0))
    work = tmp_path / "work"
    assert main(["--out", str(out), "--rounds", "1", "--overwrite", "--workdir", str(work)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"deploy: error: the run left no trace: the run folder {out} is as it was before (its ServerApp did not "
        f"start, or stopped before round 1 of 1 ended; see {work / 'flwr-run.log'} and {work / 'superlink.log'})"]


# --------------------------------------------------------------- one token for devices and coordinator

@pytest.mark.parametrize("files", ["one file", "two files"])
def test_the_devices_token_as_the_coordinators_is_refused_before_anything_starts(tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
                                                                                   capsys, files: str) -> None:
    """Every command deploy would start is a script that records its start: none may run (so no port is
    bound), and no workdir is made (the guard's log would be there). Before: the edge tier refused it once both tiers had started."""
    started = tmp_path / "started"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("splitfed", "flower-superlink", "flower-supernode", "flwr"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} >> {shlex.quote(str(started))}\nexit 2\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(deploy, "BIN", bin_dir)
    token, coordinator = tmp_path / "token", tmp_path / ("token" if files == "one file" else "coord-token")
    token.write_text("same-token\n")
    coordinator.write_text("  same-token")  # the same token as a tier reads it (whitespace around it ignored)
    code = main(["--clients", "1", "--out", str(tmp_path / "run"), "--workdir", str(tmp_path / "work"),
                 "--token-file", str(token), "--coordinator-token-file", str(coordinator)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines() == [f"deploy: error: --coordinator-token-file {coordinator} holds the same token as "
                                f"--token-file {token}: every device holds that one; give the coordinator a token "
                                "of its own (or leave --coordinator-token-file out: deploy makes one)"], err
    assert not started.exists(), started.read_text()
    assert not (tmp_path / "work").exists() and not (tmp_path / "run").exists()  # nor the guard's log
