"""``python -m server.deploy --workdir W`` where W holds files deploy did not write.

Before, deploy deleted ``W/app`` (a user's code), replaced ``W/coordinator-token`` with a new random token and
overwrote ``W/NAME.log`` and ``W/flwr-home/config.toml``, and exited 0 without a word. It now records what it
makes there (``.splitfed-deploy.json``) and refuses, before writing anything, a workdir holding one of those
names that record does not list; a workdir it made keeps working, and so does one that is the run folder too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import server.deploy as deploy
from server.deploy import WORKDIR_RECORD, Deployment
from splitfed.errors import ConfigError

OWN_2_CLIENTS = ["app", "cloud.log", "coordinator-token", "edge.log", "flwr-home", "flwr-run.log", "guard.log",
                 "superlink.log", "supernode0.log", "supernode1.log"]


def _not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(self: Deployment) -> Deployment:
        raise AssertionError("the deployment started")

    monkeypatch.setattr(Deployment, "start", start)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refusal(work: Path, path: Path) -> str:
    return (f"deploy: error: --workdir {work.resolve()}: deploy would replace {path.resolve()}, which it did not "
            "write; give an empty folder or a workdir deploy made\n")


def test_the_users_app_and_token_in_the_workdir_are_refused_and_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The prober's reproduction: deploy deleted app/main.py and replaced the token, and exited 0."""
    _not_started(monkeypatch)
    work = tmp_path / "work"
    (work / "app").mkdir(parents=True)
    (work / "app" / "main.py").write_text("my precious app code\n")
    (work / "coordinator-token").write_text("mysecret")
    code = deploy.main(["--clients", "2", "--rounds", "1", "--out", str(tmp_path / "run"), "--workdir", str(work)])
    assert code == 2 and capsys.readouterr().err == _refusal(work, work / "app")  # the first in name order
    assert _files(work) == {"app/main.py": b"my precious app code\n", "coordinator-token": b"mysecret"}
    assert sorted(os.listdir(work)) == ["app", "coordinator-token"] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["coordinator-token", "flwr-home/config.toml", "superlink.log", "guard.log",
                                  "flwr-run.log", "edge.log", "cloud.log", "supernode1.log"])
def test_each_name_deploy_writes_is_refused_when_the_user_holds_it(tmp_path: Path, name: str) -> None:
    work = tmp_path / "work"
    (work / name).parent.mkdir(parents=True, exist_ok=True)
    (work / name).write_text("mine")
    with pytest.raises(ConfigError) as e:
        Deployment(2, work, log=False)
    entry = work / name.split("/")[0]
    assert str(e.value) == _refusal(work, entry).removeprefix("deploy: error: ").rstrip("\n")
    assert _files(work) == {name: b"mine"} and not (work / WORKDIR_RECORD).exists()


def test_names_this_deployment_does_not_write_are_left_to_the_user(tmp_path: Path) -> None:
    """A third node's log with 2 nodes, the cloud's with 2 tiers, a token given with --coordinator-token-file
    (even the one in the workdir), a run folder's files (``--out`` the same folder): none is written."""
    work = tmp_path / "work"
    work.mkdir()
    mine = {"supernode2.log": b"a", "cloud.log": b"b", "coordinator-token": b"tok", "metrics.jsonl": b"{}\n",
            "notes.txt": b"c"}
    for name, data in mine.items():
        (work / name).write_bytes(data)
    dep = Deployment(2, work, tiers=2, coordinator_token_file=str(work / "coordinator-token"), log=False)
    assert {name: (work / name).read_bytes() for name in mine} == mine
    assert dep.coordinator_token_file == str(work / "coordinator-token")
    record = json.loads((work / WORKDIR_RECORD).read_text())
    assert record == {"written by": "splitfed deploy", "entries": [
        "app", "edge.log", "flwr-home", "flwr-run.log", "guard.log", "superlink.log", "supernode0.log",
        "supernode1.log"]}


def test_a_workdir_deploy_made_is_used_again_and_grows_with_more_nodes(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = Deployment(2, work, log=False)
    for name in OWN_2_CLIENTS:  # what the run's processes write
        if name.endswith(".log"):
            (work / name).write_text("earlier run\n")
    first.write_app()
    token = (work / "coordinator-token").read_text()
    assert json.loads((work / WORKDIR_RECORD).read_text())["entries"] == OWN_2_CLIENTS
    again = Deployment(3, work, log=False)  # a third node: its log is new, and deploy's from now on
    assert (work / "coordinator-token").read_text() != token and again.write_app() == work / "app"
    assert json.loads((work / WORKDIR_RECORD).read_text())["entries"] == sorted([*OWN_2_CLIENTS, "supernode2.log"])
    (work / "supernode2.log").write_text("run with 3 nodes\n")
    Deployment(2, work, log=False)  # fewer nodes: supernode2.log stays deploy's
    assert "supernode2.log" in json.loads((work / WORKDIR_RECORD).read_text())["entries"]


def test_a_name_deploy_recorded_that_the_user_made_again_as_a_link_is_refused(tmp_path: Path) -> None:
    work, theirs = tmp_path / "work", tmp_path / "project"
    Deployment(1, work, log=False).write_app()
    theirs.mkdir()
    (theirs / "main.py").write_text("mine")
    shutil.rmtree(work / "app")
    (work / "app").symlink_to(theirs)
    with pytest.raises(ConfigError, match=f"deploy would replace {work.resolve() / 'app'}, which it did not write"):
        Deployment(1, work, log=False)
    assert (theirs / "main.py").read_text() == "mine"


@pytest.mark.parametrize("text", ['{"written by": "someone else", "entries": ["app"]}', "not json",
                                  '{"written by": "splitfed deploy", "entries": "app"}'])
def test_a_record_that_is_not_deploys_is_refused_and_kept(tmp_path: Path, text: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / WORKDIR_RECORD).write_text(text)
    (work / "app").mkdir()
    with pytest.raises(ConfigError) as e:
        Deployment(1, work, log=False)
    assert str(e.value) == _refusal(work, work / WORKDIR_RECORD).removeprefix("deploy: error: ").rstrip("\n")
    assert (work / WORKDIR_RECORD).read_text() == text and (work / "app").is_dir()


def test_the_run_folder_may_be_the_workdir_and_the_refusal_leaves_nothing_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out`` and ``--workdir`` one new folder: deploy's record is made there and nothing is refused (the
    deployment is stopped at its start); a user's log there is refused before the run folder is touched."""

    class Stopped(deploy.StartFailed):
        pass

    def start(self: Deployment) -> Deployment:
        raise Stopped("stopped at its start by the test")

    monkeypatch.setattr(Deployment, "start", start)
    same = tmp_path / "run"
    assert deploy.main(["--out", str(same), "--workdir", str(same)]) == 1
    assert capsys.readouterr().err == "deploy: error: stopped at its start by the test\n"
    assert json.loads((same / WORKDIR_RECORD).read_text())["entries"] == OWN_2_CLIENTS

    other = tmp_path / "other"
    other.mkdir()
    (other / "superlink.log").write_text("mine")
    assert deploy.main(["--out", str(other), "--workdir", str(other)]) == 2
    assert capsys.readouterr().err == _refusal(other, other / "superlink.log")
    assert sorted(os.listdir(other)) == ["superlink.log"]
