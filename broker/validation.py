"""Checks an inference request against its model's config and the client's regions, before it is queued."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from zinfer.client import dtypes
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Frame, InferRequest, OutputRequest, ShmRef, TensorRef
from zinfer.modelconfig.signature import Signature

DEFAULT_MAX_TENSOR_BYTES = 1 << 32


class RegionCheck(Protocol):
    """Raises unless ``ref`` lies inside a region ``client`` may use (``regions.RegionTable``)."""

    def check(self, client: bytes, ref: ShmRef) -> None: ...


@dataclass(frozen=True)
class CheckedRequest:
    batch_size: int
    shape_key: Hashable
    outputs: tuple[OutputRequest, ...]
    input_bytes: int


def _nbytes(ref: TensorRef, frames: Sequence[Frame]) -> int:
    if ref.shm is not None:
        return ref.shm.nbytes
    assert ref.frame is not None
    if ref.frame >= len(frames):
        raise InvalidArgument(
            f"input '{ref.name}' names inline frame {ref.frame}, the message has {len(frames)}"
        )
    return len(memoryview(frames[ref.frame]).cast("B"))


def _check_shape(ref: TensorRef, dims: Sequence[int], max_batch_size: int, model: str) -> int:
    shape = ref.shape
    if max_batch_size > 0:
        if len(shape) != len(dims) + 1:
            raise InvalidArgument(
                f"input '{ref.name}' has shape {list(shape)}, model '{model}' expects [-1] + {list(dims)}"
                " (a leading batch dimension)"
            )
        batch, body = shape[0], shape[1:]
        if not 1 <= batch <= max_batch_size:
            raise InvalidArgument(
                f"input '{ref.name}' has batch size {batch}, model '{model}' accepts 1 to {max_batch_size}"
            )
    else:
        batch, body = 1, shape
        if len(shape) != len(dims):
            raise InvalidArgument(
                f"input '{ref.name}' has shape {list(shape)}, model '{model}' expects {list(dims)}"
            )
    for want, got in zip(dims, body, strict=True):
        if want != -1 and want != got:
            expected = ([-1] if max_batch_size > 0 else []) + list(dims)
            raise InvalidArgument(
                f"input '{ref.name}' has shape {list(shape)}, model '{model}' expects {expected}"
            )
    return batch


def check_request(
    req: InferRequest,
    frames: Sequence[Frame],
    sig: Signature,
    regions: RegionCheck,
    client: bytes,
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
) -> CheckedRequest:
    """Raise ``InvalidArgument`` with a clear message unless the request fits the model exactly."""
    model = sig.name
    specs = sig.inputs
    seen: dict[str, TensorRef] = {}
    frames_used: set[int] = set()
    input_bytes = 0
    for ref in req.inputs:
        spec = specs.get(ref.name)
        if spec is None:
            raise InvalidArgument(
                f"unexpected input '{ref.name}' for model '{model}', it takes {sorted(specs)}"
            )
        if ref.name in seen:
            raise InvalidArgument(f"input '{ref.name}' is given twice")
        seen[ref.name] = ref
        want = spec.wire
        if ref.datatype != want:
            raise InvalidArgument(
                f"input '{ref.name}' has datatype {ref.datatype}, model '{model}' expects {want}"
            )
        nbytes = _nbytes(ref, frames)
        input_bytes += nbytes
        if nbytes > max_tensor_bytes:
            raise InvalidArgument(
                f"input '{ref.name}' of {nbytes} bytes is over the {max_tensor_bytes} byte limit"
            )
        count = 1
        for d in ref.shape:
            count *= d
        if want == dtypes.BYTES:
            if nbytes < 4 * count:
                raise InvalidArgument(f"input '{ref.name}' is too short for {count} BYTES elements")
        else:
            expected = count * spec.itemsize
            if nbytes != expected:
                raise InvalidArgument(
                    f"input byte size mismatch for input '{ref.name}' of model '{model}': "
                    f"expected {expected}, got {nbytes}"
                )
        if ref.shm is not None:
            regions.check(client, ref.shm)
        elif ref.frame is not None:
            if ref.frame in frames_used:
                raise InvalidArgument("two inputs name the same inline frame")
            frames_used.add(ref.frame)
    missing = sorted(set(specs) - set(seen))
    if missing:
        raise InvalidArgument(f"missing input {', '.join(repr(m) for m in missing)} for model '{model}'")
    batches = {_check_shape(ref, specs[ref.name].dims, sig.max_batch_size, model) for ref in req.inputs}
    if len(batches) > 1:
        raise InvalidArgument(f"inputs disagree on the batch size: {sorted(batches)}")
    batch = batches.pop() if batches else 1
    outputs = _check_outputs(req, sig, regions, client)
    shape_key = tuple(
        (name, seen[name].shape[1:] if sig.batching else seen[name].shape) for name in sorted(seen)
    )
    return CheckedRequest(batch, shape_key, outputs, input_bytes)


def _check_outputs(
    req: InferRequest, sig: Signature, regions: RegionCheck, client: bytes
) -> tuple[OutputRequest, ...]:
    names = sig.outputs
    if req.outputs is None:
        return tuple(OutputRequest(name) for name in names)
    seen: set[str] = set()
    for out in req.outputs:
        if out.name not in names:
            raise InvalidArgument(
                f"unknown output '{out.name}' for model '{sig.name}', it has {sorted(names)}"
            )
        if out.name in seen:
            raise InvalidArgument(f"output '{out.name}' is requested twice")
        seen.add(out.name)
        if out.slot is not None:
            regions.check(client, out.slot)
    return req.outputs
