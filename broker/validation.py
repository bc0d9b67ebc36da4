"""Checks an inference request against its model's config and the client's regions, before it is queued."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from zinfer.client import dtypes, framing
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
    return framing.nbytes(frames[ref.frame])  # a frame is one contiguous buffer: its length in bytes


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


class _Input:
    """What ``check_request`` reads of one input's spec, read once per signature (``_rules``): a native
    object's fields, where a ``TensorSpec``'s are looked up by name on every request."""

    def __init__(self, wire: str, itemsize: int, dims: tuple[int, ...], optional: bool) -> None:
        self.wire = wire
        self.is_bytes = wire == dtypes.BYTES
        self.itemsize = itemsize
        self.dims = dims
        self.rank = len(dims)
        self.optional = optional


class _Rules:
    """A signature's checks as ``check_request`` runs them: its inputs, how many are required, its outputs."""

    def __init__(self, sig: Signature) -> None:
        self.sig = sig  # held: the cache below keys on its id
        self.inputs: dict[str, _Input] = {
            name: _Input(spec.wire, spec.itemsize, tuple(spec.dims), bool(spec.optional))
            for name, spec in sig.inputs.items()
        }
        self.required = sum(1 for i in self.inputs.values() if not i.optional)
        self.max_batch_size = sig.max_batch_size
        self.batching = sig.max_batch_size > 0
        self.all_outputs = tuple(OutputRequest(name) for name in sig.outputs)


_RULES: dict[int, _Rules] = {}
_MAX_RULES = 1024  # signatures kept (one per model version loaded); past it the cache starts over


def _rules(sig: Signature) -> _Rules:
    rules = _RULES.get(id(sig))
    if rules is None or rules.sig is not sig:
        if len(_RULES) >= _MAX_RULES:
            _RULES.clear()
        rules = _Rules(sig)
        _RULES[id(sig)] = rules
    return rules


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
    rules = _rules(sig)
    specs = rules.inputs
    seen: dict[str, TensorRef] = {}
    frames_used: set[int] = set()
    input_bytes = 0
    required = 0  # required inputs given
    for ref in req.inputs:
        name = ref.name
        spec = specs.get(name)
        if spec is None:
            raise InvalidArgument(
                f"unexpected inference input '{name}' for model '{model}', it takes {sorted(specs)}"
            )
        if name in seen:
            raise InvalidArgument(f"input '{name}' is given twice")
        seen[name] = ref
        if not spec.optional:
            required += 1
        want = spec.wire
        datatype = ref.datatype
        if datatype != want:
            raise InvalidArgument(
                f"inference input '{name}' data-type is '{datatype}', but model '{model}' "
                f"expects '{want}'"
            )
        shm = ref.shm
        nbytes = shm.nbytes if shm is not None else _nbytes(ref, frames)
        input_bytes += nbytes
        if nbytes > max_tensor_bytes:
            raise InvalidArgument(
                f"input '{name}' of {nbytes} bytes is over the {max_tensor_bytes} byte limit"
            )
        count = 1
        for d in ref.shape:
            count *= d
        if spec.is_bytes:
            if nbytes < 4 * count:
                raise InvalidArgument(f"input '{name}' is too short for {count} BYTES elements")
        else:
            expected = count * spec.itemsize
            if nbytes != expected:
                raise InvalidArgument(
                    f"input byte size mismatch for input '{name}' for model '{model}'. "
                    f"Expected {expected}, got {nbytes}"
                )
        if shm is not None:
            regions.check(client, shm)
        else:
            frame = ref.frame
            if frame is not None:
                if frame in frames_used:
                    raise InvalidArgument("two inputs name the same inline frame")
                frames_used.add(frame)
    if required != rules.required:  # each input given is the model's, once: only a missing one can fail
        _check_input_set(req, sig)
    batch = 0
    batching = rules.batching
    for ref in req.inputs:
        rows = _rows(ref, specs[ref.name], rules.max_batch_size, model)
        if batch and rows != batch:
            raise InvalidArgument(f"input '{ref.name}' batch size does not match other inputs for '{model}'")
        batch = rows
    outputs = rules.all_outputs if req.outputs is None else _check_outputs(req, sig, regions, client)
    # the set of inputs is part of the key: requests that leave out different optional inputs never batch
    names = list(seen)
    if len(names) > 1:
        names.sort()
    shape_key = tuple((name, seen[name].shape[1:] if batching else seen[name].shape) for name in names)
    return CheckedRequest(batch or 1, shape_key, outputs, input_bytes)


def _rows(ref: TensorRef, spec: _Input, max_batch_size: int, model: str) -> int:
    """``_check_shape``'s answer, its common case without slices and generators: the rows of ``ref``."""
    shape = ref.shape
    dims = spec.dims
    if max_batch_size > 0:
        if len(shape) != spec.rank + 1:
            return _check_shape(ref, dims, max_batch_size, model)
        batch = shape[0]
        if batch > max_batch_size or batch < 1:
            return _check_shape(ref, dims, max_batch_size, model)
        k = 1
    else:
        if len(shape) != spec.rank:
            return _check_shape(ref, dims, max_batch_size, model)
        batch = 1
        k = 0
    for want in dims:
        if want != -1 and want != shape[k]:
            return _check_shape(ref, dims, max_batch_size, model)  # raises, with the texts
        k += 1
    return batch


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
