"""Ctrl-C and SIGTERM stop a real ``splitfed simulate`` cleanly, leaving a run ``--resume`` continues.

Before: Ctrl-C printed "interrupted" and then hung, because the interpreter waited at exit
on Flower's engine threads blocked on Ray actors that were gone; a second Ctrl-C ended it
with a traceback. SIGTERM (what ``timeout``, ``docker stop``, systemd and Slurm send) hit
Ray's crash handler and aborted the process (exit 134) with a C++ stack dump.

The deadline below only detects a hang; it is not a speed target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-real")]

ROOT = Path(__file__).resolve().parent.parent
SPLITFED = Path(sys.executable).parent / "splitfed"  # the console script, as a user runs it
HANG = 180  # seconds: far beyond a clean stop; only a hang gets here


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(SPLITFED), "simulate", "--config", "simulations/configs/main.toml", "--clients", "2", "--rounds", "4",
         "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _stop_after_round_1(p: subprocess.Popen, send) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    assert p.stdout is not None
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("round 1/4"):
            send(p)
            break
    else:
        pytest.fail("the run ended before round 1:\n" + "".join(seen))
    try:
        rest, _ = p.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the run did not stop after the signal (hang)")
    return p.returncode, "".join(seen) + rest


def _rounds(out: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_ctrl_c_stops_cleanly_and_leaves_a_resumable_run(tmp_path):
    out = tmp_path / "run"
    # a terminal's Ctrl-C goes to the whole process group (Ray's workers and the tier processes too)
    code, text = _stop_after_round_1(_start(out), lambda p: os.killpg(p.pid, signal.SIGINT))
    assert code == 130, text
    assert text.rstrip().endswith("splitfed simulate: interrupted"), text
    assert "Traceback" not in text and "ERROR" not in text, text
    done = _rounds(out)
    assert done and done == list(range(1, len(done) + 1))  # every finished round, none twice
    from splitfed.flower import checkpoint

    assert checkpoint.load(out).round >= done[-1] - 1  # what --resume continues from (tests/test_flower_sim.py)


def test_sigterm_stops_like_ctrl_c(tmp_path):
    out = tmp_path / "run"
    code, text = _stop_after_round_1(_start(out), lambda p: p.send_signal(signal.SIGTERM))
    assert code == 143, text
    assert text.rstrip().endswith("splitfed simulate: terminated"), text
    assert "SIGTERM received" not in text and "Traceback" not in text, text
    assert (out / "checkpoint.pt").is_file()
