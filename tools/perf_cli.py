"""``zinfer perf``: a load generator in the spirit of Triton's perf_analyzer.

::

    zinfer perf -m add --concurrency-range 1:16:4 --measurement-interval 5 --csv add.csv
    zinfer perf -m linear --request-rate-range 500:2000:500 --request-distribution poisson --async

Each step (a concurrency, or a request rate) runs for ``--measurement-interval`` seconds or
``--max-requests`` requests, whichever comes first, while a progress line per second goes to stderr. Then
one table row: throughput, client latency percentiles, and the server's own split (queue and compute time
per request, mean batch size) from its statistics before and after the step. Inputs are made from the
model's metadata (``--shape NAME:d1,d2`` fixes variable dims, batch dim excluded) or read from an ``.npz``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zinfer.client import AsyncClient, Client
from zinfer.client import dtypes as wire_types
from zinfer.client.errors import ZinferError

from .perf_load import Step, Tally, run_async, run_sync
from .perf_report import (
    StepResult,
    header,
    load_pyplot,
    plot,
    print_errors,
    row,
    summarize,
    write_csv,
    write_json,
)

__all__ = ["main"]

_Arrays = dict[str, npt.NDArray[Any]]


def _range(text: str, kind: type[int] | type[float]) -> list[Any]:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected START[:END[:STEP]], got {text!r}")
    try:
        start = kind(parts[0])
        end = kind(parts[1]) if len(parts) > 1 else start
        step = kind(parts[2]) if len(parts) > 2 else kind(1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers in START[:END[:STEP]], got {text!r}") from None
    if start <= 0 or end < start or step <= 0 or (end - start) / step > 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < START <= END, STEP > 0, at most 1000 steps")
    count = int((end - start) / step + 1e-9) + 1
    return [kind(start + i * step) for i in range(count)]


def _shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition(":")
    try:
        values = [int(d) for d in dims.split(",")] if dims else []
    except ValueError:
        values = [-1]
    if not sep or not name or any(d < 0 for d in values):
        raise argparse.ArgumentTypeError(f"expected NAME:d1,d2,... with dims >= 0, got {text!r}")
    return name, values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zinfer perf", description="Measure a model's throughput and latency.")
    p.add_argument("-m", "--model-name", dest="model", required=True, help="the model to measure")
    p.add_argument("-x", "--model-version", type=int, default=0, help="version (default: the server's)")
    p.add_argument("-u", "--url", default=None, help="the server (default: the default runtime directory)")
    p.add_argument("-b", "--batch-size", type=int, default=1, help="rows per request (batching models)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--concurrency-range",
        type=lambda t: _range(t, int),
        default=None,
        metavar="START:END:STEP",
        help="requests kept in flight (default: 1)",
    )
    mode.add_argument(
        "--request-rate-range",
        type=lambda t: _range(t, float),
        default=None,
        metavar="START:END:STEP",
        help="requests sent a second, whatever the answers do",
    )
    p.add_argument(
        "--request-distribution",
        choices=("constant", "poisson"),
        default="constant",
        help="request-rate mode: evenly spaced or Poisson arrivals",
    )
    p.add_argument(
        "--measurement-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long each step runs (default 5)",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=0,
        metavar="N",
        help="end a step after N requests, even before the interval ends",
    )
    p.add_argument(
        "--input-data",
        default="random",
        metavar="random|zero|FILE.npz",
        help="input values: random, zeros, or arrays by input name from an .npz file",
    )
    p.add_argument(
        "--shape",
        type=_shape,
        action="append",
        default=[],
        metavar="NAME:d1,d2",
        help="dims of a variable-shape input, batch dim excluded (repeatable)",
    )
    p.add_argument(
        "--async",
        dest="use_async",
        action="store_true",
        help="one AsyncClient and tasks, instead of threads sharing a Client",
    )
    shm = p.add_mutually_exclusive_group()
    shm.add_argument(
        "--shm",
        dest="shm",
        action="store_true",
        default=None,
        help="every tensor through shared memory (inputs placed once, zero-copy)",
    )
    shm.add_argument("--no-shm", dest="shm", action="store_false", help="every tensor inline in the messages")
    p.add_argument(
        "--max-threads", type=int, default=64, help="threads for request-rate mode without --async"
    )
    p.add_argument("--client-timeout", type=float, default=30.0, metavar="SECONDS", help="per request")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE", help="write the steps as CSV")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the run as JSON")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="draw throughput against p99 latency (needs matplotlib: zinfer[plot])",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs and Poisson arrivals")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _steps(args: argparse.Namespace) -> list[Step]:
    common = {"interval_s": args.measurement_interval, "max_requests": args.max_requests}
    if args.request_rate_range is not None:
        return [
            Step(rate=r, distribution=args.request_distribution, **common) for r in args.request_rate_range
        ]
    return [Step(concurrency=c, **common) for c in (args.concurrency_range or [1])]


# ---------------------------------------------------------------------------------------------- inputs


def build_inputs(meta: Mapping[str, Any], args: argparse.Namespace) -> _Arrays:
    """One request's input arrays, from the model's metadata and the options."""
    batching = int(meta.get("max_batch_size", 0)) > 0
    overrides = dict(args.shape)
    unknown = set(overrides) - {i["name"] for i in meta.get("inputs", [])}
    if unknown:
        raise ValueError(f"--shape names no input of the model: {', '.join(sorted(unknown))}")
    given: Mapping[str, Any] = {}
    if args.input_data not in ("random", "zero"):
        with np.load(args.input_data, allow_pickle=False) as npz:
            given = {k: npz[k] for k in npz.files}
    rng = np.random.default_rng(args.seed)
    out: _Arrays = {}
    for spec in meta.get("inputs", []):
        name, datatype = spec["name"], spec["datatype"]
        dims = list(spec["shape"])[1:] if batching else list(spec["shape"])
        dims = overrides.get(name, dims)
        shape = ([args.batch_size] if batching else []) + dims
        if name in given:
            out[name] = _from_file(name, given[name], shape, datatype, batching, args.batch_size)
            continue
        if any(d < 0 for d in shape):
            raise ValueError(f"input {name} has variable dims {spec['shape']}: give --shape {name}:d1,d2")
        out[name] = _make(rng, shape, datatype, args.input_data == "zero")
    return out


def _from_file(
    name: str, arr: npt.NDArray[Any], shape: list[int], datatype: str, batching: bool, batch: int
) -> npt.NDArray[Any]:
    if batching and arr.ndim == len(shape) - 1:  # one row: repeat it for the batch
        arr = np.repeat(arr[None, ...], batch, axis=0)
    if datatype != wire_types.BYTES:
        want = wire_types.wire_to_numpy(datatype)
        if not np.can_cast(arr.dtype, want, "same_kind"):
            raise ValueError(f"input {name}: {arr.dtype} in the file, the model wants {datatype}")
        arr = arr.astype(want, copy=False)
    return arr


def _make(rng: np.random.Generator, shape: list[int], datatype: str, zero: bool) -> npt.NDArray[Any]:
    count = int(np.prod(shape)) if shape else 1
    if datatype == wire_types.BYTES:
        words = [b"0" if zero else str(int(v)).encode() for v in rng.integers(0, 10**6, count)]
        return np.array(words, dtype=object).reshape(shape)
    dt = wire_types.wire_to_numpy(datatype)
    if zero:
        return np.zeros(shape, dt)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    return rng.integers(0, 64, shape).astype(dt)


def _client_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {"timeout": args.client_timeout, "shm": args.shm}
    if args.shm:
        opts["inline_threshold"] = -1
    return opts


def _into_shm(inputs: _Arrays, empty: Callable[..., npt.NDArray[Any]]) -> _Arrays:
    """With ``--shm``: the inputs placed once in the client's shared memory, sent without a copy."""
    placed: _Arrays = {}
    for name, arr in inputs.items():
        if arr.dtype.kind in "OSU":
            placed[name] = arr
        else:
            placed[name] = empty(arr.shape, arr.dtype)
            placed[name][...] = arr
    return placed


# ---------------------------------------------------------------------------------------------- running


class _Progress:
    """A line per second on stderr while a step runs."""

    def __init__(self, label: str, tally: Tally, quiet: bool) -> None:
        self._label, self._tally, self._quiet = label, tally, quiet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Progress:
        if not self._quiet:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            t = self._tally
            elapsed = time.perf_counter() - t.started
            lat = t.latencies_s[-2000:]
            p50 = f"{np.percentile(lat, 50) * 1e6:.0f} us" if lat else "-"
            print(
                f"[{self._label}] {elapsed:5.1f} s  {t.done} done  {t.done / elapsed:.0f}/s  "
                f"p50 {p50}  errors {t.error_count}",
                file=sys.stderr,
                flush=True,
            )


def _report(args: argparse.Namespace, step: Step, tally: Tally, before: Any, after: Any) -> StepResult:
    result = summarize(step, tally, before, after, args.model, args.batch_size)
    print(row(result), flush=True)
    print_errors(tally)
    return result


def _run_sync(args: argparse.Namespace, steps: list[Step]) -> tuple[str, list[StepResult]]:
    results: list[StepResult] = []
    with Client(args.url, **_client_options(args)) as client:
        inputs = build_inputs(client.model_metadata(args.model, args.model_version), args)
        if args.shm:
            inputs = _into_shm(inputs, client.empty)

        def call() -> object:
            return client.infer(args.model, inputs, model_version=args.model_version)

        call()  # warm-up: model info cached, shared memory registered
        print(header(), flush=True)
        for step in steps:
            tally = Tally()
            before = client.statistics(args.model)
            with _Progress(step.label, tally, args.quiet):
                run_sync(call, step, tally, args.max_threads)
            results.append(_report(args, step, tally, before, client.statistics(args.model)))
        return client.url, results


async def _run_async(args: argparse.Namespace, steps: list[Step]) -> tuple[str, list[StepResult]]:
    results: list[StepResult] = []
    async with AsyncClient(args.url, **_client_options(args)) as client:
        inputs = build_inputs(await client.model_metadata(args.model, args.model_version), args)
        if args.shm:
            inputs = _into_shm(inputs, client.empty)

        async def call() -> object:
            return await client.infer(args.model, inputs, model_version=args.model_version)

        await call()
        print(header(), flush=True)
        for step in steps:
            tally = Tally()
            before = await client.statistics(args.model)
            with _Progress(step.label, tally, args.quiet):
                await run_async(call, step, tally)
            results.append(_report(args, step, tally, before, await client.statistics(args.model)))
        return client.url, results


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.batch_size < 1 or args.measurement_interval <= 0 or args.max_requests < 0:
        parser.error("--batch-size must be >= 1, --measurement-interval > 0, --max-requests >= 0")
    pyplot = None
    if args.plot is not None:
        try:
            pyplot = load_pyplot()
        except ImportError as exc:
            print(f"zinfer perf: {exc}", file=sys.stderr)
            return 2
    steps = _steps(args)
    try:
        url, results = asyncio.run(_run_async(args, steps)) if args.use_async else _run_sync(args, steps)
    except (ZinferError, ValueError, OSError) as exc:
        print(f"zinfer perf: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    run = {
        "model": args.model,
        "model_version": args.model_version,
        "url": url,
        "batch_size": args.batch_size,
        "async": args.use_async,
        "shm": args.shm,
        "measurement_interval_s": args.measurement_interval,
        "max_requests": args.max_requests,
        "request_distribution": args.request_distribution if args.request_rate_range else None,
    }
    if args.csv is not None:
        write_csv(args.csv, results)
    if args.json is not None:
        write_json(args.json, run, results)
    if pyplot is not None and args.plot is not None:
        plot(pyplot, args.plot, results, f"zinfer perf: {args.model}")
    return 0 if any(r.requests for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
