"""``instance_group``: how many instances of a model run, of which kind, on which GPUs, with which rate
limiter resources."""

from __future__ import annotations

from dataclasses import dataclass, field

from .block import INT32, INT64, UINT32, Block, nonnegative
from .record_base import ProtoEnum, json_meta

__all__ = [
    "InstanceGroup",
    "InstanceKind",
    "RateLimiter",
    "RateLimiterResource",
    "SecondaryDevice",
    "SecondaryDeviceKind",
    "decode_instance_group",
]


class InstanceKind(ProtoEnum):
    KIND_AUTO = "KIND_AUTO"
    KIND_GPU = "KIND_GPU"
    KIND_CPU = "KIND_CPU"
    KIND_MODEL = "KIND_MODEL"


class SecondaryDeviceKind(ProtoEnum):
    KIND_NVDLA = "KIND_NVDLA"


@dataclass(frozen=True, slots=True)
class RateLimiterResource:
    name: str
    is_global: bool = field(default=False, metadata=json_meta("global"))
    count: int = 0


@dataclass(frozen=True, slots=True)
class RateLimiter:
    resources: tuple[RateLimiterResource, ...] = ()
    priority: int = 1


@dataclass(frozen=True, slots=True)
class SecondaryDevice:
    kind: SecondaryDeviceKind = SecondaryDeviceKind.KIND_NVDLA
    device_id: int = 0


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """``count`` instances per listed GPU (GPU kinds) or in all (CPU); empty ``gpus`` means all GPUs."""

    name: str
    kind: InstanceKind = InstanceKind.KIND_AUTO
    count: int = 1
    gpus: tuple[int, ...] = ()
    rate_limiter: RateLimiter | None = None
    secondary_devices: tuple[SecondaryDevice, ...] = ()
    profile: tuple[str, ...] = ()
    passive: bool = False
    host_policy: str = ""


def _decode_resource(b: Block) -> RateLimiterResource:
    record = RateLimiterResource(
        name=b.string("name"), is_global=b.boolean("global"), count=b.integer("count", UINT32)
    )
    if not record.name:
        raise b.error("is required and may not be empty", "name")
    b.finish()
    return record


def _decode_rate_limiter(b: Block) -> RateLimiter:
    record = RateLimiter(
        resources=tuple(_decode_resource(r) for r in b.blocks("resources")),
        priority=b.integer("priority", UINT32) or 1,
    )
    b.finish()
    return record


def _decode_secondary_device(b: Block) -> SecondaryDevice:
    record = SecondaryDevice(
        kind=b.enum("kind", SecondaryDeviceKind, SecondaryDeviceKind.KIND_NVDLA),
        device_id=b.integer("device_id", INT64),
    )
    b.finish()
    return record


def decode_instance_group(b: Block, index: int, model_name: str) -> InstanceGroup:
    """One ``instance_group`` entry; an unnamed group is called ``<model>_<index>``, count defaults to 1."""
    limiter = b.block("rate_limiter")
    record = InstanceGroup(
        name=b.string("name") or f"{model_name}_{index}",
        kind=b.enum("kind", InstanceKind, InstanceKind.KIND_AUTO),
        count=b.integer("count", INT32, default=1),
        gpus=b.integers("gpus", INT32, nonnegative),
        rate_limiter=None if limiter is None else _decode_rate_limiter(limiter),
        secondary_devices=tuple(_decode_secondary_device(d) for d in b.blocks("secondary_devices")),
        profile=b.strings("profile"),
        passive=b.boolean("passive"),
        host_policy=b.string("host_policy"),
    )
    if record.count < 1:
        raise b.error(f"must be >= 1, got {record.count}", "count")
    if record.gpus and record.kind in (InstanceKind.KIND_CPU, InstanceKind.KIND_MODEL):
        raise b.error(f"may not be given for {record.kind.value}", "gpus")
    b.finish()
    return record
