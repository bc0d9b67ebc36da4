"""The python-backend floor worker (``floor_ensemble.py`` runs it through ``floor_ens_procs``): the echo
worker's DEALER socket and calls, reading zinfer's real EXECUTE and answering its real RESULT, with the
model's own ``model.py`` (``vs_triton_repo``'s ``TritonPythonModel`` source) run on the cheapest
``triton_python_backend_utils`` objects that model code can use: a request that makes an input's array
from its frame when the model asks for it, a ``Tensor`` that holds a name and an array, an
``InferenceResponse`` that holds its tensors.

What a worker of the contract cannot skip, and the floor does: decode the EXECUTE, make each input an array
(``BYTES`` in Triton's length-prefixed layout, the rest by ``frombuffer``), call ``execute`` (a batch at
once; or, for a ``serial`` run of a model without dynamic batching, once per request), make each output's
bytes and its tensor record, encode the RESULT with the timings. What it leaves out (zinfer's worker does
them): checks of outputs against the config, requested-output filtering, errors per request, parameters,
shared memory, cancellation, BLS, tracing, metrics, heartbeats.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import numpy as np
import zmq

from zinfer.client import dtypes, protocol
from zinfer.client.protocol import Command, TensorRef
from zinfer.client.worker_protocol import decode_execute
from zinfer.client.worker_records import Execute, ExecuteRequest, RequestResult, WorkerResult

_BYTES = "BYTES"
_NUMPY: dict[str, np.dtype[Any]] = {
    "FP32": np.dtype(np.float32),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
}
_WIRE: dict[np.dtype[Any], str] = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
}


class Tensor:
    """``pb_utils.Tensor``: a name and an array."""

    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> Any:
        return self._array


class InferenceResponse:
    """``pb_utils.InferenceResponse``: its output tensors (errors are out of the floor)."""

    def __init__(self, output_tensors: list[Tensor], error: Any = None) -> None:
        if error is not None:
            raise SystemExit("the floor takes no error responses")
        self._outputs = output_tensors

    def output_tensors(self) -> list[Tensor]:
        return self._outputs


class InferenceRequest:
    """``pb_utils.InferenceRequest`` of one EXECUTE request: inputs made into arrays when asked for."""

    def __init__(self, req: ExecuteRequest, frames: list[Any]) -> None:
        self._req = req
        self._frames = frames

    def request_id(self) -> str:
        return self._req.request_id

    def tensor(self, name: str) -> Tensor | None:
        for t in self._req.inputs:
            if t.name == name:
                if t.frame is None:
                    raise SystemExit("the floor takes only inline tensors")
                data = self._frames[t.frame]
                if t.datatype == _BYTES:
                    return Tensor(name, dtypes.deserialize_bytes(data, t.shape))
                return Tensor(name, np.frombuffer(data, _NUMPY[t.datatype]).reshape(t.shape))
        return None


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request.tensor(name)


def install() -> None:
    """These objects as the ``triton_python_backend_utils`` module that ``model.py`` imports."""
    mod = types.ModuleType("triton_python_backend_utils")
    mod.__dict__.update(
        Tensor=Tensor,
        InferenceResponse=InferenceResponse,
        InferenceRequest=InferenceRequest,
        get_input_tensor_by_name=get_input_tensor_by_name,
    )
    sys.modules["triton_python_backend_utils"] = mod


def load(name: str, source: str) -> Any:
    """An instance of the ``TritonPythonModel`` that ``source`` (a ``model.py``) defines."""
    install()
    mod = types.ModuleType(f"floor_model_{name}")
    exec(compile(source, f"{name}/1/model.py", "exec"), mod.__dict__)
    model = mod.__dict__["TritonPythonModel"]()
    init = getattr(model, "initialize", None)
    if init is not None:
        init({"model_name": name, "model_instance_kind": "CPU", "model_instance_device_id": "0"})
    return model


def _out(t: Tensor, frames: list[Any]) -> TensorRef:
    """An output's record, its bytes appended to ``frames``."""
    arr = t.as_numpy()
    wire = _WIRE.get(arr.dtype)
    if wire is None:
        wire = dtypes.numpy_to_wire(arr.dtype)
    frames.append(dtypes.serialize_bytes(arr) if wire == _BYTES else arr.tobytes())
    return TensorRef(t.name(), wire, tuple(arr.shape), None, len(frames) - 1)


def worker(back_ep: str, name: str, source: str) -> None:
    """The floor worker of model ``name``: says hello with its name, then answers EXECUTEs."""
    model = load(name, source)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(back_ep)
    sock.send(name.encode())
    ns = time.monotonic_ns
    while True:
        if not sock.poll(10_000):
            return
        got = decode_execute(sock.recv_multipart())
        if got is None:
            return
        ex: Execute = got.record
        t0 = ns()
        reqs = [InferenceRequest(r, got.frames) for r in ex.requests]
        t1 = ns()
        if ex.serial:
            responses = [model.execute([q])[0] for q in reqs]
        else:
            responses = model.execute(reqs)
        t2 = ns()
        frames: list[Any] = []
        results = tuple(
            RequestResult(r.id, outputs=tuple(_out(t, frames) for t in resp.output_tensors()))
            for r, resp in zip(ex.requests, responses, strict=True)
        )
        t3 = ns()
        header: Any = WorkerResult(ex.batch, results, timings=(t1 - t0, t2 - t1, t3 - t2))
        sock.send_multipart(protocol.encode(Command.W_RESULT, header, frames))
