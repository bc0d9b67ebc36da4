"""A stand-in for CuPy, so the unit tests drive the GPU code paths on machines without a GPU.

Device arrays are NumPy arrays of a subclass (:class:`FakeDeviceArray`) with CuPy's ``get``/``set``;
ufuncs refuse to mix them with plain host arrays, as CuPy does. ``install(monkeypatch)`` puts the fake in
``sys.modules["cupy"]`` and returns it; ``calls`` records host registrations and stream use.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest


class FakeDeviceArray(np.ndarray):  # type: ignore[type-arg]
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        for x in (*inputs, *kwargs.get("out", ())):
            if isinstance(x, np.ndarray) and not isinstance(x, FakeDeviceArray) and x.ndim:
                raise TypeError(f"Unsupported type {type(x)} (a host array given to a device ufunc)")
        args = [x.view(np.ndarray) if isinstance(x, FakeDeviceArray) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) for o in kwargs["out"])
        result = getattr(ufunc, method)(*args, **kwargs)
        if isinstance(result, np.ndarray):
            return result.view(FakeDeviceArray)
        return result

    def get(self, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> Any:
        host = np.array(self.view(np.ndarray), order=order)
        if out is None:
            return host
        assert type(out) is np.ndarray and out.flags.c_contiguous and out.shape == self.shape
        assert out.dtype == self.dtype
        CALLS.append(("get", blocking))
        out[...] = host
        return out

    def set(self, arr: Any, stream: Any = None) -> None:
        assert type(arr) is np.ndarray and arr.flags.c_contiguous, "set() takes a contiguous host array"
        assert arr.shape == self.shape and arr.dtype == self.dtype
        assert self.flags.c_contiguous
        CALLS.append(("set", arr.shape))
        self.view(np.ndarray)[...] = arr


CALLS: list[tuple[str, Any]] = []


class _Device:
    def __init__(self, index: int) -> None:
        self.id = index

    def use(self) -> None:
        CALLS.append(("device", self.id))


class _Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = 1234

    def use(self) -> None:
        CALLS.append(("stream_use", None))

    def synchronize(self) -> None:
        CALLS.append(("sync", None))


def _to_device(a: Any, dtype: Any = None) -> FakeDeviceArray:
    if isinstance(a, FakeDeviceArray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return np.array(a, dtype=dtype).view(FakeDeviceArray)


def _module(device_count: int) -> types.ModuleType:
    mod = types.ModuleType("cupy")
    mod.ndarray = FakeDeviceArray  # type: ignore[attr-defined]
    mod.asarray = _to_device  # type: ignore[attr-defined]
    mod.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(FakeDeviceArray)  # type: ignore[attr-defined]
    mod.ascontiguousarray = (  # type: ignore[attr-defined]
        lambda a: np.ascontiguousarray(a.view(np.ndarray)).view(FakeDeviceArray)
    )
    for name in ("matmul", "add", "subtract", "maximum", "negative", "exp", "reciprocal", "tanh", "multiply"):
        setattr(mod, name, getattr(np, name))

    def host_register(ptr: int, size: int, flags: int) -> None:
        CALLS.append(("register", size))

    def host_unregister(ptr: int) -> None:
        CALLS.append(("unregister", None))

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: device_count, hostRegister=host_register, hostUnregister=host_unregister
    )
    mod.cuda = types.SimpleNamespace(runtime=runtime, Device=_Device, Stream=_Stream)  # type: ignore[attr-defined]
    return mod


def install(monkeypatch: pytest.MonkeyPatch, device_count: int = 2) -> types.ModuleType:
    CALLS.clear()
    mod = _module(device_count)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


def calls(kind: str) -> list[Any]:
    return [arg for name, arg in CALLS if name == kind]
