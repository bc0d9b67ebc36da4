"""A runtime directory put inside the model repository (``--runtime-dir <repo>/rt``) is the server's own
folder of sockets and lock, not a model: it is neither loaded nor listed in the repository index."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from tests.conftest import MODELS, start_server, stop_all
from zinfer.client import Client


def test_a_runtime_dir_inside_the_repository_is_no_model(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    server = start_server(repo, runtime_dir=repo)  # the server runs on repo/rt
    try:
        assert server.runtime_dir.parent == repo
        with Client(server.url, timeout=30) as c:
            names = {row["name"] for row in c.repository_index()}
            assert names == {"add"}
            one = np.ones((1, 1), np.float32)
            out = c.infer("add", {"INPUT_A": one, "INPUT_B": one})
            assert out.as_numpy("OUTPUT_SUM").tolist() == [[2.0]]
        assert "model=rt" not in server.log()
    finally:
        stop_all([server])
