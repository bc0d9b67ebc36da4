"""The build's one addition to pyproject.toml: the modules every request passes through, compiled with mypyc.

mypyc (part of mypy) turns type-annotated Python into C extension modules with the same names, so
``zinfer.client.protocol`` imports the compiled module where one was built and the ``.py`` file elsewhere.
On these 2 cores it cut the broker's CPU per request by about a quarter (bench/bench_compiled.py measures it,
bench/results/bench_compiled.json has the figures). The package is ``mypy --strict`` clean, which is what
mypyc needs.

When: a wheel (what ``pip install .`` and ``pip wheel .`` build) is compiled unless ``ZINFER_COMPILE=0``;
an editable install (``pip install -e .``) stays pure Python unless ``ZINFER_COMPILE=1``, so an edited
``.py`` file is what runs. Where the compilation fails (no C compiler, no Python headers), the build says so
once and installs the pure-Python package: every module has its ``.py`` file, compiled or not. The same
builds compile one plain C module, ``zinfer.frontdoor._shmcopy`` (frontdoor/_shmcopy.c, the front door's
copy through mapped system shared memory); without it the front door copies with ``pread``/``pwrite``.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGES = ("client", "modelconfig", "broker", "workers", "tools", "frontdoor")  # zinfer.<name> = <name>/
# the list lives in the package (zinfer.broker.compiled): the broker reads it back to log what runs compiled
COMPILED = runpy.run_path(str(ROOT / "broker" / "compiled.py"))["COMPILED"]
_YES, _NO = ("1", "yes", "true", "on"), ("0", "no", "false", "off")


def _wanted() -> bool:
    choice = os.environ.get("ZINFER_COMPILE", "").strip().lower()
    if choice in _NO or "egg_info" in sys.argv or "dist_info" in sys.argv:
        return False
    if choice in _YES:
        return any(c in sys.argv for c in ("bdist_wheel", "editable_wheel", "build_ext", "build", "develop"))
    return "bdist_wheel" in sys.argv


def _staged() -> Path:
    """The packages in their import shape (build/mypyc-src/zinfer/client -> client/, ...), which mypyc needs
    to name the modules zinfer.*; with a mypy configuration for the compilation."""
    stage = ROOT / "build" / "mypyc-src"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "zinfer").mkdir(parents=True)
    (stage / "zinfer" / "__init__.py").write_text("")
    for pkg in PACKAGES:
        (stage / "zinfer" / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    # third-party packages may be missing from the build's environment: they are Any to the compiler
    (stage / "mypy.ini").write_text(
        f"[mypy]\nmypy_path = {stage}\nexplicit_package_bases = True\nignore_missing_imports = True\n"
        "follow_imports = silent\nwarn_unused_ignores = False\n"
    )
    return stage


def _extensions() -> list[Any]:
    if not _wanted():
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("zinfer: mypy is not installed: building pure Python", file=sys.stderr)
        return []
    # the front door's guarded copy for mapped shared memory (frontdoor/_shmcopy.c): plain C, no mypyc
    helpers = [Extension("zinfer.frontdoor._shmcopy", ["frontdoor/_shmcopy.c"], extra_compile_args=["-O2"])]
    stage = _staged()
    paths = [str(stage / (name.replace(".", "/") + ".py")) for name in COMPILED]
    try:
        exts: list[Any] = mypycify(
            ["--config-file", str(stage / "mypy.ini"), *paths], opt_level="3", group_name="zinfer"
        )
    except (SystemExit, Exception) as e:  # mypy's errors end in SystemExit
        print(f"zinfer: mypyc could not compile ({e!r}): building pure Python", file=sys.stderr)
        return []
    return [*exts, *helpers]


class BuildExt(build_ext):
    """All or nothing: a failed compilation leaves no compiled module behind (a module compiled without the
    shared library the others import would not load), and the build goes on as pure Python."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # the compiler's and the linker's errors alike
            print(f"zinfer: compiling failed ({e}): installing pure Python", file=sys.stderr)
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            self.extensions = []


if __name__ == "__main__":  # what setuptools runs; a test imports the file under another name
    setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
