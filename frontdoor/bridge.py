"""The front door's connection to the broker: one ``Bridge`` (one ``AsyncClient``) per front-door process.

Every method takes and returns the neutral records of ``bridge_records``; failures are zinfer's own
exceptions (``zinfer.client.errors``), which ``errors.triton_error`` turns into Triton's answers. Versions
are Triton's strings: ``""`` is the newest, anything else must be a non-negative integer.

::

    bridge = Bridge(url)
    reply = await bridge.infer(InferCall("add", (Tensor("A", "FP32", (1, 4), a), ...)))
    async for part in bridge.stream(call):  # a decoupled model's responses, the last with final=True
        ...
    await bridge.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version
from typing import Any

import numpy as np
import numpy.typing as npt

from zinfer.client import InferResult
from zinfer.client.dtypes import numpy_to_wire
from zinfer.client.errors import ConnectionFailed, InvalidArgument, RequestTimeout
from zinfer.client.protocol import TRACE_ID, TRACEPARENT

from .bridge_records import (
    BatchStat,
    Duration,
    InferCall,
    InferReply,
    ModelMetadata,
    ModelStatistics,
    RepositoryModel,
    ServerMetadata,
    Tensor,
    TensorSpec,
)
from .door_client import DoorClient
from .door_trace import DoorStamps
from .http_raw import RawPlan
from .shortcut import Shortcut, from_environment

__all__ = ["EXTENSIONS", "Bridge"]

EXTENSIONS = (
    "model_repository",
    "model_configuration",
    "model_repository(unload_dependents)",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "sequence",
    "classification",
    "trace",
)
"""Triton's protocol extensions the front door answers (server metadata lists them)."""

_DURATIONS = (
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
)  # fmt: skip


CONSUMED_PARAMETERS = frozenset(
    ("priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "binary_data_output")
)
"""Request parameters the door reads itself (fields of zinfer's request, or the door's own options); the
others, but for Triton's reserved ``triton_`` ones, go to the model."""


def model_parameters(parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parameters of a request that reach the model (None when there are none)."""
    if not parameters:
        return None
    out = {k: v for k, v in parameters.items() if k not in CONSUMED_PARAMETERS and k[:7] != "triton_"}
    return out or None


HEALTH_TIMEOUT_S = 5.0
"""How long a health call waits for the broker before it answers False (probes have short timeouts)."""


async def _health(call: Awaitable[bool]) -> bool:
    try:
        return await asyncio.wait_for(call, HEALTH_TIMEOUT_S)
    except (asyncio.TimeoutError, ConnectionFailed, RequestTimeout):
        return False


def _zinfer_version() -> str:
    try:
        return _package_version("zinfer")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def parse_version(model: str, version: str) -> int:
    """Triton's version string as zinfer's integer (0 is the newest). A malformed one is an invalid argument
    with Triton's text, which clients match on; a well-formed one the repository lacks is unknown later."""
    if version == "":
        return 0
    if not version.isascii() or not version.isdigit() or len(version) > 18:
        shown = version if len(version) <= 64 else version[:64] + "..."
        raise InvalidArgument(
            f"failed to get model version from specified version string '{shown}' (model '{model}'), "
            "version should be an integral value > 0"
        )
    return int(version)


class Bridge:
    """The broker as the front door sees it. ``url`` is the broker's client socket (``ipc://`` locally).

    ``timeout`` bounds each call's wait for the broker (an infer with its own ``timeout_us`` waits at most
    that long plus ``timeout`` seconds).
    """

    def __init__(self, url: str | None = None, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._client = DoorClient(url, timeout=timeout)
        self.url = self._client.url
        self._decoupled: dict[tuple[str, str], bool] = {}
        self.trace_stamps = DoorStamps(self._client.add_trace_stamps)  # the door's timestamps of a trace
        # benchmarks only (ZINFER_FRONTDOOR_SHORTCUT=1): answer from a recorded reply, without the broker
        self._shortcut: Shortcut[InferReply] | None = Shortcut() if from_environment() else None
        self._background: set[asyncio.Task[InferReply]] = set()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        """An array in the bridge's shared-memory arena: an input built there goes to the broker as a
        descriptor, without another copy. Plain memory when the broker is not local."""
        if not self.uses_shm:
            return np.empty(shape, dtype)
        return self._client.empty(shape, dtype)

    @property
    def uses_shm(self) -> bool:
        return self.url.startswith("ipc://")

    async def close(self) -> None:
        await self._client.close()

    # ------------------------------------------------------------------------------------ health

    async def server_live(self) -> bool:
        """False, not an error, when the broker does not answer within ``HEALTH_TIMEOUT_S``."""
        return await _health(self._client.is_server_live())

    async def server_ready(self) -> bool:
        return await _health(self._client.is_server_ready())

    async def model_ready(self, model: str, version: str = "") -> bool:
        try:
            number = parse_version(model, version)
        except InvalidArgument:
            return False
        return await _health(self._client.is_model_ready(model, number))

    def server_metadata(self) -> ServerMetadata:
        """Answered by the front door itself (no broker round trip)."""
        return ServerMetadata("zinfer", _zinfer_version(), EXTENSIONS)

    # ------------------------------------------------------------------------------------ models

    async def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        meta = await self._client.model_metadata(model, parse_version(model, version))
        return ModelMetadata(
            name=str(meta["name"]),
            versions=tuple(str(v) for v in meta.get("versions", ())),
            platform=str(meta.get("platform", "")),
            max_batch_size=int(meta.get("max_batch_size", 0)),
            inputs=_specs(meta.get("inputs", ())),
            outputs=_specs(meta.get("outputs", ())),
        )

    async def model_config(self, model: str, version: str = "") -> Mapping[str, Any]:
        """The parsed ``config.pbtxt`` in Triton's JSON form of its ``ModelConfig`` message (the HTTP
        ``/config`` answer as it is; gRPC parses it into ``model_config_pb2.ModelConfig``)."""
        config: dict[str, Any] = await self._client.model_config(model, parse_version(model, version))
        return config

    def known_decoupled(self, model: str, version: str = "") -> bool | None:
        """``is_decoupled``'s cached answer, without a call (None when not known yet)."""
        return self._decoupled.get((model, version))

    async def is_decoupled(self, model: str, version: str = "") -> bool:
        """Whether the model's transaction policy is decoupled (several responses per request): a unary
        infer refuses such a model, as Triton does. Cached per model version; a load or unload through this
        bridge forgets the model."""
        key = (model, version)
        found = self._decoupled.get(key)
        if found is None:
            policy = (await self.model_config(model, version)).get("model_transaction_policy") or {}
            found = self._decoupled[key] = bool(policy.get("decoupled", False))
            if len(self._decoupled) > 4096:  # bounded whatever names callers send
                self._decoupled.clear()
        return found

    async def statistics(self, model: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        """Every loaded model's statistics when ``model`` is empty, else that model's (all its versions
        when ``version`` is empty)."""
        number = parse_version(model, version) if model else 0
        body = await self._client.statistics(model or None, number)
        return tuple(_statistics(s) for s in body.get("model_stats", ()))

    async def repository_index(self, ready_only: bool = False) -> tuple[RepositoryModel, ...]:
        entries = await self._client.repository_index()
        models = tuple(
            RepositoryModel(
                name=str(e.get("name", "")),
                version=str(e.get("version", "")),
                state=str(e.get("state", "")),
                reason=str(e.get("reason", "")),
            )
            for e in entries
        )
        return tuple(m for m in models if m.state == "READY") if ready_only else models

    async def trace_settings(
        self, model: str, settings: Mapping[str, Any] | None = None
    ) -> dict[str, str | list[str]]:
        """Triton's trace extension: the settings in force for ``model`` ("": the global ones), after
        ``settings`` are applied when given (refused whole with ``InvalidArgument`` if one is bad)."""
        if settings is None:
            return await self._client.get_trace_settings(model or None)
        return await self._client.update_trace_settings(model or None, settings)

    async def load(self, model: str, config: str = "", files: Mapping[str, bytes] | None = None) -> None:
        """Load ``model``; ``config`` (JSON) and ``files`` are Triton's load overrides."""
        self._forget(model)
        await self._client.load_model(model, config=config or None, files=files)

    async def unload(self, model: str) -> None:
        self._forget(model)
        await self._client.unload_model(model)

    def _forget(self, model: str) -> None:
        self._decoupled = {k: v for k, v in self._decoupled.items() if k[0] != model}

    # ------------------------------------------------------------------------------------ inference

    async def infer(self, call: InferCall) -> InferReply:
        shortcut = self._shortcut
        if shortcut is not None:
            recorded = shortcut.recorded(call.model)
            if recorded is None:
                reply = await self._infer(call)
                shortcut.record(call.model, reply)
                return reply
            if shortcut.forward_now():
                task = asyncio.ensure_future(self._infer(call))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            return InferReply(recorded.model, recorded.version, call.request_id, recorded.outputs)
        parameters = _with_trace(model_parameters(call.parameters), call.traceparent)  # ``_infer``, inline:
        version = parse_version(call.model, call.version)  # one coroutine less per request
        return await self._client.infer_call(call, version, parameters, self._wait(call))

    def raw_plan(self, call: InferCall) -> RawPlan | None:
        """The HTTP door's direct path's plan for requests like ``call``, which was just answered the usual
        way (``http_raw``); None where it cannot be made (a benchmark's recorded replies, or the model's
        information is not held now)."""
        if self._shortcut is not None:
            return None
        parameters = _with_trace(model_parameters(call.parameters), call.traceparent)
        version = parse_version(call.model, call.version)
        return self._client.raw_plan(call, version, parameters, self._wait(call))

    @property
    def door_client(self) -> DoorClient:
        """The connection to the broker: the direct path (``http_direct``) calls its ``infer_raw``
        itself, one coroutine less per request."""
        return self._client

    async def _infer(self, call: InferCall) -> InferReply:
        parameters = _with_trace(model_parameters(call.parameters), call.traceparent)
        version = parse_version(call.model, call.version)
        return await self._client.infer_call(call, version, parameters, self._wait(call))

    async def stream(self, call: InferCall) -> AsyncIterator[InferReply]:
        """A decoupled model's responses to one request as they come; a plain model's one response. The
        last has ``final=True``. Leaving the loop early cancels the request in the broker."""
        responses: AsyncGenerator[InferResult, None] = self._client.stream(  # type: ignore[assignment]
            call.model,
            {t.name: t.data for t in call.inputs},
            outputs=list(call.outputs) or None,
            request_id=call.request_id or None,
            model_version=parse_version(call.model, call.version),
            client_timeout=self._wait(call),
            priority=call.priority,
            timeout=call.timeout_us or None,
            sequence_id=call.sequence_id,
            sequence_start=call.sequence_start,
            sequence_end=call.sequence_end,
            parameters=_with_trace(model_parameters(call.parameters), call.traceparent),
        )
        try:
            async for result in responses:
                yield _reply(result, call.request_id)
        finally:
            await responses.aclose()

    def _wait(self, call: InferCall) -> float:
        return self.timeout + call.timeout_us / 1e6


def _with_trace(parameters: dict[str, Any] | None, traceparent: str) -> dict[str, Any] | None:
    if not traceparent:
        return parameters
    return {**(parameters or {}), TRACEPARENT: traceparent}


def _specs(items: Sequence[Mapping[str, Any]]) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(str(t["name"]), str(t["datatype"]), tuple(int(d) for d in t["shape"])) for t in items
    )


def _statistics(s: Mapping[str, Any]) -> ModelStatistics:
    stats = s.get("inference_stats", {})
    return ModelStatistics(
        name=str(s["name"]),
        version=str(s["version"]),
        last_inference_ms=int(s.get("last_inference", 0)),
        inference_count=int(s.get("inference_count", 0)),
        execution_count=int(s.get("execution_count", 0)),
        durations={
            k: Duration(int(stats[k]["count"]), int(stats[k]["ns"])) for k in _DURATIONS if k in stats
        },
        batch_stats=tuple(BatchStat(int(b["batch_size"]), int(b["count"])) for b in s.get("batch_stats", ())),
    )


def _reply(result: InferResult, request_id: str) -> InferReply:
    outputs = []
    for name in result.output_names:
        data = result.as_numpy(name)
        spec = result.get_output(name)
        datatype = str(spec["datatype"]) if spec else numpy_to_wire(data.dtype)
        outputs.append(Tensor(name, datatype, tuple(data.shape), data))
    params = dict(result.parameters)
    trace = params.pop(TRACE_ID, "") if params else ""  # the broker traced it: the door adds its stamps
    return InferReply(result.model_name, str(result.model_version), request_id, tuple(outputs), result.final,
                      params, str(trace))  # fmt: skip
