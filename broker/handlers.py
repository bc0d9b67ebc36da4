"""Answers to the client commands other than INFER, in two roles, each handed only what it uses.

``Queries`` answers from the server's state and changes nothing: liveness and readiness, a model's
readiness, metadata and config, statistics, the repository index and the status table. ``Controls`` changes
something for its caller: a request cancelled, a region registered or unregistered, a model loaded or
unloaded, the trace settings changed. Each reads its header through the command's record in
``zinfer.client.protocol``; a malformed field raises ``ProtocolError`` and a refusal a ``ServerError``, which
the server answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from zinfer.client import dtypes, protocol
from zinfer.client.errors import InvalidArgument, ProtocolError, ServerError
from zinfer.client.protocol import Command
from zinfer.modelconfig.model_config import ModelConfig

from .model_state import ModelState
from .outbox import Outbox
from .tracing import Tracer

if TYPE_CHECKING:
    from .region_intake import RegionIntake
    from .regions import Region, RegionTable
    from .registry import ModelRegistry

QUERIES = frozenset({
    Command.SERVER_LIVE, Command.SERVER_READY, Command.MODEL_READY, Command.MODEL_METADATA,
    Command.MODEL_CONFIG, Command.STATISTICS, Command.REPOSITORY_INDEX, Command.SERVER_STATUS,
})  # fmt: skip

LATER: Final = object()
"""What ``Controls.handle`` and ``Queries.answer`` return for a command answered later (LOAD: once the model
is ready or failed; MODEL_READY of a model with its own is_ready(): once its instances answered)."""


def metadata(state: ModelState, versions: list[int]) -> dict[str, Any]:
    """The KServe v2 model metadata of one model version."""
    return config_metadata(state.config, versions)


def config_metadata(cfg: ModelConfig, versions: list[int]) -> dict[str, Any]:
    """The KServe v2 model metadata of a model's config (loaded or not: on-demand control answers it for a
    model before its first request loads it)."""
    batch = [-1] if cfg.max_batch_size > 0 else []

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {"name": t.name, "datatype": dtypes.config_to_wire(t.data_type), "shape": batch + list(t.dims)}
            for t in specs
        ]

    return {
        "name": cfg.name,
        "versions": [str(v) for v in versions],
        "platform": cfg.platform or cfg.backend,
        "max_batch_size": cfg.max_batch_size,
        "inputs": tensors(cfg.input),
        "outputs": tensors(cfg.output),
    }


class Queries:
    def __init__(
        self,
        registry: ModelRegistry,
        status: Callable[[], dict[str, Any]],
        index: Callable[[], list[dict[str, Any]]],
        serving_ready: Callable[[], bool],
        ask_ready: Callable[[ModelState, bytes, str], None],
    ) -> None:
        self.registry = registry
        self.status = status  # the status table (``Observer.status``)
        self.index = index  # the repository index (``ModelControl.index``)
        self.serving_ready = serving_ready  # the server's readiness (``Broker.serving_ready``)
        # a readiness query of a model with its own is_ready(), answered later (``ReadinessWaits.ask``)
        self.ask_ready = ask_ready

    def answer(self, command: Command, header: dict[str, Any], client: bytes = b"") -> Any:
        """The answer's body, or ``LATER`` for a readiness query the model's own is_ready() answers."""
        if command == Command.SERVER_LIVE:
            return True
        if command == Command.SERVER_READY:
            return self.serving_ready()
        if command == Command.MODEL_READY:
            try:  # anything wrong with the question is a model that is not ready
                q = protocol.model_query_from_wire(header)
                state = self.registry.resolve(q.model, q.version)
                if not state.own_readiness or not state.ready:
                    return state.ready
                # a Triton model's own is_ready(): a fresh call in every instance (ReadinessWaits)
                self.ask_ready(state, client, protocol.request_id_of(header))
                return LATER
            except (ServerError, ProtocolError):
                return False
        if command in (Command.MODEL_METADATA, Command.MODEL_CONFIG):
            q = protocol.model_query_from_wire(header)
            state = self.registry.resolve(q.model, q.version)
            if command == Command.MODEL_CONFIG:
                return state.config.to_dict()
            return metadata(state, sorted(self.registry.models[state.name]))
        if command == Command.STATISTICS:
            return self._statistics(protocol.statistics_from_wire(header))
        if command == Command.SERVER_STATUS:
            return self.status()
        if command == Command.REPOSITORY_INDEX:
            return self.index()
        raise InvalidArgument(f"command {command.name} is not supported")

    def _statistics(self, q: protocol.StatisticsQuery) -> dict[str, Any]:
        if q.model is not None:
            state = self.registry.resolve(q.model, q.version)
            states = [state] if q.version else list(self.registry.models[state.name].values())
        else:
            states = list(self.registry.serving())
        return {
            "model_stats": [
                {"name": s.name, "version": str(s.version), **s.stats.to_dict(), **_adaptive(s)}
                for s in sorted(states, key=lambda s: (s.name, s.version))
            ]
        }


class Controls:
    def __init__(
        self,
        cancel: Callable[[bytes, str], str],
        regions: RegionTable,
        intake: Callable[[], RegionIntake | None],
        drop_region: Callable[[Region], None],
        load: Callable[..., None],
        unload: Callable[[str], None],
        trace: Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cancel = cancel  # a caller's request out of its queue (``Admission.cancel``)
        self.regions = regions
        self.intake = intake  # where local clients hand over segments (None until the server starts)
        self.drop_region = drop_region  # a region is gone: workers unmap it (``Broker.drop_region``)
        self.load = load  # ``ModelControl.load``: the answer goes out once the model is ready or failed
        self.unload = unload  # ``ModelControl.unload``
        self.trace = trace or Tracer()  # the server's trace settings (``Observer.tracer``)
        self.clock = clock

    def handle(self, identity: bytes, command: Command, header: dict[str, Any]) -> Any:
        """The answer's body, or ``LATER`` when the command is answered later."""
        if command == Command.CANCEL:
            c = protocol.cancel_command_from_wire(header)
            return {"state": self.cancel(identity, c.target)}
        if command == Command.REGISTER:
            return self._register(identity, header)
        if command == Command.UNREGISTER:
            u = protocol.unregister_from_wire(header)
            self.drop_region(self.regions.unregister(identity, u.name))
            return None
        if command == Command.LOAD:
            change = protocol.model_change_from_wire(header)
            self.load(change.model, self.clock(), identity, change.request_id, change.config, change.files)
            return LATER
        if command == Command.UNLOAD:
            change = protocol.model_change_from_wire(header)
            self.unload(change.model)
            return {"model": change.model}
        if command == Command.TRACE_SETTING:
            return self._trace_setting(protocol.trace_setting_from_wire(header))
        raise InvalidArgument(f"command {command.name} is not supported")

    def _trace_setting(self, change: protocol.TraceSettingChange) -> dict[str, Any]:
        """Triton's trace extension: the settings in force (for ``change.model``, or the global ones),
        after the change if there is one; a bad change is refused whole. The door's timestamps of a
        traced request it answered (``change.trace``) are added to that trace."""
        if change.trace:
            return {"added": self.trace.door_stamps(change.trace, change.stamps)}
        if change.settings is None:
            return {"settings": self.trace.get(change.model or None)}
        try:
            return {"settings": self.trace.set(change.model or None, change.settings)}
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def _register(self, identity: bytes, header: dict[str, Any]) -> dict[str, Any]:
        """Claim a segment handed over on the region socket (see ``region_intake``) for this connection."""
        intake = self.intake()
        if not Outbox.is_local(identity) or intake is None:
            raise InvalidArgument("shared-memory regions can be registered only over the local socket")
        r = protocol.register_from_wire(header)
        region, replaced = self.regions.register(identity, r.name, intake.claim(r.token))
        if replaced is not None:  # the same connection registered the name again: workers must remap
            self.drop_region(replaced)
        return {"size": region.size}


def _adaptive(state: ModelState) -> dict[str, Any]:
    """The adaptive batcher's view (latency target mode only): its target, what it learned and observed,
    and whether the target is out of reach."""
    stats = state.scheduler.stats()
    a = stats.adaptive if stats is not None else None
    if a is None:
        return {}
    return {
        "adaptive": {
            "target_us": round(a.target_s * 1e6),
            "arrival_rate": a.arrival_rate,
            "exec_fixed_us": None if a.exec_fixed_s is None else a.exec_fixed_s * 1e6,
            "exec_per_item_us": None if a.exec_per_item_s is None else a.exec_per_item_s * 1e6,
            "slack_us": a.slack_s * 1e6,
            "observed": a.observed,
            "observed_misses": a.observed_misses,
            "observed_p99_us": None if a.observed_p99_s is None else a.observed_p99_s * 1e6,
            "target_misses": a.target_misses,
            "target_unreachable": a.target_unreachable,
        }
    }
