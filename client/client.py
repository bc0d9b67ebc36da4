"""The synchronous client: ``Client(url).infer(model, {name: array})``.

One DEALER socket per client, safe to share between threads: each call registers a waiter for its
request id; whichever waiting thread holds the receive lock reads replies for everyone. Request building
and result reading live in ``base._ClientBase``, shared with ``AsyncClient``; this module is the I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from . import protocol
from .base import _ClientBase, _ModelInfo, _Prepared
from .connection import Connection, Unsent
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


class Client(_ClientBase):
    """Talks to one zinfer server. Use as a context manager, or call ``close()``.

    ``url`` defaults to the server's socket in the default runtime directory. Tensors go through the
    client's shared-memory arena when the server is local (``ipc://``), inline in the message otherwise;
    tensors of at most ``inline_threshold`` bytes travel inline anyway, where a copy is cheaper than a
    shared-memory slot (set it to -1 to send everything through shared memory).
    A server that dies or freezes fails the calls waiting on it with ``ConnectionFailed`` within about two
    ``heartbeat_interval`` seconds (see ``link_watch``).
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
        self._conn = Connection(
            self.url,
            on_late_reply=self._late_reply,
            curve=curve,
            server_uid=server_uid,
            heartbeat_interval=heartbeat_interval,
        )

    # ------------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Unregister and unlink this client's shared memory and close the socket."""
        if self._closed:
            return
        if self._arena is not None:
            for seg in self._arena.segments:
                try:
                    header = protocol.unregister_to_wire(UnregisterRegion(seg.name))
                    self._call(Command.UNREGISTER, header, timeout=min(self.timeout, 2.0))
                except ClientError:
                    pass
            self._arena.close()
        self._closed = True
        self._conn.close()

    # ------------------------------------------------------------------------------------ server calls

    def is_server_live(self) -> bool:
        return bool(self._call(Command.SERVER_LIVE, protocol.server_query_to_wire(ServerQuery())).body)

    def is_server_ready(self) -> bool:
        return bool(self._call(Command.SERVER_READY, protocol.server_query_to_wire(ServerQuery())).body)

    def is_model_ready(self, name: str, version: int | str = 0) -> bool:
        header = protocol.model_query_to_wire(ModelQuery(name, _version(version)))
        return bool(self._call(Command.MODEL_READY, header).body)

    def model_metadata(self, name: str, version: int | str = 0) -> dict[str, Any]:
        header = protocol.model_query_to_wire(ModelQuery(name, _version(version)))
        body: dict[str, Any] = self._call(Command.MODEL_METADATA, header).body
        return body

    def model_config(self, name: str, version: int | str = 0) -> dict[str, Any]:
        header = protocol.model_query_to_wire(ModelQuery(name, _version(version)))
        body: dict[str, Any] = self._call(Command.MODEL_CONFIG, header).body
        return body

    def statistics(self, model: str | None = None, version: int | str = 0) -> dict[str, Any]:
        body: dict[str, Any] = self._call(
            Command.STATISTICS, self._statistics_header(model, _version(version))
        ).body
        return body

    def load_model(
        self,
        name: str,
        timeout: float | None = None,
        *,
        config: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load or reload ``name`` from the repository (needs ``--model-control-mode explicit``).

        Returns once every instance of the new version is ready; requests keep going to the old version until
        then. Raises ``Unavailable`` with the reason if it fails, in which case the old version keeps serving.
        ``config`` (JSON text) replaces the model's config.pbtxt, and ``files`` (relative path to bytes, with
        a config) its whole folder, as Triton's load overrides do.
        """
        change = ModelChange(name, config=config or "", files=dict(files or {}))
        self._call(Command.LOAD, protocol.model_change_to_wire(change), timeout=timeout)
        self._forget_model(name)

    def unload_model(self, name: str) -> None:
        """Stop serving ``name``: new requests are refused, queued ones finish."""
        self._call(Command.UNLOAD, protocol.model_change_to_wire(ModelChange(name)))
        self._forget_model(name)

    def get_trace_settings(self, model_name: str | None = None) -> dict[str, Any]:
        """The trace settings in force (``model_name``'s, else the global ones), as Triton's trace
        extension names them (``trace_level``, ``trace_rate``, ``trace_count``, ...)."""
        header = protocol.trace_setting_to_wire(protocol.TraceSettingChange(model_name or ""))
        body: dict[str, Any] = self._call(Command.TRACE_SETTING, header).body["settings"]
        return body

    def update_trace_settings(
        self, model_name: str | None = None, settings: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Change trace settings while serving (Triton's names; for a model, ``{}`` drops its own settings
        and a value None takes the global one) and return those now in force. A bad value raises
        ``InvalidArgument`` and changes nothing."""
        change = protocol.TraceSettingChange(model_name or "", dict(settings or {}))
        body: dict[str, Any] = self._call(Command.TRACE_SETTING, protocol.trace_setting_to_wire(change)).body
        return dict(body["settings"])

    def server_status(self) -> dict[str, Any]:
        """What ``zinfer status`` shows: models, instances (pid, device, state, RSS, CPU), queues, figures."""
        header = protocol.server_query_to_wire(ServerQuery())
        body: dict[str, Any] = self._call(Command.SERVER_STATUS, header).body
        return body

    def repository_index(self) -> list[dict[str, Any]]:
        header = protocol.server_query_to_wire(ServerQuery())
        body: list[dict[str, Any]] = self._call(Command.REPOSITORY_INDEX, header).body
        return body

    # tritonclient's names for the same calls
    def get_model_metadata(self, model_name: str, model_version: int | str = "") -> dict[str, Any]:
        return self.model_metadata(model_name, model_version)

    def get_model_config(self, model_name: str, model_version: int | str = "") -> dict[str, Any]:
        return self.model_config(model_name, model_version)

    def get_inference_statistics(self, model_name: str = "", model_version: int | str = "") -> dict[str, Any]:
        return self.statistics(model_name, model_version)

    def get_model_repository_index(self) -> list[dict[str, Any]]:
        return self.repository_index()

    # ------------------------------------------------------------------------------------ inference

    def infer(
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
        """Run ``model`` on ``inputs`` and return its outputs (all of them unless ``outputs`` names some).

        ``inputs`` is ``{name: array}`` or a list of ``InferInput``; ``outputs`` names or
        ``InferRequestedOutput``s. As in Triton's client: ``priority`` is the request's priority level (0 =
        the model's default, 1 = highest) and ``timeout`` its queue timeout in microseconds, honoured where
        the model's queue policy allows an override. ``client_timeout`` (seconds, default: the client's
        ``timeout``) is how long to wait for the answer; when it passes the request is cancelled in the
        server and ``RequestTimeout`` is raised. ``request_id`` names the request for ``cancel`` from
        another thread.
        ``sequence_id`` (non-zero int or non-empty str), ``sequence_start`` and ``sequence_end`` make the
        request part of a sequence of a stateful model (``sequence_batching``), as Triton's parameters do.
        ``parameters`` (names to bool, int, float or str) are the request's own, which a Triton-style model
        reads with ``request.parameters()``; a response's come back as ``InferResult.parameters``.
        ``trace_context`` is a W3C ``traceparent``: where the server traces this request (``--trace-config``),
        its trace record carries that trace id and parent span id.
        """
        # an int is as ``model_version`` has it: no call into that interpreted module per request
        version = model_version if type(model_version) is int else _version(model_version)
        info = self._model_info(model, version)
        sequence = (sequence_id, sequence_start, sequence_end)
        # a W3C traceparent (given, or the active OpenTelemetry span's): the server's trace continues it
        parameters = with_trace_context(parameters, trace_context)
        rid = self._conn.new_id()  # the wire id, in the header as it is built (``_track`` keeps it)
        p = self._prepare(info, inputs, outputs, request_id, priority, timeout, sequence, parameters, rid)
        try:
            self._conn.server_check.check_changed()  # nothing sent yet: a missing server frees the slots
            reply, rframes = self._exchange(p, client_timeout, rid)
            if self._unknown_region(reply):
                self._register_all()
                reply, rframes = self._exchange(p, client_timeout, self._conn.new_id())
        except BaseException as exc:
            self._abandon(p, exc)
            raise
        return self._finish(p, reply, rframes)

    def stream(
        self,
        model: str,
        inputs: InputsArg,
        *,
        outputs: OutputsArg = None,
        request_id: str | None = None,
        model_version: int | str = 0,
        client_timeout: float | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> Iterator[InferResult]:
        """The responses of a decoupled model to one request, as they come; the last has ``final`` set
        (and, as in Triton, usually no outputs). ``client_timeout`` bounds the wait for each response."""
        info = self._model_info(model, _version(model_version))
        parameters = with_trace_context(parameters, None)  # the active OpenTelemetry span's, if any
        p = self._prepare(info, inputs, outputs, request_id, 0, None, parameters=parameters)
        wait = self.timeout if client_timeout is None else client_timeout
        rid = self._conn.new_id()
        self._track(p, rid)
        try:
            for reply, rframes in self._conn.stream(Command.INFER, p.header, p.frames, wait):
                yield self._stream_result(p, reply, rframes)
        finally:
            self._stream_closed(p, self._conn.send_only)

    def _exchange(self, p: _Prepared, timeout: float | None, rid: str) -> tuple[Reply, list[Frame]]:
        """``p`` sent as ``rid`` (a fresh wire id) and its reply."""
        self._track(p, rid)  # until the reply comes the server may read or write the slots
        try:
            reply, rframes = self._conn.request(
                Command.INFER, p.header, p.frames, self.timeout if timeout is None else timeout, check=False
            )
        except Unsent:
            self._untrack_caller(p)
            self._settle(p)  # it never went out: the slots are the caller's again
            raise
        except RequestTimeout:
            header = protocol.cancel_command_to_wire(CancelCommand(rid))
            self._conn.send_only(Command.CANCEL, header)  # the server drops it or its result
            raise
        finally:
            self._untrack_caller(p)
        self._settle(p)
        return reply, rframes

    def cancel(self, request_id: str) -> bool:
        """Cancel the running ``infer`` that was given this ``request_id`` (from another thread): it leaves
        the server's queue, or its result is discarded, and that ``infer`` raises ``Cancelled``. Returns
        False when no such request is in flight."""
        with self._orphans_lock:
            rid = self._active.get(request_id)
        if rid is None:
            return False
        self._call(Command.CANCEL, protocol.cancel_command_to_wire(CancelCommand(rid)))
        return True

    def _model_info(self, model: str, version: int) -> _ModelInfo:
        info = self._cached_info(model, version)
        if info is None:
            info = self._store_info(model, version, self.model_metadata(model, version))
        return info

    # ------------------------------------------------------------------------------------ shm

    def register_segment(self, seg: Segment) -> None:
        """Register with the server a shared-memory segment this process created (hand over its
        descriptor, then ``REGISTER``), as the client's arena does for each of its own segments. For a
        segment managed outside the arena (a benchmark timing the registration, ...); call
        ``unregister_segment`` before closing it. Local (``ipc://``) servers only, ``ClientError`` for
        others."""
        self._on_new_segment(seg)

    def unregister_segment(self, seg: Segment) -> None:
        """The server forgets a segment given to ``register_segment``; ``NotFound`` if it was not."""
        self._call(Command.UNREGISTER, protocol.unregister_to_wire(UnregisterRegion(seg.name)))

    def _on_new_segment(self, seg: Segment) -> None:
        self._call(Command.REGISTER, self._handoff(seg, min(self.timeout, 10.0)))

    def _register_all(self) -> None:
        if self._arena is not None:
            for seg in self._arena.segments:
                self._on_new_segment(seg)

    # ------------------------------------------------------------------------------------ transport

    def _call(self, command: Command, header: dict[str, Any], timeout: float | None = None) -> Reply:
        reply: Reply
        reply, _ = self._conn.request(command, header, (), self.timeout if timeout is None else timeout)
        if reply.status != Status.OK:
            raise from_status(reply.status, reply.error)
        return reply
