"""Loading, reloading and unloading models while the server runs (Triton's explicit model control).

A load starts the new version's workers beside the old ones; only when every new instance is ready do the
new states take over, so requests in flight never fail. If any instance fails to load (or the load takes
longer than ``LOAD_TIMEOUT_S``), the new workers stop and the old model keeps serving; the reason goes to
the caller and to the repository index. Replaced and unloaded states retire: no new requests, the queue
drains, then their workers are told to stop.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zinfer.client.errors import InvalidArgument, NotFound, ServerError, Status, Unavailable, Unsupported
from zinfer.client.protocol import Command, Reply
from zinfer.client.worker_protocol import Shutdown, empty_to_wire
from zinfer.modelconfig.repository import load_model_entry, model_folder_names

from .batching.rate_limiter import RateLimiter
from .instance_pool import InstancePool
from .limited_dispatch import ModelKey, model_key
from .load_override import override_folder
from .model_state import ModelState
from .outbox import Outbox
from .registry import ModelRegistry

if TYPE_CHECKING:
    from .server_options import ServerOptions

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 120.0
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


@dataclass
class PendingLoad:
    name: str
    states: list[ModelState]
    client: bytes | None  # who asked (None at startup)
    request_id: str
    deadline: float


class ModelControl:
    def __init__(
        self,
        options: ServerOptions,
        registry: ModelRegistry,
        pool: InstancePool,
        outbox: Outbox,
        attach: Callable[[ModelState], None],
        start_instances: Callable[[ModelState, list[str]], None],
        limiter: RateLimiter[bytes, ModelKey],
    ) -> None:
        self.options = options
        self.registry = registry
        self.pool = pool
        self.outbox = outbox
        self.attach = attach  # a new state's metric series (``Observer.attach``)
        self.start_instances = start_instances  # a worker per device (``Broker.start_instances``)
        self.limiter = limiter  # a retired generation's turns at the resources are dropped with it
        self.pending: list[PendingLoad] = []
        self._stopping: set[int] = set()  # ids of retiring states whose workers were told to stop

    @property
    def explicit(self) -> bool:
        """Load and unload on request: explicit mode, and on-demand mode (``on_demand``) too."""
        return self.options.model_control_mode in ("explicit", "on-demand")

    def load(
        self,
        name: str,
        now: float,
        client: bytes | None = None,
        request_id: str = "",
        config: str = "",
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Start loading ``name``; the reply goes to ``client`` once it is ready or has failed. ``config``
        and ``files`` are Triton's load overrides (``load_override``)."""
        if client is not None and not self.explicit:
            raise Unsupported("model control is off: start the server with --model-control-mode explicit")
        if not _MODEL_NAME.fullmatch(name) or name in (".", ".."):
            raise InvalidArgument(  # Triton's text, which clients match on
                f"failed to load '{name}': Invalid stub name: contains invalid characters (a model name is "
                "letters, digits, '_', '.' and '-')"
            )
        model_dir = self.options.model_repository / name
        if config or files:
            model_dir = override_folder(self.options.runtime_dir, model_dir, name, config, files or {})
        elif not model_dir.is_dir():
            raise NotFound(f"no model '{name}' in the repository")
        self.registry.known.add(name)
        if any(p.name == name for p in self.pending):
            raise Unavailable(f"model '{name}' is already being loaded")
        prepared, error = self.registry.prepare(load_model_entry(model_dir), self.options.max_batch_bytes)
        if error is not None:
            self.registry.fail(name, error)
            log.error("event=model_load_failed model=%s error=%r", name, error)
            raise Unavailable(f"model '{name}' failed to load: {error}")
        states = [state for state, _ in prepared]
        for state in states:
            self.attach(state)
        self.registry.loading.add(name)
        self.pending.append(PendingLoad(name, states, client, request_id, now + LOAD_TIMEOUT_S))
        for state, devices in prepared:
            self.start_instances(state, devices)
        log.info("event=model_loading model=%s versions=%s", name, ",".join(str(s.version) for s in states))

    def unload(self, name: str) -> None:
        if not self.explicit:
            raise Unsupported("model control is off: start the server with --model-control-mode explicit")
        if not self.registry.remove(name):
            if self.registry.load_errors.pop(name, None) is not None:
                log.info("event=model_unloaded model=%s was=failed", name)  # no longer wanted: not "failed"
                return
            raise NotFound(f"model '{name}' is not loaded")
        log.info("event=model_unloading model=%s", name)

    def poll(self, now: float) -> None:
        """Finish loads whose instances are all ready or one has failed; stop drained retiring states."""
        for load in list(self.pending):
            failed = next((s.error for s in load.states if s.error is not None), None)
            if failed is None and now > load.deadline:
                failed = f"not ready within {LOAD_TIMEOUT_S:.0f} s"
            if failed is not None:
                self.pending.remove(load)
                self.registry.loading.discard(load.name)
                self.registry.retire(load.states)
                self.registry.fail(load.name, failed)
                log.error("event=model_load_failed model=%s error=%r", load.name, failed)
                self._answer(load, Unavailable(f"model '{load.name}' failed to load: {failed}"))
            elif all(self.pool.started(s) for s in load.states):
                self.pending.remove(load)
                self.registry.loading.discard(load.name)
                self.registry.install(load.name, load.states)
                log.info("event=model_loaded model=%s", load.name)
                self._answer(load, None)
        self._stop_drained()

    def _answer(self, load: PendingLoad, error: ServerError | None) -> None:
        if load.client is None:
            return
        if error is None:
            self.outbox.send_client(load.client, Reply(load.request_id, Status.OK, body={"model": load.name}))
        else:
            self.outbox.send_client(load.client, Reply(load.request_id, error.status, error.wire_text()))

    def _stop_drained(self) -> None:
        registry = self.registry
        for state in list(registry.retiring):
            if state.queued or self.pool.busy(state):
                continue
            if id(state) not in self._stopping:
                self._stopping.add(id(state))
                for identity in self.pool.retire(state):
                    self.outbox.send_worker(identity, Command.W_SHUTDOWN, empty_to_wire(Shutdown()))
            if not self.pool.workers_of(state):
                registry.drop_retired(state)
                self.limiter.forget_model(model_key(state))
                self._stopping.discard(id(state))

    def index(self) -> list[dict[str, Any]]:
        """Every model of the repository with its state, loaded or not (Triton's repository index)."""
        registry = self.registry
        rows: list[dict[str, Any]] = []
        names = set(registry.models) | set(registry.load_errors) | {p.name for p in self.pending}
        repo = self.options.model_repository
        if repo.is_dir():
            names |= set(model_folder_names(repo, self.options.runtime_dir))
            registry.known |= names
        loading = {p.name for p in self.pending}
        for name in sorted(names):
            versions = registry.models.get(name)
            if versions:
                for v, s in sorted(versions.items()):
                    reason = s.error or registry.reload_errors.get(name, "")
                    rows.append({"name": name, "version": str(v), "state": s.state(), "reason": reason})
            elif name in loading:
                rows.append({"name": name, "version": "", "state": "LOADING", "reason": ""})
            elif name in registry.load_errors:
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE",
                             "reason": registry.load_errors[name]})  # fmt: skip
            else:
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"})
        return rows
