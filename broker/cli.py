"""The ``zinfer`` command: ``zinfer serve`` starts a server on a model repository."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import zmq

from zinfer.client.addresses import listen_problem
from zinfer.client.errors import ConfigError, ZinferError
from zinfer.client.gc_tuning import tune_for_serving
from zinfer.client.paths import client_endpoint, default_runtime_dir
from zinfer.client.region_handoff import HANDOFF_SOCKET_NAME

from .batching.rate_limiter import normalize_resources
from .cli_parser import parser as _parser
from .compiled import COMPILED, compiled_here
from .frontdoor_procs import FrontDoorConfig, FrontDoorProcs, missing_extra
from .memory_budget import parse_budget
from .regions import default_limits
from .reply_backlog import DEFAULT_MAX_UNREAD_REPLY_BYTES
from .sd_notify import Notifier
from .server import Broker
from .server_config import FILE_ONLY_KEYS, KEYS, ConfigFileError, flag_defaults, format_cpus, load_config
from .server_options import ServerOptions
from .trace_otel import missing as otel_missing
from .trace_settings import parse_trace_config

log = logging.getLogger("zinfer.serve")

NOTIFY_TICK_S = 0.05  # how often the main loop reports to systemd (READY, STATUS, WATCHDOG)
# how often the loop looks at the front-door processes (a ``waitpid`` and ``Popen``'s lock each: 2-6 us a
# look on a loaded 2-core machine, on every pass of the loop before, which passes every few requests under
# door traffic); the broker reaps its workers as often (``server.REAP_INTERVAL_S``)
DOOR_POLL_INTERVAL_S = 0.05
MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
EXIT_CONFIG = 2  # a configuration error: systemd's RestartPreventExitStatus=2 keeps it from restarting


def bundled_models() -> Path:
    """The example model repository shipped with zinfer (``configs/models``)."""
    return Path(str(resources.files("zinfer.configs") / "models"))


def keys(args: argparse.Namespace) -> int:
    from .tcp_access import create_keys

    public, secret = create_keys(args.folder, args.name)
    print(f"public key (share it): {public}\nsecret key (keep it private): {secret}")
    return 0


def control(args: argparse.Namespace) -> int:
    """``zinfer models|load|unload``: model control against a running server."""
    from zinfer.client import Client

    try:
        with Client(args.url, timeout=args.timeout) as client:
            if args.command == "load":
                client.load_model(args.model)
                print(f"loaded {args.model}")
            elif args.command == "unload":
                client.unload_model(args.model)
                print(f"unloading {args.model}")
            else:
                rows = client.repository_index()
                resident = any("resident_bytes" in r for r in rows)  # on-demand model control
                head = f"{'RESIDENT':>10}  " if resident else ""
                print(f"{'MODEL':24} {'VERSION':8} {'STATE':12} {head}REASON")
                for r in rows:
                    mib = f"{r['resident_bytes'] / 2**20:.1f} MiB" if r.get("resident_bytes") else "-"
                    column = f"{mib:>10}  " if resident else ""
                    print(f"{r['name']:24} {r['version']:8} {r['state']:12} {column}{r['reason']}")
    except ZinferError as exc:
        print(f"zinfer {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def server_options(args: argparse.Namespace, repo: Path) -> ServerOptions:
    """``ServerOptions`` from the parsed flags (whose defaults hold the configuration file's values).

    Keys that only the file sets become fields of the same name; a key whose field ``ServerOptions`` does
    not have yet is logged (``event=config_key_ignored``) and left out."""
    known = {f.name for f in dataclasses.fields(ServerOptions)}
    extra: dict[str, Any] = {}
    for name in FILE_ONLY_KEYS:
        if not hasattr(args, KEYS[name].dest):
            continue
        if name in known:
            extra[name] = getattr(args, KEYS[name].dest)
        else:
            log.warning("event=config_key_ignored key=%s reason='not supported by this server yet'", name)
    for flag, name in (("cli_cache_bytes", "cache_bytes"), ("cli_heartbeat_interval", "heartbeat_interval_s"),
                       ("cli_heartbeat_liveness", "heartbeat_liveness")):  # fmt: skip
        if getattr(args, flag, None) is not None:
            extra[name] = getattr(args, flag)
    extra.update(_on_demand_options(args))
    if getattr(args, "trace_config", None):
        try:
            extra["trace"] = parse_trace_config(args.trace_config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if extra["trace"].mode == "opentelemetry" and (problem := otel_missing()) is not None:
            raise ConfigError(problem)
    if getattr(args, "cli_rate_limits", None):
        extra["rate_limit_resources"] = tuple(_resource(text) for text in args.cli_rate_limits)
    if "rate_limit_resources" in extra:
        try:
            extra["rate_limit_resources"] = normalize_resources(extra["rate_limit_resources"])
        except ValueError as exc:
            raise ConfigError(f"--rate-limit-resource: {exc}") from None
    runtime_dir = Path(os.path.abspath(args.runtime_dir or default_runtime_dir()))
    if len(str(runtime_dir / HANDOFF_SOCKET_NAME)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"runtime dir {runtime_dir}: its socket paths would be longer than {MAX_SOCKET_PATH} characters "
            "(the limit of a Unix socket address); give a shorter --runtime-dir"
        )
    load_models = args.load_model if args.load_model is not None else getattr(args, "config_load_models", ())
    region_bytes, user_bytes = default_limits()
    for name, default in (("max_region_bytes", region_bytes), ("max_user_region_bytes", user_bytes),
                          ("max_unread_reply_bytes", DEFAULT_MAX_UNREAD_REPLY_BYTES)):  # fmt: skip
        value = getattr(args, name, None)
        extra[name] = default if value is None else value
    return ServerOptions(
        model_repository=repo,
        # absolute, not resolved: a runtime dir that is a symbolic link must be seen as one (and refused)
        runtime_dir=runtime_dir,
        tcp=args.tcp,
        max_tensor_bytes=args.max_tensor_bytes,
        max_batch_bytes=args.max_batch_bytes or 2 * args.max_tensor_bytes,
        exit_timeout_s=args.exit_timeout,
        drain_timeout_s=args.drain_timeout,
        log_level=args.log_level,
        model_control_mode=args.model_control_mode,
        socket_group=args.socket_group,
        metrics=None if args.metrics == "off" else args.metrics,
        curve_secret_key=args.curve_secret_key,
        curve_allow=args.curve_allow,
        load_models=tuple(load_models),
        **extra,
    )


def _on_demand_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--memory-budget`` and ``--model-idle-unload`` (flags over the file's ``memory_budget`` and
    ``model_idle_unload_s``), which only on-demand model control uses: given as flags in another mode they
    are an error; from the file they are then left out (logged), so that one file serves every mode."""
    flags = getattr(args, "memory_budget", None), getattr(args, "model_idle_unload", None)
    items = flags[0] if flags[0] is not None else getattr(args, "config_memory_budget", ())
    idle = flags[1] if flags[1] is not None else getattr(args, "config_model_idle_unload", None)
    if args.model_control_mode != "on-demand":
        if flags != (None, None):
            raise ConfigError("--memory-budget and --model-idle-unload need --model-control-mode on-demand")
        if items or idle is not None:
            log.warning("event=config_key_ignored key=memory_budget,model_idle_unload_s "
                        "reason='only with model_control_mode on-demand'")  # fmt: skip
        return {}
    try:
        budget = parse_budget(items or ())
    except ValueError as exc:
        raise ConfigError(f"--memory-budget: {exc}") from None
    return {"memory_budget": budget, "model_idle_unload_s": idle}


def _resource(text: str) -> tuple[str, int, str | None]:
    name, _, rest = text.partition(":")
    count, _, device = rest.partition(":")
    if not name or not count.isdigit():
        raise ConfigError(f"--rate-limit-resource expects NAME:COUNT[:DEVICE], got {text!r}")
    return name, int(count), device or None


def frontdoor_config(args: argparse.Namespace, options: ServerOptions) -> FrontDoorConfig:
    """The front door's settings from the flags; a ``ConfigError`` for a combination that cannot serve."""
    config = FrontDoorConfig(
        workers=args.frontdoor_workers,
        broker_url=client_endpoint(options.runtime_dir),
        runtime_dir=options.runtime_dir,
        grpc=args.grpc,
        http=args.http,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        insecure_remote=args.insecure_remote,
        allow_unknown_shm_callers=args.allow_unknown_shm_callers,
        http_header_timeout_s=args.http_header_timeout,
        http_peer_connections=args.http_peer_connections,
        cpus=args.frontdoor_cpus,
        max_tensor_bytes=options.max_tensor_bytes,
        log_level=options.log_level,
        model_repository=options.model_repository,
    )
    if config.cpus is not None:
        usable = os.sched_getaffinity(0)
        if not config.cpus <= usable:
            raise ConfigError(
                f"--frontdoor-cpus {format_cpus(config.cpus)}: CPU {min(config.cpus - usable)} is not one "
                f"this server may run on ({format_cpus(frozenset(usable))})"
            )
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    for path in (config.tls_cert, config.tls_key, config.tls_client_ca):
        if path is not None and not path.is_file():
            raise ConfigError(f"{path}: no such file")
    for flag, address in (("--grpc", config.grpc), ("--http", config.http)):
        problem = None if address is None else listen_problem(address, config.tls_cert is not None,
                                                              config.insecure_remote)  # fmt: skip
        if problem is not None:
            raise ConfigError(f"{flag} {problem}")
    missing = missing_extra(config) if config.enabled else None
    if missing is not None:
        raise ConfigError(missing)
    return config


def _names(names: list[str], limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def serving_status(broker: Broker) -> str:
    """One line for ``systemctl status``: what is loading, serving, failed, or that the server drains."""
    states = list(broker.registry.states())
    ready = sorted({s.name for s in states if s.ready})
    failed = sorted({s.name for s in states if s.error} | set(broker.registry.load_errors))
    loading = sorted({p.name for p in broker.control.pending})
    if broker.draining_since is not None:
        head = "draining queued and running requests, then stopping"
    elif loading:
        head = f"loading {len(loading)} model(s): {_names(loading)}; {len(ready)} ready"
    else:
        head = f"serving {len(ready)} model(s)"
    return head + (f"; failed: {_names(failed)}" if failed else "")


def _reporting(notifier: Notifier, broker: Broker, stop: dict[str, int]) -> Callable[[], int]:
    """The broker loop's stop-request callable (called once per pass of the loop), which also reports to
    systemd: READY=1 once start-up is done, STATUS= as it changes, WATCHDOG=1, STOPPING=1 on a signal."""
    if not notifier.enabled:
        return lambda: stop["count"]
    last = {"tick": float("-inf"), "count": 0}

    def stop_requests() -> int:
        count = stop["count"]
        now = time.monotonic()
        if now - last["tick"] >= NOTIFY_TICK_S or count != last["count"]:
            last["tick"], last["count"] = now, count
            if count:
                notifier.stopping("draining queued and running requests, then stopping")
            notifier.loop_tick(now, broker.startup_done, serving_status(broker))
        return count

    return stop_requests


def _with_frontdoors(
    stop_requests: Callable[[], int], doors: FrontDoorProcs, clock: Callable[[], float] = time.monotonic
) -> Callable[[], int]:
    """The loop's stop-request callable, which also watches the front-door processes (restarting those that
    died; at most every ``DOOR_POLL_INTERVAL_S``, as the broker reaps its workers) and, once a stop is asked
    for, stops them at once so they take no new requests while the broker drains."""
    if not doors.config.enabled:
        return stop_requests
    due = [float("-inf")]  # the next look at the processes

    def check() -> int:
        count = stop_requests()
        if count:
            doors.terminate()  # never waits: the loop must go on answering what the front doors hold
            return count
        now = clock()
        if now >= due[0]:
            due[0] = now + DOOR_POLL_INTERVAL_S
            doors.poll()
        return count

    return check


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    # before any worker starts: the notify socket and watchdog are the broker's, not its children's
    notifier = Notifier.from_environment()
    repo = (args.model_repository or bundled_models()).resolve()
    if not repo.is_dir():
        log.error("event=bad_repository path=%s error='not a folder'", repo)
        notifier.send(f"STATUS=model repository {repo} is not a folder")
        return EXIT_CONFIG
    try:
        options = server_options(args, repo)
        doors = FrontDoorProcs(frontdoor_config(args, options))
    except ConfigError as exc:
        log.error("event=bad_config error=%r", str(exc))
        notifier.send(f"STATUS=configuration error: {' '.join(str(exc).split())}")
        notifier.close()
        return EXIT_CONFIG
    stop = {"signal": 0, "count": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stop["signal"] = signum
        stop["count"] += 1

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    log.info("event=starting repository=%s runtime_dir=%s compiled=%d/%d", repo, options.runtime_dir,
             len(compiled_here()), len(COMPILED))  # fmt: skip
    o = options
    log.info("event=client_limits max_region_bytes=%d max_user_region_bytes=%d max_unread_reply_bytes=%d",
             o.max_region_bytes, o.max_user_region_bytes, o.max_unread_reply_bytes)  # fmt: skip
    broker = Broker(options)
    broker.startup.where.update(grpc=doors.config.grpc or "off", http=doors.config.http or "off")
    try:
        broker.start()
    except (ZinferError, OSError, zmq.ZMQError) as exc:
        # a configuration error (untrusted runtime dir, unknown --socket-group, TCP without CURVE, CURVE
        # files) exits 2, which no restart fixes; anything else (a server already running, ...) exits 1
        config = isinstance(exc, ConfigError)
        log.error("event=start_failed runtime_dir=%s config_error=%s error=%r", options.runtime_dir,
                  str(config).lower(), str(exc))  # fmt: skip
        notifier.send(f"STATUS=failed to start: {' '.join(str(exc).split())}")
        broker.close()
        notifier.close()
        return EXIT_CONFIG if config else 1
    try:
        if doors.config.enabled:
            doors.start()
            broker.observer.frontdoors = doors.snapshot
            broker.startup.waits["frontdoors"] = doors.listening  # the ready line once their ports are bound
        tune_for_serving()  # set up: freeze the broker's heap, collect less often (gc_tuning)
        broker.run(_with_frontdoors(_reporting(notifier, broker, stop), doors))
    finally:
        log.info("event=stopping signal=%d", stop["signal"])
        notifier.stopping("stopping workers")
        doors.close()
        broker.close()
        notifier.close()
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; for ``serve --config FILE``, parsed a second time with the file's values as the
    defaults, so that flags override the file. Raises ``ConfigFileError`` for a file it cannot use."""
    args = _parser().parse_args(argv)
    if args.command == "serve" and args.config is not None:
        args = _parser(flag_defaults(load_config(args.config))).parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tune"]:
        from zinfer.tools.tune_cli import main as tune_main

        return tune_main(argv[1:])
    if argv[:1] == ["perf"]:
        from zinfer.tools.perf_cli import main as perf_main

        return perf_main(argv[1:])
    if argv[:1] == ["status"]:
        from zinfer.tools.status_view import main as status_main

        return status_main(argv[1:])
    try:
        args = parse_args(argv)
    except ConfigFileError as exc:
        print(f"zinfer serve: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "serve":
        return serve(args)
    if args.command == "keys":
        return keys(args)
    return control(args)  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
