"""The asyncio client: ``await AsyncClient(url).infer(model, {name: array})``.

The same calls as ``Client``, awaitable, over one DEALER socket on ``zmq.asyncio``: thousands of requests
may be in flight at once, each answered through its own future by one reader task. Cancelling a task that
awaits ``infer`` cancels the request in the server (it leaves the queue, or its result is dropped); its
shared-memory slots stay reserved until the server's late reply says it is done with them. Request
building and result reading live in ``base._ClientBase``, shared with the sync ``Client``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from . import protocol
from .async_connection import AsyncConnection
from .base import _ClientBase, _ModelInfo, _Prepared
from .connection import Unsent
from .curve_keys import CurveKeys
from .errors import ClientError, RequestTimeout, Status, from_status
from .link_watch import HEARTBEAT_INTERVAL_S
from .protocol import (
    CancelCommand,
    Command,
    Frame,
    ModelChange,
    ModelQuery,
    Reply,
    ServerQuery,
    UnregisterRegion,
)
from .result import InferResult
from .shm import Segment
from .trace_context import with_trace_context
from .triton_compat import InputsArg, OutputsArg
from .triton_compat import model_version as _version

log = logging.getLogger(__name__)


class AsyncClient(_ClientBase):
    """Talks to one zinfer server from one event loop. Use ``async with``, or ``await close()``.

    Options as for ``Client``. ``empty`` and ``zeros`` need no ``await``: a new shared-memory segment
    they make is registered with the server before the next request is sent.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 60.0,
        shm: bool | None = None,
        arena_bytes: int = 16 << 20,
        max_arena_bytes: int = 4 << 30,
        inline_threshold: int = 4096,
        curve: CurveKeys | None = None,
        server_uid: int | None = None,
        heartbeat_interval: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        super().__init__(
            url,
            timeout=timeout,
            shm=shm,
            arena_bytes=arena_bytes,
            max_arena_bytes=max_arena_bytes,
            inline_threshold=inline_threshold,
        )
        self._conn = AsyncConnection(
            self.url,
            on_late_reply=self._late_reply,
            curve=curve,
            server_uid=server_uid,
            heartbeat_interval=heartbeat_interval,
        )
        self._unregistered: list[Segment] = []  # segments the server has not been told of yet
        self._register_lock = asyncio.Lock()
        self._info_pending: dict[tuple[str, int], asyncio.Task[dict[str, Any]]] = {}

    # ------------------------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Unregister and unlink this client's shared memory, fail what still waits, close the socket."""
        if self._closed:
            return
        if self._arena is not None:
            for seg in self._arena.segments:
                if seg in self._unregistered:
                    continue
                try:
                    header = protocol.unregister_to_wire(UnregisterRegion(seg.name))
                    await self._call(Command.UNREGISTER, header, timeout=min(self.timeout, 2.0))
                except ClientError:
                    pass
            self._arena.close()
        self._closed = True
        await self._conn.aclose()

    # ------------------------------------------------------------------------------------ server calls

    async def is_server_live(self) -> bool:
        header = protocol.server_query_to_wire(ServerQuery())
        return bool((await self._call(Command.SERVER_LIVE, header)).body)

    async def is_server_ready(self) -> bool:
        header = protocol.server_query_to_wire(ServerQuery())
        return bool((await self._call(Command.SERVER_READY, header)).body)

    async def is_model_ready(self, name: str, version: int | str = 0) -> bool:
        header = protocol.model_query_to_wire(ModelQuery(name, _version(version)))
        reply = await self._call(Command.MODEL_READY, header)
        return bool(reply.body)

    async def model_metadata(self, name: str, version: int | str = 0) -> dict[str, Any]:
        header = protocol.model_query_to_wire(ModelQuery(name, _version(version)))
        body: dict[str, Any] = (await self._call(Command.MODEL_METADATA, header)).body
        return body

    async def model_config(self, name: str, version: int | str = 0) -> dict[str, Any]:
        header = protocol.model_query_to_wire(ModelQuery(name, _version(version)))
        body: dict[str, Any] = (await self._call(Command.MODEL_CONFIG, header)).body
        return body

    async def statistics(self, model: str | None = None, version: int | str = 0) -> dict[str, Any]:
        header = self._statistics_header(model, _version(version))
        body: dict[str, Any] = (await self._call(Command.STATISTICS, header)).body
        return body

    async def load_model(
        self,
        name: str,
        timeout: float | None = None,
        *,
        config: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load or reload ``name`` (see ``Client.load_model``, overrides included)."""
        change = ModelChange(name, config=config or "", files=dict(files or {}))
        await self._call(Command.LOAD, protocol.model_change_to_wire(change), timeout=timeout)
        self._forget_model(name)

    async def unload_model(self, name: str) -> None:
        """Stop serving ``name``: new requests are refused, queued ones finish."""
        await self._call(Command.UNLOAD, protocol.model_change_to_wire(ModelChange(name)))
        self._forget_model(name)

    async def get_trace_settings(self, model_name: str | None = None) -> dict[str, Any]:
        """The trace settings in force (see ``Client.get_trace_settings``)."""
        header = protocol.trace_setting_to_wire(protocol.TraceSettingChange(model_name or ""))
        body: dict[str, Any] = (await self._call(Command.TRACE_SETTING, header)).body["settings"]
        return body

    async def update_trace_settings(
        self, model_name: str | None = None, settings: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Change trace settings while serving (see ``Client.update_trace_settings``)."""
        change = protocol.TraceSettingChange(model_name or "", dict(settings or {}))
        header = protocol.trace_setting_to_wire(change)
        body: dict[str, Any] = (await self._call(Command.TRACE_SETTING, header)).body
        return dict(body["settings"])

    async def add_trace_stamps(self, trace: str, stamps: Sequence[tuple[str, int]]) -> bool:
        """A front door's own timestamps (Triton's ``HTTP_*``/``GRPC_*`` names, ``CLOCK_MONOTONIC`` ns) of
        a traced request it answered, under its reply's ``protocol.TRACE_ID`` parameter; False when the
        server no longer holds that trace (only its latest answered traces are kept for this)."""
        change = protocol.TraceSettingChange(trace=trace, stamps=tuple((str(n), int(ns)) for n, ns in stamps))
        reply = await self._call(Command.TRACE_SETTING, protocol.trace_setting_to_wire(change))
        return bool(reply.body.get("added"))

    async def server_status(self) -> dict[str, Any]:
        header = protocol.server_query_to_wire(ServerQuery())
        body: dict[str, Any] = (await self._call(Command.SERVER_STATUS, header)).body
        return body

    async def repository_index(self) -> list[dict[str, Any]]:
        header = protocol.server_query_to_wire(ServerQuery())
        body: list[dict[str, Any]] = (await self._call(Command.REPOSITORY_INDEX, header)).body
        return body

    # tritonclient's names for the same calls
    async def get_model_metadata(self, model_name: str, model_version: int | str = "") -> dict[str, Any]:
        return await self.model_metadata(model_name, model_version)

    async def get_model_config(self, model_name: str, model_version: int | str = "") -> dict[str, Any]:
        return await self.model_config(model_name, model_version)

    async def get_inference_statistics(
        self, model_name: str = "", model_version: int | str = ""
    ) -> dict[str, Any]:
        return await self.statistics(model_name, model_version)

    async def get_model_repository_index(self) -> list[dict[str, Any]]:
        return await self.repository_index()

    # ------------------------------------------------------------------------------------ inference

    async def infer(
        self,
        model: str,
        inputs: InputsArg,
        *,
        outputs: OutputsArg = None,
        request_id: str | None = None,
        model_version: int | str = 0,
        priority: int = 0,
        timeout: int | None = None,
        client_timeout: float | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        parameters: Mapping[str, Any] | None = None,
        trace_context: str | None = None,
    ) -> InferResult:
        """Run ``model`` on ``inputs`` (see ``Client.infer``). When ``client_timeout`` passes, or the task
        awaiting this is cancelled, the request is cancelled in the server too."""
        version = _version(model_version)
        info = self._cached_info(model, version) or await self._model_info(model, version)
        sequence = (sequence_id, sequence_start, sequence_end)
        # a W3C traceparent (given, or the active OpenTelemetry span's): the server's trace continues it
        parameters = with_trace_context(parameters, trace_context)
        p = self._prepare(info, inputs, outputs, request_id, priority, timeout, sequence, parameters)
        try:
            if self._unregistered:  # new arena segments: the server learns of them first
                await self._register_new()
            reply, rframes = await self._exchange(p, client_timeout)
            if self._unknown_region(reply):
                await self._register_all()
                reply, rframes = await self._exchange(p, client_timeout)
        except BaseException as exc:
            self._abandon(p, exc)
            raise
        return self._finish(p, reply, rframes)

    async def stream(
        self,
        model: str,
        inputs: InputsArg,
        *,
        outputs: OutputsArg = None,
        request_id: str | None = None,
        model_version: int | str = 0,
        client_timeout: float | None = None,
        priority: int = 0,
        timeout: int | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        parameters: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[InferResult]:
        """The responses of a decoupled model to one request as they come (see ``Client.stream``); the
        request options are ``infer``'s (a decoupled model may be stateful: ``sequence_*``)."""
        info = await self._model_info(model, _version(model_version))
        sequence = (sequence_id, sequence_start, sequence_end)
        parameters = with_trace_context(parameters, None)
        p = self._prepare(info, inputs, outputs, request_id, priority, timeout, sequence, parameters)
        await self._register_new()
        wait = self.timeout if client_timeout is None else client_timeout
        self._track(p, self._conn.new_id())
        try:
            async for reply, rframes in self._conn.stream(Command.INFER, p.header, p.frames, wait):
                yield self._stream_result(p, reply, rframes)
        finally:
            self._stream_closed(p, self._conn.send_only)

    async def _exchange(self, p: _Prepared, timeout: float | None) -> tuple[Reply, list[Frame]]:
        rid = self._conn.new_id()
        self._track(p, rid)  # until the reply comes the server may read or write the slots
        try:
            fut = self._conn.send(Command.INFER, p.header, p.frames)  # goes out with this turn's messages
            reply, rframes = await self._conn.wait(rid, fut, self.timeout if timeout is None else timeout)
        except Unsent:
            self._untrack_caller(p)
            self._settle(p)  # it never went out: the slots are the caller's again
            raise
        except (RequestTimeout, asyncio.CancelledError):
            header = protocol.cancel_command_to_wire(CancelCommand(rid))
            self._conn.send_only(Command.CANCEL, header)  # the server drops it or its result
            raise
        finally:
            self._untrack_caller(p)
        self._settle(p)
        return reply, rframes

    async def cancel(self, request_id: str) -> bool:
        """Cancel the ``infer`` in flight that was given this ``request_id``: it raises ``Cancelled``.
        Returns False when no such request is in flight. (Cancelling its task does the same.)"""
        with self._orphans_lock:
            rid = self._active.get(request_id)
        if rid is None:
            return False
        await self._call(Command.CANCEL, protocol.cancel_command_to_wire(CancelCommand(rid)))
        return True

    async def _model_info(self, model: str, version: int) -> _ModelInfo:
        info = self._cached_info(model, version)
        if info is not None:
            return info
        key = (model, version)
        task = self._info_pending.get(key)
        if task is None:  # one metadata call however many requests wait for it
            task = asyncio.ensure_future(self.model_metadata(model, version))
            self._info_pending[key] = task
            task.add_done_callback(lambda t: self._metadata_done(key, t))
        meta = await asyncio.shield(task)
        return self._store_info(model, version, meta)

    def _metadata_done(self, key: tuple[str, int], task: asyncio.Task[dict[str, Any]]) -> None:
        if self._info_pending.get(key) is task:
            del self._info_pending[key]
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter may have been cancelled

    # ------------------------------------------------------------------------------------ shm

    def _on_new_segment(self, seg: Segment) -> None:
        self._unregistered.append(seg)  # no I/O inside the arena: registered before the next send

    async def _handoff_async(self, seg: Segment) -> dict[str, Any]:
        return await asyncio.to_thread(self._handoff, seg, min(self.timeout, 10.0))

    async def _register_new(self) -> None:
        if not self._unregistered:
            return
        async with self._register_lock:
            while self._unregistered:
                seg = self._unregistered[0]
                await self._call(Command.REGISTER, await self._handoff_async(seg))
                self._unregistered.remove(seg)

    async def _register_all(self) -> None:
        if self._arena is None:
            return
        async with self._register_lock:
            for seg in self._arena.segments:
                await self._call(Command.REGISTER, await self._handoff_async(seg))
                if seg in self._unregistered:
                    self._unregistered.remove(seg)

    # ------------------------------------------------------------------------------------ transport

    async def _call(self, command: Command, header: dict[str, Any], timeout: float | None = None) -> Reply:
        reply, _ = await self._conn.request(command, header, (), self.timeout if timeout is None else timeout)
        if reply.status != Status.OK:
            raise from_status(reply.status, reply.error)
        return reply
