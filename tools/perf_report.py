"""Figures and output for ``zinfer perf``: one ``StepResult`` per step, as a table, CSV, JSON and a plot.

Client figures come from the step's own latencies; server figures from the difference of two
``statistics`` calls around the step (Triton's cumulative counters): mean queue time and compute time
per request, and the mean batch size (rows per execution).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .perf_load import Step, Tally

PLOT_HINT = "--plot needs matplotlib: pip install 'zinfer[plot]' (or pip install matplotlib)"


@dataclass(frozen=True)
class StepResult:
    mode: str  # "concurrency" or "request_rate"
    concurrency: int | None
    request_rate: float | None
    requests: int  # answered without error
    errors: int
    duration_s: float
    throughput_infer_s: float  # rows (requests x batch size) per second
    avg_us: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    server_requests: int
    server_queue_us: float
    server_compute_input_us: float
    server_compute_infer_us: float
    server_compute_output_us: float
    mean_batch: float

    @property
    def server_compute_us(self) -> float:
        return self.server_compute_input_us + self.server_compute_infer_us + self.server_compute_output_us


FIELDS = [f.name for f in dataclasses.fields(StepResult)]


def summarize(
    step: Step, tally: Tally, before: Mapping[str, Any], after: Mapping[str, Any], model: str, batch: int
) -> StepResult:
    lat = np.asarray(tally.latencies_s, dtype=np.float64) * 1e6
    duration = max((tally.finished or tally.started) - tally.started, 1e-9)
    pct = np.percentile(lat, [50, 90, 95, 99]) if len(lat) else np.zeros(4)
    server = server_figures(before, after, model)
    return StepResult(
        mode="request_rate" if step.rate is not None else "concurrency",
        concurrency=step.concurrency,
        request_rate=step.rate,
        requests=len(lat),
        errors=tally.error_count,
        duration_s=round(duration, 4),
        throughput_infer_s=round(len(lat) * batch / duration, 2),
        avg_us=round(float(lat.mean()) if len(lat) else 0.0, 1),
        p50_us=round(float(pct[0]), 1),
        p90_us=round(float(pct[1]), 1),
        p95_us=round(float(pct[2]), 1),
        p99_us=round(float(pct[3]), 1),
        server_requests=int(server["requests"]),
        server_queue_us=round(server["queue"], 1),
        server_compute_input_us=round(server["compute_input"], 1),
        server_compute_infer_us=round(server["compute_infer"], 1),
        server_compute_output_us=round(server["compute_output"], 1),
        mean_batch=round(server["mean_batch"], 2),
    )


def _totals(stats: Mapping[str, Any], model: str) -> dict[str, float]:
    """The model's counters summed over its versions."""
    out: dict[str, float] = {}
    for entry in stats.get("model_stats", []):
        if entry.get("name") != model:
            continue
        out["inference_count"] = out.get("inference_count", 0) + entry.get("inference_count", 0)
        out["execution_count"] = out.get("execution_count", 0) + entry.get("execution_count", 0)
        for key, value in entry.get("inference_stats", {}).items():
            out[f"{key}.count"] = out.get(f"{key}.count", 0) + value.get("count", 0)
            out[f"{key}.ns"] = out.get(f"{key}.ns", 0) + value.get("ns", 0)
    return out


def server_figures(before: Mapping[str, Any], after: Mapping[str, Any], model: str) -> dict[str, float]:
    """Requests, mean µs per request in each phase, and mean batch size between two snapshots."""
    b, a = _totals(before, model), _totals(after, model)

    def delta(key: str) -> float:
        return a.get(key, 0) - b.get(key, 0)

    def per_request_us(phase: str) -> float:
        count = delta(f"{phase}.count")
        return delta(f"{phase}.ns") / count / 1e3 if count else 0.0

    executions = delta("execution_count")
    return {
        "requests": delta("success.count"),
        "queue": per_request_us("queue"),
        "compute_input": per_request_us("compute_input"),
        "compute_infer": per_request_us("compute_infer"),
        "compute_output": per_request_us("compute_output"),
        "mean_batch": delta("inference_count") / executions if executions else 0.0,
    }


# ---------------------------------------------------------------------------------------------- table

_COLUMNS = (
    ("step", 16),
    ("infer/s", 11),
    ("errors", 7),
    ("p50 us", 9),
    ("p90 us", 9),
    ("p95 us", 9),
    ("p99 us", 9),
    ("avg us", 9),
    ("queue us", 9),
    ("compute us", 11),
    ("batch", 6),
)


def header() -> str:
    return "  ".join(
        f"{name:>{width}}" if i else f"{name:<{width}}" for i, (name, width) in enumerate(_COLUMNS)
    )


def row(r: StepResult) -> str:
    step = f"rate {r.request_rate:g}/s" if r.mode == "request_rate" else f"concurrency {r.concurrency}"
    values = (
        step,
        f"{r.throughput_infer_s:.1f}",
        str(r.errors),
        f"{r.p50_us:.0f}",
        f"{r.p90_us:.0f}",
        f"{r.p95_us:.0f}",
        f"{r.p99_us:.0f}",
        f"{r.avg_us:.0f}",
        f"{r.server_queue_us:.0f}",
        f"{r.server_compute_us:.0f}",
        f"{r.mean_batch:.2f}",
    )
    return "  ".join(
        f"{v:>{w}}" if i else f"{v:<{w}}" for i, (v, (_, w)) in enumerate(zip(values, _COLUMNS, strict=True))
    )


def print_errors(tally: Tally, out: TextIO = sys.stderr) -> None:
    for text, count in sorted(tally.errors.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {count} x {text}", file=out)


# ---------------------------------------------------------------------------------------------- files


def write_csv(path: Path, results: Sequence[StepResult]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for r in results:
            writer.writerow({k: "" if v is None else v for k, v in dataclasses.asdict(r).items()})


def write_json(path: Path, run: Mapping[str, Any], results: Sequence[StepResult]) -> None:
    doc = {**run, "steps": [dataclasses.asdict(r) for r in results]}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def load_pyplot() -> Any:
    """matplotlib's pyplot on a file-only backend; ``ImportError`` with ``PLOT_HINT`` when missing."""
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        return importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise ImportError(PLOT_HINT) from exc


def plot(pyplot: Any, path: Path, results: Sequence[StepResult], title: str) -> None:
    """Throughput against p99 latency, one point per step, labelled with its concurrency or rate."""
    fig, ax = pyplot.subplots(figsize=(7, 4.5))
    xs = [r.p99_us / 1e3 for r in results]
    ys = [r.throughput_infer_s for r in results]
    ax.plot(xs, ys, marker="o")
    for r, x, y in zip(results, xs, ys, strict=True):
        label = f"{r.request_rate:g}/s" if r.mode == "request_rate" else f"c={r.concurrency}"
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
