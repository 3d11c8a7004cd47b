"""Late review of the gradient-reach, cost, config and run-folder commits: each test fails on the code before
its fix."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from splitfed.engine import template
from splitfed.flower import runfolder, runstatus
from splitfed.flower.metrics import METRICS
from splitfed.models import rng
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile.profiler import profile_model

ROOT = Path(__file__).resolve().parent.parent


class _StopsInEval(nn.Module):
    """Lets the gradient through in training, computes without autograd in eval (a cache used only then)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return torch.tanh(x)
        with torch.no_grad():
            return torch.tanh(x)


class _StopsInTraining(nn.Module):
    """A stop-gradient used only while training."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x.detach() if self.training else x)


def moded(kind: str = "eval", bn: bool = False, width: int = 8) -> nn.Module:
    """Linear, Tanh, the mode-dependent block, Linear (``bn``: a BatchNorm after the first Linear; ``width``:
    another model, whose template and caches no other test has made)."""
    stop: nn.Module = _StopsInEval() if kind == "eval" else _StopsInTraining()
    return nn.Sequential(nn.Linear(6, width), *([nn.BatchNorm1d(width)] if bn else []), nn.Tanh(), stop,
                         nn.Linear(width, 3))


def _spec(kind: str, bn: bool = False) -> ModelSpec:
    return resolve_spec("tests.test_late_review:moded", input_shape=(6,), num_classes=3, kind=kind, bn=bn)


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_grad_reach_follows_training_mode(kind: str) -> None:
    """Which blocks train is what whole training (train mode) says: a block that stops the gradient in eval
    mode only left the device's blocks untrained in a split run (no gradient sent down), one that stops it in
    training only had a gradient computed and sent that nothing could use."""
    spec = _spec(kind)
    model = moded(kind).train()
    model(torch.randn(4, 6)).sum().backward()
    whole = [any(p.grad is not None for p in m.parameters()) for m in model.children()]
    blocks = template.template(spec)
    assert len(blocks) == len(whole)
    assert [template.gets_gradient(spec, i) for i in range(len(whole))] == whole
    assert template.trains_before(spec, 3) == whole[0]


def test_grad_reach_leaves_the_template_as_it_was() -> None:
    """Run in training mode, the probe puts back the template's running statistics and every module's mode."""
    spec = _spec("eval", bn=True)
    blocks = template.template(spec)
    blocks.modules[1].eval()  # a frozen BatchNorm inside a block in training mode stays frozen
    before = {k: v.clone() for k, v in blocks.modules[1].state_dict().items()}
    modes = [m.training for m in blocks.modules]
    template.grad_reach(spec)
    assert all(torch.equal(before[k], v) for k, v in blocks.modules[1].state_dict().items())
    assert [m.training for m in blocks.modules] == modes


def _check_elsewhere(folder: Path, resume: bool) -> str:
    """What another process's early check (``splitfed simulate``'s validate) says of ``folder``: its refusal."""
    code = (f"from splitfed.errors import ConfigError\nfrom splitfed.flower import runfolder, runstatus\ntry:\n"
            f"    runfolder.check({str(folder)!r}, resume={resume}, overwrite=False)\n"
            f"except ConfigError as e:\n    print(e)\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_reserved_folder_of_a_killed_run_does_not_name_the_dead_run_as_its_holder(tmp_path: Path) -> None:
    """A resume reserves the folder of a SIGKILLed run, whose lock file still holds that run's start record:
    a second run is refused naming no holder, not the dead process (whose pid may be anyone's by now)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / METRICS).write_text('{"round": 1, "accuracy": 0.5, "sim_round_s": 1.0}\n')
    code = "import json; from splitfed.flower import runfolder; print(json.dumps(runfolder._start_record()))"
    start = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout  # the killed run's record: its process is gone
    (folder / runfolder.LOCK).write_text(start)
    dead = json.loads(start)["pid"]
    assert runstatus.status(folder).state == "crashed"
    with runfolder.reserve(folder, resume=True, overwrite=False):
        refused = _check_elsewhere(folder, resume=True)
    assert f"in use by another run (pid {os.getpid()} on {socket.gethostname()}, still starting)" in refused, refused
    assert f"pid {dead} " not in refused


def test_profiling_never_waits_for_the_template_while_holding_torchs_generator() -> None:
    """The template takes its lock, then torch's generator (building a model, probing it); the profiler held
    the generator (its seeded measurement) and then asked the template which blocks train: a thread building
    another model meanwhile deadlocked both. Here a thread holds the template's lock as a build does, lets the
    profiler run into it, then asks for the generator: it must get it (the profiler waits holding nothing)."""
    spec = resolve_spec("tests.test_late_review:moded", input_shape=(6,), num_classes=3, kind="eval", width=7)
    template.grad_reach(spec)  # the template built; which blocks train not yet asked
    got: list[bool] = []
    done = threading.Event()
    with template._lock:  # a build of another model, under way
        worker = threading.Thread(target=_profile, args=(spec, done), daemon=True)
        worker.start()
        while not done.is_set() and not _waits_in_template(worker):
            threading.Event().wait(0.01)
        got.append(rng.LOCK.acquire(timeout=60))  # the build goes on to seed torch's generator
        if got[0]:
            rng.LOCK.release()
    worker.join()
    assert done.is_set()
    assert got == [True], "the profiler held torch's generator while waiting for the template's lock"


def _profile(spec: ModelSpec, done: threading.Event) -> None:
    profile_model(spec, batch=4, reps=1, use_cache=False)
    done.set()


def _waits_in_template(thread: threading.Thread) -> bool:
    """Whether ``thread`` is in :func:`template.template` (about to take, or waiting for, its lock)."""
    frame = sys._current_frames().get(thread.ident or -1)
    return frame is not None and frame.f_code is template.template.__code__
