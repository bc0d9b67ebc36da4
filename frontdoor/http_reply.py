"""The body of a KServe v2 HTTP inference response, as a pure function of the reply and the request: the
JSON header, then (Triton's binary-data extension) each binary output's raw bytes in output order, with
``Inference-Header-Content-Length`` naming the JSON's size.

The reply is always JSON (RFC 8259): a floating-point output's NaN or infinity is ``null`` in JSON data
(as JavaScript's JSON.stringify writes it; tritonclient reads it back as NaN). Triton writes a bare
``NaN``/``Infinity`` there (rapidjson's kWriteNanAndInfFlag), which strict parsers reject with the whole
reply. A client that needs the exact value asks for the output as binary data."""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

import numpy as np

from zinfer.client.dtypes import BYTES, serialize_bytes
from zinfer.client.errors import InvalidArgument

from .bridge_records import InferReply, Tensor, array_bytes
from .http_codec import NO_JSON, HttpInferRequest

__all__ = ["EncodedReply", "encode_infer_reply", "tensor_to_bytes"]


class EncodedReply(NamedTuple):
    """The response: ``json`` then ``binary`` parts in order; ``header_length`` is set (the
    ``Inference-Header-Content-Length`` header) when there are binary parts."""

    json: bytes
    binary: tuple[memoryview, ...]

    @property
    def header_length(self) -> int | None:
        return len(self.json) if self.binary else None

    @property
    def content_length(self) -> int:
        return len(self.json) + sum(p.nbytes for p in self.binary)


def tensor_to_bytes(tensor: Tensor) -> memoryview:
    """An output's raw bytes, without a copy where the array is contiguous."""
    if tensor.datatype == BYTES:
        return memoryview(serialize_bytes(tensor.data))
    return array_bytes(tensor.data)


def _json_data(tensor: Tensor) -> list[Any]:
    if tensor.datatype in NO_JSON:
        raise InvalidArgument(
            f"sending {tensor.datatype} data via JSON is not supported. Please use the binary data format "
            "for output"
        )
    flat = tensor.data.reshape(-1)
    if tensor.datatype == BYTES:
        return [
            (v if isinstance(v, bytes) else str(v).encode()).decode("utf-8", "replace") for v in flat.tolist()
        ]
    if flat.dtype.kind == "f":
        finite = np.isfinite(flat)
        if not finite.all():  # JSON has no NaN or Infinity: null, as JSON.stringify writes them
            boxed = flat.astype(object)
            boxed[~finite] = None
            nulls: list[Any] = boxed.tolist()
            return nulls
    values: list[Any] = flat.tolist()
    return values


def encode_infer_reply(
    reply: InferReply, request: HttpInferRequest, in_shm: frozenset[str] = frozenset()
) -> EncodedReply:
    """The response body for ``reply``: outputs named in ``in_shm`` were written to shared memory (no data);
    the others go as JSON data or binary parts, as their request (or ``binary_data_output``) asks."""
    wanted = {o.name: o for o in request.outputs}
    outputs: list[str] = []
    parts: list[memoryview] = []
    for tensor in reply.outputs:
        spec = wanted.get(tensor.name)
        if request.outputs and spec is None:
            continue
        shape = ",".join([str(d) for d in tensor.shape])
        entry = f'{{"name":{_string(tensor.name)},"datatype":{_string(tensor.datatype)},"shape":[{shape}]'
        if tensor.name in in_shm:
            entry += "}"
        elif spec.binary if spec is not None and spec.binary is not None else request.binary_output:
            raw = tensor_to_bytes(tensor)
            entry += f',"parameters":{{"binary_data_size":{raw.nbytes}}}}}'
            if raw.nbytes:
                parts.append(raw)
        else:
            entry += f',"data":{_ENCODER.encode(_json_data(tensor))}}}'
        outputs.append(entry)
    # the JSON text assembled at once, as json.dumps(head, separators=(",", ":")) writes it (same keys, same
    # order, same escapes), without building the dicts and lists it would walk
    rid = reply.request_id or request.request_id
    text = f'{{"id":{_string(rid)},' if rid else "{"
    text += f'"model_name":{_string(reply.model)},"model_version":{_string(reply.version)},'
    if reply.parameters:
        text += f'"parameters":{_ENCODER.encode(dict(reply.parameters))},'
    text += f'"outputs":[{",".join(outputs)}]}}'
    return EncodedReply(text.encode(), tuple(parts))


_string = encode_basestring_ascii  # json.dumps's text for a string (ensure_ascii)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # json.dumps's, made once
