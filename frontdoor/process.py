"""A front-door process: ``python -m zinfer.frontdoor.process --broker-url URL --grpc HOST:PORT ...``.

``zinfer serve --grpc/--http`` starts ``--frontdoor-workers`` of them, all on the same ports
(SO_REUSEPORT), restarts one that dies and stops them with SIGTERM. Each holds one ``Bridge`` to the broker,
answers until SIGTERM (or until its parent, the server, is gone) and writes its pid and request counts to
``--status-file`` every second for ``zinfer status``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from zinfer.client.cpu_pinning import parse_cpu_arg, pin_process
from zinfer.client.errors import ConfigError
from zinfer.client.gc_tuning import tune_for_serving

from .bridge import Bridge
from .classification import LabelFiles
from .door import HEADER_TIMEOUT_S, PEER_CONNECTIONS, FrontDoor, FrontDoorOptions
from .sysshm import SystemShm

log = logging.getLogger("zinfer.frontdoor")

STATUS_INTERVAL_S = 1.0
LOOP_ENV = "ZINFER_FRONTDOOR_LOOP"  # "asyncio": asyncio's event loop even where uvloop is installed


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop's event loop where uvloop is installed (the ``frontdoor`` extra brings it), else
    on asyncio's; ``ZINFER_FRONTDOOR_LOOP=asyncio`` asks for asyncio's. Measured in turns against asyncio
    with perf_analyzer over HTTP (bench/ab_frontdoor_http.py, 4 rounds): the door's CPU per request was
    lower on uvloop in every round, 6% at concurrency 32 and 8% at 1, at the same throughput."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if os.environ.get(LOOP_ENV, "") != "asyncio":
        try:
            uvloop: Any = importlib.import_module("uvloop")  # optional: the frontdoor extra's
        except ImportError:
            pass
        else:
            factory = uvloop.new_event_loop
    log.info("event=frontdoor_event_loop loop=%s", "asyncio" if factory is None else "uvloop")
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def parse_args(
    argv: Sequence[str] | None = None,
) -> tuple[FrontDoorOptions, int | None, str, set[int] | None]:
    p = argparse.ArgumentParser(prog="zinfer-frontdoor")
    p.add_argument("--broker-url", required=True)
    p.add_argument("--shm-folder", type=Path, required=True)
    p.add_argument("--grpc")
    p.add_argument("--http")
    p.add_argument("--tls-cert", type=Path)
    p.add_argument("--tls-key", type=Path)
    p.add_argument("--tls-client-ca", type=Path)
    p.add_argument("--insecure-remote", action="store_true")
    p.add_argument("--max-tensor-bytes", type=int, default=1 << 30)
    p.add_argument("--status-file", type=Path)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--model-repository", type=Path)
    p.add_argument("--allow-unknown-shm-callers", action="store_true")
    p.add_argument("--http-header-timeout", type=float, default=HEADER_TIMEOUT_S)
    p.add_argument("--http-peer-connections", type=int, default=PEER_CONNECTIONS)
    p.add_argument("--parent", type=int)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--cpus", default=None, help="pin this process to these CPUs, e.g. 0,1")
    a = p.parse_args(argv)
    options = FrontDoorOptions(
        broker_url=a.broker_url,
        shm_folder=a.shm_folder,
        grpc=a.grpc,
        http=a.http,
        tls_cert=a.tls_cert,
        tls_key=a.tls_key,
        tls_client_ca=a.tls_client_ca,
        insecure_remote=a.insecure_remote,
        max_tensor_bytes=a.max_tensor_bytes,
        status_file=a.status_file,
        index=a.index,
        model_repository=a.model_repository,
        allow_unknown_shm_callers=a.allow_unknown_shm_callers,
        http_header_timeout_s=a.http_header_timeout,
        http_peer_connections=a.http_peer_connections,
    )
    cpus = parse_cpu_arg(a.cpus) if a.cpus else None
    return options, a.parent, a.log_level, cpus


async def serve(options: FrontDoorOptions, parent: int | None = None) -> None:
    """Run the gRPC (and HTTP) servers until SIGTERM/SIGINT or the parent's exit."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    door = FrontDoor(
        options,
        Bridge(options.broker_url),
        SystemShm(options.shm_folder, allow_unknown=options.allow_unknown_shm_callers),
        labels=LabelFiles(options.model_repository),
    )
    servers: list[Any] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        if options.grpc:
            from .grpc_server import start_grpc

            servers.append(await start_grpc(door, options.grpc))
        if options.http:
            try:
                http: Any = importlib.import_module("zinfer.frontdoor.http_server")
            except ImportError as exc:  # httptools missing: zinfer installed without its frontdoor extra
                hint = f"{exc}: pip install 'zinfer[frontdoor]'"
                log.error("event=frontdoor_http_unavailable reason=%r", hint)
            else:
                tasks.append(asyncio.create_task(http.serve_http(door, stop)))
                await asyncio.sleep(0)  # its first step binds and listens: the status file below means "up"
        tune_for_serving()  # set up and listening: freeze the heap, collect less often (gc_tuning)
        log.info(
            "event=frontdoor_listening index=%d pid=%d grpc=%s http=%s",
            options.index, os.getpid(), options.grpc or "off", options.http or "off",
        )  # fmt: skip
        while not stop.is_set():
            if options.status_file is not None:
                # the counts copied here, on the loop that records them; the write and rename in a thread
                # (tens of ms on a slow disk)
                snapshot = door.counters.snapshot()
                await asyncio.to_thread(door.counters.write, options.status_file, snapshot)
            if parent is not None and os.getppid() != parent:
                log.warning("event=frontdoor_parent_gone index=%d", options.index)
                break
            if any(t.done() for t in tasks):
                break
            try:
                await asyncio.wait_for(stop.wait(), STATUS_INTERVAL_S)
            except asyncio.TimeoutError:
                pass
    finally:
        stop.set()
        for server in servers:
            await server.stop(grace=2.0)
        for task in tasks:
            try:
                await asyncio.wait_for(task, 5.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - stopping: logged, not raised
                log.exception("event=frontdoor_http_stop_failed")
        door.shm.close()
        await door.bridge.close()
        log.info("event=frontdoor_stopped index=%d", options.index)


def main(argv: Sequence[str] | None = None) -> int:
    options, parent, level, cpus = parse_args(argv)
    logging.basicConfig(  # the server's own format (key=value), as its workers'
        level=level.upper(),
        format=f"%(asctime)s level=%(levelname)s logger=%(name)s frontdoor={options.index} %(message)s",
    )
    if cpus:  # before the loop starts its threads (libzmq's, gRPC's): they take the mask of their creator
        try:
            pin_process(cpus)
        except OSError as exc:  # e.g. every CPU of the list went offline since the server checked it
            log.error("event=frontdoor_failed error=%r", f"cannot run on CPUs {sorted(cpus)}: {exc.strerror}")
            return 2
    try:
        run_loop(serve(options, parent))
    except ConfigError as exc:
        log.error("event=frontdoor_failed error=%r", str(exc))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
