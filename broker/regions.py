"""Shared-memory regions registered by each client connection.

A region is a sealed memory file whose descriptor the client handed over (``region_intake``) and then
claimed on its ZeroMQ connection with ``REGISTER {name, token}``. The broker keeps that descriptor: it is the
region's identity. Workers reach the very same file through ``/proc/<broker>/fd/<n>`` and check its device
and inode against the ones the EXECUTE names, so neither a name nor a path is ever trusted. A descriptor may
only name a region its own connection registered, and only within the size it had when it was registered
(sealed: it cannot shrink since).

Bounded: regions per connection, per user (the uid that handed the descriptor over, so many connections of one
user cannot take every place), in all; bytes per region, per user and in all. By default a region may be a
quarter of the machine's physical memory and one user's regions half of it together (``default_limits``),
so a sparse memory file of a terabyte is refused and one user cannot make the server hold (and fault into)
more than that. The newest registration is the one refused (``ResourceExhausted``) and nothing registered
is ever taken away.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zinfer.client.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ShmError,
    UnknownRegion,
)
from zinfer.client.protocol import ShmRef
from zinfer.client.shm import Segment, check_name

from .region_intake import HandedRegion

MAX_REGIONS_PER_CLIENT = 256
MAX_REGIONS_PER_UID = 1024
MAX_REGIONS = 4096
REGION_SHARE = 4  # by default a region may be 1/REGION_SHARE of physical memory
USER_SHARE = 2  # and one user's regions together 1/USER_SHARE of it


def physical_memory() -> int:
    """Bytes of physical memory on this machine."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_limits() -> tuple[int, int]:
    """The default byte limits of one region and of one user's regions together (``--max-region-bytes``,
    ``--max-user-region-bytes``): a quarter and a half of physical memory."""
    memory = physical_memory()
    return memory // REGION_SHARE, memory // USER_SHARE


@dataclass(frozen=True)
class Region:
    name: str
    client: bytes
    fd: int  # the broker's descriptor of the file
    size: int
    dev: int
    ino: int
    uid: int  # who handed it over

    def wire(self) -> list[int]:
        """How an EXECUTE names it to workers: ``[fd, dev, ino]`` (the broker's pid comes with the worker)."""
        return [self.fd, self.dev, self.ino]


class RegionTable:
    def __init__(
        self,
        max_region_bytes: int = 0,
        max_per_client: int = MAX_REGIONS_PER_CLIENT,
        max_regions: int = MAX_REGIONS,
        max_per_uid: int = MAX_REGIONS_PER_UID,
        max_total_bytes: int = 0,
        max_uid_bytes: int = 0,
    ) -> None:
        """Byte limits of 0 are no limit."""
        self.max_region_bytes = max_region_bytes
        self.max_uid_bytes = max_uid_bytes
        self._uid_bytes: dict[int, int] = {}
        self.max_per_client = max_per_client
        self.max_regions = max_regions
        self.max_per_uid = max_per_uid
        self._per_uid: dict[int, int] = {}
        self.max_total_bytes = max_total_bytes
        self._by_client: dict[bytes, dict[str, Region]] = {}
        self._by_name: dict[str, Region] = {}
        self._bytes = 0

    def register(self, client: bytes, name: str, handed: HandedRegion) -> tuple[Region, Region | None]:
        """Record the handed-over descriptor as ``name`` for ``client``: the new region, and the one it
        replaces (the same connection registering a name again), whose descriptor the caller must close
        after telling the workers. On error the handed descriptor is closed. Errors never echo the name."""
        try:
            try:
                check_name(name)
            except ShmError as exc:
                raise InvalidArgument(f"cannot register region: {exc}") from None
            held = self._by_name.get(name)
            if held is not None and held.client != client:
                raise AlreadyExists("cannot register region: the name is in use by another connection")
            regions = self._by_client.get(client, {})
            if held is None and len(regions) >= self.max_per_client:
                raise ResourceExhausted(f"a connection may register at most {self.max_per_client} regions")
            if held is None and self._per_uid.get(handed.uid, 0) >= self.max_per_uid:
                raise ResourceExhausted(f"a user may register at most {self.max_per_uid} regions")
            if held is None and len(self._by_name) >= self.max_regions:
                raise ResourceExhausted(f"the server holds its maximum of {self.max_regions} regions")
            if self.max_region_bytes and handed.size > self.max_region_bytes:
                limit = self.max_region_bytes
                raise ResourceExhausted(
                    f"cannot register region: {handed.size} bytes is over the {limit} byte limit "
                    "of one region (--max-region-bytes)"
                )
            grow = handed.size - (held.size if held else 0)
            mine = self._uid_bytes.get(handed.uid, 0) - (held.size if held and held.uid == handed.uid else 0)
            if self.max_uid_bytes and mine + handed.size > self.max_uid_bytes:
                limit = self.max_uid_bytes
                raise ResourceExhausted(
                    f"cannot register region: this user's regions would hold {mine + handed.size} bytes, "
                    f"over the {limit} byte limit of one user (--max-user-region-bytes)"
                )
            if self.max_total_bytes and self._bytes + grow > self.max_total_bytes:
                raise ResourceExhausted(
                    f"cannot register region: the server's {self.max_total_bytes} bytes of regions are taken"
                )
        except BaseException:
            os.close(handed.fd)
            raise
        region = Region(name, client, handed.fd, handed.size, handed.dev, handed.ino, handed.uid)
        self._by_client.setdefault(client, {})[name] = region
        self._by_name[name] = region
        self._bytes += grow
        if held is not None:
            self._drop_uid(held.uid, held.size)
        self._per_uid[region.uid] = self._per_uid.get(region.uid, 0) + 1
        self._uid_bytes[region.uid] = self._uid_bytes.get(region.uid, 0) + region.size
        return region, held

    def unregister(self, client: bytes, name: str) -> Region:
        """Forget ``name``; the caller tells the workers, then ``release``s it."""
        region = self._by_client.get(client, {}).get(name)
        if region is None:
            raise NotFound("no such region registered by this connection")
        self._forget(region)
        return region

    def drop_client(self, client: bytes) -> list[Region]:
        regions = list(self._by_client.get(client, {}).values())
        for region in regions:
            self._forget(region)
        return regions

    def _forget(self, region: Region) -> None:
        regions = self._by_client[region.client]
        del regions[region.name]
        if not regions:
            del self._by_client[region.client]
        del self._by_name[region.name]
        self._bytes -= region.size
        self._drop_uid(region.uid, region.size)

    def _drop_uid(self, uid: int, size: int) -> None:
        left = self._per_uid[uid] - 1
        if left:
            self._per_uid[uid] = left
            self._uid_bytes[uid] -= size
        else:
            del self._per_uid[uid]
            del self._uid_bytes[uid]

    @staticmethod
    def release(region: Region) -> None:
        """Close the broker's descriptor of a region it no longer holds."""
        os.close(region.fd)

    def check(self, client: bytes, ref: ShmRef) -> None:
        """Raise ``InvalidArgument`` unless ``ref`` lies inside a region ``client`` registered."""
        region = self._by_client.get(client, {}).get(ref.region)
        if region is None:
            raise UnknownRegion("tensor names a region this connection has not registered")
        size = region.size
        if ref.offset < 0 or ref.nbytes < 0 or ref.offset > size or ref.nbytes > size - ref.offset:
            raise InvalidArgument(
                f"invalid offset + byte size for region of {size} bytes: "
                f"offset {ref.offset}, size {ref.nbytes}"
            )

    def get(self, name: str) -> Region | None:
        return self._by_name.get(name)

    def map_readonly(self, name: str) -> Segment | None:
        """A read-only mapping of a registered region (the response cache reads through it), or None."""
        region = self._by_name.get(name)
        if region is None:
            return None
        return Segment.from_fd(name, os.dup(region.fd), region.size, writable=False)

    def clients(self) -> list[bytes]:
        return list(self._by_client)

    def total_bytes(self) -> int:
        return self._bytes

    def user_bytes(self, uid: int) -> int:
        """Bytes of the regions ``uid`` handed over that are registered now."""
        return self._uid_bytes.get(uid, 0)

    def count(self) -> int:
        return len(self._by_name)

    def close(self) -> None:
        for client in list(self._by_client):
            for region in self.drop_client(client):
                self.release(region)
