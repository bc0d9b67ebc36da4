"""The sequence batcher: binding, order, one request of a sequence at a time, start/end rules, idle release,
the batches of both strategies, and the control values."""

from __future__ import annotations

import numpy as np
import pytest

from zinfer.broker.batching.batch_policy import BatchReason
from zinfer.broker.batching.rate_limiter import Need, RateLimiter
from zinfer.broker.batching.sequence_batcher import (
    SequenceBatcher,
    SequenceError,
    SequencePolicy,
    SequenceRequest,
    parse_sequence,
)
from zinfer.modelconfig.sequence_batching import (
    ControlInput,
    ControlKind,
    SequenceBatching,
    SequenceControl,
    SequenceOldest,
    control_specs,
    control_value,
)
from zinfer.workers.batch_io import BatchRequest, control_arrays

Sb = SequenceBatcher[str, str]


def req(name: str, sid: int | str, t: float, start: bool = False, end: bool = False) -> SequenceRequest[str]:
    return SequenceRequest(name, sid, start, end, t)


def names(batches: list[tuple[str, object]]) -> dict[str, list[str]]:
    return {inst: list(b.items) for inst, b in batches}  # type: ignore[attr-defined]


def test_start_binds_to_the_least_loaded_instance_and_stays() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(4))
    sb.add(req("a0", 1, 0.0, start=True), 0.0, ["w1", "w2"])
    sb.add(req("b0", 2, 0.0, start=True), 0.0, ["w1", "w2"])
    sb.add(req("c0", 3, 0.0, start=True), 0.0, ["w1", "w2"])
    assert [sb.instance_of(i) for i in (1, 2, 3)] == ["w1", "w2", "w1"]
    assert names(sb.pop_ready(0.0, ["w2", "w1"])) == {"w2": ["b0"], "w1": ["a0", "c0"]}
    sb.add(req("b1", 2, 0.1), 0.1, ["w1", "w2"])
    sb.done([1, 2, 3], 0.1)
    assert names(sb.pop_ready(0.1, ["w1"])) == {}  # b's next request waits for its own instance
    assert names(sb.pop_ready(0.1, ["w2"])) == {"w2": ["b1"]}


def test_one_request_of_a_sequence_at_a_time_in_arrival_order() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(4))
    for i, t in enumerate((0.0, 0.1, 0.2)):
        sb.add(req(f"a{i}", 7, t, start=i == 0), t, ["w"])
    assert len(sb) == 3
    assert names(sb.pop_ready(0.3, ["w"])) == {"w": ["a0"]}
    assert sb.pop_ready(0.3, ["w"]) == []  # a0 still runs
    sb.done([7], 0.4)
    assert names(sb.pop_ready(0.4, ["w"])) == {"w": ["a1"]}
    sb.done([7], 0.5)
    assert names(sb.pop_ready(0.5, ["w"])) == {"w": ["a2"]}
    assert len(sb) == 0


@pytest.mark.parametrize(
    ("steps", "error"),
    [
        (
            [("x", 5, False, False)],
            "^inference request for sequence 5 must specify the START flag on the first request of the "
            "sequence$",
        ),
        ([("x", 5, True, True), ("y", 5, False, False)], "sequence 5 must specify the START flag"),
        (
            [("x", "s", True, False), ("y", "s", False, True), ("z", "s", False, False)],
            "sequence s must specify the START flag",
        ),
    ],
)
def test_requests_outside_an_open_sequence_fail(
    steps: list[tuple[str, int | str, bool, bool]], error: str
) -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(4))
    *ok, (name, sid, start, end) = steps
    for n, s, st, en in ok:
        sb.add(req(n, s, 0.0, st, en), 0.0, ["w"])
    with pytest.raises(SequenceError, match=error):
        sb.add(req(name, sid, 0.0, start, end), 0.0, ["w"])


def test_end_closes_after_its_request_and_a_new_start_reopens() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(2))
    sb.add(req("a", 1, 0.0, start=True, end=True), 0.0, ["w"])
    sb.pop_ready(0.0, ["w"])
    assert sb.active() == 1  # still running
    sb.done([1], 0.1)
    assert sb.active() == 0
    sb.add(req("b", 1, 0.2, start=True), 0.2, ["w"])
    assert sb.active() == 1


def test_idle_sequences_are_released_with_a_fake_clock() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(2, max_sequence_idle_us=500_000))
    sb.add(req("a0", 1, 0.0, start=True), 0.0, ["w"])
    sb.pop_ready(0.0, ["w"])
    assert sb.next_expiry() is None  # running: not idle
    sb.done([1], 1.0)
    assert sb.next_expiry() == pytest.approx(1.5)
    assert sb.expire(1.4) == [] and sb.active() == 1
    sb.expire(1.5)
    assert sb.active() == 0
    with pytest.raises(SequenceError, match="must specify the START flag"):
        sb.add(req("a1", 1, 2.0), 2.0, ["w"])


def test_direct_rows_follow_slots_and_wait_for_the_delay() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(3, max_queue_delay_us=1000))
    for sid in (1, 2, 3):
        sb.add(req(f"s{sid}", sid, 0.0, start=True), 0.0, ["w"])
    out = sb.pop_ready(0.0, ["w"])  # every sequence has a request: full, no waiting
    assert names(out) == {"w": ["s1", "s2", "s3"]} and out[0][1].reason is BatchReason.MAX_SIZE
    sb.done([1, 2, 3], 0.01)
    sb.add(req("t3", 3, 0.01), 0.01, ["w"])
    sb.add(req("t1", 1, 0.011), 0.011, ["w"])
    assert sb.pop_ready(0.0105, ["w"]) == []  # sequence 2 may still send: wait up to the delay
    assert sb.next_deadline(["w"]) == pytest.approx(0.011)
    out = sb.pop_ready(0.011, ["w"])
    assert names(out) == {"w": ["t1", "t3"]} and out[0][1].reason is BatchReason.DELAY_EXPIRED


def test_direct_sequences_past_the_slots_wait_for_a_free_slot() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(2))
    for sid in (1, 2, 3):
        sb.add(req(f"s{sid}", sid, 0.0, start=True, end=sid == 1), 0.0, ["w"])
    assert names(sb.pop_ready(0.0, ["w"])) == {"w": ["s1", "s2"]}
    sb.done([1, 2], 0.1)  # sequence 1 ended: its slot goes to sequence 3
    assert names(sb.pop_ready(0.1, ["w"])) == {"w": ["s3"]}


def test_oldest_takes_the_oldest_heads_up_to_the_candidates() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(4, oldest=True, max_candidate_sequences=2))
    for sid, t in ((1, 0.3), (2, 0.1), (3, 0.2)):
        sb.add(req(f"s{sid}", sid, t, start=True), t, ["w"])
    out = sb.pop_ready(0.3, ["w"])
    assert names(out) == {"w": ["s2", "s3"]}
    assert names(sb.pop_ready(0.3, ["w"])) == {"w": ["s1"]}


def test_no_batching_sends_one_request_per_batch() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(0))
    sb.add(req("a", 1, 0.0, start=True), 0.0, ["w"])
    sb.add(req("b", 2, 0.0, start=True), 0.0, ["w"])
    out = sb.pop_ready(0.0, ["w"])
    assert names(out) == {"w": ["a"]} and out[0][1].reason is BatchReason.NO_BATCHING


def test_pop_one_gives_one_batch_to_the_first_instance_that_has_one() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(4))
    sb.add(req("a0", 1, 0.0, start=True), 0.0, ["w1", "w2"])  # on w1
    sb.add(req("b0", 2, 0.0, start=True), 0.0, ["w1", "w2"])  # on w2
    assert sb.pop_one(0.0, []) is None
    picked = sb.pop_one(0.0, ["w2", "w1"])
    assert picked is not None and picked[0] == "w2" and picked[1].items == ("b0",)
    assert sb.pop_one(0.0, ["w2"]) is None  # b0 runs; w2 has nothing else
    picked = sb.pop_one(0.0, ["w2", "w1"])
    assert picked is not None and picked[0] == "w1" and picked[1].items == ("a0",)
    assert len(sb) == 0


def test_sequences_under_a_rate_limiter_take_the_resource_one_batch_at_a_time() -> None:
    """The broker's limited dispatch, in miniature: offer only idle instances whose resources are free."""
    limiter: RateLimiter[str, str] = RateLimiter((("ONE", 1, None),))
    for w in ("w1", "w2"):
        assert limiter.add(w, "seq", "cpu", [Need("ONE", 1, is_global=True)]) is None
    sb: Sb = SequenceBatcher(SequencePolicy(4))
    idle = ["w1", "w2"]
    for sid in (1, 2, 3, 4):  # w1: 1 and 3, w2: 2 and 4
        sb.add(req(f"s{sid}", sid, 0.0, start=True), 0.0, idle)

    def turn(now: float) -> tuple[str, tuple[str, ...]] | None:
        picked = sb.pop_one(now, [w for w in idle if limiter.can_acquire(w)])
        if picked is None:
            return None
        worker, batch = picked
        assert limiter.acquire(worker)
        idle.remove(worker)
        return worker, batch.items

    assert turn(0.0) == ("w1", ("s1", "s3"))
    assert turn(0.0) is None  # w2 is idle with a batch ready, but ONE is held
    limiter.release("w1")
    idle.append("w1")
    sb.done([1, 3], 0.1)
    assert turn(0.1) == ("w2", ("s2", "s4"))
    assert limiter.held("ONE", None) == 1


def test_remove_and_drop_instance() -> None:
    sb: Sb = SequenceBatcher(SequencePolicy(2))
    sb.add(req("a", 1, 0.0, start=True), 0.0, ["w1", "w2"])
    sb.add(req("b", 2, 0.0, start=True), 0.0, ["w1", "w2"])
    assert sb.remove(lambda n: n == "a") == ["a"] and len(sb) == 1
    assert sb.drop_instance("w2") == ["b"] and len(sb) == 0 and sb.instance_of(2) is None


@pytest.mark.parametrize(
    ("params", "parsed"),
    [
        (None, None),
        ({}, None),
        ({"sequence_id": 0}, None),
        ({"sequence_id": 3, "sequence_start": True}, (3, True, False)),
        ({"sequence_id": "abc", "sequence_end": True}, ("abc", False, True)),
    ],
)
def test_parse_sequence(params: object, parsed: object) -> None:
    assert parse_sequence(params) == parsed


@pytest.mark.parametrize(
    "params",
    [
        {"sequence_id": 1.5},
        {"sequence_id": -1},
        {"sequence_id": 1, "sequence_start": 1},
        {"sequence_start": True},
    ],
)
def test_parse_sequence_rejects(params: dict[str, object]) -> None:
    with pytest.raises(SequenceError):
        parse_sequence(params)


def _config() -> SequenceBatching:
    def ctl(name: str, kind: ControlKind, **kw: object) -> ControlInput:
        return ControlInput(name, (SequenceControl(kind, **kw),))  # type: ignore[arg-type]

    return SequenceBatching(
        oldest=SequenceOldest(),
        control_input=(
            ctl("START", ControlKind.CONTROL_SEQUENCE_START, int32_false_true=(0, 1)),
            ctl("END", ControlKind.CONTROL_SEQUENCE_END, fp32_false_true=(0.0, 1.0)),
            ctl("READY", ControlKind.CONTROL_SEQUENCE_READY, bool_false_true=(False, True)),
            ctl("CORRID", ControlKind.CONTROL_SEQUENCE_CORRID, data_type="TYPE_UINT32"),
        ),
    )


@pytest.mark.parametrize(
    ("sequence", "values"),
    [
        ({"id": 9, "start": True, "end": False}, [1, 0.0, True, 9]),
        ({"id": 9, "start": False, "end": True}, [0, 1.0, True, 9]),
        ({"id": (1 << 32) + 5, "start": False, "end": False}, [0, 0.0, True, 5]),  # 32-bit truncates
        ({"id": "str", "start": True, "end": True}, [1, 1.0, True, 0]),
    ],
)
def test_control_values(sequence: dict[str, object], values: list[object]) -> None:
    specs = control_specs(_config())
    assert [s["name"] for s in specs] == ["START", "END", "READY", "CORRID"]
    assert [control_value(s, sequence) for s in specs] == values


def test_worker_builds_control_tensors() -> None:
    specs = control_specs(_config())
    reqs = [
        BatchRequest(1, (), (), "", {"id": 4, "start": True, "end": False, "controls": specs}),
        BatchRequest(2, (), (), "", {"id": 6, "start": False, "end": True, "controls": specs}),
    ]
    arrays = control_arrays(reqs, batching=True)
    assert arrays["START"].dtype == np.int32 and arrays["START"].tolist() == [[1], [0]]
    assert arrays["END"].dtype == np.float32 and arrays["END"].tolist() == [[0.0], [1.0]]
    assert arrays["READY"].dtype == np.bool_ and arrays["READY"].tolist() == [[True], [True]]
    assert arrays["CORRID"].dtype == np.uint32 and arrays["CORRID"].tolist() == [[4], [6]]
    single = control_arrays(reqs[:1], batching=False)
    assert single["START"].shape == (1,)
    assert control_arrays([BatchRequest(1, (), ())], batching=True) == {}


def test_a_string_corrid_control_is_accepted_and_built_as_bytes() -> None:
    """Triton's qa serves ``simple_string_dyna_sequence`` (what Triton's dyna sequence clients send string
    ids to) with ``CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING``: the config loads and the model gets
    each request's id as a BYTES row (an integer id as its decimal text)."""
    from zinfer.modelconfig.model_config import parse_model_config

    config = parse_model_config(
        """
        max_batch_size: 8
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching {
          control_input [
            { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
          ]
        }
        """,
        source="config.pbtxt",
        model_name="m",
    )
    assert config.sequence_batching is not None
    specs = control_specs(config.sequence_batching)
    assert specs == [{"name": "CORRID", "kind": "CORRID", "data_type": "TYPE_STRING"}]
    reqs = [
        BatchRequest(1, (), (), "", {"id": "1002", "start": True, "end": False, "controls": specs}),
        BatchRequest(2, (), (), "", {"id": 7, "start": False, "end": True, "controls": specs}),
    ]
    arrays = control_arrays(reqs, batching=True)
    assert arrays["CORRID"].dtype == np.object_ and arrays["CORRID"].tolist() == [[b"1002"], [b"7"]]
