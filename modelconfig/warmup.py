"""``model_warmup``: the samples a model instance runs at load, before it is ready, as Triton runs them.

Each sample (``ModelWarmup``) is ``batch_size`` requests of one row each (no batch dimension when the model
does not batch), run ``count`` times (once when 0), with these inputs:

* ``zero_data``: zeros (empty strings for ``TYPE_STRING``);
* ``random_data``: random values (``TYPE_STRING`` as zero data, as in Triton);
* ``input_data_file``: the raw bytes of one request's tensor, in row-major order, from the file of that name
  in the model's ``warmup/`` folder (``TYPE_STRING``: each element a 4-byte little-endian length, then its
  bytes). The name must stay inside that folder and the size must be exact.

``check_warmup`` checks the samples against the model's inputs (names, types, shapes: every input that is
not optional given, each as the config declares it) when the config is loaded; ``request_arrays`` builds one
request's inputs. The worker runs them (``zinfer.workers.warmup``); a sample that fails fails the load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zinfer.client import dtypes
from zinfer.client.errors import ConfigError, InvalidArgument

from .model_config import ModelConfig
from .model_files import read_model_file
from .model_options import ModelWarmup, WarmupInput

__all__ = ["WARMUP_FOLDER", "check_warmup", "request_arrays"]

WARMUP_FOLDER = "warmup"
_MAX_FILE_BYTES = 1 << 30


def _where(config: ModelConfig, sample: ModelWarmup) -> str:
    return f"model '{config.name}': model_warmup '{sample.name}'"


def check_warmup(config: ModelConfig) -> None:
    """Raise a ConfigError for a warmup sample that does not fit the model's inputs."""
    inputs = {t.name: t for t in config.input}
    for sample in config.model_warmup:
        where = _where(config, sample)
        for name, given in sample.inputs.items():
            tensor = inputs.get(name)
            if tensor is None:
                raise ConfigError(f"{where}: the model has no input '{name}' (it has {sorted(inputs)})")
            if given.data_type != tensor.data_type:
                raise ConfigError(
                    f"{where}: input '{name}' is {given.data_type}, the model takes {tensor.data_type}"
                )
            fits = len(given.dims) == len(tensor.dims) and all(
                want in (-1, got) for want, got in zip(tensor.dims, given.dims, strict=True)
            )
            if not fits:
                raise ConfigError(
                    f"{where}: input '{name}' has dims {list(given.dims)}, "
                    f"the model takes {list(tensor.dims)}"
                )
        missing = sorted(n for n, t in inputs.items() if not t.optional and n not in sample.inputs)
        if missing:
            raise ConfigError(f"{where}: no data for input {', '.join(repr(m) for m in missing)}")


def _from_file(
    config: ModelConfig, sample: ModelWarmup, name: str, given: WarmupInput, model_dir: Path
) -> bytes:
    try:
        return read_model_file(model_dir / WARMUP_FOLDER, given.input_data_file, _MAX_FILE_BYTES)
    except ConfigError as exc:
        where = _where(config, sample)
        raise ConfigError(f"{where}: input_data_file {given.input_data_file!r} {exc}") from None


def _array(
    config: ModelConfig,
    sample: ModelWarmup,
    name: str,
    given: WarmupInput,
    model_dir: Path,
    rng: np.random.Generator,
) -> npt.NDArray[Any]:
    wire = dtypes.config_to_wire(given.data_type)
    dtype = dtypes.wire_to_numpy(wire)
    shape = tuple(given.dims)
    if given.input_data_file:
        raw = _from_file(config, sample, name, given, model_dir)
        if wire == dtypes.BYTES:
            try:
                return dtypes.deserialize_bytes(raw, shape)
            except InvalidArgument as exc:
                raise ConfigError(f"{_where(config, sample)}: input '{name}': {exc}") from None
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(raw) != want:
            raise ConfigError(
                f"{_where(config, sample)}: input '{name}' needs {want} bytes "
                f"from {given.input_data_file!r}, the file has {len(raw)}"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if wire == dtypes.BYTES:
        return np.full(shape, b"", dtype=object)
    if given.random_data:
        if dtype.kind == "f":
            return rng.random(shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, shape).astype(dtype)
        return rng.integers(0, 100, shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def request_arrays(
    config: ModelConfig, sample: ModelWarmup, model_dir: Path, rng: np.random.Generator
) -> dict[str, npt.NDArray[Any]]:
    """One warmup request's inputs: each with a batch dimension of 1 when the model batches."""
    out = {}
    for name, given in sample.inputs.items():
        arr = _array(config, sample, name, given, model_dir, rng)
        out[name] = arr.reshape((1, *arr.shape)) if config.max_batch_size > 0 else arr
    return out
