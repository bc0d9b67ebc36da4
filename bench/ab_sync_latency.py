"""One side of an A/B run: ``add0`` at concurrency 1 (one sync ``Client``; p50 and CPU per request of the
broker, its workers and the client) or the bare DEALER->ROUTER->DEALER relay sending the frames this zinfer
sends for an ``add`` request, with whichever zinfer ``PYTHONPATH`` selects. Run it alternately for two
trees (a symlink tree ``DIR/zinfer/{client,broker,...}`` for each) in one run, and compare each to its bare.

Usage: ``PYTHONPATH=DIR python bench/ab_sync_latency.py zinfer SECONDS`` or ``... bare N``; prints JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
import vs_triton_repo  # noqa: E402
import zinfer_side as z  # noqa: E402
from bench_serving import bare_frames, pct  # noqa: E402


def main() -> int:
    mode, arg = sys.argv[1], float(sys.argv[2])
    if mode == "zinfer":
        with tempfile.TemporaryDirectory(prefix="zab-") as tmp:
            repo = vs_triton_repo.write(Path(tmp) / "zinfer", zinfer_only=True)
            with z.serve(repo) as s:
                out = z.sync_latency(s, "add0", arg, 100_000)
    else:
        with baseline.bare_hop() as ep:
            frames = bare_frames()
            lats = baseline.bare_latency_us(ep, frames, int(arg))
            out = {"p50_us": round(pct(lats, 50), 1), "frames": len(frames)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
