"""The HTTP door's direct path: a request whose JSON header the door has seen before goes to the broker as
byte ranges of its body, and a reply of a kind seen before comes back as its frames in the HTTP body.

The usual path decodes the body (``http_known``: arrays over its bytes), makes tensors and an
``InferCall``, builds zinfer's wire request from them (``DoorClient._prepare_call``), reads the reply into
arrays and tensors (``DoorClient._reply_of``) and writes the answer (``http_known.KnownReplies``). For the
same header, model and version that work gives the same result each time but for the bytes, so once a
request has gone that way whole, a ``RawPlan`` keeps what it built:

- the wire request (``InferRequest``, every input an inline frame, no shared-memory slot), which the next
  request sends with its own id (``DoorClient.infer_raw``) and its inputs' byte ranges as the frames (``cut``:
  the checks and errors of ``http_known``'s binary inputs, in their order);
- the reply's kind (``RawReply``): the reply body it read (outputs, their types, shapes and frames) and the
  size of each frame, with the answer written for it (its JSON and HTTP head). A reply with the same body
  and frame sizes is answered with that JSON and head and the frames as the binary parts (``kind_of``);
  any other reply is read the usual way (``DoorClient`` then ``KnownReplies``), and its kind kept in turn.

A plan holds only for the model information it was built with (a reload makes new information: the
request then goes the usual way and builds a new plan), and is never used for a request with a
``traceparent`` header, a request id, shared memory, classification or JSON data (the usual path only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zinfer.client.errors import InvalidArgument, Status, from_status
from zinfer.client.protocol import Frame, InferRequest, Reply

from .http_codec import HEADER_LENGTH

__all__ = ["MAX_PLANS", "RawPlan", "RawReply", "cut", "kind_of", "reply_kind"]

MAX_PLANS = 16  # plans kept per header (one per model and version it was sent to)

_NO_HEADERS: Mapping[str, str] = {}


class RawReply:
    """A reply's kind and the answer written for it (see the module's docstring)."""

    def __init__(
        self, body: Any, sizes: tuple[int, ...], json: bytes, head: bytes, parts: tuple[int, ...]
    ) -> None:
        self.body = body  # the reply's body as read (a map)
        self.sizes = sizes  # each reply frame's size
        self.json = json
        self.head = head  # the HTTP head of a keep-alive answer
        self.parts = parts  # the frames that are the binary parts, in order (none of 0 bytes)
        self.headers: Mapping[str, str] = {HEADER_LENGTH: str(len(json))} if parts else _NO_HEADERS


class RawPlan:
    """What the usual path built for one header, model and version (see the module's docstring)."""

    def __init__(
        self,
        key: tuple[str, int],
        info: object,
        header: InferRequest,
        sizes: tuple[int, ...],
        wait: float,
        direct: bool = True,
    ) -> None:
        self.key = key  # the client's model information's key: (model, version asked for)
        self.info = info  # and the information it was built with
        self.header = header  # the wire request, its ``request_id`` "" (each request stamps its own)
        self.sizes = sizes  # each input's bytes in the body, in order
        self.wait = wait  # how long a request waits for its reply
        self.direct = direct  # False: the requests take arena slots and go the usual way
        self.reply: RawReply | None = None  # the kind of the last reply read the usual way


def cut(plan: RawPlan, body: bytes, end: int, model: str) -> list[Frame]:
    """The inputs' byte ranges after the header (at ``end``), with ``http_known``'s checks and errors."""
    frames: list[Frame] = []
    view = memoryview(body)
    pos = end
    length = len(body)
    names = plan.header.inputs
    i = 0
    for nbytes in plan.sizes:
        if nbytes > length - pos:
            raise InvalidArgument(
                f"unexpected size for input '{names[i].name}', expecting {nbytes - (length - pos)} "
                f"additional bytes for model '{model}'"
            )
        frames.append(view[pos : pos + nbytes])
        pos += nbytes
        i += 1
    if pos != length:
        raise InvalidArgument(f"unexpected additional input data for model '{model}'")
    return frames


def kind_of(plan: RawPlan, reply: Reply, frames: Sequence[Frame]) -> RawReply | None:
    """The plan's kept kind when ``reply`` is of it (None: read it the usual way); a reply that is an error
    raises it, as the usual reading does."""
    if reply.status != Status.OK:
        raise from_status(reply.status, reply.error)
    kind = plan.reply
    if kind is None or len(frames) != len(kind.sizes) or reply.body != kind.body:
        return None
    i = 0
    for size in kind.sizes:
        if len(frames[i]) != size:
            return None
        i += 1
    return kind


def reply_kind(
    reply: Reply,
    frames: Sequence[Frame],
    wanted: tuple[int, ...],
    json: bytes,
    binary: Sequence[memoryview],
    head: bytes,
) -> RawReply | None:
    """The kind of a reply read the usual way and answered with ``json`` and ``binary`` (the parts of the
    outputs ``wanted``, by index: ``KnownReplies``'s kept kind), or None when its answer is not simply its
    frames (an output in shared memory, a part that is not its whole frame, parameters)."""
    body = reply.body
    if not isinstance(body, dict) or body.get("parameters"):
        return None
    outputs = body.get("outputs")
    if not isinstance(outputs, list):
        return None
    sizes = tuple([len(f) for f in frames])
    parts: list[int] = []
    for i in wanted:
        if not 0 <= i < len(outputs):
            return None
        out = outputs[i]
        at = out.get("frame") if isinstance(out, dict) else None
        if type(at) is not int or not 0 <= at < len(sizes):
            return None
        if sizes[at]:
            parts.append(at)
    if len(parts) != len(binary):
        return None
    for at, part in zip(parts, binary, strict=True):  # each part the whole of its output's frame
        if part.nbytes != sizes[at]:
            return None
    return RawReply(body, sizes, json, head, tuple(parts))
