"""Review of the changes since 928f788: each test failed before its fix.

- a package-relative import that climbs beyond the top-level package (``from ..x import f`` in ``pkg/net.py``:
  Python refuses it) was read as the absolute ``import x``, so an unrelated top-level ``x.py`` entered the
  model's profile key, and an edit to it measured the model again;
- the ServerApp (``flwr run .`` with ``resume=true``, or ``server.app.run``) answered a resume asking fewer
  rounds than an unfinished run holds by writing its summary.json and recording the run ``finished``, as
  simulate and server.deploy no longer do (``runfolder.nothing_to_do``);
- the cost model's memory rule named ``ModelProfile.shared_act_bytes``, a field that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import clients.app
from splitfed.flower import runstatus
from splitfed.flower.metrics import METRICS, SUMMARY
from splitfed.models.zoo import resolve_spec
from splitfed.profile import digest
from splitfed.profile.digest import code_digest
from splitfed.profile.profiler import ModelProfile
from tests.flower_fixtures import FakeGrid, inprocess_tiers
from tests.test_resume_review import SMALL, _stopped_after

NET = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 10)

    def forward(self, x):
        return self.a(x)

    def never_called(self):
        from ..{other} import f  # beyond the top-level package: Python refuses it, were it ever run


def make():
    return Net()
"""



def test_a_relative_import_beyond_the_top_level_package_is_not_read_as_an_absolute_one(tmp_path: Path,
                                                                                       tag: str) -> None:
    pkg, other = f"pkgrel_{tag}", f"otherrel_{tag}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "net.py").write_text(NET.format(other=other))
    (tmp_path / f"{other}.py").write_text("def f():\n    pass\n")  # unrelated to the model
    assert not any(n.startswith(other) for n in digest._imports(str(tmp_path / pkg / "net.py"), pkg))
    assert str(tmp_path / f"{other}.py") not in digest._user_files({f"{pkg}.net"})
    spec = resolve_spec(f"{pkg}.net:make", input_shape=(8,), num_classes=10)
    first = code_digest(spec)
    (tmp_path / f"{other}.py").write_text("def f():\n    return 1\n")
    assert code_digest(spec) == first
    # within the package's depth a relative import is still followed: `from . import x` in pkg/net.py
    (tmp_path / pkg / "net.py").write_text(NET.format(other=other).replace(f"from ..{other}", "from .helpers"))
    assert f"{pkg}.helpers" in digest._imports(str(tmp_path / pkg / "net.py"), pkg)


def test_the_server_app_resume_asking_fewer_rounds_leaves_a_run_ended_part_way_unfinished(tmp_path: Path,
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``flwr run . --run-config 'resume=true num-server-rounds=1 out=DIR'`` on a run stopped at round 2 of 4:
    before, it said "the checkpoint already holds round 2 of 1", wrote summary.json and recorded the run
    finished; now it answers as ``splitfed simulate --resume`` does."""
    import server.app

    _stopped_after(tmp_path, 2, monkeypatch)
    rows = (tmp_path / METRICS).read_bytes()
    with inprocess_tiers(monkeypatch, SMALL.tiers - 1):
        summary = server.app.run(FakeGrid(clients.app.app, SMALL.clients),
                                 SMALL.with_(out=str(tmp_path), rounds=1, resume=True), progress=lambda line: None)
    assert summary["rounds"] == 2
    assert not (tmp_path / SUMMARY).exists() and (tmp_path / METRICS).read_bytes() == rows
    assert runstatus.status(tmp_path).state == "stopped"


def test_the_cost_models_docstring_names_fields_the_profile_has() -> None:
    import splitfed.cost.model as cost_model

    named = set(re.findall(r"ModelProfile\.(\w+)", cost_model.__doc__ or ""))
    assert named and all(hasattr(ModelProfile, n) or n in ModelProfile.__dataclass_fields__ for n in named), named
