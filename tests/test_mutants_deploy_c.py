"""``python -m server.deploy``'s ``main`` past its checks, and how it ends (server/deploy.py from ``main``'s
defaults to the end): the defaults of --clients/--rounds/--tiers the deployment and the run get, the folder a
resume with nothing to do names as the user named it, the exit code and line of each way a deployment stops
(a process that did not start, every SuperNode gone, Ctrl-C, SIGTERM), how a run folder says its run ended
(``_ended``) and what a run stopped short keeps (``_kept``).

Nothing really starts here: ``Deployment.start`` and ``Deployment.run`` stand in for Flower's processes, as
in tests/test_deploy_session25.py.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from server import deploy
from server.deploy import Deployment, NodesGone, StartFailed, main
from splitfed.errors import Terminated
from splitfed.flower import runstatus
from splitfed.flower.config import RunSettings
from tests.test_flower_deploy import _held_run


def _args(**given: object) -> argparse.Namespace:
    """deploy's parsed flags, as ``main`` hands them to ``_kept``: none given but ``given``."""
    flags: dict[str, object] = {"workdir": None, "tls_ca": "", "tls_cert": "", "tls_key": "", "token_file": "",
                                "coordinator_token_file": "", "profile": [], "tier_torch_device": "cpu"}
    return argparse.Namespace(**{**flags, **given})


# --------------------------------------------------------------- main: defaults and resume

def test_without_flags_two_supernodes_three_tiers_and_one_round_are_deployed(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The defaults the help names (--clients 2, --tiers 3, --rounds 1): the deployment started and the run
    config it hands ``flwr run`` get them."""
    seen: list[tuple[int, int, dict]] = []

    def ran(self, overrides, timeout=None):  # type: ignore[no-untyped-def]
        seen.append((self.clients, self.tiers, dict(overrides)))
        return subprocess.CompletedProcess([], 0, "", "")  # the run left no trace: exit 1, not the point here

    monkeypatch.setattr(Deployment, "start", lambda self: self)
    monkeypatch.setattr(Deployment, "run", ran)
    out = tmp_path / "run"
    assert main(["--out", str(out), "--workdir", str(tmp_path / "work")]) == 1
    [(clients, tiers, overrides)] = seen
    assert (clients, tiers, overrides["num-server-rounds"]) == (2, 3, 1)
    assert "; 2 supernode(s); " in capsys.readouterr().out


def test_a_resume_with_nothing_to_do_names_the_folder_as_the_user_gave_it(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """``--resume run`` (relative) whose round 1 of 1 is kept: nothing starts, exit 0, and the way to train on
    repeats the user's own ``--resume run``."""
    monkeypatch.chdir(tmp_path)
    _held_run(tmp_path / "run", 1)
    monkeypatch.setattr(Deployment, "start", lambda self: pytest.fail("nothing is to start"))
    assert main(["--resume", "run", "--workdir", str(tmp_path / "work")]) == 0
    err = capsys.readouterr().err
    assert (f"nothing to do: {(tmp_path / 'run').resolve()} already holds round 1 of 1 (to train on: --resume run "
            "--rounds 2 or more)") in err, err


# --------------------------------------------------------------- main: how a deployment stops

def _stopping(monkeypatch, where: str, exc: BaseException) -> None:  # type: ignore[no-untyped-def]
    """``Deployment.start`` (``where`` "start") or ``Deployment.run`` ("run") raises ``exc``."""
    def raises(*_a, **_k):  # type: ignore[no-untyped-def]
        raise exc

    monkeypatch.setattr(Deployment, "start", raises if where == "start" else (lambda self: self))
    monkeypatch.setattr(Deployment, "run", raises)


def test_a_process_that_did_not_start_exits_1_with_its_line(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    _stopping(monkeypatch, "start", StartFailed("tier edge exited with code 2 (see its log)"))
    assert main(["--out", str(tmp_path / "run"), "--workdir", str(tmp_path / "work")]) == 1
    assert capsys.readouterr().err.splitlines() == ["deploy: error: tier edge exited with code 2 (see its log)"]


def test_every_supernode_gone_exits_1_saying_the_run_is_stopped_and_what_is_kept(tmp_path, monkeypatch,  # type: ignore[no-untyped-def]
                                                                                 capsys) -> None:
    _stopping(monkeypatch, "run", NodesGone("every SuperNode exited"))
    out = tmp_path / "run"
    assert main(["--out", str(out), "--workdir", str(tmp_path / "work")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "deploy: error: every SuperNode exited; the run is stopped",
        f"deploy: no round was kept in {out}: run the same command again to start over"]


@pytest.mark.parametrize(("exc", "code", "word"), [(KeyboardInterrupt(), 130, "interrupted"),
                                                   (Terminated(), 143, "terminated")])
def test_ctrl_c_exits_130_and_sigterm_143(tmp_path, monkeypatch, capsys, exc, code, word) -> None:  # type: ignore[no-untyped-def]
    """The shell's codes for a process ended by SIGINT and SIGTERM (128 + the signal)."""
    _stopping(monkeypatch, "run", exc)
    out = tmp_path / "run"
    assert main(["--out", str(out), "--workdir", str(tmp_path / "work")]) == code
    assert capsys.readouterr().err.splitlines() == [
        f"deploy: {word}: every process it started is stopped",
        f"deploy: no round was kept in {out}: run the same command again to start over"]


# --------------------------------------------------------------- _ended: how the folder says the run ended

@pytest.mark.parametrize(("state", "record", "said"), [
    ("stopped", {"signal": "SIGTERM", "reason": "its reader went away"}, "it was stopped by SIGTERM"),
    ("stopped", {"reason": "its output's reader went away"}, "it was stopped by its output's reader went away"),
    ("stopped", {}, "it was stopped by a signal"),
    ("crashed", {"pid": 1}, "it crashed (its ServerApp ended without recording how)"),
    ("running", {"pid": 1}, "it was still running when flwr run returned"),
    ("unknown", {"host": "elsewhere"}, "it recorded no end (the folder reads unknown)"),
])
def test_each_way_a_run_ended_has_its_words(state: str, record: dict, said: str) -> None:
    assert deploy._ended(runstatus.RunStatus(state, record)) == said


# --------------------------------------------------------------- _kept: what a run stopped short keeps

def test_a_run_stopped_part_way_says_the_round_kept_and_how_to_continue(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    _held_run(out, 1)
    deploy._kept(_args(), RunSettings(rounds=3, out=str(out)))
    assert capsys.readouterr().err.splitlines() == [
        f"deploy: round 1 of 3 is kept in {out}; continue it with: python -m server.deploy --resume {out} "
        "--rounds 3"]


def test_a_run_stopped_before_any_round_was_kept_says_to_start_over(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    deploy._kept(_args(), RunSettings(rounds=3, out=str(out)))
    assert capsys.readouterr().err.splitlines() == [
        f"deploy: no round was kept in {out}: run the same command again to start over"]


def test_a_run_that_kept_every_round_and_one_stopped_before_its_settings_say_nothing(tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                                     capsys) -> None:
    """Every round kept: nothing to continue. No settings yet (a refusal before them): no folder to read."""
    out = tmp_path / "run"
    _held_run(out, 2)
    deploy._kept(_args(), RunSettings(rounds=2, out=str(out)))
    deploy._kept(_args(), None)
    assert capsys.readouterr().err == ""
