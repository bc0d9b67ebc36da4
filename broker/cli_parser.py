"""The ``zinfer`` command line: its subcommands and ``zinfer serve``'s flags (``cli.py`` runs them)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .memory_budget import parse_budget
from .server_config import host_port, parse_cpus

__all__ = ["parser"]


def _host_port(value: str) -> str:
    try:
        return host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _metrics_address(value: str) -> str:
    return value if value == "off" else _host_port(value)


def _cpus(value: str) -> frozenset[int]:
    try:
        return parse_cpus(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{value!r} is not a CPU list such as "1" or "2-3,6"') from None


def _number(kind: Callable[[str], float], minimum: float, strict: bool = False) -> Callable[[str], Any]:
    """An argparse type: a ``kind`` number >= ``minimum`` (> when ``strict``), else a usage error (exit 2)."""

    def convert(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if number < minimum or (strict and number == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g}, got {value}")
        return number

    return convert


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an argument it does not know is its usage error (``zinfer serve: error:
    unrecognized arguments: --metric``, with serve's usage), not the top-level parser's."""

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def parser(serve_defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The ``zinfer`` command line; ``serve_defaults`` (from a configuration file) replace the built-in
    defaults of ``zinfer serve``, so that flags given on the command line override the file."""
    p = argparse.ArgumentParser(prog="zinfer", description="zinfer: an intra-host inference server.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    s = sub.add_parser("serve", help="serve a model repository")
    s.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML file with any of the options below (and more; see configs/zinfer.toml); flags override it",
    )
    s.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        help="Triton-layout model repository (default: the bundled configs/models)",
    )
    s.add_argument(
        "--runtime-dir",
        type=Path,
        default=None,
        help="folder for the sockets (default: $ZINFER_RUNTIME_DIR, else $XDG_RUNTIME_DIR/zinfer, "
        "else a per-user folder in the temp dir)",
    )
    s.add_argument(
        "--tcp",
        type=_host_port,
        default=None,
        metavar="HOST:PORT",
        help="also accept clients over TCP (off by default; tensors then travel inline)",
    )
    s.add_argument(
        "--metrics",
        type=_metrics_address,
        default="127.0.0.1:8002",
        metavar="HOST:PORT",
        help="serve /metrics and the /v2/health endpoints here (default: %(default)s, Triton's metrics port; "
        "port 0: any free port; 'off': none)",
    )
    s.add_argument(
        "--no-metrics",
        action="store_const",
        const="off",
        dest="metrics",
        help="serve no metrics or health endpoints (same as --metrics off)",
    )
    s.add_argument(
        "--cache-bytes",
        dest="cli_cache_bytes",
        type=_number(int, 0),
        default=None,
        metavar="N",
        help="response cache size in bytes for models with response_cache { enable: true } (0: off)",
    )
    s.add_argument(
        "--rate-limit-resource",
        dest="cli_rate_limits",
        action="append",
        default=None,
        metavar="NAME:COUNT[:DEVICE]",
        help="a rate-limiter resource's count, per DEVICE (cpu, gpu:N) or for every device (repeatable)",
    )
    s.add_argument(
        "--heartbeat-interval",
        dest="cli_heartbeat_interval",
        type=_number(float, 0, strict=True),
        default=None,
        metavar="S",
        help="seconds between heartbeats of the broker and its workers (default 1)",
    )
    s.add_argument(
        "--heartbeat-liveness",
        dest="cli_heartbeat_liveness",
        type=_number(int, 1),
        default=None,
        metavar="N",
        help="intervals of silence after which a worker is declared dead (default 5)",
    )
    s.add_argument(
        "--socket-group",
        default=None,
        metavar="GROUP",
        help="let this group's members use the client socket (folder 0750, socket 0660)",
    )
    s.add_argument(
        "--curve-secret-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="server certificate (from 'zinfer keys'): TCP clients must then use CURVE",
    )
    s.add_argument(
        "--curve-allow",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder of client public certificates allowed to connect over TCP",
    )
    s.add_argument(
        "--max-tensor-bytes", type=_number(int, 1), default=1 << 32, help="largest tensor accepted, in bytes"
    )
    s.add_argument(
        "--max-batch-bytes",
        type=_number(int, 0),
        default=0,
        help="largest total of input bytes in one batch (default 0: twice --max-tensor-bytes)",
    )
    s.add_argument(
        "--drain-timeout",
        type=_number(float, 0),
        default=30.0,
        help="on SIGTERM or Ctrl-C, seconds to finish queued and running requests (twice: stop now)",
    )
    s.add_argument(
        "--exit-timeout", type=_number(float, 0), default=5.0, help="seconds to wait for workers on shutdown"
    )
    s.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    s.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "on-demand"],
        default="none",
        help="none: load every model at start; explicit: only --load-model ones, then load/unload on "
        "request; on-demand: load each model on its first request, unload the least recently used ones "
        "under --memory-budget",
    )
    _on_demand_flags(s)
    s.add_argument(
        "--load-model",
        action="append",
        default=None,
        metavar="NAME",
        help="with --model-control-mode explicit: a model to load at start (repeatable; '*' loads all)",
    )
    s.add_argument(
        "--trace-config",
        action="append",
        default=None,
        metavar="[MODE,]SETTING=VALUE",
        help="per-request tracing, Triton's syntax (repeatable): rate=N, level=OFF|TIMESTAMPS, count=N, "
        "mode=triton, triton,file=PATH, triton,log-frequency=N",
    )
    _limit_flags(s)
    _frontdoor_flags(s)
    if serve_defaults:
        s.set_defaults(**serve_defaults)
    for name, text in (("models", "list the repository's models and their state"),
                       ("load", "load or reload a model (explicit model control)"),
                       ("unload", "unload a model (explicit model control)")):  # fmt: skip
        c = sub.add_parser(name, help=text)
        c.add_argument("--url", default=None, help="server socket (default: the default runtime directory's)")
        c.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the server")
        if name != "models":
            c.add_argument("model")
    sub.add_parser("status", help="a terminal view of a running server (see 'zinfer status --help')")
    sub.add_parser("perf", help="a load generator in the spirit of perf_analyzer (see 'zinfer perf --help')")
    sub.add_parser("tune", help="sweep batching and instance settings on a live server (zinfer tune --help)")
    k = sub.add_parser("keys", help="write a CURVE key pair: NAME.key (public) and NAME.key_secret")
    k.add_argument("folder", type=Path)
    k.add_argument("name")
    return p


def _budget_item(value: str) -> str:
    try:
        parse_budget([value])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _on_demand_flags(s: argparse.ArgumentParser) -> None:
    """On-demand model control: the memory budgets and the idle time."""
    s.add_argument(
        "--memory-budget",
        action="append",
        type=_budget_item,
        default=None,
        metavar="MEMORY=BYTES",
        help="with --model-control-mode on-demand: bytes the loaded models may hold in host memory "
        "(host=8G, from worker RSS) or on a GPU (gpu0=20G, from each worker's device memory); repeatable",
    )
    s.add_argument(
        "--model-idle-unload",
        type=_number(float, 0, strict=True),
        default=None,
        metavar="S",
        help="with --model-control-mode on-demand: unload a model no request used for S seconds",
    )


def _frontdoor_flags(s: argparse.ArgumentParser) -> None:
    """The KServe v2 front door: Triton's gRPC and HTTP APIs in processes of their own."""
    g = s.add_argument_group("front door (KServe v2 / Triton gRPC and HTTP, for any Triton client)")
    g.add_argument(
        "--grpc",
        type=_host_port,
        default=None,
        metavar="HOST:PORT",
        help="serve Triton's gRPC API (inference.GRPCInferenceService) here (off by default)",
    )
    g.add_argument(
        "--http",
        type=_host_port,
        default=None,
        metavar="HOST:PORT",
        help="serve the KServe v2 HTTP/REST API here (off by default)",
    )
    g.add_argument(
        "--frontdoor-workers",
        type=_number(int, 1),
        default=1,
        metavar="N",
        help="front-door processes sharing the ports (SO_REUSEPORT; default 1)",
    )
    g.add_argument(
        "--frontdoor-cpus",
        type=_cpus,
        default=None,
        metavar="LIST",
        help='pin every front-door process to these CPUs, e.g. "1" or "2-3" (default: not pinned)',
    )
    g.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM certificate chain: the front door serves TLS (with --tls-key)",
    )
    g.add_argument("--tls-key", type=Path, default=None, metavar="FILE", help="PEM private key of --tls-cert")
    g.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM CA certificates: clients must present a certificate they signed (mutual TLS)",
    )
    g.add_argument(
        "--insecure-remote",
        action="store_true",
        default=False,
        help="allow a non-loopback --grpc/--http address without TLS (anyone who reaches it may "
        "run and load models)",
    )
    g.add_argument(
        "--allow-unknown-shm-callers",
        action="store_true",
        default=False,
        help="let front-door clients whose user the server cannot establish (not on this host's loopback "
        "or a Unix socket) register system shared memory, limited to segments of the server's own user "
        "(off: only clients whose uid the kernel names, each for segments it owns; root for any)",
    )
    g.add_argument(
        "--http-header-timeout",
        type=_number(float, 0.001),
        default=None,
        metavar="SECONDS",
        help="an HTTP request's line and headers must arrive within this of the connection (or of the "
        "request's first byte), else 408 and closed (default 10)",
    )
    g.add_argument(
        "--http-peer-connections",
        type=_number(int, 1),
        default=None,
        metavar="N",
        help="open HTTP connections per peer and front-door process: per uid for clients on this host, per "
        "address otherwise; more are closed at once (default 256; 1024 in all)",
    )


def _limit_flags(s: argparse.ArgumentParser) -> None:
    """What one client, one user or one connection may make the server hold (docs/reliability.md)."""
    g = s.add_argument_group("per-client limits (shared-memory regions, unread replies)")
    g.add_argument(
        "--max-region-bytes",
        type=_number(int, 0),
        default=None,
        metavar="N",
        help="largest shared-memory region a client may register, in bytes (default: a quarter of physical "
        "memory; 0: no limit); a larger one is refused with ResourceExhausted",
    )
    g.add_argument(
        "--max-user-region-bytes",
        type=_number(int, 0),
        default=None,
        metavar="N",
        help="bytes of shared-memory regions one user (uid) may have registered at once, over all its "
        "connections (default: half of physical memory; 0: no limit)",
    )
    g.add_argument(
        "--max-unread-reply-bytes",
        type=_number(int, 0),
        default=None,
        metavar="N",
        help="bytes of replies the server holds for one connection that is not reading them (default "
        "256 MiB; 0: no limit); past it the connection's new requests are refused with ResourceExhausted "
        "and replies that would pass it are replaced by that error",
    )
