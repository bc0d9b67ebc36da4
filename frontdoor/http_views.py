"""The JSON bodies of the KServe v2 HTTP answers other than inference, from the bridge's records, as
Triton writes them (so ``tritonclient.http`` reads them unchanged), plus the small JSON request bodies."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from zinfer.client.errors import InvalidArgument

from .bridge_records import ModelMetadata, ModelStatistics, RepositoryModel, ServerMetadata

__all__ = [
    "error_body",
    "model_metadata",
    "not_ready_reason",
    "optional_json",
    "repository_index",
    "server_metadata",
    "shm_register_body",
    "shm_status",
    "statistics",
]

_STAT_KEYS = (
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
)  # fmt: skip
_U64 = (1 << 64) - 1


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def error_body(message: str) -> bytes:
    """Triton's error answer: ``{"error": "..."}``."""
    return dumps({"error": message})


def not_ready_reason(models: Iterable[RepositoryModel] | None) -> str:
    """The body's reason for a ``/v2/health/ready`` that is not ready (Triton's status, 400, with a reason):
    the models still loading and those that failed, from the repository index (None: the broker did not
    answer)."""
    if models is None:
        return "Server is not ready: the zinfer server does not answer"
    rows = list(models)
    loading = sorted({m.name for m in rows if m.state == "LOADING"})
    failed = sorted({f"{m.name} ({m.reason})" for m in rows
                     if m.state == "UNAVAILABLE" and m.reason and m.reason != "unloaded"})  # fmt: skip
    parts = ([f"loading: {', '.join(loading)}"] if loading else []) + (
        [f"failed to load: {'; '.join(failed)}"] if failed else []
    )
    return "Server is not ready: " + ("; ".join(parts) or "starting, or draining to stop")


def server_metadata(meta: ServerMetadata) -> dict[str, Any]:
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def _tensors(specs: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]


def model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": _tensors(meta.inputs),
        "outputs": _tensors(meta.outputs),
    }


def statistics(stats: Iterable[ModelStatistics]) -> dict[str, Any]:
    """Triton's statistics extension; zinfer counts batches per size but not their durations (0 ns)."""
    zero = {"count": 0, "ns": 0}
    models = []
    for s in stats:
        durations = {
            k: ({"count": s.durations[k].count, "ns": s.durations[k].ns} if k in s.durations else dict(zero))
            for k in _STAT_KEYS
        }
        models.append({
            "name": s.name,
            "version": s.version,
            "last_inference": s.last_inference_ms,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": durations,
            "batch_stats": [
                {
                    "batch_size": b.batch_size,
                    "compute_input": {"count": b.count, "ns": 0},
                    "compute_infer": {"count": b.count, "ns": 0},
                    "compute_output": {"count": b.count, "ns": 0},
                }
                for b in s.batch_stats
            ],
        })  # fmt: skip
    return {"model_stats": models}


def repository_index(models: Iterable[RepositoryModel]) -> list[dict[str, str]]:
    out = []
    for m in models:
        entry = {"name": m.name}
        if m.version:
            entry["version"] = m.version
        if m.state:
            entry["state"] = m.state
        if m.reason:
            entry["reason"] = m.reason
        out.append(entry)
    return out


def shm_status(regions: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]


def optional_json(body: bytes) -> Mapping[str, Any]:
    """A small request body that may be empty (index, load, unload): ``{}`` when empty, else an object."""
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {str(exc)[:200]}") from None
    if type(doc) is not dict:
        raise InvalidArgument("failed to parse the request JSON buffer: expected an object")
    return doc


def shm_register_body(body: bytes) -> tuple[str, int, int]:
    """``{"key": ..., "offset": ..., "byte_size": ...}`` of a system shared memory register request."""
    doc = optional_json(body)
    if "key" not in doc:
        raise InvalidArgument("Shared memory register request has no 'key' field")
    if "byte_size" not in doc:
        raise InvalidArgument("Shared memory register request has no 'byte_size' field")
    key, offset, size = doc["key"], doc.get("offset", 0), doc["byte_size"]
    if type(key) is not str:
        raise InvalidArgument("Unable to parse 'key'")
    for name, value in (("offset", offset), ("byte_size", size)):
        if type(value) is not int or not 0 <= value <= _U64:
            raise InvalidArgument(f"Unable to parse '{name}'")
    return key, offset, size
