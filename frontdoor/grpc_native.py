"""pygrpc-native's grpc.aio-compatible server (the ``frontdoor-native`` extra), with the door's raw unary
methods (``grpc_server.RAW``: ModelInfer) run by a shorter per-call path.

pygrpc-native runs each call as a task of three nested coroutines (``_run``, ``_run_unary``,
``_unary_response``), asks ``inspect`` per call whether the handler is a coroutine function, and builds the
call's metadata as named tuples whenever the handler reads it. For a raw method, whose handler is known to
be a coroutine function taking and returning bytes, ``LeanServer`` runs one coroutine per call instead: the
same receive limit and its text, the same handler, the same status for an abort or an unexpected error, the
same send limit, the same cancellation and done callbacks. Every other event (other methods, cancels, calls
while stopping, calls when interceptors are set) goes pygrpc-native's own way, in the order the events came.

Built on pygrpc-native's internals (``_on_events``, ``_Call``, ``_Context``, ``_failed``, ``_fail``,
``_encode``): ``lean_server`` checks they are there and otherwise returns pygrpc-native's own server (logged).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Iterable
from typing import Any

import grpc

__all__ = ["lean_server"]

log = logging.getLogger(__name__)

IO_THREADS = 1
"""pygrpc-native's I/O threads (its default: 2). The door's Python side (one event loop, one GIL) is the
bound, not the I/O threads: a unary echo server at 32 calls in flight, one grpcio client process, alternate
runs: CPU per call 79/95 us on one I/O thread against 119/105 on two, and 15/16 us of wall time inside
``respond`` (the GIL held) against 63/35."""
_NEEDED = ("_on_events", "_failed", "_fail", "_encode")
_OK = grpc.StatusCode.OK
_RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
_CANCELLED = grpc.StatusCode.CANCELLED.value[0]


def lean_server(options: Iterable[tuple[str, Any]], raw: frozenset[str], service: str) -> Any:
    """pygrpc-native's server whose methods ``/service/name`` for each name in ``raw`` take the short path
    (pygrpc-native's own server where its internals are not as this module knows them)."""
    module: Any = importlib.import_module("pygrpc_native.aio")  # optional: imported by name
    options = list(options)
    if not all(hasattr(module.Server, a) for a in _NEEDED) or not all(
        hasattr(module, a) for a in ("_Call", "_Context")
    ):
        log.warning("event=grpc_native_lean_unavailable reason=internals")
        return module.Server(options=options, io_threads=IO_THREADS)
    server = _lean_class(module)(options=options, io_threads=IO_THREADS)
    server._lean_paths = frozenset(f"/{service}/{name}" for name in raw)
    return server


def _lean_class(module: Any) -> Any:
    base: Any = module.Server
    call_class: Any = module._Call
    context_class: Any = module._Context
    event_call: int = importlib.import_module("pygrpc_native._native").EVENT_CALL

    class RawContext(context_class):  # type: ignore[misc]
        """pygrpc-native's context whose ``invocation_metadata`` gives the (key, value) pairs as received
        (tuples, not named tuples): the raw handlers only iterate over them."""

        def invocation_metadata(self) -> Any:
            return self._call.metadata

    class LeanServer(base):  # type: ignore[misc]
        _lean_paths: frozenset[str] = frozenset()

        def _on_events(self, events: list[tuple[Any, ...]]) -> None:
            if self._stopping or self._interceptors:
                super()._on_events(events)
                return
            loop, table, calls, lean = self._loop, self._table, self._calls, self._lean_paths
            pending: list[tuple[Any, ...]] = []  # other events, kept in order with the lean ones
            for event in events:
                kind, call_id, method_id, payload, _, details = event
                if kind != event_call or table[method_id][0] not in lean:
                    pending.append(event)
                    continue
                if pending:
                    super()._on_events(pending)
                    pending = []
                method, handler = table[method_id]
                call = call_class(call_id, method, handler, *details)
                calls[call_id] = call
                call.task = loop.create_task(self._run_lean(call, payload))
            if pending:
                super()._on_events(pending)

        async def _run_lean(self, call: Any, payload: bytes) -> None:
            context = RawContext(self, call)
            front = self._front
            try:
                limit = self._receive_limit
                if limit is not None and len(payload) > limit:
                    front.fail(
                        call.call_id,
                        _RESOURCE_EXHAUSTED,
                        f"SERVER: Received message larger than max ({len(payload)} vs. {limit})",
                    )
                    return
                try:
                    response = await call.handler.unary_unary(payload, context)
                except Exception as exc:  # an abort's status, or grpc's answer to an unexpected error
                    self._failed(call, context, exc)
                    return
                code = context._code
                if code is not None and code != _OK:
                    self._fail(call, context, None)
                    return
                data = self._encode(call, context, response)
                if data is not None:
                    initial, trailing = context._initial_metadata, context._trailing_metadata
                    front.respond(
                        call.call_id,
                        data,
                        initial_metadata=None if initial is None else list(initial),
                        trailing_metadata=list(trailing) if trailing else None,
                    )
            except asyncio.CancelledError:
                # only a call the handler cancelled itself still has a client
                if not call.cancelled and not self._stopping:
                    front.fail(call.call_id, _CANCELLED, "Cancelled")
            finally:
                self._calls.pop(call.call_id, None)
                call.finish(context)

    return LeanServer
