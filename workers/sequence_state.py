"""Implicit sequence state (``sequence_batching { state [...] }``), kept by the worker between requests.

A stateful model names, per state, an input (``input_name``) it reads the sequence's state from and an
output (``output_name``) it writes the next state to; neither is one of the model's config inputs or
outputs, and clients never see them. Every sequence is bound to one instance (the sequence batcher), so
the instance's worker keeps each sequence's state, by sequence id, on the host:

* a request that starts a sequence (or the first one the worker sees of it) gets the initial state:
  ``initial_state`` zeros (``zero_data``) or the raw file ``<version>/initial_state/<data_file>``, or zeros
  of ``dims`` when the config gives none (a ``-1`` dim starts at 0, for state that grows);
* the model's state output for that request's row becomes the sequence's state for its next request;
* the sequence's END request drops it, and so does a full store (the least recently used of
  ``MAX_SEQUENCES`` goes first: a sequence the broker released as idle never sends END).

A batch that fails leaves every state as it was. State is lost with the worker (a crash or a reload), as
it is in Triton.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zinfer.client import dtypes
from zinfer.client.errors import ConfigError, InternalError

from .batch_io import BatchRequest
from .device import CPU, Device
from .model import Array

__all__ = ["MAX_SEQUENCES", "ImplicitStates", "StateSpec", "state_specs"]

MAX_SEQUENCES = 4096  # sequences whose state one worker keeps at most


@dataclass(frozen=True)
class StateSpec:
    input_name: str
    output_name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    initial: Array  # the state a sequence starts with (without the batch dimension)


def _initial(spec: Any, dtype: np.dtype[Any], version_dir: Path) -> Array:
    if not spec.initial_state:
        return np.zeros(tuple(max(d, 0) for d in spec.dims), dtype)
    init = spec.initial_state[0]
    if init.data_type != spec.data_type:
        raise ConfigError(
            f"state '{spec.input_name}': initial_state is {init.data_type}, the state {spec.data_type}"
        )
    if any(d < 0 for d in init.dims):
        raise ConfigError(
            f"state '{spec.input_name}': initial_state dims must be fixed, got {list(init.dims)}"
        )
    shape = tuple(init.dims)
    if not init.data_file:
        return np.zeros(shape, dtype)
    path = version_dir / "initial_state" / init.data_file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"state '{spec.input_name}': initial_state file {path}: {exc.strerror}") from None
    want = int(np.prod(shape)) * dtype.itemsize
    if len(raw) != want:
        raise ConfigError(f"state '{spec.input_name}': {path} holds {len(raw)} bytes, dims {list(shape)} "
                          f"of {spec.data_type} need {want}")  # fmt: skip
    return np.frombuffer(raw, dtype).reshape(shape).copy()


def state_specs(config: Any, version_dir: Path) -> list[StateSpec]:
    """The config's states, checked; raises ``ConfigError`` naming the state at fault."""
    sb = config.sequence_batching
    if sb is None or not sb.state:
        return []
    taken = {t.name for t in config.input} | {t.name for t in config.output}
    specs: list[StateSpec] = []
    for s in sb.state:
        for name in (s.input_name, s.output_name):
            if name in taken:
                raise ConfigError(f"state '{s.input_name}': '{name}' is also a config input or output")
        if s.data_type == "TYPE_STRING":
            raise ConfigError(f"state '{s.input_name}': TYPE_STRING state is not supported")
        dtype = dtypes.wire_to_numpy(dtypes.config_to_wire(s.data_type))
        specs.append(
            StateSpec(s.input_name, s.output_name, dtype, tuple(s.dims), _initial(s, dtype, version_dir))
        )
        taken |= {s.input_name, s.output_name}
    return specs


class ImplicitStates:
    """Each sequence's state, by sequence id; ``inputs`` before a batch runs, ``update`` after it ran."""

    def __init__(self, specs: Sequence[StateSpec], batching: bool, capacity: int = MAX_SEQUENCES) -> None:
        self.specs = tuple(specs)
        self.batching = batching
        self.capacity = capacity
        self._store: OrderedDict[Any, dict[str, Array]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def _current(self, req: BatchRequest) -> dict[str, Array]:
        seq = req.sequence or {}
        kept = None if seq.get("start") else self._store.get(seq.get("id"))
        if kept is None:
            return {s.input_name: s.initial for s in self.specs}
        self._store.move_to_end(seq.get("id"))
        return kept

    def request_inputs(self, req: BatchRequest) -> dict[str, Array]:
        """One request's state inputs: ``[1, *dims]`` with batching, ``dims`` without."""
        current = self._current(req)
        return {name: (a[None] if self.batching else a) for name, a in current.items()}

    def inputs(self, requests: Sequence[BatchRequest]) -> dict[str, Array]:
        """The batch's state inputs, one row per request (a sequence request holds one row)."""
        per = [self.request_inputs(r) for r in requests]
        out: dict[str, Array] = {}
        for s in self.specs:
            rows = [p[s.input_name] for p in per]
            if not self.batching:
                out[s.input_name] = rows[0]
                continue
            try:
                out[s.input_name] = np.concatenate(rows, axis=0)
            except ValueError:
                shapes = sorted({tuple(r.shape[1:]) for r in rows})
                raise InternalError(
                    f"state '{s.input_name}' has different shapes in one batch: {shapes}"
                ) from None
        return out

    def update(
        self, requests: Sequence[BatchRequest], outputs: Mapping[str, Any], device: Device = CPU
    ) -> None:
        """Keep each request's row of the model's state outputs for its sequence (END drops it); raises
        ``InternalError`` (and keeps nothing) when a state output is missing or has the wrong rows."""
        hosts: dict[str, Array] = {}
        for s in self.specs:
            if s.output_name not in outputs:
                raise InternalError(f"model returned no state output '{s.output_name}'")
            host = np.asarray(device.to_host(outputs[s.output_name]))
            if host.dtype != s.dtype:
                raise InternalError(f"state output '{s.output_name}' is {host.dtype}, the state is {s.dtype}")
            if self.batching and (host.ndim == 0 or host.shape[0] != len(requests)):
                raise InternalError(f"state output '{s.output_name}' must have one row per request "
                                    f"({len(requests)}), got shape {list(host.shape)}")  # fmt: skip
            hosts[s.output_name] = host
        for i, req in enumerate(requests):
            seq = req.sequence or {}
            sid = seq.get("id")
            if seq.get("end"):
                self._store.pop(sid, None)
                continue
            row = {s.input_name: np.array(hosts[s.output_name][i] if self.batching else hosts[s.output_name])
                   for s in self.specs}  # fmt: skip
            self._store[sid] = row
            self._store.move_to_end(sid)
        while len(self._store) > self.capacity:
            self._store.popitem(last=False)
