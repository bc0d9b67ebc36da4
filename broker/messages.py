"""Pure builders for the messages the broker relays between clients and workers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Frame

from .model_state import Pending


def execute_header(
    batch_id: int, items: Sequence[Pending], controls: Sequence[dict[str, Any]] = ()
) -> tuple[dict[str, Any], list[Frame]]:
    """The EXECUTE header for a batch, and its inline frames numbered across the whole batch.

    Descriptors go on as the clients sent them (the broker checked them); only inline frame numbers change.
    A sequence request's entry carries ``"sequence": {"id", "start", "end", "controls"}``: its flags and
    the model's control inputs (``sequence_batcher.control_specs``), which the worker adds to the batch.
    """
    requests: list[dict[str, Any]] = []
    frames: list[Frame] = []
    for p in items:
        inputs = p.wire_inputs
        if p.frames:
            inputs = []
            for d in p.wire_inputs:
                if "frame" in d:
                    frames.append(p.frames[d["frame"]])
                    d = {**d, "frame": len(frames) - 1}
                inputs.append(d)
        entry: dict[str, Any] = {"id": p.seq, "inputs": inputs, "outputs": p.wire_outputs}
        if p.sequence is not None:
            entry["sequence"] = {**p.sequence, "controls": list(controls)}
        requests.append(entry)
    return {"batch": batch_id, "requests": requests}, frames


def client_outputs(
    outputs: list[dict[str, Any]], frames: Sequence[Frame]
) -> tuple[list[dict[str, Any]], list[Frame]]:
    """One request's outputs from a worker result, with its inline frames numbered from 0 for the client."""
    out_frames: list[Frame] = []
    renumbered = []
    for t in outputs:
        if "frame" in t:
            idx = int(t["frame"])
            if not 0 <= idx < len(frames):
                raise InvalidArgument("worker result names a missing frame")
            t = {**t, "frame": len(out_frames)}
            out_frames.append(frames[idx])
        renumbered.append(t)
    return renumbered, out_frames
