"""The checks the records no longer make themselves (they have no ``__post_init__``), made where a header
comes in: a tensor names exactly one of ``shm`` and ``frame`` on every path a header holding tensors is
decoded (typed from its bytes, or converted from its map), and decoded parameters are read-only."""

from __future__ import annotations

from typing import Any

import pytest

from zinfer.client import protocol
from zinfer.client import worker_protocol as wp
from zinfer.client.errors import ProtocolError
from zinfer.client.protocol import Command

GOOD = {"name": "A", "datatype": "FP32", "shape": [1], "frame": 0}
BOTH = {**GOOD, "shm": ["r", 0, 4]}
NEITHER = {"name": "A", "datatype": "FP32", "shape": [1]}


def _infer(tensor: dict[str, Any]) -> dict[str, Any]:
    return {"id": "r", "model": "m", "version": 0, "inputs": [GOOD, tensor]}


def _execute(tensor: dict[str, Any], parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"id": 1, "inputs": [GOOD, tensor], "outputs": []}
    if parameters:
        request["parameters"] = parameters
    return {"batch": 1, "requests": [{"id": 0, "inputs": [GOOD], "outputs": []}, request]}


def _result(tensor: dict[str, Any], parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": 1, "status": 0, "outputs": [GOOD, tensor]}
    if parameters:
        entry["parameters"] = parameters
    return {"batch": 1, "results": [entry], "t": [1, 2, 3]}


def _frames(command: Command, header: dict[str, Any]) -> list[Any]:
    return protocol.encode(command, header, [b"\0" * 4])


@pytest.mark.parametrize("tensor", [BOTH, NEITHER], ids=["both", "neither"])
def test_an_infer_tensor_naming_both_or_neither_is_refused(tensor: dict[str, Any]) -> None:
    frames = _frames(Command.INFER, _infer(tensor))
    assert protocol.decode_infer(frames) is None  # the typed path declines; the map path names the fault
    with pytest.raises(ProtocolError, match="exactly one of 'shm' or 'frame'"):
        protocol.infer_from_wire(protocol.decode(frames).header)
    with pytest.raises(ProtocolError, match="exactly one of 'shm' or 'frame'"):
        protocol.tensor_from_wire(tensor)


@pytest.mark.parametrize("tensor", [BOTH, NEITHER], ids=["both", "neither"])
def test_an_execute_tensor_naming_both_or_neither_is_refused(tensor: dict[str, Any]) -> None:
    frames = _frames(Command.W_EXECUTE, _execute(tensor))
    assert wp.decode_execute(frames) is None
    header = protocol.decode(frames).header
    with pytest.raises(ProtocolError, match="exactly one of 'shm' or 'frame'"):
        wp.execute_from_wire(header)
    with pytest.raises(ProtocolError, match="exactly one of 'shm' or 'frame'"):
        wp.execute_request_from_wire(header["requests"][1])


@pytest.mark.parametrize("tensor", [BOTH, NEITHER], ids=["both", "neither"])
def test_a_result_tensor_naming_both_or_neither_is_refused(tensor: dict[str, Any]) -> None:
    frames = _frames(Command.W_RESULT, _result(tensor))
    assert wp.decode_result(frames) is None
    header = protocol.decode(frames).header
    with pytest.raises(ProtocolError, match="exactly one of 'shm' or 'frame'"):
        wp.result_from_wire(header)
    with pytest.raises(ProtocolError, match="exactly one of 'shm' or 'frame'"):
        wp.request_result_from_wire(header["results"][0])


def test_well_formed_headers_still_decode_on_the_typed_path() -> None:
    assert protocol.decode_infer(_frames(Command.INFER, _infer(GOOD))) is not None
    assert wp.decode_execute(_frames(Command.W_EXECUTE, _execute(GOOD))) is not None
    assert wp.decode_result(_frames(Command.W_RESULT, _result(GOOD))) is not None


def _read_only(parameters: Any) -> None:
    assert parameters == {"k": "v"}
    with pytest.raises(TypeError):
        parameters["k"] = "changed"


def test_decoded_execute_parameters_are_read_only_on_every_path() -> None:
    frames = _frames(Command.W_EXECUTE, _execute(GOOD, {"k": "v"}))
    typed = wp.decode_execute(frames)
    assert typed is not None
    _read_only(typed.record.requests[1].parameters)
    header = protocol.decode(frames).header
    _read_only(wp.execute_from_wire(header).requests[1].parameters)
    _read_only(wp.execute_request_from_wire(header["requests"][1]).parameters)
    assert typed.record.requests[0].parameters == {}


def test_decoded_result_parameters_are_read_only_on_every_path() -> None:
    frames = _frames(Command.W_RESULT, _result(GOOD, {"k": "v"}))
    typed = wp.decode_result(frames)
    assert typed is not None
    _read_only(typed.record.results[0].parameters)
    header = protocol.decode(frames).header
    _read_only(wp.result_from_wire(header).results[0].parameters)
    _read_only(wp.request_result_from_wire(header["results"][0]).parameters)
