"""``sequence_batching``: strategies, control inputs and implicit state, and the control inputs as built.

:func:`control_specs` turns the config's control inputs into the plain specs the broker sends with each
EXECUTE; :func:`control_value` gives one control input's value for one request (the worker adds it to
the batch). The batching itself is ``zinfer.broker.batching.sequence_batcher``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .block import INT32, UINT64, Block, read_dims, required_block, required_string
from .record_base import ProtoEnum
from .scheduling import preferred_sizes

__all__ = [
    "ControlInput",
    "ControlKind",
    "InitialState",
    "SequenceBatching",
    "SequenceControl",
    "SequenceDirect",
    "SequenceOldest",
    "SequenceState",
    "control_specs",
    "control_value",
    "decode_sequence_batching",
]


class ControlKind(ProtoEnum):
    CONTROL_SEQUENCE_START = "CONTROL_SEQUENCE_START"
    CONTROL_SEQUENCE_READY = "CONTROL_SEQUENCE_READY"
    CONTROL_SEQUENCE_END = "CONTROL_SEQUENCE_END"
    CONTROL_SEQUENCE_CORRID = "CONTROL_SEQUENCE_CORRID"


@dataclass(frozen=True, slots=True)
class SequenceControl:
    kind: ControlKind
    int32_false_true: tuple[int, ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[bool, ...] = ()
    data_type: str = ""


@dataclass(frozen=True, slots=True)
class ControlInput:
    name: str
    control: tuple[SequenceControl, ...]


@dataclass(frozen=True, slots=True)
class InitialState:
    """Initial data of an implicit state: zeros (``zero_data``) or the file ``data_file``."""

    data_type: str
    dims: tuple[int, ...]
    name: str
    zero_data: bool = False
    data_file: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"data_type": self.data_type, "dims": list(self.dims), "name": self.name}
        if self.data_file:
            out["data_file"] = self.data_file
        else:
            out["zero_data"] = self.zero_data
        return out


@dataclass(frozen=True, slots=True)
class SequenceState:
    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...]
    initial_state: tuple[InitialState, ...] = ()
    use_same_buffer_for_input_output: bool = False
    use_growable_memory: bool = False


@dataclass(frozen=True, slots=True)
class SequenceDirect:
    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0


@dataclass(frozen=True, slots=True)
class SequenceOldest:
    max_candidate_sequences: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False


@dataclass(frozen=True, slots=True)
class SequenceBatching:
    """Exactly one of ``direct`` and ``oldest`` is set (``direct`` when the config names neither)."""

    direct: SequenceDirect | None = None
    oldest: SequenceOldest | None = None
    max_sequence_idle_microseconds: int = 1_000_000
    control_input: tuple[ControlInput, ...] = ()
    state: tuple[SequenceState, ...] = ()
    iterative_sequence: bool = False


# TYPE_STRING as in Triton, whose qa serves simple_string_dyna_sequence so (the id as its text, as BYTES)
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


def _decode_control(b: Block) -> SequenceControl:
    record = SequenceControl(
        kind=b.enum("kind", ControlKind, ControlKind.CONTROL_SEQUENCE_START),
        int32_false_true=b.integers("int32_false_true", INT32),
        fp32_false_true=b.reals("fp32_false_true"),
        bool_false_true=b.booleans("bool_false_true"),
        data_type=b.data_type(required=False),
    )
    pairs = {
        "int32_false_true": len(record.int32_false_true),
        "fp32_false_true": len(record.fp32_false_true),
        "bool_false_true": len(record.bool_false_true),
    }
    given = [name for name, count in pairs.items() if count]
    if record.kind is ControlKind.CONTROL_SEQUENCE_CORRID:
        if given:
            raise b.error("CONTROL_SEQUENCE_CORRID takes a data_type, not false/true values", given[0])
        if record.data_type not in _CORRID_TYPES:
            raise b.error(f"CONTROL_SEQUENCE_CORRID needs data_type {', '.join(_CORRID_TYPES)}", "data_type")
    else:
        if len(given) != 1:
            raise b.error(f"{record.kind.value} needs exactly one of {', '.join(pairs)}", "kind")
        if pairs[given[0]] != 2:
            raise b.error("takes two values: false, then true", given[0])
    b.finish()
    return record


def _decode_control_input(b: Block) -> ControlInput:
    record = ControlInput(
        name=required_string(b, "name"), control=tuple(_decode_control(c) for c in b.blocks("control"))
    )
    b.finish()
    return record


def _decode_initial_state(b: Block) -> InitialState:
    source = b.oneof("zero_data", "data_file")
    if source is None:
        raise b.error("needs zero_data or data_file")
    record = InitialState(
        data_type=b.data_type(),
        dims=read_dims(b, required=False),
        name=required_string(b, "name"),
        zero_data=b.boolean("zero_data"),
        data_file=b.string("data_file"),
    )
    if source == "data_file" and not record.data_file:
        raise b.error("may not be empty", "data_file")
    b.finish()
    return record


def _decode_state(b: Block) -> SequenceState:
    record = SequenceState(
        input_name=required_string(b, "input_name"),
        output_name=required_string(b, "output_name"),
        data_type=b.data_type(),
        dims=read_dims(b),
        initial_state=tuple(_decode_initial_state(s) for s in b.blocks("initial_state")),
        use_same_buffer_for_input_output=b.boolean("use_same_buffer_for_input_output"),
        use_growable_memory=b.boolean("use_growable_memory"),
    )
    b.finish()
    return record


def decode_sequence_batching(b: Block, max_batch_size: int) -> SequenceBatching:
    direct: SequenceDirect | None = None
    oldest: SequenceOldest | None = None
    if b.oneof("direct", "oldest") == "oldest":
        inner = required_block(b, "oldest")
        oldest = SequenceOldest(
            max_candidate_sequences=inner.integer("max_candidate_sequences", INT32),
            preferred_batch_size=preferred_sizes(inner, max_batch_size),
            max_queue_delay_microseconds=inner.integer("max_queue_delay_microseconds", UINT64),
            preserve_ordering=inner.boolean("preserve_ordering"),
        )
        if oldest.max_candidate_sequences < 0:
            raise inner.error("must be >= 0", "max_candidate_sequences")
        inner.finish()
    else:
        inner_or_none = b.block("direct")
        direct = SequenceDirect()
        if inner_or_none is not None:
            direct = SequenceDirect(
                max_queue_delay_microseconds=inner_or_none.integer("max_queue_delay_microseconds", UINT64),
                minimum_slot_utilization=inner_or_none.real("minimum_slot_utilization"),
            )
            if not 0.0 <= direct.minimum_slot_utilization <= 1.0:
                raise inner_or_none.error("must be in [0, 1]", "minimum_slot_utilization")
            inner_or_none.finish()
    record = SequenceBatching(
        direct=direct,
        oldest=oldest,
        max_sequence_idle_microseconds=b.integer("max_sequence_idle_microseconds", UINT64) or 1_000_000,
        control_input=tuple(_decode_control_input(c) for c in b.blocks("control_input")),
        state=tuple(_decode_state(s) for s in b.blocks("state")),
        iterative_sequence=b.boolean("iterative_sequence"),
    )
    b.finish()
    return record


_CONTROL_NAMES = {
    ControlKind.CONTROL_SEQUENCE_START: "START",
    ControlKind.CONTROL_SEQUENCE_END: "END",
    ControlKind.CONTROL_SEQUENCE_READY: "READY",
    ControlKind.CONTROL_SEQUENCE_CORRID: "CORRID",
}


def control_specs(sb: SequenceBatching) -> list[dict[str, Any]]:
    """The control inputs as the worker builds them: name, kind, config data type, false and true values."""
    specs: list[dict[str, Any]] = []
    for ci in sb.control_input:
        for c in ci.control:
            kind = _CONTROL_NAMES[c.kind]
            if kind == "CORRID":
                specs.append({"name": ci.name, "kind": kind, "data_type": c.data_type or "TYPE_UINT64"})
            elif c.int32_false_true:
                specs.append({"name": ci.name, "kind": kind, "data_type": "TYPE_INT32",
                              "values": [int(v) for v in c.int32_false_true]})  # fmt: skip
            elif c.fp32_false_true:
                specs.append({"name": ci.name, "kind": kind, "data_type": "TYPE_FP32",
                              "values": [float(v) for v in c.fp32_false_true]})  # fmt: skip
            else:
                specs.append({"name": ci.name, "kind": kind, "data_type": "TYPE_BOOL",
                              "values": [bool(v) for v in c.bool_false_true or (False, True)]})  # fmt: skip
    return specs


def control_value(spec: dict[str, Any], sequence: dict[str, Any]) -> Any:
    """The value of one control input for one request (``sequence``: its id, start and end)."""
    kind = spec["kind"]
    if kind == "CORRID":
        sid = sequence.get("id", 0)
        if spec["data_type"] == "TYPE_STRING":
            return str(sid).encode()
        if not isinstance(sid, int):
            return 0
        bits = 32 if spec["data_type"] in ("TYPE_UINT32", "TYPE_INT32") else 64
        sid &= (1 << bits) - 1  # 32-bit types truncate, as in Triton
        if spec["data_type"].startswith("TYPE_INT") and sid >= 1 << (bits - 1):
            sid -= 1 << bits
        return sid
    flag = {"START": sequence.get("start", False), "END": sequence.get("end", False), "READY": True}[kind]
    return spec["values"][1 if flag else 0]


def fed_by_batcher(sb: SequenceBatching | None) -> tuple[frozenset[str], frozenset[str]]:
    """The model inputs the sequence batcher feeds (control inputs and implicit state inputs), and the
    state outputs it takes back: tensors of the graph that the config's ``input``/``output`` leave out."""
    if sb is None:
        return frozenset(), frozenset()
    inputs = {ci.name for ci in sb.control_input} | {st.input_name for st in sb.state}
    return frozenset(inputs), frozenset(st.output_name for st in sb.state)
