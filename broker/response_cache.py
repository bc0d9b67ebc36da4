"""The response cache (Triton's ``response_cache``): whole responses kept by a hash of their request.

A model with ``response_cache { enable: true }`` on a server started with a cache size answers a request it
has seen before from the cache, without queueing it or touching a worker. The key is a BLAKE2b hash of the
model name, version and load generation, every input (name, datatype, shape, bytes) and the names of the
requested outputs; the value is a copy of each output's bytes. Errors are never cached.

``ResponseCache`` is the pure part: an LRU bounded by bytes, no clock, no I/O. ``RegionReader`` maps the
clients' registered regions read-only, so the broker can hash inputs and copy outputs that live in shared
memory; like the workers it re-reads a region's size before each read, so a region its client shrank is a
miss (no key, nothing stored), never a SIGBUS.

Trust: the cache believes what the clients' regions hold when it hashes them and when it copies an output
from a slot, as Triton's does with system shared memory. A client that rewrites its input or output
memory while its request runs can store a wrong answer for that key; serve untrusted clients without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from zinfer.client.errors import ShmError
from zinfer.client.protocol import ShmRef
from zinfer.client.shm import SHM_DIR, Segment, creator_pid

__all__ = [
    "ENTRY_OVERHEAD",
    "TENSOR_OVERHEAD",
    "CachedResponse",
    "CachedTensor",
    "RegionReader",
    "ResponseCache",
    "request_key",
]

log = logging.getLogger(__name__)

ENTRY_OVERHEAD = 128
"""Bytes an entry is charged beyond its tensor data (its key and bookkeeping)."""
TENSOR_OVERHEAD = 64
"""Bytes each cached tensor is charged beyond its data (name, datatype, shape)."""
MAX_MAPPED_REGIONS = 1024
KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class CachedTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True, slots=True)
class CachedResponse:
    """The outputs of one successful response, in the order they were returned."""

    outputs: tuple[CachedTensor, ...]

    @property
    def nbytes(self) -> int:
        """What the entry costs against the cache size: its data plus a fixed overhead."""
        return ENTRY_OVERHEAD + sum(TENSOR_OVERHEAD + len(t.data) for t in self.outputs)


class ResponseCache:
    """Responses by key, least recently used first out, never more than ``capacity`` bytes in all.

    An entry larger than the whole cache is refused (``put`` returns False) rather than emptying it.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("cache capacity must be >= 0 bytes")
        self.capacity = capacity
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()
        self.used_bytes = 0
        self.evictions = 0
        self.hits = 0
        self.misses = 0
        self.refused = 0

    def get(self, key: bytes) -> CachedResponse | None:
        """The response for ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: bytes, response: CachedResponse) -> bool:
        """Store ``response`` as the most recently used, evicting the least recently used entries until it
        fits. False (and nothing changes) when it is larger than the whole cache."""
        size = response.nbytes
        if size > self.capacity:
            self.refused += 1
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used_bytes -= old.nbytes
        while self._entries and self.used_bytes + size > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = response
        self.used_bytes += size
        return True

    def remove(self, key: bytes) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.used_bytes -= entry.nbytes
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.used_bytes = 0

    def keys(self) -> list[bytes]:
        """Keys from the least to the most recently used."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[bytes]:
        return iter(list(self._entries))


InputBytes = tuple[str, str, Sequence[int], memoryview | bytes]
"""An input as the key sees it: name, datatype, shape and its bytes."""


def _put(h: hashlib.blake2b, data: bytes | memoryview) -> None:
    n = data.nbytes if isinstance(data, memoryview) else len(data)
    h.update(n.to_bytes(8, "little"))
    h.update(data)


def request_key(
    model: str, version: int, generation: int, inputs: Iterable[InputBytes], outputs: Iterable[str]
) -> bytes:
    """The cache key of a request: a BLAKE2b digest over length-prefixed fields, inputs in name order
    (where the bytes came from, a region or an inline frame, does not matter) and outputs in the order
    they were requested."""
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"zinfer-cache-v1")
    _put(h, model.encode())
    h.update(version.to_bytes(8, "little", signed=True))
    h.update(generation.to_bytes(8, "little", signed=True))
    ordered = sorted(inputs, key=lambda t: t[0])
    h.update(len(ordered).to_bytes(4, "little"))
    for name, datatype, shape, data in ordered:
        _put(h, name.encode())
        _put(h, datatype.encode())
        h.update(len(shape).to_bytes(4, "little"))
        for d in shape:
            h.update(int(d).to_bytes(8, "little", signed=True))
        _put(h, data)
    names = list(outputs)
    h.update(len(names).to_bytes(4, "little"))
    for name in names:
        _put(h, name.encode())
    return h.digest()


class RegionReader:
    """Regions mapped read-only in the broker, by name, at most ``max_regions`` at a time.

    A client's region is mapped through ``open_client`` (the broker's own descriptor of the sealed file the
    client handed over: it cannot shrink, so its registered size holds). The server's own segments
    (``zinfer-s…``, ensemble intermediates) are attached by name, never following a symlink, and their size
    is re-read (``fstat``) before every read. ``read`` answers None for a range outside the region, for a
    region that cannot be opened, or for one that is gone; ``prune`` unmaps server segments unlinked since.
    """

    def __init__(self, max_regions: int = MAX_MAPPED_REGIONS) -> None:
        self.max_regions = max_regions
        self._segments: OrderedDict[str, Segment] = OrderedDict()
        self.open_client: Callable[[str], Segment | None] = lambda name: None

    def _open(self, name: str) -> Segment | None:
        if creator_pid(name) is not None:  # the server's own segment
            return Segment.attach(name, writable=False)
        return self.open_client(name)

    def read(self, ref: ShmRef) -> memoryview | None:
        """A read-only view of the range (release it soon: it pins the mapping), or None."""
        seg = self._segments.get(ref.region)
        if seg is None:
            try:
                seg = self._open(ref.region)
            except (ShmError, ValueError, OSError):
                return None
            if seg is None:
                return None
            self._segments[ref.region] = seg
            while len(self._segments) > self.max_regions:
                _, old = self._segments.popitem(last=False)
                old.close(unlink=False)
        else:
            self._segments.move_to_end(ref.region)
        size = seg.size
        if seg.named:
            try:
                size = min(seg.current_size(), seg.size)
            except OSError:
                self.drop(ref.region)
                return None
        if ref.offset < 0 or ref.nbytes < 0 or ref.offset > size or ref.nbytes > size - ref.offset:
            return None
        return seg.buf[ref.offset : ref.offset + ref.nbytes]

    def copy(self, ref: ShmRef) -> bytes | None:
        view = self.read(ref)
        if view is None:
            return None
        with view:
            return bytes(view)

    def prune(self) -> int:
        """Unmap the segments that no longer have a name in /dev/shm; returns how many."""
        gone = []
        for name in [n for n, seg in self._segments.items() if seg.named]:
            try:
                os.stat(SHM_DIR / name, follow_symlinks=False)
            except FileNotFoundError:
                gone.append(name)
            except OSError:
                pass
        for name in gone:
            self.drop(name)
        return len(gone)

    def drop(self, name: str) -> None:
        seg = self._segments.pop(name, None)
        if seg is not None:
            seg.close(unlink=False)

    def close(self) -> None:
        for name in list(self._segments):
            self.drop(name)

    def __len__(self) -> int:
        return len(self._segments)
