"""``version_policy``: which version folders of a model are served (see ``zinfer.modelconfig.repository``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .block import INT64, UINT32, Block, nonnegative, required_block

__all__ = [
    "VersionPolicy",
    "decode_version_policy",
]


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """``latest { num_versions }`` (the default, with 1), ``all { }`` or ``specific { versions }``."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"all": {}}


def decode_version_policy(b: Block) -> VersionPolicy:
    choice = b.oneof("latest", "all", "specific")
    if choice is None:
        policy = VersionPolicy()
    else:
        inner = required_block(b, choice)
        if choice == "latest":
            count = inner.integer("num_versions", UINT32, default=1)
            if count < 1:
                raise inner.error("must be >= 1", "num_versions")
            policy = VersionPolicy("latest", num_versions=count)
        elif choice == "specific":
            versions = inner.integers("versions", INT64, nonnegative)
            if not versions:
                raise inner.error("'specific' needs at least one version", "versions")
            policy = VersionPolicy("specific", num_versions=0, versions=tuple(sorted(set(versions))))
        else:
            policy = VersionPolicy("all", num_versions=0)
        inner.finish()
    b.finish()
    return policy
