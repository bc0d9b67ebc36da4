"""Explicit model control over a real server: load, unload, reload under load, failed reloads, versions."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for
from zinfer.client.client import Client
from zinfer.client.errors import NotFound, Unavailable, Unsupported

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    for name in ("add", "identity"):
        shutil.copytree(MODELS / name, repo / name)
    return repo


def _states(client: Client) -> dict[str, tuple[str, str]]:
    return {r["name"]: (r["state"], r["reason"]) for r in client.repository_index()}


def test_explicit_mode_loads_only_what_it_is_told(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    repo = _repo(tmp_path)
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "add")
    with Client(server.url, timeout=60) as client:
        assert client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2
        assert _states(client)["identity"] == ("UNAVAILABLE", "unloaded")
        with pytest.raises(Unavailable, match="not loaded"):
            client.infer("identity", {"INPUT0": ONE})
        client.load_model("identity")
        assert client.is_model_ready("identity")
        np.testing.assert_array_equal(client.infer("identity", {"INPUT0": ONE}).as_numpy("OUTPUT0"), ONE)
        client.unload_model("identity")
        assert not client.is_model_ready("identity")
        with pytest.raises(Unavailable, match="not loaded"):
            client.infer("identity", {"INPUT0": ONE})
        wait_for(lambda: not any("--model identity" in c for c in server.worker_cmdlines()), 20,
                 "the unloaded model's worker to stop")  # fmt: skip
        with pytest.raises(NotFound):
            client.load_model("no_such_model")
        with pytest.raises(NotFound):
            client.unload_model("identity")


def test_reload_under_load_fails_no_request(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    repo = _repo(tmp_path)
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "*")
    errors: list[str] = []
    done = threading.Event()
    counts = [0] * 4

    def hammer(i: int) -> None:
        with Client(server.url, timeout=60) as c:
            while not done.is_set() and counts[i] < 20_000:
                try:
                    out = c.infer("add", {"INPUT_A": ONE * i, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")
                    if out[0, 0] != i + 1:
                        errors.append(f"wrong sum {out}")
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                counts[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        with Client(server.url, timeout=120) as client:
            wait_for(lambda: sum(counts) > 200, 30, "load to start")
            cfg = repo / "add" / "config.pbtxt"
            cfg.write_text(cfg.read_text().replace("max_batch_size: 16", "max_batch_size: 8"))
            client.load_model("add")  # returns once the new instance is ready
            assert client.model_config("add")["max_batch_size"] == 8
            before = sum(counts)
            wait_for(lambda: sum(counts) > before + 200, 30, "requests on the new version")
            client.load_model("add")  # and once more, unchanged
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:5]
    assert sum(counts) > 400


def test_failed_reload_keeps_the_old_model(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    repo = _repo(tmp_path)
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "add")
    cfg = repo / "add" / "config.pbtxt"
    good = cfg.read_text()
    with Client(server.url, timeout=60) as client:
        cfg.write_text(good + "\nbogus_field: 3\n")
        with pytest.raises(Unavailable, match="bogus_field"):
            client.load_model("add")
        assert client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2
        state, reason = _states(client)["add"]
        assert state == "READY" and "bogus_field" in reason
        # a config that parses but whose worker cannot load: the new instance fails, the old one serves
        cfg.write_text(good.replace('string_value: "add"', 'string_value: "nonexistent"'))
        with pytest.raises(Unavailable, match="parameter 'kernel'"):
            client.load_model("add")
        assert client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2
        cfg.write_text(good)
        client.load_model("add")
        assert _states(client)["add"] == ("READY", "")


def test_version_switch(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "add")
    with Client(server.url, timeout=60) as client:
        assert client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).model_version == 1
        (repo / "add" / "2").mkdir()
        client.load_model("add")  # version_policy latest{1}: version 2 replaces version 1
        assert client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).model_version == 2
        assert client.model_metadata("add")["versions"] == ["2"]
        with pytest.raises(NotFound, match="version 1 is not found"):
            client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, model_version=1)


def test_model_control_is_off_by_default(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory(_repo(tmp_path))
    with Client(server.url, timeout=30) as client:
        with pytest.raises(Unsupported, match="--model-control-mode explicit"):
            client.load_model("add")
        with pytest.raises(Unsupported):
            client.unload_model("add")


def test_cli_lists_loads_and_unloads(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = server_factory(_repo(tmp_path), "--model-control-mode", "explicit")

    def zinfer(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "zinfer.broker", *args, "--url", server.url],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    listed = zinfer("models")
    assert listed.returncode == 0 and "identity" in listed.stdout and "unloaded" in listed.stdout
    assert zinfer("load", "identity").returncode == 0
    assert "READY" in zinfer("models").stdout
    assert zinfer("unload", "identity").returncode == 0
    missing = zinfer("load", "nope")
    assert missing.returncode == 1 and "NotFound" in missing.stderr
