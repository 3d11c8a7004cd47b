"""The package build's own steps (``[tool.setuptools] cmdclass`` in pyproject.toml), used only by pip/setuptools.

The gRPC code is build output, never committed: an editable install (``make install``) generates it into the
source tree when :mod:`splitfed.transport` is first imported, but an installed wheel has no ``proto/`` to
generate from and a site-packages folder is often not writable. So a wheel carries the code generated from
``proto/`` when it was built, and an sdist carries ``proto/`` so that the wheel built from it can.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist


def codegen() -> ModuleType:
    """The generator of the tree being built (its ``PROTO_ROOT`` is that tree's ``proto/``). setuptools runs a
    build in that tree; this module may be another tree's (an editable install's, when the build is not
    isolated). Loaded from its file: importing :mod:`splitfed.transport` would generate into the source tree."""
    spec = importlib.util.spec_from_file_location("_splitfed_build_codegen",
                                                  Path.cwd() / "splitfed" / "transport" / "_codegen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    """Also writes the code generated from ``proto/`` into the build (refused, naming the folder, without it)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # the source tree is the package: generated there at import
            return
        codegen().generate(out=Path(self.build_lib) / "splitfed" / "transport" / "proto", force=True)


class Sdist(sdist):
    """Also carries the ``.proto`` sources (``proto/`` is outside every package, and setuptools lists an
    sdist's files with its own defaults, not a subclass's)."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        gen = codegen()
        for source in gen.proto_files():
            copy = Path(base_dir) / "proto" / source.relative_to(gen.PROTO_ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
