"""``zinfer.client``'s public names load on first use: importing one submodule (``zinfer.client.dtypes``,
as the workers and the config parser do) does not import the SDK's clients or zmq, and ``from zinfer.client
import Client`` still works. Each check runs in a fresh interpreter, so that no other test's imports count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

_LOADED = """
import json, sys
{code}
print(json.dumps(sorted(m for m in sys.modules if m == "zmq" or m.startswith("zinfer.client"))))
"""


def _loaded(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED.format(code=code)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("module", ["zinfer.client.dtypes", "zinfer.client.errors"])
def test_importing_a_submodule_does_not_import_the_sdk(module: str) -> None:
    loaded = _loaded(f"import {module}")
    assert module in loaded
    assert "zmq" not in loaded and "zinfer.client.client" not in loaded, loaded
    assert "zinfer.client.async_client" not in loaded, loaded


def test_the_public_names_load_on_first_use() -> None:
    loaded = _loaded(
        "from zinfer.client import Client, InferenceServerClient, InvalidArgument, InferInput\n"
        "assert Client is InferenceServerClient and Client.__module__ == 'zinfer.client.client'\n"
        "import zinfer.client\n"
        "assert set(zinfer.client.__all__) <= set(dir(zinfer.client))\n"
        "assert all(getattr(zinfer.client, n) is not None for n in zinfer.client.__all__)\n"
        "try:\n"
        "    zinfer.client.NoSuchName\n"
        "except AttributeError as exc:\n"
        "    assert 'NoSuchName' in str(exc)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    assert {"zmq", "zinfer.client.client", "zinfer.client.async_client"} <= set(loaded), loaded
