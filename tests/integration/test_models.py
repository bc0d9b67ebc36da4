"""A repository of models unlike the bundled ones: every data type family, no batching, versions,
several instances, preferred sizes and queue delay, served by one real server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import TRITON_TIMING, ServerProcess, start_server
from zinfer.client.client import Client
from zinfer.client.errors import InvalidArgument, NotFound

pytestmark = pytest.mark.integration


def _model(repo: Path, name: str, body: str, versions: tuple[int, ...] = (1,)) -> Path:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "zinfer"\n{body}\n')
    for v in versions:
        (repo / name / str(v)).mkdir()
    return repo / name


def _identity(dtype: str, dims: str, mbs: int = 4) -> str:
    return (
        f"max_batch_size: {mbs}\n"
        f'input [ {{ name: "IN" data_type: {dtype} dims: {dims} }} ]\n'
        f'output [ {{ name: "OUT" data_type: {dtype} dims: {dims} }} ]\n'
        'parameters { key: "kernel" value: { string_value: "identity" } }'
    )


def _add(dtype: str, dims: str, mbs: int, extra: str = "") -> str:
    a, b = (f'{{ name: "{n}" data_type: {dtype} dims: {dims} }}' for n in ("A", "B"))
    total, diff = (f'{{ name: "{n}" data_type: {dtype} dims: {dims} }}' for n in ("SUM", "DIFF"))
    return (
        f"max_batch_size: {mbs}\n"
        f"input [ {a}, {b} ]\n"
        f"output [ {total}, {diff} ]\n"
        f'parameters {{ key: "kernel" value: {{ string_value: "add" }} }}\n{extra}'
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    _model(repo, "strings", _identity("TYPE_STRING", "[ -1 ]"))
    _model(repo, "flags", _identity("TYPE_BOOL", "[ 2, 2 ]"))
    _model(repo, "halves", _identity("TYPE_BF16", "[ 4 ]"))
    _model(repo, "bytes_raw", _identity("TYPE_UINT8", "[ -1 ]", mbs=0))
    _model(repo, "nobatch", _add("TYPE_INT64", "[ 3 ]", 0))
    _model(repo, "versions", _add("TYPE_FP64", "[ 1 ]", 2, "version_policy { all { } }"), versions=(1, 3))
    _model(
        repo,
        "preferred",
        _add(
            "TYPE_INT32",
            "[ 1 ]",
            8,
            "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }\n"
            + TRITON_TIMING,
        ),
    )
    _model(
        repo,
        "delayed",
        _add(
            "TYPE_INT32",
            "[ 1 ]",
            8,
            "dynamic_batching { max_queue_delay_microseconds: 300000 }\n" + TRITON_TIMING,
        ),
    )
    lin = _model(repo, "half_linear",
                 'max_batch_size: 8\ninput [ { name: "X" data_type: TYPE_FP16 dims: [ 4 ] } ]\n'
                 'output [ { name: "Y" data_type: TYPE_FP16 dims: [ 2 ] } ]\n'
                 'instance_group [ { kind: KIND_CPU count: 2 } ]\n'
                 'parameters [ { key: "kernel" value: { string_value: "linear" } },'
                 ' { key: "activation" value: { string_value: "tanh" } } ]')  # fmt: skip
    np.save(lin / "1" / "W.npy", np.arange(8, dtype=np.float32).reshape(4, 2) / 10)
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, timeout=30) as c:
        yield c


def test_strings_round_trip(client: Client) -> None:
    words = np.array([[b"hello", b"", "wörld".encode()], [b"a", b"bc", b"\x00\xff"]], dtype=object)
    out = client.infer("strings", {"IN": words}).as_numpy("OUT")
    assert out.tolist() == words.tolist()


def test_bool_bf16_and_uint8(client: Client) -> None:
    flags = np.array([[[True, False], [False, True]]] * 3)
    np.testing.assert_array_equal(client.infer("flags", {"IN": flags}).as_numpy("OUT"), flags)
    halves = np.linspace(-2, 2, 8).reshape(2, 4).astype(ml_dtypes.bfloat16)
    out = client.infer("halves", {"IN": halves}).as_numpy("OUT")
    assert out.dtype == halves.dtype and out.tobytes() == halves.tobytes()
    raw = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8)
    np.testing.assert_array_equal(client.infer("bytes_raw", {"IN": raw}).as_numpy("OUT"), raw)


def test_no_batching_model_takes_no_batch_dim(client: Client) -> None:
    a = np.array([1, 2, 3], np.int64)
    res = client.infer("nobatch", {"A": a, "B": 10 * a})
    np.testing.assert_array_equal(res.as_numpy("SUM"), [11, 22, 33])
    np.testing.assert_array_equal(res.as_numpy("DIFF"), [-9, -18, -27])
    with pytest.raises(InvalidArgument, match=r"Expected \[3\], got \[1,3\]"):
        client.infer("nobatch", {"A": a[None], "B": a[None]})


def test_versions(client: Client) -> None:
    a = np.ones((1, 1), np.float64)
    assert client.infer("versions", {"A": a, "B": a}).model_version == 3
    assert client.infer("versions", {"A": a, "B": a}, model_version=1).model_version == 1
    with pytest.raises(NotFound, match="version 2 is not found"):
        client.infer("versions", {"A": a, "B": a}, model_version=2)
    assert client.model_metadata("versions")["versions"] == ["1", "3"]
    assert client.is_model_ready("versions", 1)


def test_fp16_linear_on_two_instances(client: Client, server: ServerProcess) -> None:
    assert sum("--model half_linear" in c for c in server.worker_cmdlines()) == 2
    x = np.arange(12, dtype=np.float16).reshape(3, 4)
    w = np.arange(8, dtype=np.float32).reshape(4, 2) / 10
    y = client.infer("half_linear", {"X": x}).as_numpy("Y")
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float32) @ w), rtol=1e-3, atol=1e-3)


def test_preferred_size_sends_at_once(client: Client, server: ServerProcess) -> None:
    """Four single-row requests with a 5 s delay: they leave together the moment the fourth arrives."""
    results: list[float] = []
    barrier = threading.Barrier(4)

    def one(i: int) -> None:
        with Client(server.url, timeout=30) as c:
            barrier.wait(10)
            a = np.full((1, 1), i, np.int32)
            results.append(float(c.infer("preferred", {"A": a, "B": a}).as_numpy("SUM")[0, 0]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [0, 2, 4, 6]
    stats = client.statistics("preferred")["model_stats"][0]
    assert stats["batch_stats"] == [{"batch_size": 4, "count": 1}]
    assert stats["batch_reasons"] == {"preferred": 1}  # it left at size 4, not when the delay ran out


def test_lone_request_waits_for_the_delay(client: Client) -> None:
    a = np.ones((2, 1), np.int32)
    client.infer("delayed", {"A": a, "B": a})
    stats = client.statistics("delayed")["model_stats"][0]
    assert stats["batch_reasons"] == {"delay_expired": 1}  # it waited for the delay, not less
    assert stats["batch_stats"] == [{"batch_size": 2, "count": 1}]
