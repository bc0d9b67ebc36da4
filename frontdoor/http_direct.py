"""The HTTP door's direct path (``http_raw``) on the door's side: a request whose header, model and version
have a plan goes to the broker as its body's byte ranges; its answer is the reply's frames when the reply is
of the plan's kept kind, else the reply read the usual way (and its kind kept for the next one).

``HttpFrontDoor._infer`` asks ``DirectPath.answer`` first when the request's header is kept and has plans
(and no ``traceparent`` header), and ``DirectPath.plan`` after a request that went the usual way whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from zinfer.client.async_connection import Watched
from zinfer.client.errors import ClientError, InvalidArgument, RequestTimeout
from zinfer.client.protocol import CancelCommand, Command, Frame, Reply, cancel_command_to_wire

from .bridge_records import InferCall, InferReply
from .door_trace import DoorStamps
from .http_codec import HEADER_LENGTH, HttpInferRequest
from .http_known import KeptHeader, KnownReplies, Written
from .http_messages import HttpRequest, HttpResponse
from .http_raw import MAX_PLANS, RawPlan, cut, kind_of, reply_kind

if TYPE_CHECKING:
    from .bridge import Bridge

__all__ = ["DirectPath", "written_response"]

_JSON = "application/json"
_BINARY = "application/octet-stream"
_NO_SHM: frozenset[str] = frozenset()
_NO_HEADERS: dict[str, str] = {}


def _http_sent(
    stamps: DoorStamps, trace: str, recv: tuple[tuple[str, int], ...], send_start: int, send_end: int
) -> None:
    stamps.add(trace, (*recv, ("HTTP_SEND_START", send_start), ("HTTP_SEND_END", send_end)))


def written_response(written: Written, on_sent: Callable[[int, int], None] | None) -> HttpResponse:
    """The HTTP answer of an encoded reply (``KnownReplies.encode``)."""
    (json_part, binary), head = written
    if not binary:
        return HttpResponse(200, (json_part,), _JSON, _NO_HEADERS, False, on_sent, head)
    headers = {HEADER_LENGTH: str(len(json_part))}  # Triton's binary-data extension: the JSON's size
    return HttpResponse(200, (json_part, *binary), _BINARY, headers, False, on_sent, head)


Done = Callable[[HttpResponse], None]
Finish = Callable[[HttpRequest, Done, "HttpResponse | BaseException"], None]


class _Sent:
    """A request ``start`` sent: what its answer needs (``send_watched``'s context, one callback for all)."""

    def __init__(self, known: KeptHeader, plan: RawPlan, request: HttpRequest, done: Done) -> None:
        self.known = known
        self.plan = plan
        self.request = request
        self.done = done


class DirectPath:
    """Plans and direct answers of one HTTP door (its bridge, and its table of reply kinds). ``finish``:
    how the door answers a direct request (``finish(request, done, answer or error)``)."""

    def __init__(self, bridge: Bridge, replies: KnownReplies, finish: Finish) -> None:
        self.bridge = bridge
        self.client = bridge.door_client
        self.conn = self.client.connection
        self.replies = replies
        self.finish = finish

    async def answer(
        self, known: KeptHeader, request: HttpRequest, header_length: int | None, model: str, version: str
    ) -> HttpResponse | None:
        """The answer by the direct path (None: no plan holds, the request goes the usual way)."""
        key = (model, version)
        plan: RawPlan | None = known.plans.get(key)
        if plan is None:
            return None
        if not plan.direct:  # the usual way, until the model's information changes (``plan`` again)
            if not self.client.holds(plan):
                known.plans.pop(key, None)
            return None
        body = request.body
        frames = cut(plan, body, len(body) if header_length is None else header_length, model)
        sent = await self.client.infer_raw(plan, frames)
        if sent is None:  # the model's information changed: made again by the usual way
            known.plans.pop(key, None)
            return None
        return self._answer_of(known, plan, request, sent[0], sent[1])

    def start(
        self, known: KeptHeader, request: HttpRequest, header_length: int | None, model: str, version: str,
        done: Done,
    ) -> bool:  # fmt: skip
        """``answer`` without a coroutine, for a request the plan sends as it is: sent now, ``finish`` is
        called by the loop with ``done`` and its answer (or the error ``answer`` would raise). False (nothing
        sent): no plan that goes direct, or one that no longer holds, or a body the usual way refuses:
        ``answer`` takes it."""
        plan: RawPlan | None = known.plans.get((model, version))
        if plan is None or not plan.direct:
            return False
        body = request.body
        try:
            frames = cut(plan, body, len(body) if header_length is None else header_length, model)
        except InvalidArgument:  # refused the usual way, with the same text
            return False
        # ``DoorClient.holds`` read here (its interpreted method costs more than the lookup): the model's
        # information changed, ``answer`` drops the plan
        if self.client._models.get(plan.key) is not plan.info:
            return False
        conn = self.conn
        # as ``DoorClient.infer_raw`` sends it (``_replace``, called from here without its interpreted frame)
        header = msgspec.structs.replace(plan.header, request_id=conn.new_id())
        sent = _Sent(known, plan, request, done)
        try:
            conn.send_watched(Command.INFER, header, frames, plan.wait, self._replied, sent)
        except ClientError:  # closed: nothing sent, and the usual way says so
            return False
        return True

    def _replied(self, rid: str, watched: Watched) -> None:
        sent: _Sent = watched.context
        exc = watched.exception()  # (nothing cancels a watched request)
        if exc is not None:
            if isinstance(exc, RequestTimeout):  # as ``infer_raw``: the broker drops it
                self.conn.send_only(Command.CANCEL, cancel_command_to_wire(CancelCommand(rid)))
            self.finish(sent.request, sent.done, exc)
            return
        try:
            raw, rframes = watched.result()
            answer = self._answer_of(sent.known, sent.plan, sent.request, raw, rframes)
        except Exception as err:  # noqa: BLE001 - answered as the handler answers it
            self.finish(sent.request, sent.done, err)
            return
        self.finish(sent.request, sent.done, answer)

    def _answer_of(
        self, known: KeptHeader, plan: RawPlan, request: HttpRequest, raw: Reply, rframes: list[Frame]
    ) -> HttpResponse:
        """The answer to a direct request's reply (an error reply raises)."""
        kind = kind_of(plan, raw, rframes)
        if kind is not None:  # the answer is the kept JSON and head, and the frames
            if not kind.parts:
                return HttpResponse(200, (kind.json,), _JSON, _NO_HEADERS, False, None, kind.head)
            parts: list[bytes | memoryview] = [kind.json]
            for at in kind.parts:
                parts.append(memoryview(rframes[at]))
            return HttpResponse(200, parts, _BINARY, kind.headers, False, None, kind.head)
        reply = self.client.read_raw(plan, raw, rframes)
        parsed = known.request
        written = self.replies.encode(reply, parsed, _NO_SHM)
        self._keep_reply(plan, reply, parsed, raw, rframes, written)
        return written_response(written, self.on_sent(request, reply))

    def plan(self, known: KeptHeader, call: InferCall, model: str, version: str) -> None:
        """Make the plan for requests like ``call`` (just answered the usual way), one that does not go
        direct included (kept too: not asked again until the model's information changes). Its reply's
        kind is kept by the first request that goes the direct way."""
        plan = self.bridge.raw_plan(call)
        if plan is None:  # the bridge cannot say now (a recorded reply, no model information)
            return
        if len(known.plans) >= MAX_PLANS:
            known.plans.clear()
        known.plans[(model, version)] = plan

    def on_sent(self, request: HttpRequest, reply: InferReply) -> Callable[[int, int], None] | None:
        """For a reply the broker traced: what adds the door's timestamps to its trace once sent."""
        if not reply.trace:
            return None
        recv = (("HTTP_RECV_START", request.recv_start_ns), ("HTTP_RECV_END", request.recv_end_ns))
        return functools.partial(_http_sent, self.bridge.trace_stamps, reply.trace, recv)

    def _keep_reply(
        self, plan: RawPlan, reply: InferReply, parsed: HttpInferRequest, raw: Reply, frames: list[Frame],
        written: Written,
    ) -> None:  # fmt: skip
        """Keep the kind of a direct request's reply read the usual way, when its answer is its frames."""
        head = written.head
        wanted = None if head is None else self.replies.wanted(reply, parsed, _NO_SHM)
        if head is None or wanted is None:
            plan.reply = None
            return
        json_part, binary = written.reply
        plan.reply = reply_kind(raw, frames, wanted, json_part, binary, head)
