"""``python -m server.deploy``'s exit code, and its check of the two tokens. Before:

- once the checkpoint held every round, deploy exited with ``flwr run``'s code: a run that failed after its last
  round (its summary could not be written) exited 0, as ``flwr run`` exits after a failed ServerApp, and a run
  that finished exited non-zero when ``flwr run`` did (a wrapper that runs the real ``flwr``, then exits 3).
  Now the run folder's own record of the run (:func:`runstatus.status`) decides: 0 iff it finished;
- the devices' token given as the coordinator's was refused by the edge tier once the tiers had started (exit 1,
  the workdir and the tiers' logs left behind). Now it is refused before anything starts (exit 2, one line).

These tests stand in for Flower's processes. A run that failed after its last round, with the real ``flwr run``
(which exits 0) and deploy in a process of its own, is test_flower_deploy's
test_a_run_that_failed_after_its_last_round_exits_1_saying_why: its deployment (2 rounds, a client killed in the
second) serves it, where this file ran one of its own for it (1 SuperNode, 1 round: ~50 s on 2 cores). (A second
real one, a finished run whose ``flwr run`` wrapper exits 3, checked nothing the stand-ins do not: the exit code is
the run folder's, whoever wrote it.)
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from server import deploy
from server.deploy import Deployment, main
from splitfed.errors import RunFolderError
from splitfed.flower import checkpoint, runfolder, runstatus
from splitfed.flower.metrics import summary_again
from tests.test_flower_deploy import _held_run

pytestmark = pytest.mark.xdist_group("flower-deploy")  # real deployments, one at a time (no Ray: beside flower-real)

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
    assert runstatus.status(out).state == "finished"
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
