"""Parts of ``splitfed.profile.profiler`` that a mutation run found unpinned (its second half, from the profile
key on): which source files the key of a user's model (``code_digest``) follows. The walk (``_user_files``)
reaches the files of the modules that define the model's classes even when the factory's module never imports
them; a module with no file of its own is walked when the user named it (a notebook's module) and only then (a
built-in module met on the way is not: its contents are not the user's code), whether it is met by an import, as
a module in the globals or as a function's ``__module__``; a module whose ``__file__`` is no path is treated as
one without a file; a module of torch's is never walked, by its name, wherever its file lies (a source
checkout); and the files of Python's installation, the standard library included, and of the base installation
under a virtual environment are not the user's."""

from __future__ import annotations

import importlib
import sys
import sysconfig
import types
from pathlib import Path

import pytest

from splitfed.models.zoo import resolve_spec
from splitfed.profile import digest
from splitfed.profile.digest import code_digest

HELPER = "def body(x):\n    return x.{op}()\n"



def _helper(tmp_path: Path, name: str, op: str = "relu") -> types.ModuleType:
    (tmp_path / f"{name}.py").write_text(HELPER.format(op=op))
    return importlib.import_module(name)


def _no_file(name: str, **values: object) -> types.ModuleType:
    """A module without a file, as a built-in one (or a notebook's) is, holding ``values``."""
    mod = types.ModuleType(name)
    vars(mod).update(values)
    sys.modules[name] = mod
    return mod


# ---------------------------------------------------------------- what the key follows


def test_the_key_follows_a_helper_of_the_models_class_module_that_the_factory_never_imports(
        tag: str, tmp_path: Path) -> None:
    """The factory's module gets the model's class by a name computed at run time (no import of it in its file),
    and the class's module imports the helper its forward calls: the class's module is walked too, so an edit to
    the helper makes a new key (the model's structure, and the class's file, are the same)."""
    entry, layers, helper = f"entry_{tag}", f"layers_{tag}", f"helper_{tag}"
    (tmp_path / f"{entry}.py").write_text(
        "import importlib\n\n\ndef make():\n"
        f"    return importlib.import_module({layers!r}).Net()\n")
    (tmp_path / f"{layers}.py").write_text(
        f"import torch.nn as nn\nfrom {helper} import body\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.a = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n        return body(self.a(x))\n")
    _helper(tmp_path, helper)
    spec = resolve_spec(f"{entry}:make", input_shape=(4,), num_classes=4)
    first = code_digest(spec)
    assert code_digest(spec) == first  # stable while nothing changes
    (tmp_path / f"{helper}.py").write_text(HELPER.format(op="sigmoid"))
    assert code_digest(spec) != first


def test_the_key_of_a_notebooks_module_follows_the_files_its_globals_reach(tag: str, tmp_path: Path) -> None:
    """The module the user names has no file (a notebook's): it is walked all the same, and a function it took
    from a file (``from helper import body`` in a cell) puts that file in the key: an edit to it makes a new key."""
    helper, nb = _helper(tmp_path, f"helper_{tag}"), f"nb_{tag}"
    mod = _no_file(nb, body=helper.body)
    exec("from torch import nn\ndef make():\n    return nn.Sequential(nn.Linear(6, 3))\n", vars(mod))  # noqa: S102
    assert mod.make.__module__ == nb
    spec = resolve_spec(f"{nb}:make", input_shape=(6,), num_classes=3)
    first = code_digest(spec)
    assert code_digest(spec) == first
    (tmp_path / f"helper_{tag}.py").write_text(HELPER.format(op="sigmoid"))
    assert code_digest(spec) != first
    assert digest._user_files({nb}) == [helper.__file__]


# ---------------------------------------------------------------- modules without a file, met on the way


def test_a_module_without_a_file_that_the_users_file_imports_is_not_walked(tag: str, tmp_path: Path) -> None:
    """``import builtin_like`` in the user's file: a module with no file that the user did not name is not the
    user's code (a built-in one), and what it holds (here a function of another file) is not followed."""
    helper = _helper(tmp_path, f"helper_{tag}")
    _no_file(f"builtin_{tag}", body=helper.body)
    entry = tmp_path / f"entry_{tag}.py"
    entry.write_text(f"import builtin_{tag}\n")
    assert digest._user_files({f"entry_{tag}"}) == [str(entry)]


def test_a_module_without_a_file_in_the_users_globals_is_not_walked(tag: str, tmp_path: Path) -> None:
    """A module object in the user's module's globals, with no file (a built-in one, obtained without an import
    statement): not walked, so the function of another file it holds is not in the key."""
    helper = _helper(tmp_path, f"helper_{tag}")
    builtin = _no_file(f"builtin_{tag}", body=helper.body)
    entry = tmp_path / f"entry_{tag}.py"
    entry.write_text("x = 1\n")
    importlib.import_module(f"entry_{tag}").mod = builtin  # type: ignore[attr-defined]
    assert digest._user_files({f"entry_{tag}"}) == [str(entry)]


def test_a_function_whose_module_has_no_file_is_not_walked_into(tag: str, tmp_path: Path) -> None:
    """A function in the user's globals whose ``__module__`` names a module with no file (not the user's): that
    module is not walked, so the function of another file it holds is not in the key."""
    helper = _helper(tmp_path, f"helper_{tag}")
    builtin = _no_file(f"builtin_{tag}", body=helper.body)
    exec("def fn():\n    return 1\n", vars(builtin))  # noqa: S102
    assert builtin.fn.__module__ == f"builtin_{tag}"
    entry = tmp_path / f"entry_{tag}.py"
    entry.write_text("x = 1\n")
    importlib.import_module(f"entry_{tag}").fn = builtin.fn  # type: ignore[attr-defined]
    assert digest._user_files({f"entry_{tag}"}) == [str(entry)]


@pytest.mark.parametrize("odd", ["", "path"])
def test_a_module_whose_file_is_no_path_is_one_without_a_file(tag: str, tmp_path: Path, odd: str) -> None:
    """A module imported by the user's file whose ``__file__`` is empty or not a str (a ``Path``, as some loaders
    leave it): it has no file to hash, and is neither taken as one (not the current folder for "") nor a crash."""
    entry = tmp_path / f"entry_{tag}.py"
    entry.write_text(f"import odd_{tag}\n")
    odd_mod = _no_file(f"odd_{tag}")
    odd_mod.__file__ = "" if odd == "" else tmp_path / f"odd_{tag}.py"  # type: ignore[assignment]
    (tmp_path / f"odd_{tag}.py").write_text("x = 1\n")
    assert digest._user_files({f"entry_{tag}"}) == [str(entry)]


# ---------------------------------------------------------------- what is not the user's


def test_a_module_of_torchs_is_not_walked_even_from_a_source_checkout(tag: str, tmp_path: Path) -> None:
    """torch is known by its name, not only by where it is installed: a module of torch's whose file lies in
    the user's folders (a source checkout of torch) is not the user's code."""
    checkout = tmp_path / f"torch_src_{tag}.py"
    checkout.write_text("x = 1\n")
    fake = _no_file(f"torch._fake_{tag}")
    fake.__file__ = str(checkout)
    entry = tmp_path / f"entry_{tag}.py"
    entry.write_text(f"import torch._fake_{tag}\n")
    assert digest._user_files({f"entry_{tag}"}) == [str(entry)]


def test_the_standard_library_is_not_the_users(tag: str, tmp_path: Path) -> None:
    """The user's file imports modules of the standard library (outside site-packages): their files are not in
    the key, and neither are the files they reach."""
    import json
    import textwrap

    entry = tmp_path / f"entry_{tag}.py"
    entry.write_text("import json\nimport textwrap\nfrom email import message\n")
    assert digest._user_files({f"entry_{tag}"}) == [str(entry)]
    assert json.__file__ and not digest._is_users_file(json.__file__)
    assert textwrap.__file__ and not digest._is_users_file(textwrap.__file__)


def test_the_base_installations_standard_library_is_not_the_users(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a virtual environment the standard library is the base installation's (``sys.base_prefix``), which
    the environment's own paths need not name: a module there is not the user's."""
    base = tmp_path / "base"
    monkeypatch.setattr(sys, "base_prefix", str(base))
    monkeypatch.setattr(sys, "base_exec_prefix", str(base))
    stdlib = Path(sysconfig.get_path("stdlib", vars={"base": str(base), "platbase": str(base),
                                                     "installed_base": str(base), "installed_platbase": str(base)}))
    assert stdlib.is_relative_to(base)
    stdlib.mkdir(parents=True)
    (stdlib / "somelib.py").write_text("x = 1\n")
    digest._installed_dirs.cache_clear()
    try:
        assert not digest._is_users_file(str(stdlib / "somelib.py"))
        assert digest._is_users_file(str(tmp_path / "mine.py"))  # beside it, outside the base: the user's
    finally:
        monkeypatch.undo()
        digest._installed_dirs.cache_clear()


# ---------------------------------------------------------------- reading a file's imports, finding a module's file


def test_imports_name_each_package_of_a_dotted_import_and_each_name_taken_from_a_module(tmp_path: Path) -> None:
    """``import a.b.c`` imports ``a``, ``a.b`` and ``a.b.c``; ``from m import f, g`` names ``m``, ``m.f`` and
    ``m.g`` (each may be a module); ``from s import *`` names only ``s``."""
    f = tmp_path / "imports_dotted.py"
    f.write_text("import a.b.c\nfrom m import f, g\nfrom s import *\n")
    assert digest._imports(str(f), "") == ["a", "a.b", "a.b.c", "m", "m.f", "m.g", "s"]


def test_relative_imports_are_resolved_against_the_files_package(tmp_path: Path) -> None:
    """In package ``p.q.r``: ``from . import x`` is ``p.q.r`` and ``p.q.r.x``; ``from .. import y`` is ``p.q``
    and ``p.q.y``; ``from ...z import w`` is ``p.z`` and ``p.z.w``."""
    f = tmp_path / "imports_relative.py"
    f.write_text("from . import x\nfrom .. import y\nfrom ...z import w\n")
    assert digest._imports(str(f), "p.q.r") == ["p.q", "p.q.r", "p.q.r.x", "p.q.y", "p.z", "p.z.w"]


def test_locate_finds_only_python_source_files(tag: str, tmp_path: Path) -> None:
    """``_locate`` gives a module's ``.py`` file without importing it; a compiled extension (``.so``) has no
    source to hash and a namespace package (no ``__init__``) has no file at all: None, not a crash."""
    (tmp_path / f"src_{tag}.py").write_text("x = 1\n")
    (tmp_path / f"ext_{tag}.so").write_bytes(b"")
    (tmp_path / f"ns_{tag}").mkdir()
    assert digest._locate(f"src_{tag}") == str(tmp_path / f"src_{tag}.py")
    assert digest._locate(f"ext_{tag}") is None
    assert digest._locate(f"ns_{tag}") is None
    assert f"src_{tag}" not in sys.modules  # found, not imported


@pytest.mark.parametrize("reps", [0, -3])
def test_a_profile_asked_for_no_timed_runs_still_times_one(reps: int) -> None:
    """``profile_model(reps=0)`` (the API; the command refuses it) measures one run: a profile whose times are
    there, as the cost model and ``render`` read them, not a median of nothing."""
    from splitfed.models.zoo import resolve_spec
    from splitfed.profile.profiler import profile_model

    prof = profile_model(resolve_spec("mlp", input_shape=(8,), num_classes=3), 4, reps=reps, use_cache=False)
    assert prof.reps == 1 and len(prof.fwd_s) == len(prof.bwd_s) == prof.n_blocks
    assert sum(prof.fwd_s) + sum(prof.bwd_s) > 0  # measured (how long is not the point)
