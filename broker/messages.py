"""Pure builders for the messages the broker relays between clients and workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zinfer.client import protocol
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Frame, TensorRef
from zinfer.client.worker_protocol import NO_PARAMETERS, NO_REGIONS, Execute, ExecuteRequest, SequenceControl

from .model_state import Pending

RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                 "binary_data_output", "binary_data_size", "traceparent"})  # fmt: skip
"""Request parameters that are fields of the request, not passed on to model code (as in Triton)."""


def sequence_controls(specs: Sequence[dict[str, Any]]) -> tuple[SequenceControl, ...]:
    """A model's control inputs (``sequence_batcher.control_specs``) as the EXECUTE records carry them."""
    return tuple(
        SequenceControl(c["name"], c["kind"], c["data_type"], tuple(c.get("values", ()))) for c in specs
    )


def execute_message(
    batch_id: int,
    items: Sequence[Pending],
    controls: tuple[SequenceControl, ...] = (),
    region: Callable[[str], list[int] | None] | None = None,
    serial: bool = False,
) -> tuple[Execute, list[Frame]]:
    """The EXECUTE for a batch, and its inline frames numbered across the whole batch.

    Descriptors go on as the clients sent them (the broker checked them); only inline frame numbers change.
    Each request carries its client's id (``InferRequest.caller_id``); a sequence request its flags and the
    model's control inputs (``controls``), which the worker adds to the batch. ``regions`` names, for each
    client region the batch touches, how the worker reaches and checks it (``region(name)``: ``[fd, dev,
    ino]`` of the broker's descriptor, see ``regions.Region.wire``); regions absent from it are the server's.
    ``serial``: the items are a run, each executed alone (``batching.runs``).
    """
    requests: list[ExecuteRequest] = []
    frames: list[Frame] = []
    table: dict[str, tuple[int, int, int]] = {}
    # every region name looked up once per batch, found or not: an ensemble step's batch names a server
    # slot (not a client region) in every request
    seen: set[str] = set()

    for p in items:
        inputs = p.request.inputs
        outputs = p.outputs
        if region is not None:
            for t in inputs:
                if t.shm is not None and t.shm.region not in seen:
                    _note(t.shm.region, region, table, seen)
            for o in outputs:
                if o.slot is not None and o.slot.region not in seen:
                    _note(o.slot.region, region, table, seen)
        if p.frames:
            renumbered = []
            for t in inputs:
                if t.frame is not None:
                    frames.append(p.frames[t.frame])
                    t = TensorRef(t.name, t.datatype, t.shape, None, len(frames) - 1)
                renumbered.append(t)
            inputs = tuple(renumbered)
        sequence = None if p.sequence is None else p.sequence._replace(controls=controls)
        given = p.request.parameters
        parameters: dict[str, Any] = {}
        if given:  # (most requests have none: no comprehension for them)
            parameters = {
                k: v
                for k, v in given.items()
                if k not in RESERVED_PARAMETERS and isinstance(v, bool | int | float | str)
            }
        if p.trace is not None:  # a traced request: its model may pass the context on to a BLS call
            parameters["traceparent"] = p.trace.context
        requests.append(
            ExecuteRequest(p.seq, inputs, outputs, p.request.caller_id, sequence, parameters or NO_PARAMETERS)
        )  # the defaults when empty: an encoded record leaves them out
    return Execute(batch_id, tuple(requests), table or NO_REGIONS, serial), frames


def _note(
    name: str,
    region: Callable[[str], list[int] | None],
    table: dict[str, tuple[int, int, int]],
    seen: set[str],
) -> None:
    """How the worker reaches region ``name``, into ``table`` when it is a client's (``region(name)``)."""
    seen.add(name)
    wire = region(name)
    if wire is not None:
        table[name] = (wire[0], wire[1], wire[2])


def reply_outputs(
    outputs: Sequence[TensorRef], frames: Sequence[Frame]
) -> tuple[list[dict[str, Any]], list[Frame]]:
    """One request's outputs from a worker result, as the client's maps (``protocol.tensor_to_wire``), with
    its inline frames numbered from 0 for the client."""
    out_frames: list[Frame] = []
    out: list[dict[str, Any]] = []
    for t in outputs:
        d = protocol.tensor_to_wire(t)
        idx = t.frame
        if idx is not None:
            if not 0 <= idx < len(frames):
                raise InvalidArgument("worker result names a missing frame")
            d["frame"] = len(out_frames)  # a map of its own: renumbered in place
            out_frames.append(frames[idx])
        out.append(d)
    return out, out_frames
