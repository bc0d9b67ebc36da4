"""Level ``TENSORS``: a traced request's tensors as Triton's trace file shows them, bounded.

Each tensor is one entry ``{"id", "activity", "tensor": {"name", "data", "shape", "dtype"}}``: ``activity``
is ``TENSOR_QUEUE_INPUT`` (an input as the request brought it), ``TENSOR_BACKEND_INPUT`` (the same bytes as
the model got them: zinfer converts no input) or ``TENSOR_BACKEND_OUTPUT`` (an output as the model made
it); ``data`` is the elements in row-major order joined by commas (numbers as ``%g`` writes them, BOOL as
1/0, BYTES elements as text), ``shape`` the dims joined by commas, ``dtype`` the wire name (``FP32``).

Sizes are the client's, so every one is bounded: at most ``MAX_ELEMENTS`` elements of a tensor are written
(``"truncated": true`` and ``"elements"``, the full count, mark a cut), at most ``MAX_TEXT`` characters of
one BYTES element, at most ``MAX_TENSORS`` tensors of one activity per request. Only the elements written
are read; a tensor whose bytes cannot be read (a region gone, a range outside it) is written with empty
data and ``"unreadable": true``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from zinfer.client.dtypes import BYTES, wire_to_numpy
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Frame, ShmRef, TensorRef

MAX_ELEMENTS = 1024  # elements of one tensor written to a trace
MAX_TEXT = 256  # characters of one BYTES element
MAX_TENSORS = 64  # tensors of one activity of one request

Read = Callable[[ShmRef], "memoryview | None"]
"""A read-only view of a region's range (``RegionReader.read``), or None where it cannot be read."""


def _numbers(datatype: str, buf: memoryview | bytes, count: int) -> str:
    dtype = wire_to_numpy(datatype)
    n = min(count, len(buf) // dtype.itemsize)
    arr = np.frombuffer(buf, dtype=dtype, count=n)
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in arr.tolist())
    if arr.dtype.kind == "f" or datatype == "BF16":
        return ",".join(f"{v:g}" for v in arr.astype(np.float64).tolist())
    return ",".join(str(v) for v in arr.tolist())


def _strings(buf: memoryview | bytes, count: int) -> str:
    out: list[str] = []
    pos, size = 0, len(buf)
    while len(out) < count and pos + 4 <= size:
        (length,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if length > size - pos:
            break
        text = bytes(buf[pos : pos + min(length, MAX_TEXT * 4)]).decode("utf-8", "replace")[:MAX_TEXT]
        out.append(text)
        pos += length
    return ",".join(out)


def tensor_entry(
    trace_id: int,
    activity: str,
    name: str,
    datatype: str,
    shape: Sequence[int],
    buf: memoryview | bytes | None,
) -> dict[str, Any]:
    """One entry of Triton's trace file for a tensor (``buf`` None: its bytes could not be read)."""
    elements = math.prod(shape)
    shown = min(elements, MAX_ELEMENTS)
    tensor: dict[str, Any] = {"name": name, "data": "", "shape": ",".join(str(d) for d in shape),
                              "dtype": datatype}  # fmt: skip
    if buf is None:
        tensor["unreadable"] = True
    elif datatype == BYTES:
        tensor["data"] = _strings(buf, shown)
    else:
        try:
            tensor["data"] = _numbers(datatype, buf, shown)
        except (TypeError, ValueError, InvalidArgument):  # a type NumPy cannot read: shown as unreadable
            tensor["unreadable"] = True
    if shown < elements:
        tensor["truncated"] = True
        tensor["elements"] = elements
    return {"id": trace_id, "activity": activity, "tensor": tensor}


def _read(read: Read, ref: ShmRef, datatype: str) -> memoryview | None:
    """A view of at most what ``MAX_ELEMENTS`` elements need (all of a BYTES tensor, whose elements vary)."""
    if datatype != BYTES:
        try:
            need = MAX_ELEMENTS * wire_to_numpy(datatype).itemsize
        except (TypeError, ValueError, InvalidArgument):
            need = 0
        ref = ShmRef(ref.region, ref.offset, max(0, min(ref.nbytes, need)))
    return read(ref)


def input_entries(
    trace_id: int, inputs: Iterable[TensorRef], frames: Sequence[Frame], read: Read
) -> list[dict[str, Any]]:
    """``TENSOR_QUEUE_INPUT`` entries of a request's inputs (inline frames, or regions through ``read``)."""
    out: list[dict[str, Any]] = []
    for t in inputs:
        if len(out) >= MAX_TENSORS:
            break
        if t.shm is not None:
            view = _read(read, t.shm, t.datatype)
            try:
                out.append(tensor_entry(trace_id, "TENSOR_QUEUE_INPUT", t.name, t.datatype, t.shape, view))
            finally:
                if view is not None:
                    view.release()
        else:
            buf = frames[t.frame] if t.frame is not None and 0 <= t.frame < len(frames) else None
            data = memoryview(buf) if buf is not None else None
            out.append(tensor_entry(trace_id, "TENSOR_QUEUE_INPUT", t.name, t.datatype, t.shape, data))
    return out


def output_entries(
    trace_id: int, outputs: Iterable[Mapping[str, Any]], frames: Sequence[Frame], read: Read
) -> list[dict[str, Any]]:
    """``TENSOR_BACKEND_OUTPUT`` entries of a result's outputs in wire form (``{"name", "datatype",
    "shape", "frame" | "shm"}``); anything malformed is skipped, never raised."""
    out: list[dict[str, Any]] = []
    for t in outputs:
        if len(out) >= MAX_TENSORS:
            break
        try:
            name, datatype = str(t["name"]), str(t["datatype"])
            shape = tuple(int(d) for d in t["shape"])
            if "frame" in t:
                idx = int(t["frame"])
                data = memoryview(frames[idx]) if 0 <= idx < len(frames) else None
                out.append(tensor_entry(trace_id, "TENSOR_BACKEND_OUTPUT", name, datatype, shape, data))
                continue
            region, offset, nbytes = t["shm"]
            ref = ShmRef(str(region), int(offset), int(nbytes))
        except (KeyError, TypeError, ValueError):
            continue
        view = _read(read, ref, datatype)
        try:
            out.append(tensor_entry(trace_id, "TENSOR_BACKEND_OUTPUT", name, datatype, shape, view))
        finally:
            if view is not None:
                view.release()
    return out


def as_backend_inputs(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``TENSOR_QUEUE_INPUT`` entries again as ``TENSOR_BACKEND_INPUT`` (the model got those bytes)."""
    queued = [e for e in entries if e["activity"] == "TENSOR_QUEUE_INPUT"]
    return [{**e, "activity": "TENSOR_BACKEND_INPUT"} for e in queued]
