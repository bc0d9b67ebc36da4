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
import os
from collections.abc import Iterable
from typing import Any

import grpc

from zinfer.client.errors import ConfigError

__all__ = ["IO_THREADS_ENV", "io_threads", "lean_server"]

log = logging.getLogger(__name__)

IO_THREADS = 1
"""pygrpc-native's I/O threads (its own default: 2; ``ZINFER_GRPC_IO_THREADS`` sets it). The door's Python
side (one event loop, one GIL) is the bound at concurrency 32, not the I/O threads: through the door, in turns
against two threads, the door's CPU per request was lower in 6 of 7 rounds (medians 266 against 371 and 284
against 371 us); at concurrency 1, p50 was higher in the two rounds that measured (3890 against 3349 us, and
an outlier). ``bench/ab_frontdoor_http.py --protocol grpc`` with ``ZINFER_GRPC_IO_THREADS=2`` as a variant
measures it again."""
IO_THREADS_ENV = "ZINFER_GRPC_IO_THREADS"


def io_threads() -> int:
    """pygrpc-native's I/O threads: ``ZINFER_GRPC_IO_THREADS`` (1 to 64) or ``IO_THREADS``."""
    text = os.environ.get(IO_THREADS_ENV, "").strip()
    if not text:
        return IO_THREADS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 64:
        raise ConfigError(f"{IO_THREADS_ENV} must be a whole number from 1 to 64, got {text!r}")
    return value


_NEEDED = ("_on_events", "_failed", "_fail", "_encode")
_OK = grpc.StatusCode.OK
_RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
_CANCELLED = grpc.StatusCode.CANCELLED.value[0]


def lean_server(options: Iterable[tuple[str, Any]], raw: frozenset[str], service: str) -> Any:
    """pygrpc-native's server whose methods ``/service/name`` for each name in ``raw`` take the short path
    (pygrpc-native's own server where its internals are not as this module knows them)."""
    threads = io_threads()
    module: Any = importlib.import_module("pygrpc_native.aio")  # optional: imported by name
    options = list(options)
    if not all(hasattr(module.Server, a) for a in _NEEDED) or not all(
        hasattr(module, a) for a in ("_Call", "_Context")
    ):
        log.warning("event=grpc_native_lean_unavailable reason=internals")
        return module.Server(options=options, io_threads=threads)
    server = _lean_class(module)(options=options, io_threads=threads)
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
