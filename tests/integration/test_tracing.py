"""Per-request traces on a real ``zinfer serve``: Triton's JSON trace file, rate and count."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for
from zinfer.client import Client
from zinfer.client.errors import InvalidArgument

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)
ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
         "COMPUTE_END", "REQUEST_END"]  # fmt: skip
ENSEMBLE_ORDER = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]


def traces(entries: list[dict[str, Any]], strict: bool = True) -> dict[int, dict[str, Any]]:
    """Triton's documented schema, checked: entries keyed by trace id, merged (the ``timestamps`` of
    several entries of one id joined, as Triton's trace_summary does; ``TENSOR_*`` entries under
    ``tensors``). ``strict``: the broker's timestamps are those of a request that ran, or an ensemble's."""
    assert isinstance(entries, list)
    out: dict[int, dict[str, Any]] = {}
    for e in entries:
        assert isinstance(e["id"], int)
        t = out.setdefault(e["id"], {"timestamps": [], "door": [], "tensors": []})
        if "timestamps" in e:
            door = e["timestamps"][0]["name"].startswith(("HTTP_", "GRPC_"))
            t["door" if door else "timestamps"].extend(e["timestamps"])
        elif "activity" in e:
            assert set(e["tensor"]) >= {"name", "data", "shape", "dtype"}
            t["tensors"].append(e)
        else:
            t.update(e)
    for t in out.values():
        assert isinstance(t["model_name"], str) and isinstance(t["model_version"], int)
        assert isinstance(t["request_id"], str)
        stamps = t["timestamps"]
        assert all(set(s) == {"name", "ns"} and isinstance(s["ns"], int) for s in stamps + t["door"])
        names = [s["name"] for s in stamps]
        if strict:
            assert names == ORDER or names == ENSEMBLE_ORDER  # an ensemble's own request runs no batch
        ns = [s["ns"] for s in stamps]
        assert ns == sorted(ns), stamps
    return out


def test_trace_file_rate_and_count(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    server = server_factory(MODELS, "--trace-config", f"triton,file={path}",
                            "--trace-config", "level=TIMESTAMPS",
                            "--trace-config", "rate=2", "--trace-config", "count=3")  # fmt: skip
    with Client(server.url, timeout=30) as c:
        for i in range(10):
            c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id=f"r{i}")
    assert server.stop(signal.SIGTERM) == 0
    got = traces(json.loads(path.read_text()))
    assert len(got) == 3  # count=3 of the 5 that rate=2 picks
    assert sorted(t["request_id"] for t in got.values()) == ["r1", "r3", "r5"]
    for t in got.values():
        assert t["model_name"] == "add" and t["model_version"] == 1
        own = t["zinfer"]
        assert own["batch_size"] >= 1 and own["batch_requests"] >= 1 and own["worker"]
        assert own["wire_ns_each_way"] >= 0 and own["dispatch_ns"] <= own["result_ns"]
        stamps = {s["name"]: s["ns"] for s in t["timestamps"]}
        # the compute window lies within the broker's send and receive of the batch
        assert own["dispatch_ns"] <= stamps["COMPUTE_START"] <= stamps["COMPUTE_END"] <= own["result_ns"]


def test_log_frequency_writes_as_it_goes(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = tmp_path / "t.json"
    server = server_factory(MODELS, "--trace-config", f"triton,file={path}",
                            "--trace-config", "triton,log-frequency=2",
                            "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1")  # fmt: skip
    with Client(server.url, timeout=30) as c:
        for i in range(4):
            c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id=f"q{i}")
        wait_for(lambda: (tmp_path / "t.json.1").exists(), 20, "the second trace file")
    first = traces(json.loads((tmp_path / "t.json.0").read_text()))
    second = traces(json.loads((tmp_path / "t.json.1").read_text()))
    assert sorted(t["request_id"] for t in first.values()) == ["q0", "q1"]
    assert sorted(t["request_id"] for t in second.values()) == ["q2", "q3"]
    assert not path.exists()


def test_tracing_off_writes_nothing(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    path = tmp_path / "off.json"
    server = server_factory(MODELS, "--trace-config", f"triton,file={path}", "--trace-config", "rate=1")
    with Client(server.url, timeout=30) as c:
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE})
    assert server.stop(signal.SIGTERM) == 0
    assert list(tmp_path.iterdir()) == []  # level defaults to OFF, as in Triton


def test_bad_trace_config_is_refused(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(MODELS, "--trace-config", "rate=0", wait_ready=False)
    wait_for(lambda: server.proc.poll() is not None, 30, "the server to refuse its flags")
    assert server.proc.returncode != 0
    assert "rate: must be at least 1" in server.log()


def test_settings_change_live_through_the_sdk(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = tmp_path / "live.json"
    server = server_factory(MODELS, "--trace-config", f"triton,file={path}", "--trace-config", "rate=1")
    with Client(server.url, timeout=30) as c:
        want = {"trace_file": str(path), "trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1",
                "log_frequency": "0", "trace_mode": "triton"}  # fmt: skip
        assert c.get_trace_settings() == want
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="before")
        for bad in ({"trace_rate": "0"}, {"trace_file": "/etc/x"}, {"no_such": "1"}):
            with pytest.raises(InvalidArgument):
                c.update_trace_settings(settings=bad)
        assert c.get_trace_settings()["trace_level"] == ["OFF"]  # the refused changes changed nothing
        got = c.update_trace_settings("add", {"trace_level": ["TIMESTAMPS"], "trace_count": "2"})
        assert got["trace_level"] == ["TIMESTAMPS"] and got["trace_count"] == "2" and got["trace_rate"] == "1"
        assert c.get_trace_settings()["trace_level"] == ["OFF"]  # the global settings stay
        for i in range(4):
            c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id=f"on{i}")
            c.infer("double", {"A": ONE, "B": ONE}, request_id=f"other{i}")
        assert c.get_trace_settings("add")["trace_count"] == "0"
        assert c.update_trace_settings("add", {})["trace_level"] == ["OFF"]  # back to the global ones
    assert server.stop(signal.SIGTERM) == 0
    got_ids = sorted(t["request_id"] for t in traces(json.loads(path.read_text())).values())
    assert got_ids == ["on0", "on1"]


TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_sdk_trace_context_continues_the_trace(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = tmp_path / "ctx.json"
    server = server_factory(MODELS, "--trace-config", f"triton,file={path}", "--trace-config", "rate=1",
                            "--trace-config", "level=TIMESTAMPS")  # fmt: skip
    with Client(server.url, timeout=30) as c:
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="ctx",
                trace_context=f"00-{TRACE_ID}-{SPAN_ID}-01")  # fmt: skip
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="plain")
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="bad", trace_context="00-nonsense-01")
    assert server.stop(signal.SIGTERM) == 0
    by_rid = {t["request_id"]: t["zinfer"] for t in traces(json.loads(path.read_text())).values()}
    assert by_rid["ctx"]["trace_id"] == TRACE_ID and by_rid["ctx"]["parent_span_id"] == SPAN_ID
    assert "trace_id" not in by_rid["plain"] and "trace_id" not in by_rid["bad"]  # a bad one starts afresh


def test_ensemble_steps_are_children(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    path = tmp_path / "ens.json"
    server = server_factory(MODELS, "--trace-config", f"triton,file={path}", "--trace-config", "rate=1",
                            "--trace-config", "level=TIMESTAMPS")  # fmt: skip
    with Client(server.url, timeout=30) as c:
        out = c.infer("text_pipeline", {"TEXT": np.array([[b"abc"]], dtype=object)}, request_id="ens")
        assert out.as_numpy("RESULT")[0, 0] == b"nop"
    assert server.stop(signal.SIGTERM) == 0
    got = traces(json.loads(path.read_text()))
    (ensemble,) = [t for t in got.values() if t["model_name"] == "text_pipeline"]
    assert "parent_id" not in ensemble
    steps = sorted((t for t in got.values() if t is not ensemble), key=lambda t: t["timestamps"][0]["ns"])
    assert [t["model_name"] for t in steps] == ["tokenizer", "rot13", "detokenizer"]
    assert all(t["parent_id"] == ensemble["id"] and t["request_id"] == "ens" for t in steps)
    window = {s["name"]: s["ns"] for s in ensemble["timestamps"]}
    for t in steps:
        assert window["REQUEST_START"] <= t["timestamps"][0]["ns"] <= t["timestamps"][-1]["ns"]
        assert t["timestamps"][-1]["ns"] <= window["REQUEST_END"]


def test_bls_calls_are_children(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = tmp_path / "models"
    for name in ("bls_router", "identity", "double"):
        shutil.copytree(MODELS / name, repo / name)
    code = repo / "bls_router" / "1" / "model.py"
    text = code.read_text()
    assert text.count("pb_utils.InferenceRequest(") == 2
    traced = text.replace("pb_utils.InferenceRequest(", "pb_utils.InferenceRequest(trace=request.trace(),")
    code.write_text(traced)
    path = tmp_path / "bls.json"
    server = server_factory(repo, "--trace-config", f"triton,file={path}", "--trace-config", "rate=1",
                            "--trace-config", "level=TIMESTAMPS", "--trace-config", "count=1")  # fmt: skip
    with Client(server.url, timeout=30) as c:
        for rid in ("traced", "past-count"):
            out = c.infer("bls_router", {"X": np.ones(2, np.float32)}, request_id=rid)
            assert out.as_numpy("Y").tolist() == [1.0, 1.0]
    assert server.stop(signal.SIGTERM) == 0
    got = traces(json.loads(path.read_text()))
    assert len(got) == 2  # the traced request and its BLS call; nothing of the request past count
    (caller,) = [t for t in got.values() if t["model_name"] == "bls_router"]
    (call,) = [t for t in got.values() if t["model_name"] == "identity"]
    assert caller["request_id"] == "traced" and call["parent_id"] == caller["id"]
    stamps = {s["name"]: s["ns"] for s in caller["timestamps"]}
    call_stamps = {s["name"]: s["ns"] for s in call["timestamps"]}
    # the call ran while the caller's batch was out (broker clock only: the compute window is derived)
    assert caller["zinfer"]["dispatch_ns"] <= call_stamps["REQUEST_START"] <= call_stamps["REQUEST_END"]
    assert call_stamps["REQUEST_END"] <= caller["zinfer"]["result_ns"] <= stamps["REQUEST_END"]
