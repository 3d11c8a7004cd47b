"""``python -m server.deploy`` reviewed as an operator uses it. Before:

- Ctrl-C (SIGINT) to deploy was recorded in the run folder as a stop by SIGTERM: deploy stopped every process
  with SIGTERM, and the ServerApp records the signal it gets;
- the settings deploy checks before anything starts (``wanted``) were RunSettings' defaults under the flags, while
  the run it starts takes the app's (:data:`~splitfed.flower.config.APP_DEFAULTS`: adaptive cuts): a ``--set`` the
  run takes was refused against cuts the run does not use;
- ``--set`` of a setting deploy itself sets (clients, tiers, tier-addresses, TLS, tokens) reached the run config
  over the deployment's own: ``--set clients=3`` started 2 SuperNodes for a run that waits for 3;
- a token file that cannot be read was found by the first tier once everything was starting (a traceback, exit 1),
  a ``--workdir`` that is a file was a traceback, and so was a tier that exited as it started, where deploy says
  one error line.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.deploy import main
from splitfed.flower import checkpoint, runfolder, runstatus
from tests.test_deploy_signals import _family, _held, _left, _resumed, _running, reaped  # noqa: F401 - reaped: a fixture

ROOT = Path(__file__).resolve().parent.parent


def _deploy_cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m server.deploy --out TMP/run --workdir TMP/work ARGS`` (its ``main``, here: these refusals come
    before anything starts, and a new interpreter cost seconds of imports each): its exit code and output."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--out", str(tmp / "run"), "--workdir", str(tmp / "work"), *args])
    return subprocess.CompletedProcess(["server.deploy", *args], code, out.getvalue(), err.getvalue())


def test_wanted_settings_are_those_of_the_app_the_run_starts(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The app runs adaptive cuts (its default): min-device-blocks=3 suits them. Before, deploy checked it
    against RunSettings' static:2,5 and refused the run (exit 2) that would have run."""
    from server.deploy import as_run

    w = as_run({"clients": 2, "tiers": 3, "min-device-blocks": "3", "num-server-rounds": 1,
                "out": str(tmp_path / "run")}, "command line")
    assert (w.cuts, w.partition, w.min_device_blocks) == ("adaptive", "dirichlet:0.5", 3)


def test_a_set_the_run_takes_is_not_refused_for_the_default_of_another_front(tmp_path: Path) -> None:
    """Through the command itself: the settings pass, and the check after them (a profile that does not exist)
    refuses before anything starts. Before, the settings were refused for static cuts the run does not use."""
    p = _deploy_cli(tmp_path, "--set", "min-device-blocks=3", "--profile", "nosuch")
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("deploy: error: --profile nosuch: "), p.stderr
    assert not (tmp_path / "work").exists()


@settings(max_examples=12, deadline=None)
@given(key=st.sampled_from(["clients", "num-clients", "num_supernodes", "tiers", "tier-addresses", "tls-ca",
                            "token-file", "coordinator-token-file", "sim-clock", "resume", "overwrite", "out",
                            "num-server-rounds", "rounds", "tier-torch-device"]))
def test_a_set_of_what_deploy_sets_itself_is_refused_naming_its_flag(key: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Before, ``--set clients=3`` reached the run config over the 2 SuperNodes deploy started (the run then
    waited for a third node), ``--set tiers=2`` over the 3 tiers it started, ``--set tier-addresses=...`` over
    the addresses of its own tiers; now refused before anything starts, naming the flag to use."""
    import contextlib
    import io

    monkeypatch.chdir(tmp_path)
    not_a_folder = tmp_path / "file"  # before, a run folder refused for it: nothing starts either way
    not_a_folder.write_text("")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["--out", str(not_a_folder), "--set", f"{key}=1"])
    assert code == 2, err.getvalue()
    line = err.getvalue().strip()
    assert line.startswith(f"deploy: error: --set {key}: ") and "deploy sets it itself" in line, line


@pytest.mark.slow
def test_ctrl_c_is_recorded_as_sigint(tmp_path, reaped) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Ctrl-C reaches deploy alone (every process it started leads a session of its own): SIGINT to deploy.
    A run folder that keeps a round keeps the run, and its record says how it stopped: by SIGINT, as the user
    did, not by the SIGTERM deploy stopped everything with. The folder keeps round 1 before the run starts (a
    resume, :func:`~tests.test_deploy_signals._resumed`: training it here cost ~30 s more), and the SIGINT comes
    once the ServerApp holds the folder and a ClientApp runs (the query round: its stop handlers are in place)."""
    p, out, _ = _resumed(tmp_path)
    try:
        family = _running(p, reaped, tmp_path, checkpointed=True, names=("flwr-serverapp", "flwr-clientapp"))
        _held(p, tmp_path)
        family += _family(p)
        p.send_signal(signal.SIGINT)
        code = p.wait(90)
        text = (tmp_path / "deploy.out").read_text()
        assert code == 130, text[-3000:]
        assert "deploy: interrupted: every process it started is stopped" in text, text[-3000:]
        assert not _left(family), "still running after deploy exited"
        runfolder.check(out, resume=True, overwrite=False)  # free
        assert checkpoint.load(out).round >= 1
        st_ = runstatus.status(out)
        assert (st_.state, st_.record.get("signal")) == ("stopped", "SIGINT"), st_
    finally:
        p.kill()
        p.wait(10)


@pytest.mark.parametrize("flag", ["--token-file", "--coordinator-token-file"])
def test_a_token_file_that_cannot_be_read_is_refused_before_anything_starts(tmp_path: Path, flag: str) -> None:
    p = _deploy_cli(tmp_path, flag, str(tmp_path / "nosuch"))
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == f"deploy: error: {flag}: cannot read token file {tmp_path / 'nosuch'}: " \
                               "No such file or directory", p.stderr
    assert not (tmp_path / "work").exists()  # nothing was started


def test_a_workdir_that_is_a_file_is_refused_with_its_flag(tmp_path: Path) -> None:
    (tmp_path / "work").write_text("mine")
    p = _deploy_cli(tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"deploy: error: --workdir {tmp_path / 'work'}: cannot make it a folder"), p.stderr
    assert (tmp_path / "work").read_text() == "mine"


@pytest.mark.slow
def test_a_tier_that_refuses_to_start_is_one_error_and_nothing_is_left(tmp_path, monkeypatch, capsys,  # type: ignore[no-untyped-def]
                                                                       reaped) -> None:  # noqa: F811
    """The edge tier exits with a refusal as it starts (deploy's ``splitfed`` refuses the edge's start as a tier
    refuses what it cannot serve): one error line, and the cloud tier, already started, is stopped. Deploy's
    ``main``, in this process (a new interpreter only cost its imports: the signal tests run ``python -m
    server.deploy`` itself), and a cloud that only sleeps (a real one only cost its imports: real tiers are
    stopped by every real deployment, test_deploy_signals' and test_flower_deploy's)."""
    from server import deploy

    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "splitfed").write_text(
        "#!/bin/sh\n"
        'case " $* " in *" --role edge "*) echo "splitfed tier: error: the edge refuses to start" >&2; exit 2;; '
        "esac\n"
        f'exec {sys.executable} -c "import time; time.sleep(300)" "$@"\n')  # its command line names the workdir
    (folder / "splitfed").chmod(0o755)
    monkeypatch.setattr(deploy, "BIN", folder)
    code = main(["--clients", "2", "--out", str(tmp_path / "run"), "--workdir", str(tmp_path / "work")])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert out == "" and "Traceback" not in err and err.startswith("deploy: error: edge exited with code 2:"), err
    assert "the edge refuses to start" in err, err
    mine = [q for q in psutil.process_iter(["cmdline"])  # the tiers name the workdir
            if any(str(tmp_path) in a for a in q.info["cmdline"] or ())]
    reaped.extend(mine)
    assert not _left(mine), mine
