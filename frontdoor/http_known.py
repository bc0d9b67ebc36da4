"""Inference requests and replies the HTTP door has seen before: what was parsed and written once, kept.

``InferTargets`` keeps the model and version of each infer target (the route's match), by the target's text.

A client sends the same JSON header, request after request, for the same kind of call (perf_analyzer and
tritonclient's HTTP client do: same inputs, shapes and outputs; only the binary bytes after the header
differ), and a model gives the same kind of reply (same outputs, data types and shapes). So:

- ``KnownRequests.decode`` is ``http_codec.decode_infer_request`` with its JSON work kept per header text:
  the first request with a header is decoded in full; a later one with the same bytes takes the parsed
  header and only cuts its binary inputs out of the body, with the same checks, in the same order, and the
  same errors (the property test in tests/unit/test_http_known.py decodes every body both ways). Kept only
  for headers of at most ``KEY_BYTES`` that decoded in full, with no request id (it changes each call), no
  JSON data and no shared-memory input (their arrays and reads are per request).
- ``KnownReplies.encode`` is ``http_reply.encode_infer_reply`` with the reply's JSON (after its id) and
  its whole HTTP head kept per kind of reply, when every output goes as fixed-size binary data or to shared
  memory: the response is then those bytes and the outputs' raw bytes (``Written``).

Each table holds at most ``MAX_KINDS`` entries and starts afresh when full: whatever a client sends, the
memory is bounded (``MAX_KINDS`` x ``KEY_BYTES`` of keys, and as much of their parsed form).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple
from urllib.parse import unquote

import numpy as np

from zinfer.client.dtypes import BYTES
from zinfer.client.errors import InvalidArgument

from .bridge_records import InferReply
from .http_codec import (
    HEADER_LENGTH,
    HttpInferRequest,
    InputSpec,
    Limits,
    decode_infer_request,
)
from .http_reply import EncodedReply, encode_infer_reply, tensor_to_bytes

__all__ = [
    "KEY_BYTES",
    "MAX_KINDS",
    "MODEL_ROUTE",
    "InferTargets",
    "KnownReplies",
    "KeptHeader",
    "KnownRequests",
    "Written",
]

KEY_BYTES = 8192  # the longest JSON header kept
MAX_KINDS = 256  # headers (and kinds of reply) kept per door process


MODEL_ROUTE = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|ready|config|stats|trace/setting))?"
)
"""``/v2/models/{m}[/versions/{v}][/infer|/ready|/config|/stats|/trace/setting]`` (the HTTP door's routes)."""


class InferTargets:
    """The model and version of an infer request's target (``/v2/models/{m}[/versions/{v}]/infer``, with
    any query), by the target's text; None for any other target."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, str] | None] = {}

    def get(self, target: str) -> tuple[str, str] | None:
        try:
            return self._known[target]
        except KeyError:
            pass
        m = MODEL_ROUTE.fullmatch(target.split("?", 1)[0])
        found = (unquote(m.group(1)), m.group(2) or "") if m is not None and m.group(3) == "infer" else None
        if len(target) <= KEY_BYTES:
            if len(self._known) >= MAX_KINDS:
                self._known.clear()
            self._known[target] = found
        return found


class KeptHeader(NamedTuple):
    """A JSON header decoded once: the request it gave (its inputs, all binary, without data), per input
    its size in the body and its NumPy dtype, and the direct path's plans for it (``http_direct``)."""

    request: HttpInferRequest
    binary: tuple[tuple[int, np.dtype[Any]], ...]
    # by (model, version) it was sent to: an ``http_raw.RawPlan`` (``direct`` False: it cannot go direct)
    plans: dict[tuple[str, str], Any]


class KnownRequests:
    """Decoded JSON headers by their bytes (one table per door process; see the module's docstring)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._known: dict[bytes, KeptHeader] = {}

    def decode(self, body: bytes, header_length: int | None, model: str) -> HttpInferRequest:
        """``decode_infer_request(body, header_length, model, limits)``, from the header's kept form when
        its bytes were seen before."""
        return self.decode_known(self.header(body, header_length), body, header_length, model)

    def header(self, body: bytes, header_length: int | None) -> KeptHeader | None:
        """The kept form of the body's JSON header, when its bytes were seen before (else None)."""
        end = len(body) if header_length is None else header_length
        if not 0 < end <= KEY_BYTES:
            return None
        return self._known.get(body[:end])

    def decode_known(
        self, found: KeptHeader | None, body: bytes, header_length: int | None, model: str
    ) -> HttpInferRequest:
        """``decode`` of a body whose header's kept form was looked up already (``header``)."""
        end = len(body) if header_length is None else header_length
        if not 0 < end <= KEY_BYTES:
            return decode_infer_request(body, header_length, model, self.limits)
        if found is None:
            key = body[:end]
            request = decode_infer_request(body, header_length, model, self.limits)
            header = _keep(request, end, len(body))
            if header is not None:
                if len(self._known) >= MAX_KINDS:
                    self._known.clear()
                self._known[key] = header
            return request
        return _with_binary(found, body, end, model)


def _keep(request: HttpInferRequest, end: int, length: int) -> KeptHeader | None:
    """What to keep of a request decoded in full (None: nothing, it is decoded in full each time)."""
    if request.request_id or request.input_shm:
        return None
    binary: list[tuple[int, np.dtype[Any]]] = []
    inputs: list[InputSpec] = []
    total = 0
    for spec in request.inputs:
        data = spec.data
        # a binary input's array is over the body's bytes (its base); JSON data makes arrays of its own (an
        # ndarray's view, or no base); an empty tensor's 'data' is not read: over no bytes, as 0 binary bytes
        if data is None or spec.datatype == BYTES or data.base is None or isinstance(data.base, np.ndarray):
            return None
        binary.append((data.nbytes, data.dtype))
        total += data.nbytes
        inputs.append(InputSpec(spec.name, spec.datatype, spec.shape))
    if total != length - end:  # every byte after the header is one of the binary inputs'
        return None
    params = request.parameters
    frozen: Mapping[str, Any] = MappingProxyType(dict(params)) if params else params
    # no id and no shared-memory input (refused above): the request as decoded, its arrays left out
    return KeptHeader(request._replace(inputs=tuple(inputs), parameters=frozen), tuple(binary), {})


def _with_binary(header: KeptHeader, body: bytes, end: int, model: str) -> HttpInferRequest:
    """The kept request with its inputs cut from the body after the header (at ``end``): the checks and
    errors of ``http_codec._input`` and ``decode_infer_request`` on the binary part, in their order; each
    array over the body's bytes, as ``tensor_from_bytes`` makes it."""
    request = header.request
    inputs = []
    pos = end
    length = len(body)
    for spec, (nbytes, dtype) in zip(request.inputs, header.binary, strict=True):
        if nbytes > length - pos:
            raise InvalidArgument(
                f"unexpected size for input '{spec.name}', expecting {nbytes - (length - pos)} additional "
                f"bytes for model '{model}'"
            )
        data = np.ndarray(spec.shape, dtype, body, pos)
        inputs.append(InputSpec(spec.name, spec.datatype, spec.shape, data))
        pos += nbytes
    if pos != length:
        raise InvalidArgument(f"unexpected additional input data for model '{model}'")
    return HttpInferRequest(
        "", tuple(inputs), request.outputs, request.binary_output, request.priority, request.timeout_us,
        request.sequence_id, request.sequence_start, request.sequence_end, request.parameters,
        request.output_shm, False,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ replies


class Written(NamedTuple):
    """A reply encoded, with its HTTP head written ahead when its kind is kept (``head``: the status line
    and headers of a keep-alive answer, None when not written ahead)."""

    reply: EncodedReply
    head: bytes | None


class _Kind(NamedTuple):
    after_id: bytes  # the JSON (it has no id)
    wanted: tuple[int, ...]  # the outputs that go as binary parts, by index
    sizes: tuple[int, ...]  # and their sizes
    head: bytes  # the HTTP head of a keep-alive answer


class KnownReplies:
    """Written replies by kind (one table per door process; see the module's docstring)."""

    def __init__(self) -> None:
        self._known: dict[Any, _Kind] = {}

    def wanted(
        self, reply: InferReply, request: HttpInferRequest, in_shm: frozenset[str]
    ) -> tuple[int, ...] | None:
        """The outputs (by index) that go as binary parts of the kept kind of ``reply`` (None: not kept)."""
        if reply.parameters or reply.request_id or request.request_id:
            return None
        key = (reply.model, reply.version, request.outputs, request.binary_output, in_shm,
               *[t[:3] for t in reply.outputs])  # fmt: skip
        try:
            kind = self._known.get(key)
        except TypeError:
            return None
        return None if kind is None else kind.wanted

    def encode(self, reply: InferReply, request: HttpInferRequest, in_shm: frozenset[str]) -> Written:
        """``encode_infer_reply(reply, request, in_shm)``, and the answer's head when written ahead."""
        if reply.parameters or reply.request_id or request.request_id:
            return Written(encode_infer_reply(reply, request, in_shm), None)
        # what decides the JSON: which outputs go how (the request's), and each one's name, type and shape
        key = (reply.model, reply.version, request.outputs, request.binary_output, in_shm,
               *[t[:3] for t in reply.outputs])  # fmt: skip
        try:
            kind = self._known.get(key)
        except TypeError:  # a shape that is not a tuple: written in full
            return Written(encode_infer_reply(reply, request, in_shm), None)
        if kind is not None:
            parts = _binary_parts(reply, kind)
            if parts is not None:
                return Written(EncodedReply(kind.after_id, parts), kind.head)
            return Written(encode_infer_reply(reply, request, in_shm), None)
        encoded = encode_infer_reply(reply, request, in_shm)
        kind = _kind_of(reply, request, in_shm, encoded)
        if kind is None:
            return Written(encoded, None)
        if len(self._known) >= MAX_KINDS:
            self._known.clear()
        self._known[key] = kind
        return Written(encoded, kind.head)


def _binary_parts(reply: InferReply, kind: _Kind) -> tuple[memoryview, ...] | None:
    """The reply's binary parts when they have the kind's sizes (else None: written in full)."""
    parts = []
    outputs = reply.outputs
    for i, size in zip(kind.wanted, kind.sizes, strict=True):
        raw = tensor_to_bytes(outputs[i])
        if raw.nbytes != size:
            return None
        if size:
            parts.append(raw)
    return tuple(parts)


def _kind_of(
    reply: InferReply, request: HttpInferRequest, in_shm: frozenset[str], encoded: EncodedReply
) -> _Kind | None:
    """What to keep of a reply written in full (None: nothing, an output goes as JSON data or BYTES)."""
    specs = {o.name: o for o in request.outputs}
    wanted: list[int] = []
    for i, t in enumerate(reply.outputs):  # the choices of ``encode_infer_reply``, output by output
        spec = specs.get(t.name)
        if (request.outputs and spec is None) or t.name in in_shm:
            continue
        binary = spec.binary if spec is not None and spec.binary is not None else request.binary_output
        if not binary or t.datatype == BYTES:
            return None
        wanted.append(i)
    sizes = tuple([tensor_to_bytes(reply.outputs[i]).nbytes for i in wanted])
    text = encoded.json
    if sum(sizes) != sum(p.nbytes for p in encoded.binary):
        return None
    length = len(text) + sum(sizes)
    if encoded.binary:  # as ``http_server`` answers it, and ``HttpResponse.head`` writes it
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            f"{HEADER_LENGTH}: {len(text)}\r\nContent-Length: {length}\r\n\r\n"
        )
    else:
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    return _Kind(text, tuple(wanted), sizes, head.encode("latin-1"))
