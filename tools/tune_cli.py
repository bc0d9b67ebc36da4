"""``zinfer tune``: sweep a model's batching and instance settings on a live server, keep the best.

::

    zinfer serve --model-repository models --model-control-mode explicit &
    zinfer tune -m add --model-repository models --latency-budget-ms 2 \\
        --max-batch-size 8,16 --preferred-batch-size "",4,8 --max-queue-delay-us 0,100,500 \\
        --instance-count 1,2 --concurrency 16 --measurement-interval 3 --output add.config.pbtxt

For each point of the sweep the model's ``config.pbtxt`` in the repository is rewritten (the original
text is kept, only ``max_batch_size``, ``dynamic_batching.preferred_batch_size``,
``dynamic_batching.max_queue_delay_microseconds`` and the instance groups' ``count`` change), the server
reloads the model (``Client.load_model``: needs ``--model-control-mode explicit``), and the ``zinfer
perf`` engine measures it. The best point is the one with the highest throughput whose p99 latency is
within the budget; it is printed and written as a ``config.pbtxt``. The original file is always put back
(and reloaded), on errors and Ctrl-C too. ``--time-limit`` and ``--max-points`` bound the sweep.
A range not given on the command line gets a default derived from the model's config, the latency budget
and the machine (``DEFAULTS_HELP``); every point tried is printed as a table row.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from zinfer.client import Client
from zinfer.client.errors import ConfigError, Unsupported, ZinferError
from zinfer.modelconfig.model_config import CONFIG_FILENAME, ModelConfig, parse_model_config

from . import perf_cli
from .perf_load import Step, Tally, run_sync
from .perf_report import StepResult, summarize
from .tune_points import DEFAULTS_HELP, Point, apply_point, default_ranges

__all__ = ["main"]


# ---------------------------------------------------------------------------------------------- options


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by ',', got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 0 separated by ',', got {text!r}")
    return values


def _preferred_list(text: str) -> list[tuple[int, ...]]:
    """``"",4,8`` or ``none,4,8`` or ``4:8,16``: each ','-separated entry a choice, '' or 'none' for no
    preferred sizes, ':' joining several sizes into one choice."""
    out: list[tuple[int, ...]] = []
    for entry in text.split(","):
        entry = entry.strip().strip("\"'")
        if entry.lower() in ("", "none"):
            out.append(())
            continue
        try:
            sizes = tuple(int(v) for v in entry.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad preferred batch size {entry!r} in {text!r}") from None
        if any(v <= 0 for v in sizes):
            raise argparse.ArgumentTypeError(f"preferred batch sizes must be > 0, got {entry!r}")
        out.append(sizes)
    return list(dict.fromkeys(out))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zinfer tune",
        description="Sweep a model's batching and instance settings on a server with explicit model "
        "control; write the best configuration within a p99 latency budget.",
        epilog=DEFAULTS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model-name", dest="model", required=True, help="the model to tune")
    p.add_argument(
        "--model-repository", type=Path, required=True, metavar="DIR", help="the server's model repository"
    )
    p.add_argument("-u", "--url", default=None, help="the server (default: the default runtime directory)")
    p.add_argument(
        "--latency-budget-ms", type=float, required=True, metavar="MS", help="the largest p99 allowed"
    )
    p.add_argument("--max-batch-size", type=_int_list, default=None, metavar="N,N,...")
    p.add_argument(
        "--preferred-batch-size",
        type=_preferred_list,
        default=None,
        metavar='"",4,8',
        help="choices of dynamic_batching.preferred_batch_size; '' means none, 4:8 means [4, 8]",
    )
    p.add_argument("--max-queue-delay-us", type=_int_list, default=None, metavar="US,US,...")
    p.add_argument("--instance-count", type=_int_list, default=None, metavar="N,N,...")
    p.add_argument("--concurrency", type=int, default=16, help="requests kept in flight (default 16)")
    p.add_argument(
        "--measurement-interval", type=float, default=3.0, metavar="SECONDS", help="per point (default 3)"
    )
    p.add_argument("--max-requests", type=int, default=0, metavar="N", help="end a point after N requests")
    p.add_argument("-b", "--batch-size", type=int, default=1, help="rows per request (batching models)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="stop starting new points after this long (default 600)",
    )
    p.add_argument("--max-points", type=int, default=100, help="measure at most this many points")
    p.add_argument("--load-timeout", type=float, default=120.0, metavar="SECONDS", help="per reload")
    p.add_argument(
        "--output",
        type=Path,
        default=Path("config.pbtxt.best"),
        metavar="FILE",
        help="where the best config goes (default ./config.pbtxt.best)",
    )
    return p


def _points(args: argparse.Namespace, config: ModelConfig) -> list[Point]:
    """Every combination of the ranges (given, else default); none whose preferred sizes pass its
    max_batch_size."""
    defaults = default_ranges(config, args.latency_budget_ms * 1e3, os.cpu_count() or 1)
    names = ("max_batch_size", "preferred_batch_size", "max_queue_delay_us", "instance_count")
    axes = [getattr(args, n) or defaults.get(n) or [None] for n in names]
    taken = [n for n in names if not getattr(args, n) and defaults.get(n)]
    if taken:
        shown = "; ".join(f"{n} {_show(defaults[n])}" for n in taken)
        print(f"zinfer tune: default ranges (zinfer tune --help): {shown}", flush=True)
    points = []
    for mbs, pref, delay, count in itertools.product(*axes):
        limit = mbs if mbs is not None else config.max_batch_size
        if pref and max(pref) > limit:
            continue
        points.append(Point(mbs, pref, delay, count))
    return points


def _show(values: list[Any]) -> str:
    return ",".join(
        "none" if v == () else ":".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in values
    )


# ---------------------------------------------------------------------------------------------- measuring


@dataclass
class Outcome:
    point: Point
    text: str
    result: StepResult | None = None
    error: str = ""


def _measure(client: Client, args: argparse.Namespace, inputs: dict[str, Any]) -> StepResult:
    def call() -> object:
        return client.infer(args.model, inputs)

    call()  # warm-up on the new instances
    step = Step(
        concurrency=args.concurrency, interval_s=args.measurement_interval, max_requests=args.max_requests
    )
    tally = Tally()
    before = client.statistics(args.model)
    run_sync(call, step, tally)
    return summarize(step, tally, before, client.statistics(args.model), args.model, args.batch_size)


def _header() -> str:
    cols = f"{'infer/s':>10} {'p50 us':>9} {'p99 us':>9} {'batch':>6} {'errors':>6}"
    return f"{'#':>3}  {'configuration':<40} {cols}"


def _row(i: int, o: Outcome, budget_us: float) -> str:
    if o.result is None:
        return f"{i:>3}  {o.point.label:<40} skipped: {o.error}"
    r = o.result
    mark = "" if r.p99_us <= budget_us else "  over budget"
    return (
        f"{i:>3}  {o.point.label:<40} {r.throughput_infer_s:>10.1f} {r.p50_us:>9.0f} {r.p99_us:>9.0f} "
        f"{r.mean_batch:>6.2f} {r.errors:>6}{mark}"
    )


def best(outcomes: list[Outcome], budget_us: float) -> Outcome | None:
    """The highest throughput among error-free points whose p99 is within the budget."""
    fits = [
        o
        for o in outcomes
        if o.result is not None and o.result.requests and not o.result.errors and o.result.p99_us <= budget_us
    ]
    return max(fits, key=lambda o: o.result.throughput_infer_s if o.result else 0.0, default=None)


def _sweep(
    client: Client, args: argparse.Namespace, path: Path, original: str, points: list[Point]
) -> list[Outcome]:
    budget_us = args.latency_budget_ms * 1e3
    started = time.monotonic()
    client.load_model(args.model, timeout=args.load_timeout)  # the original: also checks model control
    perf_args = perf_cli._parser().parse_args(["-m", args.model, "-b", str(args.batch_size)])
    inputs = perf_cli.build_inputs(client.model_metadata(args.model), perf_args)
    outcomes: list[Outcome] = []
    print(_header(), flush=True)
    per_point = args.measurement_interval + 1.0
    for point in points[: args.max_points]:
        if time.monotonic() - started + per_point > args.time_limit:
            print(
                f"time limit of {args.time_limit:g} s reached: {len(points) - len(outcomes)} points left out"
            )
            break
        o = Outcome(point, apply_point(original, point))
        outcomes.append(o)
        try:
            parse_model_config(o.text, source=f"{path} ({point.label})", model_name=args.model)
        except ConfigError as exc:
            o.error = f"invalid: {str(exc).split(': ', 1)[-1]}"
            print(_row(len(outcomes), o, budget_us), flush=True)
            continue
        path.write_text(o.text, encoding="utf-8")
        try:
            client.load_model(args.model, timeout=args.load_timeout)
            o.result = _measure(client, args, inputs)
        except ZinferError as exc:
            o.error = f"{type(exc).__name__}: {exc}"
        print(_row(len(outcomes), o, budget_us), flush=True)
    return outcomes


def _sigterm_as_interrupt() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.concurrency < 1 or args.measurement_interval <= 0 or args.max_requests < 0 or args.batch_size < 1:
        parser.error("--concurrency and --batch-size must be >= 1, --measurement-interval > 0")
    if args.latency_budget_ms <= 0 or args.time_limit <= 0 or args.max_points < 1:
        parser.error("--latency-budget-ms and --time-limit must be > 0, --max-points >= 1")
    path = args.model_repository / args.model / CONFIG_FILENAME
    try:
        original = path.read_text(encoding="utf-8")
        config = parse_model_config(original, source=str(path), model_name=args.model)
    except (OSError, ConfigError) as exc:
        print(f"zinfer tune: {exc}", file=sys.stderr)
        return 2
    points = _points(args, config)
    if len(points) > args.max_points:
        print(f"zinfer tune: {len(points)} points, measuring the first {args.max_points} (--max-points)")
    previous = _sigterm_as_interrupt()
    outcomes: list[Outcome] = []
    try:
        with Client(args.url, timeout=max(30.0, args.load_timeout)) as client:
            try:
                outcomes = _sweep(client, args, path, original, points)
            except Unsupported as exc:
                print(
                    f"zinfer tune: the server does not allow reloading models ({exc}).\n"
                    "Start it with --model-control-mode explicit.",
                    file=sys.stderr,
                )
                return 2
            finally:
                _restore(client, args, path, original)
    except KeyboardInterrupt:
        print("zinfer tune: interrupted; the original config is back in place", file=sys.stderr)
        return 130
    except (ZinferError, OSError, ValueError) as exc:
        print(f"zinfer tune: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return _conclude(args, outcomes, min(len(points), args.max_points))


def _restore(client: Client, args: argparse.Namespace, path: Path, original: str) -> None:
    """Put the original file back, then reload it (best effort: the file matters most)."""
    if path.read_text(encoding="utf-8") != original:
        path.write_text(original, encoding="utf-8")
        try:
            client.load_model(args.model, timeout=args.load_timeout)
        except ZinferError as exc:
            print(f"zinfer tune: original config restored, but reloading it failed: {exc}", file=sys.stderr)


def nothing_fits(
    outcomes: list[Outcome], budget_us: float, concurrency: int, batch_size: int, planned: int,
    load: tuple[float, int] | None = None,
) -> list[str]:
    """When no point fits: what bounded the sweep, and the next step to try, one line each. ``planned`` is
    how many points the sweep meant to measure; ``load`` the machine's (1-minute load average, CPUs)."""
    lines: list[str] = []
    if len(outcomes) < planned:
        lines.append(f"the time limit stopped the sweep after {len(outcomes)} of {planned} points: "
                     "raise --time-limit, or give fewer ranges")  # fmt: skip
    measured = [o for o in outcomes if o.result is not None and o.result.requests]
    clean = [o for o in measured if o.result is not None and not o.result.errors]
    if not measured:
        lines.append("no point could be measured (the table says why): check that the model loads and "
                     "answers with 'zinfer perf -m MODEL'")  # fmt: skip
        return lines
    if not clean:
        lines.append("every point had errors: 'zinfer perf -m MODEL' shows them")
        return lines
    low = min(clean, key=lambda o: o.result.p99_us if o.result else float("inf"))
    r = low.result
    assert r is not None
    lines.append(f"bounded by the latency budget: the lowest p99 was {r.p99_us / 1e3:.2f} ms "
                 f"({low.point.label.strip()}), over the {budget_us / 1e3:g} ms budget")  # fmt: skip
    rate = r.throughput_infer_s / batch_size  # requests per second
    if rate > 0:
        waiting_ms = concurrency / rate * 1e3  # Little's law: in flight / rate = time in the system
        # half the budget on average leaves room for the tail
        allowed = max(1, int(rate * budget_us / 1e6 / 2))
        if allowed < concurrency:
            lines.append(f"  {concurrency} requests in flight at {rate:.0f} requests/s spend "
                         f"{waiting_ms:.2f} ms each in the server on average (Little's law): "
                         f"try --concurrency {allowed}")  # fmt: skip
    per_batch_ms = r.server_compute_us / 1e3
    if per_batch_ms > budget_us / 1e3 / 2:
        lines.append(f"  one batch computes for {per_batch_ms:.2f} ms: give smaller --max-batch-size values, "
                     "or a faster instance kind")  # fmt: skip
    if load is not None and load[0] > 0.7 * load[1]:
        lines.append(f"  the machine is busy (load average {load[0]:.1f} on {load[1]} CPUs): measure when it "
                     "is quieter")  # fmt: skip
    lines.append(f"  or raise --latency-budget-ms to at least {r.p99_us * 1.2 / 1e3:.1f}")
    return lines


def _conclude(args: argparse.Namespace, outcomes: list[Outcome], planned: int) -> int:
    budget_us = args.latency_budget_ms * 1e3
    chosen = best(outcomes, budget_us)
    if outcomes:
        print(f"\ntried {len(outcomes)} point(s), highest throughput first:\n{_header()}")
        ranked = sorted(outcomes, key=lambda o: -(o.result.throughput_infer_s if o.result else -1.0))
        for o in ranked:
            print(_row(outcomes.index(o) + 1, o, budget_us) + ("  <- best" if o is chosen else ""))
    if chosen is None or chosen.result is None:
        print(f"\nno configuration kept p99 within {args.latency_budget_ms:g} ms; nothing written")
        load = (os.getloadavg()[0], os.cpu_count() or 1)
        for line in nothing_fits(outcomes, budget_us, args.concurrency, args.batch_size, planned, load):
            print(line)
        return 1
    r = chosen.result
    print(
        f"\nbest within p99 <= {args.latency_budget_ms:g} ms: {chosen.point.label}\n"
        f"  {r.throughput_infer_s:.1f} infer/s, p50 {r.p50_us:.0f} us, p99 {r.p99_us:.0f} us, "
        f"mean batch {r.mean_batch:.2f}\n  written to {args.output}"
    )
    args.output.write_text(chosen.text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
