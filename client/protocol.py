"""The zinfer wire protocol: frames, limits, field checks and the client half's records; no sockets.

A message is a list of ZeroMQ frames, the first of them the envelope::

    [PROTOCOL + command (1 byte) + msgpack header, inline tensor frame 0, inline tensor frame 1, ...]

``PROTOCOL`` names the protocol and its version, so a peer can reject a message from anything else. One
envelope frame rather than three saves two sends and two receives per message in every process on the
way; a peer still sending protocol, command and header as frames of their own gets a clear error. The
header is a msgpack map decoded with hard limits (``MAX_HEADER_BYTES`` and per-container caps); pickle is
never used. A lone INFER, EXECUTE or RESULT is read straight from its bytes into its record instead
(``decode_typed``), and falls back to the map for anything its record refuses. Records are msgspec
Structs or frozen dataclasses; ``*_to_wire``/``*_from_wire`` turn them into
header maps and back, checking every field's type, because every field that arrives from a peer is hostile
until checked (a ``*_from_wire`` raises ``ProtocolError``, never ``KeyError`` or ``TypeError``). The
broker<->worker records live in ``zinfer.client.worker_protocol`` (this file holds the framing and the
client half). ``?`` marks a key that may be absent; ``tensor`` is ``{name, datatype, shape, shm?:
[region, offset, nbytes] | frame?: n}``. Every command's frames:

Client -> broker (DEALER -> ROUTER); each is answered by one REPLY with the same ``id``, but INFER of a
decoupled model, answered by REPLYs with ``body.final`` false and a last one with ``final`` true::

    INFER            {id, model, version, inputs: [tensor], outputs?: [{name, slot?: [region, offset,
                      nbytes], alias?: true}], priority?, timeout_us?, parameters?, caller_id?}
                                                                                  + inline input frames
                                                                                               InferRequest
    CANCEL           {id, target}                      body {state: queued|running|unknown}  CancelCommand
    REGISTER         {id, name, token}                 body {size}  (the segment handed over first)
                                                                                            RegisterRegion
    UNREGISTER       {id, name}                                                           UnregisterRegion
    SERVER_LIVE      {id}                              body bool                               ServerQuery
    SERVER_READY     {id}                              body bool                               ServerQuery
    MODEL_READY      {id, model, version?}             body bool                                ModelQuery
    MODEL_METADATA   {id, model, version?}             body KServe v2 model metadata            ModelQuery
    MODEL_CONFIG     {id, model, version?}             body the config as a map                 ModelQuery
    STATISTICS       {id, model?, version?}            body {model_stats: [...]}           StatisticsQuery
                     (``version`` counts only with ``model``: without it, every model)
    REPOSITORY_INDEX {id}                              body [{name, version, state, reason}]   ServerQuery
    LOAD             {id, model}                       answered once the model is ready or failed
                                                                                               ModelChange
    UNLOAD           {id, model}                       body {model}                            ModelChange
    SERVER_STATUS    {id}                              body the status table                   ServerQuery
    TRACE_SETTING    {id, model, settings?}            body {settings}                  TraceSettingChange
                     or {id, model, trace, stamps}: a front door's timestamps of a traced request it
                     answered (``trace`` its reply's TRACE_ID parameter)      body {added}
    BUNDLE           [[command, header, n], ...]  + each entry's n inline frames, in entry order
                     several messages of one connection in one (either way; entries are never BUNDLE):
                     each is handled, and answered, exactly as if it had come alone, in order

Broker -> client::

    REPLY            {id, status, error?, body?}  + inline output frames                       Reply
                     (``id`` PROBE_ID: unasked, to learn whether the connection is still there)

Worker -> broker (DEALER -> ROUTER; heartbeats on a second DEALER whose identity ends HEARTBEAT_SUFFIX)::

    W_READY          {model, version, instance, device, pid, slot?: 2}                         WorkerReady
    W_LOAD_FAILED    {error}                                                                   LoadFailed
    W_RESULT         {batch, results: [{id, status, error?, outputs?: [tensor], final?}],
                      t?: [input_ns, infer_ns, output_ns], partial?: true}  + inline output frames
                                                                                  WorkerResult, RequestResult
    W_HEARTBEAT      {}                                                                        Heartbeat

Broker -> worker::

    W_EXECUTE        {batch, requests: [{id, inputs: [tensor], outputs: [{name, slot?, alias?}], request_id?,
                      sequence?: {id, start, end, controls: [{name, kind, data_type, values?}]},
                      parameters?: {name: bool | number | str}}],
                      regions?: {name: [fd, dev, ino]}}  + inline input frames, numbered across the batch
                                                          Execute, ExecuteRequest, SequenceFlags
    W_DROP_REGION    {name}                                                                    DropRegion
    W_CANCEL         {batch, id}  (a running request its client cancelled)                 CancelRequest
    W_HEARTBEAT      {}  (the answer to each of the worker's)                                  Heartbeat
    W_SHUTDOWN       {}                                                                        Shutdown

A command's ``id`` may be absent (its reply's ``id`` is then ""); the records of the commands other than
INFER leave an empty ``request_id`` out, so a client builds them with "" and its connection adds the id it
numbers.

This module is over 400 lines on purpose: the framing and the whole client half of the contract, each
command's frames drawn above beside its record, are read in one place.

An INFER's ``id`` is the client connection's own number for the request (replies are matched by it);
``caller_id`` is the id the user gave the request, which the broker passes on to the worker as an EXECUTE
request's ``request_id`` (Triton's ``request.request_id()``).

A reply's output in shared memory names its ``slot`` (the same region and offset), or, where the output asked
with ``alias`` true, may name instead a range wholly inside one of the request's inputs in shared memory that
holds its bytes already (an identity model's output is its input: no copy is made). A client sets ``alias``
only where every such input is memory of its own that it keeps as long as the output lives, and refuses any
other range (``ProtocolError``: "reply names shared memory this request did not reserve").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Annotated, Any

import msgpack
import msgspec

from . import framing
from .errors import ProtocolError, Status
from .wire_records import NO_PARAMETERS as NO_PARAMETERS
from .wire_records import BundledReply
from .wire_records import InferRequest as InferRequest
from .wire_records import OutputRequest as OutputRequest
from .wire_records import Reply as Reply
from .wire_records import ShmRef as ShmRef
from .wire_records import TensorRef as TensorRef

PROTOCOL = b"ZNF1"
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS = 16
MAX_TENSORS = 256
MAX_NAME = 256


def frame_limit(max_tensor_bytes: int) -> int:
    """The largest frame a server's socket takes in (``zmq.MAXMSGSIZE``): a tensor of ``max_tensor_bytes``
    or a header, whichever is larger, plus a header's worth of room. libzmq checks each frame's announced
    size before buffering it and drops a peer that sends a larger one."""
    return max(max_tensor_bytes, MAX_HEADER_BYTES) + MAX_HEADER_BYTES


Frame = bytes | memoryview


class Command(IntEnum):
    # client -> broker
    INFER = 0x01
    CANCEL = 0x02
    REGISTER = 0x03
    UNREGISTER = 0x04
    SERVER_LIVE = 0x05
    SERVER_READY = 0x06
    MODEL_READY = 0x07
    MODEL_METADATA = 0x08
    MODEL_CONFIG = 0x09
    STATISTICS = 0x0A
    REPOSITORY_INDEX = 0x0B
    LOAD = 0x0C
    UNLOAD = 0x0D
    SERVER_STATUS = 0x0E
    BUNDLE = 0x0F  # several messages in one, either way between a client and the broker
    TRACE_SETTING = 0x10  # read or change the trace settings (Triton's trace extension)
    # broker -> client
    REPLY = 0x20
    # worker <-> broker
    W_READY = 0x41
    W_HEARTBEAT = 0x42
    W_RESULT = 0x43
    W_EXECUTE = 0x44
    W_SHUTDOWN = 0x45
    W_LOAD_FAILED = 0x46
    W_DROP_REGION = 0x47
    W_CANCEL = 0x48
    W_READINESS = 0x49  # worker -> broker: what its model's own is_ready() answered
    W_CHECK_READY = 0x4A  # broker -> worker: call the model's is_ready() again


HEARTBEAT_SUFFIX = b".hb"
"""A worker's heartbeat socket has its worker's identity plus this suffix."""

PROBE_ID = "zinfer.probe"
"""The request id of the replies the server sends unasked, to learn whether a client connection is still
there; no request has this id (clients number theirs ``<pid>-<hex>-<n>``), so clients drop them."""

CLIENT_COMMANDS = frozenset(c for c in Command if c < Command.REPLY)
MAX_BUNDLE = 256
MAX_BUNDLE_FRAMES = 4 * MAX_TENSORS
"""The most messages one BUNDLE carries, and the most inline frames of all its entries together (each
entry's own at most MAX_TENSORS)."""
WORKER_COMMANDS = frozenset(
    {Command.W_READY, Command.W_HEARTBEAT, Command.W_RESULT, Command.W_LOAD_FAILED, Command.W_READINESS}
)

_PREFIX = {c: PROTOCOL + bytes([c]) for c in Command}
_PACKED_PREFIX = {int(c): PROTOCOL + bytes([c | framing.PACKED]) for c in Command}
_PLAIN = (str, bytes, bytearray, int, float, dict, list, tuple)


def _as_plain(value: Any) -> Any:
    """A subclass of a plain type as that type (msgpack takes them as their base; msgspec asks this)."""
    for kind in _PLAIN:
        if isinstance(value, kind):
            plain: Any = kind
            return plain(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


_pack = msgspec.msgpack.Encoder(enc_hook=_as_plain).encode
"""A header as MessagePack (maps, lists, strings, bytes as bin, numbers, records), encoded in C."""
ENVELOPE_HEAD = len(PROTOCOL) + 2
"""The shortest envelope frame: the protocol, the command byte and a header of at least one byte."""
_COMMAND_BY_INT = {int(c): c for c in Command}
_REPLY_BYTE = int(Command.REPLY)  # a REPLY's command byte, not packed
_REPLY_ONLY = frozenset({Command.REPLY})
_STATUS_BY_INT = {int(s): s for s in Status}
COPY_THRESHOLD = framing.COPY_THRESHOLD
"""Frames at least this large are sent without copying (see ``send_copy``)."""


Header = Mapping[str, Any] | InferRequest
"""What a message's header is built from: a header map, or INFER's record (msgspec encodes it as the map
``infer_to_wire`` writes, byte for byte)."""


OutHeader = dict[str, Any] | InferRequest
"""A header a client connection sends: a map it may add the ``id`` to, or INFER's record, which has one."""


def header_id(header: Header) -> str:
    """The ``id`` a header carries ("" if none)."""
    rid = header.request_id if isinstance(header, InferRequest) else header.get("id", "")
    return rid if isinstance(rid, str) else ""


def stamp_id(header: OutHeader, fresh: str) -> str:
    """The id a message goes out with: a record's own, or a header map's ``id`` (``fresh`` if absent)."""
    if isinstance(header, InferRequest):
        return header.request_id
    rid: str = header.setdefault("id", fresh)
    return rid


@dataclass(frozen=True, init=False)
class Message:
    """One message as read. Its own ``__init__``: built for every message, and under mypyc a dataclass's
    generated one (a frozen one above all) runs as interpreted code."""

    command: Command
    header: dict[str, Any]
    frames: list[Frame] = field(default_factory=list)
    record: Any = None  # the header read straight from its bytes (``decode_typed``), in place of the map

    def __init__(
        self, command: Command, header: dict[str, Any], frames: list[Frame] | None = None, record: Any = None
    ) -> None:
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "header", header)
        object.__setattr__(self, "frames", [] if frames is None else frames)
        object.__setattr__(self, "record", record)

    @property
    def record_or_header(self) -> Any:
        """What a ``*_from_wire`` reads: the record when there is one, else the header map."""
        return self.header if self.record is None else self.record


def encode(command: Command, header: Header | msgspec.Struct, frames: Sequence[Frame] = ()) -> list[Frame]:
    """Frames for one message: the envelope (protocol, command and header in one frame), then its inline
    frames, the small ones packed into one when there are several (``framing``). A record as the header
    (a worker's ``WorkerResult``) is written as its map."""
    if len(frames) < 2 or not framing.worth_packing(frames):
        return [_PREFIX[command] + _pack(header), *frames]
    return _encode_packed(int(command), header, frames)


def _encode_packed(command: int, payload: Any, frames: Sequence[Frame]) -> list[Frame]:
    refs, blob, large = framing.pack(frames)
    return [_PACKED_PREFIX[command] + _pack((refs, payload)), blob, *large]


def _open(frames: Sequence[Frame], limit: int) -> tuple[Command, Any, list[Frame]]:
    """The command, the unpacked header (any type) and the inline frames (unpacked) of one message."""
    if not frames:
        raise ProtocolError("message has no frames")
    envelope = frames[0]
    size = len(envelope)
    if size < ENVELOPE_HEAD or envelope[:4] != PROTOCOL:
        if size == len(PROTOCOL) and envelope == PROTOCOL:
            raise ProtocolError(
                "the envelope is one frame of protocol, command and header: the older shape with "
                "each in a frame of its own is not accepted"
            )
        if size == len(PROTOCOL) + 1 and envelope[:4] == PROTOCOL:
            raise ProtocolError("the envelope has no header after its command byte")
        raise ProtocolError("unknown protocol or version")
    cmd = envelope[4]
    command = _COMMAND_BY_INT.get(cmd & ~framing.PACKED)
    if command is None:
        raise ProtocolError(f"unknown command 0x{cmd:02x}")
    head = memoryview(envelope)[ENVELOPE_HEAD - 1 :]
    if not cmd & framing.PACKED:
        if len(frames) - 1 > limit:
            raise ProtocolError("too many inline frames")
        return command, _unpack(head), list(frames[1:])
    if len(frames) < 2 or len(frames) - 2 > limit:
        raise ProtocolError("packed message: a blob frame and at most the inline frame limit")
    top = _unpack(head)
    if not (isinstance(top, list) and len(top) == 2):
        raise ProtocolError("packed message: its header is [refs, header]")
    return command, top[1], framing.unpack(top[0], frames[1], frames[2:], limit)


def decode(frames: Sequence[Frame], allowed: frozenset[Command] | None = None) -> Message:
    """Parse and bound-check one message; raise ``ProtocolError`` on anything malformed."""
    command, header, inline = _open(frames, MAX_TENSORS)
    if allowed is not None and command not in allowed:
        raise ProtocolError(f"command {command.name} is not accepted here")
    if not isinstance(header, dict):
        raise ProtocolError("header must be a map")
    return Message(command, header, inline)


_Ref = int | Annotated[list[int], msgspec.Meta(max_length=2)]
_Refs = Annotated[list[_Ref], msgspec.Meta(max_length=MAX_TENSORS)]
TypedDecoders = tuple[Callable[[Frame], Any], Callable[[Frame], tuple[Any, Any]]]


def typed_decoders(record: type) -> TypedDecoders:
    """msgspec decoders, made once per record type, of a header that is that record: plain, and packed
    (``[refs, header]``, the refs only as ``framing.unpack`` reads them)."""
    pair: Any = tuple  # ``tuple[_Refs, record]``, made at run time
    return msgspec.msgpack.Decoder(record).decode, msgspec.msgpack.Decoder(pair[_Refs, record]).decode


def decode_typed(
    frames: Sequence[Frame], command: Command, decoders: TypedDecoders, limit: int = MAX_TENSORS
) -> Message | None:
    """A lone message of ``command`` (plain or packed) whose header is read straight from its bytes into its
    record, in C, as ``Message.record`` (its ``header`` then empty); None when the message is anything else,
    or anything in it is not what a well-formed one holds: ``decode`` and the record's ``*_from_wire`` then
    read it as before and name the fault in the same words. It takes only what that path takes: records
    refuse unknown keys (whose contents only the msgpack caps of ``_unpack`` bound). ``limit``: its inline
    frames at most (a BUNDLE's are ``MAX_BUNDLE_FRAMES``, as ``decode_many`` takes them)."""
    if not frames or len(frames) - 1 > limit:
        return None
    envelope = frames[0]
    if len(envelope) < ENVELOPE_HEAD or envelope[:4] != PROTOCOL or envelope[4] & ~framing.PACKED != command:
        return None
    head = memoryview(envelope)[ENVELOPE_HEAD - 1 :]
    if len(head) > MAX_HEADER_BYTES:
        return None
    try:
        if not envelope[4] & framing.PACKED:
            record, inline = decoders[0](head), list(frames[1:])
        elif len(frames) >= 2:
            refs, record = decoders[1](head)
            inline = framing.unpack(refs, frames[1], frames[2:], limit)
        else:
            return None
    except (msgspec.ValidationError, msgspec.DecodeError, ProtocolError, RecursionError):
        return None  # msgspec's depth limit is a RecursionError: msgpack's caps then refuse it by name
    return Message(command, {}, inline, record)


_INFER = typed_decoders(InferRequest)
_SCALARS = (str, int, float, bool, bytes, type(None))


def decode_infer(frames: Sequence[Frame]) -> Message | None:
    """A lone INFER read straight from its bytes (``decode_typed``); its parameters, which may hold
    anything, hold no containers here (the msgpack caps bound those: the map path reads them)."""
    msg = decode_typed(frames, Command.INFER, _INFER)
    if msg is None or not _infer_typed_ok(msg.record):
        return None
    return msg


def _infer_typed_ok(r: InferRequest) -> bool:
    """What ``decode_infer`` asks of an INFER msgspec read, beyond the record's own types and bounds."""
    if not tensors_named(r.inputs):
        return False
    params = r.parameters
    return not params or (len(params) <= 1 << 12 and all(isinstance(v, _SCALARS) for v in params.values()))


_INFER_BYTE = int(Command.INFER)
_InferEntry = tuple[int, InferRequest, int]
_InferIndex = Annotated[list[_InferEntry], msgspec.Meta(min_length=1, max_length=MAX_BUNDLE)]
_BundleRefs = Annotated[list[_Ref], msgspec.Meta(max_length=MAX_BUNDLE_FRAMES)]
_INFER_BUNDLE: TypedDecoders = (
    msgspec.msgpack.Decoder(_InferIndex).decode,
    msgspec.msgpack.Decoder(tuple[_BundleRefs, _InferIndex]).decode,
)


def decode_infer_bundle(frames: Sequence[Frame]) -> list[Message] | None:
    """A BUNDLE of INFERs only (what an ``AsyncClient`` and a front door send) read straight from its bytes,
    each entry as ``decode_infer`` reads a lone INFER, with the checks ``decode_many`` makes of a bundle's
    entries; None when it holds anything else, or anything in it is not what a well-formed one holds:
    ``decode_many`` and ``infer_from_wire`` then read it as before and name the fault in the same words."""
    msg = decode_typed(frames, Command.BUNDLE, _INFER_BUNDLE, MAX_BUNDLE_FRAMES)
    if msg is None:
        return None
    inline = msg.frames
    out: list[Message] = []
    at = 0
    for cmd, r, n in msg.record:
        if cmd != _INFER_BYTE or not 0 <= n <= min(MAX_TENSORS, len(inline) - at) or not _infer_typed_ok(r):
            return None
        out.append(Message(Command.INFER, {}, inline[at : at + n], r))
        at += n
    return out if at == len(inline) else None


def decode_replies(frames: Sequence[Frame]) -> list[tuple[Reply, list[Frame]]]:
    """The replies of one message from the server (a REPLY, or a BUNDLE of them), each with its inline
    frames; ``ProtocolError`` on anything malformed. A lone REPLY that is not packed, the usual answer to
    one request, is read without the general path's ``Message`` (the same limits and checks)."""
    if frames:
        envelope = frames[0]
        if len(envelope) >= ENVELOPE_HEAD and envelope[4] == _REPLY_BYTE and envelope[:4] == PROTOCOL:
            if len(frames) - 1 > MAX_TENSORS:
                raise ProtocolError("too many inline frames")
            # (a receiver's frames are memoryviews and come as a list already: neither is made again)
            view = envelope if type(envelope) is memoryview else memoryview(envelope)
            head = view[ENVELOPE_HEAD - 1 :]
            r = _typed_reply(head)
            if r is not None:
                inline: Any = frames[1:]
                reply = Reply(r.request_id, r.status, r.error, r.body)
                return [(reply, inline if type(inline) is list else list(inline))]
            header = _unpack(head)
            if not isinstance(header, dict):
                raise ProtocolError("header must be a map")
            return [(reply_from_wire(header), list(frames[1:]))]
        if len(envelope) >= ENVELOPE_HEAD and envelope[4] & ~framing.PACKED == _BUNDLE_BYTE:
            typed = _typed_reply_bundle(frames)
            if typed is not None:
                return typed
    return [(reply_from_wire(m.header), m.frames) for m in decode_many(frames, _REPLY_ONLY)]


_BUNDLE_BYTE = int(Command.BUNDLE)
_REPLY_DECODE = msgspec.msgpack.Decoder(BundledReply).decode


def _typed_reply(head: memoryview) -> BundledReply | None:
    """A lone REPLY's header read straight from its bytes (as a bundle's entries are); None when it is not
    one ``BundledReply`` takes: ``_unpack`` and ``reply_from_wire`` then read it and name the fault."""
    if len(head) > MAX_HEADER_BYTES:
        return None
    try:
        r: BundledReply = _REPLY_DECODE(head)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    return r
_ReplyEntry = tuple[int, BundledReply, int]
_ReplyIndex = Annotated[list[_ReplyEntry], msgspec.Meta(min_length=1, max_length=MAX_BUNDLE)]
_REPLY_BUNDLE = typed_decoders(_ReplyIndex)


def _typed_reply_bundle(frames: Sequence[Frame]) -> list[tuple[Reply, list[Frame]]] | None:
    """A BUNDLE of REPLYs read straight from its bytes (``decode_typed``: the index, each entry's header and
    the refs, in C), with the checks ``decode_many`` makes per entry; None when anything in it is not what a
    well-formed one holds (an unknown status, a body past ``BundledReply``'s bounds): the general path then
    reads it and names the fault in the same words."""
    msg = decode_typed(frames, Command.BUNDLE, _REPLY_BUNDLE)
    if msg is None:
        return None
    inline = msg.frames
    out: list[tuple[Reply, list[Frame]]] = []
    at = 0
    for cmd, r, n in msg.record:
        if cmd != _REPLY_BYTE or not 0 <= n <= min(MAX_TENSORS, len(inline) - at):
            return None
        out.append((Reply(r.request_id, r.status, r.error, r.body), inline[at : at + n]))
        at += n
    return out if at == len(inline) else None


def encode_bundle(items: Sequence[tuple[Command, Header, Sequence[Frame]]]) -> list[Frame]:
    """Frames for one BUNDLE of ``items`` (at most MAX_BUNDLE, MAX_BUNDLE_FRAMES inline frames in all)."""
    index = [(int(c), h, len(fs)) for c, h, fs in items]
    frames = [f for _, _, fs in items for f in fs]
    if len(frames) < 2 or not framing.worth_packing(frames):
        return [_PREFIX[Command.BUNDLE] + _pack(index), *frames]
    return _encode_packed(int(Command.BUNDLE), index, frames)


def is_bundle(frames: Sequence[Frame]) -> bool:
    if not frames or len(frames[0]) < ENVELOPE_HEAD:
        return False
    return frames[0][4] & ~framing.PACKED == Command.BUNDLE


def decode_many(frames: Sequence[Frame], allowed: frozenset[Command] | None = None) -> list[Message]:
    """The messages of one message (one, or a BUNDLE's entries); ``ProtocolError`` on anything malformed,
    in the bundle's index or in any entry (nothing of a malformed bundle is handled)."""
    if not is_bundle(frames):
        return [decode(frames, allowed)]
    _, index, inline = _open(frames, MAX_BUNDLE_FRAMES)
    if not isinstance(index, list) or not 0 < len(index) <= MAX_BUNDLE:
        raise ProtocolError(f"a bundle is a list of 1 to {MAX_BUNDLE} entries")
    out: list[Message] = []
    at = 0
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ProtocolError("a bundle entry is [command, header, frames]")
        cmd, header, n = entry
        command = _COMMAND_BY_INT.get(cmd) if isinstance(cmd, int) and not isinstance(cmd, bool) else None
        if command is None or command == Command.BUNDLE:
            raise ProtocolError("unknown command in a bundle")
        if allowed is not None and command not in allowed:
            raise ProtocolError(f"command {command.name} is not accepted here")
        if not isinstance(header, dict):
            raise ProtocolError("header must be a map")
        room = min(MAX_TENSORS, len(inline) - at)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= room:
            raise ProtocolError("a bundle entry names frames the message does not have")
        out.append(Message(command, header, inline[at : at + n]))
        at += n
    if at != len(inline):
        raise ProtocolError("a bundle carries frames no entry names")
    return out


def send_copy(frames: Sequence[Frame]) -> bool:
    """Whether to let ZeroMQ copy the frames: cheaper unless one of them is large."""
    return all(len(f) < COPY_THRESHOLD for f in frames)


def unpack_header(data: Frame) -> dict[str, Any]:
    header = _unpack(data)
    if not isinstance(header, dict):
        raise ProtocolError("header must be a map")
    return header


def _unpack(data: Frame) -> Any:
    if len(data) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(data)} bytes is over the {MAX_HEADER_BYTES} byte limit")
    try:
        header = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_HEADER_BYTES,
            max_bin_len=MAX_HEADER_BYTES,
            max_array_len=1 << 16,
            max_map_len=1 << 12,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types (ValueError, StackError, ...)
        raise ProtocolError(f"malformed header: {type(exc).__name__}") from None
    return header


# ---------------------------------------------------------------------------------------------- checks

_convert = msgspec.convert
"""A header map (or a part of one) as its record, checked in C; ``msgspec.ValidationError`` when it is not
one (the field-by-field checks then name what is wrong)."""


def _get(h: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in h:
        if default is ...:
            raise ProtocolError(f"missing field '{key}'")
        return default
    value = h[key]
    if kind is int and isinstance(value, bool):
        raise ProtocolError(f"field '{key}' must be int")
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ProtocolError(f"field '{key}' must be {name}")
    return value


def _name(h: Mapping[str, Any], key: str = "name") -> str:
    value: str = _get(h, key, str)
    if not value or len(value) > MAX_NAME:
        raise ProtocolError(f"field '{key}' must be 1 to {MAX_NAME} characters")
    return value


def _int(h: Mapping[str, Any], key: str, default: Any = ..., lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    value: int = _get(h, key, int, default)
    if not lo <= value <= hi:
        raise ProtocolError(f"field '{key}' out of range")
    return value


def _list(h: Mapping[str, Any], key: str, limit: int, default: Any = ...) -> list[Any]:
    value: list[Any] = _get(h, key, list, default)
    if len(value) > limit:
        raise ProtocolError(f"field '{key}' has more than {limit} entries")
    return value


def _optional_list(h: Mapping[str, Any], key: str, limit: int) -> list[Any] | None:
    """``_list``, where an absent field is None (the annotation is checked at run time where compiled)."""
    return _list(h, key, limit) if key in h else None


# ---------------------------------------------------------------------------------------------- records


# The per-request records are msgspec Structs, declared once in ``wire_records`` (not compiled: mypyc takes
# no Struct subclasses); a header becomes its record in C, and only what that refuses is checked field by
# field below, to name what is wrong.


def is_final(reply: Reply) -> bool:
    """Whether a reply ends its request: errors and every reply but a stream's ``final: false`` ones."""
    return not (reply.status == 0 and isinstance(reply.body, dict) and reply.body.get("final") is False)


def shm_to_wire(ref: ShmRef) -> list[Any]:
    return [ref.region, ref.offset, ref.nbytes]


def shm_from_wire(value: Any) -> ShmRef:
    try:
        return _convert(value, ShmRef)
    except msgspec.ValidationError:
        pass
    if not (isinstance(value, list) and len(value) == 3):
        raise ProtocolError("shared-memory reference must be [region, offset, nbytes]")
    region, offset, nbytes = value
    if not isinstance(region, str) or not 0 < len(region) <= MAX_NAME:
        raise ProtocolError("region name must be a non-empty string")
    for v in (offset, nbytes):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < (1 << 63):
            raise ProtocolError("offset and nbytes must be integers in [0, 2**63)")
    return ShmRef(region, offset, nbytes)


def tensor_to_wire(t: TensorRef) -> dict[str, Any]:
    d: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
    if t.shm is not None:
        d["shm"] = shm_to_wire(t.shm)
    if t.frame is not None:
        d["frame"] = t.frame
    return d


_SHAPE_LIMIT = 1 << 40
INT63_LIMIT = 1 << 63
"""Counts, offsets, sizes and ids are integers below this (``_int``'s default bound, exclusive)."""


def tensors_named(tensors: Sequence[TensorRef]) -> bool:
    """Whether each tensor names exactly one of ``shm`` and ``frame``, which a ``TensorRef`` msgspec
    decoded does not check: every decoder of a header holding tensors asks, and where not, reads the
    header field by field (``_tensor_checked`` names the fault)."""
    for t in tensors:
        if (t.shm is None) == (t.frame is None):
            return False
    return True


def tensor_from_wire(d: Any) -> TensorRef:
    """A tensor entry of a header, every field checked (see :func:`_tensor_checked` for the errors)."""
    try:
        t: TensorRef = _convert(d, TensorRef)
    except msgspec.ValidationError:
        return _tensor_checked(d)
    return t if (t.shm is None) != (t.frame is None) else _tensor_checked(d)


def _tensor_checked(d: Any) -> TensorRef:
    if not isinstance(d, dict):
        raise ProtocolError("tensor must be a map")
    shape = _list(d, "shape", MAX_DIMS)
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < (1 << 40):
            raise ProtocolError("shape dims must be integers in [0, 2**40)")
    shm = shm_from_wire(d["shm"]) if "shm" in d else None
    frame = _int(d, "frame", None, 0, MAX_TENSORS) if "frame" in d else None
    if (shm is None) == (frame is None):
        raise ProtocolError("tensor needs exactly one of 'shm' or 'frame'")
    return TensorRef(_name(d), _name(d, "datatype"), tuple(shape), shm, frame)


def output_to_wire(o: OutputRequest) -> dict[str, Any]:
    d: dict[str, Any] = {"name": o.name}
    if o.slot is not None:
        d["slot"] = shm_to_wire(o.slot)
    if o.alias:
        d["alias"] = True
    return d


def output_from_wire(d: Any) -> OutputRequest:
    try:
        return _convert(d, OutputRequest)
    except msgspec.ValidationError:
        pass
    if not isinstance(d, dict):
        raise ProtocolError("requested output must be a map")
    slot = shm_from_wire(d["slot"]) if "slot" in d else None
    return OutputRequest(_name(d), slot, _get(d, "alias", bool, False))


def infer_to_wire(r: InferRequest) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": r.request_id,
        "model": r.model,
        "version": r.version,
        "inputs": [tensor_to_wire(t) for t in r.inputs],
    }
    if r.outputs is not None:
        d["outputs"] = [output_to_wire(o) for o in r.outputs]
    if r.priority:
        d["priority"] = r.priority
    if r.timeout_us:
        d["timeout_us"] = r.timeout_us
    if r.parameters:
        d["parameters"] = dict(r.parameters)
    if r.caller_id:
        d["caller_id"] = r.caller_id
    return d


def infer_from_wire(d: Mapping[str, Any] | InferRequest) -> InferRequest:
    """An INFER header as a request, every field checked (see :func:`_infer_checked` for the errors); a
    record (decoded from its bytes already, ``decode_infer``) as it is."""
    if isinstance(d, InferRequest):
        return d
    try:
        r: InferRequest = _convert(d, InferRequest)
    except msgspec.ValidationError:
        return _infer_checked(d)
    return r if tensors_named(r.inputs) else _infer_checked(d)


def _infer_checked(d: Mapping[str, Any]) -> InferRequest:
    outputs = _optional_list(d, "outputs", MAX_TENSORS)
    params = _get(d, "parameters", dict, {})
    return InferRequest(
        request_id=_get(d, "id", str),
        model=_name(d, "model"),
        version=_int(d, "version", 0),
        inputs=tuple(tensor_from_wire(t) for t in _list(d, "inputs", MAX_TENSORS)),
        outputs=None if outputs is None else tuple(output_from_wire(o) for o in outputs),
        priority=_int(d, "priority", 0),
        timeout_us=_int(d, "timeout_us", 0),
        parameters=params,
        caller_id=_get(d, "caller_id", str, ""),
    )


def reply_to_wire(r: Reply) -> dict[str, Any]:
    d: dict[str, Any] = {"id": r.request_id, "status": int(r.status)}
    if r.error:
        d["error"] = r.error
    if r.body is not None:
        d["body"] = r.body
    return d


def reply_from_wire(d: Mapping[str, Any]) -> Reply:
    try:
        return _convert(d, Reply)
    except msgspec.ValidationError:
        pass
    status = _STATUS_BY_INT.get(_int(d, "status", lo=0, hi=255), Status.INTERNAL)
    return Reply(_get(d, "id", str), status, _get(d, "error", str, ""), d.get("body"))


def request_id_of(header: Header) -> str:
    """The request id of a header, or ``""`` when it has none usable (for error replies)."""
    rid = header_id(header)
    return rid if len(rid) <= MAX_NAME else ""


# --------------------------------------------------------------------------------- other commands
# The client commands other than INFER: one record per header shape, shared by the commands of that shape.


@dataclass(frozen=True)
class ServerQuery:
    """SERVER_LIVE, SERVER_READY, REPOSITORY_INDEX, SERVER_STATUS: the server answers from its own state."""

    request_id: str = ""


@dataclass(frozen=True)
class ModelQuery:
    """MODEL_READY, MODEL_METADATA, MODEL_CONFIG: one model version (0 = the server's choice)."""

    model: str
    version: int = 0
    request_id: str = ""


@dataclass(frozen=True)
class StatisticsQuery:
    """STATISTICS: one model (a version of it, or every version with 0), or every model (``model`` None)."""

    model: str | None = None
    version: int = 0
    request_id: str = ""


@dataclass(frozen=True)
class ModelChange:
    """LOAD, UNLOAD: a model of the repository, by name. A LOAD may carry Triton's overrides: ``config``
    (the model config as JSON text, in place of its config.pbtxt) and ``files`` (relative path to bytes,
    such as ``1/model.py``, the model's whole folder then; they need ``config``)."""

    model: str
    request_id: str = ""
    config: str = ""
    files: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class CancelCommand:
    """CANCEL: the caller's own request ``target`` (its ``id``), queued or running."""

    target: str
    request_id: str = ""


@dataclass(frozen=True)
class RegisterRegion:
    """REGISTER: claim the segment handed over on the region socket under ``token``, as region ``name``."""

    name: str
    token: bytes = b""
    request_id: str = ""


@dataclass(frozen=True)
class UnregisterRegion:
    """UNREGISTER: the caller's region ``name`` is no longer used."""

    name: str
    request_id: str = ""


TRACEPARENT = "traceparent"
"""The request parameter that carries a W3C trace context (``00-<trace id>-<span id>-<flags>``) for the
server's trace of the request to continue; the door sets it from the ``traceparent`` header or metadata."""
TRACE_ID = "zinfer_trace_id"
"""The response parameter of a traced request's reply: its trace's token, under which the front door adds
its own timestamps (``TraceSettingChange.stamps``); the door removes it from what its caller sees."""
MAX_TRACE_SETTINGS = 16
MAX_TRACE_STAMPS = 8
MAX_TRACE_VALUES = 8
MAX_TRACE_VALUE = 4096


@dataclass(frozen=True)
class TraceSettingChange:
    """TRACE_SETTING: a model's trace settings (``model`` "": the global ones); ``settings`` None reads
    them, else changes them (Triton's names; each value a string, a list of strings, or None to clear a
    model's own value; a model given an empty mapping drops its own settings)."""

    model: str = ""
    settings: Mapping[str, str | list[str] | None] | None = None
    request_id: str = ""
    # the front door's own timestamps (name, CLOCK_MONOTONIC ns) of the traced request answered under the
    # token ``trace`` (its reply's ``TRACE_ID``); with ``trace`` set, nothing else is read
    trace: str = ""
    stamps: tuple[tuple[str, int], ...] = ()


def trace_setting_to_wire(r: TraceSettingChange) -> dict[str, Any]:
    d: dict[str, Any] = {"model": r.model}
    if r.settings is not None:
        d["settings"] = dict(r.settings)
    if r.trace:
        d["trace"] = r.trace
        d["stamps"] = [[n, ns] for n, ns in r.stamps]
    return _with_id(r.request_id, d)


def _trace_stamps(d: Mapping[str, Any]) -> TraceSettingChange:
    trace: str = _get(d, "trace", str, "")
    raw = _get(d, "stamps", list, [])
    if len(trace) > 64 or len(raw) > MAX_TRACE_STAMPS:
        raise ProtocolError(f"field 'stamps': at most {MAX_TRACE_STAMPS} timestamps of a trace token")
    stamps: list[tuple[str, int]] = []
    for item in raw:
        if (
            not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str) or len(item[0]) > 64
            or not isinstance(item[1], int) or isinstance(item[1], bool) or not 0 <= item[1] < 2**63
        ):  # fmt: skip
            raise ProtocolError("field 'stamps': each must be [name, nanoseconds]")
        stamps.append((item[0], item[1]))
    return TraceSettingChange(trace=trace, stamps=tuple(stamps), request_id=request_id_of(d))


def trace_setting_from_wire(d: Mapping[str, Any]) -> TraceSettingChange:
    if "trace" in d:
        return _trace_stamps(d)
    model: str = _get(d, "model", str, "")
    if len(model) > MAX_NAME:
        raise ProtocolError(f"field 'model' must be at most {MAX_NAME} characters")
    raw = _get(d, "settings", dict, None)
    if raw is None:
        return TraceSettingChange(model, None, request_id_of(d))
    if len(raw) > MAX_TRACE_SETTINGS:
        raise ProtocolError(f"field 'settings' holds at most {MAX_TRACE_SETTINGS} settings")
    settings: dict[str, str | list[str] | None] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_NAME:
            raise ProtocolError("field 'settings': each name must be a string of 1 to 256 characters")
        values = value if isinstance(value, list) else [value]
        if value is not None and (
            len(values) > MAX_TRACE_VALUES
            or not all(isinstance(v, str) and len(v) <= MAX_TRACE_VALUE for v in values)
        ):
            raise ProtocolError(f"field 'settings': {key!r} must be a string, a list of strings, or null")
        settings[key] = value
    return TraceSettingChange(model, settings, request_id_of(d))


def _with_id(request_id: str, d: dict[str, Any]) -> dict[str, Any]:
    if request_id:
        d["id"] = request_id
    return d


def server_query_to_wire(r: ServerQuery) -> dict[str, Any]:
    return _with_id(r.request_id, {})


def server_query_from_wire(d: Mapping[str, Any]) -> ServerQuery:
    return ServerQuery(request_id_of(d))


def model_query_to_wire(r: ModelQuery) -> dict[str, Any]:
    return _with_id(r.request_id, {"model": r.model, "version": r.version})


def model_query_from_wire(d: Mapping[str, Any]) -> ModelQuery:
    return ModelQuery(_name(d, "model"), _int(d, "version", 0), request_id_of(d))


def statistics_to_wire(r: StatisticsQuery) -> dict[str, Any]:
    d: dict[str, Any] = {} if r.model is None else {"model": r.model, "version": r.version}
    return _with_id(r.request_id, d)


def statistics_from_wire(d: Mapping[str, Any]) -> StatisticsQuery:
    if "model" not in d:  # every model: a version alone means nothing
        return StatisticsQuery(None, 0, request_id_of(d))
    return StatisticsQuery(_name(d, "model"), _int(d, "version", 0), request_id_of(d))


MAX_LOAD_FILES = 256


def model_change_to_wire(r: ModelChange) -> dict[str, Any]:
    d: dict[str, Any] = {"model": r.model}
    if r.config:
        d["config"] = r.config
    if r.files:
        d["files"] = {name: bytes(data) for name, data in r.files.items()}
    return _with_id(r.request_id, d)


def model_change_from_wire(d: Mapping[str, Any]) -> ModelChange:
    files = _get(d, "files", dict, {})
    if len(files) > MAX_LOAD_FILES or not all(
        isinstance(k, str) and 0 < len(k) <= 4 * MAX_NAME and isinstance(v, bytes) for k, v in files.items()
    ):
        raise ProtocolError(f"field 'files' must map at most {MAX_LOAD_FILES} paths to bytes")
    return ModelChange(_name(d, "model"), request_id_of(d), _get(d, "config", str, ""), files)


def cancel_command_to_wire(r: CancelCommand) -> dict[str, Any]:
    return _with_id(r.request_id, {"target": r.target})


def cancel_command_from_wire(d: Mapping[str, Any]) -> CancelCommand:
    return CancelCommand(_name(d, "target"), request_id_of(d))


def register_to_wire(r: RegisterRegion) -> dict[str, Any]:
    return _with_id(r.request_id, {"name": r.name, "token": r.token})


def register_from_wire(d: Mapping[str, Any]) -> RegisterRegion:
    """The token's length and whether anything was handed over under it are the region intake's to check."""
    return RegisterRegion(_name(d), _get(d, "token", bytes, b""), request_id_of(d))


def unregister_to_wire(r: UnregisterRegion) -> dict[str, Any]:
    return _with_id(r.request_id, {"name": r.name})


def unregister_from_wire(d: Mapping[str, Any]) -> UnregisterRegion:
    return UnregisterRegion(_name(d), request_id_of(d))
