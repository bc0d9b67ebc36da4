"""HTTP/1.1 connections for the front door: an asyncio protocol around the httptools parser.

``HttpWire`` is one connection. It parses requests as bytes arrive (httptools, the llhttp parser), hands
each whole request (``HttpRequest``: method, target, lower-cased headers, body) to an async handler and
writes the handler's ``HttpResponse``, one request at a time and in order (pipelined requests wait in a
short queue; reading pauses while it is full). What a hostile peer can send is bounded:

- the request line and headers: ``MAX_HEAD_BYTES`` in all; more is answered 431 and the connection closed;
- the body: ``body_limit(method, target)`` bytes, checked against Content-Length before any of the body is
  read (so a huge declared body is refused at once) and against what chunked bodies add up to;
- time: a connection's first request line and headers must arrive within ``header_timeout`` of the
  connection (each later one within ``header_timeout`` of its first byte), and its body within
  ``REQUEST_TIMEOUT_S`` of the headers (a stalled or trickled request is answered 408 and closed), so a
  peer trickling bytes holds a connection for seconds, not minutes; an idle keep-alive connection is
  closed after ``KEEPALIVE_S``;
- connections: ``admit`` (the server's per-peer count) may refuse a connection as it is made; the peer's
  uid, from the kernel (``peer_uid``), is known from then on (``HttpRequest.peer_uid``);
- malformed requests are answered 400 and the connection closed; an unexpected error in the handler is
  a 500 answer, never a dead connection or a crashed process.

A connection that sends the same head again (perf_analyzer and Triton's clients send the same head call
after call), whole in one read with its body, has it taken without the parser: the read is compared with
the last head the parser took alone in one read (a plain one: its body sized by Content-Length, no
``Expect``, no upgrade, kept alive, at most ``KEPT_HEAD_BYTES``) and the request made as the parser made
it, with the new body (``_KeptHead``; door CPU per request at HTTP c32 62.6 -> 53.0 us,
bench/door_hop_shape.py, label s50_kept_head). Any other read goes through the parser.

The module is over 400 lines on purpose: it is one class, a connection, whose parser callbacks, kept heads,
answers and timers all read and change the same per-connection state.

``Expect: 100-continue`` is answered before the body is read, HTTP/1.0 and ``Connection: close`` close
after the answer, and a peer that half-closes still gets the answers to what it sent. Why not a
framework: measured with perf_analyzer doing nothing but answering (bench/bench_frontdoor_ceiling.py),
aiohttp's low-level server managed 0.55x Triton's whole C++ front door, and this protocol 1.45x.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import httptools

from .door import HEADER_TIMEOUT_S
from .http_messages import BodyLimit, Handler, HttpRequest, HttpResponse, Start, plain
from .peer_uid import socket_peer_uid

__all__ = [
    "HEADER_TIMEOUT_S",
    "KEEPALIVE_S",
    "MAX_HEAD_BYTES",
    "REQUEST_TIMEOUT_S",
    "HttpRequest",
    "HttpResponse",
    "HttpWire",
    "plain",
]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 << 10
REQUEST_TIMEOUT_S = 60.0
KEEPALIVE_S = 75.0
MAX_PIPELINED = 16  # whole requests waiting behind the one being answered before reading pauses
KEPT_HEAD_BYTES = 4096  # a longer head is never kept: an idle connection holds no more than this of it
ONE_WRITE_BYTES = 1 << 16  # an answer up to this size goes out as one buffer (one send), larger ones as parts


Admit = Callable[["HttpWire"], bool]  # whether a connection just made may stay (its peer is known)


class _KeptHead(NamedTuple):
    """A request head this connection sent whole in one read, with what the parser made of it: a read of the
    same head and a body of its length is that request again (see ``HttpWire.data_received``)."""

    head: bytes
    size: int  # the head's and its body's bytes: what such a read holds
    method: str
    url: str
    headers: Mapping[str, str]


class _Refused(Exception):
    def __init__(self, answer: HttpResponse) -> None:
        super().__init__(answer.status)
        self.answer = answer


class HttpWire(asyncio.Protocol):
    """One HTTP/1.1 connection (see the module's docstring)."""

    def __init__(
        self,
        handler: Handler,
        body_limit: BodyLimit,
        on_close: Callable[[HttpWire], None],
        *,
        header_timeout: float = HEADER_TIMEOUT_S,
        admit: Admit | None = None,
        start: Start | None = None,
    ) -> None:
        self._handler = handler
        self._start = start
        self._body_limit = body_limit
        self._on_close = on_close
        self._header_timeout = header_timeout
        self._admit = admit
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._peer: Any = None
        self.peer: Any = None  # the transport's peername
        self.peer_uid: int | None = None
        self.admitted = False  # counted by ``admit``: the server uncounts it when it closes
        self._loop = asyncio.get_running_loop()
        # the request being parsed
        self._target: list[bytes] = []
        self._method = self._url = ""  # set once its head is complete
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._chunks: list[bytes] = []
        self._body_bytes = 0
        self._limit = 0
        self._partial = False  # between a request's first byte and its end
        self._in_head = False  # between a request's first byte and the end of its headers
        self._recv_start = 0
        # requests parsed in full, waiting to be answered in order
        self._ready: collections.deque[tuple[HttpRequest, bool]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a request is being answered (by ``_task``, or taken by ``start``)
        self._keep_alive = False  # whether the request ``start`` took may keep the connection
        self._timer: asyncio.TimerHandle | None = None  # due no later than the deadline (see ``_arm``)
        self._deadline: float | None = None  # the loop's time the current step must be done by
        self._closing = False  # no more requests are read: answer what is queued, then close
        self._eof = False
        self._kept: _KeptHead | None = None  # the last head that may be taken again without the parser
        self._fresh = False  # the read being parsed began between requests
        self._whole: HttpRequest | None = None  # the request that read held alone (kept alive)
        self._writable: asyncio.Future[None] | None = None

    # ---------------------------------------------------------------------------- connection events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._peer = self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        self.peer_uid = socket_peer_uid(sock) if sock is not None else None
        if self._admit is not None and not self._admit(self):
            self._closing = True
            transport.abort()  # over the peer's share: refused at once, nothing read
            return
        self._arm(self._header_timeout)  # the first request's head is due as soon as a client connects

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._stop_timer()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._on_close(self)

    def eof_received(self) -> bool:
        self._eof = True
        self._closing = True
        if not self._busy and not self._ready:
            return False  # nothing to answer: asyncio closes the transport
        return True  # answer what was sent, then close (a half-closed peer still reads)

    def pause_writing(self) -> None:
        self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        kept = self._kept
        if kept is not None and not self._partial and len(data) == kept.size and data.startswith(kept.head):
            self._again(kept, data)
            return
        self._fresh = not self._partial  # (``_whole`` is None between reads)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # one of ours refused (httptools wraps it)
            refused = exc.__context__
            if not isinstance(refused, _Refused):
                raise
            self._refuse(refused.answer)
        except httptools.HttpParserUpgrade:
            pass  # an upgrade (h2c, websocket) is not taken: the request was answered as plain HTTP/1.1
        except httptools.HttpParserError as parse_exc:
            self._refuse(plain(400, f"malformed HTTP request: {str(parse_exc)[:120]}"))
        else:
            whole = self._whole  # set by on_message_complete while this read was fed
            if whole is not None and not self._partial:
                self._keep(whole, data)
        finally:
            self._fresh, self._whole = False, None

    def _keep(self, request: HttpRequest, data: bytes) -> None:
        """``data`` held ``request`` and nothing else: keep its head when a read of the same bytes can be
        taken without the parser. Only a plain one is kept: its body sized by Content-Length (not chunked),
        no ``Expect``, no upgrade, the connection kept alive after it; what the parser checks of a head
        (its size, the body's limit) gives the same answer for the same bytes."""
        headers = request.headers
        body = request.body
        head = len(data) - len(body)
        if (
            self._closing or "transfer-encoding" in headers
            or "expect" in headers or "upgrade" in headers or headers.get("content-length") != str(len(body))
            or head <= 0 or head > KEPT_HEAD_BYTES
        ):  # fmt: skip
            return
        self._kept = _KeptHead(data[:head], len(data), request.method, request.target, headers)

    def _again(self, kept: _KeptHead, data: bytes) -> None:
        """A read of a kept head and its body: the request the parser would make of it, without the parser
        (it is between requests, as it would be after this one)."""
        now = time.monotonic_ns()
        request = HttpRequest(
            kept.method, kept.url, kept.headers, data[len(kept.head):], self._peer, self.peer_uid, now, now
        )  # fmt: skip
        self._disarm()
        self._complete(request, True)

    # ------------------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._target, self._headers, self._chunks = [], {}, []
        self._head_bytes = self._body_bytes = 0
        self._partial = self._in_head = True
        self._recv_start = time.monotonic_ns()
        self._arm(self._header_timeout)

    def on_url(self, url: bytes) -> None:
        self._grow_head(len(url))
        self._target.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow_head(len(name) + len(value) + 4)
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._arm(REQUEST_TIMEOUT_S)
        self._method = self._parser.get_method().decode("ascii", "replace")
        self._url = b"".join(self._target).decode("latin-1")
        self._limit = self._body_limit(self._method, self._url)
        declared = self._headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._limit:
            raise _Refused(
                plain(400, f"request body of {declared} bytes is more than the limit of {self._limit}")
            )
        if self._headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._limit:
            raise _Refused(plain(400, f"request body is more than the limit of {self._limit} bytes"))
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        request = HttpRequest(
            self._method, self._url, self._headers, b"".join(self._chunks), self._peer, self.peer_uid,
            self._recv_start, time.monotonic_ns(),
        )  # fmt: skip
        self._chunks, self._partial = [], False
        keep_alive = bool(self._parser.should_keep_alive())
        self._disarm()
        # the first request of a read that began between requests (a second one in the same read: none)
        self._whole = request if self._fresh and keep_alive else None
        self._fresh = False
        self._complete(request, keep_alive)

    def _complete(self, request: HttpRequest, keep_alive: bool) -> None:
        """A whole request: answered now (``start``), or queued behind the ones being answered."""
        if not self._busy:
            start = self._start
            if start is not None and self._taken(start, request):  # no task: answered in a callback
                self._busy, self._keep_alive = True, keep_alive
                return
            self._busy = True
            self._ready.append((request, keep_alive))
            self._task = self._loop.create_task(self._answer_all())
            return
        self._ready.append((request, keep_alive))
        if len(self._ready) >= MAX_PIPELINED and self._transport is not None and self._transport.is_reading():
            self._transport.pause_reading()

    # -------------------------------------------------------------------------------------- answers

    def _taken(self, start: Start, request: HttpRequest) -> bool:
        try:
            return start(request, self._started_done)
        except Exception:  # noqa: BLE001 - a bug there: the handler answers it the usual way
            log.exception("event=http_start_failed path=%r", request.path[:200])
            return False

    def _started_done(self, answer: HttpResponse) -> None:
        """The answer to the request ``start`` took, written as ``_answer_all`` writes; then the next ones."""
        keep_alive = self._keep_alive and not answer.close and not (self._closing and not self._ready)
        sent = answer.on_sent
        send_start = time.monotonic_ns() if sent is not None else 0
        self._write(answer, keep_alive)
        if self._writable is None:
            if sent is not None:
                sent(send_start, time.monotonic_ns())
            if not keep_alive:
                self._busy = False
                self._close()
                return
            if not self._ready:
                self._busy = False
                self._idle()
                return
            sent = None
        # the rest in a task: the wait for the write (reading is paused), and the requests behind this one
        self._task = self._loop.create_task(self._answer_all(True, sent, send_start, keep_alive))

    async def _answer_all(
        self, written: bool = False, sent: Callable[[int, int], None] | None = None, send_start: int = 0,
        keep_alive: bool = True,
    ) -> None:  # fmt: skip
        """Answer the requests waiting, in order. ``written``: after a ``start`` answer's write (``sent``
        told once it is done; the connection closed after it unless ``keep_alive``)."""
        try:
            if written:
                if self._writable is not None:
                    await self._writable
                if sent is not None:
                    sent(send_start, time.monotonic_ns())
                if not keep_alive:
                    self._close()
                    return
            while self._ready and self._transport is not None and not self._transport.is_closing():
                request, keep_alive = self._ready.popleft()
                if len(self._ready) < MAX_PIPELINED // 2 and not self._transport.is_reading():
                    self._transport.resume_reading()
                try:
                    answer = await self._handler(request)
                except Exception:  # noqa: BLE001 - the handler answers its own errors; this is a bug there
                    log.exception("event=http_handler_failed path=%r", request.path[:200])
                    answer = plain(500, "internal error")
                keep_alive = keep_alive and not answer.close and not (self._closing and not self._ready)
                sent = answer.on_sent
                send_start = time.monotonic_ns() if sent is not None else 0
                self._write(answer, keep_alive)
                if self._writable is not None:
                    await self._writable
                if sent is not None:
                    sent(send_start, time.monotonic_ns())
                if not keep_alive:
                    self._close()
                    return
        finally:
            self._task = None
            self._busy = False
        self._idle()

    def _idle(self) -> None:
        """Every request answered: close if the peer is gone, else wait for the next one."""
        if self._eof:
            self._close()
        elif self._transport is not None and not self._transport.is_closing() and not self._ready:
            self._arm(KEEPALIVE_S)

    def _write(self, answer: HttpResponse, keep_alive: bool) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        body = answer.body
        length = 0
        for part in body:
            length += len(part)
        head = answer.written
        if head is None or not keep_alive:
            head = answer.head(keep_alive, length)
        if not body:
            self._transport.write(head)
        elif length <= ONE_WRITE_BYTES:  # head and body assembled once: one send
            self._transport.write(b"".join((head, *body)))
        else:
            self._transport.writelines([head, *body])

    def _refuse(self, answer: HttpResponse) -> None:
        """Answer at once and close: what comes after cannot be parsed, or must not be read."""
        self._closing = True
        self._ready.clear()
        self._write(answer, keep_alive=False)
        self._close()

    def _close(self) -> None:
        self._closing = True
        self._stop_timer()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def close(self) -> None:
        """Stop reading; close once the request being answered (if any) has its answer."""
        self._closing = True
        if not self._busy:
            self._close()

    # ---------------------------------------------------------------------------------------- timers

    def _arm(self, seconds: float) -> None:
        """The current step (a head, a body, an idle wait) must be done within ``seconds``. One timer per
        connection, due at most ``header_timeout`` ahead, stays armed across requests: a later deadline
        only moves ``_deadline`` (the timer, when due early, arms itself again), so a request on a busy
        connection costs no timer of its own."""
        now = self._loop.time()
        deadline = self._deadline = now + seconds
        timer = self._timer
        if timer is not None:
            if timer.when() <= deadline:
                return
            timer.cancel()
        self._timer = self._loop.call_at(min(deadline, now + self._header_timeout), self._expired)

    def _disarm(self) -> None:
        self._deadline = None  # the timer, when due, finds nothing to do

    def _stop_timer(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return
        now = self._loop.time()
        if now < deadline:  # due early (the deadline moved on): wait for the rest
            self._timer = self._loop.call_at(min(deadline, now + self._header_timeout), self._expired)
            return
        self._deadline = None
        if self._busy:  # answering: the handler bounds its own time; look again later
            self._arm(REQUEST_TIMEOUT_S)
            return
        if self._in_head:
            self._refuse(
                plain(408, f"the request line and headers did not arrive within {self._header_timeout:g} s")
            )
        elif self._partial:
            self._refuse(plain(408, f"the request did not arrive within {REQUEST_TIMEOUT_S:g} s"))
        else:
            self._close()  # idle keep-alive, or a connection that never sent a request

    def _grow_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _Refused(plain(431, f"request line and headers are more than {MAX_HEAD_BYTES} bytes"))
