"""What ``TierProcess`` promises from its spawn's readers to its stop, which the mutation run found unpinned.

- readiness and a child's exit are read from its stdout alone: a tier whose stderr closes at once (a child that
  logs elsewhere) still starts;
- a child that never says it serves is killed and refused at its ``startup_timeout`` (TimeoutError);
- a child that says it serves where nothing answers fails the health check (RuntimeError, killed); one with TLS
  but no client credentials to probe with is not probed;
- ``stop`` (and leaving a ``with`` block) is a SIGTERM the tier ends by itself (exit 0), SIGKILL only after
  ``grace`` + 5 s; a process that just exits, its tier never stopped, exits (the readers never hold it) and
  takes the tier with it.

The children that misbehave are ``splitfed tier`` commands given a ``sitecustomize`` on their PYTHONPATH
(``env``) that acts before the tier's code runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from splitfed.ports import free_ports
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.process import TierProcess
from tests.transport_fixtures import Certs, certs  # noqa: F401

pytestmark = pytest.mark.xdist_group("transport-processes")

ROOT = Path(__file__).resolve().parents[1]
Env = Callable[[str], dict[str, str]]  # the environment of a tier child that behaves as its argument says

_SITECUSTOMIZE = """\
import os, sys
what = os.environ.get("SPLITFED_TEST_CHILD", "")
if what == "quiet-stderr":  # stderr closed at once (to /dev/null): the tier goes on to serve as ever
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)
elif what == "silent":  # never says it serves; ends with its stdin
    sys.stdin.read()
    os._exit(0)
elif what.startswith("announce "):  # says it serves at an address where nothing answers
    print("listening on " + what.split()[1] + " (computing on cpu)", flush=True)
    sys.stdin.read()
    os._exit(0)
"""


@pytest.fixture
def child_env(tmp_path: Path) -> Env:
    """The environment of a tier child that behaves as ``what`` says (see ``_SITECUSTOMIZE``)."""
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return lambda what: {**os.environ, "PYTHONPATH": str(tmp_path), "SPLITFED_TEST_CHILD": what}


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(120)
def test_a_tier_whose_stderr_closes_at_once_still_starts_and_a_stop_lets_it_end_by_itself(child_env: Env) -> None:
    """Only the end of stdout says the child exited (the end of stderr is no sign: it waited 10 s, then raised).
    Leaving the block is ``stop``: a SIGTERM the tier answers by stopping its server and exiting 0, not a
    SIGKILL (-9) before it had the time."""
    with TierProcess.start("cloud", insecure=True, env=child_env("quiet-stderr")) as tp:
        with GrpcTierClient(tp.address) as c:
            assert c.describe().name == "cloud"
        assert tp.alive()
    assert tp.proc.returncode == 0 and not tp.alive()


@pytest.mark.timeout(120)
def test_stop_sigkills_a_tier_still_running_grace_plus_5_s_after_its_sigterm() -> None:
    """The docstring's ``grace`` + 5 s is the whole wait: ``grace=-5`` leaves the tier no time to end itself."""
    tp = TierProcess.start("cloud", insecure=True)
    tp.stop(grace=-5.0)
    assert tp.proc.returncode == -signal.SIGKILL and not tp.alive()


@pytest.mark.timeout(60)
def test_a_tier_that_never_says_it_serves_is_killed_at_its_startup_timeout(child_env: Env) -> None:
    tp = TierProcess.spawn("cloud", insecure=True, env=child_env("silent"), startup_timeout=1.0)
    with pytest.raises(TimeoutError, match=r"^tier cloud did not start within 1s:\n$"):
        tp.wait_ready()
    assert tp.address == "" and tp.proc.returncode == -signal.SIGKILL


@pytest.mark.timeout(60)
def test_a_tier_that_says_it_serves_where_nothing_answers_fails_its_health_check(child_env: Env) -> None:
    """A plaintext tier is asked for its health (once its line is read, for at least a second) before it counts
    as started; it does not answer: refused and killed."""
    address = f"127.0.0.1:{free_ports(1)[0]}"
    tp = TierProcess.spawn("cloud", insecure=True, env=child_env(f"announce {address}"), startup_timeout=1.0)
    with pytest.raises(RuntimeError, match=rf"^tier cloud at {address} does not report SERVING:\n"
                                           rf"listening on {address} \(computing on cpu\)$"):
        tp.wait_ready()
    assert tp.address == address and tp.proc.returncode == -signal.SIGKILL


@pytest.mark.timeout(60)
def test_a_tls_tier_without_client_credentials_is_not_probed(child_env: Env, certs: Certs) -> None:  # noqa: F811
    """With no credentials to probe it with, its line alone says it serves (a plaintext probe of a TLS tier
    would fail)."""
    address = f"127.0.0.1:{free_ports(1)[0]}"
    with TierProcess.start("cloud", tls=certs.server, env=child_env(f"announce {address}"),
                           startup_timeout=1.0) as tp:
        assert tp.address == address and tp.port == int(address.rpartition(":")[2]) and tp.alive()
    assert not tp.alive()


def test_a_process_that_exits_without_stopping_its_tier_exits_and_takes_the_tier_with_it() -> None:
    """The threads reading the tier's output must not hold the exit: the tier ends only with it (its stdin, or
    the exit's finalizer), so a reader waited on at exit hung both for ever."""
    script = textwrap.dedent("""\
        from splitfed.transport.process import TierProcess
        tier = TierProcess.start("cloud", insecure=True)
        print(tier.pid, flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert _gone(int(p.stdout))
