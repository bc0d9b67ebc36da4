"""The client-side tools (``zinfer.tools``) load only when their subcommand runs: ``zinfer serve`` never
imports them. Each check runs in a fresh interpreter, so that no other test's imports count."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

_SERVE = """
import importlib, json, pkgutil, sys
import zinfer.broker
from zinfer.broker import cli
for info in pkgutil.iter_modules(zinfer.broker.__path__):  # every broker module, the server loop included
    if info.name != "__main__":
        importlib.import_module("zinfer.broker." + info.name)
cli._parser().format_help()
args = cli.parse_args(["serve", "--model-repository", "repo"])
assert args.command == "serve", args
print(json.dumps(sorted(m for m in sys.modules if m.startswith("zinfer.tools"))))
"""

_SUBCOMMAND = """
import json, sys
from zinfer.broker import cli
try:
    cli.main([{command!r}, "--help"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
print(json.dumps(sorted(m for m in sys.modules if m.startswith("zinfer.tools."))))
"""


def _loaded(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_serve_and_the_whole_broker_never_import_the_tools() -> None:
    assert _loaded(_SERVE) == []


def test_each_subcommand_imports_only_its_own_tool() -> None:
    assert _loaded(_SUBCOMMAND.format(command="status")) == ["zinfer.tools.status_view"]
    assert _loaded(_SUBCOMMAND.format(command="perf")) == [
        "zinfer.tools.perf_cli",
        "zinfer.tools.perf_load",
        "zinfer.tools.perf_report",
    ]
    tune = _loaded(_SUBCOMMAND.format(command="tune"))
    assert "zinfer.tools.tune_cli" in tune and "zinfer.tools.status_view" not in tune
