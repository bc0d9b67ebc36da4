"""The bytes reserved for an output whose size the config fixes are worked out once from the metadata
(``_OutputSpec.row_bytes``) and are what the per-request computation gives."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from zinfer.client.base import _ClientBase, _OutputSpec

_META: dict[str, Any] = {
    "outputs": [
        {"name": "F", "datatype": "FP32", "shape": [-1, 3, 2]},
        {"name": "H", "datatype": "FP16", "shape": [-1]},
        {"name": "V", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "S", "datatype": "BYTES", "shape": [-1, 4]},
        {"name": "Q", "datatype": "NOT_A_TYPE", "shape": [-1, 4]},
        {"name": "Z", "datatype": "BOOL", "shape": [-1, 0]},
    ]
}


class _Offline(_ClientBase):
    def _on_new_segment(self, seg: Any) -> None:
        pass


@pytest.mark.parametrize("max_batch_size", [0, 8])
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("input_bytes", [0, 10_000])
def test_row_bytes_give_what_each_request_would_compute(
    max_batch_size: int, batch: int, input_bytes: int
) -> None:
    c = _Offline("ipc:///tmp/zinfer-row-bytes-never.sock", timeout=1.0, shm=True, arena_bytes=1 << 16,
                 max_arena_bytes=1 << 16, inline_threshold=256)  # fmt: skip
    info = c._store_info("m", 1, {**_META, "max_batch_size": max_batch_size})
    fixed = {s.name: s.row_bytes for s in info.outputs}
    assert fixed == ({"F": 24, "H": 2, "V": None, "S": None, "Q": None, "Z": 0} if max_batch_size else
                     {"F": None, "H": None, "V": None, "S": None, "Q": None, "Z": None})  # fmt: skip
    for spec in info.outputs:
        if spec.datatype == "NOT_A_TYPE":
            continue  # unknown: the request path names it, as before
        per_request = replace(spec, row_bytes=None)
        assert c._output_capacity(spec, batch, info, input_bytes) == c._output_capacity(
            per_request, batch, info, input_bytes
        )


def test_an_unknown_datatype_is_still_refused_per_request() -> None:
    c = _Offline("ipc:///tmp/zinfer-row-bytes-never.sock", timeout=1.0, shm=True, arena_bytes=1 << 16,
                 max_arena_bytes=1 << 16, inline_threshold=256)  # fmt: skip
    info = c._store_info("m", 1, {**_META, "max_batch_size": 4})
    q = next(s for s in info.outputs if s.name == "Q")
    with pytest.raises(Exception):  # noqa: B017,PT011 - whatever dtypes raises for it today
        c._output_capacity(q, 1, info, 0)
    assert _OutputSpec("x", "FP32", (2,)).row_bytes is None  # built without metadata: computed per request
