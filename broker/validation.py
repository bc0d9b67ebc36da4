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


@dataclass(frozen=True, init=False)
class CheckedRequest:
    """What ``check_request`` found. (Its own ``__init__``: built per request and per ensemble step, and
    under mypyc a dataclass's generated one runs as interpreted code.)"""

    batch_size: int
    shape_key: Hashable
    outputs: tuple[OutputRequest, ...]
    input_bytes: int

    def __init__(
        self, batch_size: int, shape_key: Hashable, outputs: tuple[OutputRequest, ...], input_bytes: int
    ) -> None:
        object.__setattr__(self, "batch_size", batch_size)
        object.__setattr__(self, "shape_key", shape_key)
        object.__setattr__(self, "outputs", outputs)
        object.__setattr__(self, "input_bytes", input_bytes)


def _nbytes(ref: TensorRef, frames: Sequence[Frame]) -> int:
    if ref.shm is not None:
        return ref.shm.nbytes
    assert ref.frame is not None
    if ref.frame >= len(frames):
        raise InvalidArgument(
            f"input '{ref.name}' names inline frame {ref.frame}, the message has {len(frames)}"
        )
    return len(memoryview(frames[ref.frame]).cast("B"))


def _dims(dims: Sequence[int]) -> str:
    """A shape as Triton's messages write it: ``[-1,4]``."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def _names(names: Sequence[str]) -> str:
    """A list of tensor names as Triton's messages write it: ``['A','B']``."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _check_shape(ref: TensorRef, dims: Sequence[int], max_batch_size: int, model: str) -> int:
    shape = ref.shape
    if max_batch_size > 0:
        if not shape:
            raise InvalidArgument(
                f"input '{ref.name}' has no shape but model requires batch dimension for '{model}'"
            )
        batch, body = shape[0], shape[1:]
        if batch > max_batch_size:
            raise InvalidArgument(f"inference request batch-size must be <= {max_batch_size} for '{model}'")
        if batch < 1:
            raise InvalidArgument(
                f"input '{ref.name}' has batch size {batch}, model '{model}' accepts 1 to {max_batch_size}"
            )
    else:
        batch, body = 1, shape
    if len(body) != len(dims) or any(want not in (-1, got) for want, got in zip(dims, body, strict=True)):
        expected = ([-1] if max_batch_size > 0 else []) + list(dims)
        note = " (max_batch_size > 0: a leading batch dimension comes first)" if max_batch_size > 0 else ""
        raise InvalidArgument(
            f"unexpected shape for input '{ref.name}' for model '{model}'. Expected {_dims(expected)}, "
            f"got {_dims(shape)}{note}"
        )
    return batch


def _check_input_set(req: InferRequest, sig: Signature) -> None:
    """Triton's count check: between the required inputs and all of them, naming what is missing."""
    specs = sig.inputs
    given = {ref.name for ref in req.inputs}
    required = [name for name, spec in specs.items() if not spec.optional]
    missing = [name for name in required if name not in given]
    if not missing and len(given) <= len(specs) and len(given) >= len(required):
        return
    if len(required) == len(specs):
        expected = f"expected {len(specs)} inputs"
    else:
        expected = f"expected number of inputs between {len(required)} and {len(specs)}"
    raise InvalidArgument(
        f"{expected} but got {len(given)} inputs for model '{sig.name}'. Got input(s) "
        f"{_names(sorted(given))}, but missing required input(s) {_names(missing)}. "
        "Please provide all required input(s)."
    )


def check_request(
    req: InferRequest,
    frames: Sequence[Frame],
    sig: Signature,
    regions: RegionCheck,
    client: bytes,
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
) -> CheckedRequest:
    """Raise ``InvalidArgument`` with a clear message unless the request fits the model exactly. The
    messages hold Triton's texts (``unexpected inference input``, ``unexpected shape for input``, ...),
    which its clients match on; an input the model does not have is named as such even where Triton only
    counts inputs. An ``optional`` input may be left out; the model then sees it absent."""
    model = sig.name
    specs = sig.inputs
    seen: dict[str, TensorRef] = {}
    frames_used: set[int] = set()
    input_bytes = 0
    for ref in req.inputs:
        spec = specs.get(ref.name)
        if spec is None:
            raise InvalidArgument(
                f"unexpected inference input '{ref.name}' for model '{model}', it takes {sorted(specs)}"
            )
        if ref.name in seen:
            raise InvalidArgument(f"input '{ref.name}' is given twice")
        seen[ref.name] = ref
        want = spec.wire
        if ref.datatype != want:
            raise InvalidArgument(
                f"inference input '{ref.name}' data-type is '{ref.datatype}', but model '{model}' "
                f"expects '{want}'"
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
                    f"input byte size mismatch for input '{ref.name}' for model '{model}'. "
                    f"Expected {expected}, got {nbytes}"
                )
        if ref.shm is not None:
            regions.check(client, ref.shm)
        elif ref.frame is not None:
            if ref.frame in frames_used:
                raise InvalidArgument("two inputs name the same inline frame")
            frames_used.add(ref.frame)
    _check_input_set(req, sig)
    batch = 0
    for ref in req.inputs:
        rows = _check_shape(ref, specs[ref.name].dims, sig.max_batch_size, model)
        if batch and rows != batch:
            raise InvalidArgument(f"input '{ref.name}' batch size does not match other inputs for '{model}'")
        batch = rows
    outputs = _check_outputs(req, sig, regions, client)
    shape_key = tuple(
        (name, seen[name].shape[1:] if sig.batching else seen[name].shape) for name in sorted(seen)
    )  # the set of inputs is part of it: requests that leave out different optional inputs never batch
    return CheckedRequest(batch or 1, shape_key, outputs, input_bytes)


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
                f"unexpected inference output '{out.name}' for model '{sig.name}', it has {sorted(names)}"
            )
        if out.name in seen:
            raise InvalidArgument(f"output '{out.name}' is requested twice")
        seen.add(out.name)
        if out.slot is not None:
            regions.check(client, out.slot)
    return req.outputs
