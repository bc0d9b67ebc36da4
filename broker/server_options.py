"""The server's options: one frozen record, built by ``cli.server_options`` from the flags and the
configuration file (``server_config``), read by the broker and the parts it builds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .memory_budget import MemoryBudget
from .regions import default_limits
from .reply_backlog import DEFAULT_MAX_UNREAD_REPLY_BYTES
from .trace_settings import TraceSettings
from .validation import DEFAULT_MAX_TENSOR_BYTES

__all__ = ["ServerOptions"]


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path
    runtime_dir: Path
    tcp: str | None = None
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES
    max_batch_bytes: int = 2 * DEFAULT_MAX_TENSOR_BYTES  # input bytes of one batch
    exit_timeout_s: float = 5.0
    drain_timeout_s: float = 30.0
    heartbeat_interval_s: float = 1.0  # workers and broker heartbeat each other this often
    heartbeat_liveness: int = 5  # intervals of silence after which a worker is declared dead
    gpus: tuple[int, ...] | None = None  # GPUs instances may use (indices after CUDA_VISIBLE_DEVICES)
    cpu_affinity: Mapping[str, tuple[frozenset[int], ...]] = field(default_factory=dict)  # by model or "*"
    # largest shared-memory region a client may register, and bytes of one user's regions together (0: no
    # limit); by default a quarter and a half of physical memory
    max_region_bytes: int = field(default_factory=lambda: default_limits()[0])
    max_user_region_bytes: int = field(default_factory=lambda: default_limits()[1])
    # bytes of replies held for one connection that does not read them (0: no limit)
    max_unread_reply_bytes: int = DEFAULT_MAX_UNREAD_REPLY_BYTES
    socket_group: str | None = None  # a group whose members may use the client socket
    metrics: str | None = "127.0.0.1:8002"  # HOST:PORT of /metrics and the health endpoints; None = off
    curve_secret_key: Path | None = None  # server certificate (zinfer keys); enables CURVE on --tcp
    curve_allow: Path | None = None  # folder of the client public certificates allowed to connect
    log_level: str = "INFO"
    # "none": load everything at start; "explicit": load/unload on request; "on-demand": load on first
    # request, unload under the memory budget (``on_demand``)
    model_control_mode: str = "none"
    memory_budget: MemoryBudget = field(default_factory=MemoryBudget)  # on-demand: bytes per memory
    model_idle_unload_s: float | None = None  # on-demand: unload a model unused for this long
    load_models: tuple[str, ...] = ()  # with "explicit": the models to load at start ("*" = all)
    cache_bytes: int = 0  # size of the response cache in bytes; 0 = no cache
    # rate limiter pool sizes: (resource, count, device "cpu"/"gpu:N" or None for every device and global)
    rate_limit_resources: tuple[tuple[str, int, str | None], ...] = ()
    trace: TraceSettings = field(default_factory=TraceSettings)  # --trace-config (Triton's settings)
