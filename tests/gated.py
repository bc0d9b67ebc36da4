"""A model whose batches the test opens and closes: events ordered by conditions, never by sleeps.

``gated_model(repo, name, ...)`` writes an ``add`` model in Python whose ``execute`` records each request's
tag (the integer value of its ``INPUT_A``) in ``gate/log`` and then waits until the test calls
``Gate.release(tag)`` (or ``Gate.release_all()``). So a test knows when a batch started (``started``), can
keep an instance busy for exactly as long as it likes, and can let batches finish in any order it chooses.
"""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.conftest import MODELS, ServerProcess, wait_for
from zinfer.client.base import _ClientBase as ClientBase

GATED_ADD = """
import os
import time

GATE = os.path.join(os.path.dirname(__file__), "gate")


def _released(tag):
    return os.path.exists(os.path.join(GATE, "release-" + tag)) or os.path.exists(os.path.join(GATE, "all"))


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        tags = [str(int(v)) for v in inputs["INPUT_A"].reshape(-1)]
        with open(os.path.join(GATE, "log"), "a") as log:
            log.write("".join(f"started {t}\\n" for t in tags))
        deadline = time.monotonic() + 120  # a test that forgets to release still ends
        while not all(_released(t) for t in tags) and time.monotonic() < deadline:
            time.sleep(0.002)
        with open(os.path.join(GATE, "log"), "a") as log:
            log.write("".join(f"done {t}\\n" for t in tags))
        return {"OUTPUT_SUM": inputs["INPUT_A"] + inputs["INPUT_B"]}
"""


class Gate:
    """The test's side of a gated model's ``gate`` folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def events(self) -> list[str]:
        log = self.folder / "log"
        return log.read_text().splitlines() if log.exists() else []

    def started(self, tag: int) -> bool:
        return f"started {tag}" in self.events()

    def done(self, tag: int) -> bool:
        return f"done {tag}" in self.events()

    def order(self) -> list[int]:
        """Tags in the order their batches started."""
        return [int(e.split()[1]) for e in self.events() if e.startswith("started ")]

    def wait_started(self, tag: int, timeout: float = 30.0) -> None:
        wait_for(lambda: self.started(tag), timeout, f"request {tag} to start executing")

    def release(self, tag: int) -> None:
        (self.folder / f"release-{tag}").touch()

    def release_all(self) -> None:
        (self.folder / "all").touch()

    def reset(self) -> None:
        """Close the gate again and forget the log (between tests sharing one server)."""
        for p in self.folder.iterdir():
            p.unlink()


def gated_model(repo: Path, name: str, config: str = "", max_batch_size: int = 1, count: int = 1) -> Gate:
    """Write the gated ``add`` model ``name`` into ``repo``; ``config`` replaces its ``dynamic_batching``
    block's contents, ``count`` is its instance count."""
    shutil.copytree(MODELS / "add", repo / name)
    path = repo / name / "config.pbtxt"
    cfg = path.read_text()
    start = cfg.index("dynamic_batching")
    end = cfg.index("}", start) + 1
    cfg = cfg[:start] + f"dynamic_batching {{ {config} }}" + cfg[end:]
    cfg = cfg.replace('name: "add"', f'name: "{name}"').replace('backend: "zinfer"', 'backend: "python"')
    cfg = cfg.replace("max_batch_size: 16", f"max_batch_size: {max_batch_size}")
    cfg = cfg.replace("count: 1", f"count: {count}")
    cfg = cfg.replace('parameters { key: "kernel" value: { string_value: "add" } }', "")
    path.write_text(cfg)
    (repo / name / "1" / "model.py").write_text(GATED_ADD)
    gate = repo / name / "1" / "gate"
    gate.mkdir()
    return Gate(gate)


def metric(server: ServerProcess, name: str, model: str) -> float:
    """The value of a model's metric ``name`` on the server's /metrics (summed over its label sets)."""
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'model="{model}"' in line
    )


def pending(server: ServerProcess, model: str) -> int:
    """Requests of ``model`` queued in the broker and not yet sent to an instance."""
    return int(metric(server, "nv_inference_pending_request_count", model))


def address(arr: npt.NDArray[Any]) -> int:
    return int(arr.__array_interface__["data"][0])


def shm_address(client: ClientBase, region: str, offset: int) -> int:
    """The address, in this process, of byte ``offset`` of the client's arena segment named ``region``."""
    assert client._arena is not None, "the client has no arena"
    for seg in client._arena.segments:
        if seg.name == region:
            return address(np.frombuffer(seg.buf, dtype=np.uint8)) + offset
    raise AssertionError("the request names a region that is not one of the client's segments")


def in_arena(client: ClientBase, arr: npt.NDArray[Any]) -> bool:
    """Whether ``arr``'s bytes lie inside one of the client's arena segments (a view, not a copy)."""
    assert client._arena is not None, "the client has no arena"
    start, end = address(arr), address(arr) + arr.nbytes
    for seg in client._arena.segments:
        base = address(np.frombuffer(seg.buf, dtype=np.uint8))
        if base <= start and end <= base + seg.size:
            return True
    return False
