"""The import rules between zinfer's packages (docs/architecture.md, "Layout"), read from the source with
``ast``: every ``import``/``from ... import`` of every module, relative ones resolved, those inside
functions and ``if TYPE_CHECKING:`` blocks included.

``ALLOWED`` names, for each top-level package, the other zinfer packages it may import. A package that
pyproject.toml installs but the table does not name fails the test: a new package states its rules here.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the 3.10 fallback, as zinfer's own dependency
    import tomli as tomllib

ALLOWED: dict[str, frozenset[str]] = {
    "client": frozenset(),  # the dependency floor: the wire contract, shared memory, errors, clients
    "modelconfig": frozenset({"client"}),  # config.pbtxt, shared by the broker and the workers
    "broker": frozenset({"client", "modelconfig"}),
    "workers": frozenset({"client", "modelconfig"}),
    "tools": frozenset({"client", "modelconfig"}),
    "frontdoor": frozenset({"client", "modelconfig"}),  # KServe v2 processes, clients of the broker
    "configs": frozenset(),  # data: the bundled models and server configuration
}

# Single modules allowed one more package, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("zinfer.broker.cli", "tools"): "the zinfer command starts its client-side subcommands (lazily)",
    ("zinfer.broker.cli", "frontdoor"): "the zinfer command runs a front-door process (lazily)",
}


def _packages() -> dict[str, Path]:
    """Each top-level zinfer package pyproject.toml installs, and its folder."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dirs: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    return {name.split(".")[1]: ROOT / folder for name, folder in dirs.items() if name.startswith("zinfer.")}


def _module_name(package: str, folder: Path, path: Path) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["zinfer", package, *parts])


def _import_statements(path: Path, module: str) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """``(line, imported module, names taken from it)`` for every import in the file (no names for a plain
    ``import``), relative imports made absolute."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target, tuple(alias.name for alias in node.names)


def _imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import in the file, relative imports made absolute."""
    for line, target, names in _import_statements(path, module):
        yield line, target
        if target == "zinfer":  # ``from zinfer import broker`` names a package
            for name in names:
                yield line, f"zinfer.{name}"


def _violations(package: str, folder: Path, root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        if package == "configs":  # user model code and example data, not zinfer's own modules
            continue
        module = _module_name(package, folder, path)
        for line, target in _imports(path, module):
            parts = target.split(".")
            if parts[0] != "zinfer" or len(parts) < 2:
                continue
            other = parts[1]
            where = f"{path.relative_to(root)}:{line} imports {target}"
            if other not in ALLOWED:
                found.append(f"{where}: package '{other}' is not in ALLOWED (add its rules to the table)")
            elif other != package and other not in ALLOWED[package] and (module, other) not in EXCEPTIONS:
                allowed = sorted(ALLOWED[package]) or "no other package"
                found.append(f"{where}: '{package}' may import only {allowed}")
    return found


def test_every_installed_package_has_rules() -> None:
    unknown = sorted(set(_packages()) - set(ALLOWED))
    assert not unknown, f"add the import rules of {unknown} to ALLOWED in {Path(__file__).name}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_rules_allow(package: str) -> None:
    folder = _packages().get(package)
    if folder is None:
        pytest.skip(f"zinfer.{package} does not exist yet")
    assert _violations(package, folder) == []


def test_the_rules_are_checked(tmp_path: Path) -> None:
    """A broker module importing the workers, or modelconfig importing the broker, is caught."""
    broker = tmp_path / "broker"
    broker.mkdir()
    (broker / "bad.py").write_text("from zinfer.workers.batch import run_batch\n")
    (broker / "sub").mkdir()
    (broker / "sub" / "worse.py").write_text("def f() -> None:\n    from ...workers import batch\n")
    config = tmp_path / "modelconfig"
    config.mkdir()
    typed = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import zinfer.broker\n"
    (config / "bad.py").write_text(typed)
    (config / "odd.py").write_text("from zinfer.nowhere import x\n")
    broker_found = _violations("broker", broker, tmp_path)
    config_found = _violations("modelconfig", config, tmp_path)
    assert [v.split(":")[0] for v in broker_found] == ["broker/bad.py", "broker/sub/worse.py"]
    assert "zinfer.workers" in broker_found[1]
    assert len(config_found) == 2
    assert "zinfer.broker" in config_found[0]
    assert "not in ALLOWED" in config_found[1]


MAX_LINES = 400
REASON = ("on purpose", "about 400 lines")  # the words a long module's docstring states its reason with


def test_no_module_is_over_400_lines_without_a_reason_in_its_docstring() -> None:
    """Each file is one idea (issue 14): a package module over ``MAX_LINES`` says why in its docstring."""
    long = []
    for package, folder in _packages().items():
        if package == "configs":
            continue
        for path in sorted(folder.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines = text.count("\n")
            doc = ast.get_docstring(ast.parse(text, str(path))) or ""
            if lines > MAX_LINES and not any(words in doc for words in REASON):
                long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, "modules over 400 lines without a reason in their docstring:\n" + "\n".join(long)


# Packages whose modules import one another without a circle (issue 36: the worker's circles went). A
# circle counts imports inside functions and ``if TYPE_CHECKING:`` blocks too: moving an import there
# hides a circle from the interpreter, not from the design.
CIRCLE_FREE = ("workers",)


def _module_graph(package: str, folder: Path) -> dict[str, set[str]]:
    """Each module of the package and the modules of the same package it imports (``from . import x``
    names module ``x``; ``from .x import y`` module ``x``, or ``x.y`` where that is a module)."""
    paths = {_module_name(package, folder, path): path for path in sorted(folder.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        edges = graph.setdefault(module, set())
        for _, target, names in _import_statements(path, module):
            found = [f"{target}.{name}" for name in names if f"{target}.{name}" in paths]
            edges.update(found or ([target] if target in paths else []))
        edges.discard(module)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: the strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


@pytest.mark.parametrize("package", CIRCLE_FREE)
def test_no_import_circle_between_a_packages_modules(package: str) -> None:
    graph = _module_graph(package, _packages()[package])
    circles = [" <-> ".join(group) for group in _circles(graph)]
    assert not circles, f"zinfer.{package} has import circles (move the shared piece, or invert one):\n" + (
        "\n".join(circles)
    )


def test_circles_are_found_in_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    """Three modules in a circle through a function-level import and a typing-only one, and a pair through
    ``from . import x``; a module importing its package is no circle."""
    workers = tmp_path / "workers"
    workers.mkdir()
    (workers / "__init__.py").write_text("")
    (workers / "a.py").write_text("from .b import B\n")
    (workers / "b.py").write_text("def f() -> None:\n    from . import c\n")
    typed = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from zinfer.workers.a import A\n"
    (workers / "c.py").write_text(typed)
    (workers / "d.py").write_text("from . import e\nimport zinfer.workers\n")
    (workers / "e.py").write_text("from .d import D\n")
    (workers / "f.py").write_text("from . import a, e\n")
    circles = _circles(_module_graph("workers", workers))
    assert circles == [
        ["zinfer.workers.a", "zinfer.workers.b", "zinfer.workers.c"],
        ["zinfer.workers.d", "zinfer.workers.e"],
    ]
