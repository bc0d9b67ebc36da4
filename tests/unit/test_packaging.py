"""Every Python package folder of the distribution is listed in pyproject.toml, so a wheel carries it."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_wheel() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    dirs = setup["package-dir"]
    found = set()
    for top, folder in dirs.items():
        if top == "zinfer.configs":
            continue  # data only
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([top, *rel.parts]))
    assert found - listed == set(), f"package folders missing from pyproject.toml: {found - listed}"
