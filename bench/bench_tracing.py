"""What per-request tracing costs the broker loop, measured in process on the broker's own objects.

Off: the two checks of ``Tracer.on`` a request meets (admission, completion). On: ``Tracer.start`` at
admission plus ``Tracer.batch_done`` for a batch of one traced request, in triton mode (the JSON entries
gathered, written every 1000 traces) and, where ``zinfer[tracing]`` is installed, in opentelemetry mode
(spans built and queued for the SDK's exporter thread, which posts them to a sink in this process that
answers 200 and keeps nothing). A serving benchmark with tracing off against the same commit without
tracing belongs on a quiet machine (``bench_serving.py``); this one isolates the broker-side work per
request.

Usage: ``.venv/bin/python bench/bench_tracing.py``; prints µs per request.
"""

from __future__ import annotations

import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from zinfer.broker.model_state import InFlight
from zinfer.broker.trace_settings import TraceSettings
from zinfer.broker.tracing import Tracer

N = 20_000


class _P:
    batch_size = 1
    trace = None


def _per_request_us(tracer: Tracer, n: int = N) -> float:
    p = _P()
    batch = InFlight(1, b"add-0", None, [p], time.monotonic_ns())  # type: ignore[arg-type, list-item]
    t0 = time.perf_counter()
    for i in range(n):
        if tracer.on:
            p.trace = tracer.start("add", 1, str(i), {}, time.monotonic_ns())  # type: ignore[assignment]
        if tracer.on:
            tracer.batch_done(batch, (1000, 5000, 1000), time.monotonic_ns())
    return (time.perf_counter() - t0) / n * 1e6


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    off = Tracer(TraceSettings())
    print(f"tracing off: {_per_request_us(off, N * 10):.3f} us per request (two attribute checks)")
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "t.json")
        on = Tracer(TraceSettings(level=("TIMESTAMPS",), rate=1, file=path, log_frequency=1000))
        print(f"triton mode, every request traced: {_per_request_us(on):.2f} us per traced request")
        on.close()
    sampled = Tracer(TraceSettings(level=("TIMESTAMPS",), rate=1000))
    print(f"triton mode, rate=1000: {_per_request_us(sampled, N * 5):.2f} us per request (sampling)")
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    try:
        settings = TraceSettings(level=("TIMESTAMPS",), rate=1, mode="opentelemetry", otel=(("url", url),))
        otel = Tracer(settings)
    except ImportError:
        print("opentelemetry mode: not measured (pip install 'zinfer[tracing]')")
        return
    cost = _per_request_us(otel, 2000)
    print(f"opentelemetry mode, every request traced: {cost:.2f} us per traced request")
    otel.close()
    sink.shutdown()


if __name__ == "__main__":
    main()
