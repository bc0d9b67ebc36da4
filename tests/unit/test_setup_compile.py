"""setup.py: when a build compiles the hot modules with mypyc, and which modules those are.

The build itself (a compiled wheel, and a pure one where the compiler fails) is in
tests/integration/test_wheel_install.py.
"""

from __future__ import annotations

import ast
import runpy
import sys
from typing import Any

import pytest

from tests.conftest import ROOT
from zinfer.broker.compiled import COMPILED, compiled_here


@pytest.fixture()
def setup_py() -> dict[str, Any]:
    """setup.py's functions, without running setup() (it runs only as __main__)."""
    return runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")


@pytest.mark.parametrize(
    ("env", "argv", "wanted"),
    [
        (None, ["bdist_wheel"], True),  # pip install . / pip wheel .
        (None, ["editable_wheel"], False),  # pip install -e .: the .py files run
        (None, ["egg_info"], False),  # metadata only
        (None, ["dist_info"], False),
        (None, ["build_ext", "--inplace"], False),
        ("0", ["bdist_wheel"], False),
        ("off", ["bdist_wheel"], False),
        ("1", ["editable_wheel"], True),
        ("yes", ["build_ext", "--inplace"], True),
        ("1", ["egg_info"], False),
        ("1", ["sdist"], False),
        ("maybe", ["bdist_wheel"], True),  # not a choice: the default
    ],
)
def test_when_a_build_compiles(
    setup_py: dict[str, Any], monkeypatch: pytest.MonkeyPatch, env: str | None, argv: list[str], wanted: bool
) -> None:
    if env is None:
        monkeypatch.delenv("ZINFER_COMPILE", raising=False)
    else:
        monkeypatch.setenv("ZINFER_COMPILE", env)
    monkeypatch.setattr(sys, "argv", ["setup.py", *argv])
    assert setup_py["_wanted"]() is wanted


def test_the_compiled_modules_are_files_of_the_package(setup_py: dict[str, Any]) -> None:
    """setup.py compiles exactly zinfer.broker.compiled.COMPILED, each a module file of a package folder."""
    assert tuple(setup_py["COMPILED"]) == COMPILED
    assert len(set(COMPILED)) == len(COMPILED)
    for name in COMPILED:
        parts = name.split(".")
        assert parts[0] == "zinfer" and parts[1] in setup_py["PACKAGES"], name
        assert (ROOT.joinpath(*parts[1:]).with_suffix(".py")).is_file(), name


def test_modules_mypyc_cannot_compile_are_left_out() -> None:
    """mypyc has no async generators, and a generic dataclass it compiles fails at import (slots or not):
    none in the list (a generic plain class compiles)."""
    for name in COMPILED:
        text = ROOT.joinpath(*name.split(".")[1:]).with_suffix(".py").read_text()
        tree = ast.parse(text)
        async_generators = [
            f.name
            for f in ast.walk(tree)
            if isinstance(f, ast.AsyncFunctionDef)
            and any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(f))
        ]
        assert not async_generators, f"{name}: async generators {async_generators}"
        generic_dataclasses = [
            c.name
            for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef)
            and any(_names_dataclass(d) for d in c.decorator_list)
            and any(isinstance(b, ast.Subscript) for b in c.bases)
        ]
        assert not generic_dataclasses, f"{name}: generic dataclasses {generic_dataclasses}"


def _names_dataclass(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass"
    )


def test_compiled_here_names_only_extension_modules() -> None:
    """In this checkout's editable install the modules are .py files (unless built in place on purpose)."""
    import importlib.util

    for name in compiled_here():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None and spec.origin.endswith(".so"), name
    pure = set(COMPILED) - set(compiled_here())
    for name in pure:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None and spec.origin.endswith(".py"), name
