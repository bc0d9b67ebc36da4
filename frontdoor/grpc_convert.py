"""Triton's gRPC messages (tritonclient's generated ``service_pb2``) to the bridge's records and back.

Pure functions: no sockets, no broker. Every field of a request is hostile until checked here (data type on
the allow-list, dims non-negative, byte counts equal to shape times item size, shared-memory ranges within
their region), and a bad one is an ``InvalidArgument`` or a ``FrontDoorError`` naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from zinfer.client import dtypes
from zinfer.client.errors import InvalidArgument

from .bridge_records import InferCall, InferReply, ModelMetadata, ModelStatistics, RepositoryModel, Tensor
from .classification import parse_class_count
from .door_client import wire_bytes, with_wire
from .sysshm import CallerShm

__all__ = [
    "config_message",
    "infer_call",
    "infer_response",
    "metadata_message",
    "repository_message",
    "statistics_message",
]

MAX_DIMS = 16
MAX_ELEMENTS = 1 << 40  # past any message limit: a shape claiming more is malformed, not merely large
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ITEMSIZE = {w: dtypes.itemsize(w) for w in dtypes.WIRE_TYPES}  # the allowed data types, with their sizes
_NUMPY = {w: dtypes.wire_to_numpy(w) for w in dtypes.WIRE_TYPES if w != dtypes.BYTES}
Alloc = Callable[[tuple[int, ...], np.dtype[Any]], npt.NDArray[Any]]
"""Where an input read from shared memory goes (the bridge's arena: ``Bridge.empty``)."""


# ---------------------------------------------------------------------------------------- parameters


Param = bool | int | float | str | bytes
"""A parameter's value (``bytes_param``'s only in a load's ``file:`` overrides)."""


def parameter(p: service_pb2.InferParameter) -> Param:
    kind = p.WhichOneof("parameter_choice")
    if kind is None:
        return ""
    value: Param = getattr(p, kind)
    return value


def parameters(entries: Mapping[str, service_pb2.InferParameter]) -> dict[str, Param]:
    return {k: parameter(v) for k, v in entries.items()}


def load_overrides(entries: Mapping[str, Any]) -> tuple[str, dict[str, bytes]]:
    """A RepositoryModelLoad's ``config`` (JSON text) and ``file:<path>`` contents, as Triton takes them."""
    config = ""
    files: dict[str, bytes] = {}
    for key, value in entries.items():
        kind = value.WhichOneof("parameter_choice")
        if key == "config" and kind == "string_param":
            config = value.string_param
        elif key.startswith("file:") and kind == "bytes_param":
            files[key[len("file:") :]] = value.bytes_param
        else:
            raise InvalidArgument(f"unexpected load parameter '{key}' ({kind})")
    return config, files


def _int(params: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"parameter '{key}' must be an integer")
    return value


def _bool(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"parameter '{key}' must be a bool")
    return value


def _sequence_id(params: Mapping[str, Any]) -> int | str:
    value = params.get("sequence_id", 0)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidArgument("parameter 'sequence_id' must be an integer or a string")
    if isinstance(value, int) and not 0 <= value < 1 << 64:
        raise InvalidArgument("parameter 'sequence_id' must be an unsigned 64-bit integer")
    if isinstance(value, str) and len(value) > 256:
        raise InvalidArgument("parameter 'sequence_id' is longer than 256 characters")
    return value


# ---------------------------------------------------------------------------------------- requests


def _shm_ref(params: Mapping[str, Any], what: str) -> tuple[str, int, int] | None:
    region = params.get("shared_memory_region")
    if region is None:
        return None
    if not isinstance(region, str):
        raise InvalidArgument(f"{what}: parameter 'shared_memory_region' must be a string")
    return region, _int(params, "shared_memory_offset"), _int(params, "shared_memory_byte_size")


def _shape(name: str, dims: Any) -> tuple[int, ...]:
    shape = tuple(dims[:])  # a slice of protobuf's repeated field: a list, several times faster to walk
    if len(shape) > MAX_DIMS or (shape and min(shape) < 0) or math.prod(shape) > MAX_ELEMENTS:
        raise InvalidArgument(f"input '{name}' has an invalid shape {list(shape)[:MAX_DIMS]}")
    return shape


def _expected_bytes(name: str, model: str, datatype: str, shape: tuple[int, ...], got: int) -> int:
    count = math.prod(shape)
    expected = count * _ITEMSIZE[datatype]
    if expected != got:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {got}"
        )
    return count


def _from_bytes(
    name: str, model: str, datatype: str, shape: tuple[int, ...], raw: bytes | npt.NDArray[Any]
) -> npt.NDArray[Any]:
    if datatype == dtypes.BYTES:
        wire = raw if isinstance(raw, bytes) else raw.tobytes()
        return with_wire(dtypes.deserialize_bytes(wire, shape), wire)  # the broker gets ``wire`` as it is
    count = _expected_bytes(name, model, datatype, shape, len(raw) if isinstance(raw, bytes) else raw.nbytes)
    return np.frombuffer(raw, dtype=_NUMPY[datatype], count=count).reshape(shape)


def _from_contents(name: str, datatype: str, shape: tuple[int, ...], contents: Any) -> npt.NDArray[Any]:
    field = _CONTENTS.get(datatype)
    if field is None:
        raise InvalidArgument(f"input '{name}': {datatype} data must come in raw_input_contents")
    values = getattr(contents, field)
    if len(values) != math.prod(shape):
        raise InvalidArgument(
            f"unexpected number of {datatype} values for input '{name}': expected {math.prod(shape)}, "
            f"got {len(values)}"
        )
    if datatype == dtypes.BYTES:
        return np.array(list(values), dtype=np.object_).reshape(shape)
    return np.array(values, dtype=dtypes.wire_to_numpy(datatype)).reshape(shape)


def _from_shm(
    name: str, model: str, datatype: str, shape: tuple[int, ...], ref: tuple[str, int, int],
    shm: CallerShm | None, alloc: Alloc | None,
) -> npt.NDArray[Any]:  # fmt: skip
    """An input's data read from the caller's shared-memory region (into ``alloc``'s array when given)."""
    if shm is None:
        raise InvalidArgument("system shared memory is not available here")
    region, offset, size = ref
    if datatype != dtypes.BYTES:
        _expected_bytes(name, model, datatype, shape, size)
    if alloc is not None and datatype != dtypes.BYTES and size > 0:
        arr = alloc(shape, _NUMPY[datatype])
        shm.read(region, offset, size, arr.reshape(-1).view(np.uint8))
        return arr
    return _from_bytes(name, model, datatype, shape, shm.read(region, offset, size))


def infer_call(
    request: service_pb2.ModelInferRequest, shm: CallerShm | None, alloc: Alloc | None = None
) -> InferCall:
    """The bridge's call for a ``ModelInferRequest``; inputs in shared memory are read from their region
    (into ``alloc``'s arrays when given). Each protobuf field is read once (every read of a field of a
    parsed message builds a new Python object)."""
    model = request.model_name
    if not model:
        raise InvalidArgument("the request names no model")
    entries = request.parameters
    params = parameters(entries) if entries else {}
    for key, value in params.items():
        if isinstance(value, bytes):  # InferParameter's bytes_param: nothing a model's parameters can hold
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )
    raw = request.raw_input_contents[:]
    used_raw = 0
    inputs = []
    seen: set[str] = set()
    for t in request.inputs[:]:
        name, datatype = t.name, t.datatype
        if name in seen:
            raise InvalidArgument(f"input '{name}' appears more than once")
        seen.add(name)
        if datatype not in _ITEMSIZE:
            raise InvalidArgument(f"input '{name}' has an unknown data type {datatype!r}")
        shape = _shape(name, t.shape)
        tparams = t.parameters
        ref = _shm_ref(parameters(tparams), f"input '{name}'") if tparams else None
        data: npt.NDArray[Any]
        if ref is not None:
            data = _from_shm(name, model, datatype, shape, ref, shm, alloc)
        elif t.HasField("contents"):
            if raw:  # Triton's text, which clients match on
                raise InvalidArgument(
                    f"contents field must not be specified when using raw_input_contents for '{name}' for "
                    f"model '{model}'"
                )
            data = _from_contents(name, datatype, shape, t.contents)
        else:
            if used_raw >= len(raw):
                raise InvalidArgument(f"input '{name}' has no data")
            data = _from_bytes(name, model, datatype, shape, raw[used_raw])
            used_raw += 1
        inputs.append(Tensor(name, datatype, shape, data))
    if used_raw != len(raw):
        raise InvalidArgument(f"the request has {len(raw)} raw_input_contents for {used_raw} inputs")
    outputs = []
    class_counts: dict[str, int] = {}
    for o in request.outputs[:]:
        oname, oentries = o.name, o.parameters
        oparams = parameters(oentries) if oentries else {}
        if "classification" in oparams:
            count = parse_class_count(oparams["classification"], oname)
            if count and "shared_memory_region" in oparams:
                raise InvalidArgument(f"output '{oname}': classification cannot be written to shared memory")
            if count:
                class_counts[oname] = count
        outputs.append(oname)
    if not params:  # no parameters: the defaults, without looking them up
        return InferCall(model, tuple(inputs), request.model_version, tuple(outputs), request.id,
                         class_counts=class_counts)  # fmt: skip
    return InferCall(
        model, tuple(inputs), request.model_version, tuple(outputs), request.id, _int(params, "priority"),
        _int(params, "timeout"), _sequence_id(params), _bool(params, "sequence_start"),
        _bool(params, "sequence_end"), params, class_counts,
    )  # fmt: skip


def output_regions(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, int, int]]:
    """The outputs the request wants written into shared memory: ``{name: (region, offset, byte_size)}``."""
    found = {}
    for o in request.outputs:
        if not o.parameters:
            continue
        ref = _shm_ref(parameters(o.parameters), f"output '{o.name}'")
        if ref is not None:
            found[o.name] = ref
    return found


# ---------------------------------------------------------------------------------------- responses


def _set(entry: service_pb2.InferParameter, value: bool | int | float | str) -> None:
    if isinstance(value, str):
        entry.string_param = value
    elif isinstance(value, bool):
        entry.bool_param = value
    elif isinstance(value, float):
        entry.double_param = value
    elif value >= 1 << 63:
        entry.uint64_param = value
    else:
        entry.int64_param = value


def infer_response(
    reply: InferReply,
    regions: Mapping[str, tuple[str, int, int]] | None = None,
    shm: CallerShm | None = None,
) -> service_pb2.ModelInferResponse:
    """The response for ``reply``; outputs named in ``regions`` go into shared memory instead."""
    response = service_pb2.ModelInferResponse(
        model_name=reply.model, model_version=reply.version, id=reply.request_id
    )
    if reply.parameters:  # the response's own parameters (a Triton model's)
        for key, value in reply.parameters.items():
            _set(response.parameters[key], value)
    outputs, contents = response.outputs, response.raw_output_contents
    for t in reply.outputs:
        out = outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        ref = regions.get(t.name) if regions else None
        if ref is None or shm is None:  # the usual case: the bytes in the message (one copy)
            data = t.data
            contents.append(wire_bytes(data) if t.datatype == dtypes.BYTES else data.tobytes())
            continue
        region, offset, size = ref
        view = _tensor_bytes(t)
        shm.write(region, offset, size, view)
        _set(out.parameters["shared_memory_region"], region)
        _set(out.parameters["shared_memory_byte_size"], len(view))
        if offset:
            _set(out.parameters["shared_memory_offset"], offset)
        # an empty entry, as Triton adds one for every output: clients read raw_output_contents by
        # output index (perf_analyzer crashed on a response without it)
        contents.append(b"")
    return response


def _tensor_bytes(t: Tensor) -> bytes | memoryview:
    if t.datatype == dtypes.BYTES:
        return wire_bytes(t.data)
    arr = np.ascontiguousarray(t.data)
    return memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- the rest


def metadata_message(meta: ModelMetadata) -> service_pb2.ModelMetadataResponse:
    response = service_pb2.ModelMetadataResponse(
        name=meta.name, versions=list(meta.versions), platform=meta.platform
    )
    for spec in meta.inputs:
        response.inputs.add(name=spec.name, datatype=spec.datatype, shape=list(spec.shape))
    for spec in meta.outputs:
        response.outputs.add(name=spec.name, datatype=spec.datatype, shape=list(spec.shape))
    return response


def config_message(config: Mapping[str, Any]) -> service_pb2.ModelConfigResponse:
    """Triton's JSON form of a config as ``ModelConfig``; fields Triton's message lacks are dropped."""
    message = model_config_pb2.ModelConfig()
    json_format.ParseDict(_drop_empty(dict(config)), message, ignore_unknown_fields=True)
    return service_pb2.ModelConfigResponse(config=message)


def _drop_empty(value: Any) -> Any:
    """Nulls out (protobuf's JSON parser refuses ``null`` for message and scalar fields)."""
    if isinstance(value, dict):
        return {k: _drop_empty(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def statistics_message(stats: tuple[ModelStatistics, ...]) -> service_pb2.ModelStatisticsResponse:
    response = service_pb2.ModelStatisticsResponse()
    for s in stats:
        m = response.model_stats.add(
            name=s.name,
            version=s.version,
            last_inference=s.last_inference_ms,
            inference_count=s.inference_count,
            execution_count=s.execution_count,
        )
        for key, d in s.durations.items():
            getattr(m.inference_stats, key).CopyFrom(service_pb2.StatisticDuration(count=d.count, ns=d.ns))
        for b in s.batch_stats:
            batch = m.batch_stats.add(batch_size=b.batch_size)
            batch.compute_infer.count = b.count  # zinfer counts executions per size, not their time
    return response


def repository_message(models: tuple[RepositoryModel, ...]) -> service_pb2.RepositoryIndexResponse:
    response = service_pb2.RepositoryIndexResponse()
    for m in models:
        response.models.add(name=m.name, version=m.version, state=m.state, reason=m.reason)
    return response
