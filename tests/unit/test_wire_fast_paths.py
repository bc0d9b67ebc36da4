"""The decoders' fast paths take exactly what their field-by-field checks take, and build the same records.

``tensor_from_wire``, ``output_from_wire``, ``infer_from_wire``, ``request_result_from_wire`` and
``execute_request_from_wire`` first try a fast path for the common shapes of header; anything else goes to
the full checks. Hostile headers are
generated around the valid ones (wrong types, bools for ints, out-of-range numbers, extra or missing keys,
subclasses), and each must give the same result or the same ``ProtocolError`` on both paths.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from zinfer.client import protocol, worker_protocol
from zinfer.client.errors import ProtocolError

_edge_ints = st.sampled_from([0, 1, 7, -1, (1 << 40) - 1, 1 << 40, (1 << 63) - 1, 1 << 63, 1 << 64])
_scalars = st.one_of(
    _edge_ints,
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.sampled_from(["", "x" * 300, "FP32", "r0"]),
    st.binary(max_size=3),
)
_HOSTILE = [True, False, -1, 0, 1, 1 << 40, 1 << 63, 1 << 64, 1.5, None, "", "x" * 300, b"x", [], {},
            [True], ["r", True, 1], ["r", -1, 1], ["", 0, 1], ["r", 0, 1 << 63], ["r", 0], [1, 1 << 40],
            [-1]]  # fmt: skip
_values = st.one_of(
    st.sampled_from(_HOSTILE), st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=6)
)


def _variants(base: dict[str, Any]) -> st.SearchStrategy[Any]:
    """``base``, and ``base`` with some keys replaced by hostile values, dropped, or added."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        d = dict(base)
        for key in draw(st.lists(st.sampled_from([*base, "extra", "caller_id", "parameters"]), max_size=3)):
            choice = draw(st.integers(0, 2))
            if choice == 0:
                d.pop(key, None)
            else:
                d[key] = draw(_values)
        return d if draw(st.integers(0, 20)) else draw(_values)

    return build()


def _same(fast: Any, slow: Any, value: Any) -> None:
    def run(fn: Any) -> tuple[str, Any]:
        try:
            return "ok", fn(value)
        except ProtocolError as exc:
            return "error", str(exc)

    assert run(fast) == run(slow)


TENSOR = {"name": "INPUT_A", "datatype": "FP32", "shape": [1, 4], "frame": 0}
SHM_TENSOR = {"name": "X", "datatype": "INT8", "shape": [2], "shm": ["region", 0, 2]}


@settings(max_examples=1500, deadline=None)
@given(st.one_of(_variants(TENSOR), _variants(SHM_TENSOR)))
def test_tensor_fast_path_matches_the_checks(d: Any) -> None:
    _same(protocol.tensor_from_wire, protocol._tensor_checked, d)


@settings(max_examples=600, deadline=None)
@given(_variants({"name": "OUTPUT_SUM"}))
def test_output_fast_path_matches_the_checks(d: Any) -> None:
    def slow(v: Any) -> Any:
        if not isinstance(v, dict):
            raise ProtocolError("requested output must be a map")
        return protocol.OutputRequest(
            protocol._name(v), protocol.shm_from_wire(v["slot"]) if "slot" in v else None
        )

    _same(protocol.output_from_wire, slow, d)


INFER = {
    "id": "17",
    "model": "add",
    "version": 0,
    "inputs": [TENSOR, dict(TENSOR, name="INPUT_B", frame=1)],
    "outputs": [{"name": "OUTPUT_SUM"}],
    "priority": 2,
    "timeout_us": 1000,
}


@settings(max_examples=1500, deadline=None)
@given(_variants(INFER))
def test_infer_fast_path_matches_the_checks(d: Any) -> None:
    if not isinstance(d, dict):
        return  # the caller hands a map (``unpack_header`` refuses anything else first)
    _same(protocol.infer_from_wire, protocol._infer_checked, d)


@settings(max_examples=1500, deadline=None)
@given(_variants({"id": 5, "status": 0, "outputs": [TENSOR]}))
def test_result_fast_path_matches_the_checks(d: Any) -> None:
    _same(worker_protocol.request_result_from_wire, worker_protocol._request_result_checked, d)


@settings(max_examples=1500, deadline=None)
@given(_variants({"id": 3, "inputs": [TENSOR, SHM_TENSOR], "outputs": [{"name": "Y"}], "request_id": "r"}))
def test_execute_request_fast_path_matches_the_checks(d: Any) -> None:
    _same(worker_protocol.execute_request_from_wire, worker_protocol._execute_request_checked, d)


def test_the_fast_paths_are_taken_for_the_common_headers() -> None:
    # a record from the fast path equals the checked one (a wrong fast path fails the tests above)
    assert protocol.infer_from_wire(INFER) == protocol._infer_checked(INFER)
    assert protocol.tensor_from_wire(SHM_TENSOR) == protocol._tensor_checked(SHM_TENSOR)
    r = {"id": 5, "status": 0, "outputs": [TENSOR]}
    assert worker_protocol.request_result_from_wire(r) == worker_protocol._request_result_checked(r)
