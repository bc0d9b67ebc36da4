"""Decoupled models (``model_transaction_policy { decoupled: true }``): several responses per request.

A decoupled native model's ``execute`` gets one request at a time and returns an iterator (a generator,
typically) of output dicts; each one goes to the client at once as a partial result, inline, and a last,
empty response marked final closes the request. An exception ends the request with an error (responses
already sent stay sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from zinfer.client.errors import InternalError, ServerError
from zinfer.client.protocol import Frame
from zinfer.client.worker_protocol import RequestResult
from zinfer.modelconfig.signature import Signature

from .batch_io import (
    BatchOutcome,
    BatchRequest,
    check_output,
    emit,
    error_result,
    model_failure,
    open_requests,
)
from .regions import RegionCache

SendPartial = Callable[[RequestResult, list[Frame]], None]


def _responses(value: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        yield value
    elif value is not None:
        yield from value


def run_stream(
    model: Any,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    send_partial: SendPartial,
) -> BatchOutcome:
    """Run each request on its own, sending every response as it comes; returns the final statuses."""
    out = BatchOutcome()
    for req, arrays, rows in open_requests(requests, frames, regions, sig.batching, out, final=True):
        t0 = time.perf_counter_ns()
        try:
            wanted = [o.name for o in req.outputs]
            for response in _responses(model.execute(arrays)):
                if not isinstance(response, Mapping):
                    raise InternalError(
                        f"a decoupled model yields dicts of arrays, got {type(response).__name__}"
                    )
                partial_frames: list[Frame] = []
                tensors = [
                    emit(
                        n,
                        check_output(n, response[n], sig, rows),
                        None,
                        sig.outputs[n].wire,
                        regions,
                        partial_frames,
                    )
                    for n in wanted
                    if n in response
                ]
                send_partial(RequestResult(req.id, outputs=tuple(tensors), final=False), partial_frames)
            out.results.append(RequestResult(req.id, final=True))
        except ServerError as exc:
            out.results.append(error_result(req.id, exc)._replace(final=True))
        except Exception as exc:
            out.results.append(error_result(req.id, model_failure(exc))._replace(final=True))
        out.infer_ns += time.perf_counter_ns() - t0
    return out
