"""KServe v2 inference over HTTP, as pure functions: a request body in, ``HttpInferRequest`` out; an
``InferReply`` in, a response body out. No sockets, no shared memory, no broker.

A request body is a JSON object, optionally followed by Triton's binary-data extension: the header
``Inference-Header-Content-Length: N`` says the first N bytes are the JSON, and each input whose
``parameters`` carry ``binary_data_size`` takes that many bytes of what follows, in input order. A response
puts an output's bytes after its JSON the same way when the output (or the request's
``binary_data_output``) asks for ``binary_data``.

Every field is hostile until checked, and every check fails with ``InvalidArgument`` (HTTP 400) carrying
Triton's text where Triton has one: malformed JSON, a wrong type anywhere, a shape with negative or too
many dimensions, a tensor over ``--max-tensor-bytes``, binary sections that are too short or too long, JSON
data that does not match its shape. Nothing here allocates more than the body already holds plus the one
tensor being checked, and nothing recurses on the client's nesting.

Just over 400 lines on purpose: the JSON tensors and the binary sections of one body are one format,
checked in one pass, and splitting them would put the byte accounting of a body in two files.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from zinfer.client.dtypes import BYTES, WIRE_TYPES, deserialize_bytes, itemsize, wire_to_numpy
from zinfer.client.errors import InvalidArgument

from .bridge_records import Tensor
from .classification import parse_class_count

__all__ = [
    "HEADER_LENGTH",
    "NO_JSON",
    "HttpInferRequest",
    "InputSpec",
    "Limits",
    "OutputSpec",
    "ShmRef",
    "decode_infer_request",
    "parse_header_length",
    "resolve_inputs",
    "tensor_from_bytes",
]

HEADER_LENGTH = "Inference-Header-Content-Length"
_U64 = (1 << 64) - 1
_I64 = (1 << 63) - 1
NO_JSON = frozenset({"FP16", "BF16"})  # Triton takes and gives these only as binary data
_RESERVED_PREFIX = "triton_"
_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_TOO_BIG = "failed to parse the request JSON buffer: Number too big to be stored in double."
_NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})
# records made for every request (several per request): named tuples, several times cheaper to build than
# frozen dataclasses (``Limits`` is made once)


@dataclass(frozen=True)
class Limits:
    """``max_tensor_bytes`` bounds each tensor (``--max-tensor-bytes``); ``max_json_bytes`` the JSON part
    (JSON tensors cost several times their binary size to parse); the rest bound counts."""

    max_tensor_bytes: int = 1 << 30
    max_json_bytes: int = 64 << 20
    max_tensors: int = 1024
    max_dims: int = 32
    max_name: int = 1024

    @property
    def max_body_bytes(self) -> int:
        """The largest request body: its JSON and one maximal tensor, plus room for a few small ones."""
        return self.max_json_bytes + self.max_tensor_bytes + (1 << 20)


class ShmRef(NamedTuple):
    """A tensor in a registered system shared memory region."""

    region: str
    offset: int
    byte_size: int


class InputSpec(NamedTuple):
    """An input with its data decoded (``data``), or in shared memory (``shm``, read by the caller)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[Any] | None = None
    shm: ShmRef | None = None


class OutputSpec(NamedTuple):
    """A requested output: ``binary`` None means the request's ``binary_data_output`` decides."""

    name: str
    binary: bool | None = None
    shm: ShmRef | None = None
    class_count: int = 0  # Triton's classification extension: the top classes instead of the tensor


class HttpInferRequest(NamedTuple):
    request_id: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...] = ()
    binary_output: bool = False
    priority: int = 0
    timeout_us: int = 0
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    parameters: Mapping[str, Any] = _NO_PARAMETERS
    output_shm: bool = False  # an output is written to shared memory
    input_shm: bool = False  # an input is read from shared memory


def _bad(message: str) -> InvalidArgument:
    return InvalidArgument(message)


# ------------------------------------------------------------------------------------------ scalars


def _uint(value: Any, what: str, top: int = _U64) -> int:
    if type(value) is not int or not 0 <= value <= top:
        raise _bad(f"Unable to parse '{what}'")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise _bad(f"Unable to parse '{what}'")
    return value


def _string(value: Any, what: str, limit: int) -> str:
    if type(value) is not str or len(value) > limit:
        raise _bad(f"Unable to parse '{what}'")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _bad(f"Unable to parse '{what}'")
    return value


def _array(value: Any, what: str) -> list[Any]:
    if type(value) is not list:
        raise _bad(f"Unable to parse '{what}'")
    return value


def parse_header_length(value: str | None, content_length: int) -> int | None:
    """The ``Inference-Header-Content-Length`` header: None when absent (the whole body is JSON)."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise _bad(f"Unable to parse {HEADER_LENGTH}, got: {value[:64]}")
    length = int(text)
    if length > content_length:
        raise _bad(f"inference header size should be in range (0, {content_length}), got: {text}")
    return length


# ------------------------------------------------------------------------------------------ tensors


def _byte_size(name: str, datatype: str, shape: tuple[int, ...], limits: Limits) -> int:
    """Bytes of a fixed-size tensor (its element count for BYTES), checked against the limit."""
    count = math.prod(shape)
    size = count * (itemsize(datatype) or 1)
    # the dims other than 0 too: [0, 2**40, 2**40] holds nothing, but no array can have that shape
    if size > limits.max_tensor_bytes or (
        count == 0 and math.prod(d for d in shape if d) * (itemsize(datatype) or 1) > limits.max_tensor_bytes
    ):
        raise _bad(
            f"input '{name}' of shape {list(shape)} needs {size} bytes, more than the limit of "
            f"{limits.max_tensor_bytes} (--max-tensor-bytes)"
        )
    return size


def tensor_from_bytes(name: str, datatype: str, shape: tuple[int, ...], raw: Any) -> npt.NDArray[Any]:
    """A tensor from its raw little-endian bytes (Triton's layout; BYTES as 4-byte-length items)."""
    view = memoryview(raw).cast("B")
    if datatype == BYTES:
        try:
            return deserialize_bytes(view, shape)
        except InvalidArgument as exc:
            raise _bad(f"input '{name}': {exc}") from None
    dtype = _sized(name, datatype, shape, view.nbytes)
    return np.ndarray(shape, dtype, view)  # over the body's bytes (read-only), as frombuffer, in one call


def _sized(name: str, datatype: str, shape: tuple[int, ...], nbytes: int) -> np.dtype[Any]:
    """The dtype of a fixed-size input whose ``nbytes`` must be what its shape holds (else Triton's 400)."""
    dtype = wire_to_numpy(datatype)
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise _bad(f"unexpected total byte size {nbytes} for input '{name}', expecting {expected}")
    return dtype


def _flatten(data: list[Any], name: str) -> list[Any]:
    """The leaves of nested JSON arrays, row-major, without recursion; the nesting must be rectangular
    (every array at one depth of one length, every leaf at the same depth): ragged data is refused, as a
    shape it cannot have (Triton flattens it whatever it is, so ``[[1],[[2]]]`` passed for ``[2, 1]``)."""
    level: list[Any] = data
    while level and type(level[0]) is list:
        width = len(level[0])
        if any(type(item) is not list or len(item) != width for item in level):
            raise _bad(_SHAPE_MISMATCH)
        level = [leaf for item in level for leaf in item]
    if any(type(item) is list for item in level):
        raise _bad(_SHAPE_MISMATCH)
    return level


def _refuse_non_finite(name: str) -> None:
    """``parse_constant`` of the request's JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON
    (RFC 8259); rapidjson's text for them in a strict parse. (Triton parses with kParseNanAndInfFlag and
    takes them; zinfer does not, so no tensor or parameter can hold what a JSON reply cannot say.)"""
    raise ValueError("Invalid value.")


_DECODER = json.JSONDecoder(parse_constant=_refuse_non_finite)  # json.loads's, made once


def _json_tensor(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> npt.NDArray[Any]:
    if datatype in NO_JSON:
        raise _bad(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for "
            f"input {name}"
        )
    items = _flatten(_array(data, "data"), name)
    if len(items) != math.prod(shape):
        raise _bad(_SHAPE_MISMATCH)
    if datatype == BYTES:
        if any(type(v) is not str for v in items):
            raise _bad("Unable to parse 'data'")
        out = np.empty(len(items), dtype=object)
        out[:] = [v.encode("utf-8", "surrogatepass") for v in items]
        return out.reshape(shape)
    dtype = wire_to_numpy(datatype)
    if datatype == "BOOL":
        ok = all(type(v) is bool for v in items)
    elif dtype.kind in "iu":
        ok = all(type(v) is int for v in items)
    else:
        ok = all(type(v) is float or type(v) is int for v in items)
    if not ok:
        raise _bad("Unable to parse 'data'")
    try:
        if dtype.kind != "f":
            return np.array(items, dtype=dtype).reshape(shape)
        wide = np.array(items, dtype=np.float64)  # what the JSON said (1e999 parses as an infinity)
        if not np.isfinite(wide).all():
            raise _bad(_TOO_BIG)
        with np.errstate(over="ignore"):
            narrow = wide.astype(dtype)
        if not np.isfinite(narrow).all():
            raise ValueError(datatype)
        return narrow.reshape(shape)
    except (OverflowError, ValueError):
        raise _bad(f"Unable to parse 'data': a value does not fit {datatype} for input '{name}'") from None


def _shm_ref(params: Mapping[str, Any]) -> ShmRef | None:
    if "shared_memory_region" not in params:
        return None
    return ShmRef(
        region=_string(params["shared_memory_region"], "shared_memory_region", 256),
        offset=_uint(params.get("shared_memory_offset", 0), "shared_memory_offset", _I64),
        byte_size=_uint(params.get("shared_memory_byte_size", 0), "shared_memory_byte_size", _I64),
    )


def _content_kind(name: str, body: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    if "binary_data_size" in params:  # the common case first: one lookup each
        if "data" not in body and "shared_memory_region" not in params:
            return "'binary_data_size'"
    elif "data" in body:
        if "shared_memory_region" not in params:
            return "'data'"
    elif "shared_memory_region" in params:
        return "'shared_memory_region'"
    kinds = [k for k, present in (
        ("'data'", "data" in body),
        ("'binary_data_size'", "binary_data_size" in params),
        ("'shared_memory_region'", "shared_memory_region" in params),
    ) if present]  # fmt: skip
    if len(kinds) != 1:
        got = " no field is set" if not kinds else " set " + " ".join(kinds)
        raise _bad(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But{got}"
        )
    return kinds[0]


def _input(item: Any, binary: memoryview, pos: int, model: str, limits: Limits) -> tuple[InputSpec, int]:
    body = _object(item, "inputs")
    params = _object(body.get("parameters", {}), "parameters")
    name = _string(body.get("name"), "name", limits.max_name)
    kind = _content_kind(name, body, params)
    datatype = _string(body.get("datatype"), "datatype", 16)
    if datatype not in WIRE_TYPES:
        raise _bad(f"invalid datatype for input {name}")
    dims = _array(body.get("shape"), "shape")
    if len(dims) > limits.max_dims:
        raise _bad(f"input '{name}' has {len(dims)} dimensions, more than {limits.max_dims}")
    shape = tuple(dims)
    for d in shape:
        if type(d) is not int or not 0 <= d <= _I64:
            raise _bad("Unable to parse 'shape'")
    size = _byte_size(name, datatype, shape, limits)
    if kind == "'shared_memory_region'":
        return InputSpec(name, datatype, shape, shm=_shm_ref(params)), pos
    if kind == "'data'":
        if size == 0:
            return InputSpec(name, datatype, shape, data=tensor_from_bytes(name, datatype, shape, b"")), pos
        return InputSpec(name, datatype, shape, data=_json_tensor(name, datatype, shape, body["data"])), pos
    nbytes = _uint(params["binary_data_size"], "binary_data_size")
    if nbytes > limits.max_tensor_bytes:
        raise _bad(f"input '{name}' declares {nbytes} bytes, over the limit of {limits.max_tensor_bytes}")
    if nbytes > len(binary) - pos:
        raise _bad(
            f"unexpected size for input '{name}', expecting {nbytes - (len(binary) - pos)} additional "
            f"bytes for model '{model}'"
        )
    data = tensor_from_bytes(name, datatype, shape, binary[pos : pos + nbytes])
    return InputSpec(name, datatype, shape, data=data), pos + nbytes


def _output(item: Any, limits: Limits) -> OutputSpec:
    body = _object(item, "outputs")
    params = _object(body.get("parameters", {}), "parameters")
    name = _string(body.get("name"), "name", limits.max_name)
    count = parse_class_count(params["classification"], name) if "classification" in params else 0
    binary = _bool(params["binary_data"], "binary_data") if "binary_data" in params else None
    shm = _shm_ref(params)
    if shm is not None and binary:
        raise _bad("Output can't set both 'shared_memory_region' and 'binary_data'")
    if shm is not None and count:
        raise _bad(f"output '{name}': classification cannot be written to shared memory")
    return OutputSpec(name, binary, shm, count)


def _request_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "sequence_id":
            out[key] = value if type(value) is int and 0 <= value <= _U64 else _string(value, key, 1024)
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            out[key] = _bool(value, key)
        elif key in ("priority", "timeout"):
            out[key] = _uint(value, key)
        elif key.startswith(_RESERVED_PREFIX):
            raise _bad(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                "specified."
            )
        elif type(value) not in (str, int, bool, float):
            raise _bad(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
        elif type(value) is float and not math.isfinite(value):
            raise _bad(_TOO_BIG)
        else:
            out[key] = value
    return out


def decode_infer_request(
    body: bytes | memoryview, header_length: int | None, model: str, limits: Limits
) -> HttpInferRequest:
    """An inference request from its body (``header_length``: the parsed header, None when absent)."""
    view = memoryview(body).cast("B")
    if header_length == 0:
        raise _bad(
            f"a raw binary request ({HEADER_LENGTH}: 0) is not supported; send a JSON header with "
            "'binary_data_size' per input"
        )
    end = len(view) if header_length is None else header_length
    if end > limits.max_json_bytes:
        raise _bad(f"the request's JSON is {end} bytes, more than the limit of {limits.max_json_bytes}")
    try:
        head = view[:end]
        # json.loads's decoding of bytes, without its copy: UTF-8 when the text opens as an object does
        utf8 = len(head) > 1 and head[0] == 0x7B and head[1] != 0  # "{" then not a NUL (UTF-16/32)
        encoding = "utf-8" if utf8 else json.detect_encoding(bytes(head))
        doc = _DECODER.decode(str(head, encoding, "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise _bad(f"failed to parse the request JSON buffer: {str(exc)[:200]}") from None
    request = _object(doc, "request")
    request_id = _string(request["id"], "id", limits.max_name) if "id" in request else ""
    params = _request_parameters(_object(request.get("parameters", {}), "parameters"))
    items = _array(request.get("inputs"), "inputs")
    if len(items) > limits.max_tensors:
        raise _bad(f"the request has {len(items)} inputs, more than {limits.max_tensors}")
    binary = view[end:]
    pos = 0
    inputs: list[InputSpec] = []
    input_shm = False
    for item in items:
        spec, pos = _input(item, binary, pos, model, limits)
        inputs.append(spec)
        if spec.shm is not None:
            input_shm = True
    if pos != len(binary):
        raise _bad(f"unexpected additional input data for model '{model}'")
    names = [i.name for i in inputs]
    if len(set(names)) != len(names):
        raise _bad(f"input names repeat in the request for model '{model}'")
    outputs: Sequence[Any] = _array(request["outputs"], "outputs") if "outputs" in request else []
    if len(outputs) > limits.max_tensors:
        raise _bad(f"the request has {len(outputs)} outputs, more than {limits.max_tensors}")
    specs = tuple([_output(o, limits) for o in outputs])
    output_shm = False
    for o in specs:
        if o.shm is not None:
            output_shm = True
    if not params:  # no request parameters (the common case): the defaults
        return HttpInferRequest(
            request_id, tuple(inputs), specs, False, 0, 0, 0, False, False, params, output_shm, input_shm
        )  # fmt: skip
    pop = params.pop
    return HttpInferRequest(
        request_id, tuple(inputs), specs, pop("binary_data_output", False), pop("priority", 0),
        pop("timeout", 0), pop("sequence_id", 0), pop("sequence_start", False), pop("sequence_end", False),
        params, output_shm, input_shm,
    )  # fmt: skip


def resolve_inputs(
    request: HttpInferRequest,
    read: Callable[..., Any],
    limits: Limits,
    alloc: Callable[[tuple[int, ...], np.dtype[Any]], npt.NDArray[Any]] | None = None,
) -> tuple[Tensor, ...]:
    """The request's inputs as tensors: those in shared memory read with ``read(region, offset, size)``,
    straight into ``alloc``'s arrays when given (``read(region, offset, size, out)``: the bridge's arena,
    so the bytes go on to the broker without another copy), except BYTES tensors."""
    out = []
    for spec in request.inputs:
        if spec.shm is None:
            assert spec.data is not None
            out.append(Tensor(spec.name, spec.datatype, spec.shape, spec.data))
            continue
        if spec.shm.byte_size > limits.max_tensor_bytes:
            raise _bad(
                f"input '{spec.name}' names {spec.shm.byte_size} bytes of shared memory, more than the limit "
                f"of {limits.max_tensor_bytes}"
            )
        if alloc is not None and spec.datatype != BYTES and spec.shm.byte_size > 0:
            data = alloc(spec.shape, _sized(spec.name, spec.datatype, spec.shape, spec.shm.byte_size))
            read(spec.shm.region, spec.shm.offset, spec.shm.byte_size, data.reshape(-1).view(np.uint8))
            out.append(Tensor(spec.name, spec.datatype, spec.shape, data))
            continue
        raw = read(spec.shm.region, spec.shm.offset, spec.shm.byte_size)
        data = tensor_from_bytes(spec.name, spec.datatype, spec.shape, raw)
        out.append(Tensor(spec.name, spec.datatype, spec.shape, data))
    return tuple(out)


def load_overrides(params: Mapping[str, Any]) -> tuple[str, dict[str, bytes]]:
    """A load request's ``config`` (JSON text) and ``file:<path>`` contents (base64), as Triton takes them."""
    config = ""
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if key == "config" and isinstance(value, str):
            config = value
        elif key.startswith("file:") and isinstance(value, str):
            try:
                files[key[len("file:") :]] = base64.b64decode(value, validate=True)
            except ValueError:
                raise InvalidArgument(f"Unable to parse '{key}': the file content must be base64") from None
        else:
            raise InvalidArgument(f"Unable to parse '{key}'")
    return config, files
