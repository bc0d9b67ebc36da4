"""Answers to the client commands other than INFER: health, metadata, config, statistics, regions."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zinfer.client import dtypes
from zinfer.client.errors import InvalidArgument, ProtocolError
from zinfer.client.protocol import Command

from .model_state import ModelState
from .outbox import Outbox

if TYPE_CHECKING:
    from .admission import Admission
    from .model_control import ModelControl
    from .observer import Observer
    from .region_intake import RegionIntake
    from .regions import Region, RegionTable
    from .registry import ModelRegistry

log = logging.getLogger(__name__)


def _str(header: dict[str, Any], key: str) -> str:
    value = header.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        raise ProtocolError(f"field '{key}' must be a string of 1 to 256 characters")
    return value


def _version(header: dict[str, Any]) -> int:
    value = header.get("version", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError("field 'version' must be a non-negative integer")
    return value


def metadata(state: ModelState, versions: list[int]) -> dict[str, Any]:
    """The KServe v2 model metadata of one model version."""
    cfg = state.config
    batch = [-1] if cfg.max_batch_size > 0 else []

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {"name": t.name, "datatype": dtypes.config_to_wire(t.data_type), "shape": batch + list(t.dims)}
            for t in specs
        ]

    return {
        "name": state.name,
        "versions": [str(v) for v in versions],
        "platform": cfg.platform or cfg.backend,
        "max_batch_size": cfg.max_batch_size,
        "inputs": tensors(cfg.input),
        "outputs": tensors(cfg.output),
    }


class ClientHandlers:
    def __init__(
        self,
        registry: ModelRegistry,
        regions: RegionTable,
        admission: Admission,
        observer: Observer,
        control: ModelControl,
        intake: Callable[[], RegionIntake | None],
        drop_region: Callable[[Region], None],
        serving_ready: Callable[[], bool],
    ) -> None:
        self.registry = registry
        self.regions = regions
        self.admission = admission  # CANCEL
        self.observer = observer  # SERVER_STATUS
        self.control = control  # REPOSITORY_INDEX, UNLOAD
        self.intake = intake  # where local clients hand over segments (None until the server starts)
        self.drop_region = drop_region  # a region is gone: workers unmap it (``Broker.drop_region``)
        self.serving_ready = serving_ready  # the server's readiness (``Broker.serving_ready``)

    def handle(self, identity: bytes, command: Command, header: dict[str, Any]) -> Any:
        if command == Command.SERVER_LIVE:
            return True
        if command == Command.SERVER_READY:
            return self.serving_ready()
        if command == Command.MODEL_READY:
            try:
                return self.registry.resolve(_str(header, "model"), _version(header)).ready
            except Exception:
                return False
        if command == Command.MODEL_METADATA:
            state = self.registry.resolve(_str(header, "model"), _version(header))
            return metadata(state, sorted(self.registry.models[state.name]))
        if command == Command.MODEL_CONFIG:
            return self.registry.resolve(_str(header, "model"), _version(header)).config.to_dict()
        if command == Command.STATISTICS:
            return self._statistics(header)
        if command == Command.CANCEL:
            return {"state": self.admission.cancel(identity, _str(header, "target"))}
        if command == Command.SERVER_STATUS:
            return self.observer.status()
        if command == Command.REPOSITORY_INDEX:
            return self.control.index()
        if command == Command.UNLOAD:
            self.control.unload(_str(header, "model"))
            return {"model": header["model"]}
        if command == Command.REGISTER:
            return self._register(identity, header)
        if command == Command.UNREGISTER:
            region = self.regions.unregister(identity, _str(header, "name"))
            self.drop_region(region)
            return None
        raise InvalidArgument(f"command {command.name} is not supported")

    def _register(self, identity: bytes, header: dict[str, Any]) -> dict[str, Any]:
        """Claim a segment handed over on the region socket (see ``region_intake``) for this connection."""
        intake = self.intake()
        if not Outbox.is_local(identity) or intake is None:
            raise InvalidArgument("shared-memory regions can be registered only over the local socket")
        name = _str(header, "name")
        handed = intake.claim(header.get("token"))
        region, replaced = self.regions.register(identity, name, handed)
        if replaced is not None:  # the same connection registered the name again: workers must remap
            self.drop_region(replaced)
        return {"size": region.size}

    def _statistics(self, header: dict[str, Any]) -> dict[str, Any]:
        if "model" in header:
            version = _version(header)
            state = self.registry.resolve(_str(header, "model"), version)
            states = [state] if version else list(self.registry.models[state.name].values())
        else:
            states = list(self.registry.serving())
        return {
            "model_stats": [
                {"name": s.name, "version": str(s.version), **s.stats.to_dict(), **_adaptive(s)}
                for s in sorted(states, key=lambda s: (s.name, s.version))
            ]
        }


def _adaptive(state: ModelState) -> dict[str, Any]:
    """The adaptive batcher's view (latency target mode only): its target, what it learned and observed,
    and whether the target is out of reach."""
    a = state.batcher.stats().adaptive
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
