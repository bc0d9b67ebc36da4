"""Decoupled models in the worker: each response leaves at once, then a final status."""

from __future__ import annotations

from typing import Any

import numpy as np

from zinfer.client import dtypes
from zinfer.client.protocol import OutputRequest, TensorRef
from zinfer.client.worker_protocol import RequestResult
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch_io import BatchRequest
from zinfer.workers.regions import RegionCache
from zinfer.workers.stream import run_stream

SIG = Signature.of(
    parse_model_config(
        """
        name: "s"
        backend: "python"
        max_batch_size: 0
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] } ]
        model_transaction_policy { decoupled: true }
        """,
        source="test",
        model_name="s",
    )
)


class Words:
    def execute(self, inputs: Any) -> Any:
        text = bytes(inputs["TEXT"][0])
        if text == b"boom":
            raise ValueError("no")
        for w in text.split():
            yield {"TOKEN": np.array([w], dtype=object)}


def _request(rid: int, text: bytes, frames: list[Any]) -> BatchRequest:
    frames.append(dtypes.serialize_bytes(np.array([text], dtype=object)))
    return BatchRequest(
        rid, (TensorRef("TEXT", "BYTES", (1,), frame=len(frames) - 1),), (OutputRequest("TOKEN"),)
    )


def test_every_response_is_sent_then_a_final_status() -> None:
    frames: list[Any] = []
    reqs = [_request(1, b"a bb ccc", frames), _request(2, b"boom", frames)]
    sent: list[tuple[RequestResult, list[Any]]] = []
    out = run_stream(Words(), SIG, reqs, frames, RegionCache(), lambda r, f: sent.append((r, f)))
    words = [bytes(dtypes.deserialize_bytes(f[r.outputs[0].frame], (1,))[0]) for r, f in sent]
    assert words == [b"a", b"bb", b"ccc"] and all(r.final is False for r, _ in sent)
    assert out.results[0] == RequestResult(1, final=True)
    assert out.results[1].final and out.results[1].status != 0 and "ValueError: no" in out.results[1].error
