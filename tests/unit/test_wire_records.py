"""Every record of the wire contract, both halves: to-wire then from-wire (through msgpack frames) gives
the record back, and from-wire on any header raises ProtocolError or nothing (never KeyError/TypeError)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zinfer.client import protocol
from zinfer.client import worker_protocol as wp
from zinfer.client.errors import ProtocolError, Status
from zinfer.client.protocol import Command, InferRequest, OutputRequest, Reply, ShmRef, TensorRef

TEXT = st.characters(blacklist_categories=("Cs",))  # msgpack cannot encode lone surrogates
names = st.text(TEXT, min_size=1, max_size=12)
texts = st.text(TEXT, max_size=24)
u63 = st.integers(0, (1 << 63) - 1)
u64 = st.integers(0, (1 << 64) - 1)

shm_refs = st.builds(ShmRef, names, u63, u63)
tensors = st.builds(
    lambda name, dtype, shape, where: TensorRef(name, dtype, tuple(shape), *where),
    names,
    names,
    st.lists(st.integers(0, (1 << 40) - 1), max_size=protocol.MAX_DIMS),
    st.one_of(
        shm_refs.map(lambda s: (s, None)), st.integers(0, protocol.MAX_TENSORS).map(lambda f: (None, f))
    ),
)
outputs = st.builds(OutputRequest, names, st.none() | shm_refs)
statuses = st.sampled_from(list(Status))
scalars = st.none() | st.booleans() | st.integers(-(1 << 31), 1 << 31) | texts
bodies = st.none() | scalars | st.dictionaries(names, scalars, max_size=3)

infer_requests = st.builds(
    InferRequest,
    request_id=texts,
    model=names,
    version=u63,
    inputs=st.lists(tensors, max_size=3).map(tuple),
    outputs=st.none() | st.lists(outputs, max_size=3).map(tuple),
    priority=u63,
    timeout_us=u63,
    parameters=st.dictionaries(names, scalars, max_size=3),
    caller_id=texts,
)
replies = st.builds(Reply, texts, statuses, texts, bodies)

controls = st.builds(
    wp.SequenceControl,
    names,
    st.sampled_from(sorted(wp.CONTROL_KINDS)),
    names,
    st.lists(
        st.booleans() | st.integers(-(1 << 31), 1 << 31) | st.floats(allow_nan=False, allow_infinity=False),
        max_size=2,
    ).map(tuple),
)
sequences = st.builds(
    wp.SequenceFlags,
    u64 | st.text(TEXT, max_size=protocol.MAX_NAME),
    st.booleans(),
    st.booleans(),
    st.lists(controls, max_size=3).map(tuple),
)
scalars = st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.floats(allow_nan=False) | texts
parameters = st.dictionaries(names, scalars, max_size=3)
execute_requests = st.builds(
    wp.ExecuteRequest,
    u63,
    st.lists(tensors, max_size=3).map(tuple),
    st.lists(outputs, max_size=3).map(tuple),
    texts,
    st.none() | sequences,
    parameters,
)
executes = st.builds(
    wp.Execute,
    u63,
    st.lists(execute_requests, max_size=3).map(tuple),
    st.dictionaries(names, st.tuples(u64, u64, u64), max_size=3),
)
request_results = st.builds(
    wp.RequestResult,
    u63,
    statuses,
    texts,
    st.lists(tensors, max_size=3).map(tuple),
    st.none() | st.booleans(),
    parameters,
)
worker_results = st.one_of(
    st.builds(wp.WorkerResult, u63, st.lists(request_results, max_size=3).map(tuple), st.just(True)),
    st.builds(
        wp.WorkerResult,
        u63,
        st.lists(request_results, max_size=3).map(tuple),
        st.just(False),
        st.tuples(u63, u63, u63),
    ),
)
server_queries = st.builds(protocol.ServerQuery, texts)
model_queries = st.builds(protocol.ModelQuery, names, u63, texts)
statistics_queries = st.one_of(
    st.builds(protocol.StatisticsQuery, st.none(), st.just(0), texts),  # every model: no version
    st.builds(protocol.StatisticsQuery, names, u63, texts),
)
model_changes = st.builds(protocol.ModelChange, names, texts)
cancels = st.builds(protocol.CancelCommand, names, texts)
registers = st.builds(protocol.RegisterRegion, names, st.binary(max_size=32), texts)
unregisters = st.builds(protocol.UnregisterRegion, names, texts)
readies = st.builds(wp.WorkerReady, names, u63, u63, names, u63, st.sampled_from([1, 2]))


def _through_frames(command: Command, header: Mapping[str, Any]) -> dict[str, Any]:
    """A header as the peer reads it: encoded into frames, then decoded with the protocol's limits."""
    return protocol.decode(protocol.encode(command, header)).header


RECORDS: list[tuple[str, st.SearchStrategy[Any], Command, Callable[[Any], Any], Callable[[Any], Any]]] = [
    ("ShmRef", shm_refs, Command.REPLY, lambda r: {"v": protocol.shm_to_wire(r)},
     lambda h: protocol.shm_from_wire(h.get("v"))),
    ("TensorRef", tensors, Command.REPLY, protocol.tensor_to_wire, protocol.tensor_from_wire),
    ("OutputRequest", outputs, Command.REPLY, protocol.output_to_wire, protocol.output_from_wire),
    ("InferRequest", infer_requests, Command.INFER, protocol.infer_to_wire, protocol.infer_from_wire),
    ("Reply", replies, Command.REPLY, protocol.reply_to_wire, protocol.reply_from_wire),
    ("ServerQuery", server_queries, Command.SERVER_LIVE, protocol.server_query_to_wire,
     protocol.server_query_from_wire),
    ("ModelQuery", model_queries, Command.MODEL_METADATA, protocol.model_query_to_wire,
     protocol.model_query_from_wire),
    ("StatisticsQuery", statistics_queries, Command.STATISTICS, protocol.statistics_to_wire,
     protocol.statistics_from_wire),
    ("ModelChange", model_changes, Command.LOAD, protocol.model_change_to_wire,
     protocol.model_change_from_wire),
    ("CancelCommand", cancels, Command.CANCEL, protocol.cancel_command_to_wire,
     protocol.cancel_command_from_wire),
    ("RegisterRegion", registers, Command.REGISTER, protocol.register_to_wire, protocol.register_from_wire),
    ("UnregisterRegion", unregisters, Command.UNREGISTER, protocol.unregister_to_wire,
     protocol.unregister_from_wire),
    ("WorkerReady", readies, Command.W_READY, wp.ready_to_wire, wp.ready_from_wire),
    ("LoadFailed", st.builds(wp.LoadFailed, texts), Command.W_LOAD_FAILED, wp.load_failed_to_wire,
     wp.load_failed_from_wire),
    ("DropRegion", st.builds(wp.DropRegion, names), Command.W_DROP_REGION, wp.drop_region_to_wire,
     wp.drop_region_from_wire),
    ("Heartbeat", st.just(wp.Heartbeat()), Command.W_HEARTBEAT, wp.empty_to_wire, wp.heartbeat_from_wire),
    ("Shutdown", st.just(wp.Shutdown()), Command.W_SHUTDOWN, wp.empty_to_wire, wp.shutdown_from_wire),
    ("SequenceControl", controls, Command.W_EXECUTE, wp.control_to_wire, wp.control_from_wire),
    ("SequenceFlags", sequences, Command.W_EXECUTE, wp.sequence_to_wire, wp.sequence_from_wire),
    ("ExecuteRequest", execute_requests, Command.W_EXECUTE, wp.execute_request_to_wire,
     wp.execute_request_from_wire),
    ("Execute", executes, Command.W_EXECUTE, wp.execute_to_wire, wp.execute_from_wire),
    ("CancelRequest", st.builds(wp.CancelRequest, u63, u63), Command.W_CANCEL, wp.cancel_to_wire,
     wp.cancel_from_wire),
    ("RequestResult", request_results, Command.W_RESULT, wp.request_result_to_wire,
     wp.request_result_from_wire),
    ("WorkerResult", worker_results, Command.W_RESULT, wp.result_to_wire, wp.result_from_wire),
]  # fmt: skip


@pytest.mark.parametrize("strategy, command, to_wire, from_wire", [r[1:] for r in RECORDS],
                         ids=[r[0] for r in RECORDS])  # fmt: skip
def test_round_trip(
    strategy: st.SearchStrategy[Any],
    command: Command,
    to_wire: Callable[[Any], Any],
    from_wire: Callable[[Any], Any],
) -> None:
    @settings(max_examples=60, deadline=None)
    @given(strategy)
    def check(record: Any) -> None:
        assert from_wire(_through_frames(command, to_wire(record))) == record

    check()


# any msgpack value, nested a little: what a hostile or broken peer may put in a field
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats()
    | texts
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
KEYS = ["id", "model", "version", "inputs", "outputs", "name", "datatype", "shape", "shm", "frame", "slot",
        "status", "error", "body", "batch", "requests", "regions", "results", "t", "partial", "final",
        "sequence", "controls", "kind", "data_type", "values", "start", "end", "request_id", "caller_id",
        "instance", "device", "pid", "priority", "timeout_us", "parameters", "target", "token"]  # fmt: skip
FROM_WIRE = [r[4] for r in RECORDS]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS) | texts, values, max_size=8), st.sampled_from(FROM_WIRE))
def test_from_wire_raises_only_protocol_errors(
    header: dict[str, Any], from_wire: Callable[[Any], Any]
) -> None:
    try:
        from_wire(header)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(executes, st.sampled_from(["inputs", "outputs", "id", "sequence"]), values)
def test_a_bad_field_in_an_execute_request_is_a_protocol_error(e: wp.Execute, key: str, junk: Any) -> None:
    header = wp.execute_to_wire(e)
    for r in header["requests"]:
        r[key] = junk
    try:
        wp.execute_from_wire(header)
    except ProtocolError:
        pass


@pytest.mark.parametrize(
    "name, entry",
    [("zinfer-x", [3, 1, 1, 1]), ("zinfer-x", [3, 1]), ("zinfer-x", [-1, 1, 1]), ("zinfer-x", [True, 1, 1]),
     ("zinfer-x", ["3", 1, 1]), ("zinfer-x", [3, -1, 1]), ("zinfer-x", [3, 1, None]), ("zinfer-x", "311"),
     ("zinfer-x", [3, 1, 1.0]), ("zinfer-x", ["x", -1]), ("", [3, 1, 1]), ("x" * 257, [3, 1, 1]),
     (b"zinfer-x", [3, 1, 1])],
)  # fmt: skip
def test_a_malformed_region_entry_of_an_execute_is_a_protocol_error(name: Any, entry: Any) -> None:
    """The worker's region cache takes ``Execute.regions`` as checked here: a malformed entry never gets
    past ``execute_from_wire``, so no tensor of that batch can name it."""
    header = {"batch": 1, "requests": [], "regions": {name: entry}}
    with pytest.raises(ProtocolError, match="region"):
        wp.execute_from_wire(_through_frames(Command.W_EXECUTE, header))


def test_a_well_formed_region_table_comes_through_whole() -> None:
    table = {"zinfer-x": [3, 1, (1 << 64) - 1], "zinfer-y": [0, 0, 0]}
    header = {"batch": 1, "requests": [], "regions": table}
    e = wp.execute_from_wire(_through_frames(Command.W_EXECUTE, header))
    assert e.regions == {"zinfer-x": (3, 1, (1 << 64) - 1), "zinfer-y": (0, 0, 0)}


@pytest.mark.parametrize(
    "from_wire, header, match",
    [(protocol.model_query_from_wire, {"model": ["x"]}, "'model' must be str"),
     (protocol.model_query_from_wire, {"model": ""}, "'model' must be 1 to"),
     (protocol.model_query_from_wire, {"model": "m", "version": -1}, "'version' out of range"),
     (protocol.model_query_from_wire, {"model": "m", "version": True}, "'version' must be int"),
     (protocol.statistics_from_wire, {"model": "m" * 257}, "'model' must be 1 to"),
     (protocol.model_change_from_wire, {}, "missing field 'model'"),
     (protocol.cancel_command_from_wire, {"target": 7}, "'target' must be str"),
     (protocol.register_from_wire, {"name": "r", "token": "a string"}, "'token' must be bytes"),
     (protocol.unregister_from_wire, {"name": None}, "'name' must be str")],
)  # fmt: skip
def test_a_bad_field_of_a_command_is_named(
    from_wire: Callable[[Any], Any], header: dict[str, Any], match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        from_wire(header)


def test_a_command_without_an_id_is_answered_under_the_empty_id() -> None:
    assert protocol.server_query_from_wire({}) == protocol.ServerQuery("")
    assert protocol.server_query_from_wire({"id": 7}) == protocol.ServerQuery("")
    assert protocol.server_query_to_wire(protocol.ServerQuery("")) == {}  # the connection adds its own


def test_statistics_without_a_model_is_every_model_whatever_the_version() -> None:
    assert protocol.statistics_from_wire({"version": 3}) == protocol.StatisticsQuery(None, 0)
    assert protocol.statistics_from_wire({"version": -1}) == protocol.StatisticsQuery(None, 0)
