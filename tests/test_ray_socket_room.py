"""A temporary folder too deep for Ray's Unix sockets is refused before Ray starts, naming the variable to set.

Before: a batch job's deep TMPDIR made every one of Ray's 3 start attempts fail with
``OSError: validate_socket_filename failed: AF_UNIX path length cannot exceed 107 bytes``, each keeping a
session folder, and the error did not say what to change.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitfed.errors import ConfigError
from splitfed.sim.ray_start import check_socket_room

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 107  # a Unix socket's path on Linux: 108 bytes with its NUL


def _socket_length(ray_tmpdir: str, pid: int) -> int:
    """The longest socket path of Ray's session under ``ray_tmpdir``, counted here on its own:
    ``<ray_tmpdir>/ray/session_2026-12-06_11-09-51_242108_<pid>/sockets/plasma_store``."""
    return len(ray_tmpdir) + len("/ray/session_") + len("2026-12-06_11-09-51_242108") + 1 + len(str(pid)) \
        + len("/sockets/plasma_store")


def _folder_of_length(base: str, total: int, pid: int) -> str:
    """A path under ``base`` whose Ray socket paths are ``total`` bytes long."""
    pad = total - _socket_length(base + "/", pid)
    assert pad >= 1
    return f"{base}/{'d' * pad}"


@given(length=st.integers(min_value=20, max_value=200))
def test_a_folder_is_refused_exactly_when_its_socket_paths_are_too_long(length: int) -> None:
    ray_tmpdir = "/" + "t" * (length - 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", ray_tmpdir)
        n = _socket_length(ray_tmpdir, os.getpid())
        if n <= LIMIT:
            check_socket_room()
            return
        with pytest.raises(ConfigError) as e:
            check_socket_room()
    assert str(e.value) == (
        f"Ray cannot start under {ray_tmpdir}/ray: the paths of its sockets there ({ray_tmpdir}/ray/session_<date>_"
        f"<pid>/sockets/plasma_store) would be {n} bytes long, over the {LIMIT} a Unix socket's path may have; set "
        "RAY_TMPDIR to a folder with a shorter path (e.g. RAY_TMPDIR=/tmp)")


def test_without_ray_tmpdir_the_error_names_tmpdir(monkeypatch: pytest.MonkeyPatch) -> None:
    deep = "/scratch/" + "j" * 100
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv("TMPDIR", deep)
    with pytest.raises(ConfigError, match=r"set TMPDIR \(or RAY_TMPDIR, which Ray reads first\) to a folder"):
        check_socket_room()
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")  # Ray reads it first: the deep TMPDIR no longer matters
    check_socket_room()


def test_simulate_refuses_a_deep_folder_before_ray_starts_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The command's exit code, its one line and what it leaves: run in this process (``splitfed.cli.main``);
    was a ``splitfed`` process of its own, an interpreter and its imports for what the command says. A real
    ``splitfed simulate`` process, the console script, is tests/test_signals.py's and tests/test_sim_review.py's."""
    from splitfed.cli import main

    deep = tmp_path / ("d" * 120)
    out = tmp_path / "run"
    monkeypatch.setenv("RAY_TMPDIR", str(deep))
    code = main(["simulate", "--config", str(ROOT / "simulations/configs/main.toml"), "--rounds", "1",
                 "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 2, printed.out + printed.err
    assert printed.err.startswith(f"splitfed simulate: error: Ray cannot start under {deep}/ray: "), printed.err
    assert printed.err.rstrip().endswith("set RAY_TMPDIR to a folder with a shorter path (e.g. RAY_TMPDIR=/tmp)")
    assert len(printed.err.strip().splitlines()) == 1, printed.err  # no "Ray did not start (attempt 1/3)", no hint
    assert not deep.exists() and not out.exists()  # nothing of Ray, no run folder


@pytest.mark.slow
@pytest.mark.xdist_group("flower-real")
def test_the_check_draws_the_line_where_ray_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the limit Ray starts (the check lets it), its socket paths as long as counted; a byte over, Ray
    itself refuses the folder (the check refuses it first): the formula is Ray's own."""
    import ray

    from splitfed.sim.ray_start import remove_session, session_dir, shutdown_ray, start_ray

    base = tempfile.mkdtemp(prefix="sfk", dir="/tmp")
    try:
        over = _folder_of_length(base, LIMIT + 1, os.getpid())
        monkeypatch.setenv("RAY_TMPDIR", over)
        with pytest.raises(ConfigError):
            check_socket_room()
        with pytest.raises(OSError, match=f"AF_UNIX path length cannot exceed {LIMIT} bytes"):
            ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, logging_level="ERROR")
        shutdown_ray()

        at = _folder_of_length(base, LIMIT, os.getpid())
        monkeypatch.setenv("RAY_TMPDIR", at)
        check_socket_room()
        start_ray({"address": "local", "num_cpus": 1, "num_gpus": 0, "include_dashboard": False,
                   "logging_level": "ERROR"}, attempts=1)
        try:
            session = session_dir()
            assert session is not None
            sockets = sorted(str(s) for s in (session / "sockets").iterdir())
            assert max(len(s) for s in sockets) == LIMIT, sockets
        finally:
            shutdown_ray()
        assert remove_session(session)
    finally:
        shutil.rmtree(base, ignore_errors=True)
