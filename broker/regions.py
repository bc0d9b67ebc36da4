"""Shared-memory regions registered by each client connection.

A descriptor may only name a region its own connection registered; its bounds are checked against the
size the segment had when it was registered (workers re-check the real size before touching it).
"""

from __future__ import annotations

from collections import defaultdict

from zinfer.client.errors import InvalidArgument, NotFound, ResourceExhausted, ShmError, UnknownRegion
from zinfer.client.protocol import ShmRef
from zinfer.client.shm import reap_orphans, region_size

MAX_REGIONS_PER_CLIENT = 1024


class RegionTable:
    def __init__(self, max_region_bytes: int = 0) -> None:
        self.max_region_bytes = max_region_bytes
        self._by_client: defaultdict[bytes, dict[str, int]] = defaultdict(dict)

    def register(self, client: bytes, name: str) -> int:
        """Record ``name`` for ``client``; returns its size. Errors never echo the name."""
        regions = self._by_client[client]
        if name not in regions and len(regions) >= MAX_REGIONS_PER_CLIENT:
            raise ResourceExhausted(f"a connection may register at most {MAX_REGIONS_PER_CLIENT} regions")
        try:
            size = region_size(name)
        except ShmError as exc:
            raise InvalidArgument(f"cannot register region: {exc}") from None
        if size <= 0:
            raise InvalidArgument("cannot register region: it is empty")
        if self.max_region_bytes and size > self.max_region_bytes:
            raise ResourceExhausted(
                f"cannot register region: {size} bytes is over the {self.max_region_bytes} byte limit"
            )
        regions[name] = size
        return size

    def unregister(self, client: bytes, name: str) -> None:
        if self._by_client.get(client, {}).pop(name, None) is None:
            raise NotFound("no such region registered by this connection")

    def drop_client(self, client: bytes) -> list[str]:
        return list(self._by_client.pop(client, {}))

    def check(self, client: bytes, ref: ShmRef) -> None:
        """Raise ``InvalidArgument`` unless ``ref`` lies inside a region ``client`` registered."""
        size = self._by_client.get(client, {}).get(ref.region)
        if size is None:
            raise UnknownRegion("tensor names a region this connection has not registered")
        if ref.offset < 0 or ref.nbytes < 0 or ref.offset > size or ref.nbytes > size - ref.offset:
            raise InvalidArgument(
                f"invalid offset + byte size for region of {size} bytes: "
                f"offset {ref.offset}, size {ref.nbytes}"
            )

    def reap_dead_clients(self) -> list[str]:
        """Forget, and unlink, the regions whose creating client process has died."""
        dead = set(reap_orphans([n for regions in self._by_client.values() for n in regions]))
        if dead:
            for client in list(self._by_client):
                regions = self._by_client[client]
                for name in dead & regions.keys():
                    del regions[name]
                if not regions:
                    del self._by_client[client]
        return sorted(dead)

    def total_bytes(self) -> int:
        return sum(sum(r.values()) for r in self._by_client.values())

    def count(self) -> int:
        return sum(len(r) for r in self._by_client.values())
