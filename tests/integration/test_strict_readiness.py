"""Issue 13, item 8: Triton's strict readiness. The server is live but not ready while a model that should be
loaded has failed; a model never asked for (explicit model control) or unloaded on request does not count."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import MODELS, ServerProcess, wait_for
from zinfer.client import Client
from zinfer.client.errors import Unavailable

pytestmark = pytest.mark.integration

RAISES_IN_INITIALIZE = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights here")

    def execute(self, requests):
        return []
"""


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _repo(root: Path, *broken: str) -> Path:
    repo = root / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    if "config" in broken:
        (repo / "badconfig" / "1").mkdir(parents=True)
        (repo / "badconfig" / "config.pbtxt").write_text('name: "badconfig"\nmax_batch_size: [ oops\n')
    if "initialize" in broken:
        shutil.copytree(MODELS / "add_sub_triton", repo / "noinit")
        cfg = (repo / "noinit" / "config.pbtxt").read_text().replace('"add_sub_triton"', '"noinit"')
        (repo / "noinit" / "config.pbtxt").write_text(cfg)
        (repo / "noinit" / "1" / "model.py").write_text(RAISES_IN_INITIALIZE)
    return repo


def _ready(server: ServerProcess, client: Client) -> tuple[bool, bool, int]:
    return (
        client.is_server_live(),
        client.is_server_ready(),
        _status(server.http_url + "/v2/health/ready"),
    )


@pytest.mark.parametrize("broken", ["config", "initialize"])
def test_server_with_a_failed_model_is_live_but_not_ready(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, broken: str
) -> None:
    server = server_factory(_repo(tmp_path, broken))
    with Client(server.url, timeout=30) as client:
        assert client.is_model_ready("add")  # the good model serves
        assert client.is_server_live()
        assert not client.is_server_ready()
        assert _status(server.http_url + "/v2/health/live") == 200
        # the HTTP snapshot is published periodically: it must settle on 503 and stay there
        wait_for(lambda: _status(server.http_url + "/v2/health/ready") == 503, 10, "HTTP readiness")
        assert _ready(server, client) == (True, False, 503)


def test_server_with_good_models_only_is_ready(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory(_repo(tmp_path))
    with Client(server.url, timeout=30) as client:
        assert client.is_server_ready()
        wait_for(lambda: _status(server.http_url + "/v2/health/ready") == 200, 10, "HTTP readiness")


def test_explicit_mode_counts_only_the_models_asked_for(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    repo = _repo(tmp_path, "initialize")
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "add")
    with Client(server.url, timeout=30) as client:
        assert client.is_server_ready()  # noinit is in the repository but was not asked for
        with pytest.raises(Unavailable, match="no weights here"):
            client.load_model("noinit")
        assert not client.is_server_ready()  # asked for, and failed
        wait_for(lambda: _status(server.http_url + "/v2/health/ready") == 503, 10, "HTTP readiness to drop")
        client.unload_model("noinit")  # no longer wanted
        assert client.is_server_ready()
        wait_for(lambda: _status(server.http_url + "/v2/health/ready") == 200, 10, "HTTP readiness back")
