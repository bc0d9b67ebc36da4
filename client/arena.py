"""The client's shared-memory arena: segments it owns, carved into slots for tensors.

First-fit allocation over a sorted free list, 64-byte aligned, coalescing on free. When no segment has
room, the arena grows by a new segment (at least double the last one), up to ``max_bytes`` in total.
Thread-safe.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ResourceExhausted
from .shm import Segment

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Slot:
    segment: Segment
    offset: int
    nbytes: int  # bytes usable by the caller (the reservation is aligned up)

    @property
    def region(self) -> str:
        return self.segment.name

    def view(self) -> memoryview:
        return self.segment.buf[self.offset : self.offset + self.nbytes]


class _FreeList:
    """Free extents of one segment as parallel sorted lists of offsets and sizes."""

    def __init__(self, size: int) -> None:
        self.offsets = [0]
        self.sizes = [size]

    def take(self, n: int) -> int | None:
        for i, size in enumerate(self.sizes):
            if size >= n:
                off = self.offsets[i]
                if size == n:
                    del self.offsets[i], self.sizes[i]
                else:
                    self.offsets[i] += n
                    self.sizes[i] -= n
                return off
        return None

    def give(self, off: int, n: int) -> None:
        i = bisect.bisect_left(self.offsets, off)
        if i < len(self.offsets) and self.offsets[i] == off + n:  # merge with the next extent
            self.offsets[i] = off
            self.sizes[i] += n
        else:
            self.offsets.insert(i, off)
            self.sizes.insert(i, n)
        if i > 0 and self.offsets[i - 1] + self.sizes[i - 1] == off:  # merge with the previous one
            self.sizes[i - 1] += self.sizes[i]
            del self.offsets[i], self.sizes[i]


class Arena:
    """Segments owned by one client; ``on_new_segment`` is called for each new segment (to register it).
    ``new_segment(size)`` makes them: sealed anonymous memory files for clients, named files for the
    server."""

    def __init__(
        self,
        initial_bytes: int = 64 << 20,
        max_bytes: int = 4 << 30,
        on_new_segment: Callable[[Segment], None] | None = None,
        new_segment: Callable[[int], Segment] = Segment.create_sealed,
    ) -> None:
        self._initial = _align(max(initial_bytes, ALIGN))
        self._max = max_bytes
        self._on_new = on_new_segment
        self._new_segment = new_segment  # a client's sealed memory files by default
        self._lock = threading.Lock()
        self._segments: list[tuple[Segment, _FreeList]] = []
        self._closed = False

    @property
    def segments(self) -> list[Segment]:
        return [s for s, _ in self._segments]

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s, _ in self._segments)

    def alloc(self, nbytes: int) -> Slot:
        need = _align(max(nbytes, 1))
        with self._lock:
            if self._closed:
                raise ResourceExhausted("the client is closed")
            for seg, free in self._segments:
                off = free.take(need)
                if off is not None:
                    return Slot(seg, off, nbytes)
            seg = self._grow(need)
            off = self._segments[-1][1].take(need)
            assert off is not None
            return Slot(seg, off, nbytes)

    def _grow(self, need: int) -> Segment:
        last = self._segments[-1][0].size if self._segments else self._initial // 2
        size = max(self._initial, 2 * last, need)
        if self.total_bytes + size > self._max:
            size = max(need, self._max - self.total_bytes)
            if self.total_bytes + size > self._max:
                raise ResourceExhausted(
                    f"shared-memory arena limit of {self._max} bytes reached (need {need} more bytes)"
                )
        seg = self._new_segment(size)
        try:
            if self._on_new is not None:
                self._on_new(seg)
        except BaseException:
            seg.close()
            raise
        self._segments.append((seg, _FreeList(size)))
        return seg

    def free(self, slot: Slot) -> None:
        with self._lock:
            for seg, free in self._segments:
                if seg is slot.segment:
                    free.give(slot.offset, _align(max(slot.nbytes, 1)))
                    return

    def close(self) -> None:
        """Unmap and unlink every segment."""
        with self._lock:
            self._closed = True
            for seg, _ in self._segments:
                seg.close()
            self._segments.clear()
