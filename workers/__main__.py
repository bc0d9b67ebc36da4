"""``python -m zinfer.workers``: one model instance, started by the broker's supervisor."""

from __future__ import annotations

import argparse
import io
import logging
import sys
from pathlib import Path

from zinfer.client.cpu_pinning import parse_cpu_arg, pin_process

from .worker import WorkerArgs, main_loop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="zinfer-worker", description="A zinfer model instance (started by the broker)."
    )
    p.add_argument("--endpoint", required=True)
    p.add_argument("--repository", required=True, type=Path)
    p.add_argument("--model", required=True)
    p.add_argument("--version", required=True, type=int)
    p.add_argument("--instance", required=True, type=int)
    p.add_argument("--device", default="cpu")
    p.add_argument("--identity", required=True)
    p.add_argument("--parent", required=True, type=int)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--heartbeat-liveness", type=int, default=5)
    p.add_argument("--server-url", default=None, help="the server's client socket, for BLS")
    p.add_argument("--cpus", default=None, help="pin this worker to these CPUs, e.g. 0,1,2,3")
    p.add_argument("--max-frame-bytes", type=int, default=-1, help="largest frame sent or received")
    a = p.parse_args(argv)
    # model code sees no worker flags (Triton's stub has none): unittest.main() in a model parses sys.argv
    sys.argv = sys.argv[:1]
    if a.cpus:  # before any model code, so thread pools size themselves to the mask
        pin_process(parse_cpu_arg(a.cpus))
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # a model's print() reaches the log as it happens
    logging.basicConfig(
        level=a.log_level.upper(),
        format=f"%(asctime)s level=%(levelname)s logger=%(name)s worker={a.identity} %(message)s",
    )
    return main_loop(
        WorkerArgs(
            a.endpoint,
            a.repository,
            a.model,
            a.version,
            a.instance,
            a.device,
            a.identity.encode(),
            a.parent,
            a.heartbeat_interval,
            a.heartbeat_liveness,
            a.server_url,
            a.max_frame_bytes,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
