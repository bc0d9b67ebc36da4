"""python_backend's own examples (``examples/*``: the models and their ``client.py``), run unchanged with the
real tritonclient against ``zinfer serve``.

As ``test_triton_qa``: nothing of Triton's is kept here; the models and clients are read at test time from a
local git copy of triton-inference-server/python_backend named by ``PYTHON_BACKEND_GIT`` (its ``.git``
folder, or a bare mirror), laid out as each example's README does, and served on Triton's ports 8000, 8001
and 8002, which the clients use. Without that variable or tritonclient, every test here is skipped. The
examples that need a GPU, torch, JAX or TensorRT (``instance_kind``, ``jax``, ``preprocessing``,
``pytorch``, and ``bls``, which calls the pytorch model) are not run. Run::

    PYTHON_BACKEND_GIT=/path/to/python_backend/.git .venv/bin/python -m pytest \\
        tests/integration/test_triton_examples.py -v
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, start_server, stop_all

pytestmark = pytest.mark.integration
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

GIT_DIR = os.environ.get("PYTHON_BACKEND_GIT", "")

# model name -> (model.py, config.pbtxt or "" for an auto-completed config), as the READMEs copy them
MODELS = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "nobatch_auto_complete": ("auto_complete/nobatch_model.py", ""),
    "batch_auto_complete": ("auto_complete/batch_model.py", ""),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
}
CLIENTS = (
    "add_sub/client.py", "auto_complete/client.py", "bls_decoupled/sync_client.py",
    "bls_decoupled/async_client.py", "custom_metrics/client.py", "decoupled/repeat_client.py",
    "decoupled/square_client.py",
)  # fmt: skip


def _show(path: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", GIT_DIR, "show", f"HEAD:examples/{path}"], check=True, capture_output=True,
        timeout=60,
    ).stdout  # fmt: skip


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    if not GIT_DIR:
        pytest.skip("PYTHON_BACKEND_GIT is not set (a git copy of triton-inference-server/python_backend)")
    try:
        _show("add_sub/client.py")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"PYTHON_BACKEND_GIT={GIT_DIR} is not a git copy of python_backend")
    if not all(_port_free(p) for p in (8000, 8001, 8002)):
        pytest.skip("ports 8000, 8001 and 8002, which the example clients use, are taken")
    root = tmp_path_factory.mktemp("examples")
    repo = root / "models"
    for name, (model, config) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_bytes(_show(model))
        if config:
            (repo / name / "config.pbtxt").write_bytes(_show(config))
    for client in CLIENTS:
        dest = root / "clients" / client
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(_show(client))
    doors = ("--grpc", "127.0.0.1:8001", "--http", "127.0.0.1:8000", "--metrics", "127.0.0.1:8002")
    server = start_server(repo, *doors, ready_timeout=120)
    try:
        yield server, root / "clients"
    finally:
        stop_all([server])


@pytest.mark.parametrize("client", CLIENTS)
def test_python_backend_example(client: str, examples: tuple[ServerProcess, Path]) -> None:
    server, clients = examples
    path = clients / client
    proc = subprocess.run([sys.executable, path.name], cwd=path.parent, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    print(f"example {client}: exit {proc.returncode}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + server.log()[-3000:]
