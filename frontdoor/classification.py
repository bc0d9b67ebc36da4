"""Triton's classification extension: an output requested with ``classification: N`` (tritonclient's
``class_count=N``) comes back as the top N entries of each batch row instead of the tensor.

As Triton's HTTP and gRPC servers do it (``TopkClassifications`` in its ``classification.cc``, the shapes
in its ``http_server.cc``):

- the answer is a ``BYTES`` tensor of ``"<value>:<index>"`` strings, ``"<value>:<index>:<label>"`` when the
  model config's output names a ``label_filename`` and the label of that index is not empty;
- ``<value>`` is C++'s ``std::to_string`` of the element: ``%f`` (six decimals) for FP32 and FP64, the
  integer for the INT and UINT types; ``<index>`` counts within one batch row;
- the shape is ``[batch, n]`` when the model batches (``max_batch_size > 0``: the first dim is the batch),
  ``[n]`` when it does not, with ``n = min(N, elements per row)``;
- the order is by value, highest first; ties go to the lower index (Triton's ``std::sort`` leaves them in
  no promised order), NaN ranks lowest;
- only the INT, UINT, FP32 and FP64 types: another is refused with Triton's text ``class result not
  available for output due to unsupported type 'BYTES'``, and a row of more than 1,000,000 elements with
  ``classification output tensor too large`` (Triton's bound);
- ``N`` 0 means the tensor itself, as in Triton.

The front door computes it on the returned tensor. Labels come from the model's own config and the
server's model repository (``<repository>/<model>/<label_filename>``), never from a path a client names;
``LabelFiles`` reads such a file safely: a plain relative name, resolved within the model's folder (no
symlink leading out of it), a regular file of at most ``MAX_LABEL_BYTES``, one label per line.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from zinfer.client.dtypes import BYTES
from zinfer.client.errors import ConfigError, InvalidArgument
from zinfer.modelconfig.model_files import (
    MAX_LABEL_BYTES,
    FileIdentity,
    plain_relative,
    read_model_file_if_changed,
    split_labels,
)

from .bridge_records import InferReply, Tensor

__all__ = [
    "MAX_CLASSIFICATION_ELEMENTS",
    "MAX_LABEL_BYTES",
    "LabelFiles",
    "classify_reply",
    "parse_class_count",
    "top_k",
]

MAX_CLASSIFICATION_ELEMENTS = 1_000_000
"""The most elements one batch row may have (Triton's bound, "classification output tensor too large")."""
_MAX_CACHED = 256
_THREAD_ABOVE = 1 << 16  # elements: a larger tensor is sorted off the event loop
_FLOATS = frozenset({"FP32", "FP64"})
_INTEGERS = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})


def parse_class_count(value: Any, output: str) -> int:
    """The ``classification`` parameter of a requested output: a non-negative integer (0: no
    classification). gRPC sends it as ``int64_param``, HTTP as a JSON number."""
    if type(value) is not int:
        raise InvalidArgument(
            f"output '{output}': invalid value type for 'classification' parameter, expected int64_param"
        )
    if value < 0:
        raise InvalidArgument(
            f"output '{output}': invalid value for 'classification' parameter, expected >= 0"
        )
    return value


def _values(rows: npt.NDArray[Any], floats: bool) -> list[list[str]]:
    if floats:
        return [[f"{v:.6f}" for v in row] for row in rows.astype(np.float64).tolist()]
    return [[str(v) for v in row] for row in rows.tolist()]


def top_k(tensor: Tensor, count: int, batched: bool, labels: Sequence[bytes] = ()) -> Tensor:
    """The classification of ``tensor`` (``count`` classes per row; ``batched``: the first dim is the
    batch), labels by class index (an index past them, or an empty label, gets none)."""
    datatype = tensor.datatype
    if datatype not in _FLOATS and datatype not in _INTEGERS:
        raise InvalidArgument(f"class result not available for output due to unsupported type '{datatype}'")
    data = np.asarray(tensor.data)
    batched = batched and data.ndim > 0
    per_row = math.prod(data.shape[1:]) if batched else data.size
    if per_row > MAX_CLASSIFICATION_ELEMENTS:
        raise InvalidArgument("classification output tensor too large")
    n = min(count, per_row)
    rows = data.reshape(data.shape[0] if batched else 1, per_row)
    if datatype in _FLOATS:  # NaN after every number, then by value down, then by index up
        index = np.broadcast_to(np.arange(per_row), rows.shape)
        order = np.lexsort((index, np.where(np.isnan(rows), 0.0, -rows.astype(np.float64)), np.isnan(rows)))
        order = order[:, :n]
    else:  # descending, ties by the lower index: a stable ascending sort of the reversed row, backwards
        order = (per_row - 1) - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :n]
    picked = np.take_along_axis(rows, order, axis=1)
    texts = _values(picked, datatype in _FLOATS)
    out = np.empty((len(texts), n), dtype=np.object_)
    for r, (row_texts, row_order) in enumerate(zip(texts, order.tolist(), strict=True)):
        for c, (text, index) in enumerate(zip(row_texts, row_order, strict=True)):
            item = f"{text}:{index}".encode()
            label = labels[index] if index < len(labels) else b""
            out[r, c] = item + b":" + label if label else item
    shape = (rows.shape[0], n) if batched else (n,)
    return Tensor(tensor.name, BYTES, shape, out.reshape(shape))


# ------------------------------------------------------------------------------------------ labels


class LabelFiles:
    """Label files of the model repository at ``repository`` (None: no labels), cached by file identity
    (a changed file is read again)."""

    def __init__(self, repository: Path | None = None, max_bytes: int = MAX_LABEL_BYTES) -> None:
        self.repository = repository
        self.max_bytes = max_bytes
        self._cache: dict[tuple[str, str], tuple[FileIdentity, tuple[bytes, ...]]] = {}

    def labels(self, model: str, label_filename: str) -> tuple[bytes, ...]:
        """The labels of ``label_filename`` in ``model``'s folder, one per line; an error names why a file
        cannot be used."""
        if self.repository is None:
            return ()
        if not plain_relative(model) or "/" in model:
            raise InvalidArgument(f"model '{model}': not a model folder name")
        found = self._cache.get((model, label_filename))
        try:
            identity, raw = read_model_file_if_changed(
                self.repository / model, label_filename, self.max_bytes, found[0] if found else None
            )
        except ConfigError as exc:
            raise InvalidArgument(f"model '{model}': label file '{label_filename}' {exc}") from None
        if raw is None and found is not None:
            return found[1]
        labels = split_labels(raw or b"")
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
        self._cache[(model, label_filename)] = (identity, labels)
        return labels


# ------------------------------------------------------------------------------------------ replies


class _Configs(Protocol):
    async def model_config(self, model: str, version: str = "") -> Mapping[str, Any]: ...


async def classify_reply(
    configs: _Configs, label_files: LabelFiles, reply: InferReply, counts: Mapping[str, int]
) -> InferReply:
    """``reply`` with each output named in ``counts`` (with a count above 0) replaced by its
    classification; the model config of the version that answered says whether it batches and its
    outputs' label files."""
    wanted = {name: n for name, n in counts.items() if n > 0}
    if not wanted or not any(t.name in wanted for t in reply.outputs):
        return reply
    config = await configs.model_config(reply.model, reply.version)
    batched = int(config.get("max_batch_size") or 0) > 0
    label_names = {
        str(o.get("name", "")): str(o.get("label_filename") or "") for o in config.get("output") or ()
    }
    outputs = []
    for t in reply.outputs:
        n = wanted.get(t.name)
        if n is None:
            outputs.append(t)
            continue
        filename = label_names.get(t.name, "")
        labels = label_files.labels(reply.model, filename) if filename else ()
        if np.asarray(t.data).size > _THREAD_ABOVE:
            outputs.append(await asyncio.to_thread(top_k, t, n, batched, labels))
        else:
            outputs.append(top_k(t, n, batched, labels))
    return reply._replace(outputs=tuple(outputs))
