"""``zinfer perf`` without a server: ranges, shapes, inputs from metadata, arrivals, server figures."""

from __future__ import annotations

import argparse
import asyncio
import itertools
from pathlib import Path

import numpy as np
import pytest

from zinfer.tools.perf_cli import _parser, _range, _shape, _steps, build_inputs
from zinfer.tools.perf_load import Step, Tally, run_async, run_sync, send_times
from zinfer.tools.perf_report import header, row, server_figures, summarize

META = {
    "name": "m",
    "max_batch_size": 8,
    "inputs": [
        {"name": "X", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "V", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "T", "datatype": "BYTES", "shape": [-1, 1]},
    ],
}


def _args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["-m", "m", *argv])


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("4", int, [4]),
        ("1:3", int, [1, 2, 3]),
        ("1:16:5", int, [1, 6, 11, 16]),
        ("100:300:100", float, [100.0, 200.0, 300.0]),
    ],
)
def test_ranges(text: str, kind: type, expected: list[float]) -> None:
    assert _range(text, kind) == expected


@pytest.mark.parametrize("text", ["0", "4:2", "1:2:0", "a:b", "1::2", "1:2:3:4", "1:100000:1"])
def test_bad_ranges(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _range(text, int)


def test_shapes() -> None:
    assert _shape("INPUT0:2,3") == ("INPUT0", [2, 3])
    assert _shape("ns:x:5") == ("ns:x", [5])
    for bad in ("INPUT0", "INPUT0:-1", ":3", "X:a"):
        with pytest.raises(argparse.ArgumentTypeError):
            _shape(bad)


def test_steps_from_options() -> None:
    assert [s.concurrency for s in _steps(_args())] == [1]
    steps = _steps(
        _args("--request-rate-range", "10:30:10", "--request-distribution", "poisson", "--max-requests", "5")
    )
    assert [(s.rate, s.distribution, s.max_requests) for s in steps] == [
        (10.0, "poisson", 5),
        (20.0, "poisson", 5),
        (30.0, "poisson", 5),
    ]
    with pytest.raises(SystemExit):
        _args("--concurrency-range", "1", "--request-rate-range", "5")


def test_inputs_from_metadata_and_overrides() -> None:
    with pytest.raises(ValueError, match="--shape V:"):
        build_inputs(META, _args())
    arrays = build_inputs(META, _args("--shape", "V:3", "-b", "2"))
    assert arrays["X"].shape == (2, 4) and arrays["X"].dtype == np.float32
    assert arrays["V"].shape == (2, 3) and arrays["V"].dtype == np.int64
    assert arrays["T"].shape == (2, 1) and isinstance(arrays["T"][0, 0], bytes)
    zeros = build_inputs(META, _args("--shape", "V:3", "--input-data", "zero"))
    assert not zeros["X"].any() and not zeros["V"].any()
    with pytest.raises(ValueError, match="names no input"):
        build_inputs(META, _args("--shape", "W:3"))


def test_inputs_from_an_npz_file(tmp_path: Path) -> None:
    path = tmp_path / "in.npz"
    np.savez(path, X=np.arange(4, dtype=np.float64), V=np.ones((2, 5), np.int32))
    arrays = build_inputs(META, _args("--input-data", str(path), "-b", "3"))
    assert arrays["X"].shape == (3, 4) and arrays["X"].dtype == np.float32  # one row repeated, cast
    assert arrays["V"].shape == (2, 5) and arrays["V"].dtype == np.int64  # used as given
    np.savez(path, X=np.ones(4, np.complex64))
    with pytest.raises(ValueError, match="complex64"):
        build_inputs(META, _args("--input-data", str(path), "--shape", "V:1"))


def test_send_times() -> None:
    even = list(itertools.islice(send_times(100.0, "constant"), 5))
    assert even == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])
    gaps = np.diff(list(itertools.islice(send_times(100.0, "poisson", seed=1), 5001)))
    assert gaps.mean() == pytest.approx(0.01, rel=0.1) and gaps.std() > 0.005


def test_steps_stop_at_max_requests_sync_and_async() -> None:
    tally = Tally()
    run_sync(lambda: None, Step(concurrency=4, interval_s=10, max_requests=50), tally)
    assert len(tally.latencies_s) == 50 and tally.error_count == 0

    def boom() -> None:
        raise RuntimeError("no")

    tally = Tally()
    run_sync(boom, Step(rate=1000, interval_s=0.05), tally)
    assert 1 <= tally.error_count <= 50 and tally.errors.keys() == {"RuntimeError: no"}

    async def nothing() -> None:
        await asyncio.sleep(0)

    tally = Tally()
    asyncio.run(run_async(nothing, Step(concurrency=8, interval_s=10, max_requests=40), tally))
    assert len(tally.latencies_s) == 40
    tally = Tally()
    asyncio.run(run_async(nothing, Step(rate=500, distribution="poisson", interval_s=0.1), tally))
    assert 1 <= len(tally.latencies_s) <= 120


def _stats(success: int, executions: int, rows: int, queue_ns: int) -> dict[str, object]:
    phases = {
        "success": (success, 0),
        "queue": (success, queue_ns),
        "compute_infer": (success, 1000 * success),
    }
    return {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "inference_count": rows,
                "execution_count": executions,
                "inference_stats": {k: {"count": c, "ns": ns} for k, (c, ns) in phases.items()},
            },
            {"name": "other", "version": "1", "inference_count": 99, "execution_count": 1},
        ]
    }


def test_server_figures_and_summary() -> None:
    before, after = _stats(10, 10, 10, 10_000), _stats(110, 35, 210, 510_000)
    fig = server_figures(before, after, "m")
    assert (
        fig["requests"] == 100
        and fig["queue"] == pytest.approx(5.0)
        and fig["compute_infer"] == pytest.approx(1.0)
    )
    assert fig["mean_batch"] == pytest.approx(200 / 25)
    assert server_figures(before, before, "m")["mean_batch"] == 0.0
    tally = Tally(latencies_s=[0.001] * 99 + [0.002], started=1.0, finished=3.0)
    r = summarize(Step(concurrency=2), tally, before, after, "m", batch=2)
    assert (r.requests, r.errors, r.throughput_infer_s, r.p50_us, r.server_requests) == (
        100,
        0,
        100.0,
        1000.0,
        100,
    )
    assert r.p99_us > r.p50_us and r.mean_batch == 8.0
    assert len(row(r)) == len(header())
