"""Pure builders for the messages the broker relays between clients and workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Frame

from .model_state import Pending


def execute_header(
    batch_id: int,
    items: Sequence[Pending],
    controls: Sequence[dict[str, Any]] = (),
    region: Callable[[str], list[int] | None] | None = None,
) -> tuple[dict[str, Any], list[Frame]]:
    """The EXECUTE header for a batch, and its inline frames numbered across the whole batch.

    Descriptors go on as the clients sent them (the broker checked them); only inline frame numbers change.
    A sequence request's entry carries ``"sequence": {"id", "start", "end", "controls"}``: its flags and
    the model's control inputs (``sequence_batcher.control_specs``), which the worker adds to the batch.
    ``"regions"`` names, for each client region the batch touches, how the worker reaches and checks it
    (``region(name)``: ``[fd, dev, ino]`` of the broker's descriptor, see ``regions.Region.wire``); regions
    absent from it are the server's own.
    """
    requests: list[dict[str, Any]] = []
    frames: list[Frame] = []
    table: dict[str, list[int]] = {}

    def note(name: str) -> None:
        if region is not None and name not in table:
            wire = region(name)
            if wire is not None:
                table[name] = wire

    for p in items:
        for d in p.wire_inputs:
            if "shm" in d:
                note(d["shm"][0])
        for o in p.wire_outputs:
            if "slot" in o:
                note(o["slot"][0])
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
    header: dict[str, Any] = {"batch": batch_id, "requests": requests}
    if table:
        header["regions"] = table
    return header, frames


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
