"""``inference.GRPCInferenceService`` on grpc.aio: Triton's gRPC API answered through the bridge.

Every method answers any failure with Triton's status code and text (``errors.triton_error``) and never
lets an exception leave the process's loop. CUDA shared memory answers as a Triton built without GPUs
(``cudashm``); TraceSetting is Triton's trace extension; log settings answer UNIMPLEMENTED with what zinfer
offers instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, NoReturn, TypeVar

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from zinfer.client.errors import InvalidArgument

from . import cudashm, grpc_metadata, grpc_request, grpc_response
from . import grpc_convert as convert
from .bridge_records import InferCall
from .classification import classify_reply
from .door import FrontDoor, grpc_peer_uid
from .door_trace import DoorStamps
from .errors import FrontDoorError, TritonError, triton_error
from .sysshm import CallerShm

log = logging.getLogger(__name__)

T = TypeVar("T")
_NO_REGIONS: Mapping[str, tuple[str, int, int]] = MappingProxyType({})
_STREAM_QUEUE = 64  # responses waiting for a slow stream reader before its requests wait too


def _forget(last: dict[int | str, asyncio.Task[None]], sequence: int | str, task: asyncio.Task[None]) -> None:
    """A sequence's last request is done: nothing needs to wait for it (the stream keeps no entry for it)."""
    if last.get(sequence) is task:
        del last[sequence]


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.bridge = door.bridge
        self._headers: grpc_request.Headers = {}  # ModelInfer's request headers seen (grpc_request)
        self._last: grpc_request.Last = []  # and the last one read
        self._written: grpc_response.Written = {}  # ModelInfer's kinds of reply written (grpc_response)

    def _shm(self, context: Any, later: list[Callable[[], None]] | None = None) -> CallerShm:
        """The shm registry as this call's peer sees it (uid looked up when first needed; later: copies)."""
        uid_of = lambda: grpc_peer_uid(str(context.peer()), self.door.options.grpc)  # noqa: E731
        return self.door.shm.caller(None, uid_of, later)

    async def _answer(
        self, context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]
    ) -> T:
        try:
            result = await call()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure becomes Triton's answer
            await self._abort(context, exc)
        self.door.counters.record("grpc", True)
        return result

    async def _abort(self, context: Any, exc: Exception) -> NoReturn:
        """End the call with Triton's status and text for ``exc``."""
        answer = triton_error(exc)
        if answer.grpc_code == "INTERNAL" and not str(exc):
            log.exception("event=frontdoor_error protocol=grpc")
        self.door.counters.record("grpc", False)
        await context.abort(getattr(grpc.StatusCode, answer.grpc_code), answer.message)
        raise AssertionError("unreachable") from None  # abort raises

    # ------------------------------------------------------------------------------------ health

    async def ServerLive(self, request: Any, context: Any) -> service_pb2.ServerLiveResponse:
        async def run() -> service_pb2.ServerLiveResponse:
            return service_pb2.ServerLiveResponse(live=await self.bridge.server_live())

        return await self._answer(context, run)

    async def ServerReady(self, request: Any, context: Any) -> service_pb2.ServerReadyResponse:
        async def run() -> service_pb2.ServerReadyResponse:
            return service_pb2.ServerReadyResponse(ready=await self.bridge.server_ready())

        return await self._answer(context, run)

    async def ModelReady(self, request: Any, context: Any) -> service_pb2.ModelReadyResponse:
        async def run() -> service_pb2.ModelReadyResponse:
            ready = await self.bridge.model_ready(request.name, request.version)
            return service_pb2.ModelReadyResponse(ready=ready)

        return await self._answer(context, run)

    async def ServerMetadata(self, request: Any, context: Any) -> service_pb2.ServerMetadataResponse:
        async def run() -> service_pb2.ServerMetadataResponse:
            meta = self.bridge.server_metadata()
            return service_pb2.ServerMetadataResponse(
                name=meta.name, version=meta.version, extensions=list(meta.extensions)
            )

        return await self._answer(context, run)

    # ------------------------------------------------------------------------------------ models

    async def ModelMetadata(self, request: Any, context: Any) -> service_pb2.ModelMetadataResponse:
        async def run() -> service_pb2.ModelMetadataResponse:
            return convert.metadata_message(await self.bridge.model_metadata(request.name, request.version))

        return await self._answer(context, run)

    async def ModelConfig(self, request: Any, context: Any) -> service_pb2.ModelConfigResponse:
        async def run() -> service_pb2.ModelConfigResponse:
            return convert.config_message(await self.bridge.model_config(request.name, request.version))

        return await self._answer(context, run)

    async def ModelStatistics(self, request: Any, context: Any) -> service_pb2.ModelStatisticsResponse:
        async def run() -> service_pb2.ModelStatisticsResponse:
            return convert.statistics_message(await self.bridge.statistics(request.name, request.version))

        return await self._answer(context, run)

    async def RepositoryIndex(self, request: Any, context: Any) -> service_pb2.RepositoryIndexResponse:
        async def run() -> service_pb2.RepositoryIndexResponse:
            return convert.repository_message(await self.bridge.repository_index(request.ready))

        return await self._answer(context, run)

    async def RepositoryModelLoad(
        self, request: Any, context: Any
    ) -> service_pb2.RepositoryModelLoadResponse:
        async def run() -> service_pb2.RepositoryModelLoadResponse:
            config, files = convert.load_overrides(request.parameters)
            await self.bridge.load(request.model_name, config, files)
            return service_pb2.RepositoryModelLoadResponse()

        return await self._answer(context, run)

    async def RepositoryModelUnload(
        self, request: Any, context: Any
    ) -> service_pb2.RepositoryModelUnloadResponse:
        async def run() -> service_pb2.RepositoryModelUnloadResponse:
            await self.bridge.unload(request.model_name)
            return service_pb2.RepositoryModelUnloadResponse()

        return await self._answer(context, run)

    # ------------------------------------------------------------------------------------ inference

    async def ModelInfer(self, request: Any, context: Any) -> bytes:
        # the hot path: _answer's work written out (no closure, one coroutine less per call). ``request``
        # comes as its wire bytes and the response goes as its own (grpc_server registers the method
        # without a deserializer and a serializer): a request whose header was seen before is read from them
        # directly (grpc_request), any other parsed here; a reply is written by grpc_response
        try:
            read_start = time.monotonic_ns()
            call = grpc_request.read(request, self._headers, self._last) if type(request) is bytes else None
            shm: CallerShm | None = None
            later: list[Callable[[], None]] = []  # big shm copies, checked, to run off the loop
            if call is not None:
                regions: Mapping[str, tuple[str, int, int]] = _NO_REGIONS
                traceparent = grpc_metadata.traceparent(context)
                if traceparent:
                    call = call._replace(traceparent=traceparent)
            else:
                if type(request) is bytes:
                    request = grpc_request.parse(request)
                    if request is None:  # as grpc's servers answer a message they cannot parse
                        await context.abort(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
                shm = self._shm(context, later)
                call, regions = self._call(request, shm, grpc_metadata.traceparent(context))
                await self.door.shm.copies.run(later)
            read_end = time.monotonic_ns()
            bridge = self.bridge
            if await bridge.is_decoupled(call.model, call.version):
                raise FrontDoorError(
                    "UNIMPLEMENTED",
                    501,
                    "ModelInfer RPC doesn't support models with decoupled transaction policy",
                )
            reply = await bridge.infer(call)
            if call.class_counts:
                reply = await classify_reply(bridge, self.door.labels, reply, call.class_counts)
            response = None if regions else grpc_response.response_bytes(reply, self._written)
            if response is None:
                response = convert.infer_response(reply, regions, shm).SerializeToString()
                await self.door.shm.copies.run(later)  # in the caller's regions before the reply says so
            if reply.trace:  # traced by the broker: the door's timestamps go to its trace once sent
                read = (("GRPC_WAITREAD_START", read_start), ("GRPC_WAITREAD_END", read_end))
                sent = functools.partial(_grpc_sent, bridge.trace_stamps, reply.trace, read,
                                         time.monotonic_ns())  # fmt: skip
                context.add_done_callback(sent)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # every failure becomes Triton's answer
            await self._abort(context, exc)
        self.door.counters.record("grpc", True)
        return response

    def _call(
        self, request: Any, shm: CallerShm, traceparent: str = ""
    ) -> tuple[InferCall, dict[str, tuple[str, int, int]]]:
        alloc = self.bridge.empty if self.bridge.uses_shm else None
        call = convert.infer_call(request, shm, alloc)
        if traceparent:  # the caller's W3C trace context, from the call's metadata
            call = call._replace(traceparent=traceparent)
        return call, convert.output_regions(request)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        """Requests run as they come (a sequence's requests one after the other); responses, a decoupled
        model's several per request, go back as they are ready; an error is a response's error_message."""
        queue: asyncio.Queue[service_pb2.ModelStreamInferResponse | TritonError | None] = asyncio.Queue(
            _STREAM_QUEUE
        )
        tasks: set[asyncio.Task[None]] = set()
        # Triton's "triton_grpc_error: true" header: the first error ends the stream with its gRPC status
        # (instead of a response whose error_message carries it, the stream going on)
        grpc_error = grpc_metadata.error_mode(context)
        last_of_sequence: dict[int | str, asyncio.Task[None]] = {}
        shm = self._shm(context)
        traceparent = grpc_metadata.traceparent(context)

        async def one(request: Any, before: asyncio.Task[None] | None, decoupled: bool) -> None:
            if before is not None:
                await asyncio.wait([before])
            try:
                call, regions = self._call(request, shm, traceparent)
                empty_final = call.parameters.get("triton_enable_empty_final_response") is True
                # Triton marks every response of a decoupled model's stream with triton_final_response
                flag_final = empty_final or decoupled
                async for reply in self.bridge.stream(call):
                    if reply.final and not reply.outputs and not empty_final:
                        continue
                    reply = await classify_reply(self.bridge, self.door.labels, reply, call.class_counts)
                    response = convert.infer_response(reply, regions, shm)
                    if flag_final:
                        response.parameters["triton_final_response"].bool_param = reply.final
                    await queue.put(service_pb2.ModelStreamInferResponse(infer_response=response))
                self.door.counters.record("grpc", True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.door.counters.record("grpc", False)
                if grpc_error:
                    await queue.put(triton_error(exc))
                    return
                error = triton_error(exc).message
                response = service_pb2.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version, id=request.id
                )
                await queue.put(
                    service_pb2.ModelStreamInferResponse(error_message=error, infer_response=response)
                )

        async def read() -> None:
            try:
                async for request in request_iterator:
                    sequence = convert.parameters(request.parameters).get("sequence_id") or None
                    before = last_of_sequence.get(sequence) if isinstance(sequence, (int, str)) else None
                    # asked here, in the stream's order (then cached), so that no request waits for it
                    # between its arrival and its sending, and the stream's requests stay in order
                    decoupled = await _is_decoupled(self.bridge, request)
                    task = asyncio.create_task(one(request, before, decoupled))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    if isinstance(sequence, (int, str)):
                        last_of_sequence[sequence] = task
                        task.add_done_callback(functools.partial(_forget, last_of_sequence, sequence))
                if tasks:
                    await asyncio.wait(set(tasks))
            finally:
                await queue.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, TritonError):
                    await context.abort(getattr(grpc.StatusCode, item.grpc_code), item.message)
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    # ------------------------------------------------------------------------------------ shared memory

    async def SystemSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> service_pb2.SystemSharedMemoryStatusResponse:
        async def run() -> service_pb2.SystemSharedMemoryStatusResponse:
            response = service_pb2.SystemSharedMemoryStatusResponse()
            for r in self._shm(context).status(request.name):
                response.regions[r.name].CopyFrom(
                    service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                        name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                    )
                )
            return response

        return await self._answer(context, run)

    async def SystemSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> service_pb2.SystemSharedMemoryRegisterResponse:
        async def run() -> service_pb2.SystemSharedMemoryRegisterResponse:
            self._shm(context).register(request.name, request.key, request.offset, request.byte_size)
            return service_pb2.SystemSharedMemoryRegisterResponse()

        return await self._answer(context, run)

    async def SystemSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> service_pb2.SystemSharedMemoryUnregisterResponse:
        async def run() -> service_pb2.SystemSharedMemoryUnregisterResponse:
            self._shm(context).unregister(request.name)
            return service_pb2.SystemSharedMemoryUnregisterResponse()

        return await self._answer(context, run)

    async def CudaSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> service_pb2.CudaSharedMemoryStatusResponse:
        async def run() -> service_pb2.CudaSharedMemoryStatusResponse:
            cudashm.status(request.name)  # no region: a named one is not found
            return service_pb2.CudaSharedMemoryStatusResponse()

        return await self._answer(context, run)

    async def CudaSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> service_pb2.CudaSharedMemoryRegisterResponse:
        async def run() -> service_pb2.CudaSharedMemoryRegisterResponse:
            cudashm.register(request.name)
            return service_pb2.CudaSharedMemoryRegisterResponse()

        return await self._answer(context, run)

    async def CudaSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> service_pb2.CudaSharedMemoryUnregisterResponse:
        async def run() -> service_pb2.CudaSharedMemoryUnregisterResponse:
            cudashm.unregister(request.name)
            return service_pb2.CudaSharedMemoryUnregisterResponse()

        return await self._answer(context, run)

    async def TraceSetting(self, request: Any, context: Any) -> service_pb2.TraceSettingResponse:
        """Triton's trace extension: no settings reads them; each given setting is changed (an empty value
        list clears a model's own value, which then follows the global one)."""

        async def run() -> service_pb2.TraceSettingResponse:
            changes: dict[str, str | list[str] | None] | None = None
            if request.settings:
                changes = {}
                for name, v in request.settings.items():
                    values = list(v.value)
                    changes[name] = None if not values else values if name == "trace_level" else values[0]
                    if len(values) > 1 and name != "trace_level":
                        raise InvalidArgument(f"trace setting {name}: expected one value, got {len(values)}")
            got = await self.bridge.trace_settings(request.model_name, changes)
            response = service_pb2.TraceSettingResponse()
            for name, value in got.items():
                response.settings[name].value.extend(value if isinstance(value, list) else [value])
            return response

        return await self._answer(context, run)

    async def LogSettings(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "log settings are not supported by zinfer: use zinfer serve --log-level",
        )


async def _is_decoupled(bridge: Any, request: Any) -> bool:
    """Whether the stream request's model is decoupled; False when that cannot be told (the request's
    own answer then says what is wrong)."""
    try:
        return bool(await bridge.is_decoupled(request.model_name, request.model_version))
    except Exception:  # noqa: BLE001 - an unknown model: its request fails with the right error
        return False


def _grpc_sent(
    stamps: DoorStamps, trace: str, read: tuple[tuple[str, int], ...], send_start: int, _context: Any
) -> None:
    """The call is done (its response sent): the door's timestamps to the request's trace."""
    stamps.add(trace, (*read, ("GRPC_SEND_START", send_start), ("GRPC_SEND_END", time.monotonic_ns())))
